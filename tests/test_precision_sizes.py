"""``--precision`` proven over sizes: the half model is compared with the float32 one at a long sequence.

``y = MatMul(x, w) + Sin(Cast(Range(sequence)) * inv_freq)`` with x ``[sequence, 8]``: positions
above 2048 do not fit float16 (and from 1024 its step is 1: Sin of them is off by up to 0.5 before).
At the check's first size (16) the half model is within tolerance. The search's check also
runs at sequence 1024, 2048 and 4096 (each longer one while the measured runs predict it
within the budget), where the positions are measured (range islands) and compared: the
rotary part stays float32, the MatMul goes half, and the written model is right at sequence
1024 and 4096 in onnxruntime. Where the budget allows only 2048, that is the range proven and
said; where the measured runs predict a longer one too slow, likewise; with no long set at all
the details say so, and the written model is wrong at 1024 (what the long set is for).
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from helpers import ort_run, run_cli
from passes.verify import sets as sets_module


def _rope() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inv_freq = np.array([1.0 / (10.0 ** (i / 8)) for i in range(8)], np.float32)
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]), helper.make_node("Gather", ["shape", "zero"], ["seq"], axis=0),
        helper.make_node("Range", ["start", "seq", "one"], ["pos"]),
        helper.make_node("Cast", ["pos"], ["posf"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["posf", "axes"], ["col"]),
        helper.make_node("Mul", ["col", "inv_freq"], ["angle"]), helper.make_node("Sin", ["angle"], ["s"]),
        helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "s"], ["y"]),
    ]  # fmt: skip
    inits = [numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array(0, np.int64), "start"),
             numpy_helper.from_array(np.array(1, np.int64), "one"),
             numpy_helper.from_array(np.array([1], np.int64), "axes"),
             numpy_helper.from_array(inv_freq, "inv_freq"),
             numpy_helper.from_array((rng.standard_normal((8, 8)) * 0.3).astype(np.float32), "w")]  # fmt: skip
    graph = helper.make_graph(nodes, "rope", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["sequence", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["sequence", 8])],
                              inits)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _error(original: onnx.ModelProto, converted: onnx.ModelProto, sequence: int) -> float:
    """How far ``converted`` is from the original at ``sequence``, in units of float16's tolerance."""
    x = np.random.default_rng(sequence).standard_normal((sequence, 8)).astype(np.float32)
    (expected,), (actual,) = ort_run(original, {"x": x}), ort_run(converted, {"x": x})
    return float((np.abs(actual - expected) / (1e-3 + 1e-2 * np.abs(expected))).max())


def _run(tmp_path: pathlib.Path, capsys, *flags: str) -> tuple[onnx.ModelProto, dict, str]:
    src, out, report = tmp_path / "rope.onnx", tmp_path / "out.onnx", tmp_path / "r.json"
    onnx.save_model(_rope(), str(src))
    code, stdout, err = run_cli([str(src), str(out), "--precision", "fp16", "--report", str(report), *flags], capsys)
    assert code == 0, stdout + err
    (precision,) = [p for p in json.loads(report.read_text())["passes"] if p["name"] == "precision"]
    return onnx.load(str(out)), precision["stats"], stdout


def test_the_premise_float16_is_right_at_16_and_wrong_at_1024_and_4096() -> None:
    half = _rope()
    for node in half.graph.node:  # the whole model in float16 (what a search at size 16 alone allows)
        if node.op_type == "Cast":
            node.attribute[0].i = TensorProto.FLOAT16
    for init in half.graph.initializer:
        if init.data_type == TensorProto.FLOAT:
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float16), init.name))
    graph = half.graph
    graph.node.insert(0, helper.make_node("Cast", ["x"], ["xh"], to=TensorProto.FLOAT16))
    for node in graph.node[1:]:
        node.input[:] = ["xh" if n == "x" and node.op_type == "MatMul" else n for n in node.input]
    graph.node[-1].output[0] = "yh"
    graph.node.append(helper.make_node("Cast", ["yh"], ["y"], to=TensorProto.FLOAT))
    assert _error(_rope(), half, 16) <= 1
    assert _error(_rope(), half, 1024) > 1 and _error(_rope(), half, 4096) > 1


def test_proven_at_4096_and_right_at_1024_and_4096(tmp_path: pathlib.Path, capsys) -> None:
    converted, stats, out = _run(tmp_path, capsys)
    assert stats["proven_sizes"] == {"sequence": [16, 1024, 2048, 4096, 0]} and "proven_note" not in stats
    assert "proven_sizes: sequence: [16, 1024, 2048, 4096, 0]" in out, out
    types = {i.name: i.type.tensor_type.elem_type for i in converted.graph.value_info}
    sin = next(n for n in converted.graph.node if n.op_type == "Sin")
    assert types[sin.output[0]] == TensorProto.FLOAT  # the positions' island, found at 4096
    matmul = next(n for n in converted.graph.node if n.op_type == "MatMul")
    assert types[matmul.output[0]] == TensorProto.FLOAT16  # the rest is half
    assert _error(_rope(), converted, 1024) <= 1 and _error(_rope(), converted, 4096) <= 1


