"""Deploy-ready output: static shapes (``--input-shape``, ``--fix-dim``), typed values, the summary.

* A CNN with a dynamic batch and spatial dims declared static: its Shape chains
  fold away, its outputs become static, the check runs at those sizes.
* A transformer-style model with ``--fix-dim batch=1 --fix-dim seq=128``.
* Each refusal: exit 2, one line, nothing written, the input untouched, and
  the API refuses with the same message.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import helpers
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import passes

REPO = pathlib.Path(__file__).resolve().parent.parent
BERT = REPO / "models" / "real" / "tiny_bert_opset17.onnx"
RNG = np.random.default_rng(0)


def _init(name: str, array: np.ndarray) -> onnx.TensorProto:
    return onnx.numpy_helper.from_array(array, name)


def _cnn() -> onnx.ModelProto:
    """x[N, 3, H, W] -> Conv -> Relu -> flattened by a Shape/Gather/Concat chain -> y[N, ?]."""
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Shape", ["r"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "axes0"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["r", "target"], ["y"]),
        helper.make_node("ReduceMean", ["r"], ["pooled"], axes=[2, 3], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes, "cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", None]),
         helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["N", 4])],
        [_init("w", RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)),
         _init("b", RNG.standard_normal(4).astype(np.float32)),
         _init("zero", np.array(0, np.int64)), _init("axes0", np.array([0], np.int64)),
         _init("minus1", np.array([-1], np.int64))],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _attention(width: int = 16, heads: int = 2) -> onnx.ModelProto:
    """Self-attention over x[batch, seq, width], its heads split and merged by Shape chains."""
    head = width // heads
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "i0"], ["b"], axis=0),
        helper.make_node("Gather", ["s", "i1"], ["t"], axis=0),
        helper.make_node("Unsqueeze", ["b", "axes0"], ["b1"]),
        helper.make_node("Unsqueeze", ["t", "axes0"], ["t1"]),
        helper.make_node("Concat", ["b1", "t1", "split_tail"], ["split_shape"], axis=0),
        helper.make_node("Concat", ["b1", "t1", "merge_tail"], ["merge_shape"], axis=0),
    ]
    for name in "qkv":
        nodes += [
            helper.make_node("MatMul", ["x", f"w{name}"], [f"{name}0"]),
            helper.make_node("Reshape", [f"{name}0", "split_shape"], [f"{name}1"]),
            helper.make_node("Transpose", [f"{name}1"], [f"{name}h"],
                             perm=[0, 2, 3, 1] if name == "k" else [0, 2, 1, 3]),
        ]  # fmt: skip
    nodes += [
        helper.make_node("MatMul", ["qh", "kh"], ["scores"]),
        helper.make_node("Mul", ["scores", "scale"], ["scaled"]),
        helper.make_node("Softmax", ["scaled"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "vh"], ["ctx"]),
        helper.make_node("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["ctx_t", "merge_shape"], ["y"]),
    ]
    inits = [_init(f"w{n}", RNG.standard_normal((width, width)).astype(np.float32) / 4) for n in "qkv"]
    inits += [_init("i0", np.array(0, np.int64)), _init("i1", np.array(1, np.int64)),
              _init("axes0", np.array([0], np.int64)), _init("split_tail", np.array([heads, head], np.int64)),
              _init("merge_tail", np.array([width], np.int64)),
              _init("scale", np.array(1 / np.sqrt(head), np.float32))]  # fmt: skip
    graph = helper.make_graph(
        nodes, "attention",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", width])], inits,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _save(model: onnx.ModelProto, path: pathlib.Path) -> pathlib.Path:
    onnx.save_model(model, str(path))
    return path


def _dims(info: onnx.ValueInfoProto) -> list[int | str | None]:
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
            for d in info.type.tensor_type.shape.dim]  # fmt: skip


# --- static shapes ---------------------------------------------------------------------------------


def test_a_cnn_with_dynamic_batch_and_spatial_dims_made_static(tmp_path: pathlib.Path, capsys) -> None:
    src, out, report = _save(_cnn(), tmp_path / "cnn.onnx"), tmp_path / "out.onnx", tmp_path / "r.json"
    code, text, err = helpers.run_cli([str(src), "-o", str(out), "--input-shape", "x:2,3,8,8", "--report", str(report)], capsys)
    assert code == 0, err
    result = onnx.load(str(out))
    ops = [n.op_type for n in result.graph.node]
    assert not {"Shape", "Gather", "Concat", "Unsqueeze"} & set(ops), ops
    assert _dims(result.graph.input[0]) == [2, 3, 8, 8]
    assert {o.name: _dims(o) for o in result.graph.output} == {"y": [2, 256], "pooled": [2, 4]}
    check = json.loads(report.read_text())["check"]
    assert check["checked"] and check["ok"]
    assert check["inputs"]["shapes"]["x"] == [2, 3, 8, 8]
    assert "inputs: generated (seed 0): x[2, 3, 8, 8]" in text
    x = RNG.standard_normal((2, 3, 8, 8)).astype(np.float32)
    for expected, actual in zip(helpers.ort_run(str(src), {"x": x}), helpers.ort_run(str(out), {"x": x})):
        np.testing.assert_array_equal(actual, expected)


def test_the_api_declares_the_same_shapes(tmp_path: pathlib.Path) -> None:
    result = passes.optimize(_cnn(), input_shapes={"x": (1, 3, 4, 6)})
    assert "Shape" not in [n.op_type for n in result.graph.node]
    assert {o.name: _dims(o) for o in result.graph.output} == {"y": [1, 96], "pooled": [1, 4]}
    src = _save(_cnn(), tmp_path / "cnn.onnx")
    out = passes.optimize(src, output=tmp_path / "o.onnx", fix_dims={"N": 3, "H": 4, "W": 4})
    assert _dims(onnx.load(str(out)).graph.input[0]) == [3, 3, 4, 4]


def test_a_transformer_with_fixed_batch_and_sequence(tmp_path: pathlib.Path, capsys) -> None:
    src, out = _save(_attention(), tmp_path / "attn.onnx"), tmp_path / "out.onnx"
    code, text, err = helpers.run_cli([str(src), str(out), "--fix-dim", "batch=1", "--fix-dim", "seq=128"], capsys)
    assert code == 0, err
    result = onnx.load(str(out))
    assert "Shape" not in [n.op_type for n in result.graph.node]
    assert _dims(result.graph.input[0]) == [1, 128, 16] and _dims(result.graph.output[0]) == [1, 128, 16]
    assert "inputs: generated (seed 0): batch=1, seq=128" in text and "check passed" in text


def test_fix_dim_sets_the_dim_everywhere_in_a_real_model(tmp_path: pathlib.Path, capsys) -> None:
    out = tmp_path / "bert.onnx"
    code, text, err = helpers.run_cli([str(BERT), str(out), "--fix-dim", "batch=1", "--fix-dim", "seq=16", "-q"], capsys)
    assert code == 0, err
    result = onnx.load(str(out))
    assert "Shape" not in [n.op_type for n in result.graph.node]
    assert [_dims(i) for i in result.graph.input] == [[1, 16], [1, 16]]
    assert _dims(result.graph.output[0]) == [1, 16, 64] and _dims(result.graph.output[2]) == [1, 3]


def test_a_fixed_dim_needs_no_dim_flag_and_a_same_dim_is_accepted(tmp_path: pathlib.Path, capsys) -> None:
    src, out = _save(_cnn(), tmp_path / "cnn.onnx"), tmp_path / "out.onnx"
    code, text, err = helpers.run_cli([str(src), str(out), "--fix-dim", "N=2", "--dim", "N=2", "--dim", "H=4", "--dim", "W=4"],
                           capsys)  # fmt: skip
    assert code == 0, err
    assert "inputs: generated (seed 0): H=4, N=2, W=4" in text


REFUSALS = {
    "unknown input": (["--input-shape", "nope:1,2"], dict(input_shapes={"nope": [1, 2]}),
                      "--input-shape 'nope:1,2': the model has no input named 'nope' (its inputs: 'x')"),
    "unknown dim": (["--fix-dim", "nope=3"], dict(fix_dims={"nope": 3}),
                    "--fix-dim 'nope=3': the model has no dim named 'nope' (its dim names: 'N', 'H', 'W')"),
    "rank": (["--input-shape", "x:1,3,8"], dict(input_shapes={"x": [1, 3, 8]}),
             "--input-shape 'x:1,3,8': 'x' has rank 4 [N, 3, H, W], not 3"),
    "static dim": (["--input-shape", "x:1,4,8,8"], dict(input_shapes={"x": [1, 4, 8, 8]}),
                   "--input-shape 'x:1,4,8,8': dim 1 of 'x' is 3 [N, 3, H, W], not 4"),
    "zero": (["--input-shape", "x:1,3,0,8"], dict(input_shapes={"x": [1, 3, 0, 8]}),
             "--input-shape 'x:1,3,0,8': size 0 is not a positive integer"),
    "negative": (["--fix-dim", "N=-1"], dict(fix_dims={"N": -1}), "--fix-dim 'N=-1': size -1 is not a positive integer"),
    "not a number": (["--input-shape", "x:1,3,a,8"], dict(input_shapes={"x": [1, 3, "a", 8]}),
                     "--input-shape 'x:1,3,a,8': size 'a' is not a positive integer"),
    "two requests disagree": (["--fix-dim", "N=2", "--input-shape", "x:1,3,8,8"],
                              dict(fix_dims={"N": 2}, input_shapes={"x": [1, 3, 8, 8]}),
                              "--input-shape 'x:1,3,8,8': dim 0 of 'x' is 'N', which --fix-dim 'N=2' sets to 2"),
    "dim contradicts": (["--fix-dim", "N=2", "--dim", "N=3"], dict(fix_dims={"N": 2}, check=passes.CheckOptions(dims={"N": 3})),
                        "--dim 'N=3' contradicts --fix-dim 'N=2' ('N' is 2 there)"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_each_refusal_is_one_line_exit_2_nothing_written(case: str, tmp_path: pathlib.Path, capsys) -> None:
    args, keywords, message = REFUSALS[case]
    src, out = _save(_cnn(), tmp_path / "cnn.onnx"), tmp_path / "out.onnx"
    before = src.read_bytes()
    code, text, err = helpers.run_cli([str(src), "-o", str(out), *args], capsys)
    assert code == 2
    assert err.splitlines() == [f"optimize: error: {message}"]
    assert not out.exists() and src.read_bytes() == before and text == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cnn.onnx"]
    with pytest.raises(passes.InputError) as api:
        passes.optimize(onnx.load(str(src)), **keywords)
    assert str(api.value) == message


def test_a_shape_the_model_cannot_run_at_is_refused(tmp_path: pathlib.Path, capsys) -> None:
    """tiny_bert's position table has 32 rows: a sequence of 128 is no shape it runs at."""
    out = tmp_path / "bert.onnx"
    code, text, err = helpers.run_cli([str(BERT), str(out), "--fix-dim", "seq=128"], capsys)
    assert code == 2 and not out.exists()
    assert len(err.splitlines()) == 1
    assert err.startswith("optimize: error: --fix-dim 'seq=128': the model cannot run at these shapes")


