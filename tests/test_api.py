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
import passes.cli
import passes.pipeline

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
        passes.optimize(DEMO, target_opset=6)
    with pytest.raises(passes.InputError, match="not a valid ONNX model"):
        passes.optimize(b"not a model")
    with pytest.raises(TypeError):
        passes.optimize(42)


def _invalid_model() -> onnx.ModelProto:
    """An Add of a float and an int64 input: the checker's type inference refuses it."""
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Add", ["a", "b"], ["y"])], "g",
        [onnx.helper.make_tensor_value_info("a", onnx.TensorProto.FLOAT, [2]),
         onnx.helper.make_tensor_value_info("b", onnx.TensorProto.INT64, [2])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])],
    )  # fmt: skip
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 13)])


def test_every_route_refuses_an_invalid_model_as_the_cli_does(tmp_path: pathlib.Path, capsys) -> None:
    proto = _invalid_model()
    path = tmp_path / "bad.onnx"
    onnx.save_model(proto, str(path))
    assert passes.cli.main([str(path), "-o", str(tmp_path / "out.onnx"), "-q"]) == 2
    cli_message = capsys.readouterr().err.strip().removeprefix(f"optimize: error: {path}: ")
    assert cli_message.startswith("invalid model:")
    for model in (proto, proto.SerializeToString(), ir.serde.deserialize_model(proto), path):
        with pytest.raises(passes.InputError) as raised:
            passes.optimize(model)
        assert str(raised.value).removeprefix(f"{path}: ") == cli_message
    assert not (tmp_path / "out.onnx").exists()


def test_optimize_with_output_raises_check_failed_and_writes_nothing(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Nudge(ir.passes.InPlacePass):  # a deliberately wrong pass: scales one weight by 5 %
        def call(self, model: ir.Model) -> ir.passes.PassResult:
            value = model.graph.initializers["scale_base"]
            value.const_value = ir.tensor(value.const_value.numpy() * np.float32(1.05), name="scale_base")
            return ir.passes.PassResult(model, modified=True)

    monkeypatch.setitem(passes.PASSES, "nudge", passes.pipeline.PassSpec("nudge", "test only", lambda o: Nudge()))
    out = tmp_path / "o.onnx"
    with pytest.raises(passes.CheckFailedError, match="lse_flat"):
        passes.optimize(DEMO, output=out, passes=["nudge"])
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(passes.CheckFailedError):
        passes.optimize(onnx.load(str(DEMO)), passes=["nudge"])
    # check=False opts out of the onnxruntime comparison (the ONNX checker still runs).
    assert passes.optimize(DEMO, output=out, passes=["nudge"], check=False) == out


def test_the_api_never_lowers_an_opset(tmp_path: pathlib.Path) -> None:
    model = onnx.load(str(DEMO))
    upgraded = passes.optimize(model, passes=["upgrade"], target_opset=19)
    with pytest.raises(passes.InputError, match="never lowers an opset"):
        passes.optimize(upgraded, target_opset=18)
    assert passes.optimize(upgraded, passes=["upgrade"]).opset_import[0].version == 19


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
    assert not again.modified and upgrade.stats["applied"] == {}


def test_a_model_importing_the_default_domain_under_both_names_is_upgraded_whole(tmp_path: pathlib.Path) -> None:
    """``""`` and ``"ai.onnx"`` are one domain: imported under both names, it is upgraded once, not left at 13."""
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("ReduceMax", ["x"], ["y"], axes=[0])], "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 3])],
    )  # fmt: skip
    opsets = [onnx.helper.make_opsetid("", 13), onnx.helper.make_opsetid("ai.onnx", 13)]
    src, out = tmp_path / "both.onnx", tmp_path / "out.onnx"
    onnx.save_model(onnx.helper.make_model(graph, opset_imports=opsets, ir_version=8), str(src))
    passes.optimize(src, output=out)
    result = onnx.load(str(out))
    assert [(o.domain, o.version) for o in result.opset_import] == [("", 18)]
    onnx.checker.check_model(result, full_check=True)


def test_the_graph_walk_finds_what_onnx_ir_finds_in_its_order() -> None:
    """passes.ir.walk.graphs is a faster ir.Model.graphs(): the same graphs, nested Ifs and Loops, in order."""
    from passes.ir import walk

    def branch(name: str, inner: onnx.GraphProto | None = None) -> onnx.GraphProto:
        nodes = [onnx.helper.make_node("Neg", ["x"], [f"{name}_y"])]
        if inner is not None:
            nodes = [onnx.helper.make_node("If", ["c"], [f"{name}_y"], then_branch=inner, else_branch=branch(name + "e"))]
        return onnx.helper.make_graph(nodes, name, [], [onnx.helper.make_tensor_value_info(f"{name}_y", 1, [2])])

    body = onnx.helper.make_graph(
        [onnx.helper.make_node("If", ["c"], ["v"], then_branch=branch("lt"), else_branch=branch("le")),
         onnx.helper.make_node("Identity", ["c"], ["c_out"])], "loop",
        [onnx.helper.make_tensor_value_info("i", 7, []), onnx.helper.make_tensor_value_info("c", 9, [])],
        [onnx.helper.make_tensor_value_info("c_out", 9, []), onnx.helper.make_tensor_value_info("v", 1, [2])],
    )  # fmt: skip
    nodes = [
        onnx.helper.make_node("If", ["c"], ["a"], then_branch=branch("t", branch("tt")), else_branch=branch("e")),
        onnx.helper.make_node("Loop", ["", "c"], ["s"], body=body),
        onnx.helper.make_node("Add", ["a", "x"], ["y"]),
    ]
    graph = onnx.helper.make_graph(
        nodes, "main", [onnx.helper.make_tensor_value_info("x", 1, [2]), onnx.helper.make_tensor_value_info("c", 9, [])],
        [onnx.helper.make_tensor_value_info("y", 1, [2]), onnx.helper.make_tensor_value_info("s", 1, [None, 2])],
    )  # fmt: skip
    model = ir.serde.deserialize_model(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)]))
    expected = list(model.graphs())
    assert len(expected) == 8  # main, t, tt, te, e, loop, lt, le
    assert walk.graphs(model) == expected
