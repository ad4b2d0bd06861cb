"""``--precision``: a float value that reaches a Cast to an integer (a comparison, an ArgMax...)
stays float32 from the start (``amplified`` islands), as T5's relative-position buckets need:
there a half type's rounding moves an integer by one, which no tolerance accepts.

The model: x -> Abs -> Mul(30.7) -> Add(1) -> Log -> Mul(5.3) -> Cast(int64) -> Min(63) -> Gather of a
table of small integers (exact in float16) into an output, the integers as an output too, and a
MatMul beside the chain that converts. Computed in float16 the chain moves some integers by one
(asserted on the inputs used, so the test cannot pass by a lack of such inputs); 30.7 and 5.3 are
not float16 values, so a chain computed from half weights moves integers on the CPU too (without the
islands the check passes on its three small sets, and 3 of 1024 integers move at 64 rows).
"""

from __future__ import annotations

import hashlib
import json
import pathlib

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from passes import cli
from passes.precision import islands as islands_module

F32, I64 = TensorProto.FLOAT, TensorProto.INT64
CHAIN = ("Abs", "Mul", "Add", "Log", "Mul", "Cast")


def _chain(x: str, prefix: str = "") -> list[onnx.NodeProto]:
    p = prefix
    return [
        helper.make_node("Abs", [x], [p + "a"], name=p + "abs"),
        helper.make_node("Mul", [p + "a", "thirty"], [p + "s"], name=p + "scale"),
        helper.make_node("Add", [p + "s", "one"], [p + "b"], name=p + "plus_one"),
        helper.make_node("Log", [p + "b"], [p + "l"], name=p + "log"),
        helper.make_node("Mul", [p + "l", "five"], [p + "m"], name=p + "times_five"),
        helper.make_node("Cast", [p + "m"], [p + "i"], name=p + "to_int", to=I64),
        helper.make_node("Min", [p + "i", "top"], [p + "idx"], name=p + "clip"),
        helper.make_node("Gather", ["table", p + "idx"], [p + "g"], name=p + "lookup"),
    ]


def _weights() -> list[onnx.TensorProto]:
    rng = np.random.default_rng(3)
    c = lambda name, value, dtype=np.float32: numpy_helper.from_array(np.array(value, dtype), name)  # noqa: E731
    return [c("thirty", 30.7), c("one", 1.0), c("five", 5.3), c("top", 63, np.int64),
            c("table", np.arange(64) * 4.0),
            numpy_helper.from_array((rng.standard_normal((16, 16)) * 0.3).astype(np.float32), "w")]


def _save(model: onnx.ModelProto, path: pathlib.Path) -> pathlib.Path:
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save_model(model, str(path))
    return path


def buckets() -> onnx.ModelProto:
    nodes = [*_chain("x"), helper.make_node("MatMul", ["x", "w"], ["y"], name="dense")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F32, ["N", 16])],
                              [helper.make_tensor_value_info("g", F32, ["N", 16]),
                               helper.make_tensor_value_info("idx", I64, ["N", 16]),
                               helper.make_tensor_value_info("y", F32, ["N", 16])], _weights())  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def buckets_in_if() -> onnx.ModelProto:
    """The chain in an If's then-branch (the else branch: the table's first row)."""
    then = helper.make_graph(_chain("x", "t_"), "then", [], [helper.make_tensor_value_info("t_g", F32, ["N", 16])])
    other = helper.make_graph([helper.make_node("Mul", ["x", "five"], ["e_g"], name="e_scale")], "else", [],
                              [helper.make_tensor_value_info("e_g", F32, ["N", 16])])  # fmt: skip
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["total"], name="total", keepdims=0),
        helper.make_node("Greater", ["total", "big"], ["cond"], name="cond"),  # (x's own branch choice)
        helper.make_node("Not", ["cond"], ["always"], name="always"),
        helper.make_node("Or", ["always", "cond"], ["yes"], name="yes"),
        helper.make_node("If", ["yes"], ["g"], name="branch", then_branch=then, else_branch=other),
        helper.make_node("MatMul", ["x", "w"], ["y"], name="dense"),
    ]
    weights = [*_weights(), numpy_helper.from_array(np.array(0.0, np.float32), "big")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F32, ["N", 16])],
                              [helper.make_tensor_value_info("g", F32, ["N", 16]),
                               helper.make_tensor_value_info("y", F32, ["N", 16])], weights)  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def dense_only() -> onnx.ModelProto:
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="dense"),
             helper.make_node("Tanh", ["h"], ["t"], name="tanh"),
             helper.make_node("Mul", ["t", "h"], ["y"], name="gate")]  # fmt: skip
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F32, ["N", 16])],
                              [helper.make_tensor_value_info("y", F32, ["N", 16])], _weights()[-1:])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run(source: pathlib.Path, target: pathlib.Path, *extra: str) -> tuple[int, dict]:
    report = target.with_suffix(".json")
    code = cli.main([str(source), "-o", str(target), "--precision", "fp16", "--report", str(report), *extra])
    return code, json.loads(report.read_text()) if report.exists() else {}