def _bert_declaring(seq: int) -> onnx.ModelProto:
    """tiny_bert with its inputs' sequence dim declared static (as an export with a fixed example does)."""
    model = onnx.load(str(BERT))
    for value in model.graph.input:
        dim = value.type.tensor_type.shape.dim[1]
        dim.Clear()
        dim.dim_value = seq
    return model


@pytest.mark.parametrize("check", [[], ["--no-check"]])
def test_a_model_whose_inputs_declare_a_shape_it_cannot_run_at_is_refused_as_its_own(
        check: list[str], tmp_path: pathlib.Path, capsys) -> None:  # fmt: skip
    """Declared [batch, 128] against a 32-row position table: folding makes the contradiction visible
    and the result cannot be valid. The refusal names the declaration (exit 2), not the passes
    ("the optimised model is invalid", exit 1, before): the same passes at a symbolic sequence are valid."""
    src, out, report = _save(_bert_declaring(128), tmp_path / "bert.onnx"), tmp_path / "out.onnx", tmp_path / "r.json"
    code, text, err = helpers.run_cli([str(src), str(out), "--report", str(report), *check], capsys)
    prefix = ("the model cannot run at the static shapes its inputs declare ('input_ids' [batch, 128], "
              "'attention_mask' [batch, 128]): invalid model: ")
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"optimize: error: {prefix}") and "Incompatible dimensions" in err
    assert not out.exists()
    written = json.loads(report.read_text())
    assert written["written"] is False and written["error"].startswith(prefix)
    with pytest.raises(passes.InputError, match=r"^the model cannot run at the static shapes its inputs declare"):
        passes.optimize(_bert_declaring(128))


