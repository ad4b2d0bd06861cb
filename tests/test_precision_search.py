"""The ``--precision`` search's order and its islands (``passes/precision/__init__.py``, ``islands.py``).

* The range probe comes before the first comparison: the emulated model is compared once with
  its range islands, not first without them (a comparison that could only fail).
* A model whose error builds along a long chain before a LayerNormalization (which magnifies
  the rounding of the stream it normalises), then through the later layers: the first
  difference alone (the located node, its weights, the half nodes upstream of it, a round each)
  needs more rounds than the search has; the path of largest error from the differing output
  puts the chain back in float32 in one round, and the grouped prune returns what is not needed.
  The search's emulation and the pipeline's check of the written model pass; its layers'
  MatMuls compute in the half type.
* The path looks through values the locator does not compare, and ends at the graph's inputs.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from helpers import ort_run
from passes import cli
from passes.precision import islands as islands_module
from passes.verify import check as check_module
from test_precision import large_values

F32 = TensorProto.FLOAT


def deep_chain(chain: int = 12, layers: int = 2, hidden: int = 16, offset: float = 20.0) -> onnx.ModelProto:
    """``x + 20`` through ``chain`` steps of ``e * a + b`` (each rounds a stream near 20 to float16's
    0.016 steps), then ``layers`` blocks ``r + MatMul(LayerNorm(r), w)`` and a last LayerNorm and
    MatMul: each LayerNorm divides the stream's rounding by its spread (~1)."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(np.full(hidden, offset, np.float32), "offset")]
    nodes = [helper.make_node("Add", ["x", "offset"], ["e0"])]
    for k in range(chain):
        inits += [numpy_helper.from_array((1 + 0.01 * rng.standard_normal(hidden)).astype(np.float32), f"a{k}"),
                  numpy_helper.from_array((0.1 * rng.standard_normal(hidden)).astype(np.float32), f"b{k}")]
        nodes += [helper.make_node("Mul", [f"e{k}", f"a{k}"], [f"s{k}"]),
                  helper.make_node("Add", [f"s{k}", f"b{k}"], [f"e{k + 1}"])]  # fmt: skip
    stream = f"e{chain}"
    for i in range(layers + 1):
        inits += [numpy_helper.from_array((1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32), f"g{i}"),
                  numpy_helper.from_array((0.1 * rng.standard_normal(hidden)).astype(np.float32), f"c{i}")]
        nodes.append(helper.make_node("LayerNormalization", [stream, f"g{i}", f"c{i}"], [f"n{i}"], axis=-1))
        if i == layers:
            break
        inits.append(numpy_helper.from_array((rng.standard_normal((hidden, hidden)) * 0.3).astype(np.float32), f"w{i}"))
        nodes += [helper.make_node("MatMul", [f"n{i}", f"w{i}"], [f"m{i}"], name=f"layer{i}_matmul"),
                  helper.make_node("Add", [stream, f"m{i}"], [f"r{i + 1}"])]  # fmt: skip
        stream = f"r{i + 1}"
    inits.append(numpy_helper.from_array((rng.standard_normal((hidden, 8)) * 0.3).astype(np.float32), "wout"))
    nodes.append(helper.make_node("MatMul", [f"n{layers}", "wout"], ["y"]))
    graph = helper.make_graph(nodes, "deep", [helper.make_tensor_value_info("x", F32, ["N", hidden])],
                              [helper.make_tensor_value_info("y", F32, ["N", 8])], inits)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _run(tmp_path: pathlib.Path, model: onnx.ModelProto) -> tuple[int, pathlib.Path, dict]:
    source, target, report = tmp_path / "m.onnx", tmp_path / "out.onnx", tmp_path / "r.json"
    onnx.save_model(model, str(source))
    code = cli.main([str(source), "-o", str(target), "--precision", "fp16", "--report", str(report)])
    return code, target, json.loads(report.read_text()) if report.exists() else {}


def _stats(report: dict) -> dict:
    (run,) = [p for p in report["passes"] if p["name"] == "precision"]
    return run["stats"]


