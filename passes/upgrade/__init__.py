"""Opset upgrade: rewrite a model for a newer default-domain opset without changing its results.

For every default-domain node, the pass walks the operator's schema versions
between the opset its scope imports and the target. Each step is either

* handled by an adapter (``passes.upgrade.adapters``) when the step breaks
  the old meaning (``axes`` moved to an input, a default changed...),
* refused when it is a semantic change without an adapter, or when a
  schema-driven check (``passes.upgrade.schemas``) finds a break (an
  attribute the node uses was removed, an input it uses was renamed or moved,
  a default it relies on changed, its types are no longer allowed, the op is
  deprecated), or
* a plain version bump.

For a target above 21, a node is also refused where onnxruntime runs its op at the
source version but has no CPU kernel for the target's version (RandomUniform-22 in
onnxruntime 1.32): the upgraded model would not run.

Every node is planned before anything is changed (``passes.upgrade.plan``),
so a refusal (:class:`~passes.errors.UpgradeError`) leaves the model
untouched; then each scope's drafts are committed (``passes.upgrade.rewrite``:
the constants that adapters need, as initializers of the graph that uses them
or ``Constant`` nodes in functions).

The result computes the same thing by the spec, and the same bits in
onnxruntime at opset 18. Above 18 a few onnxruntime kernels of the newer
versions round differently although the op did not change (found:
AveragePool-19 and ReduceLogSumExp-28, 1 ulp), which no rewrite can avoid.
Where the spec and onnxruntime disagree, the spec decides (Dropout-10/11's
inference mask, GroupNormalization-18 in float16: see the adapters).
"""

from __future__ import annotations

import logging
from typing import NoReturn

import onnx
import onnx_ir as ir

from passes import heap
from passes.base import Pass, pass_stats
from passes.declarations import DEFAULT_TARGET_OPSET, UPGRADE
from passes.errors import InputError, UpgradeError
from passes.ir import walk
from passes.ir.names import Names
from passes.upgrade import adapters, legacy  # noqa: F401  (register their adapters, in this order)
from passes.upgrade.draft import Stats
from passes.upgrade.plan import RunsVersion, plan_scopes
from passes.upgrade.registry import ADAPTERS, semantic_changes
from passes.upgrade.rewrite import ScopeRewriter
from passes.ir.schemas import min_ir_version
from passes.upgrade.schemas import MIN_TARGET_OPSET

__all__ = ["SEMANTIC_CHANGES", "UpgradeOpsetPass"]

#: The changes of meaning the schemas do not show, by step (see :func:`registry.semantic_changes`):
#: read only when a step has no adapter, which is then refused with this description. Built once,
#: so a step whose adapter is removed at run time is still refused, never bumped as if nothing changed.
SEMANTIC_CHANGES = semantic_changes()

logger = logging.getLogger(__name__)

# The oldest onnx and onnxruntime that pyproject.toml allows (1.17 and 1.20) both run
# opset 21, so targets up to it need no probe (which imports onnxruntime).
_ALWAYS_SUPPORTED = 21


def _highest_target() -> int:
    """The highest target: the highest opset onnxruntime runs (the probe imports onnxruntime)."""
    # Imported here, not at the top: nothing else in the pass needs onnxruntime.
    from passes.verify.probe import max_supported_opset

    return max_supported_opset()


def _runs_version(target: int) -> RunsVersion | None:
    """For a target above the opsets every supported onnxruntime runs: the probe of its kernels
    by op version (a version of an op introduced there may have none: RandomUniform-22)."""
    if target <= _ALWAYS_SUPPORTED:
        return None
    from passes.verify.probe import has_version_kernel

    return has_version_kernel


def _refuse_target(target: int) -> NoReturn:
    raise UpgradeError(
        f"target opset {target} is not supported: choose {MIN_TARGET_OPSET} to"
        f" {_highest_target()} (the highest both onnx and onnxruntime support)"
    )