def test_a_model_whose_inputs_declare_a_shape_it_runs_at_is_optimised(tmp_path: pathlib.Path, capsys) -> None:
    """The no-op case: declared [batch, 16] fits the table: written, declared as it was, and it computes
    what the original does (float32's tolerance: simplify's fusions may run)."""
    import onnxruntime as ort

    src, out = _save(_bert_declaring(16), tmp_path / "bert.onnx"), tmp_path / "out.onnx"
    code, text, err = helpers.run_cli([str(src), str(out), "-q"], capsys)
    assert code == 0 and err == "", err
    assert [_dims(i) for i in onnx.load(str(out)).graph.input] == [["batch", 16], ["batch", 16]]
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sessions = [ort.InferenceSession(str(p), options, providers=["CPUExecutionProvider"]) for p in (src, out)]
    for batch in (1, 3):
        feeds = {"input_ids": RNG.integers(0, 100, (batch, 16)).astype(np.int64),
                 "attention_mask": np.ones((batch, 16), np.int64)}  # fmt: skip
        for a, b in zip(*(s.run(None, feeds) for s in sessions)):
            np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)


def test_a_malformed_flag_is_a_usage_error(tmp_path: pathlib.Path, capsys) -> None:
    src = _save(_cnn(), tmp_path / "cnn.onnx")
    for args in (["--input-shape", "x"], ["--fix-dim", "N"], ["--input-shape", "x:1,3,8,8", "--input-shape", "x:2,3,8,8"]):
        code, text, err = helpers.run_cli([str(src), str(tmp_path / "o.onnx"), *args], capsys)
        assert code == 2 and len(err.splitlines()) == 1, err
    assert not (tmp_path / "o.onnx").exists()


