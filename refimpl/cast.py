"""Cast and CastLike: conversions between every ONNX tensor type numpy can hold.

Rules (the contract the tests check):
  * Float to float rounds once to nearest even; values beyond the target's range become
    +-inf, except for float8 targets with ``saturate=1``, which clip to the largest finite value.
    float8e8m0 (a bare power of two) rounds by ``round_mode`` as the ONNX definition does.
  * Float to integer truncates toward zero. NaN, infinities and values whose truncation is out
    of the target's range are undefined by the spec: the kernel raises UndefinedResultError
    instead of inventing a value (onnxruntime gives INT_MIN or wraps around, numpy wraps around).
  * Integer to integer keeps the low bits (two's complement), int4/int2 included.
  * Anything to bool is ``x != 0``.
  * Strings parse decimal literals (integers must be in range); other text is undefined.
  * Numbers to strings: integers print in decimal; floats have no specified formatting
    (onnxruntime prints %.8g, the onnx reference the shortest repr), so they are refused.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import ml_dtypes
import numpy as np

from refimpl._common import Attrs, Inputs, as_array
from refimpl._dtypes import (
    BOOL,
    F32,
    FLOATS,
    NARROW_INTS,
    STRING,
    DTypes,
    checked,
    disallowed,
    dtype_of_code,
    exact_type,
    float_to_int,
    int_range,
    to_float,
)
from refimpl._errors import RefImplError, UndefinedResultError
from refimpl._registry import Kernel, Typed, register

__all__ = ["cast"]

_FLOAT8 = frozenset(
    np.dtype(t)
    for t in (
        ml_dtypes.float8_e4m3fn,
        ml_dtypes.float8_e4m3fnuz,
        ml_dtypes.float8_e5m2,
        ml_dtypes.float8_e5m2fnuz,
    )
)
_E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)


def _to_e8m0(x: np.ndarray, saturate: bool, round_mode: str) -> np.ndarray:
    """float -> float8e8m0 (a power of two 2**(e-127), e in 0..254, 255 = NaN).

    Works on the float32 encoding like the ONNX definition: ``up`` rounds any fraction up,
    ``down`` drops it, ``nearest`` rounds mantissas of 1.5 and more up. Saturation keeps the
    largest exponent instead of producing NaN; infinity saturates to the largest value.
    """
    if round_mode not in ("up", "down", "nearest"):
        raise RefImplError(f"round_mode must be up, down or nearest, got {round_mode!r}")
    bits = to_float(x, F32).view(np.uint32)
    exponent = ((bits >> 23) & 0xFF).astype(np.int64)
    mantissa = bits & 0x7FFFFF
    special = exponent == 0xFF
    if round_mode == "up":
        round_up = mantissa > 0
    elif round_mode == "nearest":
        guard = (mantissa & 0x400000) > 0
        round_up = guard & (((mantissa & 0x3FFFFF) > 0) | (exponent > 0))
    else:
        round_up = np.zeros(bits.shape, bool)
    rounded = exponent + round_up
    if saturate:
        rounded = np.minimum(rounded, 0xFE)
        result = np.where(special, np.where(mantissa > 0, 0xFF, 0xFE), rounded)
    else:
        result = np.where(special, 0xFF, rounded)
    return result.astype(np.uint8).view(_E8M0)


_INT_LITERAL = re.compile(r"\s*[+-]?\d+\s*")


def _from_string(x: np.ndarray, to: np.dtype, saturate: bool, round_mode: str) -> np.ndarray:
    flat = [str(s) for s in x.ravel()]
    if to in FLOATS:
        try:
            if any("_" in s for s in flat):
                raise ValueError("an underscore")
            values = [float(s) for s in flat]
        except ValueError:
            raise UndefinedResultError("string is not a floating-point literal") from None
        return to_float(np.array(values, np.float64), to).reshape(x.shape)
    if to.kind in "iu" or to in NARROW_INTS:
        if not all(_INT_LITERAL.fullmatch(s) for s in flat):
            raise UndefinedResultError("a non-integer string to an integer type is undefined")
        values = [int(s) for s in flat]
        low, high = int_range(to)
        if any(not low <= v <= high for v in values):
            raise UndefinedResultError(f"integer string out of range for {to}")
        wide = np.array(values, dtype=np.int64 if to in NARROW_INTS else to)
        return wide.astype(to).reshape(x.shape)
    raise UndefinedResultError(f"string to {to} is not defined by the spec")


def _to_string(x: np.ndarray) -> np.ndarray:
    if x.dtype.kind in "iu" or x.dtype in NARROW_INTS:
        return np.array([str(int(v)) for v in x.ravel()], dtype=object).reshape(x.shape)
    # The spec only asks for "plain floating-point representation": onnxruntime prints %.8g,
    # the onnx reference prints the shortest repr. Neither can be called right, so no folding.
    raise RefImplError(f"{x.dtype} to string has no specified formatting")


# --- the kernels --------------------------------------------------------------------------------


def cast(
    x: np.ndarray, to: np.dtype, *, saturate: bool = True, round_mode: str = "up"
) -> np.ndarray:
    """Converts ``x`` to ``to`` with the ONNX Cast rules (see the module docstring).

    Raises:
        UndefinedResultError: the conversion is undefined for some element (e.g. NaN to int32).
        RefImplError: refimpl refuses the conversion (e.g. float to string).
    """
    src = x.dtype
    if to == src:
        return x.copy()
    if src in FLOATS and (to.kind in "iu" or to in NARROW_INTS):  # the common case first
        return float_to_int(x, to)
    if to == STRING:
        return _to_string(x)
    if src == STRING:
        return _from_string(x, to, saturate, round_mode)
    if to == BOOL:
        return np.asarray(x.astype(exact_type(src)) != 0)
    if to == _E8M0:
        return _to_e8m0(x, saturate, round_mode)
    if to in _FLOAT8 and saturate:
        limit = float(ml_dtypes.finfo(to).max)
        return to_float(np.clip(x.astype(np.float64), -limit, limit), to)
    if to in FLOATS:
        with np.errstate(over="ignore"):  # out-of-range values become +-inf, as Cast specifies
            return to_float(x, to)
    if to in NARROW_INTS or src in NARROW_INTS:
        # fixed point -> fixed point keeps the low bits (two's complement reinterpretation).
        return x.astype(np.int64).astype(to)
    return x.astype(to)


def _target_of_attribute(inputs: Inputs, attrs: Attrs) -> np.dtype:
    return dtype_of_code(attrs["to"])  # run() checks that the required 'to' is there


def _target_of_input(inputs: Inputs, attrs: Attrs) -> np.dtype:
    return as_array(inputs[1]).dtype


def _cast_kernel(target: Callable[[Inputs, Attrs], np.dtype]) -> Typed:
    """Cast (``target`` reads the ``to`` attribute) or CastLike (the second input's dtype)."""

    def make(types: DTypes) -> Kernel:
        allowed_in, allowed_out = types["T1"], types["T2"]

        def kernel(inputs: Inputs, attrs: Attrs) -> tuple[np.ndarray]:
            x = checked(inputs[0], allowed_in)
            to = target(inputs, attrs)
            if to not in allowed_out:
                raise disallowed(to, "target")
            saturate = bool(attrs.get("saturate", 1))
            out = cast(x, to, saturate=saturate, round_mode=attrs.get("round_mode", "up"))
            return (np.asarray(out),)  # 0-d inputs may come back as numpy scalars

        return kernel

    return Typed(make)


# Cast-1 took the target type as a string: it is not implemented.
register("Cast", 6)(_cast_kernel(_target_of_attribute))
register("CastLike", 15)(_cast_kernel(_target_of_input))
