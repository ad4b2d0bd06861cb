"""When the check refuses a fused model, the run writes the same passes without simplify's fusions.

A fusion (here BatchNormalization into the Conv before it) changes float
rounding by design. Where the change is beyond the check's tolerance (a Conv
bias and a BatchNormalization mean of 1e4 that cancel: the original subtracts
them, the fused Conv never adds them), the run used to write nothing; now the
same run without the fusions (exact) is checked on the same inputs and written,
and the report says so (``check.without_fusions``). Where that fails too, the
pass blamed is the one that brings the difference left without the fusions.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

import helpers
import passes
from passes import cli, pipeline

_C = 4


def _conv_bn(mean: float, *, in_if: bool = False) -> onnx.ModelProto:
    """x -> Conv(bias = mean) -> BatchNormalization(mean) -> Relu; the bias and the mean cancel exactly
    (fused: a zero bias), so a large ``mean`` puts the original's rounding, not the fused one's, in the output."""
    rng = np.random.default_rng(0)
    arrays = {
        "W": rng.uniform(0.5, 1.5, (_C, 3, 3, 3)).astype(np.float32),
        "B": np.full(_C, mean, np.float32),
        "s": rng.uniform(0.5, 2, _C).astype(np.float32),
        "beta": rng.uniform(-0.1, 0.1, _C).astype(np.float32),
        "m": np.full(_C, mean, np.float32),
        "v": rng.uniform(0.5, 2, _C).astype(np.float32),
    }
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["y"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["y", "s", "beta", "m", "v"], ["z"]),
             helper.make_node("Relu", ["z"], ["out"])]  # fmt: skip
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])]
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", _C, 8, 8])
    inits = [numpy_helper.from_array(a, n) for n, a in arrays.items() if not (in_if and n == "W")]
    if in_if:  # the chain in both branches of an If on a bool input (Relu, and Sigmoid in the else branch)
        branches = []
        for tag, last in (("then", "Relu"), ("else", "Sigmoid")):
            body = [helper.make_node(n.op_type if n.op_type != "Relu" else last, list(n.input), [f"{o}_{tag}" if o != "out" else f"out_{tag}"
                                                                for o in n.output]) for n in nodes]  # fmt: skip
            body[1].input[0], body[2].input[0] = f"y_{tag}", f"z_{tag}"
            body[0].input[1] = f"W_{tag}"  # a weight of its own: a shared one is not fused (it would be copied)
            for node, original in zip(body, nodes):
                node.attribute.extend(original.attribute)
            value = helper.make_tensor_value_info(f"out_{tag}", TensorProto.FLOAT, ["N", _C, 8, 8])
            branches.append(helper.make_graph(body, tag, [], [value]))
        inits += [numpy_helper.from_array(arrays["W"] * np.float32(k), f"W_{tag}") for tag, k in (("then", 1), ("else", 0.75))]
        nodes = [helper.make_node("If", ["c"], ["out"], then_branch=branches[0], else_branch=branches[1])]
        inputs.append(helper.make_tensor_value_info("c", TensorProto.BOOL, []))
    graph = helper.make_graph(nodes, "conv_bn", inputs, [out], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    return model


def _feeds(model: onnx.ModelProto, batch: int = 2) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((batch, 3, 8, 8)).astype(np.float32)
    edges = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 3.4e38], np.float32)
    x_edge = x.copy()
    x_edge.flat[: edges.size] = edges
    sets = [{"x": x}, {"x": x_edge}, {"x": np.zeros((0, 3, 8, 8), np.float32)}]
    if any(i.name == "c" for i in model.graph.input):
        sets = [{**s, "c": np.array(flag)} for s in sets for flag in (True, False)]
    return sets


def _same_bits(expected: np.ndarray, actual: np.ndarray) -> bool:
    return expected.shape == actual.shape and expected.tobytes() == actual.tobytes()


@pytest.mark.parametrize("in_if", [False, True], ids=["graph", "if-body"])
def test_a_refused_fusion_writes_the_unfused_model(tmp_path: pathlib.Path, in_if: bool, capsys) -> None:
    original = _conv_bn(1e4, in_if=in_if)
    src, out, plain = tmp_path / "m.onnx", tmp_path / "out.onnx", tmp_path / "plain.onnx"
    onnx.save(original, str(src))
    report_path = tmp_path / "r.json"
    assert cli.main([str(src), "-o", str(out), "--report", str(report_path)]) == 0
    text = capsys.readouterr().out
    fused = 2 if in_if else 1
    assert (f"written without simplify's fusions (as with --no-fuse), which the check refused: with the {fused} "
            "fusion(s), output 'out': ") in text
    report = json.loads(report_path.read_text())
    assert report["status"] == "ok" and report["written"] and report["check"]["ok"] is True
    tried = report["check"]["without_fusions"]
    assert tried["fused"] == fused and tried["unfused_check"] == "passed", tried
    assert tried["fused_check"].startswith("check failed") and "differ" in tried["fused_check"], tried
    assert report["check"]["inputs"] is not None  # the first check's inputs, on which the second ran
    simplify = next(p for p in report["passes"] if p["name"] == "simplify")
    assert not simplify["stats"].get("fused"), simplify  # the passes of the model written
    result = onnx.load(str(out))
    assert helpers.ops_recursive(result).count("BatchNormalization") == fused
    # What --no-fuse writes, byte for byte, and what the original computes, bit for bit.
    assert cli.main([str(src), "-o", str(plain), "--no-fuse", "-q"]) == 0
    assert out.read_bytes() == plain.read_bytes()
    for feeds in _feeds(original):
        for want, got in zip(helpers.ort_run(original, feeds), helpers.ort_run(result, feeds)):
            assert _same_bits(want, got)
    assert src.read_bytes() == original.SerializeToString()


def test_a_fusion_the_check_accepts_is_kept(tmp_path: pathlib.Path) -> None:
    """The no-op case: a mean of 0 leaves nothing to cancel; the fused model passes and is written."""
    src, out, report_path = tmp_path / "m.onnx", tmp_path / "out.onnx", tmp_path / "r.json"
    onnx.save(_conv_bn(0.0), str(src))
    assert cli.main([str(src), "-o", str(out), "--report", str(report_path), "-q"]) == 0
    report = json.loads(report_path.read_text())
    assert report["check"]["ok"] is True and report["check"]["without_fusions"] is None
    assert "BatchNormalization" not in helpers.ops_recursive(onnx.load(str(out)))
    assert not any("without simplify's fusions" in n for n in report["notes"])


def test_the_api_returns_the_unfused_model(caplog: pytest.LogCaptureFixture) -> None:
    original = _conv_bn(1e4)
    for given in (original, original.SerializeToString()):
        result = passes.optimize(given)
        result = onnx.ModelProto.FromString(result) if isinstance(result, bytes) else result
        assert "BatchNormalization" in helpers.ops_recursive(result)
        assert "written without simplify's fusions" in caplog.text
        for feeds in _feeds(original):
            for want, got in zip(helpers.ort_run(original, feeds), helpers.ort_run(result, feeds)):
                assert _same_bits(want, got)


def test_an_onnx_ir_model_changed_in_place_is_refused_as_before() -> None:
    """The API changes an ``onnx_ir.Model`` in place: the unfused model would be another object, and a
    caller reading the one it passed would read the refused fused model. So that route raises."""
    model = ir.serde.deserialize_model(_conv_bn(1e4))
    with pytest.raises(passes.CheckFailedError, match="differ"):
        passes.optimize(model)


class _ReluToSigmoidPass(ir.passes.InPlacePass):
    """Test-only: a wrong pass, whatever the fusions did (every Relu computes Sigmoid)."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        for node in model.graph:
            if node.op_type == "Relu":
                node.op_type = "Sigmoid"
        return ir.passes.PassResult(model, modified=True)


