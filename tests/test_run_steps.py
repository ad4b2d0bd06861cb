"""Which steps a run has: a pass list the user chose runs those passes and the clean-up, the
``types`` step (a value_info per computed value) only in the default pipeline or with static shapes."""

from __future__ import annotations

import pathlib

import numpy as np
import onnx
import onnx.helper as oh
import pytest

from helpers import ort_run, run_cli
from passes.runspec import RunSpec


def _reduce_chain(count: int = 6) -> onnx.ModelProto:
    """``count`` opset-13 reduce nodes with ``axes`` attributes, inside an If branch too."""
    nodes, previous = [], "x"
    for index in range(count):
        op = ("ReduceMax", "ReduceMean", "ReduceL2")[index % 3]
        nodes.append(oh.make_node(op, [previous], [f"v{index}"], axes=[index % 2], keepdims=1))
        previous = f"v{index}"
    branch = oh.make_graph([oh.make_node("ReduceMin", [previous], ["b"], axes=[0], keepdims=1)], "branch", [],
                           [oh.make_tensor_value_info("b", onnx.TensorProto.FLOAT, [1, 1])])  # fmt: skip
    nodes.append(oh.make_node("ReduceSum", [previous], ["s"], keepdims=0))
    nodes.append(oh.make_node("Greater", ["s", "zero"], ["c"]))
    nodes.append(oh.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch))
    graph = oh.make_graph(nodes, "chain", [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 3])],
                          [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 1])],
                          [onnx.numpy_helper.from_array(np.float32(0), "zero")])  # fmt: skip
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 13)], ir_version=7)


def _value_infos(model: onnx.ModelProto) -> list[str]:
    names = [v.name for v in model.graph.value_info]
    for node in model.graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                names += [v.name for v in attr.g.value_info]
    return names


def _cli(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], *args: str) -> onnx.ModelProto:
    src, dst = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(_reduce_chain(), src)
    code, _, err = run_cli([str(src), "-o", str(dst), "--no-check", "-q", *args], capsys)
    assert code == 0, err
    return onnx.load(dst)


def test_the_upgrade_alone_adds_no_value_info_and_is_valid_at_the_target(tmp_path, capsys) -> None:
    out = _cli(tmp_path, capsys, "--passes", "upgrade", "--target-opset", "18")
    assert _value_infos(out) == []
    assert next(o.version for o in out.opset_import if o.domain == "") == 18
    onnx.checker.check_model(out, full_check=True)
    reduces = [n for n in out.graph.node if n.op_type.startswith("Reduce")]
    assert reduces and all(len(n.input) == 2 and not any(a.name == "axes" for a in n.attribute)
                           for n in reduces if n.op_type != "ReduceSum")  # fmt: skip
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    np.testing.assert_array_equal(ort_run(out, {"x": x})[0], ort_run(_reduce_chain(), {"x": x})[0])


def test_the_default_pipeline_still_types_every_computed_value(tmp_path, capsys) -> None:
    out = _cli(tmp_path, capsys, "--target-opset", "18")
    assert _value_infos(out)  # the types step ran


def test_static_shapes_with_a_chosen_pass_still_tighten_the_outputs(tmp_path, capsys) -> None:
    out = _cli(tmp_path, capsys, "--passes", "upgrade", "--target-opset", "18", "--input-shape", "x:4,3")
    assert _value_infos(out)  # the types step runs where static shapes are declared


def test_the_steps_of_a_run() -> None:
    steps = [name for name, _, _ in RunSpec.build(["upgrade"])._steps()]
    assert steps == ["upgrade", "cleanup"]
    assert [name for name, _, _ in RunSpec.build(["upgrade"], cleanup=False)._steps()] == ["upgrade"]
    assert [name for name, _, _ in RunSpec.build()._steps()][-2:] == ["cleanup", "types"]
    assert [name for name, _, _ in RunSpec.build(skip=["fold"])._steps()][-2:] == ["cleanup", "types"]
    static = RunSpec.build(["upgrade"], input_shapes={"x": (4, 3)})
    assert [name for name, _, _ in static._steps()] == ["shapes", "upgrade", "cleanup", "types"]


@pytest.mark.parametrize(("chosen", "typed"), [(None, True), (["upgrade"], False), (("upgrade" for _ in [0]), False)])
def test_the_api_writes_what_the_command_writes(tmp_path: pathlib.Path, chosen, typed: bool) -> None:
    """``passes.optimize(path, output=...)``: the default run types the values, a pass list (any
    iterable) does not, as on the command line."""
    import passes

    src = tmp_path / "in.onnx"
    onnx.save(_reduce_chain(), src)
    passes.optimize(str(src), output=str(tmp_path / "out.onnx"), passes=chosen, check=False, target_opset=18)
    assert bool(_value_infos(onnx.load(tmp_path / "out.onnx"))) == typed
