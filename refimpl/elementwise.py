"""Elementwise kernels: unary math, activations, arithmetic, comparison, logic, Clip, Where, Cast.

Every operator is built by one of a few factories (``_unary``, ``_binary``, ``_compare``,
``_variadic``...) and registered for the exact ONNX schema versions it implements with
``register_versions``, which also hands each kernel the dtypes that schema version allows: a
kernel rejects any other dtype instead of letting numpy promote it.

Numerics (the contract the tests check):
  * Outputs have exactly the schema's dtype; numpy scalar promotion never leaks (int8 Add wraps
    around, float16 stays float16).
  * Operations that IEEE 754 rounds exactly once (+, -, *, /, sqrt, comparisons, floor, ceil,
    round, abs, neg) run in the input type. bfloat16 and float8 arrays run in float32, which is
    exact for these (double rounding is innocuous when the wider format has at least 2p+2 bits).
  * Transcendental functions (exp, log, tanh, erf, pow, ...) on float16, bfloat16 and float32 are
    evaluated in float64 and rounded once to the input type.
  * Integer division by zero and float-to-integer casts of NaN, infinities or out-of-range values
    are undefined in ONNX: the kernels raise instead of inventing a value.
  * Transcendental functions, Div, Pow, Mod and Cast silence numpy's floating-point warnings
    (inf and NaN results are intended). Add, Sub, Mul and the comparisons do not: silencing
    costs about a microsecond per call, so a genuine overflow to inf there still warns.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import onnx.defs

from refimpl._registry import Kernel, UnsupportedOpError, register

__all__ = ["as_dtype", "cast", "register_versions", "schema_dtypes"]

Array = np.ndarray
Attrs = Mapping[str, Any]
DTypes = Mapping[str, frozenset]

_F16 = np.dtype(np.float16)
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_BOOL = np.dtype(np.bool_)
_STRING = np.dtype(object)


def _onnx_type_table() -> dict[str, np.dtype]:
    """Maps schema type strings such as ``tensor(float)`` to numpy dtypes."""
    table: dict[str, np.dtype] = {}
    for name, code in onnx.TensorProto.DataType.items():
        if code == onnx.TensorProto.UNDEFINED:
            continue
        try:
            dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(code))
        except (KeyError, TypeError, ValueError):
            continue
        table[f"tensor({name.lower()})"] = dtype
    return table


_TYPE_TABLE = _onnx_type_table()
# Every float dtype refimpl may meet: numpy's and ml_dtypes' (kind "V").
_FLOATS = frozenset(
    dt for name, dt in _TYPE_TABLE.items() if "float" in name or "double" in name
)
_NARROW_INTS = frozenset(
    np.dtype(t) for t in (ml_dtypes.int4, ml_dtypes.uint4, ml_dtypes.int2, ml_dtypes.uint2)
)


def schema_dtypes(op_type: str, version: int) -> dict[str, frozenset]:
    """The dtypes each type parameter (``T``, ``T1``...) of ``op_type``-``version`` allows.

    Strings map to numpy ``object``; types numpy cannot hold (sequences, optionals) are dropped.
    """
    schema = onnx.defs.get_schema(op_type, version)
    if schema.since_version != version:
        raise ValueError(f"{op_type} has no schema version {version}")
    return {
        c.type_param_str: frozenset(
            _TYPE_TABLE[t] for t in c.allowed_type_strs if t in _TYPE_TABLE
        )
        for c in schema.type_constraints
    }


def register_versions(
    op_type: str, versions: Sequence[int], make: Callable[[DTypes], Kernel]
) -> None:
    """Registers ``make(dtypes)`` for each listed schema version of ``op_type``.

    Each version gets its own kernel so that it accepts exactly that version's dtypes.
    """
    for version in versions:
        register(op_type, version)(make(schema_dtypes(op_type, version)))


# --- small helpers -------------------------------------------------------------------------


def _arr(value: Any) -> Array:
    """An input as an ndarray; numpy ``str_`` arrays become ``object`` arrays (ONNX strings)."""
    x = np.asarray(value)
    if x.dtype.kind == "U":
        x = x.astype(object)
    return x


def _check(x: Array, allowed: frozenset, what: str = "input") -> None:
    if x.dtype not in allowed:
        raise TypeError(f"{what} dtype {x.dtype} is not allowed by the schema")


def _same_dtype(arrays: Sequence[Array], allowed: frozenset) -> np.dtype:
    dtype = arrays[0].dtype
    for a in arrays:
        if a.dtype != dtype:
            raise TypeError(f"inputs must share one dtype, got {a.dtype} and {dtype}")
    if dtype not in allowed:
        raise TypeError(f"input dtype {dtype} is not allowed by the schema")
    return dtype


def _exact_type(dtype: np.dtype) -> np.dtype:
    """The dtype an exactly-rounded operation runs in: float32 for ml_dtypes floats."""
    return _F32 if dtype.kind == "V" else dtype


def _wide_type(dtype: np.dtype) -> np.dtype:
    """The dtype a transcendental function runs in: float64 for every float type."""
    return _F64 if dtype in _FLOATS else dtype


def as_dtype(result: Any, dtype: np.dtype) -> Array:
    """``result`` as an ndarray of ``dtype`` (never a numpy scalar)."""
    out = np.asarray(result)
    if out.dtype != dtype:
        out = _to_float(out, dtype) if dtype in _FLOATS else out.astype(dtype)
    return out


def _round_to_odd_f32(x: Array) -> Array:
    """float64 -> float32 rounding to odd, so a second rounding to a narrower float is exact."""
    near = x.astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        overshoot = np.abs(near.astype(np.float64)) > np.abs(x)
        toward_zero = np.where(overshoot, np.nextafter(near, np.float32(0)), near)
        inexact = toward_zero.astype(np.float64) != x
    bits = toward_zero.view(np.uint32) | (inexact & np.isfinite(x)).astype(np.uint32)
    return bits.view(np.float32)


def _to_float(x: Array, dtype: np.dtype) -> Array:
    """Rounds ``x`` to the float ``dtype`` once (round to nearest even), as ONNX Cast does.

    ml_dtypes converts float64 to bfloat16/float8 through float32 with two roundings; going
    through float32 rounded to odd keeps the result correctly rounded.
    """
    if dtype.kind == "V" and x.dtype not in (_F32, _F16) and x.dtype.kind != "V":
        x = _round_to_odd_f32(x.astype(np.float64))
    return x.astype(dtype)


def _quiet(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Runs ``fn`` with numpy floating-point warnings off (inf/NaN results are intended)."""

    @functools.wraps(fn)
    def wrapper(*args: Any) -> Any:
        with np.errstate(all="ignore"):
            return fn(*args)

    return wrapper


