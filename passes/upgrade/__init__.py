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

import bisect
import collections
import dataclasses
import functools
import logging
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import onnx
import onnx_ir as ir

from passes.ir import inference as _inference, walk as _graphs
from passes.upgrade.adapters import (
    ADAPTERS,
    SEMANTIC_CHANGES,
    ConstInput,
    Draft,
    PlanContext,
    dtype_of,
)
from passes.base import Pass
from passes.errors import UpgradeError
from passes.ir.names import Names
from passes.ir.types import type_string
from passes.options import Option

__all__ = ["UpgradeOpsetPass", "max_supported_opset", "min_ir_version"]

logger = logging.getLogger(__name__)

MIN_TARGET_OPSET = 18
# The oldest onnx and onnxruntime that pyproject.toml allows (1.17 and 1.20) both run
# opset 21, so targets up to it need no probe (which would import onnxruntime).
_ALWAYS_SUPPORTED = 21


# --- supported versions ----------------------------------------------------------------------


def min_ir_version(opset: int) -> int:
    """The lowest IR version that allows default-domain ``opset`` (``onnx.helper.VERSION_TABLE``)."""
    return onnx.helper.find_min_ir_version_for([onnx.helper.make_opsetid("", opset)])


def _ort_loads(opset: int) -> bool:
    import onnxruntime as ort  # imported lazily: only the probe needs it

    errors = tuple(
        getattr(ort.capi.onnxruntime_pybind11_state, name)
        for name in ("Fail", "InvalidGraph", "InvalidArgument", "NotImplemented", "RuntimeException")
        if hasattr(ort.capi.onnxruntime_pybind11_state, name)
    )
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", ["x"], ["y"])],
        "probe",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
    )
    model = onnx.helper.make_model(
        graph, opset_imports=[onnx.helper.make_opsetid("", opset)], ir_version=min_ir_version(opset)
    )
    options = ort.SessionOptions()
    options.log_severity_level = 4
    try:
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except errors as error:
        logger.debug("onnxruntime does not load opset %s: %s", opset, error)
        return False
    return True


@functools.cache
def max_supported_opset() -> int:
    """The highest default-domain opset that both onnx and onnxruntime support (probed once)."""
    for opset in range(onnx.defs.onnx_opset_version(), MIN_TARGET_OPSET - 1, -1):
        if _ort_loads(opset):
            return opset
    return MIN_TARGET_OPSET - 1


# --- schemas ---------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Formal:
    name: str
    allowed: frozenset[str]
    variadic: bool


@dataclasses.dataclass(frozen=True)
class _Schema:
    """What the checks need from an ``OpSchema``, read once (pybind properties copy on access)."""

    name: str
    since: int
    deprecated: bool
    attributes: Mapping[str, tuple[int, object]]  # name -> (AttributeType, default)
    required: tuple[str, ...]
    inputs: tuple[_Formal, ...]
    outputs: tuple[_Formal, ...]
    input_range: tuple[int, int]
    output_range: tuple[int, int]

    @property
    def label(self) -> str:
        return f"{self.name}-{self.since}"

    @classmethod
    def of(cls, schema: onnx.defs.OpSchema) -> _Schema:
        constraints = {c.type_param_str: frozenset(c.allowed_type_strs) for c in schema.type_constraints}
        variadic = onnx.defs.OpSchema.FormalParameterOption.Variadic

        def formals(params: Sequence[onnx.defs.OpSchema.FormalParameter]) -> tuple[_Formal, ...]:
            return tuple(
                _Formal(p.name, constraints.get(p.type_str, frozenset({p.type_str})), p.option == variadic)
                for p in params
            )

        attributes = schema.attributes
        return cls(
            schema.name,
            schema.since_version,
            schema.deprecated,
            {name: (int(a.type), _default(a)) for name, a in attributes.items()},
            tuple(name for name, a in attributes.items() if a.required),
            formals(schema.inputs),
            formals(schema.outputs),
            (schema.min_input, schema.max_input),
            (schema.min_output, schema.max_output),
        )


def _default(attr: onnx.defs.OpSchema.Attribute) -> object:
    proto = attr.default_value
    if proto is None or not proto.ListFields():
        return None
    value = onnx.helper.get_attribute_value(proto)
    return value.decode() if isinstance(value, bytes) else value