def test_overwrite_input_shape_is_an_alias(tmp_path: pathlib.Path, capsys) -> None:
    src, out = _save(_cnn(), tmp_path / "cnn.onnx"), tmp_path / "out.onnx"
    code, _, err = helpers.run_cli([str(src), str(out), "--overwrite-input-shape", "x:1,3,8,8", "-q"], capsys)
    assert code == 0, err
    assert _dims(onnx.load(str(out)).graph.input[0]) == [1, 3, 8, 8]


# --- typed values in the output --------------------------------------------------------------------


def _typed_values(graph: onnx.GraphProto) -> None:
    """Every value a node computes has a value_info (type and shape); initializers, inputs and outputs none."""
    infos = {v.name for v in graph.value_info}
    boundary = {t.name for t in graph.initializer} | {i.name for i in graph.input} | {o.name for o in graph.output}
    computed = {o for n in graph.node for o in n.output if o}
    assert computed - boundary <= infos, sorted(computed - boundary - infos)
    assert not infos & boundary, sorted(infos & boundary)
    for info in graph.value_info:
        assert info.type.tensor_type.elem_type and info.type.tensor_type.HasField("shape"), info.name


def _against_onnxruntime(path: pathlib.Path, feeds_by_size: list[dict[str, np.ndarray]]) -> None:
    """Each value_info matches the shape onnxruntime computes, at each input size: static dims equal,
    each symbolic name one size within a run (and the inputs' names their sizes)."""
    assert helpers.value_info_against_onnxruntime(str(path), feeds_by_size) > 0


