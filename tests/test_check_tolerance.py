"""The tolerance comes from the lowest-precision float type an output depends on, not its own dtype."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from passes import cli, pipeline
from passes.verify.lowest import float_dependencies
from passes.verify.defaults import TOLERANCES


def fp16_cnn(opset: int = 11) -> onnx.ModelProto:
    """What ``convert_float_to_float16(model, keep_io_types=True)`` makes of a small CNN:
    float32 in and out, Cast to float16 first, float16 Conv/Relu weights and values, Cast back."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Cast", ["x"], ["x16"], name="cast_in", to=TensorProto.FLOAT16)]
    inits, prev, channels = [], "x16", 3
    for i in range(3):
        w = (rng.standard_normal((8, channels, 3, 3)) * 0.3).astype(np.float16)
        inits += [numpy_helper.from_array(w, f"w{i}"),
                  numpy_helper.from_array((rng.standard_normal(8) * 0.1).astype(np.float16), f"b{i}")]
        nodes += [helper.make_node("Conv", [prev, f"w{i}", f"b{i}"], [f"c{i}"], name=f"conv{i}", pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}")]  # fmt: skip
        prev, channels = f"r{i}", 8
    nodes += [helper.make_node("GlobalAveragePool", [prev], ["gap"], name="gap"),
              helper.make_node("Flatten", ["gap"], ["y16"], name="flatten"),
              helper.make_node("Cast", ["y16"], ["y"], name="cast_out", to=TensorProto.FLOAT)]
    graph = helper.make_graph(
        nodes, "fp16_cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, "height", "width"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])], initializer=inits,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=7)


def _optimize(tmp_path: pathlib.Path, model: onnx.ModelProto, *args: str) -> tuple[int, dict]:
    src, report = tmp_path / "fp16.onnx", tmp_path / "r.json"
    onnx.save_model(model, str(src))
    code = cli.main([str(src), "-o", str(tmp_path / "out.onnx"), "--report", str(report), "-q", *args])
    return code, json.loads(report.read_text())


def test_a_float16_model_with_float32_io_is_checked_with_the_float16_tolerance(tmp_path: pathlib.Path,
                                                                                capsys) -> None:  # fmt: skip
    code, data = _optimize(tmp_path, fp16_cnn())
    assert code == 0, capsys.readouterr().err
    assert data["after"]["opset"][""] == 18
    (output,) = data["check"]["outputs"]
    assert output["dtype"] == "float32" and output["tolerance_dtype"] == "float16"
    assert (output["rtol"], output["atol"]) == TOLERANCES["float16"]
    assert output["tolerance_value"] == "x16"  # the first float16 value on the way to the output
    capsys.readouterr()
    cli.main([str(tmp_path / "fp16.onnx"), "-o", str(tmp_path / "out.onnx")])
    assert "(rtol 0.01 atol 0.001: float16's default)" in capsys.readouterr().out  # the type, not a value's name


def test_the_converter_keep_io_types_model_passes_at_opset_18(tmp_path: pathlib.Path, capsys) -> None:
    float16 = pytest.importorskip("onnxconverter_common.float16")
    from test_check_inputs import cnn_model

    converted = float16.convert_float_to_float16(cnn_model(opset=11), keep_io_types=True)
    code, data = _optimize(tmp_path, converted)
    assert code == 0, capsys.readouterr().err
    assert data["check"]["checked"] and data["check"]["outputs"][0]["tolerance_dtype"] == "float16"


class _FewUlps(ir.passes.InPlacePass):
    """Test-only: moves the last biases by 2**-10, a couple of float16 ulps of the outputs
    (about 0.5): far within the float16 tolerance, far outside the float32 one."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        value = model.graph.initializers["b2"]
        array = value.const_value.numpy() + np.float16(2**-10)
        value.const_value = ir.tensor(array, name="b2")
        return ir.passes.PassResult(model, modified=True)


def test_float16_roundings_pass_but_not_under_a_float32_tolerance(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setitem(pipeline.PASSES, "ulp", pipeline.PassSpec("ulp", "test only", lambda o: _FewUlps()))
    code, data = _optimize(tmp_path, fp16_cnn(), "--passes", "ulp")
    assert code == 0, capsys.readouterr().err
    assert data["check"]["outputs"][0]["max_abs_error"] > 0
    code, data = _optimize(tmp_path, fp16_cnn(), "--passes", "ulp", "--rtol", "1e-4", "--atol", "1e-5")
    assert code == 1 and data["check"]["outputs"][0]["tolerance_dtype"] == ""  # given, not derived


def test_the_walk_follows_subgraph_references_and_ignores_shape_only_uses() -> None:
    then_branch = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["x16"], to=TensorProto.FLOAT16),
         helper.make_node("Cast", ["x16"], ["t"], to=TensorProto.FLOAT)],
        "then", [], [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2])])
    else_branch = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["e"])], "else", [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2])])
    h = numpy_helper.from_array(np.ones(2, np.float16), "h")
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["via_if"], then_branch=then_branch, else_branch=else_branch),
         helper.make_node("Shape", ["h"], ["h_shape"]),
         helper.make_node("Cast", ["h_shape"], ["h_shape_f"], to=TensorProto.FLOAT),
         helper.make_node("Add", ["x", "h_shape_f"], ["plain"])],
        "g", [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
              helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("via_if", TensorProto.FLOAT, [2]),
         helper.make_tensor_value_info("plain", TensorProto.FLOAT, [2])], initializer=[h],
    )  # fmt: skip
    lowest = float_dependencies(graph)
    assert lowest["via_if"] == ("float16", "x16")
    assert lowest["plain"][0] == "float32"  # the float16 table only gives its shape
