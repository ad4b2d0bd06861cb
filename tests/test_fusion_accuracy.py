"""How far the fused LayerNormalization and RMSNormalization are from the exact result (float64), against the
primitive ops they replace, both run in onnxruntime (docs/exactness.md, "How much a fusion changes").

On rows whose mean dwarfs their spread (1000 + 0.01·N(0,1)) the primitive LayerNorm loses digits to the
cancellation in ``x - mean`` and ``mean((x - mean)²)`` in float32, and the two differ far beyond the
check's float32 tolerance (0.027 at width 768). onnxruntime's LayerNormalization kernel accumulates in
double: it is the closer one, on every such row. RMSNormalization has no cancellation: the two stay within
an ulp of the output's scale of each other and of float64, on any rows. On normal data both are within
about 1e-7 of float64, relative to the output's largest magnitude.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import helpers
from test_simplify_standard_fusions import Net, _model, layer_norm, rms_norm

ULP = float(np.finfo(np.float32).eps)  # 2^-23: one ulp at 1.0

ROWS = {
    "N(0,1)": lambda rng, shape: rng.standard_normal(shape),
    "30·N(0,1) + 5": lambda rng, shape: 30 * rng.standard_normal(shape) + 5,
    "1000 + 0.01·N(0,1)": lambda rng, shape: 1000 + 0.01 * rng.standard_normal(shape),
    "1e4 + N(0,1)": lambda rng, shape: 1e4 + rng.standard_normal(shape),
    "1e5 + 0.1·N(0,1)": lambda rng, shape: 1e5 + 0.1 * rng.standard_normal(shape),
    "±exp(10·N(0,1))": lambda rng, shape: np.exp(10 * rng.standard_normal(shape)) * rng.choice([-1, 1], shape),
    "1e-20·N(0,1)": lambda rng, shape: 1e-20 * rng.standard_normal(shape),
}
ILL_CONDITIONED = ("1000 + 0.01·N(0,1)", "1e4 + N(0,1)", "1e5 + 0.1·N(0,1)")


def _pattern(kind: str, width: int) -> tuple[onnx.ModelProto, onnx.ModelProto, list[np.ndarray], float]:
    """The primitive model, its fused form, its vector constants (scale, bias) and eps."""
    net = Net(opset=23)
    (layer_norm if kind == "layer_norm" else rms_norm)(net, width=width)
    original = _model(net, ("batch", 8, width))
    fused, stats = helpers.simplify_checked(original)
    assert stats["fused"] == 1, stats
    constants = [numpy_helper.to_array(t) for t in original.graph.initializer]
    vectors = [c.astype(np.float64) for c in constants if c.shape == (width,)]
    eps = next(float(c) for c in constants if c.dtype == np.float32 and c.size == 1 and 0 < float(c) < 1e-3)
    return original, fused, vectors, eps


def _exact(kind: str, x: np.ndarray, vectors: list[np.ndarray], eps: float) -> np.ndarray:
    x = x.astype(np.float64)
    if kind == "layer_norm":
        scale, bias = vectors
        d = x - x.mean(-1, keepdims=True)
        return d / np.sqrt((d * d).mean(-1, keepdims=True) + eps) * scale + bias
    (scale,) = vectors
    return scale * (x / np.sqrt((x * x).mean(-1, keepdims=True) + eps))


def _errors(kind: str, width: int, rows: str) -> tuple[float, float, float]:
    """Max abs errors against float64 of the primitive ops and of the fused op, and the output's scale."""
    original, fused, vectors, eps = _pattern(kind, width)
    x = ROWS[rows](np.random.default_rng(width), (4, 8, width)).astype(np.float32)
    exact = _exact(kind, x, vectors, eps)
    primitive = helpers.ort_run(original, {"x": x})[0].astype(np.float64)
    single = helpers.ort_run(fused, {"x": x})[0].astype(np.float64)
    assert np.all(np.isfinite(exact)) and np.all(np.isfinite(primitive)) and np.all(np.isfinite(single))
    return float(np.abs(primitive - exact).max()), float(np.abs(single - exact).max()), float(np.abs(exact).max())


@pytest.mark.parametrize("width", [16, 192, 768])
@pytest.mark.parametrize("rows", ILL_CONDITIONED)
def test_the_fused_layer_norm_is_the_closer_one_on_ill_conditioned_rows(width: int, rows: str) -> None:
    primitive, fused, _ = _errors("layer_norm", width, rows)
    assert fused <= primitive, (fused, primitive)
    assert primitive > 1e-4  # the rows do cancel: the primitive ops are far beyond rounding there


@pytest.mark.parametrize("width", [16, 192, 768])
@pytest.mark.parametrize("rows", sorted(ROWS))
def test_the_fused_rms_norm_is_as_close_as_the_primitive_ops(width: int, rows: str) -> None:
    primitive, fused, scale = _errors("rms_norm", width, rows)
    assert fused <= primitive + ULP * scale, (fused, primitive, scale)
    assert fused <= 8 * ULP * scale  # RMSNorm has no cancellation: a few ulps at the output's scale


@pytest.mark.parametrize("width", [16, 192, 768])
@pytest.mark.parametrize("rows", ["N(0,1)", "30·N(0,1) + 5"])
def test_on_normal_rows_both_layer_norms_are_a_few_ulps_from_float64(width: int, rows: str) -> None:
    primitive, fused, scale = _errors("layer_norm", width, rows)
    assert max(primitive, fused) <= 8 * ULP * scale, (primitive, fused, scale)
