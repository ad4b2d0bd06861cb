"""Common subexpression elimination, in every graph, subgraph and function.

Two nodes with the same (domain, op type, overload), the same input values
and the same attributes compute the same outputs, so the second one's users
can use the first one's outputs. Attributes are compared exactly: floats by
their bits (``-0.0`` is not ``0.0``), tensors by dtype, shape and bytes.

Never merged: ops whose schema is not deterministic (RandomNormalLike,
Bernoulli, Multinomial, ...; onnxsim and onnxslim merge two RandomNormalLike,
which changes the outputs), ops of domains without an ONNX schema (their
determinism is unknown), nodes holding subgraphs, tensor attributes over
``_TENSOR_LIMIT`` elements, and a node whose output is a graph output (its
name and producer are part of the contract).

onnx_ir's ``CommonSubexpressionEliminationPass`` is not used: it only visits
the main graph, knows a short fixed list of random ops (no Bernoulli, no
domain check), and compares float attributes with ``==``, so it merges
``Constant(value_float=0.0)`` with ``Constant(value_float=-0.0)``.
"""

from __future__ import annotations

import collections
import struct
from collections.abc import Hashable

import onnx_ir as ir

from passes.ir import tensors
from passes.ir.schemas import is_deterministic, schema_at
from passes.ir.walk import DEFAULT_DOMAINS, iter_scopes

__all__ = ["eliminate"]

_TENSOR_LIMIT = 1024
_GRAPH_TYPES = (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
_INT = ir.AttributeType.INT


def _float_key(value: float) -> bytes:
    return struct.pack("<d", value)


def _attribute_key(attr: ir.Attr) -> Hashable | None:
    """An exact, hashable key of an attribute's value; None when it must not be compared."""
    if attr.is_ref():
        return ("ref", attr.ref_attr_name, attr.type)
    kind = attr.type
    if kind is _INT:  # the most common first (keepdims, axis, to)
        return (kind, attr.value)
    if kind in _GRAPH_TYPES:
        return None
    if kind == ir.AttributeType.FLOAT:
        return (kind, _float_key(attr.value))
    if kind == ir.AttributeType.FLOATS:
        return (kind, tuple(_float_key(v) for v in attr.value))
    if kind in (ir.AttributeType.INTS, ir.AttributeType.STRINGS):
        return (kind, tuple(attr.value))
    if kind == ir.AttributeType.TENSOR:
        tensor = attr.value
        if tensor.size > _TENSOR_LIMIT or tensor.dtype == ir.DataType.STRING:
            return None
        array = tensors.read_tensor(tensor, f"attribute {attr.name!r}")  # checked reads, never a memory map
        return (kind, tensor.dtype, tuple(tensor.shape), array.tobytes())
    if kind in (ir.AttributeType.INT, ir.AttributeType.STRING):
        return (kind, attr.value)
    return None  # sparse tensors, types, lists of tensors: not compared


def _node_key(node: ir.Node, opset: int | None, mergeable: dict[str, bool]) -> Hashable | None:
    """The key two nodes that compute the same thing share; None for a node never merged.

    ``mergeable``: per op type of the default domain at ``opset``, whether it has a schema
    that is deterministic (filled as the scope's nodes ask; one scope, one opset).
    """
    if node.domain not in DEFAULT_DOMAINS or opset is None:
        return None
    op_type = node.op_type
    ok = mergeable.get(op_type)
    if ok is None:
        ok = mergeable[op_type] = schema_at(op_type, opset) is not None and is_deterministic(op_type, "", opset)
    if not ok:
        return None
    outputs = node.outputs
    for output in outputs:
        if output.is_graph_output():
            return None
    attributes = []
    stored = node.attributes
    for name, attr in sorted(getattr(stored, "data", stored).items()):  # the attributes' own dict
        key = _attribute_key(attr)
        if key is None:
            return None
        attributes.append((name, key))
    return (op_type, node.overload, len(outputs), tuple(map(id, node.inputs)), tuple(attributes))


def eliminate(model: ir.Model, applied: collections.Counter[str]) -> bool:
    """Merges common subexpressions in every scope of ``model``; whether any were.

    A sweep that merged nothing finds nothing again until a node's op, inputs or attributes
    change (the keys are the same), so a caller may skip a sweep where nothing but the
    removal of dead nodes happened since one that merged nothing.
    """
    changed = False
    for scope in iter_scopes(model):
        seen: dict[Hashable, ir.Node] = {}
        opset = scope.opset("")
        mergeable: dict[str, bool] = {}
        # A node alone in reading its first input has no twin (its twin would read it too): no key,
        # unless a merge later in the sweep gives that input another user (then it gets its key as
        # the earlier node, which it is).
        alone: dict[ir.Value, list[ir.Node]] = {}
        for node in list(scope.body):
            inputs = node.inputs
            if inputs and inputs[0] is not None and len(inputs[0].uses()) < 2:
                alone.setdefault(inputs[0], []).append(node)
                continue
            key = _node_key(node, opset, mergeable)
            if key is None:
                continue
            first = seen.setdefault(key, node)
            if first is node:
                continue
            for old, new in zip(node.outputs, first.outputs):
                old.replace_all_uses_with(new)
                for earlier in alone.pop(new, ()):
                    if (earlier_key := _node_key(earlier, opset, mergeable)) is not None:
                        seen.setdefault(earlier_key, earlier)
            scope.body.remove(node, safe=True)
            applied["cse/merged"] += 1
            changed = True
    return changed
