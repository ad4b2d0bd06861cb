"""The fusions keep NaN, infinities and the sign of zero (issue #29, item 4).

A fusion may change rounding only. Each case builds ``tail(Conv(x, W, b))`` (or a
Gemm, or a ConvTranspose) in the main graph and in an If branch, runs the simplify
pass, and runs original and result in onnxruntime (its optimisations off) on inputs
made of ±0, ±1, ±inf and NaN: NaN in the same places, the same infinities, the
same sign of every zero, and finite values equal within rounding. Where the
weights make a fusion inexact, the fusion is declined with its reason logged; the
positive cases show the guards do not decline what is exact.
"""

from __future__ import annotations

import itertools
import pathlib
import logging

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import helper, numpy_helper

import helpers
from passes.simplify import SimplifyPass

LOGGER = "passes.simplify"
EDGES = [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan]


def _edge_inputs(channels: int, shape_tail: tuple[int, ...] = (1, 1)) -> list[np.ndarray]:
    """Every combination of edge values over ``channels`` input channels (batched into one tensor each)."""
    rows = np.array(list(itertools.product(EDGES, repeat=channels)), dtype=np.float32)
    return [rows.reshape(len(rows), channels, *shape_tail)]


def _model(layer: str, tail: str, consts: dict[str, np.ndarray], *, W: np.ndarray, b: np.ndarray | None,
           branch: bool, attrs: dict | None = None) -> onnx.ModelProto:  # fmt: skip
    """``tail(layer(x, W, b), consts...)``; constants are initializers, or Constant nodes in an If branch."""
    values = {"W": W, **({} if b is None else {"b": b}), **consts}
    nodes = [helper.make_node(layer, ["x", "W", *(["b"] if b is not None else [])], ["c"],
                              **({"transB": 1} if layer == "Gemm" else {}))]  # fmt: skip
    nodes.append(helper.make_node(tail, ["c", *consts], ["y"], **(attrs or {})))
    tensors = [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in values.items()]
    rank = 2 if layer == "Gemm" else 4
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [None] * rank)
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [None] * rank)
    if not branch:
        graph = helper.make_graph(nodes, "g", [x], [y], initializer=tensors)
    else:
        constants = [helper.make_node("Constant", [], [t.name], value=t) for t in tensors]
        body = helper.make_graph(constants + nodes, "then", [], [y])
        other = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "else", [], [y])
        cond = helper.make_tensor_value_info("cond", onnx.TensorProto.BOOL, [])
        graph = helper.make_graph([helper.make_node("If", ["cond"], ["y"], then_branch=body, else_branch=other)],
                                  "g", [cond, x], [y])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _simplify(proto: onnx.ModelProto) -> tuple[onnx.ModelProto, dict]:
    model = ir.serde.deserialize_model(proto)
    pass_ = SimplifyPass()
    pass_(model)
    result = ir.serde.serialize_model(model)
    onnx.checker.check_model(result, full_check=True)
    return result, pass_.stats


def assert_same_specials(expected: np.ndarray, actual: np.ndarray, rtol: float = 0.0) -> None:
    """NaN in the same places, the same infinities, the same sign of every zero; finite values within ``rtol``."""
    assert expected.shape == actual.shape and expected.dtype == actual.dtype
    nan = np.isnan(expected)
    np.testing.assert_array_equal(nan, np.isnan(actual))
    np.testing.assert_array_equal(np.isinf(expected), np.isinf(actual))
    zero = expected == 0
    np.testing.assert_array_equal(zero, actual == 0)
    np.testing.assert_array_equal(np.signbit(expected[zero]), np.signbit(actual[zero]))
    finite = np.isfinite(expected)
    np.testing.assert_allclose(actual[~finite & ~nan], expected[~finite & ~nan])
    np.testing.assert_allclose(actual[finite], expected[finite], rtol=rtol, atol=0)


def _run_both(original: onnx.ModelProto, result: onnx.ModelProto, inputs: list[np.ndarray], rtol: float) -> None:
    branch = any(i.name == "cond" for i in original.graph.input)
    for x in inputs:
        feeds = {"x": x, **({"cond": np.array(True)} if branch else {})}
        expected, actual = helpers.ort_run(original, feeds)[0], helpers.ort_run(result, feeds)[0]
        if rtol == 0:
            np.testing.assert_array_equal(expected.view(np.uint32), actual.view(np.uint32))
        else:
            assert_same_specials(expected, actual, rtol)


