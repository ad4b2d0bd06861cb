"""The check's sets of inputs besides the seeded standard-normal ones: edge values, NaN/infinities, 0-sized dims.

Each wrong "optimised" model here differs from its original only at values
standard-normal inputs never reach (above 100, -0, NaN); the edge sets must
find it. Sets the original cannot run are skipped with a note, never a failure.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import passes
from passes import cli
from passes.verify import edges, plan
from passes.verify.result import QUOTE_LIMIT

OPSET = [helper.make_opsetid("", 13)]


def _model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto],
           initializers: list[onnx.TensorProto] = ()) -> onnx.ModelProto:  # fmt: skip
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    return helper.make_model(graph, opset_imports=OPSET, ir_version=8)


def _float(name: str, dims: list[Any]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, dims)


def _sets(result: passes.CheckResult) -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in result.inputs.sets}


def _where_over_100(constant: float) -> onnx.ModelProto:
    """y = Where(x > 100, Reciprocal(c), x): c = -0 gives -inf where x > 100."""
    return _model(
        [helper.make_node("Greater", ["x", "limit"], ["above"]), helper.make_node("Reciprocal", ["c"], ["r"]),
         helper.make_node("Where", ["above", "r", "x"], ["y"])],
        [_float("x", ["batch", 8])], [_float("y", ["batch", 8])],
        [numpy_helper.from_array(np.array(100.0, np.float32), "limit"),
         numpy_helper.from_array(np.array(constant, np.float32), "c")],
    )  # fmt: skip


def test_an_identical_model_passes_on_every_set() -> None:
    model = _where_over_100(-0.0)
    result = passes.check(model, model)
    assert result.checked and result.ok, result.summary()
    sets = _sets(result)
    assert list(sets) == ["normal", "larger", "edge", "edge-nonfinite", "zero-dims"]
    assert all(s["ran"] and s["ok"] for s in sets.values()), sets
    assert sets["zero-dims"]["dims"] == {"batch": 0}
    assert sets["larger"]["dims"] == {"batch": 3} and result.inputs.sizes == {"batch": [1, 3, 0]}
    assert result.notes == []
    text = result.inputs.text()
    assert "also larger-size (batch=3), edge-value, NaN/infinity, 0-sized-dimension inputs" in text, text
    assert "sizes checked: batch 1, 3, 0" in text, text
    data = json.loads(json.dumps(result.to_json()))
    assert [s["name"] for s in data["inputs"]["sets"]] == list(sets)


def test_where_above_100_hides_a_wrong_constant_from_normal_inputs_not_from_edge_values() -> None:
    result = passes.check(_where_over_100(-0.0), _where_over_100(0.0))  # -inf became +inf above 100
    assert result.checked and not result.ok, result.summary()
    sets = _sets(result)
    assert sets["normal"]["ok"] is True  # standard-normal inputs never exceed 100
    assert sets["edge"]["ok"] is False
    (output,) = result.failures
    assert output.input_set == "edge" and "edge-value inputs" in output.message
    assert "check failed: output 'y': on the edge-value inputs" in result.summary()
    # The locator runs on the set that differs: the folded constant is where it starts.
    assert result.first_difference is not None and result.first_difference.output == "r"


def test_the_same_check_is_made_for_the_same_seed() -> None:
    feeds = {"x": np.zeros((2, 8), np.float32), "i": np.zeros(5, np.int32)}
    first = edges.edge_feeds(feeds, (), 7)
    assert all(np.array_equal(first[k], edges.edge_feeds(feeds, (), 7)[k]) for k in feeds)
    assert not np.array_equal(first["x"], edges.edge_feeds(feeds, (), 8)["x"])


def test_edge_values_cover_each_kind_in_any_seven_neighbours() -> None:
    pool = edges.edge_pool(np.float32)
    for start in range(pool.size):
        window = pool[np.arange(start, start + 7) % pool.size]
        assert np.any(window > 100) and np.any(window < -100), window
        assert np.any((window == 0) | (np.abs(window) < np.finfo(np.float32).tiny * 2)), window
    huge = float(np.float32(1e30))
    assert {1e4, -1e4, huge, -huge, 100.0, -1000.0, 1.0, -0.5} <= set(pool.tolist())
    assert np.isfinite(pool).all() and np.any(np.signbit(pool) & (pool == 0))
    nonfinite = edges.edge_pool(np.float32, nonfinite=True)
    assert np.isnan(nonfinite).any() and np.isposinf(nonfinite).any() and np.isneginf(nonfinite).any()
    half = edges.edge_pool(np.float16)
    assert np.isfinite(half).all() and 6e4 in np.abs(half.astype(np.float64)).round(-3).tolist()
    assert np.abs(half.astype(np.float64)).max() < 65504 * 1.0001
    ints = edges.edge_pool(np.int32)
    assert {-(2**31), 2**31 - 1, 0, -1, 2**24 + 1} <= set(ints.tolist())
    assert set(edges.edge_pool(np.uint8).tolist()) <= set(range(256))


def test_a_difference_only_at_minus_zero_is_found_behind_a_reciprocal() -> None:
    """x + 0 -> x is wrong: it turns -0 into +0, so 1/x turns -inf into +inf; no normal input is -0."""
    io = ([_float("x", ["n", 8])], [_float("y", ["n", 8])])
    zero = numpy_helper.from_array(np.array(0.0, np.float32), "zero")
    original = _model([helper.make_node("Reciprocal", ["x"], ["y"])], *io)
    wrong = _model([helper.make_node("Add", ["x", "zero"], ["x0"]), helper.make_node("Reciprocal", ["x0"], ["y"])],
                   *io, [zero])  # fmt: skip
    result = passes.check(original, wrong)
    assert result.checked and not result.ok, result.summary()
    assert _sets(result)["normal"]["ok"] is True and result.failures[0].input_set == "edge"
    # Without the Reciprocal, only the sign of zero differs: still a failure.
    identity = _model([helper.make_node("Identity", ["x"], ["y"])], *io)
    result = passes.check(identity, _model([helper.make_node("Add", ["x", "zero"], ["y"])], *io, [zero]))
    assert not result.ok and "sign of zero" in result.failures[0].message, result.summary()


def test_a_difference_only_at_nan_is_found_by_the_nonfinite_set() -> None:
    """IsNaN(x) -> false is wrong only where x is NaN: the finite sets pass, the NaN set fails."""
    io = ([_float("x", ["n", 4])], [helper.make_tensor_value_info("y", TensorProto.INT32, ["n", 4])])
    original = _model([helper.make_node("IsNaN", ["x"], ["nan"]),
                       helper.make_node("Cast", ["nan"], ["y"], to=TensorProto.INT32)], *io)  # fmt: skip
    wrong = _model([helper.make_node("Shape", ["x"], ["shape"]),
                    helper.make_node("ConstantOfShape", ["shape"], ["y"],
                                     value=numpy_helper.from_array(np.array([0], np.int32)))], *io)  # fmt: skip
    result = passes.check(original, wrong)
    assert result.checked and not result.ok, result.summary()
    sets = _sets(result)
    assert sets["normal"]["ok"] and sets["edge"]["ok"] and sets["edge-nonfinite"]["ok"] is False, sets
    assert result.failures[0].input_set == "edge-nonfinite"
    assert "exact comparison" in result.failures[0].message


def test_onnxruntime_where_gives_plus_zero_for_minus_zero() -> None:
    """Found by the edge set: onnxruntime's Where(true, -0, 0) is +0, so a rewrite of
    Where(x == x, x, 0) into x is caught at -0 as well as at NaN."""
    original = _model(
        [helper.make_node("Equal", ["x", "x"], ["same"]), helper.make_node("Where", ["same", "x", "zero"], ["y"])],
        [_float("x", ["n", 8])], [_float("y", ["n", 8])], [numpy_helper.from_array(np.array(0.0, np.float32), "zero")],
    )  # fmt: skip
    wrong = _model([helper.make_node("Identity", ["x"], ["y"])], [_float("x", ["n", 8])], [_float("y", ["n", 8])])
    result = passes.check(original, wrong)
    assert not result.ok and result.failures[0].input_set == "edge", result.summary()
    assert "only in the sign of zero" in result.failures[0].message


def _gather_reshape_model() -> onnx.ModelProto:
    """y = Reshape(Gather(table, ids), shape) * scale: ``ids`` and ``shape`` are indices; ``scale`` a value."""
    table = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(3, 4), "table")
    return _model(
        [helper.make_node("Gather", ["table", "ids"], ["rows"], axis=0),
         helper.make_node("Reshape", ["rows", "shape"], ["flat"]),
         helper.make_node("Cast", ["scale"], ["scale_f"], to=TensorProto.FLOAT),
         helper.make_node("Mul", ["flat", "scale_f"], ["y"])],
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [2]),
         helper.make_tensor_value_info("shape", TensorProto.INT64, [1]),
         helper.make_tensor_value_info("scale", TensorProto.INT32, [8])],
        [_float("y", [8])], [table],
    )  # fmt: skip


def test_index_and_shape_inputs_keep_their_values_and_get_no_extremes(tmp_path: pathlib.Path) -> None:
    model = _gather_reshape_model()
    specs = {s.name: s for s in plan.input_specs(model)}
    assert "Gather" in specs["ids"].index and "Reshape" in specs["shape"].index, specs
    assert specs["scale"].index == ""
    feeds = {"ids": np.array([0, 2]), "shape": np.array([8]), "scale": np.ones(8, np.int32)}
    made = edges.edge_feeds(feeds, [n for n, s in specs.items() if s.index], 0)
    assert made["ids"] is feeds["ids"] and made["shape"] is feeds["shape"]
    assert made["scale"].min() < -1000 and made["scale"].max() > 1000  # int extremes for the value input
    # The shape must be [8]: it is given; the edge set keeps it and the original runs on it.
    given = tmp_path / "in.npz"
    np.savez(given, shape=np.array([8], np.int64))
    result = passes.check(model, model, inputs_file=given)
    assert result.checked and result.ok, result.summary()
    sets = _sets(result)
    assert sets["edge"]["ran"] and sets["edge"]["ok"], sets
    assert not sets["edge-nonfinite"]["tried"] and "no float input" in sets["edge-nonfinite"]["note"]
    assert not sets["zero-dims"]["tried"]  # no dynamic dimension


def test_an_integer_feeding_another_domain_is_taken_for_an_index_a_float_is_not() -> None:
    model = _model(
        [helper.make_node("Foo", ["ids", "x"], ["y"], domain="com.example")],
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [2]), _float("x", [2])], [_float("y", [2])],
    )  # fmt: skip
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    specs = {s.name: s for s in plan.input_specs(model)}
    assert "com.example::Foo" in specs["ids"].index and specs["x"].index == ""


def _reshape_copying_dim_1(dims: list[str]) -> onnx.ModelProto:
    """Reshape(x, [-1, 0]) copies dim 1 and needs it non-zero (onnxruntime: 0 elements in a -1 reshape)."""
    return _model(
        [helper.make_node("Reshape", ["x", "target"], ["y"])], [_float("x", dims)], [_float("y", [None, None])],
        [numpy_helper.from_array(np.array([-1, 0], np.int64), "target")],
    )  # fmt: skip


def test_a_model_that_cannot_run_with_0_sized_dims_is_still_checked_and_passes(tmp_path: pathlib.Path,
                                                                               capsys) -> None:  # fmt: skip
    model = _reshape_copying_dim_1(["n", "m"])
    result = passes.check(model, model)
    assert result.checked and result.ok, result.summary()
    zero = _sets(result)["zero-dims"]
    # Every dim 0 does not run; only the first (n) 0 does: that set is used.
    assert zero["ran"] and zero["dims"] == {"n": 0, "m": 4}, zero
    assert "only the first dynamic dimension 0" in zero["note"]
    # With the dim the Reshape copies first, neither form runs: skipped with a note, the check passes.
    swapped = _model(
        [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]), helper.make_node("Reshape", ["t", "target"], ["y"])],
        [_float("x", ["n", "m"])], [_float("y", [None, None])],
        [numpy_helper.from_array(np.array([-1, 0], np.int64), "target")],
    )  # fmt: skip
    result = passes.check(swapped, swapped)
    assert result.checked and result.ok, result.summary()
    zero = _sets(result)["zero-dims"]
    assert zero["tried"] and not zero["ran"] and zero["ok"] is None, zero
    assert "nor with only the first dynamic dimension 0" in zero["note"], zero
    assert any(n.startswith("input set 'zero-dims'") for n in result.notes), result.notes
    # On the command line: exit 0, and the report says which sets ran and which were skipped.
    src, report = tmp_path / "m.onnx", tmp_path / "r.json"
    onnx.save_model(swapped, str(src))
    assert cli.main([str(src), "-o", str(tmp_path / "o.onnx"), "--report", str(report)]) == 0
    out = capsys.readouterr().out
    assert "edge-value, NaN/infinity inputs; skipped: 0-sized-dimension (see the note)" in out, out
    assert out.count("nor with only the first dynamic dimension 0") == 1, out  # the reason once, in the note
    assert "[ONNXRuntimeError]" not in out and "onnxruntime_src" not in out, out  # ORT's sentence, not its source
    data = json.loads(report.read_text())["check"]
    assert {s["name"]: s["ran"] for s in data["inputs"]["sets"]} == {
        "normal": True, "larger": True, "edge": True, "edge-nonfinite": True, "zero-dims": False}


def test_a_set_that_crashes_the_original_is_skipped_and_the_check_goes_on() -> None:
    """The minimum integer divided by -1 is SIGFPE in onnxruntime (on its scalar path): the edge
    sets kill the check's process; each is skipped with a note (the child restarted), the check
    passes on the others."""
    model = _model(
        [helper.make_node("ReduceMin", ["a"], ["least"], keepdims=0),
         helper.make_node("Div", ["least", "minus_one"], ["q"]),
         helper.make_node("Cast", ["q"], ["qf"], to=TensorProto.FLOAT), helper.make_node("Add", ["qf", "x"], ["y"])],
        [helper.make_tensor_value_info("a", TensorProto.INT32, ["n", 64]), _float("x", ["n", 64])],
        [_float("y", ["n", 64])], [numpy_helper.from_array(np.array(-1, np.int32), "minus_one")],
    )  # fmt: skip
    result = passes.check(model, model)
    assert result.checked and result.ok, result.summary()
    sets = _sets(result)
    for name in ("edge", "edge-nonfinite"):
        assert sets[name]["tried"] and not sets[name]["ran"] and "SIGFPE" in sets[name]["note"], sets
        assert any(f"input set {name!r}" in n and "SIGFPE" in n for n in result.notes), result.notes
    assert sets["normal"]["ok"] and sets["zero-dims"]["ok"], sets
    # An integer division by 0 is an error, not a crash: skipped alike.
    model.graph.node[0].CopyFrom(helper.make_node("Add", ["a", "one"], ["least"]))  # 1..4 in the normal set
    model.graph.node[1].input[:] = ["minus_one", "least"]  # -1 / (a + 1): a is -1 somewhere in the edge sets
    model.graph.initializer.append(numpy_helper.from_array(np.array(1, np.int32), "one"))
    model.graph.output[0].type.tensor_type.shape.dim[1].dim_value = 64
    result = passes.check(model, model)
    assert result.checked and result.ok, result.summary()
    assert "division by zero" in _sets(result)["edge"]["note"], _sets(result)


def test_a_float16_input_gets_edge_values_it_holds() -> None:
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Mul", ["x", "x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, ["n"])]), opset_imports=OPSET, ir_version=8)
    result = passes.check(model, model)
    assert result.checked and result.ok and _sets(result)["edge"]["ok"], result.summary()


# --- messages ----------------------------------------------------------------------------------


def test_a_check_failure_on_an_output_with_a_huge_name_quotes_it_cut(tmp_path: pathlib.Path, monkeypatch,
                                                                      capsys) -> None:  # fmt: skip
    name = "y" * 2_000_000
    original = _model([helper.make_node("Reciprocal", ["x"], [name])], [_float("x", ["n"])], [_float(name, ["n"])])
    wrong = _model([helper.make_node("Neg", ["x"], [name])], [_float("x", ["n"])], [_float(name, ["n"])])
    result = passes.check(original, wrong)
    assert not result.ok
    for line in result.summary().splitlines():
        assert len(line) < 3 * QUOTE_LIMIT + 400, len(line)
    assert result.failures[0].name == name  # the data keeps it whole
    # Through the command (a wrong fold, as above): every line printed is short.
    import refimpl

    real = refimpl.run
    monkeypatch.setattr(refimpl, "run", lambda op, inputs, *a, **k: [np.reciprocal(np.abs(inputs[0]))]
                        if op == "Reciprocal" else real(op, inputs, *a, **k))  # fmt: skip
    model = _where_over_100(-0.0)
    model.graph.node[2].output[0] = model.graph.output[0].name = name
    src = tmp_path / "m.onnx"
    onnx.save_model(model, str(src))
    # --no-fold-confirm: onnxruntime's confirmation would keep the wrong fold out before the check.
    assert cli.main([str(src), "-o", str(tmp_path / "o.onnx"), "--no-fold-confirm"]) == 1
    captured = capsys.readouterr()
    lines = (captured.out + captured.err).splitlines()
    assert any("check failed:" in line and "'yyy" in line for line in lines), captured.err
    assert max(len(line) for line in lines) < 3 * QUOTE_LIMIT + 400


def _npy_header(shape_text: str) -> bytes:
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape_text + ", }"
    header += " " * ((64 - (10 + len(header) + 1) % 64) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode()


@pytest.mark.parametrize("case", ["negative", "huge-header"])
def test_inputs_with_a_bad_npy_header_are_exit_2_in_one_line(tmp_path: pathlib.Path, capsys, case: str) -> None:
    import zipfile

    src, given = tmp_path / "m.onnx", tmp_path / "in.npz"
    onnx.save_model(_model([helper.make_node("Relu", ["x"], ["y"])], [_float("x", ["n", 4])],
                           [_float("y", ["n", 4])]), str(src))  # fmt: skip
    if case == "negative":
        member = _npy_header("(-2, 4)") + b"\0" * 64
    else:  # a header over numpy's size limit (10000 bytes by default)
        member = _npy_header("(" + "1, " * 6000 + "4)")
    with zipfile.ZipFile(given, "w") as archive:
        archive.writestr("x.npy", member)
    code = cli.main([str(src), "-o", str(tmp_path / "o.onnx"), "--inputs", str(given), "-q"])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "NOT CHECKED" not in err, err
    assert ("negative" in err) if case == "negative" else ("not a readable .npy array" in err), err
    assert len(lines[0]) < 600, lines[0]


# --- through the command: a wrong rewrite is refused (exit 1), a right one passes -------------------


def test_a_wrong_fold_behind_where_above_100_fails_the_command(tmp_path: pathlib.Path, monkeypatch,
                                                                capsys) -> None:  # fmt: skip
    """refimpl made wrong on purpose: Reciprocal(-0) folds to +inf instead of -inf. The folded
    constant is used only where x > 100, which no standard-normal input reaches."""
    import refimpl

    real = refimpl.run
    calls = []

    def wrong(op_type: str, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        if op_type == "Reciprocal":
            calls.append(op_type)
            return [np.reciprocal(np.abs(inputs[0]))]
        return real(op_type, inputs, *args, **kwargs)

    monkeypatch.setattr(refimpl, "run", wrong)
    src, out, report = tmp_path / "m.onnx", tmp_path / "o.onnx", tmp_path / "r.json"
    onnx.save_model(_where_over_100(-0.0), str(src))
    # Without --no-fold-confirm onnxruntime's confirmation keeps the wrong value out (the next
    # test file, test_fold_confirm, shows it); here the check is the last line of defence.
    code = cli.main([str(src), "-o", str(out), "--report", str(report), "-q", "--no-fold-confirm"])
    err = capsys.readouterr().err
    assert calls, "the fold did not evaluate the Reciprocal: the test injects nothing"
    assert code == 1 and not out.exists(), err
    assert "on the edge-value inputs" in err and "introduced by pass 'fold'" in err, err
    check = json.loads(report.read_text())["check"]
    assert {s["name"]: s["ok"] for s in check["inputs"]["sets"]}["normal"] is True
    # Without the injected bug the same model is optimised and passes.
    monkeypatch.setattr(refimpl, "run", wrong)
    calls.clear()
    assert cli.main([str(src), "-o", str(out), "-q"]) == 0, capsys.readouterr().err  # confirmation on
    assert calls and out.exists()
    out.unlink()
    monkeypatch.setattr(refimpl, "run", real)
    assert cli.main([str(src), "-o", str(out), "-q", "--no-fold-confirm"]) == 0, capsys.readouterr().err


def _ort(path: Any, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]).run(None, feeds)


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("case", ["softmax11-non-last-axis", "conv-times-zero"])
def test_exit_0_means_the_same_results_at_edge_values_and_0_sized_dims(tmp_path: pathlib.Path, case: str,
                                                                       capsys) -> None:  # fmt: skip
    """Rewrites the issue found wrong at -0 or a 0-sized dim (the upgrade's Softmax-11 reshape without
    allowzero; a Conv fused with a per-channel Mul by 0, which turns -0 into +0): whatever the passes
    do, the command either refuses the result (exit 1, found by the check) or writes one that gives
    the same bits there."""
    rng = np.random.default_rng(0)
    if case == "softmax11-non-last-axis":
        model = helper.make_model(helper.make_graph(
            [helper.make_node("Softmax", ["x"], ["y"], axis=1)], "g", [_float("x", ["batch", 4, "width"])],
            [_float("y", ["batch", 4, "width"])]), opset_imports=[helper.make_opsetid("", 11)], ir_version=6)
        feeds = {"x": np.zeros((0, 4, 0), np.float32)}
    else:
        model = _model(
            [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Mul", ["c", "k"], ["y"])],
            [_float("x", [1, 3, 8, 8])], [_float("y", [1, 2, 6, 6])],
            [numpy_helper.from_array(rng.standard_normal((2, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(np.array([0.0, 2.0], np.float32).reshape(1, 2, 1, 1), "k")],
        )  # fmt: skip
        feeds = {"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)}
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save_model(model, str(src))
    code = cli.main([str(src), "-o", str(out), "-q"])
    err = capsys.readouterr().err
    if code == 1:  # refused: the check found the difference
        assert not out.exists() and "check failed" in err, err
        assert ("0-sized-dimension" in err) if case.startswith("softmax") else ("sign of zero" in err), err
        return
    assert code == 0, err
    (expected,), (actual,) = _ort(src, feeds), _ort(out, feeds)
    assert _same_bits(expected, actual)


def test_the_sets_after_the_first_get_a_bounded_share_of_the_time(monkeypatch) -> None:
    from passes.verify import sets as sets_module

    monkeypatch.setattr(sets_module, "EXTRA_SETS_SHARE", 0.0)
    model = _where_over_100(-0.0)
    result = passes.check(model, _where_over_100(0.0))
    assert result.checked and result.ok, result.summary()  # only the normal set: the difference is not seen
    sets = _sets(result)
    assert all(not s["ran"] and "no time left" in s["note"] for n, s in sets.items() if n != "normal"), sets
    assert sum("no time left" in n for n in result.notes) == 4, result.notes


def test_a_finite_difference_above_100_is_found_where_the_output_stays_in_range() -> None:
    """Where(x > 100, c, Tanh(x)) with c 1 against 2: a finite difference, found by the edge set
    (the output's largest magnitude is 2: the edge sets' scale-relative tolerance does not hide it)."""

    def model(c: float) -> onnx.ModelProto:
        return _model(
            [helper.make_node("Greater", ["x", "limit"], ["above"]), helper.make_node("Tanh", ["x"], ["t"]),
             helper.make_node("Where", ["above", "c", "t"], ["y"])],
            [_float("x", ["batch", 8])], [_float("y", ["batch", 8])],
            [numpy_helper.from_array(np.array(100.0, np.float32), "limit"),
             numpy_helper.from_array(np.array(c, np.float32), "c")],
        )  # fmt: skip

    assert passes.check(model(1.0), model(1.0)).ok
    result = passes.check(model(1.0), model(2.0))
    assert not result.ok and result.failures[0].input_set == "edge", result.summary()
    assert _sets(result)["normal"]["ok"] is True


def _wrong_only_at_1000() -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """y = x, and a wrong y' = Where(50 < |x| < 5000, x * 1.01, x): a difference no standard-normal
    input reaches (the edge sets' ±100 and ±1000 do), of 1e-2 relative, in an output that also holds
    the edge sets' 1e30s."""
    original = _model([helper.make_node("Identity", ["x"], ["y"])], [_float("x", ["batch", 8])],
                      [_float("y", ["batch", 8])])  # fmt: skip
    wrong = _model(
        [helper.make_node("Abs", ["x"], ["a"]), helper.make_node("Greater", ["a", "low"], ["above"]),
         helper.make_node("Less", ["a", "high"], ["below"]), helper.make_node("And", ["above", "below"], ["hit"]),
         helper.make_node("Mul", ["x", "k"], ["x1"]), helper.make_node("Where", ["hit", "x1", "x"], ["y"])],
        [_float("x", ["batch", 8])], [_float("y", ["batch", 8])],
        [numpy_helper.from_array(np.array(50.0, np.float32), "low"),
         numpy_helper.from_array(np.array(5000.0, np.float32), "high"),
         numpy_helper.from_array(np.array(1.01, np.float32), "k")],
    )  # fmt: skip
    return original, wrong


def test_an_exact_rewrite_is_held_to_the_element_wise_tolerance_on_the_edge_sets() -> None:
    """The edge sets' norm-wise leeway (a finite value within rtol of the output's largest magnitude)
    is for rewrites that change rounding; without it, 1000 -> 1001 next to 1e30 is a difference."""
    original, wrong = _wrong_only_at_1000()
    strict = passes.check(original, wrong, rounding=False)
    assert strict.checked and not strict.ok, strict.summary()
    lenient = passes.check(original, wrong, rounding=True)
    assert lenient.checked and lenient.ok  # the leeway a fusion gets hides it: so only a fusion gets it


def test_the_command_gives_the_leeway_only_when_a_pass_changed_rounding(tmp_path: pathlib.Path, monkeypatch,
                                                                        capsys) -> None:  # fmt: skip
    """A pass that declares itself exact and writes the wrong model fails the check (exit 1)."""
    import onnx_ir as ir

    from passes import pipeline
    from passes.base import Pass
    from passes.declarations import PassSpec

    original, wrong = _wrong_only_at_1000()

    class Wrong(Pass):
        """Declared exact (the default), it replaces the model's graph by the wrong one."""

        NAME, DESCRIPTION = "wrong", "replaces the graph by a wrong one (test only)"

        def call(self, model: ir.Model) -> ir.passes.PassResult:
            replacement = ir.from_proto(wrong)
            model.graph = replacement.graph
            self.stats = {"applied": {"wrong": 1}, "declined": {}}
            return ir.passes.PassResult(model, modified=True)

    monkeypatch.setitem(pipeline.PASSES, "wrong", PassSpec.of(Wrong))
    src = tmp_path / "m.onnx"
    onnx.save_model(original, str(src))
    assert cli.main([str(src), "-o", str(tmp_path / "o.onnx"), "--passes", "wrong", "-q"]) == 1
    assert "introduced by pass 'wrong'" in capsys.readouterr().err


def test_an_output_line_says_where_and_how_elements_differ_when_max_abs_is_0(tmp_path: pathlib.Path, monkeypatch,
                                                                               capsys) -> None:  # fmt: skip
    # A wrong fold (as above): -inf becomes +inf above 100, so the edge set alone differs, and only
    # in inf placement: the line's "max abs 0  max rel 0" must not be all it says.
    import refimpl

    real = refimpl.run
    monkeypatch.setattr(refimpl, "run", lambda op, inputs, *a, **k: [np.reciprocal(np.abs(inputs[0]))]
                        if op == "Reciprocal" else real(op, inputs, *a, **k))  # fmt: skip
    src = tmp_path / "m.onnx"
    onnx.save_model(_where_over_100(-0.0), str(src))
    assert cli.main([str(src), "-o", str(tmp_path / "o.onnx"), "--no-fold-confirm"]) == 1
    (line,) = [x for x in capsys.readouterr().out.splitlines() if "MISMATCH" in x]
    assert "max abs 0  max rel 0" in line, line
    assert "(on the edge-value inputs ('edge'): " in line and "element(s) differ beyond the tolerance; " in line, line
    assert line.endswith(" in NaN/inf placement)"), line
