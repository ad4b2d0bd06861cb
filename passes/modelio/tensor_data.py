"""The tensors of a parsed model, checked without reading external data.

Every string field must be UTF-8 (protobuf hands one that is not over as
bytes): the model's survey (:mod:`passes.modelio.survey`, one parse in C)
says so; when it does not know, a walk over every message checks each field
and names the first bad one. Every tensor at any depth (initializers, sparse
tensors, attribute values and defaults, subgraphs, functions) is found in a
walk over the protobuf (:func:`check_tensors`) that enters only the fields
that can hold one, and no node when the survey knows that no attribute holds
a tensor or a graph.
Inline data must be exactly what the tensor's type and shape declare; an
external tensor's location must stay inside the model's folder and name a
regular file with one hard link that its offset and length fit, which are
only looked at (``stat``), never opened. Each such file's :data:`Identity` is
noted so that a file swapped after the check is recognised.
:mod:`passes.modelio.validate` runs this after its checks of the model's
structure, and before the ONNX checker.
"""

from __future__ import annotations

import functools
import os
import pathlib
from collections.abc import Iterable

import google.protobuf.descriptor
import google.protobuf.message
import onnx
import onnx.external_data_helper
import onnx_ir as ir

from passes.errors import InputError, first_line as _first_line
from passes.modelio import detach as _detach
from passes.modelio.survey import Survey, survey

__all__ = ["Identity", "check_tensors", "identity"]

def _scan(message: google.protobuf.message.Message, tensors: list[onnx.TensorProto]) -> None:
    """Collects every TensorProto inside ``message``, at any depth (initializers, sparse
    tensors, attribute values and defaults, subgraphs, functions, training info).

    Raises:
        InputError: a string field is not valid UTF-8 (protobuf hands those over as bytes,
            which nothing downstream expects).
    """
    if isinstance(message, onnx.TensorProto):
        tensors.append(message)
    for field, value in message.ListFields():
        kind = field.type
        if kind == _TYPE_STRING:  # one value (str, or bytes when not UTF-8) or a repeated container of them
            if type(value) is bytes or (type(value) is not str and bytes in map(type, value)):
                raise InputError(f"{message.DESCRIPTOR.name}.{field.name} is not valid UTF-8 text")
        elif kind == _TYPE_MESSAGE:
            if isinstance(value, _MESSAGE):
                _scan(value, tensors)
            else:
                for item in value:
                    _scan(item, tensors)


# Looked up once: _scan visits every message of the model (50k nodes: 150k messages).
_TYPE_STRING = google.protobuf.descriptor.FieldDescriptor.TYPE_STRING
_TYPE_MESSAGE = google.protobuf.descriptor.FieldDescriptor.TYPE_MESSAGE
_MESSAGE = google.protobuf.message.Message

@functools.cache
def _tensor_fields(descriptor: google.protobuf.descriptor.Descriptor) -> frozenset[str]:
    """The message fields of ``descriptor`` whose type can hold a TensorProto at some depth."""
    def reaches(kind: google.protobuf.descriptor.Descriptor, seen: set[str]) -> bool:
        if kind.full_name == onnx.TensorProto.DESCRIPTOR.full_name:
            return True
        seen.add(kind.full_name)
        return any(f.message_type is not None and f.message_type.full_name not in seen
                   and reaches(f.message_type, seen) for f in kind.fields)  # fmt: skip

    return frozenset(f.name for f in descriptor.fields if f.message_type is not None and reaches(f.message_type, set()))


def _collect(message: google.protobuf.message.Message, tensors: list[onnx.TensorProto], nodes: bool = True) -> None:
    """The tensors :func:`_scan` collects, in its order, without its look at the text: only the
    fields that can lead to a tensor are entered (a model's value types and names are not), and
    no node when ``nodes`` is False (no attribute holds a tensor or a graph: see
    :mod:`passes.modelio.survey`)."""
    if isinstance(message, onnx.TensorProto):
        tensors.append(message)
    wanted = _tensor_fields(message.DESCRIPTOR)
    for field, value in message.ListFields():
        if field.name in wanted:
            if isinstance(value, _MESSAGE):
                _collect(value, tensors, nodes)
            elif field.message_type.full_name == _NODE and _tensor_fields(onnx.NodeProto.DESCRIPTOR) == {"attribute"}:
                if nodes:
                    _collect_nodes(value, tensors)
            else:
                for item in value:
                    _collect(item, tensors, nodes)


_NODE = onnx.NodeProto.DESCRIPTOR.full_name


