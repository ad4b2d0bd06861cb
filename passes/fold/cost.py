"""Compute-cost estimates of the contractions, so that no fold computes for minutes.

Elementwise, shape and indexing kernels cost time in proportion to the bytes
they read and write, which the size policy already bounds. Contractions do
not: a 5-operand Einsum over 60x60 constants runs numpy's unoptimised loop
over 60^6 index combinations for over two minutes. Their cost, in
multiply-adds, is estimated from the input shapes and compared with a budget
of about a second on one core:

========================================  ==========  ======================================
op                                        budget      why
========================================  ==========  ======================================
MatMul, Gemm on floats                    2^33        BLAS: ~0.4 s float32, ~0.8 s float64
MatMul, Gemm on integers and booleans     2^27        numpy's own loop, ~150 M/s for int64
Einsum                                    2^30        numpy.einsum without ``optimize``
Conv, ConvTranspose (no kernel yet)       2^30        a direct loop
========================================  ==========  ======================================

A 1024x1024 by 1024x1024 float MatMul (2^30) or folding a transformer's weight
transposes (no multiply-adds at all) stays well within them.

Resize (nearest: a gather) and LayerNormalization (a few passes over X) have no
budget: their time is linear in the bytes they read and write, which the size
policy bounds (Resize's output is sized exactly beforehand, see ``size``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import onnx_ir as ir

__all__ = ["BUDGETS", "FLOAT_MATMUL_BUDGET", "cost"]

FLOAT_MATMUL_BUDGET = 1 << 33
INTEGER_MATMUL_BUDGET = 1 << 27
EINSUM_BUDGET = 1 << 30
CONV_BUDGET = 1 << 30

#: Budget per op type (MatMul and Gemm: on integers; floats get FLOAT_MATMUL_BUDGET).
BUDGETS: Mapping[str, int] = {
    "MatMul": INTEGER_MATMUL_BUDGET,
    "Gemm": INTEGER_MATMUL_BUDGET,
    "Einsum": EINSUM_BUDGET,
    "Conv": CONV_BUDGET,
    "ConvTranspose": CONV_BUDGET,
}

_BLAS_DTYPES = frozenset(
    {ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16, ir.DataType.BFLOAT16}
)

_Inputs = Sequence[ir.TensorProtocol | None]


def _dims(tensor: ir.TensorProtocol | None) -> list[int] | None:
    return None if tensor is None else [int(d) for d in tensor.shape.numpy()]


def _broadcast_max(shapes: Sequence[Sequence[int]]) -> list[int]:
    """Right-aligned broadcasting, taking the larger dim (a clash is the kernel's to report)."""
    rank = max((len(s) for s in shapes), default=0)
    return [
        max((s[axis - rank + len(s)] for s in shapes if axis - rank + len(s) >= 0), default=1)
        for axis in range(rank)
    ]


def _matmul(inputs: _Inputs, attrs: Mapping[str, Any], out: Sequence[int] | None) -> int | None:
    a, b = (_dims(t) for t in (list(inputs) + [None, None])[:2])
    if a is None or b is None or not a or not b:
        return 0  # the kernel rejects it
    rows = a[-2] if len(a) > 1 else 1
    cols = b[-1] if len(b) > 1 else 1
    batch = math.prod(_broadcast_max([a[:-2], b[:-2]]))
    return batch * rows * a[-1] * cols


def _gemm(inputs: _Inputs, attrs: Mapping[str, Any], out: Sequence[int] | None) -> int | None:
    a, b = (_dims(t) for t in (list(inputs) + [None, None])[:2])
    if a is None or b is None or len(a) != 2 or len(b) != 2:
        return 0
    rows, inner = (a[1], a[0]) if attrs.get("transA") else (a[0], a[1])
    cols = b[0] if attrs.get("transB") else b[1]
    return rows * inner * cols


def _einsum(inputs: _Inputs, attrs: Mapping[str, Any], out: Sequence[int] | None) -> int | None:
    """The iterations of numpy's unoptimised loop: every index combination, times the operands."""
    equation = attrs.get("equation")
    if isinstance(equation, bytes):
        equation = equation.decode("utf-8", "replace")
    if not isinstance(equation, str):
        return 0
    terms = equation.replace(" ", "").split("->")[0].split(",")
    if len(terms) != len(inputs) or any(t is None for t in inputs):
        return 0
    labels: dict[str, int] = {}
    middles: list[list[int]] = []
    for term, tensor in zip(terms, inputs):
        dims = _dims(tensor)
        assert dims is not None
        left, dots, right = term.partition("...")
        letters = left + right
        n_middle = len(dims) - len(letters)
        if (letters and not letters.isalpha()) or n_middle < 0 or (n_middle and not dots):
            return 0  # an invalid equation: the kernel rejects it
        for letter, dim in zip(letters, dims[: len(left)] + dims[len(dims) - len(right) :]):
            labels[letter] = max(labels.get(letter, 1), dim)
        middles.append(dims[len(left) : len(dims) - len(right)])
    return math.prod(labels.values()) * math.prod(_broadcast_max(middles)) * len(inputs)


def _conv(inputs: _Inputs, attrs: Mapping[str, Any], out: Sequence[int] | None) -> int | None:
    w = _dims(inputs[1] if len(inputs) > 1 else None)
    if w is None or len(w) < 2:
        return 0
    if out is None:
        return None
    return math.prod(out) * math.prod(w[1:])  # each output: C/group x kernel multiply-adds


def _conv_transpose(
    inputs: _Inputs, attrs: Mapping[str, Any], out: Sequence[int] | None
) -> int | None:
    x, w = _dims(inputs[0]), _dims(inputs[1] if len(inputs) > 1 else None)
    if x is None or w is None or len(w) < 2:
        return 0
    return math.prod(x) * math.prod(w[1:])  # each input element: M/group x kernel


_COSTS = {
    "MatMul": _matmul,
    "Gemm": _gemm,
    "Einsum": _einsum,
    "Conv": _conv,
    "ConvTranspose": _conv_transpose,
}


def cost(
    op_type: str, domain: str, inputs: _Inputs, attrs: Mapping[str, Any], out: Sequence[int] | None
) -> tuple[int | None, int] | None:
    """The multiply-adds evaluating the node takes and its budget; None if it has no budget.

    Args:
        op_type: The node's operator.
        domain: Its normalised domain.
        inputs: The constant input tensors.
        attrs: The attribute values.
        out: The dims of its first output as estimated (None if unknown).

    Returns:
        ``(cost, budget)``; the cost is None when it cannot be estimated.
    """
    estimator = _COSTS.get(op_type) if domain == "" else None
    if estimator is None:
        return None
    budget = BUDGETS[op_type]
    if (
        op_type in ("MatMul", "Gemm")
        and inputs
        and inputs[0] is not None
        and inputs[0].dtype in _BLAS_DTYPES
    ):
        budget = FLOAT_MATMUL_BUDGET
    return estimator(inputs, attrs, out), budget