# --- unary ---------------------------------------------------------------------------------

UnaryFn = Callable[[Array, Attrs], Array]


def _unary(fn: UnaryFn, *, exact: bool = False) -> Callable[[DTypes], Kernel]:
    """A one-input, same-dtype op.

    Args:
        fn: ``fn(x, attributes)``; float inputs arrive in float64 unless ``exact``.
        exact: ``fn`` rounds once, so it runs in the input type (float32 for ml_dtypes floats)
            and needs no floating-point warning suppression (which costs a microsecond).
    """

    def compute(x: Array, attrs: Attrs) -> Array:
        if exact:
            return as_dtype(fn(x.astype(_exact_type(x.dtype), copy=False), attrs), x.dtype)
        with np.errstate(all="ignore"):  # overflow to inf and NaN results are intended
            return as_dtype(fn(x.astype(_wide_type(x.dtype), copy=False), attrs), x.dtype)

    def make(types: DTypes) -> Kernel:
        allowed = types["T"]

        def kernel(inputs: Sequence[Any], attrs: Attrs) -> tuple[Array]:
            x = _arr(inputs[0])
            _check(x, allowed)
            return (compute(x, attrs),)

        return kernel

    return make


def _erf(x: Array, attrs: Attrs) -> Array:
    if x.dtype.kind in "iu":
        # |erf(n)| < 1 for every finite n, so the integer result (truncated) is always 0.
        return np.zeros_like(x)
    return np.asarray(np.frompyfunc(math.erf, 1, 1)(x), dtype=np.float64)


def _f32(attrs: Attrs, name: str) -> float:
    """A FLOAT attribute's value: ONNX stores float attributes as float32."""
    return float(np.float32(attrs[name]))