def test_value_info_on_a_dynamic_transformer_matches_onnxruntime(tmp_path: pathlib.Path, capsys) -> None:
    out = tmp_path / "bert.onnx"
    code, _, err = helpers.run_cli([str(BERT), str(out), "-q"], capsys)
    assert code == 0, err
    result = onnx.load(str(out))
    _typed_values(result.graph)
    assert len(result.graph.value_info) > 50
    feeds = [{"input_ids": RNG.integers(0, 256, (b, s)), "attention_mask": np.ones((b, s), np.int64)}
             for b, s in ((1, 5), (3, 17))]  # fmt: skip
    _against_onnxruntime(out, feeds)


def test_value_info_on_the_cnn_and_attention_models(tmp_path: pathlib.Path) -> None:
    for model, feeds in (
        (_cnn(), [{"x": RNG.standard_normal(s).astype(np.float32)} for s in ((1, 3, 4, 4), (2, 3, 6, 5))]),
        (_attention(), [{"x": RNG.standard_normal(s).astype(np.float32)} for s in ((1, 3, 16), (2, 9, 16))]),
    ):
        out = passes.optimize(_save(model, tmp_path / "m.onnx"), output=tmp_path / "o.onnx")
        _typed_values(onnx.load(str(out)).graph)
        _against_onnxruntime(out, feeds)


def _branching() -> onnx.ModelProto:
    """An If whose branches compute intermediate values of x[N, 4]."""

    def branch(name: str, op: str) -> onnx.GraphProto:
        return helper.make_graph(
            [helper.make_node(op, ["x", "k"], [f"{name}_a"]), helper.make_node("Relu", [f"{name}_a"], [f"{name}_b"]),
             helper.make_node("Cast", [f"{name}_b"], [f"{name}_c"], to=TensorProto.DOUBLE),
             helper.make_node("ReduceSum", [f"{name}_c", "axes1"], [f"{name}_out"], keepdims=1)],
            name, [], [helper.make_tensor_value_info(f"{name}_out", TensorProto.DOUBLE, ["N", 1])],
        )  # fmt: skip

    nodes = [
        helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
        helper.make_node("Greater", ["total", "zero"], ["cond"]),
        helper.make_node("If", ["cond"], ["y"], then_branch=branch("then", "Mul"), else_branch=branch("else", "Sub")),
    ]
    graph = helper.make_graph(
        nodes, "branching", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.DOUBLE, ["N", None])],
        [_init("k", RNG.standard_normal(4).astype(np.float32)), _init("zero", np.array(0, np.float32)),
         _init("axes1", np.array([1], np.int64))],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def test_value_info_in_subgraphs(tmp_path: pathlib.Path) -> None:
    out = passes.optimize(_save(_branching(), tmp_path / "m.onnx"), output=tmp_path / "o.onnx")
    result = onnx.load(str(out))
    _typed_values(result.graph)
    if_node = next(n for n in result.graph.node if n.op_type == "If")
    for attr in if_node.attribute:
        body = attr.g
        _typed_values(body)
        shapes = {v.name: (v.type.tensor_type.elem_type, _dims(v)) for v in body.value_info}
        name = body.name
        assert shapes[f"{name}_a"] == (TensorProto.FLOAT, ["N", 4]) and shapes[f"{name}_c"] == (TensorProto.DOUBLE, ["N", 4])
    assert _dims(result.graph.output[0])[0] == "N"  # the declared output keeps its names
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_array_equal(helpers.ort_run(str(out), {"x": x})[0], helpers.ort_run(str(tmp_path / "m.onnx"), {"x": x})[0])


# --- the summary: signature and size on disk -------------------------------------------------------


