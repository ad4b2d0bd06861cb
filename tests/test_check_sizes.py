"""The check at more than one size: each dynamic dim at the size that ran and at a larger one.

A rewrite exact at batch 1 and wrong at batch 2 or more (the first row broadcast over the
batch) passed a check that only ran at batch 1; it fails now, on the ``larger`` set, in the
main graph and in an If branch. A model that does not run at the larger sizes is checked at
shorter ones (each dim at most twice its size). ``--dim NAME=A,B,...`` sets the sizes; a static
model has no larger set; a larger set over the budget is skipped and the summary says so.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import passes
from helpers import ort_run, run_cli
from passes.verify import sets as sets_module


def _model(nodes: list[onnx.NodeProto], dims: list[int | str], inits: list[onnx.TensorProto] = ()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)], list(inits))  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _original(dims: list[int | str] = ("batch", 4)) -> onnx.ModelProto:
    return _model([helper.make_node("Relu", ["x"], ["y"])], list(dims))


def _first_row_broadcast(dims: list[int | str] = ("batch", 4)) -> onnx.ModelProto:
    """Relu of x's first row expanded over the batch: equal to Relu(x) at batch 1 only."""
    return _model(
        [helper.make_node("Slice", ["x", "zero", "one", "zero"], ["row"]),
         helper.make_node("Relu", ["row"], ["r"]), helper.make_node("Shape", ["x"], ["s"]),
         helper.make_node("Expand", ["r", "s"], ["y"])], list(dims),
        [numpy_helper.from_array(np.array([0], np.int64), "zero"),
         numpy_helper.from_array(np.array([1], np.int64), "one")],
    )  # fmt: skip


def _in_branch(body: onnx.ModelProto) -> onnx.ModelProto:
    """``body``'s nodes in the then-branch of an If on a constant true (kept: the check runs it)."""
    branch = helper.make_graph(list(body.graph.node), "then", [],
                               [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])  # fmt: skip
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["y2"])], "else", [],
                              [helper.make_tensor_value_info("y2", TensorProto.FLOAT, None)])  # fmt: skip
    return _model([helper.make_node("If", ["cond"], ["y"], then_branch=branch, else_branch=other)], ["batch", 4],
                  [*body.graph.initializer, numpy_helper.from_array(np.array(True), "cond")])  # fmt: skip


def _sets(result: passes.CheckResult) -> dict[str, dict]:
    return {s["name"]: s for s in result.inputs.sets}


def test_the_pair_is_equal_at_batch_1_and_differs_at_3() -> None:
    """The premise, in onnxruntime: bit for bit equal at batch 1, different at batch 3."""
    rng = np.random.default_rng(0)
    one, three = rng.standard_normal((1, 4), dtype=np.float32), rng.standard_normal((3, 4), dtype=np.float32)
    for model in (_first_row_broadcast(), _in_branch(_first_row_broadcast())):
        (a,), (b,) = ort_run(_original(), {"x": one}), ort_run(model, {"x": one})
        assert a.tobytes() == b.tobytes()
        (a,), (b,) = ort_run(_original(), {"x": three}), ort_run(model, {"x": three})
        assert not np.array_equal(a, b)


def test_a_rewrite_wrong_only_at_batch_2_or_more_fails_on_the_larger_set() -> None:
    for original, optimized in ((_original(), _first_row_broadcast()),
                                (_in_branch(_original()), _in_branch(_first_row_broadcast()))):  # fmt: skip
        result = passes.check(original, optimized)
        assert result.checked and not result.ok, result.summary()
        assert result.inputs.dims == {"batch": 1}  # the chosen inputs: where the rewrite is exact
        sets = _sets(result)
        assert sets["normal"]["ok"] is True and sets["larger"]["ok"] is False, sets
        assert sets["larger"]["dims"] == {"batch": 3}
        assert result.failures[0].input_set == "larger"
        assert result.inputs.sizes == {"batch": [1, 3, 0]}


def test_dim_lists_set_the_sizes() -> None:
    """``dims={"batch": [1, 2]}``: the larger set at 2; ``[1, 2, 4]``: two larger sets; a single size fixes
    the dim (no larger set for it: the rewrite's error is then out of reach, as asked)."""
    result = passes.check(_original(), _first_row_broadcast(), dims={"batch": [1, 2]})
    assert not result.ok and _sets(result)["larger"]["dims"] == {"batch": 2}
    assert result.inputs.sizes == {"batch": [1, 2]}  # a dim the caller sizes is not made 0 either
    result = passes.check(_original(), _original(), dims={"batch": [1, 2, 4]})
    assert result.ok and [s["dims"] for s in result.inputs.sets if s["name"].startswith("larger")] == [
        {"batch": 2}, {"batch": 4}]
    result = passes.check(_original(), _first_row_broadcast(), dims={"batch": 1})
    assert result.ok and not _sets(result)["larger"]["tried"], result.inputs.sets


