"""The benchmarks' target-opset mode (#24) and static-shapes comparison (#25), without running tools.

``bench_simplify --targets`` names each row ``MODEL@T``, runs onnxsim with its own
target opset and counts the standard fused ops per output;
``bench_static_shapes`` derives the original's dim sizes from the requested
static shapes and refuses shapes the model contradicts.
"""

from __future__ import annotations

import pathlib
import sys

import onnx
import pytest
from onnx import TensorProto, helper

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks"))
import bench_simplify  # noqa: E402
import bench_static_shapes  # noqa: E402
import harness  # noqa: E402


def test_onnxsim_runs_with_its_own_target_only_when_asked() -> None:
    own = harness.tool_snippet("vc+onnxsim", 23, onnxsim_target=True)
    assert "target_opset_version=TARGET" in own and "TARGET = 23" in own
    plain = harness.tool_snippet("vc+onnxsim", 18)
    assert "target_opset_version" not in plain and "convert_version" in plain
    # the other tools are unchanged by the flag
    assert harness.tool_snippet("onnxslim", 20, onnxsim_target=True) == harness.tool_snippet("onnxslim", 20)


def test_fused_cells_count_the_standard_ops_and_mark_wrong_outputs() -> None:
    good = bench_simplify.Cell("m@23", "optimize", nodes=10, opset=23, valid=True, equal=True,
                               op_counts={"LayerNormalization": 2, "RMSNormalization": 5, "Add": 3})
    assert bench_simplify.fused_cell(good) == "2/0/5 @23"
    wrong = bench_simplify.Cell("m@23", "onnxslim", nodes=10, opset=17, valid=True, equal=False,
                                op_counts={"Gelu": 1})
    assert bench_simplify.fused_cell(wrong) == "0/1/0 @17 (wrong)"
    assert bench_simplify.fused_cell(bench_simplify.Cell("m", "t", status="timeout")) == "timeout"
    row = bench_simplify.ModelResult("m@23", "export", "", nodes_before=40, opset_before=17, target=23,
                                     op_counts_before={"Erf": 2})
    row.cells = {"optimize": good, "onnxslim": wrong}
    text = bench_simplify.tables([row], ["optimize", "onnxslim"])
    assert "| m@23 | 0/0/0 @17 | 2/0/5 @23 | 0/1/0 @17 (wrong) |" in text


def test_targets_must_be_integers(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        bench_simplify.main(["--only", "demo", "--targets", "18,x"])
    assert exit_info.value.code == 2
    assert "--targets" in capsys.readouterr().err


def _model(tmp_path: pathlib.Path) -> pathlib.Path:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, "h", "h"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph), path)
    return path


def test_static_shapes_give_the_original_dims(tmp_path: pathlib.Path) -> None:
    path = _model(tmp_path)
    assert bench_static_shapes._dims_for(path, {"x": (2, 3, 8, 8)}) == {"batch": 2, "h": 8}
    with pytest.raises(SystemExit, match="static 3"):
        bench_static_shapes._dims_for(path, {"x": (2, 4, 8, 8)})
    with pytest.raises(SystemExit, match="two sizes"):
        bench_static_shapes._dims_for(path, {"x": (2, 3, 8, 9)})
    with pytest.raises(SystemExit, match="rank"):
        bench_static_shapes._dims_for(path, {"x": (2, 3)})
