"""fold takes onnxruntime's value where refimpl leaves it to the runtime (passes/fold/decide.py).

The pattern is a Swin-v2 continuous-position-bias MLP: a constant coordinate table
through MatMul, Relu, MatMul, Sigmoid. A row of -0 coordinates makes every term of
some first-MatMul outputs -0: IEEE order gives -0, onnxruntime's MatMul (its
accumulator starts at +0) gives +0, so refimpl declines the value
(``RuntimeChoiceError``) and onnxruntime's evaluation decides it.
"""

from __future__ import annotations

import json

import hypothesis.strategies as st
import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from onnx import TensorProto, helper, numpy_helper

import refimpl
from helpers import ort_run
from passes.fold import ConstantFoldingPass, decide

F32 = TensorProto.FLOAT


def cpb_nodes(prefix: str = "") -> list[onnx.NodeProto]:
    """table -> MatMul(w1) -> m1 -> Relu -> MatMul(w2) -> Sigmoid -> s; also 1 / m1 (the sign of a zero shows)."""
    p = prefix
    return [
        helper.make_node("MatMul", ["table", "w1"], [f"{p}m1"]),
        helper.make_node("Relu", [f"{p}m1"], [f"{p}r"]),
        helper.make_node("MatMul", [f"{p}r", "w2"], [f"{p}m2"]),
        helper.make_node("Sigmoid", [f"{p}m2"], [f"{p}s"]),
        helper.make_node("Mul", ["x", f"{p}s"], [f"{p}y"]),
        helper.make_node("Div", ["x1", f"{p}m1"], [f"{p}z"]),
    ]


def weights(table: np.ndarray, w1: np.ndarray, w2: np.ndarray) -> list[onnx.TensorProto]:
    return [numpy_helper.from_array(table, "table"), numpy_helper.from_array(w1, "w1"),
            numpy_helper.from_array(w2, "w2")]  # fmt: skip


def arrays(seed: int = 0, rows: int = 6, hidden: int = 8) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    table = rng.standard_normal((rows, 2)).astype(np.float32)
    table[0] = [-0.0, -0.0]  # with a positive weight column: every term -0
    table[1] = [0.0, -0.0]
    w1 = rng.standard_normal((2, hidden)).astype(np.float32)
    w1[:, 0] = np.abs(w1[:, 0]) + 0.5
    w2 = rng.standard_normal((hidden, 3)).astype(np.float32)
    return table, w1, w2


def cpb_model(table: np.ndarray, w1: np.ndarray, w2: np.ndarray, expose: bool = False) -> onnx.ModelProto:
    rows, hidden = table.shape[0], w1.shape[1]
    inputs = [helper.make_tensor_value_info("x", F32, [rows, 3]), helper.make_tensor_value_info("x1", F32, [rows, hidden])]
    outputs = [helper.make_tensor_value_info("y", F32, [rows, 3]), helper.make_tensor_value_info("z", F32, [rows, hidden])]
    if expose:  # the folded values, as onnxruntime computes them in the original
        outputs += [helper.make_tensor_value_info("m1", F32, [rows, hidden]), helper.make_tensor_value_info("s", F32, [rows, 3]),
                    helper.make_tensor_value_info("r", F32, [rows, hidden]), helper.make_tensor_value_info("m2", F32, [rows, 3])]
    graph = helper.make_graph(cpb_nodes(), "cpb", inputs, outputs, weights(table, w1, w2))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model


def fold(proto: onnx.ModelProto, **kwargs) -> tuple[onnx.ModelProto, dict]:
    fold_pass = ConstantFoldingPass(**kwargs)
    out = ir.serde.serialize_model(fold_pass(ir.serde.deserialize_model(proto)).model)
    onnx.checker.check_model(out, full_check=True)
    json.dumps(fold_pass.stats)
    return out, fold_pass.stats


def ort_values(model: onnx.ModelProto, feeds: dict[str, np.ndarray], level: ort.GraphOptimizationLevel) -> dict:
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def feeds(rows: int = 6, hidden: int = 8) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {"x": rng.standard_normal((rows, 3)).astype(np.float32),
            "x1": rng.standard_normal((rows, hidden)).astype(np.float32)}  # fmt: skip


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def test_the_pattern_is_a_runtime_choice_for_refimpl() -> None:
    table, w1, _ = arrays()
    with pytest.raises(refimpl.RuntimeChoiceError, match="all -0"):
        refimpl.run("MatMul", [table, w1], {}, opset=18)