def _check(proto: onnx.ModelProto, caplog, *, fused: bool, reason: str = "", inputs=None) -> None:
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        result, stats = _simplify(proto)
    assert stats["fused"] == (1 if fused else 0), (stats, caplog.text)
    if reason:
        assert reason in caplog.text, caplog.text
    _run_both(proto, result, inputs or _edge_inputs(2), rtol=1e-6 if fused else 0.0)


W2 = np.array([[[[1.0]], [[-1.0]]], [[[0.5]], [[2.0]]]], np.float32)  # 2 output channels, 2 input channels
BRANCH = pytest.mark.parametrize("branch", [False, True], ids=["main", "if_branch"])


# --- Mul -----------------------------------------------------------------------------------------


@BRANCH
@pytest.mark.parametrize("scale, reason", [
    ([0.0, 2.0], "a zero scale"),
    ([-0.0, 2.0], "a zero scale"),
    ([-2.0, 2.0], "a negative scale"),
    ([1e-40, 2.0], "a subnormal scale"),
    ([2.0, 3e38], "a fused weight overflows"),
])  # fmt: skip
def test_mul_by_a_scale_the_weights_cannot_hold_is_not_fused(scale, reason, branch, caplog) -> None:
    """Mul(Conv, 0) keeps -0 where the Conv gives -1 and NaN where it gives inf; W * 0 keeps neither."""
    proto = _model("Conv", "Mul", {"k": np.array(scale, np.float32).reshape(1, 2, 1, 1)}, W=W2,
                   b=np.array([1.0, -0.0], np.float32), branch=branch)  # fmt: skip
    _check(proto, caplog, fused=False, reason=reason)


@BRANCH
def test_mul_by_a_positive_scale_fuses_and_keeps_the_specials(branch, caplog) -> None:
    proto = _model("Conv", "Mul", {"k": np.array([3.0, 0.25], np.float32).reshape(1, 2, 1, 1)}, W=W2,
                   b=np.array([1.0, -0.0], np.float32), branch=branch)  # fmt: skip
    _check(proto, caplog, fused=True)


def test_a_mul_bias_product_that_overflows_is_not_fused(caplog) -> None:
    proto = _model("Conv", "Mul", {"k": np.array([1e30, 2.0], np.float32).reshape(1, 2, 1, 1)},
                   W=W2 * 1e-30, b=np.array([1e10, 1.0], np.float32), branch=False)  # fmt: skip
    _check(proto, caplog, fused=False, reason="the fused bias is not finite")


# --- Add -----------------------------------------------------------------------------------------


@BRANCH
def test_an_add_whose_bias_overflows_is_not_fused(branch, caplog) -> None:
    proto = _model("Conv", "Add", {"k": np.array([3e38, 1.0], np.float32).reshape(1, 2, 1, 1)}, W=W2,
                   b=np.array([3e38, 1.0], np.float32), branch=branch)  # fmt: skip
    _check(proto, caplog, fused=False, reason="the fused bias is not finite")


@BRANCH
@pytest.mark.parametrize("bias", [None, [0.0, -0.0], [-0.0, 1.0]], ids=["no_bias", "zeros", "minus_zero"])
@pytest.mark.parametrize("k", [0.0, -0.0])
def test_an_add_of_zeros_fuses_and_keeps_the_sign_of_zero(k, bias, branch, caplog) -> None:
    """An absent bias is -0 in the sum (x + -0 is x): adding a -0 channel to it keeps what the Conv gives."""
    proto = _model("Conv", "Add", {"k": np.array([k, 2.0], np.float32).reshape(1, 2, 1, 1)}, W=W2,
                   b=None if bias is None else np.array(bias, np.float32), branch=branch)  # fmt: skip
    _check(proto, caplog, fused=True)


# --- BatchNormalization ----------------------------------------------------------------------------


def _bn(layer: str, gamma, beta, mean, var, epsilon: float, *, branch: bool, b=None) -> onnx.ModelProto:
    consts = {name: np.array(v, np.float32) for name, v in
              (("gamma", gamma), ("beta", beta), ("mean", mean), ("var", var))}  # fmt: skip
    weight = {"Conv": W2, "ConvTranspose": W2.transpose(1, 0, 2, 3), "Gemm": W2.reshape(2, 2)}[layer]
    return _model(layer, "BatchNormalization", consts, W=weight, b=None if b is None else np.array(b, np.float32),
                  branch=branch, attrs={"epsilon": epsilon})  # fmt: skip


