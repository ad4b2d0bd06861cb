"""The Python API: passes.optimize on each kind of model, passes.check, the pass manager."""

from __future__ import annotations

import pathlib

import numpy as np
import onnx
import onnx_ir as ir
import onnx_ir.passes.common as common_passes
import pytest

import helpers
import passes

DEMO = pathlib.Path(__file__).resolve().parent.parent / "models" / "demo.onnx"
X = {"x": np.random.default_rng(4).standard_normal((3, 4, 8)).astype(np.float32)}


def _ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def test_optimize_a_path_returns_an_ir_model_and_leaves_the_file() -> None:
    before = DEMO.read_bytes()
    model = passes.optimize(DEMO)
    assert isinstance(model, ir.Model)
    assert model.opset_imports[""] == 18
    assert DEMO.read_bytes() == before
    proto = ir.to_proto(model)
    assert "ReduceLogSumExp" not in _ops(proto) and "Concat" not in _ops(proto)
    for e, a in zip(helpers.ort_run(str(DEMO), X), helpers.ort_run(proto, X)):
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6)


def test_optimize_a_path_with_output_writes_it(tmp_path: pathlib.Path) -> None:
    out = passes.optimize(DEMO, output=tmp_path / "o.onnx", passes=["upgrade"])
    assert out == tmp_path / "o.onnx" and [p.name for p in tmp_path.iterdir()] == ["o.onnx"]
    result = onnx.load(str(out))
    assert "ReduceLogSumExp" in _ops(result)  # only the upgrade ran (and the clean-up)
    assert {o.version for o in result.opset_import if o.domain == ""} == {18}


def test_optimize_a_proto_returns_a_proto_and_does_not_change_it() -> None:
    proto = onnx.load(str(DEMO))
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    result = passes.optimize(proto, skip=["decompose"])
    assert isinstance(result, onnx.ModelProto) and proto == copy
    assert "ReduceLogSumExp" in _ops(result) and "Concat" not in _ops(result)


def test_optimize_an_ir_model_in_place() -> None:
    model = ir.load(DEMO)
    assert passes.optimize(model) is model
    assert model.opset_imports[""] == 18


def test_optimize_rejects_bad_arguments() -> None:
    with pytest.raises(passes.InputError, match="unknown pass"):
        passes.optimize(DEMO, passes=["nope"])
    with pytest.raises(passes.UpgradeError):
        passes.optimize(DEMO, target_opset=17)
    with pytest.raises(TypeError):
        passes.optimize(b"not a model")


def test_check_reports_per_output_errors() -> None:
    original = onnx.load(str(DEMO))
    result = passes.check(original, passes.optimize(original), inputs=X)
    assert result.ok and [o.name for o in result.outputs] == ["lse_flat", "log_sum"]
    assert all(o.max_abs_error < 1e-5 for o in result.outputs)
    broken = onnx.ModelProto()
    broken.CopyFrom(original)
    broken.graph.initializer[0].CopyFrom(onnx.numpy_helper.from_array(
        onnx.numpy_helper.to_array(original.graph.initializer[0]) * np.float32(1.1), "scale_base"))
    bad = passes.check(original, broken, inputs=X)
    assert not bad.ok and [o.name for o in bad.failures] == ["lse_flat"]


def test_pass_manager_composes_with_onnx_ir_passes() -> None:
    model = ir.load(DEMO)
    manager = ir.passes.PassManager(
        [passes.build_pass_manager(["upgrade", "fold"]), common_passes.TopologicalSortPass()]
    )
    assert manager(model).modified
    assert model.opset_imports[""] == 18
    # Each pass class on its own, with its stats.
    upgrade = passes.UpgradeOpsetPass(18)
    again = upgrade(model)
    assert not again.modified and upgrade.stats["adapters"] == {}
