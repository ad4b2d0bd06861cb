"""Reduction kernels: ReduceSum, ReduceMean, ReduceMax, ReduceLogSumExp and the rest of the family.

Each op is one *reducer* built by ``_reducer(on_float, on_int)``: a function
``(data, axes, keepdims) -> array`` that reduces ``data`` over the normalised ``axes``.
``_kernel`` wraps a reducer in either calling convention:

  * attribute form (schema versions below 18; ReduceSum below 13): ``axes`` is an attribute and
    an absent or empty list reduces every axis;
  * input form: ``axes`` is an optional int64 input; when it is absent or empty,
    ``noop_with_empty_axes=1`` reduces over the empty set of axes, which is the identity for the
    reduction step while composite reductions still apply their elementwise steps (ReduceL2
    gives ``|x|``, ReduceLogSum ``log(x)``, ReduceSumSquare ``x*x``), as the current ONNX schema
    text says and onnxruntime does. (The ReduceL2/ReduceLogSumExp-18 pages say "returned
    unchanged"; their examples have no negative inputs, so both readings agree there.)

Numerics:
  * float16, bfloat16 and float32 are evaluated in float64 (float64 input as is) and rounded
    once to the input type, so the result is the float64 result correctly rounded.
  * Except where the op's definition holds an intermediate tensor and that tensor overflows:
    the sum of squares of ReduceL2, the sum of ReduceLogSum and ReduceMean, the shifted sum of
    exps of ReduceLogSumExp. onnxruntime holds it in the input type, float32 for float16 and
    bfloat16 (the spec does not fix it; the schema's function body would use float16), and so
    does refimpl: where it rounds to +-inf there (its magnitude reaches ``limit``, the largest
    finite value plus half an ulp) the result is what +-inf gives: float32 ReduceL2 of
    [3e19, 4e19] is inf, not 5e19; float16 ReduceL2 of [200, 300] is 360.5.
  * Where onnxruntime's answer depends on its code path or order, and the spec leaves it open,
    the kernel raises UndefinedResultError (the node is not folded) instead of guessing:
    float ReduceMax/Min over NaN, or over +0 and -0 at a zero extreme; a float sum of only -0;
    a float sum with mixed signs whose partial sums may overflow (3e38 + 3e38 - 3e38 is inf in
    onnxruntime), or that cancels within onnxruntime's rounding error (unless every partial sum
    is exact); a product whose partial products may leave the normal range; a square below the
    normal range (onnxruntime squares in float32: ReduceL2([1e-38]) is 0 there); float16
    ReduceLogSum (onnxruntime adds in float16 there); ReduceLogSumExp over NaN with an inf,
    over -inf with values below -60 (onnxruntime does not shift there) and float16 beyond +-11.
  * Otherwise NaN propagates, and ReduceLogSumExp shifts by the slice maximum (by 0 where that
    is not finite): a slice of only -inf gives -inf, a +inf entry +inf, and 3e38 in float32
    does not overflow.
  * Integer reductions are exact: they run in the input type when a bound on the result
    (from the largest magnitude and the count) shows that nothing can overflow, and in int64 or
    Python ints otherwise. A sum, sum of squares, L1 norm or product that does not fit the input
    type raises UndefinedResultError: the spec does not define the overflow and runtimes
    disagree (onnxruntime saturates, numpy and the onnx reference wrap around). So does an
    integer sum whose partial sums may saturate, and a 64-bit sum or product beyond 2**53
    (onnxruntime accumulates 64-bit integers in double). Integer ReduceMean, ReduceL2,
    ReduceLogSum and ReduceLogSumExp return the exact real result truncated toward zero (as Cast
    converts a real to an integer). onnxruntime agrees except for ReduceLogSumExp, whose integer
    exp terms it truncates before summing.
  * Empty reductions give the schema's value: 0 for sums and norms, 1 for ReduceProd, -inf for
    ReduceLogSum/LogSumExp, -inf (or the dtype's minimum, False for bool) for ReduceMax and
    +inf (or the maximum, True) for ReduceMin. Where the schema says "undefined" (ReduceMean;
    ReduceLogSum/LogSumExp on integers, which cannot hold -inf) the kernel raises
    UndefinedResultError.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from refimpl._common import Attrs, Inputs, int_extent, normalize_axes
from refimpl._dtypes import (
    F32,
    F64,
    DTypes,
    accumulator_type,
    as_dtype,
    checked,
    int_range,
    overflow_limit,
)
from refimpl._errors import RuntimeChoiceError, UndefinedResultError
from refimpl._extremes import extreme
from refimpl._reduction_guards import (
    check_cancellation,
    check_log_sum_exp,
    check_partial_products,
    check_partial_sums,
    check_squares,
)
from refimpl._registry import Kernel, Typed, register

Array = np.ndarray
Axes = tuple[int, ...]
Reducer = Callable[[Array, Axes, int], Array]
"""``reduce(data, axes, keepdims)``: the reduction of ``data`` over the (normalised) ``axes``."""
HeldReducer = Callable[[Array, Axes, int, float], Array]
"""``reduce(data, axes, keepdims, limit)``: a float reduction whose definition holds an
intermediate in the input type; ``limit`` is the magnitude from which that type holds it as
+-inf (``overflow_limit``)."""


def _axes(op: str, axes: Any, rank: int, noop_with_empty_axes: bool) -> Axes:
    """Normalises ``axes`` (attribute list or int64 tensor); empty means all unless noop."""
    if isinstance(axes, np.ndarray):
        values = axes.tolist() if axes.ndim == 1 else axes.ravel().tolist()
    else:
        values = () if axes is None else axes
    if not len(values):
        return () if noop_with_empty_axes else tuple(range(rank))
    return normalize_axes(op, values, rank)


def _kernel(op: str, reducer: Reducer, *, axes_input: bool) -> Typed:
    """Wraps a reducer in the attribute form or the input form of the Reduce* schemas."""

    def make(types: DTypes) -> Kernel:
        allowed = types["T"]

        def kernel(inputs: Inputs, attrs: Attrs) -> tuple[Array]:
            data = checked(inputs[0], allowed)
            if axes_input:
                raw = inputs[1] if len(inputs) > 1 else None
                axes = _axes(op, raw, data.ndim, attrs.get("noop_with_empty_axes", 0))
            else:
                axes = _axes(op, attrs.get("axes"), data.ndim, False)
            return (as_dtype(reducer(data, axes, attrs.get("keepdims", 1)), data.dtype),)

        return kernel

    return Typed(make)


def _drop(out: Array, axes: Axes, keepdims: int) -> Array:
    """A keepdims result without the reduced dimensions unless ``keepdims``."""
    if keepdims:
        return out
    return out.reshape([d for i, d in enumerate(out.shape) if i not in axes])


def _count(data: Array, axes: Axes) -> int:
    return math.prod(data.shape[a] for a in axes)


def _reducer(
    on_float: Reducer | HeldReducer,
    on_int: Reducer,
    *,
    exact: bool = False,
    quiet: bool = False,
    held: bool = False,
    check: Callable[[Array, Axes], None] | None = None,
) -> Reducer:
    """Builds a reducer: floats go to ``on_float``, integers and bool to ``on_int``.

    Args:
        on_float: the float computation; it receives float64 unless ``exact``.
        on_int: the integer (and bool) computation.
        exact: the result is one of the inputs (max, min), so floats stay in their own type
            (float32 for ml_dtypes floats).
        quiet: silence numpy's floating-point warnings (log(0) = -inf is intended).
        held: ``on_float`` is a HeldReducer: it also receives the input type's overflow limit.
        check: called with float data in its own type first; raises to decline.
    """

    def reduce(data: Array, axes: Axes, keepdims: int) -> Array:
        kind = data.dtype.kind
        if kind in "iub":
            return on_int(data, axes, keepdims)
        if check is not None:
            with np.errstate(all="ignore"):
                check(data.astype(F32) if kind == "V" else data, axes)
        if exact:
            return on_float(data.astype(F32) if kind == "V" else data, axes, keepdims)
        wide = data if data.dtype == F64 else data.astype(F64)
        if not (held or quiet):  # sums and products: the common call pays for nothing else
            return on_float(wide, axes, keepdims)
        args: tuple[Any, ...] = (wide, axes, keepdims)
        if held:  # onnxruntime holds float16 intermediates in float32
            args += (overflow_limit(accumulator_type(data.dtype)),)
        if quiet:
            with np.errstate(all="ignore"):
                return on_float(*args)
        return on_float(*args)

    return reduce


# --- the reducers --------------------------------------------------------------------------


def _sum(x: Array, axes: Axes, keepdims: int) -> Array:
    if x.dtype.kind == "f" and x.size:
        # -0 is the identity of IEEE addition: the sum of only -0 is -0. onnxruntime gives -0
        # or +0 there depending on its code path (a whole-tensor sum keeps -0, a sum over a
        # size-1 axis does not), so such a sum declines.
        total = np.add.reduce(x, axes, None, None, keepdims, -0.0)
        if np.any((total == 0) & np.signbit(total)):
            raise RuntimeChoiceError("a sum of only -0: onnxruntime's sign depends on its code path")
    else:
        total = np.add.reduce(x, axes, None, None, keepdims)
    # A reduction to one element returns a numpy scalar (a bare Python int for object arrays).
    return total if isinstance(total, np.ndarray) else np.asarray(total, dtype=x.dtype)


def _sum_square(x: Array, axes: Axes, keepdims: int) -> Array:
    return _sum(np.asarray(x * x, dtype=x.dtype), axes, keepdims)


def _sum_abs(x: Array, axes: Axes, keepdims: int) -> Array:
    return _sum(np.asarray(np.abs(x), dtype=x.dtype), axes, keepdims)


def _prod(x: Array, axes: Axes, keepdims: int) -> Array:
    total = np.multiply.reduce(x, axes, None, None, keepdims)
    return total if isinstance(total, np.ndarray) else np.asarray(total, dtype=x.dtype)


def _held(total: Array, limit: float) -> Array:
    """A float64 intermediate as the input type holds it: +-inf where it rounds beyond range."""
    if limit == math.inf or not total.size:
        return total
    over = np.abs(total) >= limit
    if not over.any():
        return total
    return np.where(over, np.copysign(np.inf, total), total)


def _log2_peak(x: Array) -> float:
    """``log2(max |x|)`` of an integer array (0 when every ``|x| <= 1`` or ``x`` is empty)."""
    if not x.size:
        return 0.0
    low, high = int_extent(x)  # Python ints: no overflow in -low
    return math.log2(max(-low, high, 1))


def _fit(total: Array, dtype: np.dtype) -> Array:
    """Exact integer results, which must be representable in ``dtype``."""
    low, high = int_range(dtype)
    if total.size and (total.min() < low or total.max() > high):
        # The spec does not define integer overflow here and runtimes disagree
        # (onnxruntime saturates, numpy wraps around), so there is no value to fold.
        raise UndefinedResultError(f"the result overflows {dtype}")
    return total.astype(dtype)


def _check_double(x: Array, axes: Axes, power: int) -> None:
    """Declines a 64-bit integer sum whose terms add up beyond 2**53 (|x|**power per term).

    onnxruntime accumulates 64-bit integer sums in double, which is inexact beyond 2**53
    (ReduceSum([2**53 + 1, 0]) is 2**53 there) and saturates when converting back.
    """
    magnitudes = np.asarray(np.abs(x.astype(object)) ** power, dtype=object)
    if x.size and int(np.max(_sum(magnitudes, axes, False))) > 2**53:
        raise UndefinedResultError("a 64-bit integer sum beyond 2**53: onnxruntime adds in double")


def _exact_int(op: Reducer, *, power: int) -> Reducer:
    """An integer reduction computed exactly; ``power`` bounds its growth (|x|**power per term).

    ``power=0`` marks a product, whose growth is |x|**n. When the bound shows that no partial
    result can overflow the input type, ``op`` runs in that type; otherwise it runs in int64
    (or exact Python ints beyond 2**62) and the result must fit the input type.

    onnxruntime saturates partial sums, so a sum whose magnitudes add up beyond the type
    declines even when the exact result fits; it multiplies 64-bit integers through double, so
    a 64-bit product with a factor or result beyond 2**53 declines.
    """
    high = 2**53

    def reduce(x: Array, axes: Axes, keepdims: int) -> Array:
        count = _count(x, axes)
        peak = _log2_peak(x)
        growth = count * peak if power == 0 else power * peak + math.log2(count + 1)
        if power == 0 and x.dtype.itemsize == 8 and peak > 53:
            raise UndefinedResultError("a 64-bit product beyond 2**53: onnxruntime multiplies in double")
        if power and x.dtype.itemsize == 8 and growth >= 53:
            _check_double(x, axes, power)
        if growth < int_range(x.dtype)[1].bit_length() - 1:
            return op(x, axes, keepdims)
        wide = x.astype(np.int64) if growth < 62 else x.astype(object)
        if power == 1 and x.dtype.kind == "i":
            _fit(_sum(np.abs(x.astype(object)), axes, True), x.dtype)  # partial sums saturate
        total = _fit(op(wide, axes, True), x.dtype)
        if power == 0 and x.dtype.itemsize == 8 and total.size and int(np.max(np.abs(total.astype(object)))) > high:
            raise UndefinedResultError("a 64-bit product beyond 2**53: onnxruntime multiplies in double")
        return _drop(total, axes, keepdims)

    return reduce


def _check_defined(x: Array, axes: Axes, what: str) -> int:
    """The number of reduced elements; raises if an output element reduces an empty set."""
    count = _count(x, axes)
    if count == 0 and x.ndim and math.prod(d for i, d in enumerate(x.shape) if i not in axes):
        raise UndefinedResultError(f"{what} of an empty set is undefined")
    return count


def _float_sum(x: Array, axes: Axes, keepdims: int, limit: float) -> Array:
    check_partial_sums(x, axes, limit)
    return _sum(x, axes, keepdims)


def _float_mean(x: Array, axes: Axes, keepdims: int, limit: float) -> Array:
    count = _check_defined(x, axes, "the mean")
    check_partial_sums(x, axes, limit)
    return _held(_sum(x, axes, keepdims), limit) / max(count, 1)


def _int_mean(x: Array, axes: Axes, keepdims: int) -> Array:
    count = max(_check_defined(x, axes, "the mean"), 1)
    if x.dtype.itemsize == 8:
        _check_double(x, axes, 1)
    exact = _sum(x.astype(object), axes, True)
    # Exact Python-int sums; the mean of values of a type always fits the type.
    quotient = [_trunc_div(int(s), count) for s in exact.ravel()]
    return _drop(np.array(quotient, dtype=x.dtype).reshape(exact.shape), axes, keepdims)


def _trunc_div(a: int, b: int) -> int:
    q = abs(a) // b
    return q if a >= 0 else -q


def _float_l2(x: Array, axes: Axes, keepdims: int, limit: float) -> Array:
    return np.sqrt(_held(_sum_square(x, axes, keepdims), limit))


def _int_l2(x: Array, axes: Axes, keepdims: int) -> Array:
    squares = _sum_square(x.astype(object), axes, True)
    roots = np.array([math.isqrt(int(s)) for s in squares.ravel()], dtype=object)
    return _drop(_fit(roots.reshape(squares.shape), x.dtype), axes, keepdims)


def _check_log_sum(x: Array, axes: Axes) -> None:
    """Declines float16 ReduceLogSum: onnxruntime adds float16 in float16 there (its ReduceSum
    adds in float32), so a cancelling sum such as [-1, -3, 2, 6e-8, 6e-8, 2] is 0 (log: -inf)."""
    if x.dtype == np.float16:
        raise UndefinedResultError("float16 ReduceLogSum: onnxruntime adds in float16")


def _check_log_sum_inputs(x: Array, axes: Axes) -> None:
    _check_log_sum(x, axes)
    check_cancellation(x, axes)


def _float_log_sum(x: Array, axes: Axes, keepdims: int, limit: float) -> Array:
    check_partial_sums(x, axes, limit)
    return np.log(_held(_sum(x, axes, keepdims), limit))


def _int_log_sum(x: Array, axes: Axes, keepdims: int) -> Array:
    total = _sum(x.astype(object), axes, keepdims)
    if total.size and total.min() <= 0:
        raise UndefinedResultError("the log of a non-positive integer sum is not representable")
    return np.trunc(np.log(total.astype(np.float64)))


def _float_log_sum_exp(x: Array, axes: Axes, keepdims: int, limit: float) -> Array:
    """``m + log(sum(exp(x - m)))`` with ``m`` the slice maximum.

    A slice whose maximum is not finite (all -inf, empty, a +inf or a NaN in it) is shifted by
    0 instead: -inf stays -inf, +inf gives +inf and NaN propagates. Only that case can warn.
    The shifted sum is at most the count of terms, so only a float16 slice of more than 65519
    terms can overflow it.
    """
    shift = np.maximum.reduce(x, axes, None, None, True, -np.inf)
    finite = np.isfinite(shift)
    if np.count_nonzero(finite) == finite.size:
        log_total = np.log(_shifted_sum(x, shift, axes, keepdims, limit))
    else:
        shift = np.where(finite, shift, 0.0)
        with np.errstate(all="ignore"):
            log_total = np.log(_shifted_sum(x, shift, axes, keepdims, limit))
    result = log_total + (shift if keepdims else shift.reshape(log_total.shape))
    if np.any((result != 0) & (np.abs(result) < 2.0**-20)):
        # log(exp(m)) of a tiny m: the unshifted path gives log(1) = 0, the shifted one m.
        raise UndefinedResultError("ReduceLogSumExp near 0: onnxruntime's paths round it differently")
    return result


def _shifted_sum(x: Array, shift: Array, axes: Axes, keepdims: int, limit: float) -> Array:
    total = np.add.reduce(np.exp(x - shift), axes, None, None, keepdims)
    # Each term is at most 1: below ``limit`` terms the sum cannot overflow the input type.
    return _held(total, limit) if x.size >= limit else total


def _int_log_sum_exp(x: Array, axes: Axes, keepdims: int) -> Array:
    """Exact integer ReduceLogSumExp: ``trunc(m + log(sum(exp(x - m))))`` with integer ``m``."""
    _check_defined(x, axes, "ReduceLogSumExp (-inf, not an integer)")
    if x.size == 0:
        shape = [1 if i in axes else d for i, d in enumerate(x.shape)]
        return _drop(np.zeros(shape, x.dtype), axes, keepdims)
    top = np.maximum.reduce(x, axes, None, None, True)
    gap = top - x  # >= 0; wraps negative only when the true gap exceeds the type's range
    gap_f = np.where(gap < 0, np.inf, gap.astype(np.float64)) if x.dtype.kind == "i" else gap
    with np.errstate(all="ignore"):
        offset = np.log(np.add.reduce(np.exp(-gap_f.astype(np.float64)), axes, None, None, True))
    whole = np.floor(offset)
    if np.any(top.astype(np.float64) + whole > float(int_range(x.dtype)[1])):
        raise UndefinedResultError("ReduceLogSumExp overflows the input type")
    base = top + whole.astype(x.dtype)
    # base + fraction truncated toward zero: a negative base with a fraction moves up by one.
    return _drop(base + ((base < 0) & (offset > whole)).astype(x.dtype), axes, keepdims)


# ReduceSumSquare, ReduceL1 and ReduceSum need no limit: their result is the intermediate, and
# rounding it to the input type overflows by itself.
_REDUCERS: dict[str, Reducer] = {
    "ReduceSum": _reducer(_float_sum, _exact_int(_sum, power=1), held=True, check=check_cancellation),
    "ReduceSumSquare": _reducer(_sum_square, _exact_int(_sum_square, power=2), check=check_squares),
    "ReduceL1": _reducer(_sum_abs, _exact_int(_sum_abs, power=1)),
    "ReduceL2": _reducer(_float_l2, _int_l2, held=True, check=check_squares),
    "ReduceMean": _reducer(_float_mean, _int_mean, quiet=True, held=True, check=check_cancellation),
    "ReduceProd": _reducer(_prod, _exact_int(_prod, power=0), check=check_partial_products),
    "ReduceMax": _reducer(*[extreme(np.maximum, largest=True)] * 2, exact=True),
    "ReduceMin": _reducer(*[extreme(np.minimum, largest=False)] * 2, exact=True),
    "ReduceLogSum": _reducer(
        _float_log_sum, _int_log_sum, quiet=True, held=True, check=_check_log_sum_inputs
    ),
    "ReduceLogSumExp": _reducer(
        _float_log_sum_exp, _int_log_sum_exp, held=True, check=check_log_sum_exp
    ),
}

# op: (the last schema version with the axes attribute, the first with the axes input).
_FORMS: dict[str, tuple[int, int]] = {"ReduceSum": (11, 13)}

for _op, _reduce in _REDUCERS.items():
    _last_attribute, _first_input = _FORMS.get(_op, (13, 18))
    register(_op, 1, _last_attribute)(_kernel(_op, _reduce, axes_input=False))
    register(_op, _first_input)(_kernel(_op, _reduce, axes_input=True))
