"""Matrix products: MatMul, Gemm and Einsum.

Precision: float16/bfloat16 products of MatMul and Gemm are computed in float32 and rounded
once; Einsum computes every float type below float64 in float64 and rounds once, so its results
are (nearly always) correctly rounded. Integer products wrap around like the C++ kernels.
Each kernel accepts exactly the dtypes its schema version allows.

Where onnxruntime's result depends on its code path, the kernels decline (UndefinedResultError,
the node is not folded):
  * the sign of a zero whose every term is -0 or an underflowing product (``[-0] @ [1]`` is +0
    in onnxruntime's MatMul, ``Gemm([-0], [1], C=[-0])`` is -0: it depends on where the
    accumulation starts);
  * a float element whose finite terms may overflow (the order and fused multiply-adds decide
    between inf and NaN), or that cancels within the rounding error of the runtime's
    accumulation (its order decides the value, even the sign);
  * integer Einsum whose partial sums or products may overflow: onnxruntime saturates its
    reductions (``Einsum("ii->")`` of [[2**62, 0], [0, 2**62]] is 2**63 - 1) and wraps its
    products, so only a result no intermediate can overflow is folded.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import numpy as np

from refimpl._common import Attrs, Inputs, as_text, broadcasts_to, same_dtype
from refimpl._dtypes import DTypes, accumulator_type, checked, wide_type
from refimpl._errors import RefImplError, RuntimeChoiceError, UndefinedResultError
from refimpl._registry import Kernel, Typed, register

def _lowest_bit(x: np.ndarray) -> float:
    """The exponent of the lowest set bit over the nonzero finite elements of ``x`` (inf if none)."""
    values = x[np.isfinite(x) & (x != 0)].astype(np.float64)
    if not values.size:
        return math.inf
    mantissa, exponent = np.frexp(np.abs(values))
    digits = (mantissa * 2.0**53).astype(np.int64)
    trailing = np.log2((digits & -digits).astype(np.float64))
    return float(np.min(exponent - 53 + trailing))


def _log2_smallest(x: np.ndarray) -> float:
    """``log2`` of the smallest nonzero finite magnitude in ``x`` (inf if there is none)."""
    values = np.abs(x[np.isfinite(x) & (x != 0)].astype(np.float64))
    return float(np.log2(values.min())) if values.size else math.inf


def _check_terms(
    op: str,
    combine: Callable[..., np.ndarray],
    arrays: Sequence[np.ndarray],
    result: np.ndarray,
    *,
    scale: float = 1.0,
    extra: np.ndarray | None = None,
) -> None:
    """Declines a float product where the runtime's order or accumulator decides the result.

    The result is ``scale * combine(*arrays) + extra`` (Gemm: ``alpha * A @ B + beta * C``).

    * An element whose finite terms may overflow: onnxruntime's order and fused multiply-adds
      decide between inf and NaN (``[-inf, 2.5] @ [-max, -max]``).
    * Products that may underflow (below the normal range): fused multiply-adds round them
      differently (even to a zero of another sign).
    * An element whose products are all zero: the sum's sign depends on where the accumulator
      starts; it is +0 in every order only when one product is +0, or ``extra`` is +0 there.
    * An element that cancels to the last bits of its terms (``|y| <= eps * sum|terms|``),
      where the runtime's order may give exactly 0 (then -inf/inf behind a Log or Reciprocal)
      or another sign, unless every partial result is exact in every order (all terms multiples
      of ``2**q`` and ``sum|terms| < 2**(p + q)``). The worst-case bound would be ``n`` times
      larger; it would decline most large random products, whose rounding differs from the
      runtime's anyway.
    """
    dtype = arrays[0].dtype
    if dtype.kind != "f":
        return
    accumulator = np.finfo(accumulator_type(dtype))
    wide = [np.where(np.isfinite(a), a, 0).astype(np.float64) for a in arrays]
    added = None if extra is None else np.abs(np.where(np.isfinite(extra), extra, 0).astype(np.float64))
    limit = float(np.finfo(dtype).max) / 2
    with np.errstate(all="ignore"):
        products = combine(*(np.abs(a) for a in wide))
        magnitude = abs(scale) * products + (0 if added is None else added)
        if np.any(products >= limit) or np.any(magnitude >= limit):
            raise RuntimeChoiceError(f"{op}: terms that may overflow: the runtime's order decides inf or NaN")
        held = combine(*(np.abs(a) for a in arrays))  # the products as the input type holds them
    smallest = sum(_log2_smallest(a) for a in arrays) + _log2_smallest(np.array([scale]))
    if smallest < math.log2(float(accumulator.tiny)) + 1:
        raise RuntimeChoiceError(f"{op}: products that may underflow: fused multiply-adds decide their rounding")
    zero = held == 0
    if np.any(zero):
        signs = [np.where(np.signbit(a), -1.0, 1.0) for a in arrays]
        positive = (combine(*(np.ones(a.shape) for a in arrays)) + combine(*signs)) / 2
        unsure = zero & ((magnitude > 0) & (products > 0) | (positive == 0))  # underflow, or only -0
        if extra is not None:
            unsure &= (extra == 0) & np.signbit(extra)  # + (+0) makes any zero +0
        if np.any(unsure):
            raise RuntimeChoiceError(f"{op}: an output whose terms are all -0 (or underflow) has the runtime's sign")
    with np.errstate(all="ignore"):
        doubtful = np.abs(result.astype(np.float64)) <= float(accumulator.eps) * magnitude
    doubtful &= (magnitude > 0) & np.isfinite(result)
    if np.any(doubtful):
        quantum = sum(_lowest_bit(a) for a in arrays) + _lowest_bit(np.array([scale]))
        if extra is not None:
            quantum = min(quantum, _lowest_bit(extra))
        exact = magnitude < 2.0 ** (accumulator.nmant + 1 + quantum) if math.isfinite(quantum) else True
        if np.any(doubtful & ~exact):
            raise RuntimeChoiceError(f"{op}: a sum that cancels within rounding error: the runtime's order decides")


# --- MatMul ------------------------------------------------------------------------------------


def _matmul(types: DTypes) -> Kernel:
    allowed = types["T"]

    def kernel(inputs: Inputs, attrs: Attrs) -> tuple[np.ndarray]:
        """MatMul with numpy.matmul semantics (1-D operands are promoted, batch dims broadcast)."""
        a, b = checked(inputs[0], allowed), checked(inputs[1], allowed)
        dtype = same_dtype("MatMul", (a, b))
        if a.ndim == 0 or b.ndim == 0:
            raise RefImplError("MatMul: scalar operand")
        work = accumulator_type(dtype)
        try:
            a, b = a.astype(work, copy=False), b.astype(work, copy=False)
            product = np.matmul(a, b)
        except ValueError:  # dtypes and ranks are checked: only the dims can disagree
            raise RefImplError(f"MatMul: shapes {a.shape} and {b.shape} do not match") from None
        _check_terms("MatMul", np.matmul, (a, b), np.asarray(product))
        return (np.asarray(product).astype(dtype, copy=False),)  # 1-D @ 1-D is a bare scalar

    return kernel


register("MatMul", 1)(Typed(_matmul))


# --- Gemm --------------------------------------------------------------------------------------


def _integral(op: str, name: str, value: float) -> int:
    if not float(value).is_integer():
        raise RefImplError(f"{op}: {name} = {value} is not integral for an integer type")
    return int(value)


def _gemm(c_optional: bool) -> Typed:
    """Gemm: ``alpha * A' @ B' + beta * C`` with C unidirectionally broadcast to (M, N).

    With beta = 0, C does not contribute (an inf or NaN in C does not give NaN), as in
    onnxruntime and onnx's reference evaluator. Integer types need integral alpha/beta.
    """

    def make(types: DTypes) -> Kernel:
        allowed = types["T"]

        def kernel(inputs: Inputs, attrs: Attrs) -> tuple[np.ndarray]:
            a, b = checked(inputs[0], allowed), checked(inputs[1], allowed)
            c = checked(inputs[2], allowed) if len(inputs) > 2 and inputs[2] is not None else None
            if c is None and not c_optional:
                raise RefImplError("Gemm: C is required before version 11")
            dtype = same_dtype("Gemm", (a, b) if c is None else (a, b, c))
            if a.ndim != 2 or b.ndim != 2:
                raise RefImplError(f"Gemm: A and B must be 2-D, got {a.shape} and {b.shape}")
            a = a.T if attrs.get("transA", 0) else a
            b = b.T if attrs.get("transB", 0) else b
            if a.shape[1] != b.shape[0]:
                raise RefImplError(f"Gemm: inner dimensions differ: {a.shape} @ {b.shape}")
            work = accumulator_type(dtype)
            alpha, beta = attrs.get("alpha", 1.0), attrs.get("beta", 1.0)
            if dtype.kind in "iu":
                alpha, beta = _integral("Gemm", "alpha", alpha), _integral("Gemm", "beta", beta)
            a, b = a.astype(work, copy=False), b.astype(work, copy=False)
            y = np.matmul(a, b)
            y = y * work.type(alpha)
            term = None
            if c is not None:
                if not broadcasts_to(c.shape, y.shape):
                    raise RefImplError(f"Gemm: C {c.shape} does not broadcast to {y.shape}")
                if beta != 0:
                    term = work.type(beta) * c.astype(work, copy=False)
                    y = y + term
            if dtype.kind == "f" and alpha == 0 and not np.all(y):
                raise RuntimeChoiceError("Gemm: alpha = 0 gives a zero whose sign is that of A @ B")
            _check_terms("Gemm", np.matmul, (a, b), np.asarray(y), scale=float(alpha), extra=term)
            return (y.astype(dtype, copy=False),)

        return kernel

    return Typed(make)


# Gemm-6 and older took a broadcast attribute: they are not implemented.
register("Gemm", 7, 9)(_gemm(c_optional=False))
register("Gemm", 11)(_gemm(c_optional=True))


# --- Einsum ------------------------------------------------------------------------------------


def _check_int_bound(equation: str, arrays: list[np.ndarray], dtype: np.dtype) -> None:
    """Declines an integer Einsum whose intermediates might overflow ``dtype``.

    Every partial product or partial sum is at most the sum over all terms of the products of
    ``max(|x|, 1)``; that bound is computed in float64 (with a margin for its rounding).
    """
    with np.errstate(all="ignore"):
        bound = np.einsum(equation, *(np.maximum(np.abs(x.astype(np.float64)), 1.0) for x in arrays))
    if np.asarray(bound).size and float(np.max(bound)) * (1 + 1e-9) >= float(np.iinfo(dtype).max):
        raise UndefinedResultError(
            f"Einsum: intermediates may overflow {dtype} (onnxruntime saturates sums, wraps products)"
        )


def _einsum(types: DTypes) -> Kernel:
    allowed = types["T"]

    def kernel(inputs: Inputs, attrs: Attrs) -> tuple[np.ndarray]:
        """Einsum via numpy.einsum (implicit output: labels seen once, in ASCII order)."""
        arrays = [checked(x, allowed) for x in inputs]
        dtype = same_dtype("Einsum", arrays)
        equation = as_text(attrs["equation"]).replace(" ", "")
        work = wide_type(dtype)
        try:
            result = np.einsum(equation, *(x.astype(work, copy=False) for x in arrays))
        except ValueError as e:  # numpy checks the equation against the operands' shapes
            raise RefImplError(f"Einsum: {equation!r} does not fit the inputs: {e}") from None
        if dtype.kind in "iu":
            _check_int_bound(equation, arrays, dtype)
        elif dtype.kind == "f":
            _check_terms("Einsum", functools.partial(np.einsum, equation), arrays, np.asarray(result))
        return (np.asarray(result).astype(dtype, copy=False),)

    return kernel


register("Einsum", 12)(Typed(_einsum))
