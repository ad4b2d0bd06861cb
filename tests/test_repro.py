"""``--repro DIR``: after a failed check, the smallest pair of models that still differ, their inputs, a README.

Each reproduction is checked as its reader would: both models pass the ONNX
checker, run in onnxruntime on ``inputs.npz`` and differ there beyond the
failing tolerance; and for what they must hold and must not (the nodes of the
region only, the weights they use only).
"""

from __future__ import annotations

import json
import os
import pathlib
import time

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from passes import cli, pipeline
from passes.verify import ddmin, reduce, repro

REPO = pathlib.Path(__file__).resolve().parent.parent
SMALL_CNN = REPO / "models" / "real" / "small_cnn_opset11_nofold.onnx"
F32 = TensorProto.FLOAT


class _Rewrite(ir.passes.InPlacePass):
    """Test-only: a wrong rewrite of the node named ``node`` in any graph or function (a Relu
    becomes a LeakyRelu), or the constant of each Add named ``late*`` nudged by ``nudge``."""

    def __init__(self, node: str = "", nudge: float = 0.0) -> None:
        super().__init__()
        self.node, self.nudge = node, nudge

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        graphs = [*model.graphs(), *model.functions.values()]
        for graph in graphs:
            for node in graph:
                if node.name == self.node:
                    node.op_type = "LeakyRelu"
                    node.attributes["alpha"] = ir.AttrFloat32("alpha", 0.5)
                if self.nudge and node.name.startswith("late") and node.inputs[1].const_value is not None:
                    value = node.inputs[1].const_value.numpy() + np.float32(self.nudge)
                    node.inputs[1].const_value = ir.Tensor(value.astype(np.float32), name=node.inputs[1].name)
        return ir.passes.PassResult(model, modified=True)


def _register(monkeypatch: pytest.MonkeyPatch, **options: object) -> None:
    monkeypatch.setitem(pipeline.PASSES, "rewrite",
                        pipeline.PassSpec("rewrite", "test only", lambda o: _Rewrite(**options)))  # fmt: skip


def _model(nodes: list, inputs: list, outputs: list, inits: list = (), functions: list = (),
           opsets: tuple = (("", 18),)) -> onnx.ModelProto:  # fmt: skip
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets],
                             functions=list(functions), ir_version=9)  # fmt: skip


def _weights(rng: np.random.Generator, name: str, *shape: int) -> onnx.TensorProto:
    return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)


def _optimize(tmp_path: pathlib.Path, model: onnx.ModelProto | pathlib.Path, *args: str,
              inputs: dict | None = None) -> tuple[int, pathlib.Path, dict]:  # fmt: skip
    if isinstance(model, pathlib.Path):
        source = model
    else:
        source = tmp_path / "m.onnx"
        onnx.save_model(model, str(source))
    extra = []
    if inputs is not None:
        np.savez(tmp_path / "inputs.npz", **inputs)
        extra = ["--inputs", str(tmp_path / "inputs.npz")]
    folder, report = tmp_path / "repro", tmp_path / "report.json"
    code = cli.main([str(source), "-o", str(tmp_path / "out.onnx"), "--repro", str(folder), "--report", str(report),
                     "-q", *extra, *args])  # fmt: skip
    return code, folder, json.loads(report.read_text()) if report.exists() else {}


def _ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def _shown(folder: pathlib.Path) -> tuple[onnx.ModelProto, onnx.ModelProto, dict[str, np.ndarray]]:
    """The reproduction as its reader checks it: the ONNX checker passes both models, onnxruntime
    runs them on inputs.npz and their outputs differ beyond the README's tolerance."""
    models = [onnx.load(str(folder / f"{name}.onnx")) for name in ("original", "optimized")]
    for name in ("original", "optimized"):
        onnx.checker.check_model(str(folder / f"{name}.onnx"), full_check=True)
    with np.load(folder / "inputs.npz") as archive:
        inputs = {k: archive[k] for k in archive.files}
    outputs = []
    for name, model in zip(("original", "optimized"), models):
        session = ort.InferenceSession(str(folder / f"{name}.onnx"), providers=["CPUExecutionProvider"])
        feeds = {}
        for arg in session.get_inputs():
            value = inputs[arg.name]
            feeds[arg.name] = value.astype(np.float16) if arg.type == "tensor(float16)" else value
        outputs.append(dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds))))
    assert set(outputs[0]) == set(outputs[1]) and len(outputs[0]) == 1
    (name,) = outputs[0]
    readme = (folder / "README.txt").read_text()
    tolerance = readme.split("Tolerance:")[1].split("\n")[0].split()
    rtol, atol = float(tolerance[1]), float(tolerance[3])
    expected, actual = outputs[0][name], outputs[1][name].astype(outputs[0][name].dtype)
    assert expected.shape == actual.shape
    assert not np.allclose(actual, expected, rtol=rtol, atol=atol), (rtol, atol)
    assert sorted(os.listdir(folder)) == sorted(f for f in repro.FILES if (folder / f).exists())
    assert set(inputs) == {i.name for m in models for i in m.graph.input}
    return models[0], models[1], inputs