def test_the_range_islands_are_in_the_first_comparison(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The values near 3e5 would be inf in float16: the first model compared already keeps them in
    float32 (it passes), and it is the only comparison of the search."""
    calls: list[tuple[str, object]] = []
    for name in ("start", "magnitudes", "check", "recheck"):
        original = getattr(check_module.Checker, name)

        def wrapped(self, *args, _original=original, _name=name, **kwargs):  # type: ignore[no-untyped-def]
            result = _original(self, *args, **kwargs)
            calls.append((_name, result))
            return result

        monkeypatch.setattr(check_module.Checker, name, wrapped)
    code, target, report = _run(tmp_path, large_values())
    assert code == 0
    stats = _stats(report)
    assert any(why.startswith("range:") for why in stats["islands"].values()), stats["islands"]
    search = [name for name, _ in calls][:4]  # then the pipeline's own check
    assert search == ["start", "magnitudes", "check", "check"], calls
    first = calls[2][1]
    assert first.checked and first.ok, first.summary()
    assert stats["check_rounds"] == 1 and stats["check_ok"] is True
    x = np.random.default_rng(5).standard_normal((4, 16)).astype(np.float32)
    (expected,), (actual,) = ort_run(large_values(), {"x": x}), ort_run(onnx.load(str(target)), {"x": x})
    assert np.isfinite(actual).all()
    assert np.abs(actual - expected).max() <= 1e-3 + 1e-2 * np.abs(expected).max()


def test_an_error_that_builds_along_the_stream_converts(tmp_path: pathlib.Path) -> None:
    code, target, report = _run(tmp_path, deep_chain())
    assert code == 0, report
    stats = _stats(report)
    assert stats["check_ok"] is True and report["check"]["ok"] is True
    assert any("path of largest error" in why for why in stats["islands"].values()), stats["islands"]
    assert all(not why.startswith("check: feeds") for why in stats["islands"].values()), stats["islands"]
    converted = onnx.load(str(target))
    half_matmuls = [n.name for n in converted.graph.node if n.op_type == "MatMul"
                    and any(i.name == n.output[0] and i.type.tensor_type.elem_type == TensorProto.FLOAT16
                            for i in converted.graph.value_info)]  # fmt: skip
    assert half_matmuls, "the layers' MatMuls compute in float16"
    # The pruning returned islands: fewer than the path put back (every half node of the chain).
    assert 0 < sum(why.startswith("check:") for why in stats["islands"].values()) < 2 * 12 + 1


def test_the_first_difference_alone_runs_out_of_rounds(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The premise: without the path (each round the located node, its weights, or the half nodes
    upstream of it), the same model is refused after the search's rounds."""
    monkeypatch.setattr(islands_module, "error_path", lambda *args: [])
    code, target, report = _run(tmp_path, deep_chain())
    assert code == 1 and not target.exists()
    assert _stats(report)["check_ok"] is False


def _graph(nodes: list[onnx.NodeProto], inputs: list[str], outputs: list[str]) -> ir.Model:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, F32, [4]) for n in inputs],
                              [helper.make_tensor_value_info(n, F32, [4]) for n in outputs])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return ir.serde.deserialize_model(model)


def test_the_path_follows_the_largest_error_in_units_of_tolerance() -> None:
    """``y = Add(p, q)``: p's error is larger, q's larger in units of its tolerance (q is small):
    the path goes through q's producer; p's producer is not on it."""
    nodes = [helper.make_node("Relu", ["a"], ["p"], name="P"), helper.make_node("Neg", ["b"], ["q"], name="Q"),
             helper.make_node("Add", ["p", "q"], ["y"], name="Y")]  # fmt: skip
    model = _graph(nodes, ["a", "b"], ["y"])
    located = {"p": {"ok": True, "max_abs_error": 0.05}, "q": {"ok": True, "max_abs_error": 0.004},
               "y": {"ok": False, "max_abs_error": 0.05}}  # fmt: skip
    magnitudes = {"p": 100.0, "q": 0.1, "y": 100.0}
    path = islands_module.error_path(model, located, ["y"], magnitudes, (1e-2, 1e-3))
    assert [(node.name, value) for node, value, _ in path] == [("Y", "y"), ("Q", "q")]
    assert path[1][2] == pytest.approx(0.004 / (1e-3 + 1e-2 * 0.1))