def test_the_summary_shows_the_signature_and_the_size_on_disk(tmp_path: pathlib.Path, capsys) -> None:
    src, out, report = _save(_cnn(), tmp_path / "cnn.onnx"), tmp_path / "out.onnx", tmp_path / "r.json"
    code, text, err = helpers.run_cli([str(src), str(out), "--input-shape", "x:2,3,8,8", "--report", str(report)], capsys)
    assert code == 0, err
    lines = text.splitlines()
    start = lines.index(next(line for line in lines if line.startswith("signature")))
    assert lines[start].split() == ["signature", "before", "after"]
    assert lines[start + 1].split() == ["input", "x", "float[N,3,H,W]", "float[2,3,8,8]"]
    assert lines[start + 2].split() == ["output", "y", "float[N,?]", "float[2,256]"]
    assert lines[start + 3].split() == ["output", "pooled", "float[N,4]", "float[2,4]"]
    size = next(line for line in lines if line.startswith("size on disk"))
    assert size.split()[3:] == [str(src.stat().st_size), "B", str(out.stat().st_size), "B"]
    data = json.loads(report.read_text())
    assert data["before"]["inputs"] == [{"name": "x", "dtype": "float", "shape": ["N", 3, "H", "W"]}]
    assert data["after"]["outputs"][0] == {"name": "y", "dtype": "float", "shape": [2, 256]}
    assert (data["before"]["file_bytes"], data["after"]["file_bytes"]) == (src.stat().st_size, out.stat().st_size)


def test_the_size_on_disk_counts_external_data(tmp_path: pathlib.Path, capsys) -> None:
    model = onnx.load(str(BERT))
    src = tmp_path / "bert.onnx"
    onnx.save_model(model, str(src), save_as_external_data=True, location="bert.weights", size_threshold=0)
    out, report = tmp_path / "out.onnx", tmp_path / "r.json"
    code, text, err = helpers.run_cli([str(src), str(out), "--report", str(report), "-q"], capsys)
    assert code == 0, err
    data = json.loads(report.read_text())
    assert data["before"]["file_bytes"] == src.stat().st_size + (tmp_path / "bert.weights").stat().st_size
    written = [out] + ([out.with_name("out.onnx.data")] if out.with_name("out.onnx.data").exists() else [])
    assert data["after"]["file_bytes"] == sum(f.stat().st_size for f in written)
    assert data["after"]["file_bytes"] > 300_000  # the weights are counted wherever they are


# --- a folder of models ----------------------------------------------------------------------------

REAL = REPO / "models" / "real"


def _mixed_folder(root: pathlib.Path) -> pathlib.Path:
    """Two good models (one in a subfolder, one with external data), an invalid file, and a model whose
    check fails at a zero tolerance (the BatchNormalization fusion's rounding)."""
    folder = root / "in"
    (folder / "sub").mkdir(parents=True)
    shutil.copy(REAL / "sk_mlp_opset13.onnx", folder / "mlp.onnx")
    model = onnx.load(str(REAL / "sk_scaler_pca_logreg_opset11.onnx"))
    for i, tensor in enumerate(model.graph.initializer):  # as raw bytes: only those go to external data
        model.graph.initializer[i].CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(tensor), tensor.name))
    onnx.save_model(model, str(folder / "sub" / "ext.onnx"), save_as_external_data=True, location="ext.weights",
                    size_threshold=0)  # fmt: skip
    assert (folder / "sub" / "ext.weights").exists()
    (folder / "sub" / "bad.onnx").write_bytes(b"not a model")
    shutil.copy(REAL / "small_cnn_opset11_nofold.onnx", folder / "cnn.onnx")
    return folder


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_mixed_folder(jobs: str, tmp_path: pathlib.Path) -> None:
    folder = _mixed_folder(tmp_path)
    before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    out, report = tmp_path / "out", tmp_path / "all.json"
    proc = helpers_run(str(folder), "-o", str(out), "--jobs", jobs, "--report", str(report), "--rtol", "0", "--atol", "0",
                       "--no-unfused-fallback")
    assert proc.returncode == 2, proc.stderr  # the worst: the invalid file
    records = {r["model"]: r for r in json.loads(report.read_text())["models"]}
    assert {m: r["exit"] for m, r in records.items()} == {"cnn.onnx": 1, "mlp.onnx": 0, "sub/bad.onnx": 2,
                                                          "sub/ext.onnx": 0}  # fmt: skip
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == ["mlp.onnx", "sub/ext.onnx"]
    assert records["sub/ext.onnx"]["report"]["check"]["ok"] is True
    assert records["sub/ext.onnx"]["report"]["before"]["file_bytes"] > (folder / "sub" / "ext.onnx").stat().st_size
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["model", "nodes", "size", "check", "seconds", "status"]
    assert any(line.startswith("cnn.onnx") and "FAILED" in line and "check failed" in line for line in lines)
    assert any(line.startswith("sub/bad.onnx") and "error: " in line for line in lines)
    assert sorted(proc.stderr.splitlines())[0].startswith("optimize: error: cnn.onnx: check failed")
    for r in records.values():
        if r["exit"] == 0:
            helpers.ort_session(r["output"])  # each output runs