def _rerun(folder: pathlib.Path, *flags: str) -> int:
    return repro.main([str(folder), *flags])


# --- the main graph -------------------------------------------------------------------------------


def test_the_batchnorm_fusions_rounding_on_the_real_cnn(tmp_path: pathlib.Path, capsys) -> None:
    """The issue's case: exit 1, nothing else written, DIR holds two models of at most 6 nodes and
    an npz, and onnxruntime shows the difference on them (also through the README's command)."""
    code, folder, report = _optimize(tmp_path, SMALL_CNN, "--rtol", "0", "--atol", "0", "--no-unfused-fallback")
    err = capsys.readouterr().err
    assert code == 1 and not (tmp_path / "out.onnx").exists()
    assert sorted(os.listdir(tmp_path)) == ["report.json", "repro"]
    original, optimized, inputs = _shown(folder)
    assert len(original.graph.node) <= 6 and len(optimized.graph.node) <= 6
    assert "BatchNormalization" in _ops(original) and "BatchNormalization" not in _ops(optimized)
    assert list(inputs) == ["pixels"]  # the region starts at the graph input: the first Conv's
    # Only the weights the region uses: the first Conv's and its BatchNormalization's.
    assert {t.name for t in original.graph.initializer} == {
        "stem.0.weight", "stem.0.bias", "stem.1.weight", "stem.1.bias", "stem.1.running_mean", "stem.1.running_var"}
    assert len(optimized.graph.initializer) == 2
    record = report["check"]["repro"]
    assert record["written"] and record["folder"] == str(folder) and record["stopped"] is None
    assert f"reproduction: '{folder}': 3 and 2 node(s) whose output '/stem/stem.2/Relu_output_0' differs in " in err
    readme = (folder / "README.txt").read_text()
    command = readme.split("The command that failed:\n")[1].split("\n")[0]
    assert command.startswith(f"  optimize {SMALL_CNN} -o ") and command.endswith("--rtol 0 --atol 0 --no-unfused-fallback")
    assert "Pass:            simplify" in readme and "Tolerance:       rtol 0 atol 0" in readme
    assert _rerun(folder, "--rtol", "0", "--atol", "0") == 1
    assert "DIFFERS" in capsys.readouterr().out
    assert _rerun(folder) == 0  # at float32's default tolerance, they agree


def _chain(broken_at: int) -> onnx.ModelProto:
    """x -> (MatMul, Add, Relu) x 4 -> y; the Relu ``relu{broken_at}`` is the one a pass breaks."""
    rng = np.random.default_rng(1)
    nodes, inits, prev = [], [], "x"
    for i in range(4):
        inits += [_weights(rng, f"w{i}", 16, 16), _weights(rng, f"b{i}", 16)]
        nodes += [helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"], name=f"matmul{i}"),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"], name=f"add{i}"),
                  helper.make_node("Relu", [f"a{i}"], [f"r{i}"], name=f"relu{i}")]
        prev = f"r{i}"
    nodes.append(helper.make_node("Identity", [prev], ["y"], name="out"))
    return _model(nodes, [helper.make_tensor_value_info("x", F32, ["n", 16])],
                  [helper.make_tensor_value_info("y", F32, ["n", 16])], inits)  # fmt: skip


def test_a_broken_node_in_the_main_graph_is_reproduced_alone(tmp_path: pathlib.Path, monkeypatch) -> None:
    _register(monkeypatch, node="relu2")
    code, folder, report = _optimize(tmp_path, _chain(2), "--passes", "rewrite")
    assert code == 1
    original, optimized, inputs = _shown(folder)
    assert (_ops(original), _ops(optimized)) == (["Relu"], ["LeakyRelu"])
    assert list(inputs) == ["a2"] and not original.graph.initializer
    assert report["check"]["repro"]["output"] == "r2"


def test_the_no_op_writes_nothing(tmp_path: pathlib.Path) -> None:
    """A check that passes leaves DIR alone (not even created)."""
    code, folder, report = _optimize(tmp_path, _chain(2), "--passes", "fold")
    assert code == 0 and not folder.exists() and report["check"]["repro"] is None


def test_without_repro_the_hint_names_it(tmp_path: pathlib.Path, monkeypatch, capsys) -> None:
    _register(monkeypatch, node="relu2")
    source = tmp_path / "m.onnx"
    onnx.save_model(_chain(2), str(source))
    assert cli.main([str(source), "-o", str(tmp_path / "o.onnx"), "--passes", "rewrite"]) == 1
    assert "hint: --repro DIR writes the smallest pair of models" in capsys.readouterr().err


