"""Matrix products: MatMul, Gemm and Einsum.

Precision: float16/bfloat16 products of MatMul and Gemm are computed in float32 and rounded
once; Einsum computes every float type below float64 in float64 and rounds once, so its results
are (nearly always) correctly rounded. Integer products wrap around like the C++ kernels.
Each kernel accepts exactly the dtypes its schema version allows.
"""

from __future__ import annotations

import numpy as np

from refimpl._common import Attrs, Inputs, as_text, broadcasts_to, same_dtype
from refimpl._dtypes import DTypes, accumulator_type, checked, wide_type
from refimpl._errors import RefImplError
from refimpl._registry import Kernel, Typed, register

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
            product = np.matmul(a.astype(work, copy=False), b.astype(work, copy=False))
        except ValueError:  # dtypes and ranks are checked: only the dims can disagree
            raise RefImplError(f"MatMul: shapes {a.shape} and {b.shape} do not match") from None
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

    ``beta * C`` is evaluated literally even when beta is 0 (the spec's
    formula), so an inf/NaN in C gives NaN; onnxruntime and onnx's reference
    evaluator skip C when beta is 0. Integer types need integral alpha/beta.
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
            y = np.matmul(a.astype(work, copy=False), b.astype(work, copy=False))
            y = y * work.type(alpha)
            if c is not None:
                if not broadcasts_to(c.shape, y.shape):
                    raise RefImplError(f"Gemm: C {c.shape} does not broadcast to {y.shape}")
                y = y + work.type(beta) * c.astype(work, copy=False)
            return (y.astype(dtype, copy=False),)

        return kernel

    return Typed(make)


# Gemm-6 and older took a broadcast attribute: they are not implemented.
register("Gemm", 7, 9)(_gemm(c_optional=False))
register("Gemm", 11)(_gemm(c_optional=True))


# --- Einsum ------------------------------------------------------------------------------------


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
        return (np.asarray(result).astype(dtype, copy=False),)

    return kernel


register("Einsum", 12)(Typed(_einsum))
