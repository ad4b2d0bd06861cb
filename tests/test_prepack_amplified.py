"""A weight made constant where a quantizer amplifies its op's rounding stays as the original has it.

``Identity(W)`` (a tied weight of a torch export) as MatMul's B: folding it is exact, but
onnxruntime then prepacks the constant B and sums in its kernel's blocked order; behind a
DynamicQuantizeLinear that ulp became a whole quantization step (6 elements of the check's larger
set), the check failed and blamed fold (sweep5's finding). fold and simplify's no-op removal now
decline there (``passes.ir.prepack.prepacked_amplified``); with no amplifier after the MatMul the
weight is made constant as before. Outputs are compared in onnxruntime, optimisations off and on,
at several sizes and draws.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import passes

K, N = 256, 2048
WEIGHT = np.random.default_rng(0).standard_normal((K, N)).astype(np.float32) * 0.1
LEVELS = [ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_ALL]


def _model(op: str, quantize: bool) -> onnx.ModelProto:
    """``X @ op(W)``, then (if ``quantize``) DynamicQuantizeLinear of the product."""
    weight = WEIGHT.T.copy() if op == "Transpose" else WEIGHT
    nodes = [helper.make_node(op, ["W"], ["Wi"]), helper.make_node("MatMul", ["X", "Wi"], ["Y"])]
    outputs = [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)]
    if quantize:
        nodes.append(helper.make_node("DynamicQuantizeLinear", ["Y"], ["q", "s", "z"]))
        outputs = [helper.make_tensor_value_info(n, t, None)
                   for n, t in (("q", TensorProto.UINT8), ("s", TensorProto.FLOAT), ("z", TensorProto.UINT8))]  # fmt: skip
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["b", "m", K])],
                              outputs, [numpy_helper.from_array(weight, "W")])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _session(model: onnx.ModelProto, level: ort.GraphOptimizationLevel) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    options.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _assert_same_bits(original: onnx.ModelProto, result: onnx.ModelProto) -> None:
    for level in LEVELS:
        before, after = _session(original, level), _session(result, level)
        for seed, shape in enumerate([(1, 1, K)] * 20 + [(3, 256, K), (2, 7, K)]):
            feeds = {"X": np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}
            for a, b in zip(before.run(None, feeds), after.run(None, feeds)):
                assert np.array_equal(np.atleast_1d(a).view(np.uint8), np.atleast_1d(b).view(np.uint8)), (level, shape, seed)


@pytest.mark.parametrize("op", ["Identity", "Transpose"])
def test_a_weight_before_a_quantizer_is_not_made_constant(op: str) -> None:
    original = _model(op, quantize=True)
    result = passes.optimize(original)  # checked: before, 'check failed ... introduced by pass fold'
    assert [n.op_type for n in result.graph.node] == [op, "MatMul", "DynamicQuantizeLinear"]
    assert [t.name for t in result.graph.initializer] == ["W"]
    _assert_same_bits(original, result)


def test_simplify_alone_keeps_the_identity_too() -> None:
    """The no-op rule is the other route to the same constant weight (fold not run)."""
    original = _model("Identity", quantize=True)
    result = passes.optimize(original, passes=["simplify"], check=False)
    assert [n.op_type for n in result.graph.node] == ["Identity", "MatMul", "DynamicQuantizeLinear"]
    _assert_same_bits(original, result)


@pytest.mark.parametrize("op", ["Identity", "Transpose"])
def test_without_a_quantizer_the_weight_is_made_constant(op: str) -> None:
    """The no-op case: nothing amplifies the MatMul's rounding, so the weight folds as before."""
    original = _model(op, quantize=False)
    result = passes.optimize(original, check=False)
    assert [n.op_type for n in result.graph.node] == ["MatMul"]
    for level in LEVELS:
        before, after = _session(original, level), _session(result, level)
        for shape in [(1, 1, K), (3, 256, K)]:
            feeds = {"X": np.random.default_rng(1).standard_normal(shape).astype(np.float32)}
            np.testing.assert_allclose(after.run(None, feeds)[0], before.run(None, feeds)[0], rtol=1e-4, atol=1e-5)