class _Halving(ir.passes.InPlacePass):
    """Test-only: (x * k) / k -> x with both nodes kept as Identity: their output names stay, but
    the first one's value is another (x, not kx); the result differs only where kx overflows."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        for node in model.graph:
            if node.name in ("double", "halve"):
                node.op_type = "Identity"
                node.resize_inputs(1)
        return ir.passes.PassResult(model, modified=True)


def test_a_name_that_holds_another_value_is_neither_the_target_nor_a_cut(tmp_path: pathlib.Path,
                                                                         monkeypatch) -> None:  # fmt: skip
    """m names kx in the original and x in the optimised model: substituting one for the other
    changes the result, so m is neither what the reproduction shows nor where it is cut; y is, from
    x, on the edge-value inputs (1e30 * 1e10 overflows) where the check failed."""
    monkeypatch.setitem(pipeline.PASSES, "halving", pipeline.PassSpec("halving", "test only", lambda o: _Halving()))
    k = numpy_helper.from_array(np.array(1e10, np.float32), "k")
    nodes = [helper.make_node("Mul", ["x", "k"], ["m"], name="double"),
             helper.make_node("Div", ["m", "k"], ["y"], name="halve")]
    model = _model(nodes, [helper.make_tensor_value_info("x", F32, ["n", 8])],
                   [helper.make_tensor_value_info("y", F32, ["n", 8])], [k])  # fmt: skip
    code, folder, report = _optimize(tmp_path, model, "--passes", "halving")
    assert code == 1
    (failure,) = [o for o in report["check"]["outputs"] if not o["ok"]]
    assert failure["input_set"] != "normal"
    original, optimized, inputs = _shown(folder)
    assert (_ops(original), _ops(optimized)) == (["Mul", "Div"], ["Identity", "Identity"])
    assert list(inputs) == ["x"] and report["check"]["repro"]["output"] == "y"
    assert (np.abs(inputs["x"]) >= 1e30).any()  # the edge values


class _BadFold(ir.passes.InPlacePass):
    """Test-only: the Add of two constants named ``sum`` folded into a wrong constant of its output's name."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        node = next(n for n in model.graph if n.name == "sum")
        value = sum(v.const_value.numpy() for v in node.inputs) + np.float32(1)
        folded = ir.Value(name=node.outputs[0].name, const_value=ir.Tensor(value.astype(np.float32)))
        ir.convenience.replace_all_uses_with(node.outputs[0], folded)
        model.graph.remove(node, safe=True)
        node.outputs[0].name = "unused"
        model.graph.register_initializer(folded)
        return ir.passes.PassResult(model, modified=True)


def test_a_wrong_constant_is_reproduced_as_the_nodes_against_the_constant(tmp_path: pathlib.Path,
                                                                          monkeypatch) -> None:  # fmt: skip
    """Where the optimised model holds a constant the original computes, its region has no node:
    the constant is its output."""
    monkeypatch.setitem(pipeline.PASSES, "badfold", pipeline.PassSpec("badfold", "test only", lambda o: _BadFold()))
    rng = np.random.default_rng(9)
    nodes = [helper.make_node("Add", ["k1", "k2"], ["c"], name="sum"),
             helper.make_node("Mul", ["x", "c"], ["y"], name="scale")]
    model = _model(nodes, [helper.make_tensor_value_info("x", F32, ["n", 8])],
                   [helper.make_tensor_value_info("y", F32, ["n", 8])],
                   [_weights(rng, "k1", 8), _weights(rng, "k2", 8)])  # fmt: skip
    code, folder, report = _optimize(tmp_path, model, "--passes", "badfold")
    assert code == 1
    original, optimized, inputs = _shown(folder)
    assert (_ops(original), _ops(optimized)) == (["Add"], [])
    assert [t.name for t in optimized.graph.initializer] == ["c"] and not inputs
    assert report["check"]["repro"]["output"] == "c"


# --- subgraphs and functions --------------------------------------------------------------------


