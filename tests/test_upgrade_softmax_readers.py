"""A node the upgrade adapts that reads a Softmax/LogSoftmax/Hardmax-12 the upgrade wraps in Flatten/Reshape.

The Softmax-13 adapter makes the op work on the 2-D Flatten of its input and reshapes the result
back, moving every reader of the op's output to the Reshape. A reader that an adapter rewrites too
(Clip-11's inputs, Squeeze/Unsqueeze-13's axes, Slice-10, Pad-11, TopK-10, Split, the Reduce ops)
was planned reading the op's output before the wrapping existed, and its commit put that input
back: it read the 2-D value (a wrong rank, so a wrong result or an invalid model; found by sweep6
in an opset-9 network). Readers committed after the wrapping, in the same graph or in an If
branch, now read the reshaped value.
"""

from __future__ import annotations

import copy

import numpy as np
import onnx
import onnx.helper as oh
import onnx_ir as ir
import onnxruntime as ort
import pytest

from passes.upgrade import UpgradeOpsetPass

F = onnx.TensorProto.FLOAT
X = np.random.default_rng(7).standard_normal((2, 3, 4, 5)).astype(np.float32)
X[0, 0, 0, :2] = [-0.0, np.inf]

#: Readers written in their opset-9 form (attributes that later opsets take as inputs).
READERS = {
    "Clip": lambda i, o: [oh.make_node("Clip", [i], [o], min=0.05, max=0.5)],
    "Squeeze": lambda i, o: [oh.make_node("Unsqueeze", [i], [o + "_u"], axes=[0]),
                             oh.make_node("Squeeze", [o + "_u"], [o], axes=[0])],
    "ReduceSum": lambda i, o: [oh.make_node("ReduceSum", [i], [o], axes=[1], keepdims=1)],
    "ReduceMax": lambda i, o: [oh.make_node("ReduceMax", [i], [o], axes=[2, 3], keepdims=0)],
    "Slice": lambda i, o: [oh.make_node("Slice", [i], [o], starts=[1], ends=[3], axes=[3])],
    "Pad": lambda i, o: [oh.make_node("Pad", [i], [o], pads=[0, 0, 1, 0, 0, 0, 0, 2], value=-1.0)],
    "TopK": lambda i, o: [oh.make_node("TopK", [i], [o, o + "_i"], k=2, axis=1)],
    "Split": lambda i, o: [oh.make_node("Split", [i], [o, o + "_b"], axis=3, split=[2, 3])],
}  # fmt: skip


def _outputs(nodes: list[onnx.NodeProto], produced: str) -> list[str]:
    return [n for node in nodes for n in node.output if n.startswith(produced)]


def _model(graph_nodes, outputs, extra_inputs=()) -> onnx.ModelProto:
    graph = oh.make_graph(graph_nodes, "g", [oh.make_tensor_value_info("x", F, [2, 3, 4, 5]), *extra_inputs],
                          [oh.make_empty_tensor_value_info(o) for o in outputs])  # fmt: skip
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 9)], ir_version=4)
    return onnx.shape_inference.infer_shapes(model)


def _upgrade(model: onnx.ModelProto, target: int) -> onnx.ModelProto:
    return ir.to_proto(UpgradeOpsetPass(target)(ir.from_proto(copy.deepcopy(model))).model)


def _run(model: onnx.ModelProto, feeds) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _assert_same_bits(before: onnx.ModelProto, after: onnx.ModelProto, feeds) -> None:
    onnx.checker.check_model(after, full_check=True)
    for expected, actual in zip(_run(before, feeds), _run(after, feeds), strict=True):
        assert expected.dtype == actual.dtype and expected.shape == actual.shape
        assert expected.tobytes() == actual.tobytes()


def _readers_of(graph: onnx.GraphProto, name: str) -> list[onnx.NodeProto]:
    return [n for n in graph.node if name in n.input]


@pytest.mark.parametrize("reader", sorted(READERS))
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("target", [13, 18])
def test_an_adapted_reader_reads_the_reshaped_value(op: str, reader: str, target: int) -> None:
    nodes = [oh.make_node(op, ["x"], ["sm"], axis=1), *READERS[reader]("sm", "y")]
    model = _model(nodes, ["sm", *_outputs(nodes, "y")])  # the op's output is a graph output too
    after = _upgrade(model, target)
    _assert_same_bits(model, after, {"x": X})
    (reshape,) = [n for n in after.graph.node if n.op_type == "Reshape"]
    assert reshape.output[0] == "sm"  # the user-visible name is on the reshaped value
    (flat,) = [n.output[0] for n in after.graph.node if n.op_type == op]
    assert [n.op_type for n in _readers_of(after.graph, flat)] == ["Reshape"]  # nothing else reads the 2-D value
    assert {n.op_type for n in _readers_of(after.graph, "sm")} >= {"Unsqueeze" if reader == "Squeeze" else reader}


def test_a_reader_in_an_if_branch_reads_the_reshaped_value() -> None:
    """The Softmax in the main graph, adapted readers in both branches (outer-scope reads), and a
    Softmax inside a branch read by an adapted node of the same branch."""
    then_nodes = READERS["Clip"]("sm", "t")
    else_nodes = [oh.make_node("Softmax", ["x"], ["inner"], axis=2), *READERS["Squeeze"]("inner", "e0"),
                  oh.make_node("Add", ["e0", "sm"], ["e"])]  # fmt: skip
    branch = lambda nodes, out: oh.make_graph(nodes, out, [], [oh.make_empty_tensor_value_info(out)])  # noqa: E731
    nodes = [oh.make_node("Softmax", ["x"], ["sm"], axis=1),
             oh.make_node("If", ["c"], ["y"], then_branch=branch(then_nodes, "t"), else_branch=branch(else_nodes, "e"))]  # fmt: skip
    model = _model(nodes, ["y"], [oh.make_tensor_value_info("c", onnx.TensorProto.BOOL, [])])
    after = _upgrade(model, 18)
    for c in (True, False):
        _assert_same_bits(model, after, {"x": X, "c": np.array(c)})
    if_node = next(n for n in after.graph.node if n.op_type == "If")
    then_graph, else_graph = (a.g for a in sorted(if_node.attribute, key=lambda a: a.name)[::-1])
    assert [n.op_type for n in _readers_of(then_graph, "sm")] == ["Clip"]
    inner_flat = next(n.output[0] for n in else_graph.node if n.op_type == "Softmax")
    assert [n.op_type for n in _readers_of(else_graph, inner_flat)] == ["Reshape"]


def test_no_wrapping_at_the_last_axis_leaves_readers_alone() -> None:
    nodes = [oh.make_node("Softmax", ["x"], ["sm"], axis=-1), *READERS["Clip"]("sm", "y")]
    model = _model(nodes, ["y"])
    after = _upgrade(model, 18)
    _assert_same_bits(model, after, {"x": X})
    assert [n.op_type for n in after.graph.node] == ["Softmax", "Clip"]
    assert after.graph.node[1].input[0] == after.graph.node[0].output[0] == "sm"