class UpgradeOpsetPass(Pass, spec=UPGRADE):
    """Upgrades the default-domain opset of a model, its subgraphs and its functions.

    Rewrite rule: every default-domain node of a scope importing opset ``s <
    target`` becomes the equivalent node of opset ``target``: its op's schema
    steps between ``s`` and ``target`` are applied in order (adapters for
    breaking steps, a version bump otherwise), then the scope's opset import is
    set to ``target`` and the model's ``ir_version`` raised to what ``target``
    requires. Custom-domain nodes, their opset imports, names, value_info,
    metadata and doc strings are kept.

    After :meth:`call`, ``stats`` (:func:`passes.base.pass_stats`) holds ``applied``
    (nodes rewritten by an adapter, per "Op-version: adapter"), ``declined``
    (empty: a node the upgrade cannot convert is refused), ``target_opset``,
    ``source_opsets`` (of the scopes upgraded), ``ir_version`` ([before, after]),
    ``converted`` (nodes carried to the target, per op type), ``initializers_added``,
    ``constants_added`` (Constant nodes, in functions) and ``nodes_added``.

    Args:
        target_opset: The default-domain opset to reach (7 up to
            :func:`passes.verify.probe.max_supported_opset`; only a target above
            21 needs that probe, which imports onnxruntime). None: 18, and a model
            already above it is left at its opset.

    Raises:
        UpgradeError: For an unsupported target; from ``call``, for a node that cannot be
            converted exactly (the model is then left untouched). A function already at or
            above the target is left as it is.
        InputError: From ``call``, for a model whose opset is above a target given
            explicitly (an opset is never lowered); the model is left untouched.
    """

    def __init__(self, target_opset: int | None = None) -> None:
        super().__init__()
        #: Asked for explicitly: a model above it is refused (never lowered), not left as it is.
        self.explicit = target_opset is not None
        target_opset = DEFAULT_TARGET_OPSET if target_opset is None else int(target_opset)
        too_high = target_opset > onnx.defs.onnx_opset_version() or (
            target_opset > _ALWAYS_SUPPORTED and target_opset > _highest_target()
        )
        if target_opset < MIN_TARGET_OPSET or too_high:
            _refuse_target(target_opset)
        self.target_opset = target_opset
        self.stats: dict[str, object] = {}

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        target = self.target_opset
        current = walk.default_opset(model.opset_imports)
        if self.explicit and current is not None and current > target:
            raise InputError(
                f"--target-opset {target} is lower than the model's opset {current}; this tool never lowers an opset"
            )
        all_scopes = list(walk.iter_scopes(model))
        scopes = [s for s in all_scopes if s.opset("") is not None]
        for scope in scopes:
            if scope.opset("") > target and scope.owner is None:  # once per model or function
                # Already above the target: nothing to do (the pass never lowers an opset).
                where = f"function '{scope.function.name}'" if scope.function else "the model"
                logger.info("%s imports opset %s, above the target %s: left as it is",
                            where, scope.opset(""), target)  # fmt: skip
        to_upgrade = [s for s in scopes if s.opset("") < target]
        source_opsets = sorted({s.opset("") for s in to_upgrade})
        stats = Stats()
        with heap.paused(freeze=True):  # a draft per node, alive until every node is committed
            plans = plan_scopes(model, to_upgrade, target, ADAPTERS, SEMANTIC_CHANGES, stats, _runs_version(target))
            names = Names(model) if any(drafts for _, drafts in plans) else None
            redirects: dict[ir.Value, ir.Value] = {}  # shared: a reader may be in another scope
            for scope, drafts in plans:
                if not drafts:
                    continue
                assert names is not None
                rewriter = ScopeRewriter(scope, names, stats, target, redirects)
                for draft in drafts:
                    rewriter.commit(draft)
            del plans
        modified = bool(to_upgrade)  # at least one opset import changes
        for owner in (model, *model.functions.values()):
            version = walk.default_opset(owner.opset_imports)
            if version is not None and version < target:
                walk.set_opset(owner.opset_imports, "", target)
        old_ir = model.ir_version
        if modified:
            model.ir_version = max(model.ir_version, min_ir_version(target))
        self.stats = pass_stats(
            stats.adapters, {},
            target_opset=target,
            source_opsets=source_opsets,
            ir_version=[old_ir, model.ir_version],
            converted=dict(sorted(stats.converted.items())),
            initializers_added=stats.initializers_added,
            constants_added=stats.constants_added,
            nodes_added=stats.nodes_added,
        )
        logger.info(
            "upgraded %s nodes to opset %s (%s adapted)",
            sum(stats.converted.values()),
            target,
            sum(stats.adapters.values()),
        )
        return ir.passes.PassResult(model, modified)
