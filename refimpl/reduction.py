"""Reduction kernels: ReduceSum, ReduceMean, ReduceMax, ReduceLogSumExp and the rest of the family.

Each op is one *reducer* built by ``_reducer(on_float, on_int)``: a function
``(data, axes) -> array`` that reduces ``data`` over ``axes`` keeping the reduced dimensions.
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
  * float16, bfloat16 and float32 are evaluated in float64 and rounded once to the input type,
    so the result is the float64 result correctly rounded. (float32 accumulation, which the
    brief suggested for float16, can be hundreds of ulps off after cancellation, e.g. the sum of
    [65504, 2**-14, -65504].)
  * NaN propagates through every reduction, ReduceMax/ReduceMin included (as the elementwise
    Max/Min do; onnxruntime's ReduceMax/Min drop a NaN that is not the first element).
  * ReduceLogSumExp shifts by the slice maximum (by 0 where that is not finite): a slice of
    only -inf gives -inf, a +inf entry gives +inf, NaN propagates, and 3e38 in float32 does
    not overflow.
  * Integer reductions are exact. A sum, sum of squares, L1 norm or product that does not fit
    the input type raises: the spec does not define the overflow and runtimes disagree
    (onnxruntime saturates, numpy and the onnx reference wrap around). Integer ReduceMean,
    ReduceL2, ReduceLogSum and ReduceLogSumExp return the exact real result truncated toward
    zero (as Cast converts a real to an integer). onnxruntime agrees except for
    ReduceLogSumExp, whose integer exp terms it truncates before summing.
  * Empty reductions give the schema's value: 0 for sums and norms, 1 for ReduceProd, -inf for
    ReduceLogSum/LogSumExp, -inf (or the dtype's minimum, False for bool) for ReduceMax and
    +inf (or the maximum, True) for ReduceMin. Where the schema says "undefined" (ReduceMean;
    ReduceLogSum/LogSumExp on integers, which cannot hold -inf) the kernel raises.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from refimpl._registry import Kernel
from refimpl.elementwise import DTypes, as_dtype, register_versions

Array = np.ndarray
Axes = tuple[int, ...]
Reducer = Callable[[Array, Axes], Array]


def _resolve_axes(axes: Any, rank: int, noop_with_empty_axes: bool) -> Axes:
    """Normalises ``axes`` to sorted non-negative ints; empty means all axes unless noop."""
    if axes is None:
        values = []
    elif isinstance(axes, np.ndarray):
        values = axes.tolist() if axes.ndim == 1 else axes.ravel().tolist()
    else:
        values = list(axes)
    if not values:
        return () if noop_with_empty_axes else tuple(range(rank))
    out = []
    for axis in values:
        axis = int(axis)
        if not -rank <= axis < rank:
            raise ValueError(f"axis {axis} is out of range for a tensor of rank {rank}")
        out.append(axis % rank)
    if len(set(out)) != len(out):
        raise ValueError(f"axes {values} repeat an axis")
    return tuple(sorted(out))


def _count(data: Array, axes: Axes) -> int:
    return math.prod(data.shape[a] for a in axes)


def _reducer(
    on_float: Reducer, on_int: Reducer, *, exact: bool = False, quiet: bool = False
) -> Reducer:
    """Builds a reducer: floats go to ``on_float``, integers and bool to ``on_int``.

    Args:
        on_float: the float computation; it receives float64 unless ``exact``.
        on_int: the integer (and bool) computation.
        exact: the result is one of the inputs (max, min), so floats stay in their own type
            (float32 for ml_dtypes floats).
        quiet: silence numpy's floating-point warnings (log(0) = -inf is intended).
    """

    def reduce(data: Array, axes: Axes) -> Array:
        if data.dtype.kind in "iub":
            return on_int(data, axes)
        if exact:
            return on_float(data.astype(np.float32) if data.dtype.kind == "V" else data, axes)
        wide = data.astype(np.float64, copy=False)
        if quiet:
            with np.errstate(all="ignore"):
                return on_float(wide, axes)
        return on_float(wide, axes)

    return reduce


def _kernel(reducer: Reducer, *, axes_input: bool) -> Callable[[DTypes], Kernel]:
    """Wraps a reducer in the attribute form or the input form of the Reduce* schemas."""

    def make(types: DTypes) -> Kernel:
        allowed = types["T"]

        def kernel(inputs: Sequence[Any], attrs: dict[str, Any]) -> tuple[Array]:
            data = np.asarray(inputs[0])
            if data.dtype not in allowed:
                raise TypeError(f"input dtype {data.dtype} is not allowed by the schema")
            if axes_input:
                raw = inputs[1] if len(inputs) > 1 else None
                axes = _resolve_axes(raw, data.ndim, bool(attrs.get("noop_with_empty_axes", 0)))
            else:
                axes = _resolve_axes(attrs.get("axes"), data.ndim, False)
            out = reducer(data, axes)
            if not attrs.get("keepdims", 1):
                out = out.reshape([d for i, d in enumerate(out.shape) if i not in axes])
            return (as_dtype(out, data.dtype),)

        return kernel

    return make


# --- the reducers --------------------------------------------------------------------------


def _sum(x: Array, axes: Axes) -> Array:
    total = np.add.reduce(x, axis=axes, keepdims=True)
    # Reducing a 0-d object array returns a bare Python int.
    return total if isinstance(total, np.ndarray) else np.asarray(total, dtype=x.dtype)


def _sum_square(x: Array, axes: Axes) -> Array:
    return _sum(np.asarray(x * x, dtype=x.dtype), axes)


def _sum_abs(x: Array, axes: Axes) -> Array:
    return _sum(np.asarray(np.abs(x), dtype=x.dtype), axes)


def _prod(x: Array, axes: Axes) -> Array:
    total = np.multiply.reduce(x, axis=axes, keepdims=True)
    return total if isinstance(total, np.ndarray) else np.asarray(total, dtype=x.dtype)


def _widen(x: Array, log2_bound: float) -> Array:
    """``x`` as int64 when every intermediate stays below 2**62, else as exact Python ints."""
    return x.astype(np.int64) if log2_bound < 62 else x.astype(object)


def _log2_peak(x: Array) -> float:
    peak = float(np.abs(x.astype(np.float64)).max(initial=1.0))
    return math.log2(max(peak, 1.0))


def _fit(total: Array, dtype: np.dtype) -> Array:
    """Exact integer results, which must be representable in ``dtype``."""
    info = np.iinfo(dtype)
    if total.size and (total.min() < info.min or total.max() > info.max):
        # The spec does not define integer overflow here and runtimes disagree
        # (onnxruntime saturates, numpy wraps around), so there is no value to fold.
        raise ValueError(f"the result overflows {dtype}")
    return total.astype(dtype)


def _exact_int(op: Callable[[Array, Axes], Array], *, power: int) -> Reducer:
    """An integer reduction computed exactly; ``power`` bounds its growth (|x|**power per term).

    ``power=0`` marks a product, whose growth is |x|**n.
    """

    def reduce(x: Array, axes: Axes) -> Array:
        count = _count(x, axes)
        peak = _log2_peak(x)
        growth = count * peak if power == 0 else power * peak + math.log2(count + 1)
        return _fit(op(_widen(x, growth), axes), x.dtype)

    return reduce


def _identity(dtype: np.dtype, *, largest: bool) -> Any:
    """A max (min) over an empty set: -inf (+inf), the dtype's min (max), False (True)."""
    if dtype.kind == "b":
        return not largest
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return info.min if largest else info.max
    return -np.inf if largest else np.inf