def _if_model() -> onnx.ModelProto:
    """a = x + w; y = If(c) then (Relu(a) * k, named inner) else -a; z = y * 2."""
    rng = np.random.default_rng(2)
    k = numpy_helper.from_array(np.full(8, 3.0, np.float32), "k")
    then = helper.make_graph(
        [helper.make_node("Relu", ["a"], ["t"], name="inner"), helper.make_node("Mul", ["t", "k"], ["then_y"])],
        "then", [], [helper.make_tensor_value_info("then_y", F32, None)], initializer=[k])
    other = helper.make_graph([helper.make_node("Neg", ["a"], ["else_y"])], "else", [],
                              [helper.make_tensor_value_info("else_y", F32, None)])  # fmt: skip
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    nodes = [helper.make_node("Add", ["x", "w"], ["a"], name="add"),
             helper.make_node("If", ["c"], ["y"], name="branch", then_branch=then, else_branch=other),
             helper.make_node("Mul", ["y", "two"], ["z"], name="double")]
    return _model(nodes, [helper.make_tensor_value_info("x", F32, ["n", 8]),
                          helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                  [helper.make_tensor_value_info("z", F32, ["n", 8])], [_weights(rng, "w", 8), two])  # fmt: skip


def _function_model() -> onnx.ModelProto:
    """y = local::Act(x + w) * 2 where Act(a) = Relu(a) (named inner) * Sigmoid(a)."""
    rng = np.random.default_rng(4)
    act = helper.make_function(
        "local", "Act", ["a"], ["o"],
        [helper.make_node("Relu", ["a"], ["r"], name="inner"), helper.make_node("Sigmoid", ["a"], ["s"]),
         helper.make_node("Mul", ["r", "s"], ["o"])], [helper.make_opsetid("", 18)])  # fmt: skip
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    nodes = [helper.make_node("Add", ["x", "w"], ["a"], name="add"),
             helper.make_node("Act", ["a"], ["h"], name="call", domain="local"),
             helper.make_node("Mul", ["h", "two"], ["y"], name="double")]
    return _model(nodes, [helper.make_tensor_value_info("x", F32, ["n", 8])],
                  [helper.make_tensor_value_info("y", F32, ["n", 8])], [_weights(rng, "w", 8), two], [act],
                  (("", 18), ("local", 1)))  # fmt: skip


def _loop_model() -> onnx.ModelProto:
    """a = x + w; v = Loop 3 times: v = Relu(v) (named inner) * 0.5 + 1; y = v * 2."""
    rng = np.random.default_rng(5)
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Relu", ["v_in"], ["r"], name="inner"),
         helper.make_node("Mul", ["r", "half"], ["m"]), helper.make_node("Add", ["m", "one"], ["v_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("v_in", F32, None)],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", F32, None)],
        initializer=[numpy_helper.from_array(np.array(0.5, np.float32), "half"),
                     numpy_helper.from_array(np.array(1.0, np.float32), "one")])  # fmt: skip
    nodes = [helper.make_node("Add", ["x", "w"], ["a"], name="add"),
             helper.make_node("Loop", ["trips", "", "a"], ["v"], name="loop", body=body),
             helper.make_node("Mul", ["v", "two"], ["y"], name="double")]
    inits = [_weights(rng, "w", 8), numpy_helper.from_array(np.array(3, np.int64), "trips"),
             numpy_helper.from_array(np.array(2.0, np.float32), "two")]
    return _model(nodes, [helper.make_tensor_value_info("x", F32, ["n", 8])],
                  [helper.make_tensor_value_info("y", F32, ["n", 8])], inits)  # fmt: skip


_X = np.random.default_rng(3).standard_normal((4, 8)).astype(np.float32)


@pytest.mark.parametrize(("build", "given", "read", "where"), [
    (_if_model, {"x": _X, "c": np.array(True)}, "a", "the then_branch of If node 'branch' in the main graph"),
    (_function_model, None, "a", "function local::Act called by node 'call' in the main graph"),
    (_loop_model, None, "v_in", "the body of Loop node 'loop' (its first iteration) in the main graph"),
], ids=["if-branch", "function-call", "loop-body"])  # fmt: skip
def test_a_difference_inside_a_subgraph_is_reproduced_inside_it(tmp_path: pathlib.Path, monkeypatch, build,
                                                                given: dict | None, read: str, where: str) -> None:  # fmt: skip
    """The If branch taken, the inlined function call or the Loop body's first iteration becomes
    the graph, the value it reads from outside an input: the Relu the pass broke, alone (no If,
    no Loop, no function left)."""
    _register(monkeypatch, node="inner")
    code, folder, report = _optimize(tmp_path, build(), "--passes", "rewrite", inputs=given)
    assert code == 1
    original, optimized, inputs = _shown(folder)
    assert (_ops(original), _ops(optimized)) == (["Relu"], ["LeakyRelu"])
    assert not original.functions and not optimized.functions
    assert [o.domain for o in original.opset_import] == [""]
    assert list(inputs) == [read] and report["check"]["repro"]["where"] == where
    if given is not None:  # the value the branch read from the main graph: a = x + w
        assert np.array_equal(inputs["a"], _X + numpy_helper.to_array(build().graph.initializer[0]))


# --- --precision ----------------------------------------------------------------------------------


def _cancellation() -> onnx.ModelProto:
    """(x @ w + 1000) - 1000, then @ w2: float16 keeps 0.5 steps near 1000 (test_precision's case)."""
    rng = np.random.default_rng(7)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="matmul"),
             helper.make_node("Add", ["h", "k"], ["shifted"], name="shift"),
             helper.make_node("Sub", ["shifted", "k"], ["back"], name="back"),
             helper.make_node("MatMul", ["back", "w2"], ["y"], name="head")]
    inits = [numpy_helper.from_array((rng.standard_normal((16, 16)) * 0.3).astype(np.float32), "w"),
             numpy_helper.from_array(np.array(1000.0, np.float32), "k"),
             numpy_helper.from_array((rng.standard_normal((16, 8)) * 0.3).astype(np.float32), "w2")]
    return _model(nodes, [helper.make_tensor_value_info("x", F32, ["N", 16])],
                  [helper.make_tensor_value_info("y", F32, ["N", 8])], inits)  # fmt: skip


