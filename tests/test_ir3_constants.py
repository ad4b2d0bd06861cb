"""IR < 4: the initializers listed as graph inputs are constants, as onnxruntime runs them (issue #38, item 1).

Below IR 4 every initializer had to be listed as a graph input, and onnxruntime
treats them as constants there (no caller can feed them). The load takes them out
of the inputs (a note in the report), so they fold and fuse like any weight and the
result, written at a later IR, does not make them overridable. From IR 4 on an
initializer listed as an input is a default a caller may override: it stays (the
no-op case; ``--freeze-initializer-inputs`` opts in, one mechanism for both).
"""

from __future__ import annotations

import json
import os
import pathlib

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

import helpers
import passes
from passes import cli

F = TensorProto.FLOAT
RNG = np.random.default_rng(38)


def _weights() -> list[onnx.TensorProto]:
    arrays = {
        "w": RNG.standard_normal((4, 3, 3, 3)).astype(np.float32),
        "b": RNG.standard_normal(4).astype(np.float32),
        "scale": RNG.uniform(0.5, 2, 4).astype(np.float32),
        "bias": RNG.standard_normal(4).astype(np.float32),
        "mean": RNG.standard_normal(4).astype(np.float32),
        "var": RNG.uniform(0.5, 2, 4).astype(np.float32),
        "fc": RNG.standard_normal((4, 5)).astype(np.float32),
        "shape": np.array([1, 4], np.int64),
    }
    return [numpy_helper.from_array(a, n) for n, a in arrays.items()]


def _model(ir_version: int, listed: tuple[str, ...] | None = None) -> onnx.ModelProto:
    """Conv -> BatchNormalization -> Relu -> ReduceMean -> Reshape -> MatMul, at opset 9 (IR 3) or 11.

    ``listed``: the initializers also listed as graph inputs (default: all, as IR 3 requires).
    """
    weights = _weights()
    listed = tuple(t.name for t in weights) if listed is None else listed
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["n"]),
        helper.make_node("Relu", ["n"], ["r"]),
        helper.make_node("ReduceMean", ["r"], ["m"], axes=[2, 3]),
        helper.make_node("Reshape", ["m", "shape"], ["f"]),
        helper.make_node("MatMul", ["f", "fc"], ["y"]),
    ]
    inputs = [helper.make_tensor_value_info("x", F, [1, 3, 6, 6])]
    inputs += [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in weights if t.name in listed]
    graph = helper.make_graph(nodes, "ir3", inputs, [helper.make_tensor_value_info("y", F, [1, 5])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9 if ir_version < 4 else 11)])
    model.ir_version = ir_version
    onnx.checker.check_model(model)
    return model


def _feeds() -> dict[str, np.ndarray]:
    x = np.random.default_rng(0).standard_normal((1, 3, 6, 6)).astype(np.float32)
    x.reshape(-1)[:3] = [-0.0, 0.0, 1e-30]
    return {"x": x}


def _ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def test_an_ir3_models_weights_become_constants_that_fold_and_fuse() -> None:
    original = _model(3)
    assert len(original.graph.input) == 1 + len(original.graph.initializer)
    result = passes.optimize(original)  # with the onnxruntime check: the original runs at IR 3
    onnx.checker.check_model(result, full_check=True)
    assert [i.name for i in result.graph.input] == ["x"] and result.ir_version >= 4
    assert "BatchNormalization" not in _ops(result) and "Conv" in _ops(result), _ops(result)
    expected, = helpers.ort_run(original, _feeds())  # onnxruntime: IR 3 initializers are constants
    actual, = helpers.ort_run(result, _feeds())
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)  # the BatchNormalization fusion rounds
    assert not [i for i in helpers.ort_session(result).get_inputs() if i.name != "x"]


def test_the_command_notes_it_and_its_check_passes(tmp_path: pathlib.Path, capsys) -> None:
    src, dst, report = tmp_path / "ir3.onnx", tmp_path / "out.onnx", tmp_path / "report.json"
    onnx.save(_model(3), src)
    assert cli.main([str(src), "-o", str(dst), "--report", str(report)]) == 0
    assert "check passed" in capsys.readouterr().out
    notes = json.loads(report.read_text())["notes"]
    frozen = [n for n in notes if n.startswith("ir_version 3:")]
    assert len(frozen) == 1 and "the 8 initializers also listed as graph inputs are constants" in frozen[0], notes
    assert [i.name for i in onnx.load(str(dst)).graph.input] == ["x"]


