"""Matrix products, Softmax/LogSoftmax, Dropout and Compress.

Precision: float16/bfloat16 products are computed in float32 and rounded once;
Einsum and Softmax/LogSoftmax compute every float type below float64 in
float64 and round once, so their results are (nearly always) correctly
rounded. Integer products wrap around like the C++ kernels.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from refimpl._common import Attrs, Inputs, as_array, as_text, normalize_axis, same_dtype
from refimpl._registry import Kernel, RefImplError, register

_HALF_TYPES = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


def _compute_dtype(dtype: np.dtype, wide: bool = False) -> np.dtype:
    """The type to compute in: float32 for 16-bit floats, float64 for all floats if ``wide``."""
    if dtype in _HALF_TYPES:
        return np.dtype(np.float64 if wide else np.float32)
    if wide and dtype.kind == "f":
        return np.dtype(np.float64)
    return dtype


# --- MatMul, Gemm, Einsum ---------------------------------------------------------------------


@register("MatMul", 1, 13)
def _matmul(inputs: Inputs, attrs: Attrs) -> tuple[np.ndarray]:
    """MatMul with numpy.matmul semantics (1-D operands are promoted, batch dims broadcast)."""
    a, b = as_array(inputs[0]), as_array(inputs[1])
    dtype = same_dtype("MatMul", (a, b))
    if a.ndim == 0 or b.ndim == 0:
        raise RefImplError("MatMul: scalar operand")
    compute = _compute_dtype(dtype)
    product = np.matmul(a.astype(compute, copy=False), b.astype(compute, copy=False))
    return (np.asarray(product).astype(dtype, copy=False),)  # 1-D @ 1-D is a bare scalar


def _integral(op: str, name: str, value: float) -> int:
    if not float(value).is_integer():
        raise RefImplError(f"{op}: {name} = {value} is not integral for an integer type")
    return int(value)


def _gemm(c_optional: bool) -> Kernel:
    """Gemm: ``alpha * A' @ B' + beta * C`` with C unidirectionally broadcast to (M, N).

    ``beta * C`` is evaluated literally even when beta is 0 (the spec's
    formula), so an inf/NaN in C gives NaN; onnxruntime and onnx's reference
    evaluator skip C when beta is 0. Integer types need integral alpha/beta.
    """

    def kernel(inputs: Inputs, attrs: Attrs) -> tuple[np.ndarray]:
        a, b = as_array(inputs[0]), as_array(inputs[1])
        c = as_array(inputs[2]) if len(inputs) > 2 and inputs[2] is not None else None
        if c is None and not c_optional:
            raise RefImplError("Gemm: C is required before version 11")
        dtype = same_dtype("Gemm", (a, b) if c is None else (a, b, c))
        if a.ndim != 2 or b.ndim != 2:
            raise RefImplError(f"Gemm: A and B must be 2-D, got {a.shape} and {b.shape}")
        a = a.T if attrs.get("transA", 0) else a
        b = b.T if attrs.get("transB", 0) else b
        if a.shape[1] != b.shape[0]:
            raise RefImplError(f"Gemm: inner dimensions differ: {a.shape} @ {b.shape}")
        compute = _compute_dtype(dtype)
        alpha, beta = attrs.get("alpha", 1.0), attrs.get("beta", 1.0)
        if dtype.kind in "iu":
            alpha, beta = _integral("Gemm", "alpha", alpha), _integral("Gemm", "beta", beta)
        y = np.matmul(a.astype(compute, copy=False), b.astype(compute, copy=False))
        y = y * compute.type(alpha)
        if c is not None:
            out_shape = y.shape
            if c.ndim > 2 or np.broadcast_shapes(c.shape, out_shape) != out_shape:
                raise RefImplError(f"Gemm: C {c.shape} does not broadcast to {out_shape}")
            y = y + compute.type(beta) * c.astype(compute, copy=False)
        return (y.astype(dtype, copy=False),)

    return kernel


register("Gemm", 7, 9)(_gemm(c_optional=False))
register("Gemm", 11, 13)(_gemm(c_optional=True))


@register("Einsum", 12, 28)
def _einsum(inputs: Inputs, attrs: Attrs) -> tuple[np.ndarray]:
    """Einsum via numpy.einsum (implicit output: labels seen once, in ASCII order)."""
    arrays = [as_array(x) for x in inputs]
    if not arrays:
        raise RefImplError("Einsum: needs at least one input")
    dtype = same_dtype("Einsum", arrays)
    equation = as_text(attrs["equation"]).replace(" ", "")
    compute = _compute_dtype(dtype, wide=True)
    result = np.einsum(equation, *(x.astype(compute, copy=False) for x in arrays))
    return (np.asarray(result).astype(dtype, copy=False),)


# --- Softmax, LogSoftmax ------------------------------------------------------------------------


def _softmax(log: bool, coerce_2d: bool, allow_negative: bool) -> Kernel:
    """Softmax or LogSoftmax.

    Before version 13 the input is coerced to 2-D at ``axis`` (dims before it
    form the rows) and normalised over each row, i.e. over *all* dims from
    ``axis`` on; from version 13 it is normalised over the single ``axis``.
    """
    op = "LogSoftmax" if log else "Softmax"

    def kernel(inputs: Inputs, attrs: Attrs) -> tuple[np.ndarray]:
        x = as_array(inputs[0])
        axis = normalize_axis(op, attrs["axis"], x.ndim, allow_negative=allow_negative)
        if x.size == 0:
            return (x.copy(),)
        y = x.astype(_compute_dtype(x.dtype, wide=True), copy=False)
        if coerce_2d:
            y = y.reshape(math.prod(x.shape[:axis]), -1)
            axis = 1
        shifted = y - y.max(axis=axis, keepdims=True)
        exp = np.exp(shifted)
        total = exp.sum(axis=axis, keepdims=True)
        y = shifted - np.log(total) if log else exp / total
        return (y.reshape(x.shape).astype(x.dtype, copy=False),)

    return kernel


for _log, _op in ((False, "Softmax"), (True, "LogSoftmax")):
    register(_op, 1)(_softmax(_log, coerce_2d=True, allow_negative=False))
    register(_op, 11)(_softmax(_log, coerce_2d=True, allow_negative=True))
    register(_op, 13)(_softmax(_log, coerce_2d=False, allow_negative=True))


# --- Dropout, Compress ---------------------------------------------------------------------------


def _dropout(mask_like_input: bool, mode_inputs: bool) -> Kernel:
    """Dropout in inference mode: the input unchanged and an all-true mask.

    Versions 7 and 10 are inference-only (version 7's mask has the input
    type). From version 12 the ``training_mode`` input may ask for random
    dropout, which has no deterministic result unless the ratio is 0.
    """

    def kernel(inputs: Inputs, attrs: Attrs) -> tuple[np.ndarray, np.ndarray]:
        x = as_array(inputs[0])
        if mode_inputs and len(inputs) > 2 and inputs[2] is not None and bool(as_array(inputs[2])):
            ratio = float(as_array(inputs[1])) if len(inputs) > 1 and inputs[1] is not None else 0.5
            if ratio != 0.0:
                raise RefImplError(f"Dropout: training mode with ratio {ratio} is random")
        mask = np.ones(x.shape, dtype=x.dtype if mask_like_input else np.bool_)
        return x, mask

    return kernel


register("Dropout", 7)(_dropout(mask_like_input=True, mode_inputs=False))
register("Dropout", 10)(_dropout(mask_like_input=False, mode_inputs=False))
register("Dropout", 12, 22)(_dropout(mask_like_input=False, mode_inputs=True))


def _compress(allow_negative: bool) -> Kernel:
    """Compress; a condition shorter than the axis drops the slices beyond it."""

    def kernel(inputs: Inputs, attrs: Attrs) -> tuple[np.ndarray]:
        x, condition = as_array(inputs[0]), as_array(inputs[1])
        if condition.ndim != 1:
            raise RefImplError(f"Compress: condition must be 1-D, got shape {condition.shape}")
        axis = attrs.get("axis")
        if axis is None:
            x, axis = x.reshape(-1), 0
        else:
            axis = normalize_axis("Compress", axis, x.ndim, allow_negative=allow_negative)
        if condition.shape[0] > x.shape[axis]:
            raise RefImplError(
                f"Compress: condition longer than axis ({condition.shape[0]} > {x.shape[axis]})"
            )
        return (np.compress(condition.astype(np.bool_, copy=False), x, axis=axis),)

    return kernel


register("Compress", 9)(_compress(allow_negative=False))
register("Compress", 11, 28)(_compress(allow_negative=True))