def test_cpb_mlp_folds_to_what_onnxruntime_computes_sign_of_zero_included() -> None:
    table, w1, w2 = arrays()
    original = cpb_model(table, w1, w2)
    out, stats = fold(original)
    assert [n.op_type for n in out.graph.node] == ["Mul", "Div"]  # MatMul, Relu, MatMul, Sigmoid folded
    # the MatMul's sign of zero, and the Sigmoid (its kernel approximates: passes/fold/kernels.py)
    assert stats["runtime_decided"] == {"MatMul": 1, "Sigmoid": 1}
    assert stats["applied"] == {"MatMul": 2, "Relu": 1, "Sigmoid": 1}
    folded = {i.name: numpy_helper.to_array(i) for i in out.graph.initializer}
    assert set(folded) == {"m1", "s"}
    exposed = cpb_model(table, w1, w2, expose=True)
    for level in (ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_ALL):
        theirs = ort_values(exposed, feeds(), level)
        for name in ("m1", "s"):
            assert same_bits(folded[name], theirs[name]), (name, level)
        zeros = folded["m1"] == 0
        assert np.array_equal(np.signbit(folded["m1"][zeros]), np.signbit(theirs["m1"][zeros]))
    # the choice mattered: IEEE order gives -0 where onnxruntime (and so the fold) gives +0
    products = table[:, :, None] * w1[None]
    ieee = products[:, 0] + products[:, 1]  # the terms added in order: -0 + -0 is -0
    differs = (ieee == 0) & (np.signbit(ieee) != np.signbit(folded["m1"]))
    assert differs.any()
    for e, a in zip(ort_run(original, feeds()), ort_run(out, feeds()), strict=True):
        assert same_bits(e, a)  # z = x1 / m1: +-inf where m1 is +-0


def test_in_an_if_branch_the_value_is_a_constant_node() -> None:
    table, w1, w2 = arrays()
    branch_out = [helper.make_tensor_value_info("b_z", F32, [6, 8])]
    then = helper.make_graph(cpb_nodes("b_")[:1] + [helper.make_node("Div", ["x1", "b_m1"], ["b_z"])], "then", [], branch_out)
    other = helper.make_graph([helper.make_node("Identity", ["x1"], ["e_z"])], "else", [],
                              [helper.make_tensor_value_info("e_z", F32, [6, 8])])  # fmt: skip
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["z"], then_branch=then, else_branch=other)], "g",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, []), helper.make_tensor_value_info("x1", F32, [6, 8])],
        [helper.make_tensor_value_info("z", F32, [6, 8])], weights(table, w1, w2)[:2])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    out, stats = fold(model)
    assert stats["runtime_decided"] == {"MatMul": 1}
    branch = next(a.g for a in out.graph.node[0].attribute if a.name == "then_branch")
    assert [n.op_type for n in branch.node] == ["Constant", "Div"]
    x1 = feeds()["x1"]
    for c in (True, False):
        run = {"c": np.array(c), "x1": x1}
        for e, a in zip(ort_run(model, run), ort_run(out, run), strict=True):
            assert same_bits(e, a)


def test_without_confirmation_it_stays_declined_with_the_reason() -> None:
    """No runtime to ask (``--no-fold-confirm``): refimpl does not guess, the chain stays."""
    out, stats = fold(cpb_model(*arrays()), confirm=False)
    assert [n.op_type for n in out.graph.node].count("MatMul") == 2
    assert stats["declined"] == {decide.NOT_ASKED: 1}
    assert stats["runtime_decided"] == {}


def test_over_the_budget_it_stays_declined(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decide, "MAX_DECIDED", 0)
    out, stats = fold(cpb_model(*arrays()))
    assert "MatMul" in [n.op_type for n in out.graph.node]
    assert stats["declined"] == {decide.NOT_COMPUTED: 1}


def test_undefined_by_the_spec_is_not_the_runtime_s_choice() -> None:
    """Integer division by zero is undefined, not a choice of order: it stays (``failed``), onnxruntime is not asked."""
    a = numpy_helper.from_array(np.array([4, 5], np.int32), "a")
    b = numpy_helper.from_array(np.array([2, 0], np.int32), "b")
    graph = helper.make_graph([helper.make_node("Div", ["a", "b"], ["q"]), helper.make_node("Add", ["q", "x"], ["y"])],
                              "g", [helper.make_tensor_value_info("x", TensorProto.INT32, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, [2])], [a, b])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    out, stats = fold(model)
    assert [n.op_type for n in out.graph.node] == ["Div", "Add"]
    assert stats["failed"] == {"Div": 1} and stats["runtime_decided"] == {}


def test_no_op_without_a_runtime_choice() -> None:
    table, w1, w2 = arrays()
    table[0] = [1.0, 2.0]
    table[1] = [3.0, -1.0]
    out, stats = fold(cpb_model(table, w1, w2))
    assert stats["runtime_decided"] == {"Sigmoid": 1}  # its kernel's value, not a choice of order
    assert [n.op_type for n in out.graph.node] == ["Mul", "Div"]


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**16), hidden=st.sampled_from([1, 3, 16]), zeros=st.integers(1, 4))
def test_folded_values_are_onnxruntime_s_bits(seed: int, hidden: int, zeros: int) -> None:
    rng = np.random.default_rng(seed)
    table, w1, w2 = arrays(seed, rows=6, hidden=hidden)
    table[:zeros] = np.where(rng.random((zeros, 2)) < 0.5, -0.0, 0.0)
    out, stats = fold(cpb_model(table, w1, w2))
    folded = {i.name: numpy_helper.to_array(i) for i in out.graph.initializer}
    theirs = ort_values(cpb_model(table, w1, w2, expose=True), feeds(6, hidden), ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    assert set(folded) == {"m1", "s"}  # folded whether or not refimpl had to ask; the Sigmoid is onnxruntime's
    assert stats["runtime_decided"].get("Sigmoid") == 1
    for name, value in folded.items():
        assert same_bits(value, theirs[name]), name
