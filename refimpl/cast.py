"""Cast and CastLike: conversions between every ONNX tensor type numpy can hold.

Rules (the contract the tests check):
  * Float to float rounds once to nearest even; values beyond the target's range become
    +-inf, except for float8 targets with ``saturate=1``, which clip to the largest finite value.
    float8e8m0 (a bare power of two) rounds by ``round_mode`` as the ONNX definition does.
  * Float to integer truncates toward zero, except to int4/uint4/int2/uint2, which round half
    away from zero as onnxruntime does (the spec leaves it open; 1.5 -> 2). NaN, infinities and
    values whose conversion is out of the target's range are undefined by the spec: the kernel
    raises UndefinedResultError instead of inventing a value (onnxruntime gives 0 for int8 and
    uint8, INT_MIN for int32 and wraps int4 around; numpy wraps around).
  * Integer to integer keeps the low bits (two's complement), int4/int2 included.
  * Anything to bool is ``x != 0``.
  * Strings (``bytes`` or ``str`` items, UTF-8) to numbers read the text as onnxruntime does
    (``std::stod``/``std::stoll``) where the spec defines the result: surrounding ASCII white
    space, a decimal literal (``"1.5"``, ``"-0"``, ``"1e-5"``, ``".5"``) or, case-insensitively,
    ``"INF"``, ``"+INF"``, ``"-INF"``, ``"NaN"``. Floats are the literal rounded to double, then
    to float32 for every narrower target (onnxruntime rounds twice too). Integer targets take
    integer literals within range. Anything else is undefined by the spec (UndefinedResultError),
    and literals beyond the double range are refused (RefImplError) as onnxruntime refuses them.
  * Numbers to strings print as onnxruntime does: integers in decimal, bool as ``"1"``/``"0"``,
    floats with ``%.8g`` and ``"NaN"``, ``"INF"``, ``"-INF"``.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable

import ml_dtypes
import numpy as np

from refimpl._common import Attrs, Inputs, as_array
from refimpl._dtypes import (
    BOOL,
    F32,
    F64,
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


def _float_to_narrow_int(x: np.ndarray, to: np.dtype) -> np.ndarray:
    """float -> int4/uint4/int2/uint2: rounded half away from zero, as onnxruntime does.

    The spec only says that out-of-range values are undefined; onnxruntime rounds (1.5 -> 2,
    2.5 -> 3, -0.5 -> -1) where it truncates for wider integers. A rounded value out of the
    target's range (onnxruntime wraps it: int4 7.5 -> -8), NaN or inf raises
    UndefinedResultError.
    """
    wide = x.astype(F32).astype(F64) if x.dtype.kind == "V" else x.astype(F64)
    with np.errstate(invalid="ignore"):
        rounded = np.copysign(np.floor(np.abs(wide) + 0.5), wide)
    low, high = int_range(to)
    if rounded.size and not (np.all(np.isfinite(rounded)) and rounded.min() >= low and rounded.max() <= high):
        raise UndefinedResultError(
            f"converting values in [{wide.min()}, {wide.max()}] to {to} is undefined (NaN, inf or out of range)"
        )
    return rounded.astype(np.int64).astype(to)


# --- strings ---------------------------------------------------------------------------------

_SPACE = " \t\n\v\f\r"  # C isspace() in the "C" locale
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_INTEGER = re.compile(r"[+-]?[0-9]+")
_SPECIAL = {"inf": math.inf, "+inf": math.inf, "-inf": -math.inf, "nan": math.nan}


def _text(item: object) -> str:
    """One element of a string tensor as ``str``: numpy object arrays hold bytes or str."""
    if isinstance(item, str):
        return item
    if isinstance(item, bytes):
        try:
            return item.decode("utf-8")
        except UnicodeDecodeError:
            raise RefImplError(f"string {item!r} is not UTF-8") from None
    raise RefImplError(f"a string tensor holds a {type(item).__name__}")


def _parse_float(item: object) -> float:
    """A float literal as ``std::stod`` reads it: correctly rounded to double.

    Raises:
        UndefinedResultError: the text is not a literal the spec defines (``"abc"``, ``"0x10"``,
            ``"1.5abc"``, which onnxruntime reads as 1.5).
        RefImplError: the literal lies beyond the range of double, or underflows to a
            subnormal or zero; onnxruntime refuses those (``std::stod`` throws out_of_range).
    """
    text = _text(item).strip(_SPACE)
    special = _SPECIAL.get(text.lower())
    if special is not None:
        return special
    if not _DECIMAL.fullmatch(text):
        raise UndefinedResultError(f"{text!r} is not a numeric literal")
    value = float(text)
    digits = text.partition("e")[0].partition("E")[0]
    if math.isinf(value) or (abs(value) < sys.float_info.min and digits.strip("+-.0")):
        raise RefImplError(f"{text!r} is out of the range of double")
    return value


def _parse_int(item: object, to: np.dtype) -> int:
    """An integer literal that ``to`` can hold (float literals to integers are undefined)."""
    text = _text(item).strip(_SPACE)
    if not _INTEGER.fullmatch(text):
        raise UndefinedResultError(f"{text!r} is not an integer literal")
    value = int(text)
    low, high = int_range(to)
    if not low <= value <= high:
        raise UndefinedResultError(f"{text!r} is out of the range of {to}")
    return value


def _from_string(x: np.ndarray, to: np.dtype, saturate: bool, round_mode: str) -> np.ndarray:
    flat = x.ravel().tolist()
    if to in FLOATS:
        wide = np.array([_parse_float(s) for s in flat], F64).reshape(x.shape)
        if to == F64:
            return wide
        with np.errstate(over="ignore"):  # beyond float32: +-inf, as onnxruntime gives
            single = wide.astype(F32)
        return single if to == F32 else cast(single, to, saturate=saturate, round_mode=round_mode)
    if to.kind in "iu" or to in NARROW_INTS:
        values = [_parse_int(s, to) for s in flat]
        exact = np.array(values, dtype=np.int64 if to in NARROW_INTS else to)
        return exact.astype(to).reshape(x.shape)
    raise UndefinedResultError(f"string to {to} is not defined by the spec")


def _format_float(value: float) -> str:
    if value != value:
        return "NaN"
    if math.isinf(value):
        return "INF" if value > 0 else "-INF"
    return "%.8g" % value


def _to_string(x: np.ndarray) -> np.ndarray:
    """Numbers as onnxruntime prints them (the spec only asks for "plain" notation)."""
    if x.dtype in FLOATS:
        items = [_format_float(v) for v in x.astype(F64).ravel().tolist()]
    elif x.dtype == BOOL:
        items = ["1" if v else "0" for v in x.ravel().tolist()]
    else:  # integers; int4/int2 convert to int64 first, as tolist() cannot read them
        wide = x.astype(np.int64) if x.dtype in NARROW_INTS else x
        items = [str(v) for v in wide.ravel().tolist()]
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out.reshape(x.shape)


# --- the kernels --------------------------------------------------------------------------------


def cast(
    x: np.ndarray, to: np.dtype, *, saturate: bool = True, round_mode: str = "up"
) -> np.ndarray:
    """Converts ``x`` to ``to`` with the ONNX Cast rules (see the module docstring).

    Raises:
        UndefinedResultError: the conversion is undefined for some element (e.g. NaN to int32).
        RefImplError: refimpl refuses the conversion (a string beyond the double range).
    """
    src = x.dtype
    if to == src:
        return x.copy()
    if src in FLOATS and to in NARROW_INTS:
        return _float_to_narrow_int(x, to)
    if src in FLOATS and to.kind in "iu":  # the common case first
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
