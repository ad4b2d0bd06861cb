"""Converted weights of external data, made one chunk at a time when they are written.

A float32 weight stored externally (memory-mapped by onnx_ir, or copied by the
kernel when untouched: :mod:`passes.modelio.copy`) would be held in memory
whole once converted, and a model's converted weights all at once until the
save. :class:`HalfOf` stands for the converted tensor instead: its type and
shape are known, and its bytes are made from the source file when they are
written (:meth:`HalfOf.tofile`, which the save calls for each tensor of the
data file it writes), a chunk of :data:`CHUNK` bytes at a time with the checked
reads of :func:`passes.ir.tensors.read_external_chunks`. The peak memory of a
conversion is then a chunk, not the model: nothing keeps a converted array.

:func:`largest` (the largest finite magnitude, which decides whether a weight
fits the half type) reads such a weight the same way, once per tensor (the
answer is kept in the tensor's ``meta``, shared by the copies of a model the
pass converts while it looks for islands).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import onnx_ir as ir

from passes.ir.tensors import read_external_chunks

__all__ = ["CHUNK", "HalfOf", "converted", "largest"]

#: Bytes of the source read (and converted) at a time.
CHUNK = 8 << 20

_LARGEST = "passes.precision.largest"  # TensorProtocol.meta key: the largest finite magnitude


def _external(tensor: ir.TensorProtocol) -> bool:
    """External data (a weight left in the model file itself is not: see ``passes.modelio.weights``)."""
    from passes.ir.tensors import InlineData

    mro = type(tensor).__mro__
    return ir.ExternalTensor in mro and InlineData not in mro


def _chunks(tensor: ir.TensorProtocol) -> Iterator[np.ndarray]:
    """The tensor's elements as flat arrays, a chunk at a time when it is external data."""
    if _external(tensor):
        yield from read_external_chunks(tensor, CHUNK)  # type: ignore[arg-type]
        return
    flat = tensor.numpy().reshape(-1)
    step = max(1, CHUNK // max(1, flat.itemsize))
    for start in range(0, flat.size, step):
        yield flat[start : start + step]


def largest(tensor: ir.TensorProtocol) -> float:
    """The largest finite magnitude of a float tensor's values (0.0 if none), read a chunk at a time."""
    meta = getattr(tensor, "meta", None)
    if meta is not None and _LARGEST in meta:
        return float(meta[_LARGEST])
    found = 0.0
    for chunk in _chunks(tensor):
        finite = np.abs(chunk[np.isfinite(chunk)])
        if finite.size:
            found = max(found, float(finite.max()))
    if meta is not None:
        meta[_LARGEST] = found
    return found


class HalfOf(ir.TensorProtocol):
    """The half-type form of a float32 tensor stored externally, made from its file when read.

    With ``widen``, float32 values rounded to the half type (the search's emulation,
    ``passes.precision.convert``). Its bytes are those of numpy's
    ``source.astype(half)`` (``.astype(float32)``); :meth:`tofile` writes them a
    chunk at a time, :meth:`numpy` and :meth:`tobytes` make the whole tensor (and
    keep nothing).
    """

    __slots__ = ("_dtype", "_half", "_meta", "_source", "doc_string", "metadata_props", "name")

    def __init__(self, source: ir.TensorProtocol, half: ir.DataType, *, widen: bool = False,
                 name: str | None = None) -> None:  # fmt: skip
        if source.dtype != ir.DataType.FLOAT:
            raise ValueError(f"HalfOf converts float32, not {source.dtype}")
        self._source = source
        self._half = half
        self._dtype = ir.DataType.FLOAT if widen else half
        self._meta: Any = None
        self.name = name if name is not None else source.name
        self.doc_string = source.doc_string
        self.metadata_props = dict(source.metadata_props or {})

    def __repr__(self) -> str:
        return f"HalfOf<{self._dtype},{self.shape}>({self._source!r}, {self._half})"

    @property
    def dtype(self) -> ir.DataType:
        return self._dtype

    @property
    def shape(self) -> ir.Shape:
        return self._source.shape

    @property
    def size(self) -> int:
        return int(np.prod(self.shape.numpy(), dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return int(self.size * self._dtype.itemsize)  # itemsize is a float (0.5 for 4-bit types)

    @property
    def raw(self) -> ir.TensorProtocol:
        """The float32 source."""
        return self._source

    @property
    def meta(self) -> dict[str, Any]:
        if self._meta is None:
            self._meta = {}
        return self._meta

    def chunks(self) -> Iterator[np.ndarray]:
        """The converted elements, flat, a chunk at a time."""
        half = self._half.numpy()
        for chunk in _chunks(self._source):
            converted = chunk.astype(half)
            yield converted.astype(np.float32) if self._dtype == ir.DataType.FLOAT else converted

    def numpy(self) -> np.ndarray:
        result = np.empty(self.size, dtype=self._dtype.numpy())
        at = 0
        for chunk in self.chunks():
            result[at : at + chunk.size] = chunk
            at += chunk.size
        return result.reshape(self.shape.numpy())

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        array = self.numpy()
        return array if dtype is None else array.astype(dtype)

    def __dlpack__(self, *, stream: Any = None) -> Any:
        return self.numpy().__dlpack__(stream=stream)

    def __dlpack_device__(self) -> Any:
        return self.numpy().__dlpack_device__()

    def tobytes(self) -> bytes:
        return self.numpy().tobytes()

    def tofile(self, file: Any) -> None:
        """Writes the converted bytes (little-endian) to ``file``, a chunk at a time."""
        for chunk in self.chunks():
            file.write(chunk.tobytes())


def converted(tensor: ir.TensorProtocol, half: ir.DataType, *, widen: bool = False,
              name: str | None = None) -> ir.TensorProtocol:  # fmt: skip
    """``tensor`` (float32) in the half type (``widen``: rounded to it, in float32): a :class:`HalfOf`
    made when written if it is external data, else an array now."""
    if _external(tensor):
        return HalfOf(tensor, half, widen=widen, name=name)
    array = tensor.numpy().astype(half.numpy())
    return ir.Tensor(array.astype(np.float32) if widen else array, name=name)
