"""Light copies of a model for the ONNX checker: some main-graph initializers become graph inputs.

The checker takes a serialized model, so checking a model with a 100 MB
inline weight serialized it (100 MB) for onnx's C++ side to parse (another
100 MB), while the proto itself held it too. Neither the checker's type and
shape inference nor its structural checks need a large weight's values: as a
graph input of the same type and shape, the weight is simply an unknown value
(only shape-like inputs, a Reshape's target, say, a few bytes long, feed
inference with their values). Its data was checked against its type and shape
by ``validate.check_contents`` already. External initializers are handled the
same way (strict inference would fail on the value it cannot read).

A view is built field by field, never with ``CopyFrom`` of the whole model,
so the initializers it leaves out are not copied.
"""

from __future__ import annotations

from collections.abc import Callable

import google.protobuf.message
import onnx
import onnx.helper
import onnx_ir as ir

__all__ = ["LARGE", "large_initializers", "without_initializers"]

#: A main-graph initializer whose data is larger than this is left out of the checker's view.
LARGE = 1 << 20


def _nbytes(tensor: onnx.TensorProto) -> int:
    """The declared size of the tensor's data (its dims and type; its data is not read)."""
    try:
        bitwidth = ir.DataType(tensor.data_type).bitwidth
    except ValueError:
        return 0
    count = 1
    for d in tensor.dims:
        count *= max(d, 0)
    return (bitwidth * count + 7) // 8


def large_initializers(proto: onnx.ModelProto) -> set[str]:
    """The names of the main graph's inline numeric initializers over :data:`LARGE` bytes."""
    return {
        t.name for t in proto.graph.initializer
        if t.data_type != onnx.TensorProto.STRING and t.data_location != onnx.TensorProto.EXTERNAL
        and _nbytes(t) > LARGE
    }  # fmt: skip


def _copy_fields(source: google.protobuf.message.Message, target: google.protobuf.message.Message,
                 skip: str = "") -> None:  # fmt: skip
    """Copies every set field of ``source`` but ``skip`` into ``target``."""
    for field in source.DESCRIPTOR.fields:
        name = field.name
        if name == skip:
            continue
        if field.is_repeated:
            values = getattr(source, name)
            if len(values):
                getattr(target, name).extend(values)
        elif source.HasField(name):
            if field.type == field.TYPE_MESSAGE:
                getattr(target, name).CopyFrom(getattr(source, name))
            else:
                setattr(target, name, getattr(source, name))


def without_initializers(
    proto: onnx.ModelProto, names: set[str],
    keep_as: Callable[[onnx.TensorProto, onnx.TensorProto], None] | None = None,
) -> onnx.ModelProto:  # fmt: skip
    """A copy of ``proto`` whose main-graph initializers named in ``names`` are graph inputs instead.

    An initializer that is a graph input already is only left out. With
    ``keep_as``, each stays an initializer, filled by ``keep_as(original,
    new)`` instead (the loader's stand-ins for the weights it moves out).
    ``proto`` itself when ``names`` is empty.
    """
    if not names:
        return proto
    view = onnx.ModelProto()
    _copy_fields(proto, view, skip="graph")
    graph, source = view.graph, proto.graph
    _copy_fields(source, graph, skip="initializer")
    inputs = {i.name for i in source.input}
    for tensor in source.initializer:
        if tensor.name not in names:
            graph.initializer.add().CopyFrom(tensor)
        elif keep_as is not None:
            keep_as(tensor, graph.initializer.add())
        elif tensor.name not in inputs:
            graph.input.append(onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, tensor.dims))
    return view
