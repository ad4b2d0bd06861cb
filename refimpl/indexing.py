"""Indexing kernels: gathers, scatters, Compress, NonZero, ArgMax/ArgMin, TopK and CumSum.

Indices are checked against the ONNX bounds (``[-s, s-1]``, or ``[0, s-1]``
for versions that predate negative indices) before numpy sees them, so numpy's
wrap-around and broadcasting never produce a result ONNX does not define.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from refimpl._common import (
    Attrs,
    Inputs,
    as_array,
    as_text,
    int_extent,
    normalize_axis,
    scalar_int,
)
from refimpl._errors import RefImplError, UndefinedResultError
from refimpl._registry import Kernel, register


def _checked_indices(
    op: str, indices: np.ndarray, dim: int | np.ndarray, *, allow_negative: bool = True
) -> np.ndarray:
    """Bounds-checks ``indices`` against ``dim`` (broadcast) and makes them non-negative."""
    indices = indices.astype(np.int64, copy=False)
    if indices.size == 0:
        return indices
    bound = "[-s, s-1]" if allow_negative else "[0, s-1]"
    if isinstance(dim, np.ndarray):  # one size per index column
        lower = -dim if allow_negative else 0
        if np.any(indices < lower) or np.any(indices >= dim):
            raise RefImplError(f"{op}: index out of bounds {bound} for sizes {dim.tolist()}")
        negative = allow_negative and bool(np.any(indices < 0))
    else:
        lo, hi = int_extent(indices)
        if lo < (-dim if allow_negative else 0) or hi >= dim:
            raise RefImplError(
                f"{op}: index {lo if lo < 0 else hi} out of bounds {bound} for size {dim}"
            )
        negative = lo < 0
    return np.where(indices < 0, indices + dim, indices) if negative else indices


# --- gathers ----------------------------------------------------------------------------------


def _gather(allow_negative: bool) -> Kernel:
    def kernel(inputs: Inputs, attrs: Attrs) -> tuple[np.ndarray]:
        data = as_array(inputs[0])
        axis = normalize_axis("Gather", attrs.get("axis", 0), data.ndim)
        indices = _checked_indices(
            "Gather", as_array(inputs[1]), data.shape[axis], allow_negative=allow_negative
        )
        # Indexing is np.take without its Python overhead (a microsecond) for in-bound indices.
        out = data[(slice(None),) * axis + (indices,)]
        # A 0-D index selects a view (or a bare scalar): copy it into a new array.
        return (np.array(out, dtype=data.dtype) if indices.ndim == 0 else out,)

    return kernel


# Gather-1 only defines indices in [0, s-1]; negative ones arrive with version 11.
register("Gather", 1, 1)(_gather(allow_negative=False))
register("Gather", 11)(_gather(allow_negative=True))


def _element_indices(op: str, data: np.ndarray, indices: np.ndarray, axis: int) -> np.ndarray:
    """Validates GatherElements/ScatterElements indices (same rank, inner dims fit)."""
    if indices.ndim != data.ndim:
        raise RefImplError(f"{op}: indices rank {indices.ndim} != data rank {data.ndim}")
    for d, (n, m) in enumerate(zip(indices.shape, data.shape)):
        if d != axis and n > m:
            raise RefImplError(f"{op}: indices shape {indices.shape} exceeds data {data.shape}")
    return _checked_indices(op, indices, data.shape[axis])


@register("GatherElements", 11)
def _gather_elements(inputs: Inputs, attrs: Attrs) -> tuple[np.ndarray]:
    data = as_array(inputs[0])
    axis = normalize_axis("GatherElements", attrs.get("axis", 0), data.ndim)
    indices = _element_indices("GatherElements", data, as_array(inputs[1]), axis)
    window = tuple(slice(None) if d == axis else slice(0, n) for d, n in enumerate(indices.shape))
    return (np.take_along_axis(data[window], indices, axis=axis),)


@register("GatherND", 11)
def _gather_nd(inputs: Inputs, attrs: Attrs) -> tuple[np.ndarray]:
    """GatherND with ``batch_dims`` (version 12+; 0 before)."""
    data, indices = as_array(inputs[0]), as_array(inputs[1])
    b = int(attrs.get("batch_dims", 0))
    r, q = data.ndim, indices.ndim
    if r < 1 or q < 1 or not 0 <= b < min(q, r):
        raise RefImplError(f"GatherND: invalid ranks data {r}, indices {q}, batch_dims {b}")
    if data.shape[:b] != indices.shape[:b]:
        raise RefImplError(f"GatherND: batch dims differ: {data.shape} vs {indices.shape}")
    m = indices.shape[-1]
    if not 1 <= m <= r - b:
        raise RefImplError(f"GatherND: indices.shape[-1] = {m} not in [1, {r - b}]")
    batch = int(np.prod(data.shape[:b], dtype=np.int64))
    count = int(np.prod(indices.shape[b:-1], dtype=np.int64))
    flat = _checked_indices(
        "GatherND", indices.reshape(batch, count, m), np.array(data.shape[b : b + m])
    )
    rows = np.broadcast_to(np.arange(batch)[:, None], (batch, count))
    key = (rows, *(flat[..., j] for j in range(m)))
    gathered = data.reshape((batch,) + data.shape[b:])[key]
    return (gathered.reshape(indices.shape[:-1] + data.shape[b + m :]),)


# --- scatters ---------------------------------------------------------------------------------

_REDUCTIONS: dict[str, np.ufunc] = {
    "add": np.add,
    "mul": np.multiply,
    "max": np.maximum,
    "min": np.minimum,
}


def _scatter_into(
    op: str,
    data: np.ndarray,
    key: tuple[np.ndarray, ...],
    updates: np.ndarray,
    reduction: str,
    allowed: tuple[str, ...],
) -> np.ndarray:
    """A copy of ``data`` with ``updates`` written (or reduced) at ``key``.

    ``key`` holds one integer array per leading data dimension; the arrays
    broadcast to the update positions.
    """
    if reduction not in allowed:
        raise RefImplError(f"{op}: reduction {reduction!r} is not in {allowed} for this version")
    out = data.copy()
    if reduction == "none":
        positions = np.broadcast_arrays(*key)
        linear = np.ravel_multi_index(positions, data.shape[: len(key)]) if positions else []
        if len(np.unique(linear)) != np.size(linear):
            # The spec leaves the result of duplicate indices without reduction undefined.
            raise UndefinedResultError(f"{op}: duplicate indices with reduction 'none'")
        out[key] = updates
        return out
    if data.dtype == object:
        raise RefImplError(f"{op}: reduction {reduction!r} on strings")
    _REDUCTIONS[reduction].at(out, key, updates)
    return out


def _scatter_nd(allowed: tuple[str, ...]) -> Kernel:
    def kernel(inputs: Inputs, attrs: Attrs) -> tuple[np.ndarray]:
        data, indices, updates = (as_array(x) for x in inputs[:3])
        k = indices.shape[-1] if indices.ndim else -1
        if data.ndim < 1 or not 1 <= k <= data.ndim:
            raise RefImplError(f"ScatterND: indices.shape[-1] = {k} for data rank {data.ndim}")
        expected = indices.shape[:-1] + data.shape[k:]
        if updates.shape != expected or updates.dtype != data.dtype:
            got, want = f"{updates.dtype}{updates.shape}", f"{data.dtype}{expected}"
            raise RefImplError(f"ScatterND: updates {got}, expected {want}")
        flat = _checked_indices("ScatterND", indices.reshape(-1, k), np.array(data.shape[:k]))
        key = tuple(flat[:, j] for j in range(k))
        flat_updates = updates.reshape((flat.shape[0],) + data.shape[k:])
        reduction = as_text(attrs.get("reduction", "none"))
        return (_scatter_into("ScatterND", data, key, flat_updates, reduction, allowed),)

    return kernel


def _scatter_elements(op: str, allowed: tuple[str, ...], allow_negative: bool = True) -> Kernel:
    def kernel(inputs: Inputs, attrs: Attrs) -> tuple[np.ndarray]:
        data, indices, updates = (as_array(x) for x in inputs[:3])
        axis = normalize_axis(op, attrs.get("axis", 0), data.ndim)
        if updates.shape != indices.shape or updates.dtype != data.dtype:
            raise RefImplError(f"{op}: updates {updates.dtype}{updates.shape} do not match")
        if not allow_negative and indices.size and indices.min() < 0:
            raise RefImplError(f"{op}: negative index (allowed from version 11)")
        indices = _element_indices(op, data, indices, axis)
        key = tuple(
            indices if d == axis else np.arange(n).reshape([-1] + [1] * (indices.ndim - d - 1))
            for d, n in enumerate(indices.shape)
        )
        reduction = as_text(attrs.get("reduction", "none"))
        return (_scatter_into(op, data, key, updates, reduction, allowed),)

    return kernel


_NONE = ("none",)
_ADD_MUL = ("none", "add", "mul")
_ALL = ("none", "add", "mul", "max", "min")
register("ScatterND", 11, 13)(_scatter_nd(_NONE))
register("ScatterND", 16, 16)(_scatter_nd(_ADD_MUL))
register("ScatterND", 18)(_scatter_nd(_ALL))
register("ScatterElements", 11, 13)(_scatter_elements("ScatterElements", _NONE))
register("ScatterElements", 16, 16)(_scatter_elements("ScatterElements", _ADD_MUL))
register("ScatterElements", 18)(_scatter_elements("ScatterElements", _ALL))
# Scatter-11 is a deprecated schema (models must use ScatterElements from opset 11).
register("Scatter", 9, 9)(_scatter_elements("Scatter", _NONE, allow_negative=False))


# --- Compress ---------------------------------------------------------------------------------


def _compress(allow_negative: bool) -> Kernel:
    """Compress; a condition shorter than the axis drops the slices beyond it."""

    def kernel(inputs: Inputs, attrs: Attrs) -> tuple[np.ndarray]:
        x, condition = as_array(inputs[0]), as_array(inputs[1])
        if condition.ndim != 1:
            raise RefImplError(f"Compress: condition must be 1-D, got shape {condition.shape}")
        axis = attrs.get("axis")
        if axis is None:
            x, axis = x.reshape(-1), 0
        else:
            axis = normalize_axis("Compress", axis, x.ndim, allow_negative=allow_negative)
        if condition.shape[0] > x.shape[axis]:
            raise RefImplError(
                f"Compress: condition longer than axis ({condition.shape[0]} > {x.shape[axis]})"
            )
        return (np.compress(condition.astype(np.bool_, copy=False), x, axis=axis),)

    return kernel


register("Compress", 9, 9)(_compress(allow_negative=False))
register("Compress", 11)(_compress(allow_negative=True))


# --- NonZero, ArgMax/ArgMin, TopK, CumSum -----------------------------------------------------


@register("NonZero", 9)
def _nonzero(inputs: Inputs, attrs: Attrs) -> tuple[np.ndarray]:
    """NonZero: shape (rank, count); a scalar counts as rank 1, as in onnxruntime."""
    x = as_array(inputs[0])
    if x.ndim == 0:
        x = x.reshape(1)
    return (np.array(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1),)


def _arg_reduce(fn: Callable[..., np.ndarray], op: str, allow_negative: bool) -> Kernel:
    """ArgMax/ArgMin; the first extreme index, or the last with ``select_last_index`` (12+).

    The spec does not say what NaN does. onnxruntime's answer depends on the code path: its
    element loop keeps a NaN in the first place and skips later ones, while its whole-tensor
    reduction (Eigen's vectorised ``maxCoeff``) may return a NaN's index anywhere (float64
    ``ArgMax([-inf, -0, nan, inf, 1])`` is 2). There is no rule to match, so a float input
    holding NaN raises UndefinedResultError (the node is not folded).
    """

    def kernel(inputs: Inputs, attrs: Attrs) -> tuple[np.ndarray]:
        x = as_array(inputs[0])
        axis = normalize_axis(op, attrs.get("axis", 0), x.ndim, allow_negative=allow_negative)
        n = x.shape[axis]
        if n == 0:
            raise RefImplError(f"{op}: empty axis {axis}")
        if x.dtype.kind in "fV" and np.isnan(x.astype(np.float32) if x.dtype.kind == "V" else x).any():
            raise UndefinedResultError(f"{op} over NaN: onnxruntime's index depends on its code path")
        if attrs.get("select_last_index", 0):
            result = n - 1 - fn(np.flip(x, axis), axis=axis)
        else:
            result = fn(x, axis=axis)
        if attrs.get("keepdims", 1):
            result = np.expand_dims(result, axis)
        return (np.asarray(result, dtype=np.int64),)

    return kernel


for _op, _fn in (("ArgMax", np.argmax), ("ArgMin", np.argmin)):
    register(_op, 1, 1)(_arg_reduce(_fn, _op, allow_negative=False))
    register(_op, 11)(_arg_reduce(_fn, _op, allow_negative=True))


def _top_k(k_from_input: bool) -> Kernel:
    """TopK; ties keep the lower index first. Unsorted output (sorted=0) is returned sorted."""

    def kernel(inputs: Inputs, attrs: Attrs) -> tuple[np.ndarray, np.ndarray]:
        x = as_array(inputs[0])
        axis = normalize_axis("TopK", attrs.get("axis", -1), x.ndim)
        k = scalar_int("TopK", "K", inputs[1]) if k_from_input else int(attrs["k"])
        n = x.shape[axis]
        if not 0 <= k <= n:
            raise RefImplError(f"TopK: k = {k} is not in [0, {n}]")
        if attrs.get("largest", 1):
            # A stable ascending sort of the reversed axis, read backwards: values
            # descend and equal values keep ascending original indices.
            order = np.flip(np.argsort(np.flip(x, axis), axis=axis, kind="stable"), axis)
            order = n - 1 - order
        else:
            order = np.argsort(x, axis=axis, kind="stable")
        indices = np.take(order, np.arange(k), axis=axis).astype(np.int64, copy=False)
        return np.take_along_axis(x, indices, axis=axis), indices

    return kernel


register("TopK", 1, 1)(_top_k(k_from_input=False))
register("TopK", 10)(_top_k(k_from_input=True))


@register("CumSum", 11)
def _cumsum(inputs: Inputs, attrs: Attrs) -> tuple[np.ndarray]:
    """CumSum, accumulated in the input type; ``exclusive`` shifts, ``reverse`` runs backwards."""
    x = as_array(inputs[0])
    axis = normalize_axis("CumSum", scalar_int("CumSum", "axis", inputs[1]), x.ndim)
    reverse = bool(attrs.get("reverse", 0))
    y = np.flip(x, axis) if reverse else x
    total = np.cumsum(y, axis=axis, dtype=x.dtype)
    if attrs.get("exclusive", 0):
        shifted = np.zeros_like(total)
        dst = [slice(None)] * x.ndim
        src = [slice(None)] * x.ndim
        dst[axis], src[axis] = slice(1, None), slice(None, -1)
        shifted[tuple(dst)] = total[tuple(src)]
        total = shifted
    return (np.flip(total, axis) if reverse else total,)
