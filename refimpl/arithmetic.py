"""Multi-input elementwise kernels: arithmetic, bitwise, comparison and logic, Sum/Mean/Max/Min,
Pow, Clip and Where.

Same-typed binary operators are one ``_binary`` factory call each, the variadic ones one
``_variadic`` call; Pow, Clip and Where have their own input rules. Inputs broadcast
multidirectionally (PRelu's slope unidirectionally).

Numerics (the contract the tests check):
  * Outputs have exactly the schema's dtype; numpy scalar promotion never leaks (int8 Add wraps
    around, float16 stays float16).
  * +, -, *, /, comparisons, Mod, Max, Min, Sum and Mean run in the input type (float32 for
    bfloat16 and float8; see ``refimpl._dtypes``); Mean multiplies the sum by 1/n as
    onnxruntime does. Pow evaluates floats in float64 and rounds once.
  * Integer division (Div, Mod) by zero is undefined in ONNX: the kernels raise
    UndefinedResultError.
  * Where the spec leaves a choice, onnxruntime decides or the kernel declines
    (UndefinedResultError, the node is not folded): Max/Min of +0 and -0 keep the second input
    when both are one element and decline otherwise (onnxruntime's vector loop and its scalar
    tail break the tie differently); Clip keeps x on a tie with a bound (-0 stays) and, without
    a bound, clips to the type's finite range as onnxruntime does (inf -> float max); Where
    declines a selected -0 (onnxruntime turns it into +0 on some paths); integer
    Pow declines a result beyond 2**53 (onnxruntime computes in double: inexact, then INT_MIN).
  * Div, Pow and Mod silence numpy's floating-point warnings (inf and NaN results are
    intended). Add, Sub, Mul and the comparisons do not: silencing costs about a microsecond
    per call, so a genuine overflow to inf there still warns.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

from refimpl._common import Attrs, Inputs, as_array, broadcast_failure, same_dtype
from refimpl._dtypes import (
    DTypes,
    accumulator_type,
    as_bool,
    as_dtype,
    checked,
    disallowed,
    exact_type,
    float_to_int,
    quiet,
    work_types,
)
from refimpl._errors import RefImplError, RuntimeChoiceError, UndefinedResultError
from refimpl._registry import Kernel, Typed, register

Array = np.ndarray
BinaryFn = Callable[[Array, Array, Attrs], Array]


def _mixed(first: np.dtype, other: np.dtype) -> RefImplError:
    return RefImplError(f"inputs must share one dtype, got {other} and {first}")


def _binary(fn: BinaryFn, *, silent: bool = False, to_bool: bool = False) -> Typed:
    """A two-input op whose inputs share the type ``T``; the output has it too (or is bool).

    Args:
        fn: ``fn(a, b, attributes)``, run in the input type (float32 for ml_dtypes floats).
        silent: silence numpy's floating-point warnings (division by zero is intended there);
            Add/Sub/Mul skip it to keep the per-call cost low.
        to_bool: the output is bool (comparisons and logic).
    """
    compute = quiet(fn) if silent else fn
    finish = as_bool if to_bool else as_dtype

    def make(types: DTypes) -> Kernel:
        work_of = work_types(types["T"])

        def kernel(inputs: Inputs, attrs: Attrs) -> tuple[Array]:
            a, b = as_array(inputs[0]), as_array(inputs[1])
            dtype = a.dtype
            if b.dtype != dtype:
                raise _mixed(dtype, b.dtype)
            work = work_of.get(dtype)
            if work is None:
                raise disallowed(dtype)
            if work != dtype:
                a, b = a.astype(work), b.astype(work)
            try:
                return (finish(compute(a, b, attrs), dtype),)
            except ValueError as e:
                raise broadcast_failure((a, b)) or e

        return kernel

    return Typed(make)


def _ufunc(ufunc: np.ufunc) -> BinaryFn:
    return lambda a, b, attrs: ufunc(a, b)


def _check_divisor(b: Array) -> None:
    if b.dtype.kind in "iu" and not np.all(b):
        raise UndefinedResultError("integer division by zero is undefined")


def _div(a: Array, b: Array, attrs: Attrs) -> Array:
    if a.dtype.kind not in "iu":
        return np.true_divide(a, b)
    _check_divisor(b)
    q = np.floor_divide(a, b)
    if a.dtype.kind == "i":
        # Integer Div truncates toward zero (C semantics); floor_divide rounds down.
        q = q + ((q * b != a) & ((a < 0) != (b < 0))).astype(q.dtype)
    return q


def _mod(float_floor_mod: bool) -> BinaryFn:
    """Mod: ``fmod=1`` truncates the quotient (C fmod), ``fmod=0`` floors it (Python ``%``).

    Before Mod-28 the schema restricts ``fmod=0`` to integers; onnxruntime rejects float
    inputs there too, so the kernel does. Integer ``fmod=1`` is accepted at every version
    (Mod-28 defines it; onnxruntime already implements it for older versions).
    """

    def mod(a: Array, b: Array, attrs: Attrs) -> Array:
        fmod = int(attrs.get("fmod", 0))
        if fmod not in (0, 1):
            raise RefImplError(f"fmod must be 0 or 1, got {fmod}")
        if a.dtype.kind == "f" and not fmod and not float_floor_mod:
            raise RefImplError("fmod=0 is defined for integer types only before Mod-28")
        _check_divisor(b)
        return np.fmod(a, b) if fmod else np.mod(a, b)

    return mod


def _bitshift(x: Array, y: Array, attrs: Attrs) -> Array:
    """BitShift: a shift by the bit width or more (or a negative one) leaves only the sign fill."""
    direction = attrs.get("direction")
    if direction not in ("LEFT", "RIGHT"):
        raise RefImplError(f"direction must be LEFT or RIGHT, got {direction!r}")
    dtype = x.dtype
    out_of_range = (y < 0) | (y >= dtype.itemsize * 8)
    safe = np.where(out_of_range, 0, y).astype(dtype)
    if direction == "LEFT":
        shifted = np.left_shift(x, safe)
        fill = np.zeros((), dtype)
    else:
        shifted = np.right_shift(x, safe)
        fill = np.where(x < 0, -1, 0).astype(dtype) if dtype.kind == "i" else np.zeros((), dtype)
    return np.where(out_of_range, fill, shifted)


def _prelu(x: Array, slope: Array, attrs: Attrs) -> Array:
    """PRelu: ``slope`` broadcasts unidirectionally to ``X``."""
    if np.broadcast_shapes(x.shape, slope.shape) != x.shape:
        raise RefImplError(f"slope shape {slope.shape} does not broadcast to {x.shape}")
    return np.where(x < 0, x * slope, x)


# Versions before 7 took a broadcast attribute: they are not implemented.
for _op, _ufn in (("Add", np.add), ("Sub", np.subtract), ("Mul", np.multiply)):
    register(_op, 7)(_binary(_ufunc(_ufn)))
register("Div", 7)(_binary(_div, silent=True))
register("Mod", 10, 13)(_binary(_mod(float_floor_mod=False), silent=True))
register("Mod", 28)(_binary(_mod(float_floor_mod=True), silent=True))
register("BitShift", 11)(_binary(_bitshift))
register("PRelu", 7)(_binary(_prelu))
for _op, _ufn in (
    ("BitwiseAnd", np.bitwise_and),
    ("BitwiseOr", np.bitwise_or),
    ("BitwiseXor", np.bitwise_xor),
):
    register(_op, 18)(_binary(_ufunc(_ufn)))
for _op, _since, _ufn in (
    ("Equal", 7, np.equal),
    ("Less", 7, np.less),
    ("Greater", 7, np.greater),
    ("LessOrEqual", 12, np.less_equal),
    ("GreaterOrEqual", 12, np.greater_equal),
    ("And", 7, np.logical_and),
    ("Or", 7, np.logical_or),
    ("Xor", 7, np.logical_xor),
):
    register(_op, _since)(_binary(_ufunc(_ufn), to_bool=True))


# --- Pow -----------------------------------------------------------------------------------


_EXACT_IN_DOUBLE = 2.0**53


def _int_power(base: Array, exponent: Array) -> Array:
    """Integer ``base ** exponent`` with wraparound; negative exponents truncate toward zero."""
    if exponent.dtype == np.uint64 and np.any(exponent > np.iinfo(np.int64).max):
        raise RefImplError("integer exponents above 2**63 - 1 are not implemented")
    e = exponent.astype(np.int64)
    b = base.astype(np.uint64 if base.dtype.kind == "u" else np.int64)
    negative = e < 0
    if np.any(negative & (b == 0)):
        raise UndefinedResultError("0 raised to a negative power is undefined")
    positive = np.where(negative, 0, e)
    with np.errstate(all="ignore"):
        magnitude = np.power(np.abs(b.astype(np.float64)), positive.astype(np.float64))
    limit = min(_EXACT_IN_DOUBLE, float(np.iinfo(base.dtype).max))
    if magnitude.size and float(np.max(magnitude)) > limit:
        # onnxruntime computes in double: inexact beyond 2**53, INT_MIN beyond the type.
        raise UndefinedResultError("an integer power beyond 2**53 (onnxruntime computes it in double)")
    result = np.power(b, positive.astype(b.dtype))
    if np.any(negative):
        # 1/b**n truncates to 0 unless |b| == 1.
        odd = (e % 2) == 1
        tiny = np.where(b == 1, 1, np.where(b == -1, np.where(odd, -1, 1), 0))
        result = np.where(negative, tiny.astype(result.dtype), result)
    return result.astype(base.dtype)


def _c_power(x: Array, y: Array) -> Array:
    """float64 ``pow`` with C99's special cases (onnxruntime calls ``std::pow``).

    numpy computes ``x ** 0.5`` as ``sqrt(x)``, so (-0) ** 0.5 is -0 and (-inf) ** 0.5 NaN
    there; C gives +0 and +inf.
    """
    x, y = x.astype(np.float64), y.astype(np.float64)
    result = np.power(x, y)
    half = (y == 0.5) & ((x == 0) | (x == -np.inf))
    if np.any(half):
        result = np.where(half, np.abs(x), result)
    return result


@quiet
def _pow(x: Array, y: Array) -> Array:
    if x.dtype.kind in "iu":
        if y.dtype.kind in "iu":
            return _int_power(x, y)
        return float_to_int(_c_power(x, y), x.dtype)
    return as_dtype(_c_power(x, y), x.dtype)


def _pow_kernel(types: DTypes) -> Kernel:
    """Pow: the base type T decides the output type; the exponent may have another type T1."""
    allowed_x = types["T"]
    allowed_y = types.get("T1", allowed_x)

    def kernel(inputs: Inputs, attrs: Attrs) -> tuple[Array]:
        x, y = checked(inputs[0], allowed_x, "base"), checked(inputs[1], allowed_y, "exponent")
        if "T1" not in types and x.dtype != y.dtype:
            raise _mixed(x.dtype, y.dtype)
        try:
            return (as_dtype(_pow(x, y), x.dtype),)
        except ValueError as e:
            raise broadcast_failure((x, y)) or e

    return kernel


register("Pow", 7)(Typed(_pow_kernel))


# --- variadic ------------------------------------------------------------------------------


def _zero_tie(op: str, left: Array, right: Array, result: Array) -> Array:
    """Max/Min where +0 meets -0: the second input if both are one element, else declines.

    onnxruntime keeps the second of two one-element inputs; otherwise which zero it keeps
    depends on the position in its vector loop.
    """
    tie = (left == 0) & (right == 0) & (np.signbit(left) != np.signbit(right))
    if not np.any(tie):
        return result
    if left.size == 1 and right.size == 1:
        return right.reshape(result.shape).copy()
    raise RuntimeChoiceError(f"{op} of +0 and -0: onnxruntime's choice depends on the position")


def _variadic(
    op: str,
    fn: np.ufunc,
    *,
    mean: bool = False,
    wide: bool = False,
    extreme: bool = False,
    sum_like: bool = False,
) -> Typed:
    """Sum/Mean/Max/Min over one or more inputs with multidirectional broadcasting.

    Args:
        op: the operator's name, for error messages.
        fn: the pairwise combination.
        mean: divide by the number of inputs at the end.
        wide: accumulate floats in float64 and round once at the end.
        extreme: Max/Min (see ``_zero_tie``).
        sum_like: add in the accumulator type (float32 for float16 and bfloat16), as
            onnxruntime's Sum and Mean do.
    """

    def make(types: DTypes) -> Kernel:
        work_of = (
            {dt: accumulator_type(dt) for dt in types["T"]} if sum_like else work_types(types["T"], wide=wide)
        )

        def kernel(inputs: Inputs, attrs: Attrs) -> tuple[Array]:
            arrays = [as_array(v) for v in inputs]
            dtype = same_dtype(op, arrays)
            work = work_of.get(dtype)
            if work is None:
                raise disallowed(dtype)
            result = arrays[0].astype(work)  # a copy: outputs never alias inputs
            with np.errstate(all="ignore"):
                try:
                    for other in arrays[1:]:
                        right = other.astype(work, copy=False)
                        combined = fn(result, right)
                        if extreme and work.kind == "f":
                            combined = _zero_tie(op, result, right, combined)
                        result = combined
                except ValueError as e:
                    raise broadcast_failure(arrays) or e
                if mean:  # onnxruntime multiplies by 1/n in the input type
                    result = result * (np.asarray(1, work) / np.asarray(len(arrays), work))
            return (as_dtype(result, dtype),)

        return kernel

    return Typed(make)


# Versions 6 took equally shaped inputs only, which broadcasting handles alike.
# Sum and Mean add in the input type, pairwise in input order, as onnxruntime does: a float64
# sum would differ from it in rounding and where a partial sum overflows (3e38 + 3e38 - 3e38).
register("Sum", 6)(_variadic("Sum", np.add, sum_like=True))
register("Mean", 6)(_variadic("Mean", np.add, mean=True, sum_like=True))
register("Max", 6)(_variadic("Max", np.maximum, extreme=True))
register("Min", 6)(_variadic("Min", np.minimum, extreme=True))


# --- Clip and Where ------------------------------------------------------------------------


def _bound(value: Any, dtype: np.dtype, name: str) -> Array | None:
    if value is None:
        return None
    bound = as_array(value)
    if bound.dtype != dtype:
        raise RefImplError(f"{name} dtype {bound.dtype} differs from input dtype {dtype}")
    if bound.size != 1:
        raise RefImplError(f"{name} must be a scalar, got shape {bound.shape}")
    return bound.reshape(())


Bounds = Callable[[Inputs, Attrs, np.dtype], tuple[Any, Any]]


def _bounds_of_attributes(inputs: Inputs, attrs: Attrs, dtype: np.dtype) -> tuple[Any, Any]:
    """Clip-6: ``min``/``max`` attributes (float32 values), defaulting to the float32 range."""
    lo = np.asarray(attrs.get("min", -3.4028234663852886e38), dtype=np.float32)
    hi = np.asarray(attrs.get("max", 3.4028234663852886e38), dtype=np.float32)
    return as_dtype(lo, dtype), as_dtype(hi, dtype)


def _bounds_of_inputs(inputs: Inputs, attrs: Attrs, dtype: np.dtype) -> tuple[Any, Any]:
    """Clip-11+: optional scalar ``min``/``max`` inputs.

    The spec calls an omitted bound unbounded; onnxruntime uses the type's lowest and largest
    finite values, so a float +-inf becomes -+max. The kernel does the same.
    """
    lo = _bound(inputs[1] if len(inputs) > 1 else None, dtype, "min")
    hi = _bound(inputs[2] if len(inputs) > 2 else None, dtype, "max")
    if dtype.kind in "fV":
        info = ml_dtypes.finfo(dtype)
        lo = as_dtype(np.asarray(info.min), dtype) if lo is None else lo
        hi = as_dtype(np.asarray(info.max), dtype) if hi is None else hi
    return lo, hi


def _clip(bounds: Bounds) -> Typed:
    """Clip, ``t = x < min ? min : x; t > max ? max : t`` (bounds read by ``bounds``, None: none).

    When min > max every element becomes max; a NaN x stays NaN, a NaN bound is ignored, and
    x is kept on a tie (Clip(-0, min=0) is -0), as in onnxruntime.
    """

    def make(types: DTypes) -> Kernel:
        allowed = types["T"]

        def kernel(inputs: Inputs, attrs: Attrs) -> tuple[Array]:
            x = checked(inputs[0], allowed)
            lo, hi = bounds(inputs, attrs, x.dtype)
            work = exact_type(x.dtype)
            result = x.astype(work)  # a copy: outputs never alias inputs
            if lo is not None:
                low = np.asarray(lo).astype(work)
                result = np.where(result < low, low, result)
            if hi is not None:
                high = np.asarray(hi).astype(work)
                result = np.where(high < result, high, result)
            return (as_dtype(result, x.dtype),)

        return kernel

    return Typed(make)


register("Clip", 6, 6)(_clip(_bounds_of_attributes))
register("Clip", 11)(_clip(_bounds_of_inputs))


def _where_kernel(types: DTypes) -> Kernel:
    allowed, conditions = types["T"], types["B"]

    def kernel(inputs: Inputs, attrs: Attrs) -> tuple[Array]:
        cond = checked(inputs[0], conditions, "condition")
        x, y = as_array(inputs[1]), as_array(inputs[2])
        dtype = x.dtype
        if y.dtype != dtype:
            raise _mixed(dtype, y.dtype)
        if dtype not in allowed:
            raise disallowed(dtype)
        try:
            result = as_dtype(np.where(cond, x, y), dtype)
        except ValueError as e:
            raise broadcast_failure((cond, x, y)) or e
        if dtype.kind in "fV" and np.any(np.signbit(result) & (result == 0)):
            # onnxruntime's Where gives +0 for a selected -0 on some paths (Where([True], [-0], [1])
            # is +0, Where(True, [-0], [1]) is -0): the sign is its choice, so refimpl declines.
            raise RuntimeChoiceError("Where selecting -0: onnxruntime's sign depends on its path")
        return (result,)

    return kernel


register("Where", 9)(Typed(_where_kernel))
