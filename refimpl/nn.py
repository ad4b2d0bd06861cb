"""Neural-network layers that fold: Softmax, LogSoftmax, Dropout in inference mode and
LayerNormalization.

Softmax and LogSoftmax compute every float type below float64 in float64 and round once, so
their results are (nearly always) correctly rounded. LayerNormalization follows its schema's
function body, whose every step rounds to float32 (the stash type).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from refimpl._common import (
    Attrs,
    Inputs,
    as_array,
    broadcasts_to,
    normalize_axis,
    scalar,
)
from refimpl._dtypes import F64, DTypes, checked, wide_type
from refimpl._errors import RefImplError, UndefinedResultError
from refimpl._registry import Kernel, Typed, register

# --- Softmax, LogSoftmax ------------------------------------------------------------------------


def _softmax(log: bool, coerce_2d: bool, allow_negative: bool) -> Typed:
    """Softmax or LogSoftmax.

    Before version 13 the input is coerced to 2-D at ``axis`` (dims before it
    form the rows) and normalised over each row, i.e. over *all* dims from
    ``axis`` on; from version 13 it is normalised over the single ``axis``.
    """
    op = "LogSoftmax" if log else "Softmax"

    def make(types: DTypes) -> Kernel:
        allowed = types["T"]

        def kernel(inputs: Inputs, attrs: Attrs) -> tuple[np.ndarray]:
            x = checked(inputs[0], allowed)
            axis = normalize_axis(op, attrs["axis"], x.ndim, allow_negative=allow_negative)
            if x.size == 0:
                return (x.copy(),)
            y = x.astype(wide_type(x.dtype), copy=False)
            if coerce_2d:
                y = y.reshape(math.prod(x.shape[:axis]), -1)
                axis = 1
            shifted = y - y.max(axis=axis, keepdims=True)
            exp = np.exp(shifted)
            total = exp.sum(axis=axis, keepdims=True)
            y = shifted - np.log(total) if log else exp / total
            return (y.reshape(x.shape).astype(x.dtype, copy=False),)

        return kernel

    return Typed(make)


for _log, _op in ((False, "Softmax"), (True, "LogSoftmax")):
    register(_op, 1, 1)(_softmax(_log, coerce_2d=True, allow_negative=False))
    register(_op, 11, 11)(_softmax(_log, coerce_2d=True, allow_negative=True))
    register(_op, 13)(_softmax(_log, coerce_2d=False, allow_negative=True))


# --- Dropout -----------------------------------------------------------------------------------


def _dropout(mask_like_input: bool, mode_inputs: bool) -> Kernel:
    """Dropout in inference mode: the input unchanged and an all-true mask.

    Versions 7 and 10 are inference-only (version 7's mask has the input
    type). From version 12 the ``training_mode`` input may ask for random
    dropout, which has no deterministic result unless the ratio is 0.
    """

    def kernel(inputs: Inputs, attrs: Attrs) -> tuple[np.ndarray, np.ndarray]:
        x = as_array(inputs[0])
        training = len(inputs) > 2 and inputs[2] is not None
        if mode_inputs and training and scalar("Dropout", "training_mode", inputs[2]):
            given = len(inputs) > 1 and inputs[1] is not None
            ratio = float(scalar("Dropout", "ratio", inputs[1])) if given else 0.5
            if ratio != 0.0:
                raise RefImplError(f"Dropout: training mode with ratio {ratio} is random")
        mask = np.ones(x.shape, dtype=x.dtype if mask_like_input else np.bool_)
        return x, mask

    return kernel


register("Dropout", 7, 7)(_dropout(mask_like_input=True, mode_inputs=False))
register("Dropout", 10, 10)(_dropout(mask_like_input=False, mode_inputs=False))
register("Dropout", 12)(_dropout(mask_like_input=False, mode_inputs=True))


# --- LayerNormalization --------------------------------------------------------------------------

_STASH_FLOAT = 1  # TensorProto.FLOAT
_BFLOAT16 = 16
# How far onnxruntime's statistics may lie from the function body's, relative to StdDev (the
# mean) and to Var + epsilon: Y then differs by at most about 2**-15 of its scale (3e-5).
_AGREEMENT = 2.0**-14


def _layer_normalization(types: DTypes) -> Kernel:
    """LayerNormalization-17, as the schema's function body computes it.

    Stage one runs in the stash type, float32 for ``stash_type=1`` (the default): X is cast to
    float32 and flattened at ``axis`` into rows, then, each step rounded to float32 as the body's
    nodes are (ReduceMean correctly rounded, as refimpl's)::

        Mean = ReduceMean(X); Var = ReduceMean(X * X) - Mean * Mean
        StdDev = Sqrt(Var + epsilon); Normalized = (X - Mean) / StdDev

    Stage two runs in X's type: ``Y = Cast<T>(Normalized) * Scale + B`` (each op rounded once
    to T). ``Mean`` and ``InvStdDev = 1 / StdDev`` are float32, of shape X's with the dims from
    ``axis`` on set to 1. Scale and B broadcast unidirectionally to X, as the schema's text says
    (the body's Flatten only covers the common case, Scale holding one value per normalised
    element, where both agree); onnxruntime broadcasts likewise.

    onnxruntime computes the same E[x^2] - E[x]^2 but accumulates both sums sequentially in
    float32 (float16 too), and computes stage two in float32 before one rounding to float16:
    a few ulp apart from the body, unless the subtraction cancels. The kernel runs those running
    sums too (a cumulative float32 sum is the same loop) and declines where onnxruntime's mean
    or Var + epsilon lie further from the body's than ``_AGREEMENT`` (relative to StdDev and to
    Var + epsilon), or where Var + epsilon is not positive and finite: there no two float32
    evaluations agree, and a folded value would not be what onnxruntime computes.

    Declined (RefImplError), because no runtime computes what the spec says:
      * float64 X: the spec runs stage one in float32 (stash_type=1; U has no double), while
        onnxruntime and the onnx reference compute in double: the results differ by about
        1e-7, beyond float64 rounding.
      * stash_type=16 (bfloat16): onnxruntime has no kernel and the onnx reference raises.
    """
    allowed = types["T"]

    def kernel(inputs: Inputs, attrs: Attrs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        x = checked(inputs[0], allowed)
        scale = checked(inputs[1], allowed, "Scale")
        bias = None if len(inputs) < 3 or inputs[2] is None else checked(inputs[2], allowed, "B")
        for name, t in (("Scale", scale), ("B", bias)):
            if t is not None and t.dtype != x.dtype:
                raise RefImplError(f"LayerNormalization: {name} is {t.dtype}, X is {x.dtype}")
            if t is not None and not broadcasts_to(t.shape, x.shape):
                raise RefImplError(
                    f"LayerNormalization: {name} of shape {t.shape} does not broadcast to {x.shape}"
                )
        stash = int(attrs["stash_type"])
        if stash == _BFLOAT16:
            raise RefImplError("LayerNormalization: stash_type=16 (bfloat16) is not implemented")
        if stash != _STASH_FLOAT:
            raise RefImplError(f"LayerNormalization: stash_type {stash} is not float or bfloat16")
        if x.dtype == F64:
            raise RefImplError(
                "LayerNormalization: float64 X with stash_type=1: the spec computes in float32, "
                "onnxruntime and the onnx reference in double"
            )
        if x.ndim == 0:
            raise RefImplError("LayerNormalization: X must have at least one dimension")
        axis = normalize_axis("LayerNormalization", attrs["axis"], x.ndim)
        reduced_shape = x.shape[:axis] + (1,) * (x.ndim - axis)
        rows, cols = math.prod(x.shape[:axis]), math.prod(x.shape[axis:])
        if cols == 0:
            raise UndefinedResultError("LayerNormalization: the mean of an empty set")
        f32 = np.float32
        epsilon = f32(attrs["epsilon"])
        with np.errstate(all="ignore"):
            xu = x.reshape(rows, cols).astype(f32)
            mean = (xu.astype(F64).sum(axis=1, keepdims=True) / cols).astype(f32)
            square = xu * xu
            mean_of_square = (square.astype(F64).sum(axis=1, keepdims=True) / cols).astype(f32)
            var = mean_of_square - mean * mean
            var_eps = var + epsilon
            std_dev = np.sqrt(var_eps)
            if rows and not _agrees_with_running_sums(xu, mean, var_eps, std_dev, epsilon):
                raise RefImplError(
                    "LayerNormalization: onnxruntime's float32 running sums and the spec's "
                    "ReduceMean disagree on the mean or variance (E[x^2] - E[x]^2 cancels, or "
                    "is not positive and finite)"
                )
            normalized = ((xu - mean) / std_dev).reshape(x.shape)
            y = _in_type(_in_type(normalized, x.dtype) * _wide(scale), x.dtype)
            if bias is not None:
                y = _in_type(_wide(y) + _wide(bias), x.dtype)
            inv_std_dev = f32(1) / std_dev
        return y, mean.reshape(reduced_shape), inv_std_dev.reshape(reduced_shape)

    return kernel


def _agrees_with_running_sums(
    xu: np.ndarray, mean: np.ndarray, var_eps: np.ndarray, std_dev: np.ndarray, epsilon: Any
) -> bool:
    """Whether onnxruntime's sequential float32 statistics are close to the body's (rows)."""
    cols = np.float32(xu.shape[1])
    run_mean = np.cumsum(xu, axis=1, dtype=np.float32)[:, -1:] / cols
    run_square = np.cumsum(xu * xu, axis=1, dtype=np.float32)[:, -1:] / cols
    run_var_eps = run_square - run_mean * run_mean + epsilon
    v, r = var_eps.astype(F64), run_var_eps.astype(F64)
    ok = np.isfinite(v) & (v > 0) & np.isfinite(r) & (r > 0)
    ok &= np.abs(r - v) <= _AGREEMENT * v
    ok &= np.abs(run_mean.astype(F64) - mean) <= _AGREEMENT * std_dev
    return bool(np.all(ok))


def _wide(a: np.ndarray) -> np.ndarray:
    """float16/bfloat16 as float32, where their products and sums are exact (or round once)."""
    return a.astype(np.float32) if a.dtype != np.float32 else a


def _in_type(a: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return a if a.dtype == dtype else a.astype(dtype)


register("LayerNormalization", 17)(Typed(_layer_normalization))