@functools.cache
def _history(op_type: str) -> tuple[_Schema, ...]:
    """The default-domain schemas of ``op_type``, oldest first (one ``get_schema`` per version)."""
    schemas = []
    version = onnx.defs.onnx_opset_version()
    while version > 0:
        try:
            schema = onnx.defs.get_schema(op_type, version, "")
        except onnx.defs.SchemaError:
            break
        schemas.append(_Schema.of(schema))
        version = schema.since_version - 1
    return tuple(reversed(schemas))


@functools.cache
def _versions(op_type: str) -> tuple[int, ...]:
    return tuple(s.since for s in _history(op_type))


def _schema_at(op_type: str, opset: int) -> _Schema | None:
    """The schema of ``op_type`` that applies at ``opset``, or None if it is not defined there."""
    index = bisect.bisect_right(_versions(op_type), opset) - 1
    return _history(op_type)[index] if index >= 0 else None


def _next_version(op_type: str, since: int, target: int) -> int | None:
    versions = _versions(op_type)
    index = bisect.bisect_right(versions, since)
    if index < len(versions) and versions[index] <= target:
        return versions[index]
    return None


def _formal_at(formals: Sequence[_Formal], index: int) -> _Formal | None:
    if index < len(formals):
        return formals[index]
    if formals and formals[-1].variadic:
        return formals[-1]
    return None


@dataclasses.dataclass(frozen=True)
class _Step:
    """One schema change of an op: ``old`` is replaced by ``new`` at opset ``key[1]``.

    ``new`` is None when the op's last version is deprecated (only an adapter
    that replaces the op can go on). ``typed`` lists the formal parameters whose
    allowed types shrank, the only ones whose actual types need checking.
    """

    key: tuple[str, int]
    old: _Schema
    new: _Schema | None
    typed: tuple[tuple[str, int, _Formal], ...] = ()
    new_defaults: tuple[tuple[str, object, object], ...] = ()  # (attribute, old default, new default)
    renamed: tuple[tuple[str, int, str, str], ...] = ()  # (kind, position, old name, new name)


def _step(op_type: str, old: _Schema, new: _Schema) -> _Step:
    """Compares two consecutive schemas once; nodes then only look up what changed."""
    typed, renamed = [], []
    for kind, before, after in (("input", old.inputs, new.inputs), ("output", old.outputs, new.outputs)):
        for index, formal in enumerate(after):
            previous = _formal_at(before, index)
            if previous is None or not formal.allowed >= previous.allowed:
                typed.append((kind, index, formal))
            if previous is not None and previous.name != formal.name:
                renamed.append((kind, index, previous.name, formal.name))
    new_defaults = tuple(
        (name, old.attributes[name][1], default)
        for name, (_, default) in new.attributes.items()
        if name in old.attributes and old.attributes[name][1] != default
    )
    return _Step((op_type, new.since), old, new, tuple(typed), new_defaults, tuple(renamed))


@functools.cache
def _chain(op_type: str, since: int, target: int) -> tuple[_Step, ...]:
    """The schema steps of ``op_type`` from its version ``since`` up to ``target``."""
    steps = []
    old = _schema_at(op_type, since)
    while (version := _next_version(op_type, old.since, target)) is not None:
        new = _schema_at(op_type, version)
        steps.append(_step(op_type, old, new))
        old = new
    if old.deprecated:
        steps.append(_Step((op_type, old.since), old, None))
    return tuple(steps)


def _check_types(draft: Draft, schema: _Schema, typed: Iterable[tuple[str, int, _Formal]]) -> str | None:
    for kind, index, formal in typed:
        values = draft.inputs if kind == "input" else draft.outputs
        stop = len(values) if formal.variadic else min(index + 1, len(values))
        for value in values[index:stop]:
            dtype = dtype_of(value)
            if dtype is not None and type_string(dtype) not in formal.allowed:
                return f"{kind} '{formal.name}' of type {dtype.name} is not allowed in {schema.label}"
    return None


def _all_formals(schema: _Schema) -> tuple[tuple[str, int, _Formal], ...]:
    return tuple(("input", i, f) for i, f in enumerate(schema.inputs)) + tuple(
        ("output", i, f) for i, f in enumerate(schema.outputs)
    )


