"""After a mismatch: the first differing node, its inputs' errors, the pass that brought it; strict JSON."""

from __future__ import annotations

import json
import os
import pathlib

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

import passes
from passes import cli, pipeline
from test_check_inputs import cnn_model

REPO = pathlib.Path(__file__).resolve().parent.parent
DEMO = REPO / "models" / "demo.onnx"


class _Perturb(ir.passes.InPlacePass):
    """Test-only: a wrong rewrite of one node (a Relu becomes a LeakyRelu, same name and output)."""

    def __init__(self, node: str, op: str = "LeakyRelu") -> None:
        super().__init__()
        self.node, self.op = node, op

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        node = next(n for n in model.graph if n.name == self.node)
        node.op_type = self.op
        if self.op == "LeakyRelu":
            node.attributes["alpha"] = ir.AttrFloat32("alpha", 0.5)
        return ir.passes.PassResult(model, modified=True)


def _register(monkeypatch: pytest.MonkeyPatch, name: str, build) -> None:
    monkeypatch.setitem(pipeline.PASSES, name, pipeline.PassSpec(name, "test only", build))


def test_a_broken_pass_is_located_to_its_node_and_named(tmp_path: pathlib.Path, monkeypatch, capsys) -> None:
    _register(monkeypatch, "perturb", lambda o: _Perturb("relu1"))
    src, report = tmp_path / "cnn.onnx", tmp_path / "r.json"
    onnx.save_model(cnn_model(), str(src))
    code = cli.main([str(src), "-o", str(tmp_path / "o.onnx"), "--report", str(report),
                     "--passes", "upgrade,perturb,fold,decompose"])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 1
    found = json.loads(report.read_text())["check"]["first_difference"]
    assert (found["node"], found["op"], found["output"]) == ("relu1", "Relu", "r1")
    assert found["position"] == 4 and found["max_abs_error"] > 0
    assert {i["name"] for i in found["inputs"]} == {"c1"} and found["inputs"][0]["max_abs_error"] == 0
    assert found["pass_name"] == "perturb"
    assert [p["passes"] for p in found["pipelines"]] == [
        ["upgrade", "perturb", "fold", "cleanup"], ["upgrade", "perturb", "cleanup"], ["upgrade", "cleanup"]]
    assert [p["ok"] for p in found["pipelines"]] == [False, False, True]
    # One or two lines after the error message, said once (not in the summary too), and the way out.
    for line in ("first difference: node 'relu1' (Relu, #4 in the original)", "this node itself changed the result",
                 "introduced by pass 'perturb'", "hint: --skip perturb"):
        assert captured.err.count(line) == 1 and line not in captured.out, line


def test_a_changed_initializer_is_named_as_the_input_that_differs(monkeypatch) -> None:
    original = onnx.load(str(DEMO))
    broken = onnx.ModelProto()
    broken.CopyFrom(original)
    broken.graph.initializer[0].CopyFrom(numpy_helper.from_array(
        numpy_helper.to_array(original.graph.initializer[0]) * np.float32(1.1), "scale_base"))
    for form in (lambda m: m, lambda m: m.SerializeToString(), ir.serde.deserialize_model):
        result = passes.check(form(original), form(broken))
        assert not result.ok and result.checked
        found = result.first_difference
        assert found is not None and found.output and found.max_abs_error > 0, result.summary()
        differing = [i for i in found.inputs if not i["ok"]]
        assert [i["name"] for i in differing] == ["scale_base"] and differing[0]["kind"] == "initializer"
        assert "its input 'scale_base' (initializer) already differs" in result.summary()


def _relu_times(k: float, op: str = "Relu") -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node(op, ["x"], ["r"], name="act"), helper.make_node("Mul", ["r", "k"], ["y"], name="scale")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 64])],
        initializer=[numpy_helper.from_array(np.array(k, np.float32), "k")],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _no_constants(name: str) -> None:
    raise AssertionError(f"the report holds the non-JSON constant {name}")


def test_the_report_is_strict_json_after_a_failed_check(tmp_path: pathlib.Path, monkeypatch) -> None:
    # Where the original is 0 and the result is not, the relative error is infinite.
    _register(monkeypatch, "abs", lambda o: _Perturb("act", "Abs"))
    src, report = tmp_path / "m.onnx", tmp_path / "r.json"
    onnx.save_model(_relu_times(100.0), str(src))
    assert cli.main([str(src), "-o", str(tmp_path / "o.onnx"), "--passes", "abs", "--report", str(report),
                     "-q"]) == 1  # fmt: skip
    data = json.loads(report.read_text(), parse_constant=_no_constants)
    (output,) = data["check"]["outputs"]
    assert output["max_rel_error"] == "inf" and output["ok"] is False
    assert data["check"]["first_difference"]["node"] == "act"


