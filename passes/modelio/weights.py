"""How the loader holds a model's large weights, and how they come back into memory.

Three ways, by where the model came from (see :mod:`passes.modelio.load`):

* In a large file, a plain weight stays in the file: :mod:`passes.modelio.detach`
  parses a stand-in without its data and :func:`attach` gives the IR an
  ``InlineData`` over its bytes (:mod:`passes.ir.tensors`), never counted as
  external data (:func:`stored_externally`).
* In a proto already in memory (a small file, the Python API), a plain weight
  over 1 MiB leaves the proto for an array of its own (:func:`move_out_large`).
* External data is memory-mapped by onnx_ir.

:func:`in_memory` reads either kind of file-backed tensor into memory, where a
tensor must not refer to a file (a Constant's value, a model handed to a
caller: :func:`read_weights_in_file`).

Importing this module is cheap: onnx, onnx_ir and numpy are imported on first use.
"""

from __future__ import annotations

import os
import pathlib
from typing import TYPE_CHECKING

from passes.lazy import lazy_module

if TYPE_CHECKING:
    import numpy as np
    import onnx
    import onnx_ir as ir

    from passes.modelio import detach as _detach
else:
    np = lazy_module("numpy")
    onnx = lazy_module("onnx")
    ir = lazy_module("onnx_ir")
    _detach = lazy_module("passes.modelio.detach")
_tensors = lazy_module("passes.ir.tensors")
_views = lazy_module("passes.modelio.views")
_unknown_fields = lazy_module("google.protobuf.unknown_fields")

__all__ = ["attach", "in_memory", "move_out_large", "read_weights_in_file", "stored_externally"]


def stored_externally(tensor: ir.TensorProtocol | None) -> bool:
    """Whether ``tensor`` is external data (a weight left in the model file itself is not)."""
    return isinstance(tensor, ir.ExternalTensor) and not isinstance(tensor, _tensors.InlineData)


def attach(model: ir.Model, weights: dict[str, _detach.Weight]) -> None:
    """Each weight's stand-in (see :func:`passes.modelio.detach.read_view`) becomes an ``InlineData`` over its bytes."""
    for value in model.graph.initializers.values():
        tensor = value.const_value
        key = _detach.weight_key(getattr(tensor, "doc_string", None)) if tensor is not None else None
        if key is None or key not in weights:
            continue
        weight = weights[key]
        folder, file = os.path.split(weight.source.path)
        value.const_value = _tensors.InlineData(
            file, weight.source.offset, weight.source.length, tensor.dtype, shape=tensor.shape, name=tensor.name,
            doc_string=weight.doc_string, base_dir=folder,
        )  # fmt: skip


def read_weights_in_file(model: ir.Model) -> None:
    """Reads each weight left in the model file (``InlineData``) into memory, in place.

    For a model handed to a caller: onnx_ir's own save would write such a weight
    as a reference to the input file.
    """
    for value in model.graph.initializers.values():
        if isinstance(value.const_value, _tensors.InlineData):
            value.const_value = in_memory(value.const_value)


#: The TensorProto fields a weight may have set to be moved out of the proto (see below).
_PLAIN_FIELDS = frozenset({"dims", "data_type", "name", "doc_string", "raw_data"})


def _plain_weight(tensor: onnx.TensorProto) -> bool:
    """Whether onnx_ir writes the tensor back byte for byte from an array: raw data of a
    whole-byte numeric type, a name, no field but those of :data:`_PLAIN_FIELDS` (none empty)."""
    if not tensor.name or not tensor.HasField("raw_data") or tensor.data_type == onnx.TensorProto.STRING:
        return False
    if tensor.HasField("doc_string") and not tensor.doc_string:
        return False
    for field in tensor.DESCRIPTOR.fields:
        if field.name not in _PLAIN_FIELDS and (
            len(getattr(tensor, field.name)) if field.is_repeated else tensor.HasField(field.name)
        ):
            return False
    return ir.DataType(tensor.data_type).bitwidth % 8 == 0 and not _unknown_fields.UnknownFieldSet(tensor)


def move_out_large(proto: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, ir.Tensor]]:
    """A light copy of ``proto`` without the data of its large plain weights, and those weights as arrays.

    A proto cannot give up one field's memory (protobuf frees a parsed message
    as a whole), and onnx_ir's tensors of a proto copy its ``raw_data`` each
    time they are read: a 100 MB weight was held by the proto for the whole
    run and copied again by every read. The main graph's plain initializers
    over 1 MiB (see :func:`_plain_weight`) become arrays over one copy of their
    bytes; the copy of the proto without them is small, and the caller's proto
    can go. ``proto`` itself and no weights when there are none.
    """
    large = _views.large_initializers(proto)
    names = {t.name for t in proto.graph.initializer if t.name in large and _plain_weight(t)}
    if not names:
        return proto, {}
    weights = {}
    for t in proto.graph.initializer:
        if t.name in names:
            dtype = ir.DataType(t.data_type)
            array = np.frombuffer(t.raw_data, dtype=dtype.numpy().newbyteorder("<")).reshape(tuple(t.dims))
            weights[t.name] = ir.Tensor(array, dtype=dtype, name=t.name, doc_string=t.doc_string or None)
    return _views.without_initializers(proto, names, keep_as=_dims_and_type), weights


def _dims_and_type(source: onnx.TensorProto, target: onnx.TensorProto) -> None:
    """The stand-in of a moved-out weight in the light copy: its name, type and shape, no data."""
    target.name, target.data_type = source.name, source.data_type
    target.dims.extend(source.dims)


def in_memory(
    tensor: ir.TensorProtocol | None, base_dir: pathlib.Path | None = None
) -> ir.TensorProtocol | None:
    """An external tensor read (from ``base_dir`` if given) into memory; any other tensor as it is.

    Unlike onnx_ir's own conversion, this leaves the tensor's memory map open:
    closing it fails (BufferError) while a pass still holds an array viewing it.
    """
    if not isinstance(tensor, ir.ExternalTensor):
        return tensor
    if base_dir is not None:
        tensor.base_dir = str(base_dir)
    if isinstance(tensor, _tensors.InlineData):  # read, not mapped: the model file may be replaced
        return ir.Tensor(_tensors.read_external(tensor), dtype=tensor.dtype, name=tensor.name,
                         doc_string=tensor.doc_string)  # fmt: skip
    return ir.Tensor(tensor.numpy().copy(), dtype=tensor.dtype, name=tensor.name)