def _bn_inputs(layer: str) -> list[np.ndarray]:
    return _edge_inputs(2, () if layer == "Gemm" else (1, 1))


LAYERS = pytest.mark.parametrize("layer", ["Conv", "ConvTranspose", "Gemm"])


@BRANCH
@LAYERS
def test_a_bn_scale_that_overflows_float32_is_not_fused(layer, branch, caplog) -> None:
    """gamma 3e38 over sqrt(1e-45 + 1e-45): onnxruntime's scale is inf, so 0 * inf is NaN; fused, W * inf is ±inf."""
    proto = _bn(layer, [3e38, 1.0], [0.0, 0.0], [0.0, 0.0], [1e-45, 1.0], 1e-45, branch=branch)
    _check(proto, caplog, fused=False, reason="the scale is not finite in float32", inputs=_bn_inputs(layer))


@BRANCH
@LAYERS
def test_a_zero_bn_scale_is_not_fused(layer, branch, caplog) -> None:
    proto = _bn(layer, [0.0, 1.0], [1.0, 0.5], [0.5, 0.0], [1.0, 1.0], 1e-5, branch=branch)
    _check(proto, caplog, fused=False, reason="a zero scale", inputs=_bn_inputs(layer))


@BRANCH
@LAYERS
def test_a_negative_bn_scale_with_no_shift_is_not_fused(layer, branch, caplog) -> None:
    """gamma < 0, mean -0 and beta -0: the original gives -0 where the op gives +0; the fused op cannot."""
    proto = _bn(layer, [-1.0, 1.0], [-0.0, 0.0], [-0.0, 0.0], [1.0, 1.0], 0.0, branch=branch)
    _check(proto, caplog, fused=False, reason="a negative scale", inputs=_bn_inputs(layer))


@BRANCH
@LAYERS
def test_a_negative_bn_scale_with_a_shift_fuses_and_keeps_the_specials(layer, branch, caplog) -> None:
    proto = _bn(layer, [-1.5, 2.0], [0.25, -0.0], [-0.0, 0.0], [1.0, 4.0], 0.0, branch=branch, b=[1.0, -0.0])
    _check(proto, caplog, fused=True, inputs=_bn_inputs(layer))


def test_a_bn_mean_times_scale_that_overflows_is_not_fused(caplog) -> None:
    proto = _bn("Conv", [1e30, 1.0], [0.0, 0.0], [1e30, 0.0], [1.0, 1.0], 0.0, branch=False)
    _check(proto, caplog, fused=False, reason="mean * scale is not finite")


def test_a_subnormal_variance_with_a_moderate_gamma_still_fuses(caplog) -> None:
    """The guard looks at the folded scale: 1 / sqrt(2e-45) * 1e-20 is an ordinary float."""
    proto = _bn("Conv", [1e-20, 1.0], [0.5, 0.5], [0.0, 0.0], [1e-45, 1.0], 1e-45, branch=False)
    _check(proto, caplog, fused=True)


# --- Shape-15 start/end --------------------------------------------------------------------------


def _shape_expand(start: int | None, end: int | None, *, branch: bool) -> onnx.ModelProto:
    """``Neg(Expand(x, Shape(y, start, end)))`` with ``x`` [b, c] and ``y`` [a, b, c] (dynamic: nothing folds)."""
    attrs = {k: v for k, v in (("start", start), ("end", end)) if v is not None}
    nodes = [helper.make_node("Shape", ["y"], ["s"], **attrs), helper.make_node("Expand", ["x", "s"], ["e"]),
             helper.make_node("Neg", ["e"], ["z"])]  # the Expand's output is not a graph output
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["b", "c"])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["a", "b", "c"])
    z = helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, None if branch else [None] * 3)
    if branch:
        body = helper.make_graph(nodes, "then", [], [z])
        other = helper.make_graph([helper.make_node("Expand", ["x", "one"], ["z"])], "else", [], [z],
                                  initializer=[numpy_helper.from_array(np.ones(3, np.int64), "one")])  # fmt: skip
        cond = helper.make_tensor_value_info("cond", onnx.TensorProto.BOOL, [])
        nodes = [helper.make_node("If", ["cond"], ["z"], then_branch=body, else_branch=other)]
        inputs = [cond, x, y]
    else:
        inputs = [x, y]
    z = helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [None] * 3)
    graph = helper.make_graph(nodes, "g", inputs, [z])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@BRANCH
