"""Dead-node removal keeps every output of a node that stays (passes/ir/dead.py).

onnx_ir's own removal leaves out unused optional outputs. For MaxPool that changes the kernel
onnxruntime runs: without ``Indices`` a NaN in a pooling window becomes the window's maximum,
where the original gives NaN. The whole command, in the main graph, an If branch and a
function, must give the original's bits (NaN placement included) and keep the node's outputs.
"""

from __future__ import annotations

import pathlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from helpers import ort_run
from passes.cli import command as cli

F = TensorProto.FLOAT
OPSETS = [helper.make_opsetid("", 18)]


def _pool(x: str, y: str) -> onnx.NodeProto:
    return helper.make_node("MaxPool", [x], [y, f"{y}_unused_indices"], kernel_shape=[2, 2], strides=[2, 2])


def _io(name: str, shape: list[int]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, F, shape)


def main_graph() -> onnx.ModelProto:
    graph = helper.make_graph([_pool("x", "y")], "g", [_io("x", [1, 1, 4, 4])], [_io("y", [1, 1, 2, 2])])
    return helper.make_model(graph, opset_imports=OPSETS)


def in_branch() -> onnx.ModelProto:
    then = helper.make_graph([_pool("x", "p")], "then", [], [_io("p", [1, 1, 2, 2])])
    other = helper.make_graph([helper.make_node("AveragePool", ["x"], ["q"], kernel_shape=[2, 2], strides=[2, 2])],
                             "else", [], [_io("q", [1, 1, 2, 2])])  # fmt: skip
    node = helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)
    graph = helper.make_graph([node], "g", [_io("x", [1, 1, 4, 4]), helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                              [_io("y", [1, 1, 2, 2])])  # fmt: skip
    return helper.make_model(graph, opset_imports=OPSETS)


def in_function() -> onnx.ModelProto:
    function = helper.make_function("local", "Pool", ["a"], ["b"], [_pool("a", "b")], OPSETS)
    graph = helper.make_graph([helper.make_node("Pool", ["x"], ["y"], domain="local")], "g",
                              [_io("x", [1, 1, 4, 4])], [_io("y", [1, 1, 2, 2])])  # fmt: skip
    return helper.make_model(graph, opset_imports=[*OPSETS, helper.make_opsetid("local", 1)], functions=[function])


def _pools(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    found = []

    def visit(nodes) -> None:
        for node in nodes:
            if node.op_type == "MaxPool":
                found.append(node)
            for attr in node.attribute:
                if attr.g.node:
                    visit(attr.g.node)

    visit(model.graph.node)
    for function in model.functions:
        visit(function.node)
    return found


@pytest.mark.parametrize("build", [main_graph, in_branch, in_function], ids=lambda f: f.__name__)
def test_a_maxpool_keeps_its_unused_indices_and_its_nans(build, tmp_path: pathlib.Path) -> None:
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    original = build()
    onnx.checker.check_model(original, full_check=True)
    onnx.save(original, src)
    assert cli.main([str(src), "-o", str(out), "-q"]) == 0
    optimized = onnx.load(out)
    assert [len(n.output) for n in _pools(optimized)] == [2]
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    x[0, 0, 0, 0] = np.nan  # first in its window: the original's kernel gives NaN, the one without Indices 5
    x[0, 0, 3, 1] = np.nan  # last in its window: the original's kernel gives 12, the one without Indices NaN
    x[0, 0, 1, 2] = -0.0
    feeds = {"x": x}
    if build is in_branch:
        feeds["c"] = np.array(True)
    expected, actual = ort_run(original, feeds), ort_run(optimized, feeds)
    assert np.isnan(expected[0]).ravel().tolist() == [True, False, False, False]
    for e, a in zip(expected, actual, strict=True):
        assert e.tobytes() == a.tobytes()


def test_dead_nodes_still_go_and_a_loop_keeps_its_absent_condition(tmp_path: pathlib.Path) -> None:
    """What nothing uses is still removed, in a branch too; the clean-up changes nothing else."""
    dead = helper.make_node("Relu", ["x"], ["unused"])
    graph = helper.make_graph([dead, _pool("x", "y")], "g", [_io("x", [1, 1, 4, 4])], [_io("y", [1, 1, 2, 2])])
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(helper.make_model(graph, opset_imports=OPSETS), src)
    assert cli.main([str(src), "-o", str(out), "-q"]) == 0
    assert [n.op_type for n in onnx.load(out).graph.node] == ["MaxPool"]


def test_a_maxpool_with_indices_and_one_without_are_not_merged(tmp_path: pathlib.Path) -> None:
    """The two run different kernels (NaN placement): CSE must not make one of them the other."""
    nodes = [_pool("x", "a"), helper.make_node("MaxPool", ["x"], ["b"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Sub", ["a", "b"], ["y"])]  # fmt: skip
    graph = helper.make_graph(nodes, "g", [_io("x", [1, 1, 4, 4])], [_io("y", [1, 1, 2, 2])])
    original = helper.make_model(graph, opset_imports=OPSETS)
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(original, src)
    assert cli.main([str(src), "-o", str(out), "-q"]) == 0
    optimized = onnx.load(out)
    assert sorted(len(n.output) for n in _pools(optimized)) == [1, 2]
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    x[0, 0, 0, 0] = x[0, 0, 3, 1] = np.nan
    expected, actual = ort_run(original, {"x": x}), ort_run(optimized, {"x": x})
    assert np.isnan(expected[0]).ravel().tolist() == [True, False, True, False]  # each kernel's NaN
    assert expected[0].tobytes() == actual[0].tobytes()