def _collect_nodes(nodes: Iterable[onnx.NodeProto], tensors: list[onnx.TensorProto]) -> None:
    """:func:`_collect` on each node, whose only field that leads to a tensor is ``attribute``: a
    node's own message is not looked at (50k nodes: half the time)."""
    wanted = _tensor_fields(onnx.AttributeProto.DESCRIPTOR)
    for node in nodes:
        for attr in node.attribute:
            for field, value in attr.ListFields():
                if field.name in wanted:
                    if isinstance(value, _MESSAGE):
                        _collect(value, tensors)
                    else:
                        for item in value:
                            _collect(item, tensors)


def _tensor_label(tensor: onnx.TensorProto) -> str:
    return f"tensor {_short(tensor.name)}" if tensor.name else "an unnamed tensor"


def _element_count(tensor: onnx.TensorProto) -> int:
    count = 1
    for d in tensor.dims:
        if d < 0:
            raise InputError(f"{_tensor_label(tensor)} has a negative dimension {d}")
        count *= d
    return count


def _data_type(tensor: onnx.TensorProto) -> ir.DataType:
    try:
        dtype = ir.DataType(tensor.data_type)
    except ValueError:
        dtype = ir.DataType.UNDEFINED
    if dtype == ir.DataType.UNDEFINED:
        raise InputError(f"{_tensor_label(tensor)} has an unknown data type {tensor.data_type}")
    return dtype


def _packed_nbytes(dtype: ir.DataType, count: int) -> int:
    return (dtype.bitwidth * count + 7) // 8


# The typed field that holds each data type's values when raw_data is not used (int32_data
# for every type not listed: one value per entry, or 2 or 4 values for 4- and 2-bit types).
_TYPED_FIELDS = {
    ir.DataType.FLOAT: "float_data", ir.DataType.COMPLEX64: "float_data",
    ir.DataType.DOUBLE: "double_data", ir.DataType.COMPLEX128: "double_data",
    ir.DataType.INT64: "int64_data", ir.DataType.UINT32: "uint64_data",
    ir.DataType.UINT64: "uint64_data", ir.DataType.STRING: "string_data",
}
_DATA_FIELDS = ("raw_data", "float_data", "int32_data", "string_data", "int64_data",
                "double_data", "uint64_data")