@pytest.mark.parametrize("io", [False, True])
def test_a_precision_failure_is_reproduced_as_the_half_region_and_its_float32_original(
        tmp_path: pathlib.Path, monkeypatch, io: bool) -> None:  # fmt: skip
    """Without the pass's own search for float32 islands, the converted model fails the check; the
    reproduction is the half region (float16 nodes and weights) against the float32 one."""
    import passes.precision

    monkeypatch.setattr(passes.precision.PrecisionPass, "_search", lambda self, *args: None)
    flags = ["--precision", "fp16", "--precision-tolerance", "1e-4,1e-5", *(["--precision-io"] if io else [])]
    code, folder, report = _optimize(tmp_path, _cancellation(), "--passes", "precision", *flags)
    assert code == 1
    original, optimized, inputs = _shown(folder)
    # At this tolerance the first MatMul already differs: its float16 form (after the Cast of x,
    # or fed x in float16 with --precision-io) against the float32 one.
    assert _ops(original) == ["MatMul"] and _ops(optimized) == (["MatMul"] if io else ["Cast", "MatMul"])
    assert optimized.graph.input[0].type.tensor_type.elem_type == (TensorProto.FLOAT16 if io else F32)
    assert {t.data_type for t in original.graph.initializer} == {F32}
    assert {t.data_type for t in optimized.graph.initializer} == {TensorProto.FLOAT16}
    assert all(v.dtype == np.float32 for v in inputs.values())  # the float32 original's values
    record = report["check"]["repro"]
    assert (record["rtol"], record["atol"]) == (1e-4, 1e-5)
    assert "--scale" in record["rerun"]  # a --precision model is compared against the output's scale too
    assert _rerun(folder, "--rtol", "1e-4", "--atol", "1e-5", "--scale") == 1


# --- the budget -----------------------------------------------------------------------------------


def _drift() -> onnx.ModelProto:
    """Six Adds in a row; the pass nudges the last three's constants by 4e-6 each, so no single
    Add differs beyond atol 1e-5 but three do: the region must grow to them."""
    rng = np.random.default_rng(6)
    nodes, inits, prev = [], [], "x"
    for i in range(6):
        inits.append(_weights(rng, f"c{i}", 8))
        nodes.append(helper.make_node("Add", [prev, f"c{i}"], [f"v{i}"], name=f"{'late' if i >= 3 else 'early'}{i}"))
        prev = f"v{i}"
    nodes.append(helper.make_node("Identity", [prev], ["y"], name="out"))
    return _model(nodes, [helper.make_tensor_value_info("x", F32, ["n", 8])],
                  [helper.make_tensor_value_info("y", F32, ["n", 8])], inits)  # fmt: skip


def test_the_region_grows_until_the_difference_shows_then_shrinks(tmp_path: pathlib.Path, monkeypatch) -> None:
    """No single node differs beyond the tolerance: the region grows (then delta debugging gives
    back what it can) to the three nudged Adds, fed the value before them."""
    _register(monkeypatch, nudge=4e-6)
    code, folder, report = _optimize(tmp_path, _drift(), "--passes", "rewrite", "--rtol", "0", "--atol", "1e-5")
    assert code == 1
    original, optimized, inputs = _shown(folder)
    names = [n.name for n in original.graph.node]
    assert names == ["late3", "late4", "late5"] == [n.name for n in optimized.graph.node]
    assert list(inputs) == ["v2"]
    record = report["check"]["repro"]
    assert record["output"] == "v5" and record["stopped"] is None and record["tests"] >= 4


def test_the_time_budget_stops_with_the_smallest_reproduction_found_by_then(tmp_path: pathlib.Path,
                                                                            monkeypatch) -> None:  # fmt: skip
    """The clock jumps past the budget after the third comparison (of the target's value, then the
    tightest region, which does not differ, then the whole cone from the graph input, which does):
    that is what is written, and the README and the report say so."""
    _register(monkeypatch, nudge=4e-6)
    compared = []
    request = reduce.Search._request

    def counted(self: reduce.Search, message: dict, models: pathlib.Path) -> dict:
        answer = request(self, message, models)
        compared.append(message["op"])
        return answer

    monkeypatch.setattr(reduce.Search, "_request", counted)
    monkeypatch.setattr(reduce, "now", lambda: time.monotonic() + (1e6 if compared.count("regions") >= 3 else 0))
    code, folder, report = _optimize(tmp_path, _drift(), "--passes", "rewrite", "--rtol", "0", "--atol", "1e-5")
    assert code == 1
    original, optimized, inputs = _shown(folder)
    assert len(original.graph.node) == len(optimized.graph.node) == 6 and list(inputs) == ["x"]
    record = report["check"]["repro"]
    assert record["stopped"] == "the time budget ran out" and record["tests"] == 2
    assert "stopped early (the time budget ran out): the smallest reproduction found by then" in (
        folder / "README.txt").read_text()


