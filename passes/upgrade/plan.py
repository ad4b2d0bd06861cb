"""Planning the upgrade of a node on a :class:`~passes.upgrade.draft.Draft`, without touching the graph.

:func:`plan_scopes` walks the schema steps of every node's op between its scope's
opset and the target (:func:`passes.upgrade.schemas.chain`). Each step is

* handled by its :class:`Adapter` (``passes.upgrade.adapters``) when it breaks
  the old meaning: the adapter edits the draft (op type, attributes, inputs,
  number of outputs) and may queue *hooks*, small graph edits that the
  scope's :class:`~passes.upgrade.rewrite.ScopeRewriter` runs once every node
  of the model is planned,
* refused when it is a semantic change without an adapter, or when a
  schema-driven check finds a break, or
* a plain version bump.

A node whose op onnxruntime runs at the source version but has no CPU kernel for
at the target's version (``runs_version``, asked for targets above the opsets every
supported onnxruntime runs: RandomUniform-22 in onnxruntime 1.32) is refused too: the
upgraded model would not run, and the check would blame the upgrade for it.

Every node of the model is planned before anything is changed, so that a
refusal (:class:`~passes.errors.UpgradeError`) leaves the model untouched.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import Callable, Iterable, Mapping

import onnx_ir as ir

from passes.errors import UpgradeError
from passes.ir import inference, walk
from passes.phases import node_done
from passes.upgrade import schemas
from passes.upgrade.draft import Draft, Stats

__all__ = ["Adapter", "PlanContext", "plan_scopes"]

# --- what planning sees and produces ---------------------------------------------------------

#: Whether onnxruntime has a CPU kernel for a schema version of a default-domain op (True, False,
#: or None when it cannot tell): :func:`passes.verify.probe.has_version_kernel`.
RunsVersion = Callable[[str, int], "bool | None"]


def _rank_of(value: ir.Value | None) -> int | None:
    if value is None or value.shape is None:
        return None
    return value.shape.rank()


@dataclasses.dataclass(frozen=True)
class PlanContext:
    """Read-only facts about the scope of the node being planned.

    Attributes:
        function: The model-local function the node belongs to, if any.
        ref_attr_is_set: Tells whether a function attribute is always bound
            (it has a default, or every call site sets it).
        target: The opset the node is carried to: what an adapter writes must be valid there.
        rank_of: The rank of a value: from the model, else from shape inference.
        shape_of: The shape of a value, likewise (None when unknown).
    """

    function: ir.Function | None
    ref_attr_is_set: Callable[[str], bool]
    target: int
    rank_of: Callable[[ir.Value], int | None] = lambda value: _rank_of(value)
    shape_of: Callable[[ir.Value], ir.Shape | None] = lambda value: value.shape


@dataclasses.dataclass(frozen=True)
class Adapter:
    """The handler of one breaking schema step.

    Attributes:
        op_type: The operator.
        since: The opset version that introduced the change.
        name: A short description, used in the statistics.
        plan: Edits the draft; returns why the node cannot be converted, or None.
        change: The change of meaning that the adapter handles and that the
            schemas do not show, if any (without the adapter, the step is
            refused with this description).
    """

    op_type: str
    since: int
    name: str
    plan: Callable[[Draft, PlanContext], str | None]
    change: str | None = None


# --- planning --------------------------------------------------------------------------------


class _Refused(Exception):
    """Internal: a node cannot be upgraded (turned into an UpgradeError with context)."""


def _plan_node(
    node: ir.Node,
    source: int,
    target: int,
    ctx: PlanContext,
    adapters: Mapping[tuple[str, int], Adapter],
    semantic_changes: Mapping[tuple[str, int], str],
    runs_version: RunsVersion | None = None,
) -> Draft:
    """Walks the schema steps of ``node`` from ``source`` to ``target`` on a draft."""
    schema = schemas.op_schema(node.op_type, source)
    if schema is None:
        raise _Refused(f"{node.op_type} is not an operator of opset {source}")
    draft = Draft.of(node)
    chain = schemas.chain(node.op_type, schema.since, target)
    index = 0
    while index < len(chain):
        step = chain[index]
        index += 1
        op_type, version = step.key
        adapter = adapters.get(step.key)
        if adapter is None:
            if step.key in semantic_changes:
                raise _Refused(f"{op_type}-{version}: {semantic_changes[step.key]}, and there is no adapter")
            if step.new is None:
                raise _Refused(f"{step.old.label} is deprecated and there is no adapter")
            if reason := schemas.check_meaning(draft, step):
                raise _Refused(f"{step.old.label} -> {step.new.label}: {reason}")
            continue
        if reason := adapter.plan(draft, ctx):
            raise _Refused(f"{op_type}-{version}: {reason}")
        draft.applied.append(f"{op_type}-{version}: {adapter.name}")
        if draft.op_type == op_type and step.new is not None:
            new, typed = step.new, step.typed
        else:  # the adapter replaced the op: carry on along the new op's history
            new = schemas.op_schema(draft.op_type, version)
            if new is None:
                raise _Refused(f"{draft.op_type} is not an operator of opset {version}")
            typed = schemas.all_formals(new)
            chain, index = schemas.chain(draft.op_type, new.since, target), 0
        if reason := schemas.check_valid(draft, new, typed):
            raise _Refused(f"{op_type}-{version} after adapter: {reason}")
    if runs_version is not None:
        _refuse_without_kernel(node.op_type, schema.since, draft.op_type, target, runs_version)
    return draft


def _refuse_without_kernel(op_type: str, since: int, new_op: str, target: int, runs_version: RunsVersion) -> None:
    """Refuses a node that onnxruntime runs as ``op_type``-``since`` but has no kernel for as
    ``new_op`` at ``target`` (an op it may run as its function body is never refused)."""
    schema = schemas.op_schema(new_op, target)
    if schema is None or (new_op == op_type and schema.since == since):
        return
    if runs_version(new_op, schema.since) is False and runs_version(op_type, since) is True:
        raise _Refused(
            f"onnxruntime has no CPU kernel for {schema.label} (it runs {op_type}-{since}),"
            f" so the upgraded model would not run; --target-opset {schema.since - 1} keeps {op_type}-{since}"
        )


def plan_scopes(
    model: ir.Model,
    scopes: Iterable[walk.Scope],
    target: int,
    adapters: Mapping[tuple[str, int], Adapter],
    semantic_changes: Mapping[tuple[str, int], str],
    stats: Stats,
    runs_version: RunsVersion | None = None,
) -> list[tuple[walk.Scope, list[Draft]]]:
    """Plans every node of the scopes, counting them in ``stats``; raises before anything is changed.

    Returns, per scope, the drafts of the nodes that change. ``runs_version``: asked whether
    onnxruntime has a kernel for each op version a node is carried to (None: not asked).

    Raises:
        UpgradeError: A node cannot be converted exactly.
    """
    call_sites: dict[ir.OperatorIdentifier, list[ir.Node]] | None = None
    inferred: dict[ir.Value, tuple[ir.DataType | None, ir.Shape | None]] | None = None

    def shape_of(value: ir.Value) -> ir.Shape | None:
        """The model's shape for ``value``, else shape inference's (run once, on first need)."""
        nonlocal inferred
        if value.shape is not None:
            return value.shape
        if inferred is None:
            unshaped = {v for node, _ in walk.iter_nodes(model) for v in node.inputs
                        if v is not None and v.shape is None}  # fmt: skip
            inferred = inference.infer_types(model, unshaped)
        return inferred.get(value, (None, None))[1]

    def rank_of(value: ir.Value) -> int | None:
        shape = shape_of(value)
        return shape.rank() if shape is not None else None

    def ref_attr_is_set(function: ir.Function, name: str) -> bool:
        nonlocal call_sites
        declared = function.attributes.get(name)
        if declared is not None and declared.value is not None:
            return True
        if call_sites is None:
            call_sites = collections.defaultdict(list)
            for node, _ in walk.iter_nodes(model):
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
            target,
            rank_of,
            shape_of,
        )
        drafts = []
        for node in scope.body:
            node_done()
            if node.domain != "" or (local_ops and node.op_identifier() in local_ops):
                continue
            try:
                draft = _plan_node(node, source, target, ctx, adapters, semantic_changes, runs_version)
            except _Refused as refusal:
                raise UpgradeError(
                    f"cannot upgrade {node.op_type} node {node.name!r} from opset {source}"
                    f" to {target}: {refusal} (--skip upgrade keeps opset {source})"
                ) from None
            stats.converted[node.op_type] += 1
            if draft.changed():
                for applied in draft.applied:  # (Counter.update's own checks cost more, per node)
                    stats.adapters[applied] += 1
                drafts.append(draft)
        plans.append((scope, drafts))
    return plans