def _check_inline_data(tensor: onnx.TensorProto) -> None:
    """The data stored in the tensor itself must be exactly what its type and shape declare.

    A weight's stand-in (its data left in the file, see :mod:`passes.modelio.detach`)
    was checked on the wire: exactly the bytes its type and shape declare.
    """
    if tensor.doc_string and _detach.weight_key(tensor.doc_string) is not None:
        return
    dtype = _data_type(tensor)
    count = _element_count(tensor)
    label = _tensor_label(tensor)
    present = [f for f in _DATA_FIELDS if (tensor.HasField(f) if f == "raw_data" else len(getattr(tensor, f)))]
    if tensor.HasField("segment"):
        raise InputError(f"{label} is segmented; segmented tensors are not supported")
    if len(present) > 1:
        raise InputError(f"{label} stores its data in several fields ({', '.join(present)})")
    if present == ["raw_data"]:
        if dtype == ir.DataType.STRING:
            raise InputError(f"{label}: a string tensor cannot use raw_data")
        expected = _packed_nbytes(dtype, count)
        if len(tensor.raw_data) != expected:
            raise InputError(
                f"{label}: raw_data has {len(tensor.raw_data)} bytes, but its shape "
                f"{list(tensor.dims)} and type {dtype.name} need {expected}"
            )
        return
    field = _TYPED_FIELDS.get(dtype, "int32_data")
    if present and present != [field]:
        raise InputError(f"{label}: a {dtype.name} tensor cannot store its data in {present[0]}")
    if dtype in (ir.DataType.COMPLEX64, ir.DataType.COMPLEX128):
        expected = 2 * count
    elif field == "int32_data" and dtype.bitwidth < 8:
        expected = -(-count // (8 // dtype.bitwidth)) if 8 % dtype.bitwidth == 0 else count
    else:
        expected = count
    actual = len(getattr(tensor, field))
    if actual != expected:
        raise InputError(
            f"{label}: {field} has {actual} values, but its shape {list(tensor.dims)} "
            f"and type {dtype.name} need {expected}"
        )


def _external_info(tensor: onnx.TensorProto) -> tuple[str, int, int | None]:
    """(location, offset, length) of an external tensor, each validated."""
    label = _tensor_label(tensor)
    entries: dict[str, str] = {}
    for entry in tensor.external_data:
        if entry.key in entries:
            raise InputError(f"{label}: external data key {entry.key!r} is given twice")
        entries[entry.key] = entry.value
    if entries.get("basepath"):
        raise InputError(f"{label}: external data 'basepath' is not supported")
    numbers: dict[str, int] = {}
    for key in ("offset", "length"):
        text = entries.get(key)
        if text is None:
            continue
        # ASCII digits only: str.isdigit() also takes '²' (int() then fails) and Arabic-Indic
        # digits (int() reads them, onnxruntime does not); 20 digits reach past any file size.
        if not text or len(text) > _MAX_DIGITS or not set(text) <= _ASCII_DIGITS:
            raise InputError(f"{label}: external data {key} {_short(text)} is not a non-negative integer")
        numbers[key] = int(text)
    return entries.get("location", ""), numbers.get("offset", 0), numbers.get("length")


_ASCII_DIGITS = frozenset("0123456789")
_MAX_DIGITS = 20


def _short(text: str, limit: int = 80) -> str:
    """``repr(text)``, cut to about ``limit`` characters for a message."""
    shown = repr(text)
    return shown if len(shown) <= limit else shown[: limit - 4] + "...'"


#: How a validated external-data file is recognised later: (device, inode, size, mtime in ns).
Identity = tuple[int, int, int, int]


def identity(path: pathlib.Path) -> Identity:
    """The :data:`Identity` of the file at ``path`` itself (a symlink there is not followed)."""
    info = os.lstat(path)
    return info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns


def check_tensors(
    proto: onnx.ModelProto, base_dir: pathlib.Path, identities: dict[pathlib.Path, Identity] | None = None,
    known: Survey | None = None,
) -> int:
    """Validates all text and every tensor's data; returns how many tensors are stored externally.

    Inline data must match the declared type and shape exactly. An external
    location must be relative, stay inside ``base_dir`` (no ``..``, no absolute
    path, no symlink escaping it), name an existing regular file with a single
    hard link, and the declared offset and length must fit in that file and
    match the tensor's type and shape. Nothing is opened: only paths and
    ``stat`` results are inspected. Each external file's :data:`Identity` goes
    into ``identities`` (by resolved path), so that a file swapped after this
    check can be recognised. ``known``: the model's :func:`~passes.modelio.survey.survey`,
    if the caller made it.
    """
    found = 0
    base = base_dir.resolve()
    tensors: list[onnx.TensorProto] = []
    known = survey(proto) if known is None else known
    if known.text:
        _collect(proto, tensors, nodes=not known.plain)
    else:
        _scan(proto, tensors)
    for tensor in tensors:
        if not onnx.external_data_helper.uses_external_data(tensor):
            _check_inline_data(tensor)
            continue
        found += 1
        label = _tensor_label(tensor)
        location, offset, length = _external_info(tensor)
        if not location:
            raise InputError(f"{label} uses external data without a location")
        shown = _short(location)
        rel = pathlib.PurePath(location)
        if "\0" in location:
            raise InputError(f"{label}: external data location {shown} is not a valid path")
        if rel.is_absolute() or location.startswith(("/", "\\")) or ".." in rel.parts or (
            pathlib.PureWindowsPath(location).drive
        ):
            raise InputError(
                f"{label}: external data location {shown} "
                "points outside the model's folder; refusing to read it"
            )
        try:
            path = (base / rel).resolve()
        except (OSError, RuntimeError) as e:  # RuntimeError: a symlink loop (Python < 3.13)
            raise InputError(f"{label}: external data location {shown} cannot be resolved "
                             f"({_os_reason(e)})") from e  # fmt: skip
        if base not in path.parents:
            raise InputError(
                f"{label}: external data location {shown} "
                "resolves outside the model's folder; refusing to read it"
            )
        try:
            stat = path.stat()
        except FileNotFoundError:
            raise InputError(f"{label}: external data file {shown} not found") from None
        except OSError as e:  # a name too long, a permission denied...
            raise InputError(f"{label}: external data file {shown} cannot be used ({_os_reason(e)})") from e
        if not path.is_file():
            raise InputError(f"{label}: external data {shown} is not a regular file")
        if stat.st_nlink > 1:
            raise InputError(
                f"{label}: external data file {shown} has {stat.st_nlink} hard links; "
                "refusing to read it (it may be a link to a file outside the model's folder)"
            )
        if identities is not None:
            identities[path] = identity(path)
        size = stat.st_size
        if length is None:
            length = size - offset
        if offset + length > size or length < 0:
            raise InputError(
                f"{label}: external data {shown} is truncated "
                f"(needs bytes {offset}..{offset + length}, file has {size})"
            )
        dtype = _data_type(tensor)
        if dtype == ir.DataType.STRING:
            raise InputError(f"{label}: a string tensor cannot be stored externally")
        expected = _packed_nbytes(dtype, _element_count(tensor))
        if expected != length:
            raise InputError(
                f"{label}: external data length {length} does not match "
                f"its shape {list(tensor.dims)} and type {dtype.name} ({expected} bytes)"
            )
    return found


def _os_reason(error: BaseException) -> str:
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return "a symlink loop" if "loop" in str(error).lower() else _first_line(error, 200)