def test_a_child_that_runs_out_of_memory_stops_the_search_with_what_it_found(tmp_path: pathlib.Path,
                                                                             monkeypatch) -> None:  # fmt: skip
    """The fourth comparison kills the child (as its memory bound would): the whole cone found by
    the third is written, and why the search stopped is said."""
    from passes.verify import child

    _register(monkeypatch, nudge=4e-6)
    compared = []
    request = child.Worker.request

    def dies_once(self: child.Worker, message: dict, deadline: float) -> dict:
        if message["op"] == "regions":
            compared.append(message)
            if len(compared) == 4:
                raise child.WorkerCrashed("onnxruntime crashed (SIGKILL) (killed: out of memory?)", "regions")
        return request(self, message, deadline)

    monkeypatch.setattr(child.Worker, "request", dies_once)
    code, folder, report = _optimize(tmp_path, _drift(), "--passes", "rewrite", "--rtol", "0", "--atol", "1e-5")
    assert code == 1
    original, _, inputs = _shown(folder)
    assert len(original.graph.node) == 6 and list(inputs) == ["x"]
    record = report["check"]["repro"]
    assert record["stopped"].startswith("the check's process stopped (onnxruntime crashed (SIGKILL)")
    assert "the memory budget" in (folder / "README.txt").read_text()


def test_the_capture_budget_keeps_the_values_nearest_the_difference(tmp_path: pathlib.Path, monkeypatch) -> None:
    """With room for the graph input only, nothing can be cut: the region is the whole cone from
    the input, and the README says why."""
    _register(monkeypatch, node="relu2")
    monkeypatch.setattr(reduce, "CAPTURE_BYTES", 1)
    code, folder, report = _optimize(tmp_path, _chain(2), "--passes", "rewrite")
    assert code == 1
    original, optimized, inputs = _shown(folder)
    assert list(inputs) == ["x"] and len(original.graph.node) == 9 and _ops(optimized)[-1] == "LeakyRelu"
    (note,) = report["check"]["repro"]["notes"]
    assert note.startswith("the capture budget (1 bytes) left 8 value(s) upstream of 'r2' in the main graph")
    assert note in (folder / "README.txt").read_text()


# --- DIR: what may be written ---------------------------------------------------------------------


def _refused(tmp_path: pathlib.Path, capsys, folder: pathlib.Path, *extra: str,
             source: pathlib.Path | None = None) -> str:  # fmt: skip
    if source is None:
        source = tmp_path / "m.onnx"
        onnx.save_model(_chain(2), str(source))
    code = cli.main([str(source), "-o", str(tmp_path / "o.onnx"), "--passes", "rewrite", "--repro", str(folder),
                     *extra])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and not (tmp_path / "o.onnx").exists(), err
    return err


def test_a_folder_that_is_not_a_reproductions_is_refused_before_the_run(tmp_path: pathlib.Path, monkeypatch,
                                                                         capsys) -> None:  # fmt: skip
    _register(monkeypatch, node="relu2")
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    assert "exists and is not a folder" in _refused(tmp_path, capsys, a_file)
    assert a_file.read_text() == "mine"
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "README.txt").write_text("theirs")
    (busy / "data.bin").write_bytes(b"x")
    assert "holds files that are not a reproduction's ('data.bin')" in _refused(tmp_path, capsys, busy)
    assert (busy / "README.txt").read_text() == "theirs" and sorted(os.listdir(busy)) == ["README.txt", "data.bin"]
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    assert "is a symbolic link" in _refused(tmp_path, capsys, link)
    assert "does not exist" in _refused(tmp_path, capsys, tmp_path / "no" / "such")
    assert "needs the check" in _refused(tmp_path, capsys, tmp_path / "new", "--no-check")
    models = tmp_path / "models"
    models.mkdir()
    onnx.save_model(_chain(2), str(models / "original.onnx"))  # a reproduction's name: it would be replaced
    assert "which this run reads" in _refused(tmp_path, capsys, models, source=models / "original.onnx")
    assert "is for one model" in _refused(tmp_path, capsys, tmp_path / "new", source=models)
    assert sorted(os.listdir(tmp_path)) == ["busy", "link", "m.onnx", "models", "notes.txt"]


def test_an_empty_folder_or_a_previous_reproduction_is_replaced_whole(tmp_path: pathlib.Path, monkeypatch) -> None:
    _register(monkeypatch, node="relu2")
    folder = tmp_path / "repro"
    folder.mkdir()
    assert _optimize(tmp_path, _chain(2), "--passes", "rewrite")[0] == 1
    assert sorted(os.listdir(folder)) == ["README.txt", "inputs.npz", "optimized.onnx", "original.onnx"]
    (folder / "original.onnx.data").write_bytes(b"a previous reproduction's weights")
    _register(monkeypatch, node="relu1")
    code, _, report = _optimize(tmp_path, _chain(2), "--passes", "rewrite")
    assert code == 1 and report["check"]["repro"]["output"] == "r1"
    assert sorted(os.listdir(folder)) == ["README.txt", "inputs.npz", "optimized.onnx", "original.onnx"]
    assert _shown(folder)[2].keys() == {"a1"}
    assert sorted(os.listdir(tmp_path)) == ["m.onnx", "report.json", "repro"]  # no temporary folder left


