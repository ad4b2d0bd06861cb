"""A no-op between a DequantizeLinear and a QuantizeLinear stays (sweep5's finding).

``Q -> DQ -> Reshape(no-op) -> Q -> DQ -> MatMul -> Q -> DQ`` is exact without the Reshape in
ONNX, and onnxruntime with its optimisations off computes both bit for bit alike. With them on
(``ORT_ENABLE_ALL``, its default), it removes a DQ -> Q pair that joins two Q/DQ pairs and keeps
one scale for both: the requantization's rounding is gone, and the rewritten model differed from
the original by up to two quantization steps in 37% of the elements (the Reshape of the main
graph below; onnxruntime removes an Identity itself, and leaves an If branch's Q/DQ alone, so
those cases show the guard holds there and changes nothing). The no-op stays; where no
QuantizeLinear follows, it goes as before. Outputs are compared in onnxruntime at both levels,
at three sizes, in the main graph and in an If branch.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import passes

WIDTH = 32
RNG = np.random.default_rng(0)
WEIGHT = RNG.integers(-127, 127, (WIDTH, WIDTH)).astype(np.int8)
LEVELS = [ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_ALL]


def _initializers() -> list[onnx.TensorProto]:
    arrays = {"s1": np.float32(0.05), "z1": np.uint8(128), "s2": np.float32(0.043), "z2": np.uint8(120),
              "Wq": WEIGHT, "sw": np.float32(0.01), "zw": np.int8(0), "s3": np.float32(0.2), "z3": np.uint8(128),
              "target": np.array([0, 0, WIDTH], np.int64)}  # fmt: skip
    return [numpy_helper.from_array(np.asarray(v), k) for k, v in arrays.items()]


def _chain(noop: str, requantize: bool) -> list[onnx.NodeProto]:
    """X quantized, ``noop`` of its dequantized value, then (if ``requantize``) Q/DQ at another scale, a MatMul."""
    nodes = [helper.make_node("QuantizeLinear", ["X", "s1", "z1"], ["q1"]),
             helper.make_node("DequantizeLinear", ["q1", "s1", "z1"], ["d1"]),
             helper.make_node(noop, ["d1", "target"] if noop == "Reshape" else ["d1"], ["r"])]  # fmt: skip
    into = "r"
    if requantize:
        nodes += [helper.make_node("QuantizeLinear", ["r", "s2", "z2"], ["q2"]),
                  helper.make_node("DequantizeLinear", ["q2", "s2", "z2"], ["d2"])]  # fmt: skip
        into = "d2"
    return nodes + [helper.make_node("DequantizeLinear", ["Wq", "sw", "zw"], ["wd"]),
                    helper.make_node("MatMul", [into, "wd"], ["m"]),
                    helper.make_node("QuantizeLinear", ["m", "s3", "z3"], ["q3"]),
                    helper.make_node("DequantizeLinear", ["q3", "s3", "z3"], ["Y"])]  # fmt: skip


def _model(noop: str, *, requantize: bool = True, branch: bool = False) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["b", "s", WIDTH])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)
    nodes = _chain(noop, requantize)
    if not branch:
        graph = helper.make_graph(nodes, "g", [x], [y], _initializers())
    else:  # the chain in an If branch, its constants as Constant nodes there
        constants = [helper.make_node("Constant", [], [t.name], value=t) for t in _initializers()]
        then = helper.make_graph(constants + nodes, "then", [], [y])
        other = helper.make_graph([helper.make_node("Identity", ["X"], ["Y"])], "else", [], [y])
        cond = helper.make_tensor_value_info("cond", TensorProto.BOOL, [])
        graph = helper.make_graph([helper.make_node("If", ["cond"], ["Y"], then_branch=then, else_branch=other)],
                                  "g", [cond, x], [y])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _ops(model: onnx.ModelProto, branch: bool) -> list[str]:
    """The op types of the graph that holds the chain (the If's then branch, its Constants left out)."""
    if not branch:
        return [n.op_type for n in model.graph.node]
    (node,) = model.graph.node
    then = next(a.g for a in node.attribute if a.name == "then_branch")
    return [n.op_type for n in then.node if n.op_type != "Constant"]


def _outputs(model: onnx.ModelProto, level: ort.GraphOptimizationLevel, feeds: dict) -> np.ndarray:
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def _assert_same_in_onnxruntime(original: onnx.ModelProto, result: onnx.ModelProto, branch: bool) -> None:
    """Bit for bit, with onnxruntime's optimisations off and on, at two sizes and several draws."""
    for level in LEVELS:
        for seed, (batch, seq) in enumerate([(1, 1), (2, 8), (3, 40)]):
            feeds = {"X": np.random.default_rng(seed).standard_normal((batch, seq, WIDTH)).astype(np.float32) * 2}
            if branch:
                feeds["cond"] = np.array(True)
            expected, actual = _outputs(original, level, feeds), _outputs(result, level, feeds)
            assert np.array_equal(expected.view(np.uint32), actual.view(np.uint32)), (level, batch, seq)


@pytest.mark.parametrize("branch", [False, True])
@pytest.mark.parametrize("noop", ["Reshape", "Identity"])
def test_a_noop_between_dequantize_and_quantize_stays(noop: str, branch: bool) -> None:
    original = _model(noop, branch=branch)
    result = passes.optimize(original, passes=["simplify"], check=False)
    ops = _ops(result, branch)
    assert noop in ops, ops
    assert ops.index("DequantizeLinear") + 1 == ops.index(noop) and ops[ops.index(noop) + 1] == "QuantizeLinear"
    _assert_same_in_onnxruntime(original, result, branch)


@pytest.mark.parametrize("branch", [False, True])
def test_a_noop_before_the_matmul_still_goes(branch: bool) -> None:
    """The no-op case of the guard: no QuantizeLinear after the Reshape, which goes (exact at both levels)."""
    original = _model("Reshape", requantize=False, branch=branch)
    result = passes.optimize(original, passes=["simplify"], check=False)
    assert "Reshape" not in _ops(result, branch)
    _assert_same_in_onnxruntime(original, result, branch)