def test_a_folder_of_good_models_exits_0(tmp_path: pathlib.Path) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    shutil.copy(REAL / "sk_mlp_opset13.onnx", folder / "a.onnx")
    shutil.copy(REPO / "models" / "demo.onnx", folder / "b.onnx")
    proc = helpers_run(str(folder), str(tmp_path / "out"), "--jobs", "2", "-q")
    assert proc.returncode == 0 and proc.stdout == "" and proc.stderr == "", proc.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["a.onnx", "b.onnx"]


def test_jobs_with_a_single_file_is_refused(tmp_path: pathlib.Path, capsys) -> None:
    code, _, err = helpers.run_cli([str(REPO / "models" / "demo.onnx"), str(tmp_path / "o.onnx"), "--jobs", "2"], capsys)
    assert code == 2 and err.startswith("optimize: error: --jobs is for a folder of models")


def test_an_interrupted_folder_leaves_no_partial_output(tmp_path: pathlib.Path) -> None:
    """Ctrl-C: no partial file; the table, the totals and ``--report`` still say what finished."""
    folder = tmp_path / "in"
    folder.mkdir()
    models = 24  # about a second each: far from done when the first output appears
    for i in range(models):
        shutil.copy(REAL / "tiny_bert_opset17.onnx", folder / f"m{i}.onnx")
    out, report = tmp_path / "out", tmp_path / "all.json"
    proc = subprocess.Popen([sys.executable, "-m", "passes", str(folder), "-o", str(out), "--jobs", "2", "--report",
                             str(report)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)  # fmt: skip
    deadline = time.monotonic() + 120
    while not (out.exists() and any(out.glob("*.onnx"))) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)  # interrupted mid-way: some models written, others running or not started
    proc.send_signal(signal.SIGINT)
    stdout, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert err.decode().strip().splitlines()[-1].startswith("optimize: error: interrupted")
    left = [p for p in out.rglob("*")] if out.exists() else []
    assert all(p.suffix == ".onnx" and not p.name.startswith(".") for p in left), left
    for p in left:
        onnx.checker.check_model(str(p))  # every model written is whole
    assert len(left) < models
    data = json.loads(report.read_text())  # the report of the models that finished
    finished = {r["model"] for r in data["models"]}
    assert data["interrupted"] is True and finished and finished.isdisjoint(data["not_finished"])
    assert finished | set(data["not_finished"]) == {f"m{i}.onnx" for i in range(models)}
    assert finished <= {p.name for p in left} and all(r["status"] == "ok" for r in data["models"])
    assert f"{len(data['not_finished'])} not finished" in stdout.decode().splitlines()[-1]


def helpers_run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "passes", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=600)  # fmt: skip


def test_an_initializer_that_is_a_graph_output_keeps_its_type(tmp_path: pathlib.Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Abs", ["x"], ["y"])], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"]), helper.make_tensor_value_info("c", TensorProto.FLOAT, [2])],
        [_init("c", np.array([1, -2], np.float32))],
    )  # fmt: skip
    src = _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), tmp_path / "m.onnx")
    out = passes.optimize(src, output=tmp_path / "o.onnx")
    result = onnx.load(str(out))
    onnx.checker.check_model(result, full_check=True)
    assert _dims(result.graph.output[1]) == [2] and result.graph.output[1].type.tensor_type.elem_type == TensorProto.FLOAT