def test_the_python_api_writes_it_too(tmp_path: pathlib.Path, monkeypatch) -> None:
    """``passes.optimize`` on a ModelProto with ``CheckOptions(repro=DIR)``: the in-memory route."""
    import passes

    _register(monkeypatch, node="relu2")
    folder = tmp_path / "repro"
    with pytest.raises(passes.CheckFailedError, match="reproduction: .*1 and 1 node"):
        passes.optimize(_chain(2), passes=["rewrite"], check=pipeline.CheckOptions(repro=folder))
    original, optimized, _ = _shown(folder)
    assert (_ops(original), _ops(optimized)) == (["Relu"], ["LeakyRelu"])
    assert "(the Python API: passes.optimize)" in (folder / "README.txt").read_text()


@pytest.mark.parametrize("tolerance", ["default", "tight"])
def test_when_the_precision_search_gives_up_the_difference_is_reproduced(tmp_path: pathlib.Path, monkeypatch,
                                                                         capsys, tolerance: str) -> None:  # fmt: skip
    """The precision pass refuses a model its float32 islands cannot fix (no round left): the
    converted model's difference is reproduced (the half region against its float32 original),
    or where the converted model matches (onnxruntime computes float16 Gemm in float32), the
    emulation the search checked, and the README says which; without --repro, the hint names it."""
    import passes.precision

    monkeypatch.setattr(passes.precision, "MAX_ROUNDS", 0)
    tight = ["--precision-tolerance", "1e-4,1e-5"] if tolerance == "tight" else []
    code, folder, _ = _optimize(tmp_path, _cancellation(), "--precision", "fp16", *tight)
    err = capsys.readouterr().err
    assert code == 1 and not (tmp_path / "out.onnx").exists()
    assert err.startswith("optimize: error: --precision fp16: the float16 model still differs") and (
        f"reproduction: '{folder}':" in err)
    original, optimized, inputs = _shown(folder)
    assert len(original.graph.node) <= 6 and len(optimized.graph.node) <= 8
    assert all(t.data_type == F32 for t in original.graph.initializer)
    readme = (folder / "README.txt").read_text()
    if tolerance == "tight":
        assert any(t.data_type == TensorProto.FLOAT16 for t in optimized.graph.initializer)
        assert "emulation" not in readme
    else:
        assert "Note:            the fp16 model itself matches" in readme and "emulation" in readme
        assert "Sub" in _ops(original) and _ops(optimized).count("Cast") >= 2
    source = tmp_path / "m.onnx"
    assert cli.main([str(source), "-o", str(tmp_path / "out.onnx"), "--precision", "fp16", *tight]) == 1
    assert "hint: --repro DIR writes the smallest pair of models" in capsys.readouterr().err


# --- what the models hold -------------------------------------------------------------------------


def test_only_the_regions_weights_are_kept_the_large_ones_external(tmp_path: pathlib.Path, monkeypatch) -> None:
    """A model with external weights: the region's 1 MiB constant is the only tensor in each
    reproduction's data file; the other large weight, which the region does not use, is dropped."""
    _register(monkeypatch, nudge=1e-3)
    rng = np.random.default_rng(8)
    size = 1 << 18  # float32: 1 MiB
    nodes = [helper.make_node("Add", ["x", "c"], ["a"], name="late0"),
             helper.make_node("Mul", ["a", "d"], ["y"], name="scale")]
    model = _model(nodes, [helper.make_tensor_value_info("x", F32, ["n", size])],
                   [helper.make_tensor_value_info("y", F32, ["n", size])],
                   [_weights(rng, "c", size), _weights(rng, "d", size)])  # fmt: skip
    c = numpy_helper.to_array(model.graph.initializer[0])
    source = tmp_path / "m.onnx"
    onnx.save_model(model, str(source), save_as_external_data=True, location="m.onnx.data")
    code, folder, report = _optimize(tmp_path, source, "--passes", "rewrite")
    assert code == 1
    # The locator's copies no longer link the input's data file when the pipeline reruns from it.
    assert report["check"]["first_difference"]["pass_name"] == "rewrite"
    original, optimized, _ = _shown(folder)
    assert (_ops(original), _ops(optimized)) == (["Add"], ["Add"])
    for name in ("original", "optimized"):
        (tensor,) = onnx.load(str(folder / f"{name}.onnx"), load_external_data=False).graph.initializer
        assert tensor.name == "c" and tensor.data_location == TensorProto.EXTERNAL
        assert (folder / f"{name}.onnx").stat().st_size < 4096
        assert (folder / f"{name}.onnx.data").stat().st_size == size * 4
    stored = [numpy_helper.to_array(m.graph.initializer[0]) for m in (original, optimized)]
    assert np.array_equal(stored[0], c) and np.allclose(stored[1], c + np.float32(1e-3))
    assert np.array_equal(numpy_helper.to_array(onnx.load(str(source)).graph.initializer[0]), c)  # the input's


@pytest.mark.parametrize("seed", range(3))
def test_ddmin_finds_exactly_what_a_monotone_difference_needs(seed: int) -> None:
    from hypothesis import given, strategies as st

    @given(st.lists(st.text(min_size=1, max_size=3), unique=True, max_size=24), st.data())
    def check(items: list[str], data: st.DataObject) -> None:
        required = set(data.draw(st.lists(st.sampled_from(items), unique=True) if items else st.just([])))
        calls: list[list[str]] = []

        def holds(subset: list[str]) -> bool:
            calls.append(subset)
            return required <= set(subset)

        found = ddmin.ddmin(list(items), holds)
        assert found == [x for x in items if x in required]
        assert len(calls) <= 2 * len(items) ** 2 + 2

    check()


