"""Opset upgrade: rewrite a model for a newer default-domain opset without changing its results.

For every default-domain node, the pass walks the operator's schema versions
between the opset its scope imports and the target (from ``onnx.defs``, not a
hand-kept list). Each step is either

* handled by an adapter (``passes.upgrade.adapters``) when the step breaks
  the old meaning (``axes`` moved to an input, a default changed...),
* refused when it is listed as a semantic change without an adapter, or when
  a schema-driven check finds a break (an attribute the node uses was
  removed, an input it uses was renamed or moved, a default it relies on
  changed, its types are no longer allowed, the op is deprecated), or
* a plain version bump.

Every node is planned before anything is changed, so a refusal
(:class:`~passes.errors.UpgradeError`) leaves the model untouched. Constants
that adapters need become int64/float initializers of the graph that uses
them, shared by value and named so that no value of the model is shadowed;
in model-local functions (which cannot hold initializers) they are
``Constant`` nodes, and an attribute reference of the function becomes a
``Constant`` whose ``value_ints``/``value_float``... references it.
Subgraphs (If/Loop/Scan bodies) get their own initializers rather than using
the main graph's, so each graph stays self-contained (a subgraph can be moved,
inlined or folded on its own) and different graphs never share a constant.

The result computes the same thing by the spec, and the same bits in
onnxruntime at opset 18. Above 18 a few onnxruntime kernels of the newer
versions round differently although the op did not change (found:
AveragePool-19 and ReduceLogSumExp-28, 1 ulp), which no rewrite can avoid.
Where the spec and onnxruntime disagree, the spec decides (Dropout-10/11's
inference mask, GroupNormalization-18 in float16: see the adapters).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import onnx
import onnx_ir as ir

from passes.ir import inference as _inference, walk as _graphs
from passes.errors import UpgradeError
from passes.ir.names import Names
from passes.upgrade.adapters import ADAPTERS, SEMANTIC_CHANGES, ConstInput, Draft, PlanContext
from passes.upgrade.schemas import (
    MIN_TARGET_OPSET,
    all_formals,
    chain as schema_chain,
    check_meaning,
    check_valid,
    min_ir_version,
    op_schema,
)

__all__ = ["UpgradeOpsetPass"]

logger = logging.getLogger(__name__)

# The oldest onnx and onnxruntime that pyproject.toml allows (1.17 and 1.20) both run
# opset 21, so targets up to it need no probe (which imports onnxruntime).
_ALWAYS_SUPPORTED = 21


def _highest_target() -> int:
    """The highest target: the highest opset onnxruntime runs (the probe imports onnxruntime)."""
    from passes.verify.probe import max_supported_opset  # imported here: only this needs it

    return max_supported_opset()


# --- planning --------------------------------------------------------------------------------


class _Refused(Exception):
    """Internal: a node cannot be upgraded (turned into an UpgradeError with context)."""


def _plan_node(node: ir.Node, source: int, target: int, ctx: PlanContext) -> Draft:
    """Walks the schema steps of ``node`` from ``source`` to ``target`` on a draft."""
    schema = op_schema(node.op_type, source)
    if schema is None:
        raise _Refused(f"{node.op_type} is not an operator of opset {source}")
    draft = Draft.of(node)
    chain = schema_chain(node.op_type, schema.since, target)
    index = 0
    while index < len(chain):
        step = chain[index]
        index += 1
        op_type, version = step.key
        adapter = ADAPTERS.get(step.key)
        if adapter is None:
            if step.key in SEMANTIC_CHANGES:
                raise _Refused(f"{op_type}-{version}: {SEMANTIC_CHANGES[step.key]}, and there is no adapter")
            if step.new is None:
                raise _Refused(f"{step.old.label} is deprecated and there is no adapter")
            if reason := check_meaning(draft, step):
                raise _Refused(f"{step.old.label} -> {step.new.label}: {reason}")
            continue
        if reason := adapter.plan(draft, ctx):
            raise _Refused(f"{op_type}-{version}: {reason}")
        draft.applied.append(f"{op_type}-{version}: {adapter.name}")
        if draft.op_type == op_type and step.new is not None:
            new, typed = step.new, step.typed
        else:  # the adapter replaced the op: carry on along the new op's history
            new = op_schema(draft.op_type, version)
            if new is None:
                raise _Refused(f"{draft.op_type} is not an operator of opset {version}")
            typed = all_formals(new)
            chain, index = schema_chain(draft.op_type, new.since, target), 0
        if reason := check_valid(draft, new, typed):
            raise _Refused(f"{op_type}-{version} after adapter: {reason}")
    return draft


# --- rewriting -------------------------------------------------------------------------------


def _const_base(base: str, array: np.ndarray) -> str:
    if array.dtype.kind in "iu" and array.size <= 8:
        values = "_".join(str(int(v)).replace("-", "m") for v in array.reshape(-1))
        return f"{base}_{values}" if values else f"{base}_empty"
    return base


class _ScopeRewriter:
    """Creates the constants and nodes that the adapters of one scope need."""

    def __init__(self, scope: _graphs.Scope, names: Names, stats: _Stats) -> None:
        self._scope = scope
        self._names = names
        self._stats = stats
        self._cache: dict[tuple[object, ...], ir.Value] = {}
        self._front: ir.Node | None = None  # last Constant put at the top of a function scope

    def fresh_value_name(self, base: str) -> str:
        return self._names.value(base)

    def const(self, array: np.ndarray, base_name: str) -> ir.Value:
        array = np.asarray(array)
        key = ("tensor", array.dtype.str, array.shape, array.tobytes())
        if (value := self._cache.get(key)) is not None:
            return value
        name = self._names.value(_const_base(base_name, array))
        tensor = ir.tensor(array, name=name)
        if self._scope.in_function:
            value = self._constant_node([ir.AttrTensor("value", tensor)], name)
        else:
            value = ir.val(name, const_value=tensor)
            self._scope.body.register_initializer(value)
            self._stats.initializers_added += 1
        self._cache[key] = value
        return value

    def ref_const(self, const: ConstInput) -> ir.Value:
        attr = const.ref
        assert attr is not None and attr.ref_attr_name is not None
        key = ("ref", const.ref_kind, attr.ref_attr_name)
        if (value := self._cache.get(key)) is not None:
            return value
        ref = ir.RefAttr(const.ref_kind, attr.ref_attr_name, attr.type)
        value = self._constant_node([ref], self._names.value(f"{const.base_name}_{attr.ref_attr_name}"))
        self._cache[key] = value
        return value

    def _constant_node(self, attributes: list[ir.Attr], name: str) -> ir.Value:
        node = ir.Node("", "Constant", [], attributes, name=self._names.node(name))
        node.outputs[0].name = name
        body = self._scope.body
        if self._front is not None:
            body.insert_after(self._front, node)
        elif len(body):
            body.insert_before(body[0], node)
        else:
            body.append(node)
        self._front = node
        self._stats.constants_added += 1
        return node.outputs[0]

    def add_node(
        self,
        op_type: str,
        inputs: Sequence[ir.Value | None],
        attributes: Sequence[ir.Attr] = (),
        *,
        base_name: str,
        before: ir.Node | None = None,
        after: ir.Node | None = None,
    ) -> ir.Node:
        node = ir.Node("", op_type, inputs, attributes, name=self._names.node(base_name))
        node.outputs[0].name = self._names.value(base_name)
        if before is not None:
            self._scope.body.insert_before(before, node)
        else:
            assert after is not None
            self._scope.body.insert_after(after, node)
        self._stats.nodes_added += 1
        return node

    def materialize(self, value: ir.Value | ConstInput | None, node: ir.Node) -> ir.Value | None:
        if not isinstance(value, ConstInput):
            return value
        if value.ref is not None:
            result = self.ref_const(value)
        else:
            result = self.const(value.array, value.base_name)
        if value.like is not None:
            base = f"{node.name or node.op_type}_{value.base_name}"
            result = self.add_node("CastLike", [result, value.like], base_name=base, before=node).outputs[0]
        return result

    def commit(self, draft: Draft) -> None:
        """Writes the draft into its node."""
        node = draft.node
        node.op_type = draft.op_type
        attributes, current = node.attributes, node.attributes.data  # writes go through the container
        for name in [name for name in current if name not in draft.attributes]:
            del attributes[name]
        for name, attr in draft.attributes.items():
            if current.get(name) is not attr:
                attributes[name] = attr
        inputs = [self.materialize(value, node) for value in draft.inputs]
        while inputs and inputs[-1] is None:
            inputs.pop()
        if len(inputs) != len(node.inputs):
            node.resize_inputs(len(inputs))
        for index, value in enumerate(inputs):
            if node.inputs[index] is not value:
                node.replace_input_with(index, value)
        node.resize_outputs(draft.num_outputs)
        for hook in draft.hooks:
            hook(node, self)


@dataclasses.dataclass
class _Stats:
    converted: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    adapters: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    initializers_added: int = 0
    constants_added: int = 0
    nodes_added: int = 0


# --- the pass --------------------------------------------------------------------------------


class UpgradeOpsetPass(ir.passes.InPlacePass):
    """Upgrades the default-domain opset of a model, its subgraphs and its functions.

    Rewrite rule: every default-domain node of a scope importing opset ``s <
    target`` becomes the equivalent node of opset ``target``: its op's schema
    steps between ``s`` and ``target`` are applied in order (adapters for
    breaking steps, a version bump otherwise), then the scope's opset import is
    set to ``target`` and the model's ``ir_version`` raised to what ``target``
    requires. Custom-domain nodes, their opset imports, names, value_info,
    metadata and doc strings are kept.

    After :meth:`call`, ``stats`` holds a JSON-serialisable summary: ``target_opset``,
    ``source_opsets`` (of the scopes upgraded), ``ir_version`` ([before, after]),
    ``converted`` (nodes carried to the target, per op type), ``adapters`` (nodes
    rewritten, per "Op-version: adapter"), ``initializers_added``,
    ``constants_added`` (Constant nodes, in functions) and ``nodes_added``.

    Args:
        target_opset: The default-domain opset to reach (18 up to
            :func:`passes.verify.probe.max_supported_opset`; only a target above
            21 needs that probe, which imports onnxruntime).

    Raises:
        UpgradeError: For an unsupported target; from ``call``, for a node
            that cannot be converted exactly (the model is then left untouched).
            A model or function already at or above the target is left as it is.
    """

    def __init__(self, target_opset: int = MIN_TARGET_OPSET) -> None:
        super().__init__()
        too_high = target_opset > onnx.defs.onnx_opset_version() or (
            target_opset > _ALWAYS_SUPPORTED and target_opset > _highest_target()
        )
        if target_opset < MIN_TARGET_OPSET or too_high:
            raise UpgradeError(
                f"target opset {target_opset} is not supported: choose {MIN_TARGET_OPSET} to"
                f" {_highest_target()} (the highest both onnx and onnxruntime support)"
            )
        self.target_opset = target_opset
        self.stats: dict[str, object] = {}

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        target = self.target_opset
        all_scopes = list(_graphs.iter_scopes(model))
        scopes = [s for s in all_scopes if s.opset("") is not None]
        for scope in scopes:
            if scope.opset("") > target and scope.owner is None:  # once per model or function
                # Already above the target: nothing to do (the pass never lowers an opset).
                where = f"function '{scope.function.name}'" if scope.function else "the model"
                logger.info("%s imports opset %s, above the target %s: left as it is",
                            where, scope.opset(""), target)  # fmt: skip
        to_upgrade = [s for s in scopes if s.opset("") < target]
        source_opsets = sorted({s.opset("") for s in to_upgrade})
        stats = _Stats()
        plans = self._plan(model, to_upgrade, target, stats)
        names = Names(model) if any(drafts for _, drafts in plans) else None
        for scope, drafts in plans:
            if not drafts:
                continue
            assert names is not None
            rewriter = _ScopeRewriter(scope, names, stats)
            for draft in drafts:
                rewriter.commit(draft)
        modified = bool(to_upgrade)  # at least one opset import changes
        for owner in (model, *model.functions.values()):
            version = _graphs.default_opset(owner.opset_imports)
            if version is not None and version < target:
                _graphs.set_opset(owner.opset_imports, "", target)
        old_ir = model.ir_version
        if modified:
            model.ir_version = max(model.ir_version, min_ir_version(target))
        self.stats = {
            "target_opset": target,
            "source_opsets": source_opsets,
            "ir_version": [old_ir, model.ir_version],
            "converted": dict(sorted(stats.converted.items())),
            "adapters": dict(sorted(stats.adapters.items())),
            "initializers_added": stats.initializers_added,
            "constants_added": stats.constants_added,
            "nodes_added": stats.nodes_added,
        }
        logger.info(
            "upgraded %s nodes to opset %s (%s adapted)",
            sum(stats.converted.values()),
            target,
            sum(stats.adapters.values()),
        )
        return ir.passes.PassResult(model, modified)

    def _plan(
        self, model: ir.Model, scopes: Iterable[_graphs.Scope], target: int, stats: _Stats
    ) -> list[tuple[_graphs.Scope, list[Draft]]]:
        """Plans every node of the scopes; raises before anything is changed."""
        call_sites: dict[ir.OperatorIdentifier, list[ir.Node]] | None = None
        inferred: dict[ir.Value, tuple[ir.DataType | None, ir.Shape | None]] | None = None

        def rank_of(value: ir.Value) -> int | None:
            """The model's rank for ``value``, else shape inference's (run once, on first need)."""
            nonlocal inferred
            if value.shape is not None:
                return value.shape.rank()
            if inferred is None:
                unshaped = {v for node, _ in _graphs.iter_nodes(model) for v in node.inputs
                            if v is not None and v.shape is None}  # fmt: skip
                inferred = _inference.infer_types(model, unshaped)
            shape = inferred.get(value, (None, None))[1]
            return shape.rank() if shape is not None else None

        def ref_attr_is_set(function: ir.Function, name: str) -> bool:
            nonlocal call_sites
            declared = function.attributes.get(name)
            if declared is not None and declared.value is not None:
                return True
            if call_sites is None:
                call_sites = collections.defaultdict(list)
                for node, _ in _graphs.iter_nodes(model):
                    call_sites[node.op_identifier()].append(node)
            return all(name in site.attributes for site in call_sites.get(function.identifier(), ()))

        # Default-domain model-local functions are called like ops; they are not upgraded as ops.
        local_ops = {f.identifier() for f in model.functions.values() if f.domain == ""}
        plans = []
        for scope in scopes:
            source = scope.opset("")
            function = scope.function
            ctx = PlanContext(
                function,
                functools.partial(ref_attr_is_set, function) if function else lambda name: False,
                rank_of,
            )
            drafts = []
            for node in scope.body:
                if node.domain != "" or (local_ops and node.op_identifier() in local_ops):
                    continue
                try:
                    draft = _plan_node(node, source, target, ctx)
                except _Refused as refusal:
                    raise UpgradeError(
                        f"cannot upgrade {node.op_type} node {node.name!r} from opset {source}"
                        f" to {target}: {refusal}"
                    ) from None
                stats.converted[node.op_type] += 1
                if draft.changed():
                    stats.adapters.update(draft.applied)
                    drafts.append(draft)
            plans.append((scope, drafts))
        return plans