def _stats(report: dict) -> dict:
    (run,) = [p for p in report["passes"] if p["name"] == "precision"]
    return run["stats"]


def _session(path: pathlib.Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _half_chain(x: np.ndarray) -> np.ndarray:
    """The chain's integers computed in float16, each op's result rounded (as a half device does)."""
    h = np.float16
    a = np.abs(x.astype(h))
    b = (a * h(30.7)).astype(h) + h(1)
    return np.minimum((np.log(b.astype(np.float32)).astype(h) * h(5.3)).astype(h).astype(np.int64), 63)


SIZES = [(1, 16), (3, 16), (7, 16), (64, 16)]


def test_the_chain_stays_float32_and_the_integers_are_the_originals(tmp_path: pathlib.Path) -> None:
    source = _save(buckets(), tmp_path / "m.onnx")
    target = tmp_path / "m.fp16.onnx"
    code, report = _run(source, target)
    assert code == 0 and report["check"]["ok"]
    stats = _stats(report)
    amplified = {label.split(" ")[0] for label, why in stats["islands"].items() if why.startswith("amplified:")}
    assert amplified == {"abs", "scale", "plus_one", "log", "times_five", "to_int"}, stats["islands"]
    assert stats["declined"]["amplified"] == 6
    assert stats["check_rounds"] == 1  # no round of the search was needed
    converted = onnx.load(str(target))
    by_name = {n.name: n for n in converted.graph.node}
    assert by_name["dense"].input[1] in {i.name for i in converted.graph.initializer
                                         if i.data_type == TensorProto.FLOAT16}  # the MatMul converts
    floats = {i.name for i in converted.graph.initializer if i.data_type == F32}
    assert {"thirty", "one", "five"} <= floats  # the chain's weights are not rounded either
    original, half = _session(source), _session(target)
    moved = 0
    for seed, (n, d) in enumerate(SIZES):
        x = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
        expected = original.run(None, {"x": x})
        actual = half.run(None, {"x": x})
        assert np.array_equal(actual[1], expected[1])  # the integers, exactly
        assert actual[0].tobytes() == expected[0].tobytes()
        moved += int((_half_chain(x) != expected[1]).sum())
    assert moved > 0  # in float16 the chain would have moved some of them


def test_an_if_body_keeps_its_chain_float32(tmp_path: pathlib.Path) -> None:
    source = _save(buckets_in_if(), tmp_path / "m.onnx")
    target = tmp_path / "m.fp16.onnx"
    code, report = _run(source, target)
    assert code == 0 and report["check"]["ok"]
    islands = _stats(report)["islands"]
    inside = {label.split(" ")[0] for label, why in islands.items() if why.startswith("amplified:") and "/branch" in label}
    assert inside == {"t_abs", "t_scale", "t_plus_one", "t_log", "t_times_five", "t_to_int"}, islands
    assert "e_scale (Mul, in /branch.else_branch)" not in islands  # the other branch converts
    original, half = _session(source), _session(target)
    for seed, (n, d) in enumerate(SIZES):
        x = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
        assert half.run(["g"], {"x": x})[0].tobytes() == original.run(["g"], {"x": x})[0].tobytes()


def test_a_model_without_amplifiers_converts_as_before(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = _save(dense_only(), tmp_path / "m.onnx")
    code, report = _run(source, tmp_path / "with.onnx")
    assert code == 0
    stats = _stats(report)
    assert "amplified" not in stats["declined"]
    assert not any(why.startswith("amplified:") for why in stats["islands"].values())
    converted = onnx.load(str(tmp_path / "with.onnx"))
    assert {n.op_type for n in converted.graph.node} >= {"MatMul", "Tanh", "Mul", "Cast"}
    assert [i.data_type for i in converted.graph.initializer] == [TensorProto.FLOAT16]
    monkeypatch.setattr(islands_module, "amplified_islands", lambda *args: None)
    assert _run(source, tmp_path / "without.onnx")[0] == 0
    digest = lambda p: hashlib.sha256(p.read_bytes()).hexdigest()  # noqa: E731
    assert digest(tmp_path / "with.onnx") == digest(tmp_path / "without.onnx")


def test_the_hint_after_a_precision_failure_names_the_tolerance() -> None:
    from types import SimpleNamespace

    from passes.cli.hints import check_hint

    failure = SimpleNamespace(mismatches=3, max_abs_error=0.147, max_rel_error=0.2, tolerance_dtype="float16",
                              dtype="float32")  # fmt: skip
    check = SimpleNamespace(checked=True, ok=False, error="", failures=[failure], without_fusions=None,
                            repro=None, first_difference=SimpleNamespace(pass_name="precision"))  # fmt: skip
    run = SimpleNamespace(name="precision", stats={"precision": "float16"})
    hints = check_hint(SimpleNamespace(check=check, passes=[run], written=False))
    assert any("--precision-tolerance" in h and "without --precision" in h for h in hints), hints
    assert not any("is a bug" in h for h in hints), hints