_IDENTITIES = {
    (dt, largest): _identity(np.dtype(dt), largest=largest)
    for dt in (np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32,
               np.int64, np.uint64, np.float16, np.float32, np.float64)
    for largest in (True, False)
}


def _extreme(ufunc: np.ufunc, *, largest: bool) -> Reducer:
    """ReduceMax/ReduceMin; the identity fills the results of empty sets."""

    def reduce(x: Array, axes: Axes) -> Array:
        initial = _IDENTITIES[(x.dtype.type, largest)]
        return ufunc.reduce(x, axis=axes, keepdims=True, initial=initial)

    return reduce


def _check_defined(x: Array, axes: Axes, what: str) -> int:
    """The number of reduced elements; raises if an output element reduces an empty set."""
    count = _count(x, axes)
    if count == 0 and x.ndim and math.prod(d for i, d in enumerate(x.shape) if i not in axes):
        raise ValueError(f"{what} of an empty set is undefined")
    return count


def _float_mean(x: Array, axes: Axes) -> Array:
    count = _check_defined(x, axes, "the mean")
    return _sum(x, axes) / max(count, 1)


def _int_mean(x: Array, axes: Axes) -> Array:
    count = max(_check_defined(x, axes, "the mean"), 1)
    exact = _sum(x.astype(object), axes)
    # Exact Python-int sums; the mean of values of a type always fits the type.
    quotient = [_trunc_div(int(s), count) for s in exact.ravel()]
    return np.array(quotient, dtype=x.dtype).reshape(exact.shape)


def _trunc_div(a: int, b: int) -> int:
    q = abs(a) // b
    return q if a >= 0 else -q


def _float_l2(x: Array, axes: Axes) -> Array:
    return np.sqrt(_sum_square(x, axes))