def test_an_ir3_model_in_memory_is_read_the_same_way() -> None:
    """``passes.optimize(ir_model)``: the model built in memory gets the load's repair."""
    original = _model(3)
    model = ir.serde.deserialize_model(original)
    passes.optimize(model, check=False)
    assert [v.name for v in model.graph.inputs] == ["x"] and model.ir_version >= 4
    result = ir.serde.serialize_model(model)
    assert "BatchNormalization" not in _ops(result)
    np.testing.assert_allclose(helpers.ort_run(result, _feeds())[0], helpers.ort_run(original, _feeds())[0],
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("listed", [("scale", "var"), ()], ids=["some_listed", "none_listed"])
def test_ir4_initializers_listed_as_inputs_stay_overridable(listed: tuple[str, ...]) -> None:
    """The no-op case: from IR 4 a listed initializer is a default a caller may override; it stays an input
    and is neither folded nor fused, and an override computes what the original computes with it."""
    original = _model(7, listed)
    result = passes.optimize(original)
    assert [i.name for i in result.graph.input] == ["x", *listed]
    if listed:
        assert "BatchNormalization" in _ops(result), _ops(result)
        override = {**_feeds(), "scale": np.full(4, -3.0, np.float32), "var": np.full(4, 0.25, np.float32)}
        expected, = helpers.ort_run(original, override)
        np.testing.assert_array_equal(helpers.ort_run(result, override)[0], expected)
        assert not np.array_equal(expected, helpers.ort_run(original, _feeds())[0])  # the override matters
    else:
        assert "BatchNormalization" not in _ops(result)


def test_the_flag_freezes_an_ir4_model_with_the_same_mechanism(tmp_path: pathlib.Path) -> None:
    src, kept, frozen = tmp_path / "ir7.onnx", tmp_path / "kept.onnx", tmp_path / "frozen.onnx"
    onnx.save(_model(7, ("scale", "var")), src)
    assert cli.main([str(src), "-o", str(kept), "-q"]) == 0
    assert [i.name for i in onnx.load(str(kept)).graph.input] == ["x", "scale", "var"]
    assert cli.main([str(src), "-o", str(frozen), "-q", "--freeze-initializer-inputs"]) == 0
    result = onnx.load(str(frozen))
    assert [i.name for i in result.graph.input] == ["x"] and "BatchNormalization" not in _ops(result)


def _light(name: str) -> pathlib.Path:
    path = pathlib.Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data" / "light" / f"light_{name}.onnx"
    if not path.exists():
        pytest.skip(f"{path.name} is not in this onnx wheel")
    return path


def test_a_light_zoo_model_keeps_one_input_and_checks_equal(tmp_path: pathlib.Path, capsys) -> None:
    """onnx's light SqueezeNet (IR 3, 52 initializers listed as inputs): one input left, the check passes."""
    src = _light("squeezenet")
    original = onnx.load(str(src))
    assert original.ir_version == 3 and len(original.graph.input) == 53
    dst = tmp_path / "out.onnx"
    assert cli.main([str(src), "-o", str(dst)]) == 0
    assert "check passed" in capsys.readouterr().out
    result = onnx.load(str(dst))
    weights = {t.name for t in original.graph.initializer}
    assert [i.name for i in result.graph.input] == [i.name for i in original.graph.input if i.name not in weights]
    assert len(result.graph.node) < len(original.graph.node) / 1.5


def _matmul_then_add(ir_version: int) -> onnx.ModelProto:
    """``MatMul(x, W) + b``, W and b initializers listed as inputs: W is the weight onnxruntime prepacks."""
    rng = np.random.default_rng(3)
    weights = [numpy_helper.from_array(rng.standard_normal((64, 8)).astype(np.float32), "W"),
               numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b")]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])], "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64]),
         helper.make_tensor_value_info("W", TensorProto.FLOAT, [64, 8]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, [8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])], weights)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = ir_version
    return model


def test_a_frozen_weight_onnxruntime_prepacks_is_counted_as_a_rounding_change(tmp_path: pathlib.Path) -> None:
    """A frozen MatMul weight is prepacked by onnxruntime and summed in another order (1e-7 apart
    from the same weight fed at run time): the report says so as after fold's constants; the
    frozen Add operand is not counted, and without the flag nothing is."""
    src, out, report = tmp_path / "m.onnx", tmp_path / "out.onnx", tmp_path / "r.json"
    onnx.save(_matmul_then_add(8), src)
    assert cli.main([str(src), "-o", str(out), "-q", "--freeze-initializer-inputs", "--report", str(report)]) == 0
    (simplify,) = [p for p in json.loads(report.read_text())["passes"] if p["name"] == "simplify"]
    assert simplify["stats"]["applied"]["constants/frozen_input"] == 2
    assert simplify["stats"]["weights_made_constant"] == 1  # W, not b
    assert [i.name for i in onnx.load(str(out)).graph.input] == ["x"]
    x = np.random.default_rng(4).standard_normal((5, 64)).astype(np.float32)
    (expected,), (actual,) = helpers.ort_run(src, {"x": x}), helpers.ort_run(out, {"x": x})
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)  # rounding apart, not more
    assert cli.main([str(src), "-o", str(out), "-q", "--report", str(report)]) == 0
    for run in json.loads(report.read_text())["passes"]:
        assert not run["stats"].get("weights_made_constant"), run
