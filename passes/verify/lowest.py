"""The lowest-precision float type each value of a graph depends on: it chooses the check's tolerance.

:func:`float_dependencies` walks back through the graph, into subgraphs and
their references to outer values: a value computed from a float16 input, a
float16 constant or a Cast to float16 is compared with float16's tolerance,
even where it is stored as float32.
"""

from __future__ import annotations

from collections.abc import Mapping

import onnx

from passes.verify.defaults import PRECISION_ORDER, default_tolerance

__all__ = ["FLOAT_TYPES", "Lowest", "float_dependencies", "lower", "output_tolerances"]

#: Float element types by name, for the tolerance.
FLOAT_TYPES: dict[int, str] = {
    onnx.TensorProto.DOUBLE: "float64",
    onnx.TensorProto.FLOAT: "float32",
    onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.BFLOAT16: "bfloat16",
    onnx.TensorProto.FLOAT8E4M3FN: "float8e4m3fn",
    onnx.TensorProto.FLOAT8E4M3FNUZ: "float8e4m3fnuz",
    onnx.TensorProto.FLOAT8E5M2: "float8e5m2",
    onnx.TensorProto.FLOAT8E5M2FNUZ: "float8e5m2fnuz",
}

_RANK = {name: i for i, name in enumerate(PRECISION_ORDER)}

#: Ops whose outputs depend on their inputs' shapes only, not on their values.
_SHAPE_ONLY = frozenset({"Shape", "Size", "ConstantOfShape"})

_INT, _FLOAT, _FLOATS = onnx.AttributeProto.INT, onnx.AttributeProto.FLOAT, onnx.AttributeProto.FLOATS
_TENSOR, _TENSORS = onnx.AttributeProto.TENSOR, onnx.AttributeProto.TENSORS
_GRAPH, _GRAPHS = onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS
#: The integer attributes that name an element type (a Cast's target, a generator's dtype).
_DTYPE_ATTRIBUTES = frozenset({"to", "dtype", "output_dtype"})

#: (dtype name, value where it appears), or None: no float anywhere upstream.
Lowest = tuple[str, str] | None


def lower(a: Lowest, b: Lowest) -> Lowest:
    """The lower-precision of two (None: no float)."""
    if a is None:
        return b
    if b is None:
        return a
    return b if _RANK[b[0]] > _RANK[a[0]] else a


def _declared(info: onnx.ValueInfoProto) -> Lowest:
    if info.type.HasField("tensor_type"):
        name = FLOAT_TYPES.get(info.type.tensor_type.elem_type)
        if name:
            return (name, info.name)
    return None


def _tensor_lowest(tensor: onnx.TensorProto, where: str) -> Lowest:
    name = FLOAT_TYPES.get(tensor.data_type)
    return (name, where) if name else None


def _subgraph_lowest(graph: onnx.GraphProto, outer: Mapping[str, Lowest]) -> Lowest:
    """Everything a subgraph computes with: its own types, and the outer values it refers to."""
    inner = float_dependencies(graph, outer)
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    defined |= {name for node in graph.node for name in node.output}
    found: Lowest = None
    for name in defined | {o.name for o in graph.output}:
        found = lower(found, inner.get(name))
    return found


def float_dependencies(graph: onnx.GraphProto, outer: Mapping[str, Lowest] | None = None) -> dict[str, Lowest]:
    """For every value of ``graph``: the lowest-precision float type it depends on, and where it appears.

    Walks the graph in its (topological) node order: a node's outputs depend on
    its inputs, on the types it introduces (a Cast's target, a constant), on its
    subgraphs' whole content and the outer values those refer to, and on their
    own declared types.

    Args:
        graph: A graph (the main graph, or a subgraph with ``outer`` values).
        outer: What the enclosing scopes' values depend on.
    """
    lowest: dict[str, Lowest] = dict(outer or {})
    for info in graph.input:
        lowest[info.name] = _declared(info)
    for tensor in graph.initializer:
        lowest[tensor.name] = _tensor_lowest(tensor, tensor.name)
    for sparse in graph.sparse_initializer:
        lowest[sparse.values.name] = _tensor_lowest(sparse.values, sparse.values.name)
    declared = {info.name: _declared(info) for info in [*graph.value_info, *graph.output]}
    for node in graph.node:
        # The types the node brings in by itself (a Cast's target, a dtype attribute, a constant
        # tensor) and its subgraphs, in one look at each attribute: this runs in the parent while
        # the passes run (10k nodes: 58 -> 27 ms)
        outputs = node.output
        where = outputs[0] if outputs else node.name
        found: Lowest = None
        subgraphs: list[onnx.GraphProto] = []
        for attr in node.attribute:
            kind = attr.type
            if kind == _INT:
                if attr.name in _DTYPE_ATTRIBUTES and (name := FLOAT_TYPES.get(attr.i)):
                    found = lower(found, (name, where))
            elif kind == _GRAPH:
                subgraphs.append(attr.g)
            elif kind == _GRAPHS:
                subgraphs.extend(attr.graphs)
            elif kind == _TENSOR:
                found = lower(found, _tensor_lowest(attr.t, where))
            elif kind == _TENSORS:
                for t in attr.tensors:
                    found = lower(found, _tensor_lowest(t, where))
            elif (kind == _FLOAT or kind == _FLOATS) and node.op_type == "Constant":
                found = lower(found, ("float32", where))
        if not (node.op_type in _SHAPE_ONLY and node.domain in ("", "ai.onnx")):
            for name in node.input:
                if name and (dependency := lowest.get(name)) is not None:
                    found = lower(found, dependency)
        for sub in subgraphs:
            found = lower(found, _subgraph_lowest(sub, lowest))
        for name in outputs:
            if name:
                lowest[name] = lower(found, declared.get(name))
    for info in graph.output:
        lowest[info.name] = lower(lowest.get(info.name), declared.get(info.name))
    return lowest


def output_tolerances(graph: onnx.GraphProto, rtol: float | None, atol: float | None, precision: str | None,
                      precision_tolerance: tuple[float, float | None] | None,
                      ) -> tuple[dict[str, tuple[float, float]], dict[str, Lowest]]:  # fmt: skip
    """Each float output's (rtol, atol): the flags', else the default of the lowest-precision float
    type it depends on (the half type of ``--precision`` at least); and, where a default applies,
    the (type, value) that chose it."""
    lowest = float_dependencies(graph)
    tolerances: dict[str, tuple[float, float]] = {}
    sources: dict[str, Lowest] = {}
    for output in graph.output:
        found = lowest.get(output.name)
        if found is None:
            continue
        if precision is not None:
            found = lower(found, (precision, f"--precision ({precision})"))
            if found[0] == precision and precision_tolerance is not None:
                found = (found[0], "--precision-tolerance")
        default_rtol, default_atol = default_tolerance(found[0], precision, precision_tolerance)
        tolerances[output.name] = (default_rtol if rtol is None else rtol, default_atol if atol is None else atol)
        if rtol is None or atol is None:
            sources[output.name] = found
    return tolerances, sources