def test_the_path_looks_through_values_not_compared_and_stops_at_exact_ones() -> None:
    """``s`` (not compared: a sequence, a rewritten value) inherits its producer's inputs' error; the
    path ends where no input has an error (``c``, exact)."""
    nodes = [helper.make_node("Neg", ["c"], ["e"], name="E"), helper.make_node("Abs", ["e"], ["s"], name="S"),
             helper.make_node("Relu", ["s"], ["y"], name="Y"), helper.make_node("Sin", ["a"], ["c"], name="C")]
    nodes = [nodes[3], *nodes[:3]]
    model = _graph(nodes, ["a"], ["y"])
    located = {"c": {"ok": True, "max_abs_error": 0.0}, "e": {"ok": False, "max_abs_error": 0.01},
               "y": {"ok": False, "max_abs_error": 0.01}}  # fmt: skip
    path = islands_module.error_path(model, located, ["y"], {}, (1e-2, 1e-3))
    assert [node.name for node, _, _ in path] == ["Y", "S", "E"]
    assert islands_module.error_path(model, {}, ["y"], {}, (1e-2, 1e-3))[0][0].name == "Y"  # nothing compared


class _Verdict:
    def __init__(self, ok: bool) -> None:
        self.checked, self.ok = True, ok


@pytest.mark.parametrize("needed", [set(), {3}, {0, 17}, {5, 6, 7}])
def test_the_prune_returns_the_islands_not_needed_a_group_at_a_time(needed: set[int]) -> None:
    """40 check islands of which ``needed`` keep the (stand-in) check passing: the prune returns
    every other one within its 24 tries (one at a time it would try 24 of the 40), and never
    returns a needed one; a range island is not tried."""
    from passes.precision import PRUNE_ROUNDS, PrecisionPass

    islands = {("", f"n{i}"): f"check: n{i}" for i in range(40)}
    islands[("", "big")] = "range: big"
    tries: list[set[tuple[str, str]]] = []

    class Checker:
        def recheck(self, kept: set[tuple[str, str]]) -> _Verdict:
            tries.append(kept)
            return _Verdict(all(("", f"n{i}") in kept for i in needed) and ("", "big") in kept)

    checked = {"rounds": 0}
    PrecisionPass("fp16")._prune(islands, lambda: set(islands), Checker(), _Verdict(True), checked)
    assert set(islands) == {("", f"n{i}") for i in needed} | {("", "big")}
    assert len(tries) <= PRUNE_ROUNDS and checked["rounds"] == len(tries)


def test_a_check_that_cannot_run_converts_as_without_it(tmp_path: pathlib.Path) -> None:
    """An op onnxruntime does not know: the search's check is skipped (the original does not run),
    and a weight above the range limit (1e4 > 4094, within float16) makes no range island: the
    written model is the one ``--no-check`` writes, byte for byte."""
    w = numpy_helper.from_array(np.full((4, 4), 1e4, np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Foo", ["y"], ["z"], domain="example")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F32, [2, 4])],
                              [helper.make_tensor_value_info("z", F32, [2, 4])], [w])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("example", 1)])
    model.ir_version = 8
    code, target, report = _run(tmp_path, model)
    assert code == 0
    stats = _stats(report)
    assert stats["check_ok"] is None and stats["skipped"], stats
    assert not [why for why in stats["islands"].values() if not why.startswith("fixed:")], stats["islands"]
    unchecked = tmp_path / "unchecked.onnx"
    assert cli.main([str(tmp_path / "m.onnx"), "-o", str(unchecked), "--precision", "fp16", "--no-check"]) == 0
    assert target.read_bytes() == unchecked.read_bytes()
    (matmul,) = [n for n in onnx.load(str(target)).graph.node if n.op_type == "MatMul"]
    (weight,) = [t for t in onnx.load(str(target)).graph.initializer if t.name == matmul.input[1]]
    assert weight.data_type == TensorProto.FLOAT16
