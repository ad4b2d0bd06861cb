"""Whether onnxruntime's value confirms refimpl's: :func:`agrees`, bit for bit where it matters.

Integers, booleans and strings equal; floats with NaN, infinities and zeros
(with their sign) in the same places, and other values within :data:`ULPS`
units in the last place of their dtype (of the array's largest magnitude
after a sum: :data:`ACCUMULATING`). onnxruntime's results come back in a file,
read in chunks (:func:`file_chunks`): memory stays bounded whatever the size.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np

__all__ = ["ACCUMULATING", "ULPS", "agrees", "agrees_in_chunks", "differing_bits", "file_chunks", "is_float"]

#: Floats agree within this many units in the last place of their dtype (see :func:`agrees`).
ULPS = 16

#: Ops that sum many terms in an order each library chooses (BLAS and MLAS block their loops,
#: numpy sums pairwise): their results, and what is computed from them, agree within ULPS of the
#: array's largest magnitude rather than of each element (see :func:`agrees`).
ACCUMULATING: frozenset[str] = frozenset({
    "AveragePool", "Conv", "ConvTranspose", "CumSum", "DFT", "Einsum", "Gemm", "GlobalAveragePool",
    "GlobalLpPool", "GroupNormalization", "InstanceNormalization", "LayerNormalization", "LogSoftmax",
    "LpNormalization", "LpPool", "LRN", "MatMul", "MeanVarianceNormalization", "ReduceL1", "ReduceL2",
    "ReduceLogSum", "ReduceLogSumExp", "ReduceMean", "ReduceProd", "ReduceSum", "ReduceSumSquare",
    "RMSNormalization", "Softmax", "STFT",
})  # fmt: skip

_CHUNK = 1 << 20


def is_float(dtype: np.dtype) -> bool:
    return dtype.kind == "f" or dtype.name == "bfloat16" or dtype.name.startswith("float")


def _float_info(dtype: np.dtype) -> tuple[float, float]:
    """(epsilon, smallest subnormal) of a float dtype, ml_dtypes' included (float8_e5m2 among them
    says kind "f", but numpy's finfo refuses it)."""
    try:
        info = np.finfo(dtype)
    except (ValueError, TypeError):  # ml_dtypes' types: their own finfo
        import ml_dtypes

        info = ml_dtypes.finfo(dtype)
    return float(info.eps), float(info.smallest_subnormal)


def agrees(expected: np.ndarray, actual: np.ndarray, *, accumulated: bool = False) -> bool:
    """Whether onnxruntime's ``actual`` confirms refimpl's ``expected``.

    Same dtype and shape; integers, booleans and strings equal; floats with NaN,
    infinities (with their sign) and zeros (with their sign) in the same places,
    and other values within ``ULPS`` units in the last place:
    ``|a - e| <= ULPS * max(eps * m, smallest subnormal)`` with ``m = max(|a|, |e|)``,
    or, when ``accumulated`` (an :data:`ACCUMULATING` op computed it or a value
    it was computed from), ``m`` at least the largest finite ``|e|`` of the array:
    the norm-wise bound in which the error of a sum in another order is stated.

    Why ULPs and not the check's tolerance: both compute the same function of the
    same constants, so they differ only by the rounding of a few kernels (numpy's
    and MLAS's exp or tanh, a sum in another order: a few ULPs); a larger
    difference is another result and such a value stays computed, where the
    check's rtol (1e-4 for float32) and atol would let a constant drift (or a
    1e-12 epsilon double) that a later op may amplify. Zero, infinity and NaN are
    exact because a later op turns their differences into the largest ones
    (1/-0 is -inf).
    """
    flat = np.asarray(actual).reshape(-1)
    chunks = (flat[i : i + _CHUNK] for i in range(0, flat.size, _CHUNK))
    return agrees_in_chunks(expected, actual.dtype, actual.shape, chunks, accumulated)


