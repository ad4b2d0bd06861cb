"""ReduceMax and ReduceMin: the reductions that select rather than accumulate.

They need none of the sum family's care for intermediates and overflow: the
result is one of the inputs, in the input type. What they need instead is an
identity for an empty set (-inf or +inf, the integer type's minimum or maximum,
False or True) and a refusal where onnxruntime's answer depends on its code
path: a float slice with a NaN, or with +0 and -0 at a zero extreme.
:mod:`refimpl.reduction` registers :func:`extreme` for both ops.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from refimpl._errors import RuntimeChoiceError, UndefinedResultError

__all__ = ["extreme"]

Array = np.ndarray
Axes = tuple[int, ...]
Reducer = Callable[[Array, Axes, int], Array]


def _check_extreme(x: Array, axes: Axes, keepdims: int, out: Array) -> None:
    """Declines a float ReduceMax/Min over NaN, or over +0 and -0 when the extreme is a zero.

    onnxruntime's loop drops a NaN that is not first and keeps the first of equal values, but
    its vectorised whole-tensor path does neither reliably: there is no rule to match.
    """
    if np.isnan(out).any() or np.isnan(x).any():
        raise UndefinedResultError("ReduceMax/Min over NaN: onnxruntime's result depends on its code path")
    if not np.any(out == 0):
        return
    zero = x == 0
    negative = np.logical_or.reduce(zero & np.signbit(x), axes, keepdims=keepdims)
    positive = np.logical_or.reduce(zero & ~np.signbit(x), axes, keepdims=keepdims)
    if np.any(negative & positive & (out == 0)):
        raise RuntimeChoiceError("ReduceMax/Min over +0 and -0: onnxruntime's zero depends on its code path")


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


def extreme(ufunc: np.ufunc, *, largest: bool) -> Reducer:
    """The reducer of ReduceMax (``np.maximum``, ``largest``) or ReduceMin (``np.minimum``): a
    ``(data, axes, keepdims)`` function; the identity fills the results of empty sets."""

    def reduce(x: Array, axes: Axes, keepdims: int) -> Array:
        if x.size:  # then no reduced set is empty
            out = ufunc.reduce(x, axes, None, None, keepdims)
            if x.dtype.kind == "f":
                _check_extreme(x, axes, keepdims, out)
            return out
        initial = _IDENTITIES[(x.dtype.type, largest)]
        return ufunc.reduce(x, axes, None, None, keepdims, initial)

    return reduce
