"""Argument helpers every kernel family shares: arrays, axes, int lists, strings, tensors.

Axis helpers raise :class:`RefImplError` with the op's name, so the message says which node
failed. ``normalize_axes`` is memoised: nodes in a model repeat the same few (axes, rank) pairs.
``broadcast_failure`` tells a numpy ValueError that rejects unbroadcastable inputs from a bug.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from refimpl._errors import RefImplError

__all__ = [
    "SMALL",
    "Attrs",
    "Inputs",
    "as_array",
    "as_text",
    "broadcast_failure",
    "broadcasts_to",
    "int_extent",
    "int_list",
    "normalize_axes",
    "normalize_axis",
    "same_dtype",
    "scalar",
    "scalar_int",
    "to_array",
]

Inputs = Sequence[Any]
Attrs = Mapping[str, Any]

SMALL = 64
"""Up to this many elements, Python's min/max over ``tolist()`` beat numpy's reductions (over a
microsecond each): range checks on small arrays take the Python path."""

_NDARRAY = np.ndarray


def as_array(value: Any) -> np.ndarray:
    """An input as an ndarray; numpy ``str_`` and ``bytes_`` arrays become ``object`` arrays
    (ONNX strings: onnx_ir reads a string tensor as ``bytes_``).

    Backend test data may hold numpy scalars or lists, so anything numpy accepts is taken.
    """
    x = value if type(value) is _NDARRAY else np.asarray(value)
    return x.astype(object) if x.dtype.kind in "US" else x


def normalize_axis(op: str, axis: int, rank: int, *, allow_negative: bool = True) -> int:
    """Maps ``axis`` into ``[0, rank)``; negative axes count from the back if allowed.

    Raises:
        RefImplError: the axis is out of range (or negative where the schema
            version only accepts non-negative axes).
    """
    axis = int(axis)
    lo = -rank if allow_negative else 0
    if not lo <= axis < rank:
        raise RefImplError(f"{op}: axis {axis} is out of range [{lo}, {rank - 1}]")
    return axis + rank if axis < 0 else axis


@functools.lru_cache(maxsize=1024)
def _normalized_axes(
    op: str, axes: tuple[int, ...], rank: int, allow_negative: bool
) -> tuple[int, ...]:
    out = tuple(normalize_axis(op, a, rank, allow_negative=allow_negative) for a in axes)
    if len(set(out)) != len(out):
        raise RefImplError(f"{op}: repeated axis in {list(axes)}")
    return out


def normalize_axes(
    op: str, axes: Iterable[int], rank: int, *, allow_negative: bool = True
) -> tuple[int, ...]:
    """Normalises a list of axes (order kept) and rejects repeated ones."""
    return _normalized_axes(op, tuple(axes), rank, allow_negative)


def same_dtype(op: str, arrays: Sequence[np.ndarray]) -> np.dtype:
    """The dtype every one of ``arrays`` has; raises if they mix types."""
    dtype = arrays[0].dtype
    for a in arrays:
        if a.dtype != dtype:
            raise RefImplError(f"{op}: mixed input types {sorted({str(a.dtype) for a in arrays})}")
    return dtype


def broadcast_failure(arrays: Iterable[Any]) -> RefImplError | None:
    """The error for inputs whose shapes do not broadcast, or None if they do.

    Kernels call it only after numpy raised ValueError (checking first would cost every call a
    microsecond): None means that the ValueError had another cause, a bug to re-raise.
    """
    shapes = [np.shape(a) for a in arrays]
    try:
        np.broadcast_shapes(*shapes)
    except ValueError:
        return RefImplError(f"input shapes {shapes} do not broadcast")
    return None


def broadcasts_to(shape: Sequence[int], target: Sequence[int]) -> bool:
    """Whether ``shape`` broadcasts unidirectionally to ``target`` (as PRelu's slope, Gemm's C)."""
    if len(shape) > len(target):
        return False
    return all(d in (1, t) for d, t in zip(reversed(shape), reversed(target)))


def int_list(value: Any) -> list[int]:
    """An attribute list or a 0-/1-D integer tensor as a list of Python ints."""
    if type(value) is _NDARRAY:
        return value.tolist() if value.ndim == 1 else value.reshape(-1).tolist()
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value]
    return np.asarray(value).reshape(-1).tolist()


def int_extent(a: np.ndarray) -> tuple[int, int]:
    """The smallest and largest element of a non-empty integer array, as Python ints."""
    if a.size <= SMALL:
        values = a.ravel().tolist()
        return min(values), max(values)
    return int(a.min()), int(a.max())


def scalar(op: str, name: str, value: Any) -> Any:
    """A tensor holding exactly one value (0-D or shape [1]) as a Python scalar."""
    arr = np.asarray(value)
    if arr.size != 1:
        raise RefImplError(f"{op}: {name} must hold one value, got shape {arr.shape}")
    return arr.reshape(()).item()


def scalar_int(op: str, name: str, value: Any) -> int:
    """A tensor holding exactly one integer (0-D or shape [1]) as a Python int."""
    item = scalar(op, name, value)
    try:
        return operator.index(item)
    except TypeError:
        raise RefImplError(f"{op}: {name} must be an integer, got {item!r}") from None


def as_text(value: str | bytes) -> str:
    """A string attribute as ``str`` (protobuf attributes may arrive as bytes)."""
    return value.decode("utf-8") if isinstance(value, bytes) else value


def _sparse_to_dense(sparse: onnx.SparseTensorProto) -> np.ndarray:
    values = numpy_helper.to_array(sparse.values)
    indices = numpy_helper.to_array(sparse.indices).astype(np.int64)
    dims = tuple(sparse.dims)
    dense = np.zeros(dims, dtype=values.dtype)
    if values.dtype == object:
        dense[...] = ""
    if indices.ndim == 1:  # linearised (row-major) positions
        dense.reshape(-1)[indices] = values
    elif indices.size:
        dense[tuple(indices.T)] = values
    return dense


def to_array(value: Any) -> np.ndarray:
    """A tensor attribute (array, TensorProto, SparseTensorProto, ir tensor) as a dense array."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, onnx.SparseTensorProto):
        return _sparse_to_dense(value)
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    if hasattr(value, "numpy"):  # onnx_ir tensors
        return np.asarray(value.numpy())
    return np.asarray(value)