def agrees_in_chunks(expected: np.ndarray, dtype: np.dtype, shape: tuple[int, ...], chunks: Iterable[np.ndarray],
            accumulated: bool) -> bool:  # fmt: skip
    """:func:`agrees`, with ``actual`` given as its dtype, shape and flat chunks in order."""
    strings = expected.dtype.kind in "OSU", dtype.kind in "OSU"
    if any(strings):
        if not all(strings) or tuple(expected.shape) != tuple(shape):
            return False
        whole = np.concatenate([c.astype(str) for c in chunks]) if expected.size else np.array([], str)
        return bool(np.all(expected.reshape(-1).astype(str) == whole))
    if expected.dtype != dtype or tuple(expected.shape) != tuple(shape):
        return False
    e_flat = expected.reshape(-1)
    floats = is_float(dtype)
    eps, smallest = _float_info(dtype) if floats else (0.0, 0.0)
    scale = 0.0
    if floats and accumulated:
        for i in range(0, e_flat.size, _CHUNK):
            e = e_flat[i : i + _CHUNK].astype(np.float64)
            e = np.abs(e[np.isfinite(e)])
            scale = max(scale, float(e.max()) if e.size else 0.0)
    bits = np.dtype(f"u{dtype.itemsize}") if floats else None
    start = 0
    for a_own in chunks:
        e_own = e_flat[start : start + a_own.size]
        start += a_own.size
        if e_own.size != a_own.size:
            return False
        if not floats:
            if not np.array_equal(e_own, a_own):
                return False
            continue
        if np.array_equal(e_own.view(bits), np.ascontiguousarray(a_own).view(bits)):
            continue  # bit for bit (NaN payloads included)
        e, a = e_own.astype(np.float64), a_own.astype(np.float64)
        e_nan = np.isnan(e)
        if not np.array_equal(e_nan, np.isnan(a)):
            return False
        exact = (~np.isfinite(e) | ~np.isfinite(a) | (e == 0) | (a == 0)) & ~e_nan
        if not np.array_equal(e[exact], a[exact]) or not np.array_equal(np.signbit(e[exact]), np.signbit(a[exact])):
            return False
        close = ~exact & ~e_nan
        e, a = e[close], a[close]
        magnitude = np.maximum(np.maximum(np.abs(e), np.abs(a)), scale)
        if np.any(np.abs(a - e) > ULPS * np.maximum(eps * magnitude, smallest)):
            return False
    return start == e_flat.size


def _numpy_dtype(name: str) -> np.dtype:
    if name == "bfloat16" or name.startswith(("float8", "float4", "int4", "uint4")):
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


def file_chunks(found: Mapping[str, Any]) -> tuple[np.dtype, tuple[int, ...], Iterator[np.ndarray]]:
    """An output the child saved: its dtype, shape and data in chunks, read (not mapped: bounded memory)."""
    if found["dtype"] == "str":
        whole = np.load(found["path"], allow_pickle=False)
        return whole.dtype, tuple(whole.shape), iter([whole.reshape(-1)])
    dtype = _numpy_dtype(found["dtype"])
    shape = tuple(int(d) for d in found["shape"])
    total = int(np.prod(shape, dtype=np.int64))

    def chunks() -> Iterator[np.ndarray]:
        with open(found["path"], "rb") as f:
            f.seek(int(found["offset"]))
            for start in range(0, total, _CHUNK):
                count = min(_CHUNK, total - start)
                data = np.fromfile(f, dtype=np.uint8, count=count * dtype.itemsize)
                if data.size != count * dtype.itemsize:
                    raise OSError(f"{found['path']}: short read")
                yield data.view(dtype)

    return dtype, shape, chunks()


def differing_bits(expected: np.ndarray, found: Mapping[str, Any]) -> np.ndarray | None:
    """onnxruntime's saved output as an array when its bits differ from ``expected``'s, else None."""
    dtype, _, chunks = file_chunks(found)
    bits = np.dtype(f"u{dtype.itemsize}")
    flat, start, differs = expected.reshape(-1), 0, False
    for chunk in chunks:
        if not np.array_equal(flat[start : start + chunk.size].view(bits), np.ascontiguousarray(chunk).view(bits)):
            differs = True
            break
        start += chunk.size
    if not differs:
        return None
    dtype, shape, chunks = file_chunks(found)
    parts = list(chunks)
    whole = np.concatenate(parts) if parts else np.zeros(0, dtype)
    return whole.reshape(shape)