def test_when_the_unfused_run_fails_too_the_other_pass_is_blamed(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setitem(pipeline.PASSES, "wrong", pipeline.PassSpec("wrong", "test only", lambda o: _ReluToSigmoidPass()))
    src, out, report_path = tmp_path / "m.onnx", tmp_path / "out.onnx", tmp_path / "r.json"
    onnx.save(_conv_bn(1e4), str(src))
    assert cli.main([str(src), "-o", str(out), "--passes", "simplify,wrong", "--report", str(report_path)]) == 1
    err = capsys.readouterr().err
    report = json.loads(report_path.read_text())
    assert not out.exists() and not report["written"]
    tried = report["check"]["without_fusions"]
    assert tried["fused"] == 1 and tried["unfused_check"].startswith("check failed"), tried
    assert report["check"]["first_difference"]["pass_name"] == "wrong"  # bisected without the fusions
    assert "hint: without simplify's fusions the check fails too" in err
    assert "hint: --skip wrong" in err and "--no-fuse keeps" not in err


def test_a_no_fuse_run_is_not_retried(tmp_path: pathlib.Path) -> None:
    """--no-fuse has nothing to leave out: one check, nothing tried without fusions."""
    src, report_path = tmp_path / "m.onnx", tmp_path / "r.json"
    onnx.save(_conv_bn(1e4), str(src))
    code = cli.main([str(src), "-o", str(tmp_path / "o.onnx"), "--no-fuse", "--report", str(report_path), "-q"])
    assert code == 0 and json.loads(report_path.read_text())["check"]["without_fusions"] is None