def test_a_budget_for_2048_only_proves_2048_and_says_so(tmp_path: pathlib.Path, capsys, monkeypatch) -> None:
    monkeypatch.setattr(sets_module, "LARGER_BYTES", 200_000)  # 4096 x 8 floats in and out: 256 KiB
    converted, stats, _ = _run(tmp_path, capsys)
    assert stats["proven_sizes"] == {"sequence": [16, 1024, 2048, 0]}
    assert "larger-size (sequence=2048): not at sequence=4096: over the check's budget" in stats["proven_note"]
    assert _error(_rope(), converted, 1024) <= 1


def test_a_longer_size_predicted_too_slow_is_not_run_and_said(tmp_path: pathlib.Path, capsys, monkeypatch) -> None:
    """The measured run at 1024 predicts 2048's (as the square of the size at least): over the time a
    larger set may take, 2048 and 4096 are not run, and the note says what was measured and predicted."""
    seconds = {}
    original_add = sets_module.SetRunner.add

    def add(self, description, *args):  # the original's run at 1024 measured as 0.6 s
        error = original_add(self, description, *args)
        if error is None and description["inputs"]["x"]["shape"][0] == 1024:
            self.seconds = seconds[1024] = 0.6
        return error

    monkeypatch.setattr(sets_module.SetRunner, "add", add)
    converted, stats, _ = _run(tmp_path, capsys)
    assert seconds and stats["proven_sizes"] == {"sequence": [16, 1024, 0]}
    note = stats["proven_note"]
    assert "larger-size (sequence=1024): not at sequence=2048: the run at sequence=1024 took 0.6 s" in note, note
    assert "predicted at 2.4 s" in note and f"over {sets_module.LARGER_SECONDS:g} s" in note, note
    assert _error(_rope(), converted, 1024) <= 1


@pytest.mark.parametrize("flags", [("--dim", "sequence=16,1024")])
def test_dim_lists_choose_the_long_size(tmp_path: pathlib.Path, capsys, flags: tuple[str, ...]) -> None:
    converted, stats, _ = _run(tmp_path, capsys, *flags)
    assert stats["proven_sizes"] == {"sequence": [16, 1024]}
    assert _error(_rope(), converted, 1024) <= 1


def test_without_a_long_set_the_details_say_so(tmp_path: pathlib.Path, capsys, monkeypatch) -> None:
    monkeypatch.setattr(sets_module, "LARGER_BYTES", 0)
    converted, stats, out = _run(tmp_path, capsys)
    assert stats["proven_sizes"] == {"sequence": [16, 0]}
    assert "over the check's budget" in stats["proven_note"] and "proven_note" in out, out
    assert _error(_rope(), converted, 1024) > 1  # what the long set catches: not proven, not right


def _rope_in_function() -> onnx.ModelProto:
    """The rotary chain inside a model-local function ``local.rotary(x) -> s``; the MatMul and the Add outside."""
    model = _rope()
    chain = [n for n in model.graph.node if n.op_type not in ("MatMul", "Add")]
    body = [helper.make_node("Constant", [], [i.name], value=i) for i in model.graph.initializer if i.name != "w"]
    function = helper.make_function("local", "rotary", ["x"], ["s"], [*body, *chain], [helper.make_opsetid("", 17)])
    graph = helper.make_graph(
        [helper.make_node("rotary", ["x"], ["s"], domain="local"),
         *(n for n in model.graph.node if n.op_type in ("MatMul", "Add"))], "g",
        list(model.graph.input), list(model.graph.output), [i for i in model.graph.initializer if i.name == "w"],
    )  # fmt: skip
    result = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)],
                               functions=[function])  # fmt: skip
    result.ir_version = 8
    return result


def test_in_a_function_the_difference_at_4096_refuses_the_run(tmp_path: pathlib.Path, capsys, monkeypatch) -> None:
    """The function's body is converted inside its call (a fixed island): no island found there
    closes the gap, so the run fails (exit 1, nothing written) naming a long set; without the long
    set the same run writes a model that is wrong at sequence 1024."""
    src, out = tmp_path / "f.onnx", tmp_path / "out.onnx"
    onnx.save_model(_rope_in_function(), str(src))
    code, stdout, err = run_cli([str(src), str(out), "--precision", "fp16"], capsys)
    assert code == 1 and not out.exists(), stdout + err
    assert "larger-size (sequence=1024)" in stdout + err, stdout + err  # the first long set it differs on
    monkeypatch.setattr(sets_module, "LARGER_BYTES", 0)
    code, stdout, err = run_cli([str(src), str(out), "--precision", "fp16"], capsys)
    assert code == 0, stdout + err
    assert _error(_rope_in_function(), onnx.load(str(out)), 1024) > 1