def _chain(nodes: int, perturb_at: int | None = None) -> onnx.ModelProto:
    """``nodes`` nodes (Add, Mul, Tanh repeated) on a [batch, 256] float input."""
    rng = np.random.default_rng(0)
    inits, graph_nodes, prev = [], [], "x"
    for i in range(nodes):
        op = ("Add", "Mul", "Tanh")[i % 3]
        out = f"v{i}"
        if op == "Tanh":
            graph_nodes.append(helper.make_node("Tanh" if i != perturb_at else "Sigmoid", [prev], [out], name=f"n{i}"))
        else:
            c = numpy_helper.from_array((rng.standard_normal(256) * 0.1 + (1 if op == "Mul" else 0)).astype(np.float32),
                                        f"c{i}")  # fmt: skip
            inits.append(c)
            graph_nodes.append(helper.make_node(op, [prev, f"c{i}"], [out], name=f"n{i}"))
        prev = out
    graph = helper.make_graph(
        graph_nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 256])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, ["batch", 256])], initializer=inits,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_the_locator_on_a_500_node_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """The locator asks the worker once for all the values (it chunks them by memory there), not
    once per node: the requests are counted, not timed."""
    from passes.verify import child

    ops: list[str] = []
    real_request = child.Worker.request

    def counted(self, message, deadline):
        ops.append(message.get("op"))
        return real_request(self, message, deadline)

    monkeypatch.setattr(child.Worker, "request", counted)
    original, broken = _chain(501), _chain(501, perturb_at=251)
    result = passes.check(original, broken)
    assert not result.ok and result.first_difference.node == "n251"
    assert result.first_difference.compared > 500
    assert ops.count("values") == 1, ops


def test_the_pass_is_named_for_a_model_with_external_data(tmp_path: pathlib.Path, monkeypatch) -> None:
    """The locator's copies link the input's data file while the child runs them; the pipeline's
    reruns then load the input again, which refuses a data file with a second link: the copies are
    removed as soon as the child has answered."""
    _register(monkeypatch, "perturb", lambda o: _Perturb("relu1"))
    src, report = tmp_path / "cnn.onnx", tmp_path / "r.json"
    onnx.save_model(cnn_model(), str(src), save_as_external_data=True, location="cnn.onnx.data", size_threshold=0)
    assert cli.main([str(src), "-o", str(tmp_path / "o.onnx"), "--report", str(report), "-q",
                     "--passes", "upgrade,perturb"]) == 1  # fmt: skip
    found = json.loads(report.read_text())["check"]["first_difference"]
    assert found["node"] == "relu1" and found["pass_name"] == "perturb", found["pipelines"]
    assert os.stat(tmp_path / "cnn.onnx.data").st_nlink == 1


def test_a_fused_conv_is_not_compared_and_the_fused_away_node_is_named(tmp_path: pathlib.Path) -> None:
    """``optimize cnn.onnx out --rtol 0 --atol 0``: the fused Conv keeps its output's name but computes what
    the BatchNormalization after it did; comparing it with the original's Conv output blamed it for a
    difference of about 1 while the outputs differ by 1e-7. It is not compared now; the first difference
    is of the outputs' size, and the rewritten and fused-away nodes before it are named."""
    src = REPO / "models" / "real" / "small_cnn_opset11_nofold.onnx"
    report = tmp_path / "r.json"
    assert cli.main([str(src), str(tmp_path / "o.onnx"), "--rtol", "0", "--atol", "0", "--no-unfused-fallback", "--report", str(report),
                     "-q"]) == 1  # fmt: skip
    check = json.loads(report.read_text())["check"]
    found = check["first_difference"]
    worst_output = max(o["max_abs_error"] for o in check["outputs"])
    assert 0 < found["max_abs_error"] < 100 * worst_output, found  # not a Conv's pre-BN value against a post-BN one
    hows = {(r["op"], r["how"]) for r in found["rewritten"]}
    assert ("BatchNormalization", "fused away or removed") in hows and ("Conv", "rewritten") in hows
    original = onnx.load(str(src))
    convs = {o for n in original.graph.node if n.op_type == "Conv" for o in n.output}
    assert found["output"] not in convs


def _conv_bn(fused: bool) -> onnx.ModelProto:
    """x -> Conv -> BatchNormalization -> Relu; ``fused``: the BatchNormalization folded into the Conv's
    weights (new names), the Conv keeping its output's name, as simplify's fusion does."""
    w = numpy_helper.from_array(np.full((2, 1, 1, 1), 2.0, np.float32), "w_fused" if fused else "w")
    nodes = [helper.make_node("Conv", ["x", w.name], ["c"], name="conv")]
    inits = [w]
    if not fused:
        inits += [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in
                  (("s", [1.0, 1.0]), ("b", [0.5, 0.5]), ("m", [0.0, 0.0]), ("v", [1.0, 1.0]))]
        nodes.append(helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["y"], name="bn"))
    nodes.append(helper.make_node("Relu", ["c" if fused else "y"], ["r"], name="relu"))
    nodes.append(helper.make_node("Neg", ["r"], ["out"], name="neg"))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)], initializer=inits)
    return onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))


def test_only_values_made_from_the_same_values_are_compared() -> None:
    from passes.verify import locate

    original, fused = _conv_bn(False), _conv_bn(True)
    correspondence = locate.Correspondence(original, fused)
    names, _ = locate.comparable_values(original, fused, correspondence)
    assert "c" not in names  # same name, other weights: the fused Conv means what "y" meant
    assert "r" not in names  # its Relu reads "c" where the original's read "y"
    assert "out" in names  # made from "r" in both: compared
    found = locate.first_difference(original, {"out": {"ok": False, "max_abs_error": 1.0}}, correspondence)
    assert found.node == "neg" and [r["node"] for r in found.rewritten] == ["conv", "bn", "relu"]
    assert [r["how"] for r in found.rewritten] == ["rewritten", "fused away or removed", "rewritten"]
    assert "before it, the passes rewrote nodes" in found.summary() and "'bn' (BatchNormalization, fused away" \
        in found.summary()
    # An op changed with the same inputs (a broken pass) stays compared, so it is located.
    broken = onnx.ModelProto()
    broken.CopyFrom(original)
    broken.graph.node[2].op_type = "Sigmoid"
    assert "r" in locate.comparable_values(original, broken)[0]