def _sigmoid(x: Array, attrs: Attrs) -> Array:
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def _gelu(x: Array, attrs: Attrs) -> Array:
    if attrs.get("approximate", "none") == "tanh":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0), attrs))


def _sign(x: Array, attrs: Attrs) -> Array:
    return np.sign(x).astype(x.dtype, copy=False)


def _relu(x: Array, attrs: Attrs) -> Array:
    return np.maximum(x, np.zeros((), x.dtype))


_UNARY: dict[str, tuple[tuple[int, ...], UnaryFn, bool]] = {
    # op: (schema versions, fn, exact)
    "Abs": ((6, 13), lambda x, a: np.abs(x), True),
    "Neg": ((6, 13), lambda x, a: np.negative(x), True),
    "Floor": ((6, 13), lambda x, a: np.floor(x), True),
    "Ceil": ((6, 13), lambda x, a: np.ceil(x), True),
    # np.round rounds halves to even, as Round requires.
    "Round": ((11, 22), lambda x, a: np.round(x), True),
    "Sign": ((9, 13), _sign, True),
    "Relu": ((6, 13, 14), _relu, True),
    "Sqrt": ((6, 13), lambda x, a: np.sqrt(x), True),
    "Reciprocal": ((6, 13), lambda x, a: np.reciprocal(x), True),
    "Exp": ((6, 13), lambda x, a: np.exp(x), False),
    "Log": ((6, 13), lambda x, a: np.log(x), False),
    "Tanh": ((6, 13), lambda x, a: np.tanh(x), False),
    "Sigmoid": ((6, 13), _sigmoid, False),
    "Erf": ((9, 13), _erf, False),
    "Sin": ((7, 22), lambda x, a: np.sin(x), False),
    "Cos": ((7, 22), lambda x, a: np.cos(x), False),
    "Tan": ((7, 22), lambda x, a: np.tan(x), False),
    "Asin": ((7, 22), lambda x, a: np.arcsin(x), False),
    "Acos": ((7, 22), lambda x, a: np.arccos(x), False),
    "Atan": ((7, 22), lambda x, a: np.arctan(x), False),
    "Sinh": ((9, 22), lambda x, a: np.sinh(x), False),
    "Cosh": ((9, 22), lambda x, a: np.cosh(x), False),
    "Asinh": ((9, 22), lambda x, a: np.arcsinh(x), False),
    "Acosh": ((9, 22), lambda x, a: np.arccosh(x), False),
    "Atanh": ((9, 22), lambda x, a: np.arctanh(x), False),
    "Softplus": ((1, 22), lambda x, a: np.logaddexp(0.0, x), False),
    "Softsign": ((1, 22), lambda x, a: x / (1.0 + np.abs(x)), False),
    "LeakyRelu": ((6, 16), lambda x, a: np.where(x >= 0, x, _f32(a, "alpha") * x), False),
    "HardSigmoid": (
        (6, 22),
        lambda x, a: np.clip(_f32(a, "alpha") * x + _f32(a, "beta"), 0.0, 1.0),
        False,
    ),
    "HardSwish": ((14, 22), lambda x, a: x * np.clip(x / 6.0 + 0.5, 0.0, 1.0), False),
    "Elu": ((6, 22), lambda x, a: np.where(x >= 0, x, _f32(a, "alpha") * np.expm1(x)), False),
    "Selu": (
        (6, 22),
        lambda x, a: _f32(a, "gamma") * np.where(x > 0, x, _f32(a, "alpha") * np.expm1(x)),
        False,
    ),
    "Celu": (
        (12, 28),
        lambda x, a: np.maximum(x, 0.0)
        + np.minimum(0.0, _f32(a, "alpha") * np.expm1(x / _f32(a, "alpha"))),
        False,
    ),
    "ThresholdedRelu": ((10, 22), lambda x, a: np.where(x > _f32(a, "alpha"), x, 0.0), False),
    "Mish": ((18, 22), lambda x, a: x * np.tanh(np.logaddexp(0.0, x)), False),
    "Gelu": ((20,), _gelu, False),
}

for _op, (_versions, _fn, _exact) in _UNARY.items():
    register_versions(_op, _versions, _unary(_fn, exact=_exact))


