"""Facts about operators read from ``onnx.defs``, never from hand-kept tables.

* :func:`input_since`: the first schema version of an op that takes a given
  input (``axes`` of ReduceSum became an input at 13, of ReduceMax at 18).
* :func:`is_deterministic`: whether the op's schema at an opset is deterministic.
* :func:`expected_dtypes`: the element types the schema gives a node's outputs.
* :func:`kept_input_count` and :func:`trim_absent_inputs`: how many inputs a node
  keeps once absent ones (``""``) at its end are left out, where the schema allows it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import onnx
import onnx.defs
import onnx_ir as ir

from passes.ir.types import dtype_of_type_string
from passes.ir.walk import normalize_domain

__all__ = [
    "expected_dtypes",
    "input_since",
    "is_deterministic",
    "kept_input_count",
    "min_ir_version",
    "schema_at",
    "trim_absent_inputs",
]

_RANDOM_OPS = frozenset(
    {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}
)


def min_ir_version(opset: int) -> int:
    """The lowest IR version that allows default-domain ``opset`` (``onnx.helper.VERSION_TABLE``)."""
    return onnx.helper.find_min_ir_version_for([onnx.helper.make_opsetid("", opset)])


@functools.lru_cache(maxsize=4096)
def schema_at(op_type: str, opset: int, domain: str = "") -> onnx.defs.OpSchema | None:
    """The schema of ``op_type`` that applies at ``opset``, or None if there is none."""
    try:
        return onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return None


@functools.lru_cache(maxsize=4096)
def _optional_tail(op_type: str, opset: int, domain: str) -> tuple[int, int]:
    """The positions ``[start, stop)`` at which an absent input at a node's end may be left out."""
    schema = schema_at(op_type, opset, domain)
    if schema is None:
        return (0, 0)
    stop = len(schema.inputs)
    for index, formal in enumerate(schema.inputs):
        if formal.option == onnx.defs.OpSchema.FormalParameterOption.Variadic:
            stop = index
            break
    return (schema.min_input, stop)


def kept_input_count(inputs: Sequence[object | None], op_type: str, opset: int, domain: str = "") -> int:
    """How many of a node's ``inputs`` stay once the absent ones (None) at its end are left out.

    An absent input at the end is the same as a left-out one only where the
    schema makes that position optional on its own: at or past the schema's
    least input count, and before any variadic list. ``Loop(M, "")`` keeps its
    ``""`` (Loop takes at least two inputs, its loop-carried list follows);
    ``Clip(x, min, "")`` becomes ``Clip(x, min)``; a variadic list's length is
    part of its meaning. An op without a schema (a custom domain, a function)
    keeps every input.
    """
    start, stop = _optional_tail(op_type, opset, normalize_domain(domain))
    count = len(inputs)
    while start < count <= stop and inputs[count - 1] is None:
        count -= 1
    return count


def trim_absent_inputs(node: ir.Node, opset: int | None) -> bool:
    """Leaves out the absent inputs at ``node``'s end that :func:`kept_input_count` allows; whether any went.

    ``opset`` is the version its scope imports for the node's domain (None: unknown, nothing goes).
    """
    if opset is None:
        return False
    count = kept_input_count(node.inputs, node.op_type, opset, node.domain)
    if count == len(node.inputs):
        return False
    node.resize_inputs(count)
    return True


@functools.cache
def input_since(op_type: str, input_name: str, domain: str = "") -> int | None:
    """The first schema version of ``op_type`` with an input called ``input_name``.

    ``input_since("ReduceMax", "axes") == 18``; None when no version has it.
    Versions are walked from the newest down, so a later removal is not missed.
    """
    first = None
    version = onnx.defs.onnx_opset_version() if domain == "" else None
    if version is None:
        return None
    while version > 0:
        schema = schema_at(op_type, version, domain)
        if schema is None:
            break
        if any(formal.name == input_name for formal in schema.inputs):
            first = schema.since_version
        else:
            break
        version = schema.since_version - 1
    return first


@functools.lru_cache(maxsize=4096)
def is_deterministic(op_type: str, domain: str, opset: int) -> bool:
    """Whether the op's schema at ``opset`` is marked deterministic.

    An op without an ONNX schema (a custom domain) counts as deterministic:
    callers decide with their own knowledge of it (refimpl only implements
    deterministic kernels).
    """
    if domain == "" and op_type in _RANDOM_OPS:
        return False
    schema = schema_at(op_type, opset, domain)
    if schema is None:
        return True
    return schema.node_determinism == onnx.defs.OpSchema.NodeDeterminism.Deterministic


@functools.lru_cache(maxsize=4096)
def _output_type_rules(op_type: str, domain: str, opset: int) -> tuple[int | ir.DataType | None, ...] | None:
    """Per schema output: the input index whose dtype it shares, a fixed dtype, or None.

    Returns None when the op has no schema. The last formal parameter of a
    variadic list stands for all the remaining actual ones.
    """
    schema = schema_at(op_type, opset, domain)
    if schema is None:
        return None
    first_input: dict[str, int] = {}
    for i, formal in enumerate(schema.inputs):
        first_input.setdefault(formal.type_str, i)
    single = {
        c.type_param_str: dtype_of_type_string(c.allowed_type_strs[0])
        for c in schema.type_constraints
        if len(c.allowed_type_strs) == 1
    }
    rules: list[int | ir.DataType | None] = []
    for formal in schema.outputs:
        fixed = dtype_of_type_string(formal.type_str)
        if fixed is not None:
            rules.append(fixed)
        elif single.get(formal.type_str) is not None:
            rules.append(single[formal.type_str])
        else:
            rules.append(first_input.get(formal.type_str))
    if schema.outputs and schema.outputs[-1].option != onnx.defs.OpSchema.FormalParameterOption.Variadic:
        rules.append(None)  # stands for any output past the schema's (none in a valid node)
    return tuple(rules)


def expected_dtypes(
    op_type: str, domain: str, opset: int, inputs: Sequence[ir.TensorProtocol | None], n_outputs: int
) -> list[ir.DataType | None]:
    """The dtype the schema gives each output, where the input dtypes determine it.

    An output typed ``T`` like an input has that input's dtype; one typed
    ``tensor(int64)`` is int64; one whose type depends on an attribute
    (Cast's ``to``) is None (unknown).
    """
    rules = _output_type_rules(op_type, domain, opset)
    if not rules:
        return [None] * n_outputs
    result: list[ir.DataType | None] = []
    for i in range(n_outputs):
        rule = rules[min(i, len(rules) - 1)]
        if isinstance(rule, int) and not isinstance(rule, ir.DataType):  # an input index
            tensor = inputs[rule] if rule < len(inputs) else None
            result.append(tensor.dtype if tensor is not None else None)
        else:
            result.append(rule)
    return result