def test_the_transcript_in_docs_check_md_is_the_real_output(tmp_path: pathlib.Path, capsys) -> None:
    """docs/check.md's run, replayed: the reproduction's line in the error, its files, its README
    and what the command that reruns it prints are the real output."""
    import shutil

    text = (REPO / "docs" / "check.md").read_text(encoding="utf-8")
    transcript = text.split("## A reproduction to attach")[1].split("```\n$ ")[1].split("\n```")[0]
    shutil.copytree(REPO / "models" / "real", tmp_path / "models" / "real")
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert cli.main(["models/real/small_cnn_opset11_nofold.onnx", "cnn.opt.onnx", "--rtol", "0", "--atol", "0",
                         "--no-unfused-fallback", "--repro", "cnn-repro", "-q"]) == 1  # fmt: skip
        err = capsys.readouterr().err
        assert repro.main(["cnn-repro", "--rtol", "0", "--atol", "0"]) == 1
        rerun = capsys.readouterr().out
    finally:
        os.chdir(cwd)
    (line,) = [x for x in err.splitlines() if x.startswith("reproduction:")]
    readme = (tmp_path / "cnn-repro" / "README.txt").read_text()
    listing = "\n".join(sorted(os.listdir(tmp_path / "cnn-repro")))
    for shown in (line, readme.strip(), listing, rerun.strip()):
        assert shown in transcript, shown


def test_values_are_captured_and_fed_back_as_they_were(tmp_path: pathlib.Path) -> None:
    """Strings (saved as text, no pickles) and bfloat16 (saved as its bytes) come back as onnxruntime
    takes them."""
    import ml_dtypes

    from passes.verify import repro_child

    values = {"s": np.array(["a", "bc", ""], dtype=object),
              "b": np.array([1.5, -0.0, np.inf], dtype=ml_dtypes.bfloat16),
              "i": np.array([[np.iinfo(np.int64).min]], np.int64)}  # fmt: skip
    types = {"s": TensorProto.STRING, "b": TensorProto.BFLOAT16, "i": TensorProto.INT64}
    model = _model([helper.make_node("Identity", [n], [f"{n}_out"]) for n in values],
                   [helper.make_tensor_value_info(n, t, None) for n, t in types.items()],
                   [helper.make_tensor_value_info(f"{n}_out", t, None) for n, t in types.items()])  # fmt: skip
    onnx.save_model(model, str(tmp_path / "m.onnx"))
    saved = repro_child.capture({"folder": str(tmp_path / "values"), "model": str(tmp_path / "m.onnx"),
                                 "names": ["s_out"]}, values)  # fmt: skip
    assert saved["ok"] and list(saved["values"]) == ["s", "b", "i", "s_out"]
    files = saved["values"]
    loaded = repro_child.load_feeds(files)
    assert loaded["s"].dtype == object and list(loaded["s"]) == ["a", "bc", ""]
    assert loaded["b"].dtype == ml_dtypes.bfloat16 and np.array_equal(loaded["b"].view(np.uint16),
                                                                      values["b"].view(np.uint16))  # fmt: skip
    assert np.array_equal(loaded["i"], values["i"]) and list(loaded["s_out"]) == ["a", "bc", ""]


def test_a_reproduction_that_cannot_be_made_leaves_the_checks_verdict(tmp_path: pathlib.Path, monkeypatch,
                                                                      capsys) -> None:  # fmt: skip
    """An error inside the search is a line of the failure, not an internal error: exit 1, DIR
    not written."""
    from passes.verify import region

    _register(monkeypatch, node="relu2")

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a region that cannot be built")

    monkeypatch.setattr(region, "region_model", broken)
    code, folder, report = _optimize(tmp_path, _chain(2), "--passes", "rewrite")
    assert code == 1 and not folder.exists()
    record = report["check"]["repro"]
    assert not record["written"] and record["message"].startswith("internal error (RuntimeError: a region that")
    assert f"reproduction: none written to '{folder}': internal error" in capsys.readouterr().err


def test_the_rerun_command_refuses_what_is_not_a_reproduction(tmp_path: pathlib.Path, capsys) -> None:
    assert repro.main([str(tmp_path / "none")]) == 2
    assert capsys.readouterr().err.startswith("repro: error: ")
    (tmp_path / "original.onnx").write_bytes(b"not a model")
    (tmp_path / "optimized.onnx").write_bytes(b"not a model")
    np.savez(tmp_path / "inputs.npz", x=np.zeros(2, np.float32))
    assert repro.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("repro: error: ") and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    with pytest.raises(SystemExit) as exit_:
        repro.main([str(tmp_path), "--rtol", "nan"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith("repro: error: argument --rtol: invalid tolerance 'nan'")