def test_static_shapes_have_no_larger_set() -> None:
    result = passes.check(_original([2, 4]), _original([2, 4]))
    assert result.ok and result.inputs.sizes == {}
    larger = _sets(result)["larger"]
    assert not larger["tried"] and not larger["ran"] and "no dynamic dimension" in larger["note"]
    assert "sizes checked" not in result.inputs.text() and "larger-size" not in result.inputs.text()
    assert result.notes == []


def test_unnamed_dims_are_enlarged_too() -> None:
    result = passes.check(_original([None, 4]), _first_row_broadcast([None, 4]))
    assert not result.ok and result.inputs.sizes == {"x[0]": [1, 3, 0]}, result.inputs.sizes


def test_the_budget_rule() -> None:
    assert sets_module.affordable({"scale": 100.0, "bytes": 1 << 20}, 0.01) == ""  # a fast first run
    assert sets_module.affordable({"scale": 1.5, "bytes": 1 << 20}, 5.0) == ""  # within 2x
    assert "more than 2x" in sets_module.affordable({"scale": 3.0, "bytes": 1 << 20}, 5.0)
    assert "over 1024 MiB" in sets_module.affordable({"scale": 1.0, "bytes": 2 << 30}, 0.01)
    # a fast first run, but the larger set estimated (linearly: a floor) over LARGER_SECONDS
    assert "at least, over 2 s" in sets_module.affordable({"scale": 300.0, "bytes": 1 << 20}, 0.01)
    assert sets_module.predicted(0.5, 2.0, 1.0) == 2.0 and sets_module.predicted(0.5, 2.0, 3.0) == 4.0


def test_a_larger_set_over_the_budget_is_skipped_and_said(monkeypatch, tmp_path: pathlib.Path, capsys) -> None:
    monkeypatch.setattr(sets_module, "LARGER_BYTES", 0)
    result = passes.check(_original(), _first_row_broadcast())
    assert result.checked and result.ok  # out of reach: but said
    larger = _sets(result)["larger"]
    assert larger["tried"] and not larger["ran"] and "over the check's budget" in larger["note"]
    assert any(n.startswith("input set 'larger'") and "over the check's budget" in n for n in result.notes)
    assert result.inputs.sizes == {"batch": [1, 0]}
    src = tmp_path / "m.onnx"
    onnx.save_model(_original(), str(src))
    code, out, _ = run_cli([str(src), str(tmp_path / "o.onnx")], capsys)
    assert code == 0 and "skipped: larger-size" in out and "over the check's budget" in out, out


def test_the_command_lists_the_sizes(tmp_path: pathlib.Path, capsys) -> None:
    src, report = tmp_path / "m.onnx", tmp_path / "r.json"
    onnx.save_model(_original(), str(src))
    code, out, _ = run_cli([str(src), str(tmp_path / "o.onnx"), "--dim", "batch=1,2", "--report", str(report)],
                           capsys)  # fmt: skip
    assert code == 0, out
    assert "sizes checked: batch 1, 2" in out, out
    data = json.loads(report.read_text())["check"]["inputs"]
    assert data["sizes"] == {"batch": [1, 2]} and data["dims"] == {"batch": 1}
    code, _, err = run_cli([str(src), str(tmp_path / "o.onnx"), "--dim", "batch=1,two"], capsys)
    assert code == 2 and "invalid --dim 'batch=1,two'" in err and "Traceback" not in err


def _positions(first_row_only: bool) -> onnx.ModelProto:
    """y = x + table[:seq] with a table of 64 positions (the original runs at seq 32, not 256); the
    ``first_row_only`` form adds it to x's first row expanded over the batch (wrong at batch 2)."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "one"], ["n"], axis=0),
             helper.make_node("Slice", ["table", "zero", "n"], ["p"])]  # fmt: skip
    if first_row_only:
        nodes += [helper.make_node("Slice", ["x", "zero", "one", "zero"], ["row"]),
                  helper.make_node("Add", ["row", "p"], ["r"]), helper.make_node("Expand", ["r", "s"], ["y"])]
    else:
        nodes += [helper.make_node("Add", ["x", "p"], ["y"])]
    return _model(nodes, ["batch", "seq"], [
        numpy_helper.from_array(np.arange(64, dtype=np.float32), "table"),
        numpy_helper.from_array(np.array([0], np.int64), "zero"),
        numpy_helper.from_array(np.array([1], np.int64), "one")])


def test_a_model_that_does_not_run_at_the_larger_sizes_is_checked_at_shorter_ones() -> None:
    result = passes.check(_positions(False), _positions(True))
    assert result.checked and not result.ok and result.failures[0].input_set == "larger", result.summary()
    larger = _sets(result)["larger"]
    assert larger["ran"] and larger["dims"] == {"batch": 2, "seq": 32}, larger
    assert "does not run on it at batch=3, seq=256" in larger["note"] and "it runs at batch=2, seq=32" in larger["note"]
    assert any(n.startswith("input set 'larger' (larger-size (batch=2, seq=32) inputs) (used)") for n in result.notes)
    assert result.inputs.sizes == {"batch": [1, 2, 0], "seq": [16, 32, 0]}
