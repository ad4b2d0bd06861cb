"""Where a float reduction's result depends on onnxruntime's order or code path: the kernel declines.

Each check raises :class:`UndefinedResultError` (the node is not folded) for
the inputs on which onnxruntime's answer is not the exact one rounded once:
partial sums or products that leave the accumulator's range, a sum that
cancels within its rounding error, a square below the normal range, and
ReduceLogSumExp's special paths. :mod:`refimpl.reduction` says which
reducer uses which (its module docstring lists them all).
"""

from __future__ import annotations

import functools
import math

import ml_dtypes
import numpy as np

from refimpl._dtypes import F32, F64, accumulator_type
from refimpl._errors import RuntimeChoiceError, UndefinedResultError

__all__ = ["check_cancellation", "check_log_sum_exp", "check_partial_products", "check_partial_sums", "check_squares"]

Array = np.ndarray
Axes = tuple[int, ...]


def check_partial_sums(x: Array, axes: Axes, limit: float) -> None:
    """Declines a float sum whose partial sums might round to +-inf in the accumulator type.

    onnxruntime adds in float32 in its own order, so 3e38 + 3e38 - 3e38 is inf there; the exact
    sum is not. Safe when the finite magnitudes add up to less than ``limit``, or when they all
    have one sign (partial sums then grow monotonically towards the result).
    """
    if not x.size:
        return
    if limit == math.inf:  # float64: the sum itself is in float64, in another order
        limit = float(np.finfo(F64).max)
    finite = np.where(np.isfinite(x), x, 0.0)
    mixed = np.logical_or.reduce(x > 0, axes) & np.logical_or.reduce(x < 0, axes)  # infinities too
    if np.any(mixed & (np.add.reduce(np.abs(finite), axes) >= limit)):
        raise RuntimeChoiceError("partial sums may overflow: onnxruntime's result depends on its order")


def check_cancellation(x: Array, axes: Axes) -> None:
    """Declines a float sum that cancels to the last bits of its terms.

    onnxruntime adds in an order of its own; where ``|sum| <= eps * sum|x|`` (eps of the
    accumulator type) its rounding errors can decide the result's sign, or make it 0 where the
    exact sum is not (float16 ReduceMean of [65504, -65504, -6e-8, ...] is +0 there, -0
    exactly; then -inf/inf behind a Log or Reciprocal). (The worst-case bound is ``n`` times
    larger; it would decline most long random sums.) Such a slice declines unless its sum is
    exact in every order: every element is
    a multiple of the smallest element's ulp ``q`` and ``sum|x| <= 2**p * q`` (p: the
    accumulator's precision), so that no partial sum rounds.
    """
    if x.dtype.kind != "f" or not x.size:
        return
    precision = np.finfo(x.dtype).nmant + 1
    accumulator = np.finfo(accumulator_type(x.dtype))
    wide = x.astype(F64)
    finite = np.isfinite(wide)
    values = np.where(finite, wide, 0.0)
    with np.errstate(all="ignore"):
        total = np.add.reduce(values, axes)
        magnitude = np.add.reduce(np.abs(values), axes)
        doubtful = np.abs(total) <= float(accumulator.eps) * magnitude
        doubtful &= np.logical_and.reduce(finite, axes) & (magnitude > 0)
        if not np.any(doubtful):
            return
        _, exponent = np.frexp(np.where(values != 0, values, np.inf))  # inf: no ulp (largest)
        ulp = np.where(values != 0, exponent.astype(np.float64) - precision, np.inf)
        smallest = np.minimum.reduce(ulp, axes)
        exact = magnitude <= np.exp2(smallest + accumulator.nmant + 1)  # 2**p * q itself is representable
    if np.any(doubtful & ~exact):
        raise RuntimeChoiceError("a sum that cancels within rounding error: onnxruntime's order decides")


def check_partial_products(x: Array, axes: Axes) -> None:
    """Declines a float product whose partial products might leave the normal range of ``dtype``.

    onnxruntime multiplies in float32 in its own order: a partial product may overflow to inf
    (inf * 0 = NaN) or underflow to 0 where the exact product does not. Safe when the product
    of the factors below 1 stays normal and that of those above 1 stays finite.
    """
    if not x.size:
        return
    info = ml_dtypes.finfo(accumulator_type(x.dtype))
    with np.errstate(divide="ignore"):
        logs = np.log2(np.abs(np.where(np.isfinite(x) & (x != 0), x, 1.0)))
    shrink = np.add.reduce(np.minimum(logs, 0.0), axes)
    grow = np.add.reduce(np.maximum(logs, 0.0), axes)
    if np.any(shrink < math.log2(float(info.tiny)) + 1) or np.any(grow > math.log2(float(info.max)) - 1):
        raise UndefinedResultError("partial products may leave the type's range: onnxruntime's order decides")


def check_squares(x: Array, axes: Axes) -> None:
    """Declines a sum of squares with a square below the normal range of the accumulator type.

    onnxruntime squares in float32 (float16 too), so float32 ReduceL2([1e-38]) is 0 there.
    """
    tiny = float(ml_dtypes.finfo(accumulator_type(x.dtype)).tiny)
    magnitude = np.abs(x.astype(F64))
    if np.any((magnitude > 0) & (magnitude * magnitude < tiny)):
        raise UndefinedResultError("a square below the normal range: onnxruntime's float32 square underflows")


def check_log_sum_exp(x: Array, axes: Axes) -> None:
    """Declines float ReduceLogSumExp where onnxruntime's paths disagree with the shifted sum.

    onnxruntime shifts by the slice maximum, except where a slice holds -inf (along an axis),
    where ``exp`` underflows unshifted (float64 ``[-inf, -800]`` gives -inf, not -800); its
    float16 kernel overflows (``[65504]`` gives inf) and its whole-tensor path may skip a NaN
    behind an inf (``[inf, nan]`` gives inf, float64 ``[-inf, nan]`` -inf). Such slices decline:
    NaN with an inf, -inf with a
    largest finite value below -60, float16 with a finite value beyond +-11.
    """
    if not x.size:
        return
    present = functools.partial(np.logical_or.reduce, axis=axes)
    if np.any(present(np.isnan(x)) & present(np.isinf(x))):
        raise UndefinedResultError("ReduceLogSumExp over NaN and inf: onnxruntime's result depends on its path")
    top = np.maximum.reduce(np.where(np.isfinite(x), x, -np.inf).astype(F64), axes, initial=-np.inf)
    if np.any(present(np.isneginf(x)) & np.isfinite(top) & (top < -60)):
        raise UndefinedResultError("ReduceLogSumExp of -inf and values below -60: onnxruntime's exp underflows")
    if x.dtype.itemsize <= 2 and np.any(np.isfinite(x) & (np.abs(x.astype(F32)) > 11)):
        raise UndefinedResultError("float16 ReduceLogSumExp beyond +-11: onnxruntime's exp overflows")
