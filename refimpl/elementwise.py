"""Unary elementwise kernels: math, activations, IsNaN/IsInf and the logical/bitwise Not.

Every operator is one ``unary`` factory call, registered from the first ONNX schema version it
implements on (later versions only add types). The factory is :class:`~refimpl._registry.Typed`:
each schema version gets a kernel that rejects the dtypes that version does not allow instead of
letting numpy promote them.

Numerics (the contract the tests check):
  * Outputs have exactly the input dtype; numpy scalar promotion never leaks.
  * Operations that IEEE 754 rounds exactly once (floor, ceil, round, abs, neg, sqrt,
    reciprocal) run in the input type (float32 for bfloat16 and float8; see ``refimpl._dtypes``).
  * Transcendental functions (exp, log, tanh, erf, ...) on float16, bfloat16 and float32 are
    evaluated in float64 and rounded once to the input type, with numpy's floating-point
    warnings silenced (inf and NaN results are intended).
  * Where the spec leaves the sign of a zero or NaN's fate open, onnxruntime decides: Relu keeps
    -0 (``max(x, 0)`` keeps x on a tie); float16 Sign maps NaN to 0; Selu and Celu of -0 are +0
    (their ``alpha * exp(x) - alpha`` branch). Elu, Selu and Celu of a tiny negative x, where
    onnxruntime's ``exp(x) - 1`` cancels to +0 but ``expm1`` does not, decline
    (UndefinedResultError): the node is not folded.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from refimpl._common import Attrs, Inputs, as_array
from refimpl._dtypes import F16, DTypes, as_bool, as_dtype, disallowed, work_types
from refimpl._errors import UndefinedResultError
from refimpl._registry import Kernel, Typed, register

__all__ = ["UnaryFn", "unary"]

Array = np.ndarray
UnaryFn = Callable[[Array, Attrs], Array]


def unary(fn: UnaryFn, *, exact: bool = False, param: str = "T", to_bool: bool = False) -> Typed:
    """A one-input op whose output has the input dtype (or bool).

    Args:
        fn: ``fn(x, attributes)``; float inputs arrive in float64 unless ``exact``.
        exact: ``fn`` rounds once, so it runs in the input type (float32 for ml_dtypes floats)
            and needs no floating-point warning suppression (which costs a microsecond).
        param: the schema's type parameter of the input (``T1`` for IsNaN and IsInf).
        to_bool: the output is bool instead of the input type.
    """
    finish = as_bool if to_bool else as_dtype

    def make(types: DTypes) -> Kernel:
        work_of = work_types(types[param], wide=not exact)

        def kernel(inputs: Inputs, attrs: Attrs) -> tuple[Array]:
            x = as_array(inputs[0])
            dtype = x.dtype
            work = work_of.get(dtype)
            if work is None:
                raise disallowed(dtype)
            if work != dtype:
                x = x.astype(work)
            if exact:
                return (finish(fn(x, attrs), dtype),)
            with np.errstate(all="ignore"):  # overflow to inf and NaN results are intended
                return (finish(fn(x, attrs), dtype),)

        return kernel

    return Typed(make)


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
    """Sign; float16 NaN gives 0 as in onnxruntime (float and double keep NaN there too)."""
    if x.dtype == F16:
        return np.where(np.isnan(x), np.zeros((), x.dtype), np.sign(x)).astype(x.dtype, copy=False)
    return np.sign(x).astype(x.dtype, copy=False)


def _relu(x: Array, attrs: Attrs) -> Array:
    """``x < 0 ? 0 : x``: -0 and NaN stay, as in onnxruntime."""
    return np.where(x < 0, np.zeros((), x.dtype), x)


_TINY = 2.0**-20


def _exp_branch(negative: Callable[[Array, Attrs], Array], *, positive_zero: bool) -> UnaryFn:
    """An activation whose negative branch is ``alpha * (exp(x) - 1)`` (Elu, Selu, Celu).

    ``negative(x, attrs)`` is the whole activation, evaluated with expm1 (float64). Where the
    input type's ``exp(x)`` rounds to 1 for a negative x, onnxruntime's result is +0 and expm1's
    is not: the kernel declines for ``-2**-20 < x < 0`` (a margin over float32's 2**-25; float16
    runs in float32 in onnxruntime, float64's own threshold is smaller).
    With ``positive_zero`` -0 maps to +0.
    """

    def fn(x: Array, attrs: Attrs) -> Array:
        if x.dtype.kind == "f" and x.size and np.any((x < 0) & (x > -_TINY)):
            raise UndefinedResultError("exp(x) - 1 of a tiny negative x: onnxruntime gives +0")
        out = negative(x, attrs)
        return out + 0.0 if positive_zero and x.dtype.kind == "f" else out

    return fn


_UNARY: dict[str, tuple[int, UnaryFn, bool]] = {
    # op: (first schema version, fn, exact)
    "Abs": (6, lambda x, a: np.abs(x), True),
    "Neg": (6, lambda x, a: np.negative(x), True),
    "Floor": (6, lambda x, a: np.floor(x), True),
    "Ceil": (6, lambda x, a: np.ceil(x), True),
    # np.round rounds halves to even, as Round requires.
    "Round": (11, lambda x, a: np.round(x), True),
    "Sign": (9, _sign, True),
    "Relu": (6, _relu, True),
    "Sqrt": (6, lambda x, a: np.sqrt(x), True),
    "Reciprocal": (6, lambda x, a: np.reciprocal(x), True),
    "Not": (1, lambda x, a: np.logical_not(x), True),
    "BitwiseNot": (18, lambda x, a: np.invert(x), True),
    "Exp": (6, lambda x, a: np.exp(x), False),
    "Log": (6, lambda x, a: np.log(x), False),
    "Tanh": (6, lambda x, a: np.tanh(x), False),
    "Sigmoid": (6, _sigmoid, False),
    "Erf": (9, _erf, False),
    "Sin": (7, lambda x, a: np.sin(x), False),
    "Cos": (7, lambda x, a: np.cos(x), False),
    "Tan": (7, lambda x, a: np.tan(x), False),
    "Asin": (7, lambda x, a: np.arcsin(x), False),
    "Acos": (7, lambda x, a: np.arccos(x), False),
    "Atan": (7, lambda x, a: np.arctan(x), False),
    "Sinh": (9, lambda x, a: np.sinh(x), False),
    "Cosh": (9, lambda x, a: np.cosh(x), False),
    "Asinh": (9, lambda x, a: np.arcsinh(x), False),
    "Acosh": (9, lambda x, a: np.arccosh(x), False),
    "Atanh": (9, lambda x, a: np.arctanh(x), False),
    "Softplus": (1, lambda x, a: np.logaddexp(0.0, x), False),
    "Softsign": (1, lambda x, a: x / (1.0 + np.abs(x)), False),
    "LeakyRelu": (6, lambda x, a: np.where(x >= 0, x, _f32(a, "alpha") * x), False),
    "HardSigmoid": (
        6,
        lambda x, a: np.clip(_f32(a, "alpha") * x + _f32(a, "beta"), 0.0, 1.0),
        False,
    ),
    "HardSwish": (14, lambda x, a: x * np.clip(x / 6.0 + 0.5, 0.0, 1.0), False),
    "Elu": (
        6,
        _exp_branch(lambda x, a: np.where(x >= 0, x, _f32(a, "alpha") * np.expm1(x)), positive_zero=False),
        False,
    ),
    "Selu": (
        6,
        _exp_branch(
            lambda x, a: _f32(a, "gamma") * np.where(x > 0, x, _f32(a, "alpha") * np.expm1(x)),
            positive_zero=True,
        ),
        False,
    ),
    "Celu": (
        12,
        _exp_branch(
            lambda x, a: np.maximum(x, 0.0)
            + np.minimum(0.0, _f32(a, "alpha") * np.expm1(x / _f32(a, "alpha"))),
            positive_zero=True,
        ),
        False,
    ),
    "ThresholdedRelu": (10, lambda x, a: np.where(x > _f32(a, "alpha"), x, 0.0), False),
    "Mish": (18, lambda x, a: x * np.tanh(np.logaddexp(0.0, x)), False),
    "Gelu": (20, _gelu, False),
}

for _op, (_since, _fn, _exact) in _UNARY.items():
    register(_op, _since)(unary(_fn, exact=_exact))


def _isinf(x: Array, attrs: Attrs) -> Array:
    pos = np.isposinf(x) if attrs.get("detect_positive", 1) else np.zeros(x.shape, bool)
    neg = np.isneginf(x) if attrs.get("detect_negative", 1) else np.zeros(x.shape, bool)
    return pos | neg


# Float -> bool tests, evaluated in float32/float64.
for _op, _since, _fn in (
    ("IsNaN", 9, lambda x, a: np.isnan(x)),
    ("IsInf", 10, _isinf),
):
    register(_op, _since)(unary(_fn, exact=True, param="T1", to_bool=True))