def _check_valid(draft: Draft, schema: _Schema, typed: Iterable[tuple[str, int, _Formal]]) -> str | None:
    """Why the drafted node is not a valid ``schema`` node, or None.

    Only the formal parameters in ``typed`` have their actual types checked.
    """
    if schema.deprecated:
        return f"{schema.label} is deprecated"
    declared = schema.attributes
    for name, attr in draft.attributes.items():
        if name not in declared:
            return f"attribute '{name}' does not exist in {schema.label}"
        if declared[name][0] != attr.type:
            return f"attribute '{name}' changed type to {ir.AttributeType(declared[name][0]).name}"
    for name in schema.required:
        if name not in draft.attributes:
            return f"{schema.label} requires attribute '{name}'"
    num_inputs = len(draft.inputs)
    while num_inputs and draft.inputs[num_inputs - 1] is None:
        num_inputs -= 1
    low, high = schema.input_range
    if not low <= num_inputs <= high:
        return f"{num_inputs} inputs, {schema.label} takes {low} to {high}"
    low, high = schema.output_range
    if not low <= draft.num_outputs <= high:
        return f"{draft.num_outputs} outputs, {schema.label} has {low} to {high}"
    return _check_types(draft, schema, typed)


def _check_meaning(draft: Draft, step: _Step) -> str | None:
    """Why the step changes what the drafted node computes (schema evidence), or None."""
    for name, was, now in step.new_defaults:
        if name not in draft.attributes:
            return f"the default of '{name}' changed from {was!r} to {now!r}"
    for kind, index, was, now in step.renamed:
        if index < (len(draft.inputs) if kind == "input" else draft.num_outputs):
            return f"{kind} {index} changed from '{was}' to '{now}'"
    return _check_valid(draft, step.new, step.typed)


# --- planning --------------------------------------------------------------------------------


class _Refused(Exception):
    """Internal: a node cannot be upgraded (turned into an UpgradeError with context)."""


def _plan_node(node: ir.Node, source: int, target: int, ctx: PlanContext) -> Draft:
    """Walks the schema steps of ``node`` from ``source`` to ``target`` on a draft."""
    schema = _schema_at(node.op_type, source)
    if schema is None:
        raise _Refused(f"{node.op_type} is not an operator of opset {source}")
    draft = Draft.of(node)
    chain = _chain(node.op_type, schema.since, target)
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
            if reason := _check_meaning(draft, step):
                raise _Refused(f"{step.old.label} -> {step.new.label}: {reason}")
            continue
        if reason := adapter.plan(draft, ctx):
            raise _Refused(f"{op_type}-{version}: {reason}")
        draft.applied.append(f"{op_type}-{version}: {adapter.name}")
        if draft.op_type == op_type and step.new is not None:
            new, typed = step.new, step.typed
        else:  # the adapter replaced the op: carry on along the new op's history
            new = _schema_at(draft.op_type, version)
            if new is None:
                raise _Refused(f"{draft.op_type} is not an operator of opset {version}")
            typed = _all_formals(new)
            chain, index = _chain(draft.op_type, new.since, target), 0
        if reason := _check_valid(draft, new, typed):
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


class UpgradeOpsetPass(Pass):
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
            :func:`max_supported_opset`).

    Raises:
        UpgradeError: For an unsupported target; from ``call``, for a node
            that cannot be converted exactly (the model is then left untouched).
            A model or function already at or above the target is left as it is.
    """

    NAME = "upgrade"
    DESCRIPTION = "convert the default-domain opset to --target-opset (Reduce axes become inputs)"
    OPTIONS = (
        Option("target_opset", None,
               f"opset the upgrade converts to (default: {MIN_TARGET_OPSET}; a model already at or above "
               "it is left at its opset; asking for a lower opset than the model's is an error)",
               parse=int, check=lambda n: None if n >= 1 else "must be a positive opset version", metavar="N"),
    )

    @classmethod
    def from_options(cls, values: Mapping[str, object]) -> UpgradeOpsetPass:
        target = values.get("target_opset")
        return cls(MIN_TARGET_OPSET if target is None else int(target))  # type: ignore[call-overload]

    def __init__(self, target_opset: int = MIN_TARGET_OPSET) -> None:
        super().__init__()
        too_high = target_opset > _ALWAYS_SUPPORTED and target_opset > max_supported_opset()
        if target_opset < MIN_TARGET_OPSET or too_high:
            raise UpgradeError(
                f"target opset {target_opset} is not supported: choose {MIN_TARGET_OPSET} to"
                f" {max_supported_opset()} (the highest both onnx and onnxruntime support)"
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