def _predicate(fn: UnaryFn) -> Callable[[DTypes], Kernel]:
    """A float -> bool test (IsNaN, IsInf), evaluated in float32/float64."""

    def make(types: DTypes) -> Kernel:
        allowed = types["T1"]

        def kernel(inputs: Sequence[Any], attrs: Attrs) -> tuple[Array]:
            x = _arr(inputs[0])
            _check(x, allowed)
            return (np.asarray(fn(x.astype(_exact_type(x.dtype), copy=False), attrs)),)

        return kernel

    return make


def _isinf(x: Array, attrs: Attrs) -> Array:
    pos = np.isposinf(x) if attrs.get("detect_positive", 1) else np.zeros(x.shape, bool)
    neg = np.isneginf(x) if attrs.get("detect_negative", 1) else np.zeros(x.shape, bool)
    return pos | neg


register_versions("IsNaN", (9, 13, 20), _predicate(lambda x, a: np.isnan(x)))
register_versions("IsInf", (10, 20), _predicate(_isinf))


# --- binary arithmetic ---------------------------------------------------------------------

BinaryFn = Callable[[Array, Array], Array]


def _binary(fn: BinaryFn, *, wide: bool = False, quiet: bool = False) -> Callable[[DTypes], Kernel]:
    """A two-input op with multidirectional broadcasting; both inputs and the output share T.

    Args:
        fn: ``fn(a, b)``, run in the input type (float32 for ml_dtypes floats), or in float64
            for float inputs when ``wide``.
        wide: evaluate floats in float64 and round once.
        quiet: silence numpy's floating-point warnings (division by zero is intended there);
            Add/Sub/Mul skip it to keep the per-call cost low.
    """
    compute = _quiet(fn) if quiet else fn

    def make(types: DTypes) -> Kernel:
        allowed = types["T"]

        def kernel(inputs: Sequence[Any], attrs: Attrs) -> tuple[Array]:
            a, b = _arr(inputs[0]), _arr(inputs[1])
            dtype = _same_dtype((a, b), allowed)
            work = _wide_type(dtype) if wide else _exact_type(dtype)
            if work != dtype:
                a, b = a.astype(work), b.astype(work)
            return (as_dtype(compute(a, b), dtype),)

        return kernel

    return make


def _check_divisor(b: Array) -> None:
    if b.dtype.kind in "iu" and not np.all(b):
        raise ZeroDivisionError("integer division by zero is undefined")


def _div(a: Array, b: Array) -> Array:
    if a.dtype.kind not in "iu":
        return np.true_divide(a, b)
    _check_divisor(b)
    q = np.floor_divide(a, b)
    if a.dtype.kind == "i":
        # Integer Div truncates toward zero (C semantics); floor_divide rounds down.
        q = q + ((q * b != a) & ((a < 0) != (b < 0))).astype(q.dtype)
    return q


for _op, _fn in (("Add", np.add), ("Sub", np.subtract), ("Mul", np.multiply)):
    register_versions(_op, (7, 13, 14), _binary(_fn))
register_versions("Div", (7, 13, 14), _binary(_div, quiet=True))

_BITWISE = (
    ("BitwiseAnd", np.bitwise_and),
    ("BitwiseOr", np.bitwise_or),
    ("BitwiseXor", np.bitwise_xor),
)
for _op, _fn in _BITWISE:
    register_versions(_op, (18,), _binary(_fn))
register_versions("BitwiseNot", (18,), _unary(lambda x, a: np.invert(x), exact=True))


def _make_mod(float_floor_mod: bool) -> Callable[[DTypes], Kernel]:
    """Mod: ``fmod=1`` truncates the quotient (C fmod), ``fmod=0`` floors it (Python ``%``).

    Before Mod-28 the schema restricts ``fmod=0`` to integers; onnxruntime rejects float
    inputs there too, so the kernel does. Integer ``fmod=1`` is accepted at every version
    (Mod-28 defines it; onnxruntime already implements it for older versions).
    """

    @_quiet
    def compute(a: Array, b: Array, fmod: int) -> Array:
        _check_divisor(b)
        return np.fmod(a, b) if fmod else np.mod(a, b)

    def make(types: DTypes) -> Kernel:
        allowed = types["T"]

        def kernel(inputs: Sequence[Any], attrs: Attrs) -> tuple[Array]:
            a, b = _arr(inputs[0]), _arr(inputs[1])
            dtype = _same_dtype((a, b), allowed)
            fmod = int(attrs.get("fmod", 0))
            if fmod not in (0, 1):
                raise ValueError(f"fmod must be 0 or 1, got {fmod}")
            if dtype in _FLOATS and not fmod and not float_floor_mod:
                raise TypeError("fmod=0 is defined for integer types only before Mod-28")
            work = _exact_type(dtype)
            a, b = a.astype(work, copy=False), b.astype(work, copy=False)
            return (as_dtype(compute(a, b, fmod), dtype),)

        return kernel

    return make


