"""``ir.serde.serialize_model``, its bytes exactly, with the main graph's nodes and value_info written here.

onnx_ir writes each node, attribute and value_info through a chain of calls, each
wrapped in an error-capturing decorator: about 12 us a node and 4 us a value_info.
The save of the 10,000-node chain's output (17k nodes, 17k value_infos) spent 0.22 s
CPU there, a tenth of the run after the imports; here it takes 0.12 s.

Here onnx_ir writes everything but the main graph's nodes (the model's fields,
opset imports, the graph's inputs, initializers, outputs and metadata, the
functions) from a stand-in graph without nodes, and the nodes and their outputs'
value_infos are appended after, in graph order: protobuf writes a message's fields
in the order of their numbers, and a repeated field in the order it was filled,
so the bytes are those onnx_ir's own walk makes. A node is written by the fast path
when what it holds is plain (no doc string, metadata or device configuration;
attributes of kind INT, INTS, FLOAT or STRING are written here, any other by
``ir.serde.serialize_attribute_into``); a node holding a subgraph, or anything
else, by ``ir.serde.serialize_node_into``. A value_info whose type is a plain tensor
type is a copy of the first one written with the same type and shape.

onnx_ir's own walk is used whole where the order would differ: a node output with
a quantization annotation (onnx_ir writes it between the inputs' and the
outputs'), and functions of a model below IR 10 (whose value_infos onnx_ir puts
in the main graph after the nodes').
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import Any

import onnx
import onnx_ir as ir

__all__ = ["serialize_model"]

#: onnx_ir's key in ``Value.meta`` of a quantization annotation (written with the graph).
_QUANTIZATION = "quant_parameter_tensor_names"
#: The IR version from which functions state their own value_info (below it onnx_ir writes them
#: into the main graph, after its nodes').
_FUNCTION_VALUE_INFO_SINCE = 10

_INT, _INTS, _FLOAT, _STRING = ir.AttributeType.INT, ir.AttributeType.INTS, ir.AttributeType.FLOAT, ir.AttributeType.STRING
_GRAPHS = (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)


class _Unordered(Exception):
    """The fast path would write something in another order than onnx_ir's walk."""


class _Frame:
    """The main graph as onnx_ir's ``serialize_graph_into`` reads it, without its nodes."""

    def __init__(self, graph: ir.Graph) -> None:
        self.name = graph.name
        self.doc_string = graph.doc_string
        self.inputs = graph.inputs
        self.initializers = graph.initializers
        self.outputs = graph.outputs
        self.metadata_props = graph.metadata_props

    def __iter__(self) -> Iterator[ir.Node]:
        return iter(())

    def __len__(self) -> int:
        return 0


class _WithFrame:
    """The model as onnx_ir's ``serialize_model_into`` reads it, its graph a :class:`_Frame`."""

    def __init__(self, model: ir.Model) -> None:
        self._model = model
        self.graph = _Frame(model.graph)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


def serialize_model(model: ir.Model) -> onnx.ModelProto:
    """``ir.serde.serialize_model(model)``: the same proto, the same bytes (see the module docstring)."""
    if model.functions and model.ir_version < _FUNCTION_VALUE_INFO_SINCE:
        return ir.serde.serialize_model(model)
    proto = ir.serde.serialize_model_into(onnx.ModelProto(), from_=_WithFrame(model))  # type: ignore[arg-type]
    try:
        _nodes_into(proto.graph, model.graph, model.ir_version)
    except _Unordered:
        return ir.serde.serialize_model(model)
    return proto


def _nodes_into(graph_proto: onnx.GraphProto, graph: ir.Graph, ir_version: int) -> None:
    nodes = graph_proto.node
    infos = graph_proto.value_info
    types: dict[Hashable, onnx.TypeProto] = {}
    for node in graph:
        _node_into(nodes.add(), node, ir_version)
        for value in node.outputs:
            if value.is_graph_output():
                continue
            if value.meta.get(_QUANTIZATION):
                raise _Unordered
            if value.shape is None and value.type is None and not value.metadata_props and not value.doc_string:
                continue
            if not value.name:
                continue
            _value_into(infos.add(), value, types)


def _node_into(proto: onnx.NodeProto, node: ir.Node, ir_version: int) -> None:
    """``ir.serde.serialize_node_into``, for a plain node without its chain of calls."""
    stored = node.attributes
    attributes = getattr(stored, "data", stored)  # the attributes' own dict, without a view
    if node.doc_string or node.metadata_props or getattr(node, "device_configurations", None):
        ir.serde.serialize_node_into(proto, from_=node, model_ir_version=ir_version)
        return
    for attr in attributes.values():
        if attr.type in _GRAPHS:
            ir.serde.serialize_node_into(proto, from_=node, model_ir_version=ir_version)
            return
    proto.op_type = node.op_type
    if node.domain:
        proto.domain = node.domain
    if node.name:
        proto.name = node.name
    if node.overload:
        proto.overload = node.overload
    proto.input.extend(["" if value is None else value.name for value in node.inputs])
    outputs = node.outputs
    kept = len(outputs)
    while kept and not outputs[kept - 1].name:  # trailing outputs without a name are left out
        kept -= 1
    proto.output.extend([outputs[i].name for i in range(kept)])
    for attr in attributes.values():
        into = proto.attribute.add()
        kind = attr.type
        if attr.is_ref():
            ir.serde.serialize_reference_attribute_into(into, from_=attr)
        elif kind is _INT and not attr.doc_string:
            into.name, into.i, into.type = attr.name, attr.value, onnx.AttributeProto.INT
        elif kind is _INTS and not attr.doc_string:
            into.name, into.type = attr.name, onnx.AttributeProto.INTS
            into.ints.extend(attr.value)
        elif kind is _FLOAT and not attr.doc_string:
            into.name, into.f, into.type = attr.name, attr.value, onnx.AttributeProto.FLOAT
        elif kind is _STRING and not attr.doc_string and type(attr.value) is str:
            into.name, into.s, into.type = attr.name, attr.value.encode("utf-8"), onnx.AttributeProto.STRING
        else:
            ir.serde.serialize_attribute_into(into, from_=attr)


def _value_into(proto: onnx.ValueInfoProto, value: ir.Value, types: dict[Hashable, onnx.TypeProto]) -> None:
    """``ir.serde.serialize_value_into``; the type of a plain tensor type copied from the first like it."""
    vtype, shape = value.type, value.shape
    if type(vtype) is not ir.TensorType or vtype.denotation or value.metadata_props or shape is None:
        ir.serde.serialize_value_into(proto, value)
        return
    dims: list[int | tuple[str | None]] = []
    for i, d in enumerate(shape):
        if type(d) is int:
            dims.append(d)
        elif type(d) is ir.SymbolicDim:  # as written: its name (or none), whatever the value's own type
            dims.append((None if d.value is None else str(d.value),))
        else:
            ir.serde.serialize_value_into(proto, value)
            return
        if shape.get_denotation(i):
            ir.serde.serialize_value_into(proto, value)
            return
    key = (vtype.dtype, tuple(dims))
    proto.name = value.name
    known = types.get(key)
    if known is None:
        ir.serde.serialize_type_into(proto.type, vtype)
        ir.serde.serialize_shape_into(proto.type, shape)
        types[key] = proto.type
    else:
        proto.type.CopyFrom(known)
    if value.doc_string:
        proto.doc_string = value.doc_string