@pytest.mark.parametrize("start, end", [(-5, None), (-3, None), (-5, 10), (-4, 3), (None, 10)])
def test_shape_start_and_end_are_clamped_as_onnx_does(start, end, branch) -> None:
    """``Shape(y, start=-5)`` of a rank-3 ``y`` is all of y's dims (ONNX clamps), not ``dims[-2:]`` (Python):
    the Expand adds an axis and stays."""
    proto = _shape_expand(start, end, branch=branch)
    result, _ = _simplify(proto)
    feeds = {"x": np.arange(12, dtype=np.float32).reshape(3, 4), "y": np.zeros((2, 3, 4), np.float32)}
    if branch:
        feeds["cond"] = np.array(True)
    expected, actual = helpers.ort_run(proto, feeds)[0], helpers.ort_run(result, feeds)[0]
    assert expected.shape == actual.shape
    np.testing.assert_array_equal(expected.view(np.uint32), actual.view(np.uint32))
    assert "Expand" in helpers.ops_recursive(result)


def test_a_shape_of_the_trailing_dims_still_makes_the_expand_a_no_op() -> None:
    """``Shape(y, start=-2)`` is [b, c], x's own dims: the Expand goes (and the output is the same)."""
    proto = _shape_expand(-2, None, branch=False)
    proto.graph.output[0].type.tensor_type.shape.ClearField("dim")
    proto.graph.output[0].type.tensor_type.shape.dim.add()
    proto.graph.output[0].type.tensor_type.shape.dim.add()
    result, stats = _simplify(proto)
    assert "Expand" not in helpers.ops_recursive(result), stats
    feeds = {"x": np.arange(12, dtype=np.float32).reshape(3, 4), "y": np.zeros((2, 3, 4), np.float32)}
    np.testing.assert_array_equal(helpers.ort_run(proto, feeds)[0], helpers.ort_run(result, feeds)[0])


# --- weights read with checked reads -------------------------------------------------------------

_SHRINK = """
import os, sys
import onnx_ir as ir
from passes.simplify import SimplifyPass
model = ir.load(sys.argv[1])
SimplifyPass()(model)  # reads every weight (the fusion is declined: a negative scale, no shift)
os.truncate(sys.argv[2], 0)
try:
    SimplifyPass()(model)  # the pipeline repeats simplify: the same weights are read again
except Exception as e:
    print(type(e).__name__, e)
"""


def test_a_data_file_that_shrinks_during_the_run_is_an_input_error_not_a_sigbus(tmp_path) -> None:
    """Weights are read as fold reads them (``tensors.read_tensor``), never through a memory map: a mapped page
    of a truncated file would kill the process with SIGBUS."""
    import os
    import subprocess
    import sys

    proto = _bn("Conv", [-1.0, 1.0], [-0.0, 0.0], [-0.0, 0.0], [1.0, 1.0], 0.0, branch=False)
    path = tmp_path / "m.onnx"
    onnx.save_model(proto, path, save_as_external_data=True, all_tensors_to_one_file=True, location="m.data",
                    size_threshold=0)  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(pathlib.Path(__file__).parent.parent),
                                                        os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    run = subprocess.run([sys.executable, "-c", _SHRINK, str(path), str(tmp_path / "m.data")],
                         capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
    assert run.returncode == 0, (run.returncode, run.stderr[-2000:])
    assert run.stdout.startswith("InputError") and "truncated" in run.stdout, run.stdout


@pytest.mark.parametrize("gamma", [1.0, -2.0])
@pytest.mark.parametrize("beta", [0.0, -0.0, 1.0])
@pytest.mark.parametrize("mean", [0.0, -0.0])
@pytest.mark.parametrize("bias", [None, -0.0, 1.0])
def test_bn_fusion_over_signed_zeros_fuses_only_what_keeps_the_specials(gamma, beta, mean, bias, caplog) -> None:
    """Whatever the guards decide for these parameters, the result keeps NaN, infinities and signed zeros."""
    proto = _bn("Conv", [gamma, 1.0], [beta, 0.5], [mean, 0.0], [1.0, 1.0], 0.0, branch=False,
                b=None if bias is None else [bias, 1.0])  # fmt: skip
    result, stats = _simplify(proto)
    for x in _edge_inputs(2):
        expected, actual = helpers.ort_run(proto, {"x": x})[0], helpers.ort_run(result, {"x": x})[0]
        assert_same_specials(expected, actual, 1e-6 if stats["fused"] else 0.0)
    if gamma > 0:
        assert stats["fused"] == 1, stats  # a positive scale always fuses