register_versions("Mod", (10, 13), _make_mod(float_floor_mod=False))
register_versions("Mod", (28,), _make_mod(float_floor_mod=True))


def _int_power(base: Array, exponent: Array) -> Array:
    """Integer ``base ** exponent`` with wraparound; negative exponents truncate toward zero."""
    if exponent.dtype == np.uint64 and np.any(exponent > np.iinfo(np.int64).max):
        raise ValueError("integer exponent out of range")
    e = exponent.astype(np.int64)
    b = base.astype(np.uint64 if base.dtype.kind == "u" else np.int64)
    negative = e < 0
    if np.any(negative & (b == 0)):
        raise ZeroDivisionError("0 raised to a negative power is undefined")
    result = np.power(b, np.where(negative, 0, e).astype(b.dtype))
    if np.any(negative):
        # 1/b**n truncates to 0 unless |b| == 1.
        odd = (e % 2) == 1
        tiny = np.where(b == 1, 1, np.where(b == -1, np.where(odd, -1, 1), 0))
        result = np.where(negative, tiny.astype(result.dtype), result)
    return result.astype(base.dtype)


@functools.lru_cache(maxsize=None)
def _int_range(dtype: np.dtype) -> tuple[int, int]:
    info = ml_dtypes.iinfo(dtype) if dtype in _NARROW_INTS else np.iinfo(dtype)
    return int(info.min), int(info.max)


def _float_to_int(x: Array, dtype: np.dtype) -> Array:
    """Truncates floats toward zero; NaN, inf and out-of-range values are undefined (raise)."""
    if x.dtype.kind == "V":
        x = x.astype(np.float32)
    if x.size:
        lo, hi = float(x.min()), float(x.max())  # NaN propagates into both
        low, high = _int_range(dtype)
        if not (math.isfinite(lo) and math.isfinite(hi)) or (
            math.trunc(lo) < low or math.trunc(hi) > high
        ):
            raise ValueError(
                f"casting values in [{lo}, {hi}] to {dtype} is undefined (NaN, inf or out of range)"
            )
    if dtype in _NARROW_INTS:
        return x.astype(np.int64).astype(dtype)
    return x.astype(dtype)  # C conversion: truncation toward zero


@_quiet
def _pow(x: Array, y: Array) -> Array:
    if x.dtype.kind in "iu":
        if y.dtype.kind in "iu":
            return _int_power(x, y)
        return _float_to_int(np.power(x.astype(np.float64), y.astype(np.float64)), x.dtype)
    return as_dtype(np.power(x.astype(np.float64), y.astype(np.float64)), x.dtype)


def _pow_kernel(types: DTypes) -> Kernel:
    """Pow: the base type T decides the output type; the exponent may have another type T1."""
    allowed_x = types["T"]
    allowed_y = types.get("T1", allowed_x)

    def kernel(inputs: Sequence[Any], attrs: Attrs) -> tuple[Array]:
        x, y = _arr(inputs[0]), _arr(inputs[1])
        _check(x, allowed_x, "base")
        _check(y, allowed_y, "exponent")
        if "T1" not in types and x.dtype != y.dtype:
            raise TypeError(f"base and exponent must share one dtype, got {x.dtype}, {y.dtype}")
        return (as_dtype(_pow(x, y), x.dtype),)

    return kernel


register_versions("Pow", (7, 12, 13, 15), _pow_kernel)


