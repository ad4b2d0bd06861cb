"""What changed between the versions of an operator, read from ``onnx.defs`` (not a hand-kept list).

* :func:`chain`: the schema :class:`Step` s of an op from one version up to a
  target, each comparing two consecutive :class:`Schema` s once (attribute
  defaults that changed, inputs and outputs renamed, allowed types that shrank).
* :func:`check_meaning` and :func:`check_valid`: the schema-driven checks of a
  drafted node (:class:`passes.upgrade.draft.Draft`), the evidence that a plain
  version bump would change what it computes, or that the drafted node is not
  a valid node of the new schema.
* :func:`reduce_ops_by_axes_version`: which Reduce ops moved ``axes`` from an
  attribute to an input, and at which version.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
from collections.abc import Iterable, Mapping, Sequence
import onnx
import onnx_ir as ir

from passes.declarations import DEFAULT_TARGET_OPSET
from passes.ir.schemas import input_since, kept_input_count
from passes.ir.types import type_string
from passes.upgrade.draft import Draft, dtype_of

__all__ = [
    "MIN_TARGET_OPSET",
    "Formal",
    "Schema",
    "Step",
    "all_formals",
    "chain",
    "check_meaning",
    "check_valid",
    "op_schema",
    "reduce_ops_by_axes_version",
]

#: The lowest target opset: the lowest onnxruntime runs (its CPU provider starts at opset 7, the
#: first with numpy-style broadcasting). Below 18 what the upgrade writes keeps the target's forms
#: (Reduce ops other than ReduceSum take ``axes`` as an attribute up to 17).
MIN_TARGET_OPSET = 7


@functools.cache
def reduce_ops_by_axes_version() -> Mapping[int, tuple[str, ...]]:
    """Version -> the default-domain Reduce ops whose ``axes`` became an input at that version.

    ``{13: ("ReduceSum",), 18: ("ReduceL1", ..., "ReduceSumSquare")}``, read
    from the schemas (:func:`passes.ir.schemas.input_since`), not a hand-kept list.
    """
    names = sorted({s.name for s in onnx.defs.get_all_schemas() if s.domain == "" and s.name.startswith("Reduce")})
    by_version: dict[int, list[str]] = {}
    for name in names:
        since = input_since(name, "axes")
        if since is not None:
            by_version.setdefault(since, []).append(name)
    return {since: tuple(ops) for since, ops in sorted(by_version.items())}


# --- schemas and their history ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Formal:
    """A formal input or output of a schema: its name, allowed type strings, and whether it is variadic."""

    name: str
    allowed: frozenset[str]
    variadic: bool


@dataclasses.dataclass(frozen=True)
class Schema:
    """What the checks need from an ``OpSchema``, read once (pybind properties copy on access)."""

    name: str
    since: int
    deprecated: bool
    attributes: Mapping[str, tuple[int, object]]  # name -> (AttributeType, default)
    required: tuple[str, ...]
    inputs: tuple[Formal, ...]
    outputs: tuple[Formal, ...]
    input_range: tuple[int, int]
    output_range: tuple[int, int]

    @property
    def label(self) -> str:
        return f"{self.name}-{self.since}"

    @classmethod
    def of(cls, schema: onnx.defs.OpSchema) -> Schema:
        constraints = {c.type_param_str: frozenset(c.allowed_type_strs) for c in schema.type_constraints}
        variadic = onnx.defs.OpSchema.FormalParameterOption.Variadic

        def formals(params: Sequence[onnx.defs.OpSchema.FormalParameter]) -> tuple[Formal, ...]:
            return tuple(
                Formal(p.name, constraints.get(p.type_str, frozenset({p.type_str})), p.option == variadic)
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
def _history(op_type: str) -> tuple[Schema, ...]:
    """The default-domain schemas of ``op_type``, oldest first (one ``get_schema`` per version)."""
    schemas = []
    version = onnx.defs.onnx_opset_version()
    while version > 0:
        try:
            schema = onnx.defs.get_schema(op_type, version, "")
        except onnx.defs.SchemaError:
            break
        schemas.append(Schema.of(schema))
        version = schema.since_version - 1
    return tuple(reversed(schemas))


@functools.cache
def _versions(op_type: str) -> tuple[int, ...]:
    return tuple(s.since for s in _history(op_type))


def op_schema(op_type: str, opset: int) -> Schema | None:
    """The schema of ``op_type`` that applies at ``opset``, or None if it is not defined there."""
    index = bisect.bisect_right(_versions(op_type), opset) - 1
    return _history(op_type)[index] if index >= 0 else None


def _next_version(op_type: str, since: int, target: int) -> int | None:
    versions = _versions(op_type)
    index = bisect.bisect_right(versions, since)
    if index < len(versions) and versions[index] <= target:
        return versions[index]
    return None


def _formal_at(formals: Sequence[Formal], index: int) -> Formal | None:
    if index < len(formals):
        return formals[index]
    if formals and formals[-1].variadic:
        return formals[-1]
    return None


# --- steps -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Step:
    """One schema change of an op: ``old`` is replaced by ``new`` at opset ``key[1]``.

    ``new`` is None when the op's last version is deprecated (only an adapter
    that replaces the op can go on). ``typed`` lists the formal parameters whose
    allowed types shrank, the only ones whose actual types need checking.
    """

    key: tuple[str, int]
    old: Schema
    new: Schema | None
    typed: tuple[tuple[str, int, Formal], ...] = ()
    new_defaults: tuple[tuple[str, object, object], ...] = ()  # (attribute, old default, new default)
    renamed: tuple[tuple[str, int, str, str], ...] = ()  # (kind, position, old name, new name)


def _step(op_type: str, old: Schema, new: Schema) -> Step:
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
    return Step((op_type, new.since), old, new, tuple(typed), new_defaults, tuple(renamed))


@functools.cache
def chain(op_type: str, since: int, target: int) -> tuple[Step, ...]:
    """The schema steps of ``op_type`` from its version ``since`` up to ``target``."""
    steps = []
    old = op_schema(op_type, since)
    while (version := _next_version(op_type, old.since, target)) is not None:
        new = op_schema(op_type, version)
        steps.append(_step(op_type, old, new))
        old = new
    if old.deprecated:
        steps.append(Step((op_type, old.since), old, None))
    return tuple(steps)


# --- checks of a drafted node ----------------------------------------------------------------


def _check_types(draft: Draft, schema: Schema, typed: Iterable[tuple[str, int, Formal]]) -> str | None:
    for kind, index, formal in typed:
        values = draft.inputs if kind == "input" else draft.outputs
        stop = len(values) if formal.variadic else min(index + 1, len(values))
        for value in values[index:stop]:
            dtype = dtype_of(value)
            if dtype is not None and type_string(dtype) not in formal.allowed:
                return f"{kind} '{formal.name}' of type {dtype.name} is not allowed in {schema.label}"
    return None


def all_formals(schema: Schema) -> tuple[tuple[str, int, Formal], ...]:
    """Every formal input and output of ``schema``, in the form of :attr:`Step.typed`."""
    return tuple(("input", i, f) for i, f in enumerate(schema.inputs)) + tuple(
        ("output", i, f) for i, f in enumerate(schema.outputs)
    )


def check_valid(draft: Draft, schema: Schema, typed: Iterable[tuple[str, int, Formal]]) -> str | None:
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
    num_inputs = kept_input_count(draft.inputs, schema.name, schema.since)
    low, high = schema.input_range
    if not low <= num_inputs <= high:
        return f"{num_inputs} inputs, {schema.label} takes {low} to {high}"
    low, high = schema.output_range
    if not low <= draft.num_outputs <= high:
        return f"{draft.num_outputs} outputs, {schema.label} has {low} to {high}"
    return _check_types(draft, schema, typed)


def check_meaning(draft: Draft, step: Step) -> str | None:
    """Why the step changes what the drafted node computes (schema evidence), or None."""
    for name, was, now in step.new_defaults:
        if name not in draft.attributes:
            return f"the default of '{name}' changed from {was!r} to {now!r}"
    for kind, index, was, now in step.renamed:
        if index < (len(draft.inputs) if kind == "input" else draft.num_outputs):
            return f"{kind} {index} changed from '{was}' to '{now}'"
    return check_valid(draft, step.new, step.typed)
