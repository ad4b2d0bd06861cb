"""Types and shapes the model does not state, from one run of onnx shape inference.

Folding needs static shapes (``Shape`` and ``Size`` of values that are not
constant) and the decomposition needs element types; for values the model
leaves untyped, symbolic or unknown, passes ask :func:`infer_types` once
before their sweep. Inference runs on a copy without weights:
tensors larger than a kilobyte are serialised as external-data references
that point nowhere (dims and dtype kept, no bytes), so a >2 GB model or one
with external data is never serialised with its weights. External tensors of
a kilobyte or less (Reshape targets, axes, a model saved with every
initializer external) are read and serialised inline, as data propagation
needs their values. Large attribute lists left in the model file (see
:mod:`passes.modelio.detach`) are serialised as their empty markers, never
decoded: onnx's inference of the ops that hold them does not read them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import onnx
import onnx.shape_inference
import onnx_ir as ir

from passes.errors import InputError
from passes.ir import known, tensors, walk
from passes.limits import PROTOBUF_MAX

__all__ = [
    "infer_all", "infer_static_shapes", "infer_types", "inference_error", "is_static", "known_dims", "shape_slice",
    "tensor_type",
]

logger = logging.getLogger(__name__)

_BIG_TENSOR_BYTES = 1024
_GRAPH_ATTRS = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
_IR_GRAPH_ATTRS = (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
_PLACEHOLDER = "onnx-optimize-shape-inference-placeholder.bin"


def is_static(shape: ir.Shape | None) -> bool:
    """Whether every dimension of ``shape`` is a known size (an int >= 0: a negative one is unknown,
    see :func:`known_dims`)."""
    return shape is not None and all(isinstance(d, int) and d >= 0 for d in shape)


def known_dims(shape: ir.Shape) -> tuple[int | str | None, ...]:
    """Each dim of ``shape``: its size, its symbol's name, or None (unknown).

    A negative int is unknown: no tensor has such a dim, and onnx-graphsurgeon and
    tract write ``-1`` for an unknown one. The load makes them unnamed dims
    (:func:`passes.modelio.repair.unknown_negative_dims`); a model built in memory
    may still hold one, and no prover may take it for a size.
    """
    return tuple((d if d >= 0 else None) if isinstance(d, int) else (d.value if isinstance(d, ir.SymbolicDim) else None)
                 for d in shape)  # fmt: skip


def shape_slice(dims: Sequence[int], start: int = 0, end: int | None = None) -> np.ndarray:
    """``Shape-15`` semantics: ``dims[start:end]`` with negative axes and clamping."""
    rank = len(dims)
    end = rank if end is None else end
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = min(max(end + rank if end < 0 else end, 0), rank)
    return np.array(dims[start:end], dtype=np.int64)


def _placeholder(tensor: ir.TensorProtocol | None, name: str | None) -> ir.TensorProtocol | None:
    """What inference sees instead of ``tensor``, or None for the tensor itself.

    A big tensor: an external-data reference to no file with its dtype and dims.
    A small external one: its values in memory (the data file is relative to a
    folder the serialised copy does not know).
    """
    if tensor is None or tensor.dtype == ir.DataType.STRING:
        return None
    if isinstance(tensor, ir.ExternalTensor):
        if tensors.tensor_nbytes(tensor) > _BIG_TENSOR_BYTES:
            return None
        try:
            array = tensors.read_external(tensor)  # checked reads: a shrunk file must not SIGBUS
            return ir.Tensor(array, dtype=tensor.dtype, name=name or tensor.name)
        except (InputError, OSError, ValueError):  # unreadable: inference goes without its values
            return None
    nbytes = tensors.tensor_nbytes(tensor)  # each inference asks about every constant
    if nbytes <= _BIG_TENSOR_BYTES:
        return None
    return ir.ExternalTensor(
        _PLACEHOLDER, 0, nbytes, tensor.dtype, shape=tensor.shape, name=name or ""
    )


def _serialize_without_weights(model: ir.Model) -> onnx.ModelProto:
    """Serialises ``model`` with its big in-memory tensors as external-data references.

    Initializers and ``Constant`` values above a kilobyte, in every graph, are
    swapped for placeholders (see ``_placeholder``): the proto keeps the dims
    and dtypes inference needs but none of the bytes. The nodes' metadata and
    doc strings, which inference never reads, are left out too (the dynamo
    exporter's stack traces: 37 of a 52 MB Llama export's bytes, serialised
    again for every inference). The model is restored before returning.
    """
    values: list[tuple[ir.Value, ir.TensorProtocol]] = []
    attrs: list[tuple[ir.Node, ir.Attr]] = []
    notes: list[tuple[ir.Node, dict[str, str], str | None]] = []
    try:
        for graph in walk.graphs(model):
            for value in graph.initializers.values():
                if (placeholder := _placeholder(value.const_value, value.name)) is not None:
                    values.append((value, value.const_value))
                    value.const_value = placeholder
            for node in graph:
                if node.metadata_props or node.doc_string:
                    notes.append((node, dict(node.metadata_props), node.doc_string))
                    node.metadata_props.clear()
                    node.doc_string = None
                attr = node.attributes.get("value")
                if (
                    node.op_type != "Constant"
                    or not isinstance(attr, ir.Attr)
                    or attr.type != ir.AttributeType.TENSOR
                ):
                    continue
                if (placeholder := _placeholder(attr.value, attr.value.name)) is not None:
                    attrs.append((node, attr))
                    node.attributes["value"] = ir.AttrTensor("value", placeholder)
        # Large ai.onnx.ml/custom-op lists left in the file (detach.DetachedAttr) stay there: the
        # serialised copy holds their markers, never the decoded lists (tens of millions of elements).
        from passes.modelio import detach  # noqa: PLC0415 (modelio imports this package)

        with detach.swapped(model):
            return ir.serde.serialize_model(model)
    finally:
        for value, tensor in values:
            value.const_value = tensor
        for node, attr in attrs:
            node.attributes["value"] = attr
        for node, metadata, doc_string in notes:
            node.metadata_props.update(metadata)
            node.doc_string = doc_string


def tensor_type(type_proto: onnx.TypeProto) -> tuple[ir.DataType | None, tuple[Any, ...] | None] | None:
    """(element type, (dims, denotations) or None) of a tensor type, as ``ir.serde`` reads them
    (a dim: its value, its parameter or None); None if ``type_proto`` is not a tensor type."""
    if not type_proto.HasField("tensor_type"):
        return None
    tensor = type_proto.tensor_type
    elem = tensor.elem_type
    dtype = ir.DataType(elem) if elem else None
    if not tensor.HasField("shape"):
        return dtype, None
    dims: list[int | str | None] = []
    denotations: list[str | None] = []
    for dim in tensor.shape.dim:
        which = dim.WhichOneof("value")
        dims.append(dim.dim_value if which == "dim_value" else dim.dim_param if which == "dim_param" else None)
        denotations.append(dim.denotation if dim.HasField("denotation") else None)
    return dtype, (tuple(dims), tuple(denotations))


def _walk(
    graph: ir.Graph,
    proto: onnx.GraphProto,
    wanted: dict[ir.Graph, dict[str, ir.Value]],
    found: dict[ir.Value, tuple[ir.DataType | None, ir.Shape | None]],
    pending: set[ir.Graph],
) -> None:
    """What ``proto`` (the inferred copy of ``graph``) says of the values ``wanted`` asks about, into
    ``found``; ``pending``: the graphs asked about not read yet (the walk stops when none is left)."""
    names = wanted.get(graph)
    if names:
        # Many values share one type: each distinct TypeProto is read once (a fresh Shape per value).
        read: dict[bytes, tuple[ir.DataType | None, tuple[Any, ...] | None] | None] = {}
        for infos in (proto.value_info, proto.output, proto.input):
            for info in infos:
                value = names.get(info.name)
                if value is None:
                    continue
                type_proto = info.type
                key = type_proto.SerializeToString()
                if key not in read:
                    read[key] = tensor_type(type_proto)
                if (known := read[key]) is not None:
                    dtype, dims = known
                    found[value] = (dtype, None if dims is None else ir.Shape(dims[0], denotations=dims[1], frozen=True))
    pending.discard(graph)
    if not pending:  # every graph asked about is read: the subgraphs of the rest are not walked
        return
    for node, node_proto in zip(graph, proto.node):
        if not pending:
            return
        stored = node.attributes
        subgraphs = [attr for attr in getattr(stored, "data", stored).values()  # the attributes' own dict
                     if isinstance(attr, ir.Attr) and attr.type in _IR_GRAPH_ATTRS]  # fmt: skip
        if not subgraphs:
            continue
        graph_attrs = {a.name: a for a in node_proto.attribute if a.type in _GRAPH_ATTRS}
        for attr in subgraphs:
            if attr.name not in graph_attrs:
                continue
            attr_proto = graph_attrs[attr.name]
            if attr.type == ir.AttributeType.GRAPH:
                _walk(attr.as_graph(), attr_proto.g, wanted, found, pending)
            elif attr.type == ir.AttributeType.GRAPHS:
                for sub, sub_proto in zip(attr.as_graphs(), attr_proto.graphs):
                    _walk(sub, sub_proto, wanted, found, pending)


def _forget_declared_shapes(graph: onnx.GraphProto) -> None:
    """Drops what the model declares about values its nodes compute (value_info, output shapes).

    Inference then derives every shape from the graph inputs and the ops: a
    declared shape the graph contradicts (exporters write such) is never
    taken as a fact. Graph inputs keep their declared types: they are the contract.
    """
    del graph.value_info[:]
    for output in graph.output:
        if output.type.HasField("tensor_type"):
            output.type.tensor_type.ClearField("shape")
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                _forget_declared_shapes(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    _forget_declared_shapes(sub)


def infer_types(
    model: ir.Model, values: Iterable[ir.Value], *, derived_only: bool = False
) -> dict[ir.Value, tuple[ir.DataType | None, ir.Shape | None]]:
    """The element type and shape onnx shape inference finds for ``values``.

    Args:
        model: The model (left unchanged).
        values: Values of the main graph or its subgraphs. Graph inputs are
            ignored: their declared type is the contract, not what inference
            derives from an initializer. Function bodies are not inferred.
        derived_only: Forget the shapes the model declares for computed values
            first, so that every shape found is derived from the graph inputs.

    Returns:
        What inference found for each value it typed. Empty when inference
        fails or the model is too large to serialise even without weights.
    """
    wanted: dict[ir.Graph, dict[str, ir.Value]] = {}
    for value in values:
        if value.graph is not None and value.name and not value.is_graph_input():
            wanted.setdefault(value.graph, {})[value.name] = value
    if not wanted:
        return {}
    proto = _serialize_without_weights(model)
    if derived_only:
        _forget_declared_shapes(proto.graph)
    if proto.ByteSize() >= PROTOBUF_MAX:
        logger.warning("Model too large for onnx shape inference even without its weights")
        return {}
    try:
        inferred = onnx.shape_inference.infer_shapes(
            proto, check_type=False, strict_mode=False, data_prop=True
        )
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as e:
        logger.warning("onnx shape inference failed, using the model's types only: %s", e)
        return {}
    found: dict[ir.Value, tuple[ir.DataType | None, ir.Shape | None]] = {}
    _walk(model.graph, inferred.graph, wanted, found, set(wanted))
    return found


def inference_error(model: ir.Model) -> str | None:
    """What strict onnx shape inference finds wrong in ``model`` (on the weight-free view), or None.

    Shapes the model states for computed values are forgotten first, so that a
    contradiction is one of the ops with the graph inputs (a declared static
    input that a weight's size does not allow, for one).
    """
    proto = _serialize_without_weights(model)
    _forget_declared_shapes(proto.graph)
    if proto.ByteSize() >= PROTOBUF_MAX:
        return None
    try:
        onnx.shape_inference.infer_shapes(proto, check_type=False, strict_mode=True, data_prop=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as e:
        return " ".join(str(e).split())
    return None


def infer_static_shapes(model: ir.Model, values: Iterable[ir.Value]) -> dict[ir.Value, tuple[int, ...]]:
    """The static shapes onnx shape inference finds for ``values`` (see :func:`infer_types`)."""
    return {
        value: tuple(int(d) for d in shape)
        for value, (_, shape) in infer_types(model, values).items()
        if is_static(shape)
    }


def infer_all(
    model: ir.Model, *, remember: bool = True
) -> dict[ir.Value, tuple[ir.DataType | None, ir.Shape | None]]:
    """Types and shapes derived by inference for every value nodes compute (main graph, subgraphs).

    Declared shapes of computed values are ignored (``derived_only``); dims
    that inference cannot tell are symbolic (a name it made up, or one that
    comes from a graph input's ``dim_param``). Within a run of the pass loop what
    it finds is kept (``remember``; :mod:`passes.ir.known`): a later question about
    every value is answered without inference while the graph keeps those types.
    """
    values = [v for graph in walk.graphs(model) for node in graph for v in node.outputs]
    found = infer_types(model, values, derived_only=True)
    if remember:
        known.record(model, found)
    return found