def _bitshift_kernel(types: DTypes) -> Kernel:
    """BitShift: a shift by the bit width or more (or a negative one) leaves only the sign fill."""
    allowed = types["T"]

    def kernel(inputs: Sequence[Any], attrs: Attrs) -> tuple[Array]:
        x, y = _arr(inputs[0]), _arr(inputs[1])
        dtype = _same_dtype((x, y), allowed)
        direction = attrs.get("direction")
        if direction not in ("LEFT", "RIGHT"):
            raise ValueError(f"direction must be LEFT or RIGHT, got {direction!r}")
        bits = dtype.itemsize * 8
        out_of_range = (y < 0) | (y >= bits)
        safe = np.where(out_of_range, 0, y).astype(dtype)
        if direction == "LEFT":
            shifted = np.left_shift(x, safe)
            fill = np.zeros((), dtype)
        else:
            shifted = np.right_shift(x, safe)
            signed = dtype.kind == "i"
            fill = np.where(x < 0, -1, 0).astype(dtype) if signed else np.zeros((), dtype)
        return (as_dtype(np.where(out_of_range, fill, shifted), dtype),)

    return kernel


register_versions("BitShift", (11, 28), _bitshift_kernel)


def _prelu_kernel(types: DTypes) -> Kernel:
    """PRelu: ``slope`` broadcasts unidirectionally to ``X``."""
    allowed = types["T"]

    def kernel(inputs: Sequence[Any], attrs: Attrs) -> tuple[Array]:
        x, slope = _arr(inputs[0]), _arr(inputs[1])
        dtype = _same_dtype((x, slope), allowed)
        if np.broadcast_shapes(x.shape, slope.shape) != x.shape:
            raise ValueError(f"slope shape {slope.shape} does not broadcast to {x.shape}")
        work = _exact_type(dtype)
        x, slope = x.astype(work, copy=False), slope.astype(work, copy=False)
        return (as_dtype(np.where(x < 0, x * slope, x), dtype),)

    return kernel


register_versions("PRelu", (7, 9, 16), _prelu_kernel)


# --- comparison and logic ------------------------------------------------------------------


def _compare(fn: BinaryFn) -> Callable[[DTypes], Kernel]:
    """A broadcasting comparison ``T x T -> bool``."""

    def make(types: DTypes) -> Kernel:
        allowed = types["T"]

        def kernel(inputs: Sequence[Any], attrs: Attrs) -> tuple[Array]:
            a, b = _arr(inputs[0]), _arr(inputs[1])
            dtype = _same_dtype((a, b), allowed)
            work = _exact_type(dtype)
            if work != dtype:
                a, b = a.astype(work), b.astype(work)
            return (np.asarray(fn(a, b), dtype=bool),)

        return kernel

    return make


register_versions("Equal", (7, 11, 13, 19), _compare(np.equal))
register_versions("Less", (7, 9, 13), _compare(np.less))
register_versions("Greater", (7, 9, 13), _compare(np.greater))
register_versions("LessOrEqual", (12, 16), _compare(np.less_equal))
register_versions("GreaterOrEqual", (12, 16), _compare(np.greater_equal))
register_versions("And", (7,), _compare(np.logical_and))
register_versions("Or", (7,), _compare(np.logical_or))
register_versions("Xor", (7,), _compare(np.logical_xor))
register_versions("Not", (1,), _unary(lambda x, a: np.logical_not(x), exact=True))


# --- variadic ------------------------------------------------------------------------------


def _variadic(
    fn: BinaryFn, *, mean: bool = False, wide: bool = False
) -> Callable[[DTypes], Kernel]:
    """Sum/Mean/Max/Min over one or more inputs with multidirectional broadcasting.

    Args:
        fn: the pairwise combination.
        mean: divide by the number of inputs at the end.
        wide: accumulate floats in float64 and round once at the end.
    """

    def make(types: DTypes) -> Kernel:
        allowed = types["T"]

        def kernel(inputs: Sequence[Any], attrs: Attrs) -> tuple[Array]:
            if not inputs:
                raise ValueError("at least one input is required")
            arrays = [_arr(v) for v in inputs]
            dtype = _same_dtype(arrays, allowed)
            work = _wide_type(dtype) if wide else _exact_type(dtype)
            result = arrays[0].astype(work)  # a copy: outputs never alias inputs
            with np.errstate(all="ignore"):
                for other in arrays[1:]:
                    result = fn(result, other.astype(work, copy=False))
                if mean:
                    result = result / len(arrays)
            return (as_dtype(result, dtype),)

        return kernel

    return make