def _int_l2(x: Array, axes: Axes) -> Array:
    squares = _sum_square(x.astype(object), axes)
    roots = [math.isqrt(int(s)) for s in squares.ravel()]
    return _fit(np.array(roots, dtype=object).reshape(squares.shape), x.dtype)


def _float_log_sum(x: Array, axes: Axes) -> Array:
    return np.log(_sum(x, axes))


def _int_log_sum(x: Array, axes: Axes) -> Array:
    total = _sum(x.astype(object), axes)
    if total.size and total.min() <= 0:
        raise ValueError("the log of a non-positive integer sum is not representable")
    return np.trunc(np.log(total.astype(np.float64)))


def _float_log_sum_exp(x: Array, axes: Axes) -> Array:
    """``m + log(sum(exp(x - m)))`` with ``m`` the slice maximum.

    A slice whose maximum is not finite (all -inf, empty, a +inf or a NaN in it) is shifted by
    0 instead: -inf stays -inf, +inf gives +inf and NaN propagates. Only that case can warn.
    """
    shift = np.maximum.reduce(x, axis=axes, keepdims=True, initial=-np.inf)
    if np.isfinite(shift).all():
        return np.log(np.add.reduce(np.exp(x - shift), axis=axes, keepdims=True)) + shift
    with np.errstate(all="ignore"):
        shift = np.where(np.isfinite(shift), shift, 0.0)
        return np.log(np.add.reduce(np.exp(x - shift), axis=axes, keepdims=True)) + shift


def _int_log_sum_exp(x: Array, axes: Axes) -> Array:
    """Exact integer ReduceLogSumExp: ``trunc(m + log(sum(exp(x - m))))`` with integer ``m``."""
    _check_defined(x, axes, "ReduceLogSumExp (-inf, not an integer)")
    if x.size == 0:
        return np.zeros([1 if i in axes else d for i, d in enumerate(x.shape)], x.dtype)
    top = np.maximum.reduce(x, axis=axes, keepdims=True)
    gap = top - x  # >= 0; wraps negative only when the true gap exceeds the type's range
    gap_f = np.where(gap < 0, np.inf, gap.astype(np.float64)) if x.dtype.kind == "i" else gap
    with np.errstate(all="ignore"):
        offset = np.log(np.add.reduce(np.exp(-gap_f.astype(np.float64)), axis=axes, keepdims=True))
    whole = np.floor(offset)
    if np.any(top.astype(np.float64) + whole > float(np.iinfo(x.dtype).max)):
        raise ValueError("ReduceLogSumExp overflows the input type")
    base = top + whole.astype(x.dtype)
    # base + fraction truncated toward zero: a negative base with a fraction moves up by one.
    return base + ((base < 0) & (offset > whole)).astype(x.dtype)


_REDUCERS: dict[str, Reducer] = {
    "ReduceSum": _reducer(_sum, _exact_int(_sum, power=1)),
    "ReduceSumSquare": _reducer(_sum_square, _exact_int(_sum_square, power=2)),
    "ReduceL1": _reducer(_sum_abs, _exact_int(_sum_abs, power=1)),
    "ReduceL2": _reducer(_float_l2, _int_l2),
    "ReduceMean": _reducer(_float_mean, _int_mean, quiet=True),
    "ReduceProd": _reducer(_prod, _exact_int(_prod, power=0)),
    "ReduceMax": _reducer(*[_extreme(np.maximum, largest=True)] * 2, exact=True),
    "ReduceMin": _reducer(*[_extreme(np.minimum, largest=False)] * 2, exact=True),
    "ReduceLogSum": _reducer(_float_log_sum, _int_log_sum, quiet=True),
    "ReduceLogSumExp": _reducer(_float_log_sum_exp, _int_log_sum_exp),
}

# Schema versions per op: (attribute form, input form).
_VERSIONS: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "ReduceSum": ((1, 11), (13,)),
    "ReduceSumSquare": ((1, 11, 13), (18,)),
    "ReduceL1": ((1, 11, 13), (18,)),
    "ReduceL2": ((1, 11, 13), (18,)),
    "ReduceMean": ((1, 11, 13), (18,)),
    "ReduceProd": ((1, 11, 13), (18,)),
    "ReduceMax": ((1, 11, 12, 13), (18, 20)),
    "ReduceMin": ((1, 11, 12, 13), (18, 20)),
    "ReduceLogSum": ((1, 11, 13), (18, 28)),
    "ReduceLogSumExp": ((1, 11, 13), (18, 28)),
}

for _op, (_attr_versions, _input_versions) in _VERSIONS.items():
    register_versions(_op, _attr_versions, _kernel(_REDUCERS[_op], axes_input=False))
    register_versions(_op, _input_versions, _kernel(_REDUCERS[_op], axes_input=True))
