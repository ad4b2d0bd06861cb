"""Constant values for the folding pass: reading ``Constant`` nodes, making tensors.

The folding pass works on ``ir.TensorProtocol`` objects until it evaluates a
node; only then are the inputs turned into numpy arrays (``read_array``), which
is when external data is first read.

External data is read with checked reads (:func:`read_external`), never through
onnx_ir's memory map: a data file that shrinks while the pass runs (another
process rewriting it) would make the next access to a mapped page a SIGBUS,
which kills the process; a read of a short file is an ``InputError`` instead.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import stat
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import onnx
import onnx.numpy_helper
import onnx_ir as ir

from passes.errors import InputError

__all__ = [
    "KEEP_EXTERNAL",
    "InlineData",
    "attribute_values",
    "constant_tensor",
    "contained_path",
    "is_file_backed",
    "make_tensor",
    "read_array",
    "read_external",
    "read_external_chunks",
    "read_tensor",
    "sparse_to_dense",
    "tensor_nbytes",
]

logger = logging.getLogger(__name__)

#: Key of ``ir.Model.meta``: a pass that replaced a model's external weights by arrays (``--precision``
#: converts them) sets it so that the save still writes large weights to external data.
KEEP_EXTERNAL = "passes.keep_external_data"


class InlineData(ir.ExternalTensor):
    """A weight stored inline in the model file (its ``raw_data``), left there until something reads it.

    Not external data: the output stores it inline again (or in its data file,
    if it has one), copied from the input file by the kernel while no pass
    replaced it (see :mod:`passes.modelio.detach`). The file is the model file
    the loader validated, so its folder is fixed (onnx_ir's ``set_base_dir`` of
    a graph's external data does not move it) and its hard links do not matter.
    """

    __slots__ = ()

    @property
    def base_dir(self) -> str | os.PathLike[str]:
        return self._base_dir

    @base_dir.setter
    def base_dir(self, value: str | os.PathLike[str]) -> None:
        pass

_SCALAR_LIST_ATTRS = {
    # Constant attribute -> (numpy dtype, is a list)
    "value_float": (np.float32, False),
    "value_floats": (np.float32, True),
    "value_int": (np.int64, False),
    "value_ints": (np.int64, True),
}


def _string_tensor(values: Any, name: str | None) -> ir.StringTensor:
    array = np.asarray(values, dtype=object)
    encoded = np.array(
        [v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in array.reshape(-1)],
        dtype=object,
    ).reshape(array.shape)
    return ir.StringTensor(encoded, name=name)


def constant_tensor(node: ir.Node, dense_limit: int) -> ir.TensorProtocol | None:
    """The tensor a ``Constant`` node produces, in the dtype its attribute implies.

    ``value_float(s)`` give float32 and ``value_int(s)`` int64 (as the ONNX
    schema says), never numpy's float64 default. ``sparse_value`` is densified
    when the dense tensor is at most ``dense_limit`` bytes.

    Returns:
        The tensor, or None when the node is not a usable constant (an attribute
        reference inside a function, a malformed node, a sparse value too large
        to densify).
    """
    if len(node.attributes) != 1 or len(node.outputs) != 1:
        return None
    attr_name, attr = next(iter(node.attributes.items()))
    if not isinstance(attr, ir.Attr) or attr.is_ref() or attr.value is None:
        return None
    name = node.outputs[0].name
    if attr_name == "value":
        if attr.type == ir.AttributeType.TENSOR:  # the type says it: as_tensor() checks a runtime protocol (~40 us)
            return attr.value
        return attr.as_tensor()  # (raises: not a tensor)
    if attr_name in _SCALAR_LIST_ATTRS:
        dtype, _ = _SCALAR_LIST_ATTRS[attr_name]
        return ir.Tensor(np.array(attr.value, dtype=dtype), name=name)
    if attr_name in ("value_string", "value_strings"):
        return _string_tensor(attr.value, name)
    if attr_name == "sparse_value" and isinstance(attr.value, onnx.SparseTensorProto):
        dims = tuple(attr.value.dims)
        itemsize = ir.DataType(attr.value.values.data_type).itemsize
        if int(np.prod(dims, dtype=np.int64)) * itemsize > dense_limit:
            logger.debug("Constant %s: sparse value too large to densify", node.name)
            return None
        return make_tensor(sparse_to_dense(attr.value), name)
    return None


def make_tensor(array: np.ndarray, name: str | None) -> ir.TensorProtocol:
    """Wraps a kernel's output array as an IR tensor named ``name``.

    A non-contiguous array (a Transpose result) is kept as it is: serialising
    writes it in C order, and not copying it here saves a full copy of a large
    folded weight.
    """
    if array.dtype.kind in "OSU":
        return _string_tensor(array, name)
    return ir.Tensor(array, name=name)


def is_file_backed(tensor: ir.TensorProtocol | None) -> bool:
    """Whether ``tensor``'s data is in a file (external data, or a weight left in the model file):
    :func:`read_array` reads it into a new array of its own."""
    # Not isinstance: ExternalTensor derives from a Protocol, whose isinstance costs microseconds.
    return ir.ExternalTensor in type(tensor).__mro__


def read_array(value: ir.Value, tensor: ir.TensorProtocol, node: ir.Node) -> np.ndarray:
    """The numpy array of a constant input; this is where external data gets read.

    Raises:
        InputError: the tensor's data cannot be read (a missing or short
            external-data file, raw data of the wrong length).
    """
    return read_tensor(tensor, f"{value.name!r}, input of {node.op_type} node {node.name!r}")


def read_tensor(tensor: ir.TensorProtocol, where: str) -> np.ndarray:
    """A constant tensor's array, external data read with :func:`read_external` (never a memory map).

    Every pass that reads weights reads them here: a data file that shrinks
    during the run is then an ``InputError``, never a SIGBUS.

    Raises:
        InputError: the data cannot be read (``where`` names the value in the message).
    """
    try:
        array = read_external(tensor) if is_file_backed(tensor) else tensor.numpy()
    except (InputError, OSError, ValueError) as e:
        raise InputError(f"cannot read the data of {where}: {e}") from e
    if tensor.dtype == ir.DataType.STRING:
        return np.asarray(array, dtype=object)
    return np.asarray(array)


def contained_path(tensor: ir.ExternalTensor) -> str:
    """The data file's path, refused if it leaves ``base_dir`` (as onnx_ir's own loader does).

    Every reader of external data goes through it: the reads here, and the fold's confirmation,
    whose child reads a weight from its file by this path (``passes.fold.extract``).

    The location must stay inside the base folder both as written and with
    symbolic links resolved, and the file must not have other hard links.
    """
    path = tensor.path
    if not tensor.base_dir:
        return path
    base = os.path.normcase(os.path.normpath(os.path.abspath(os.fspath(tensor.base_dir))))
    for candidate, root in (
        (os.path.normcase(os.path.normpath(os.path.abspath(path))), base),
        (os.path.normcase(os.path.realpath(path)), os.path.normcase(os.path.realpath(base))),
    ):
        if candidate != root and not candidate.startswith(root.rstrip(os.sep) + os.sep):
            raise InputError(f"external data location {tensor.location!r} is outside {root}")
    return path


def read_external(tensor: ir.ExternalTensor) -> np.ndarray:
    """An external tensor's data, read into memory with checked reads (no memory map).

    The file is opened without blocking, must be a regular file with a single
    link, and must hold the tensor's bytes when read; the bytes are read with
    ``os.preadv`` (or ``pread``) until complete.

    Raises:
        InputError: the file is missing, not a regular file, outside the model's
            folder, or shorter than the tensor needs (also if it shrinks during
            the read).
    """
    nbytes = int(tensor.nbytes)
    buffer = bytearray(nbytes)
    with _checked_file(tensor) as (fd, offset):
        _read_into(tensor, fd, memoryview(buffer), offset, 0)
    return _decode(buffer, tensor.dtype, tuple(int(d) for d in tensor.shape.numpy()))


def read_external_chunks(tensor: ir.ExternalTensor, chunk_bytes: int = 8 << 20) -> Iterator[np.ndarray]:
    """An external tensor's elements as flat arrays of about ``chunk_bytes`` each, in order, with the
    checked reads of :func:`read_external` (one chunk in memory at a time, no memory map).

    Only for types of whole bytes (float32 and the like).

    Raises:
        InputError: as :func:`read_external`.
    """
    dtype = np.dtype(tensor.dtype.numpy()).newbyteorder("<")
    if tensor.dtype.bitwidth % 8:
        raise ValueError(f"{tensor.dtype} is not read in chunks")
    nbytes = int(tensor.nbytes)
    step = max(dtype.itemsize, chunk_bytes - chunk_bytes % dtype.itemsize)
    with _checked_file(tensor) as (fd, offset):
        for start in range(0, nbytes, step):
            buffer = bytearray(min(step, nbytes - start))
            _read_into(tensor, fd, memoryview(buffer), offset, start)
            yield np.frombuffer(buffer, dtype=dtype)


@contextlib.contextmanager
def _checked_file(tensor: ir.ExternalTensor) -> Iterator[tuple[int, int]]:
    """The data file of ``tensor`` opened (fd, the tensor's offset), checked as :func:`read_external` says."""
    if tensor.dtype == ir.DataType.STRING:
        raise InputError("a string tensor cannot be stored externally")
    nbytes = int(tensor.nbytes)
    offset = int(tensor.offset or 0)
    if tensor.length is not None and int(tensor.length) != nbytes:
        raise InputError(
            f"external data length {tensor.length} does not match the {nbytes} bytes of its type"
        )
    path = contained_path(tensor)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise InputError(f"cannot open external data {tensor.location!r}: {e.strerror}") from e
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InputError(f"external data {tensor.location!r} is not a regular file")
        if info.st_nlink > 1 and not isinstance(tensor, InlineData):
            raise InputError(f"external data {tensor.location!r} has {info.st_nlink} hard links")
        if info.st_size < offset + nbytes:
            raise InputError(
                f"external data {tensor.location!r} is truncated: bytes {offset}..{offset + nbytes} "
                f"needed, the file has {info.st_size}"
            )
        yield fd, offset
    finally:
        os.close(fd)


def _read_into(tensor: ir.ExternalTensor, fd: int, view: memoryview, offset: int, start: int) -> None:
    """Fills ``view`` with the tensor's bytes from ``start`` (relative to its ``offset``) on."""
    done, size = 0, len(view)
    while done < size:
        at = offset + start + done
        if hasattr(os, "preadv"):
            count = os.preadv(fd, [view[done:]], at)
        else:  # pragma: no cover - platforms without preadv
            chunk = os.pread(fd, size - done, at)
            view[done : done + len(chunk)] = chunk
            count = len(chunk)
        if count == 0:
            raise InputError(
                f"external data {tensor.location!r} shrank while being read: "
                f"{start + done} of {int(tensor.nbytes)} bytes at offset {offset}"
            )
        done += count


def _decode(data: bytearray, dtype: ir.DataType, dims: tuple[int, ...]) -> np.ndarray:
    """The array of a tensor's raw little-endian bytes (no copy for whole-byte types)."""
    if dtype.bitwidth >= 8:
        return np.frombuffer(data, dtype=np.dtype(dtype.numpy()).newbyteorder("<")).reshape(dims)
    proto = onnx.TensorProto(data_type=int(dtype), dims=dims, raw_data=bytes(data))
    return ir.serde.deserialize_tensor(proto).numpy()  # packed 2-, 4- and 6-bit types


def _itemsizes() -> dict[int, float]:
    sizes = {}
    for dtype in ir.DataType:
        try:
            sizes[dtype.value] = dtype.itemsize
        except (TypeError, ValueError):  # UNDEFINED, STRING: no size of their own
            continue
    return sizes


#: Bytes an element of each data type takes (0.5 for a 4-bit type), by the proto's number.
_ITEMSIZES = _itemsizes()


def tensor_nbytes(tensor: ir.TensorProtocol) -> int:
    """The size of a tensor in bytes, without reading external data.

    A tensor the load left as its proto (a ``Constant``'s, 4,800 in a 48-layer GPT-2 export) is
    sized from the proto's dims: its ``nbytes`` builds an ``ir.Shape`` at each call (3.5 us against 1).
    """
    if type(tensor) is ir.serde.TensorProtoTensor:
        proto = tensor.raw
        itemsize = _ITEMSIZES.get(proto.data_type)
        if itemsize is not None:
            return math.ceil(itemsize * math.prod(proto.dims))
    if tensor.dtype == ir.DataType.STRING:
        return int(tensor.nbytes)
    return int(np.ceil(tensor.dtype.itemsize * int(np.prod(tensor.shape.numpy(), dtype=np.int64))))


def attribute_values(node: ir.Node) -> Mapping[str, Any] | None:
    """The node's attributes as plain Python values for ``refimpl.run``.

    Returns:
        A dict of attribute values, or None when an attribute cannot be given to
        a kernel (an unresolved reference inside a function, a graph, a sparse
        tensor or a type).
    """
    values: dict[str, Any] = {}
    for name, attr in node.attributes.items():
        if not isinstance(attr, ir.Attr) or attr.is_ref():
            return None
        kind = attr.type
        if kind in (ir.AttributeType.INT, ir.AttributeType.FLOAT, ir.AttributeType.STRING):
            values[name] = attr.value
        elif kind in (ir.AttributeType.INTS, ir.AttributeType.FLOATS, ir.AttributeType.STRINGS):
            values[name] = list(attr.value)
        elif kind == ir.AttributeType.TENSOR:
            values[name] = _attr_array(attr.as_tensor())
        elif kind == ir.AttributeType.TENSORS:
            values[name] = [_attr_array(t) for t in attr.as_tensors()]
        else:
            return None
    return values


def _attr_array(tensor: ir.TensorProtocol) -> np.ndarray:
    array = tensor.numpy()
    if tensor.dtype == ir.DataType.STRING:
        return np.asarray(array, dtype=object)
    return np.asarray(array)


# A dense copy must stay well below protobuf's 2 GB limit.
_MAX_DENSE_BYTES = 1 << 30


def sparse_to_dense(sparse: onnx.SparseTensorProto) -> np.ndarray:
    """The dense array of a sparse tensor (zeros where no value is given).

    Raises:
        ValueError: the indices do not fit the dims (malformed tensor).
    """
    dims = tuple(int(d) for d in sparse.dims)
    values = onnx.numpy_helper.to_array(sparse.values)
    if any(d < 0 for d in dims) or math.prod(dims) * values.dtype.itemsize > _MAX_DENSE_BYTES:
        raise ValueError(f"sparse tensor of dims {dims} is too large to densify")
    dense = np.zeros(dims, dtype=values.dtype)
    if values.size == 0:
        return dense
    indices = onnx.numpy_helper.to_array(sparse.indices).astype(np.int64)
    flat = dense.reshape(-1)
    if indices.ndim == 1:
        flat[indices] = values.reshape(-1)
    elif indices.ndim == 2 and indices.shape[1] == len(dims):
        flat[np.ravel_multi_index(tuple(indices.T), dims)] = values.reshape(-1)
    else:
        raise ValueError(f"sparse indices of shape {indices.shape} do not fit dims {dims}")
    return dense