# Versions 6 took equally shaped inputs only, which broadcasting handles alike.
register_versions("Sum", (6, 8, 13), _variadic(np.add, wide=True))
register_versions("Mean", (6, 8, 13), _variadic(np.add, mean=True, wide=True))
register_versions("Max", (6, 8, 12, 13), _variadic(np.maximum))
register_versions("Min", (6, 8, 12, 13), _variadic(np.minimum))


# --- Clip and Where ------------------------------------------------------------------------


def _bound(value: Any, dtype: np.dtype, name: str) -> Array | None:
    if value is None:
        return None
    bound = _arr(value)
    if bound.dtype != dtype:
        raise TypeError(f"{name} dtype {bound.dtype} differs from input dtype {dtype}")
    if bound.size != 1:
        raise ValueError(f"{name} must be a scalar, got shape {bound.shape}")
    return bound.reshape(())


def _clip(x: Array, lo: Any, hi: Any) -> Array:
    """``Min(max, Max(x, min))``: when min > max every element becomes max; NaN propagates."""
    work = _exact_type(x.dtype)
    result = x.astype(work)  # a copy: outputs never alias inputs
    if lo is not None:
        result = np.maximum(result, np.asarray(lo).astype(work))
    if hi is not None:
        result = np.minimum(result, np.asarray(hi).astype(work))
    return as_dtype(result, x.dtype)


def _clip_attr_kernel(types: DTypes) -> Kernel:
    """Clip-6: ``min``/``max`` attributes (defaulting to the float32 range)."""
    allowed = types["T"]

    def kernel(inputs: Sequence[Any], attrs: Attrs) -> tuple[Array]:
        x = _arr(inputs[0])
        _check(x, allowed)
        # FLOAT attributes are float32 values.
        lo = np.asarray(attrs.get("min", -3.4028234663852886e38), dtype=np.float32)
        hi = np.asarray(attrs.get("max", 3.4028234663852886e38), dtype=np.float32)
        return (_clip(x, as_dtype(lo, x.dtype), as_dtype(hi, x.dtype)),)

    return kernel


def _clip_input_kernel(types: DTypes) -> Kernel:
    """Clip-11+: optional scalar ``min``/``max`` inputs; omitted means unbounded."""
    allowed = types["T"]

    def kernel(inputs: Sequence[Any], attrs: Attrs) -> tuple[Array]:
        x = _arr(inputs[0])
        _check(x, allowed)
        lo = _bound(inputs[1] if len(inputs) > 1 else None, x.dtype, "min")
        hi = _bound(inputs[2] if len(inputs) > 2 else None, x.dtype, "max")
        return (_clip(x, lo, hi),)

    return kernel


register_versions("Clip", (6,), _clip_attr_kernel)
register_versions("Clip", (11, 12, 13), _clip_input_kernel)


def _where_kernel(types: DTypes) -> Kernel:
    allowed = types["T"]

    def kernel(inputs: Sequence[Any], attrs: Attrs) -> tuple[Array]:
        cond, x, y = _arr(inputs[0]), _arr(inputs[1]), _arr(inputs[2])
        _check(cond, types["B"], "condition")
        dtype = _same_dtype((x, y), allowed)
        return (as_dtype(np.where(cond, x, y), dtype),)

    return kernel


register_versions("Where", (9, 16), _where_kernel)


# --- Cast and CastLike ---------------------------------------------------------------------

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
_INT_LITERAL = re.compile(r"\s*[+-]?\d+\s*")


def _to_e8m0(x: Array, saturate: bool, round_mode: str) -> Array:
    """float -> float8e8m0 (a power of two 2**(e-127), e in 0..254, 255 = NaN).

    Works on the float32 encoding like the ONNX definition: ``up`` rounds any fraction up,
    ``down`` drops it, ``nearest`` rounds mantissas of 1.5 and more up. Saturation keeps the
    largest exponent instead of producing NaN; infinity saturates to the largest value.
    """
    if round_mode not in ("up", "down", "nearest"):
        raise ValueError(f"round_mode must be up, down or nearest, got {round_mode!r}")
    bits = _to_float(x, _F32).view(np.uint32)
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


def _from_string(x: Array, to: np.dtype) -> Array:
    flat = [str(s) for s in x.ravel()]
    if to in _FLOATS:
        if any("_" in s for s in flat):
            raise ValueError("string is not a floating-point literal")
        return _to_float(np.array([float(s) for s in flat], np.float64), to).reshape(x.shape)
    if to.kind in "iu" or to in _NARROW_INTS:
        if not all(_INT_LITERAL.fullmatch(s) for s in flat):
            raise ValueError("casting a non-integer string to an integer type is undefined")
        values = [int(s) for s in flat]
        info = ml_dtypes.iinfo(to) if to in _NARROW_INTS else np.iinfo(to)
        if any(not info.min <= v <= info.max for v in values):
            raise ValueError(f"integer string out of range for {to}")
        return np.array(values, dtype=np.int64 if to in _NARROW_INTS else to).astype(to).reshape(
            x.shape
        )
    raise UnsupportedOpError(f"Cast: string to {to} is not defined by the spec")


def _to_string(x: Array) -> Array:
    if x.dtype.kind in "iu" or x.dtype in _NARROW_INTS:
        return np.array([str(int(v)) for v in x.ravel()], dtype=object).reshape(x.shape)
    # The spec only asks for "plain floating-point representation": onnxruntime prints %.8g,
    # the onnx reference prints the shortest repr. Neither can be called right, so no folding.
    raise UnsupportedOpError(f"Cast: {x.dtype} to string has no specified formatting")


def cast(x: Array, to: np.dtype, *, saturate: bool = True, round_mode: str = "up") -> Array:
    """Converts ``x`` to ``to`` with the ONNX Cast rules (see the module docstring).

    Raises:
        ValueError: the conversion is undefined for some element (e.g. NaN to int32).
        UnsupportedOpError: the conversion is not implemented (e.g. float to string).
    """
    src = x.dtype
    if to == src:
        return x.copy()
    if src in _FLOATS and to.kind in "iu":  # the common case first
        return _float_to_int(x, to)
    if to == _STRING:
        return _to_string(x)
    if src == _STRING:
        return _from_string(x, to)
    if to == _BOOL:
        return np.asarray(x.astype(_exact_type(src)) != 0)
    if to == _E8M0:
        return _to_e8m0(x, saturate, round_mode)
    if to in _FLOAT8 and saturate:
        limit = float(ml_dtypes.finfo(to).max)
        wide = x.astype(np.float64)
        return _to_float(np.clip(wide, -limit, limit), to)
    if to in _FLOATS:
        with np.errstate(over="ignore"):  # out-of-range values become +-inf, as Cast specifies
            return _to_float(x, to)
    if src in _FLOATS:
        return _float_to_int(x, to)
    if to in _NARROW_INTS or src in _NARROW_INTS:
        # fixed point -> fixed point keeps the low bits (two's complement reinterpretation).
        return x.astype(np.int64).astype(to)
    return x.astype(to)


@functools.lru_cache(maxsize=None)
def _dtype_of(code: int) -> np.dtype:
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(code))


def _cast_kernel(types: DTypes, *, like: bool) -> Kernel:
    allowed_in, allowed_out = types["T1"], types["T2"]

    def kernel(inputs: Sequence[Any], attrs: Attrs) -> tuple[Array]:
        x = _arr(inputs[0])
        _check(x, allowed_in)
        if like:
            to = _arr(inputs[1]).dtype
        else:
            code = attrs.get("to")
            if code is None:
                raise ValueError("attribute 'to' is required")
            to = _dtype_of(int(code))
        if to not in allowed_out:
            raise TypeError(f"target dtype {to} is not allowed by the schema")
        saturate = bool(attrs.get("saturate", 1))
        out = cast(x, to, saturate=saturate, round_mode=attrs.get("round_mode", "up"))
        return (np.asarray(out),)

    return kernel


register_versions(
    "Cast", (6, 9, 13, 19, 21, 23, 24, 25, 28), functools.partial(_cast_kernel, like=False)
)
register_versions(
    "CastLike", (15, 19, 21, 23, 24, 25), functools.partial(_cast_kernel, like=True)
)
