"""The check's inputs: sizes that make the original run, index ranges, NOT CHECKED, ``--inputs`` read bounded."""

from __future__ import annotations

import io
import json
import pathlib
import zipfile

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import passes
from passes import cli
from passes.verify import npz, plan

REPO = pathlib.Path(__file__).resolve().parent.parent
DEMO = REPO / "models" / "demo.onnx"


def cnn_model(dims: list[str | None] | None = None, *, opset: int = 13, kernel: int = 3,
              layers: int = 3) -> onnx.ModelProto:  # fmt: skip
    """Conv (kernel 3, no padding) + Relu layers, a MaxPool, GlobalAveragePool and Flatten on
    NCHW input with dynamic dims (named ``batch/height/width`` by default, or as given; None
    leaves a dim unnamed). 2x2 or 4x4 images are too small for it."""
    rng = np.random.default_rng(0)
    dims = ["batch", 3, "height", "width"] if dims is None else dims
    nodes, inits, prev, channels = [], [], "x", 3
    for i in range(layers):
        w = (rng.standard_normal((8, channels, kernel, kernel)) * 0.3).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"),
                  numpy_helper.from_array((rng.standard_normal(8) * 0.1).astype(np.float32), f"b{i}")]
        nodes += [helper.make_node("Conv", [prev, f"w{i}", f"b{i}"], [f"c{i}"], name=f"conv{i}"),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}")]
        prev, channels = f"r{i}", 8
        if i == 0:
            nodes.append(helper.make_node("MaxPool", [prev], ["pool"], name="pool", kernel_shape=[2, 2],
                                          strides=[2, 2]))  # fmt: skip
            prev = "pool"
    nodes += [helper.make_node("GlobalAveragePool", [prev], ["gap"], name="gap"),
              helper.make_node("Flatten", ["gap"], ["y"], name="flatten")]
    graph = helper.make_graph(
        nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [dims[0], 8])], initializer=inits,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _unnamed(model: onnx.ModelProto) -> onnx.ModelProto:
    for info in [*model.graph.input, *model.graph.output]:
        for d in info.type.tensor_type.shape.dim:
            if d.HasField("dim_param"):
                d.ClearField("dim_param")
    return model


def _run(tmp_path: pathlib.Path, model: onnx.ModelProto, *args: str) -> tuple[int, dict, str]:
    src, out, report = tmp_path / "m.onnx", tmp_path / "out.onnx", tmp_path / "r.json"
    onnx.save_model(model, str(src))
    code = cli.main([str(src), "-o", str(out), "--report", str(report), "-q", *args])
    data = json.loads(report.read_text()) if report.exists() else {}
    return code, data, str(out)


def test_a_cnn_with_dynamic_spatial_dims_is_checked_by_default(tmp_path: pathlib.Path, capsys) -> None:
    code, data, _ = _run(tmp_path, cnn_model())
    err = capsys.readouterr().err
    assert code == 0, err
    check = data["check"]
    assert check["checked"] is True and check["ok"] is True, check
    assert "NOT CHECKED" not in err
    assert check["inputs"]["dims"] == {"batch": 1, "height": 32, "width": 32}
    assert check["inputs"]["shapes"] == {"x": [1, 3, 32, 32]}


def test_unnamed_dims_get_sizes_from_their_position(tmp_path: pathlib.Path, capsys) -> None:
    model = _unnamed(cnn_model())
    assert plan.input_specs(model)[0].roles == ["batch", "static", "image", "image"]
    code, data, _ = _run(tmp_path, model)
    assert code == 0 and data["check"]["checked"], capsys.readouterr().err
    assert data["check"]["inputs"]["shapes"] == {"x": [1, 3, 32, 32]}


def test_sizes_are_raised_when_a_kernel_rejects_them(tmp_path: pathlib.Path, capsys) -> None:
    # Kernel 15 needs more than 32 pixels: 32 -> 18 -> pool 9 is too small for the second
    # Conv; the second try (64 -> 50 -> 25 -> 11) runs.
    code, data, _ = _run(tmp_path, cnn_model(kernel=15, layers=2))
    assert code == 0, capsys.readouterr().err
    used = data["check"]["inputs"]
    assert data["check"]["checked"] and used["tries"] == 2 and used["dims"]["height"] == 64
    assert "Conv" in used["attempts"][0]["error"] or "conv" in used["attempts"][0]["error"].lower()
    # The text report says which sizes were used.
    capsys.readouterr()
    cli.main([str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o2.onnx")])
    assert "height=64" in capsys.readouterr().out


def test_named_dims_stay_consistent_across_inputs() -> None:
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, ["n", "seq_len"])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, ["n", "seq_len"])
    graph = helper.make_graph([helper.make_node("Add", ["a", "b"], ["y"])], "g", [a, b],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", "seq_len"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    tries, _ = plan.size_tries(plan.input_specs(model), dims={"n": 3})
    assert [t["dims"] for t in tries] == [{"n": 3, "seq_len": s} for s in plan.LADDERS["sequence"]]
    assert all(t["inputs"]["a"]["shape"] == t["inputs"]["b"]["shape"] for t in tries)
    result = passes.check(model, model)
    assert result.checked and result.ok and result.inputs.dims == {"n": 1, "seq_len": 16}


def _gather_model(rows: int) -> onnx.ModelProto:
    table = numpy_helper.from_array(np.arange(rows * 4, dtype=np.float32).reshape(rows, 4), "table")
    graph = helper.make_graph(
        [helper.make_node("Cast", ["ids"], ["ids64"], to=TensorProto.INT64),
         helper.make_node("Gather", ["table", "ids64"], ["y"], axis=0)],
        "embedding", [helper.make_tensor_value_info("ids", TensorProto.INT32, ["batch", "seq"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 4])], initializer=[table],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_index_inputs_stay_below_the_gathered_table() -> None:
    spec = plan.input_specs(_gather_model(3))[0]
    assert (spec.low, spec.high) == (0, 3) and "3 rows" in spec.high_reason
    assert plan.input_specs(_gather_model(30_000))[0].high == 30_000
    # With the old [0, 4) an index of 3 would be out of range for 3 rows: the check would not run.
    result = passes.check(_gather_model(3), _gather_model(3))
    assert result.checked and result.ok, result.summary()


def test_a_model_no_sizes_fit_is_not_checked_and_fails_under_require_check(tmp_path: pathlib.Path,
                                                                           capsys) -> None:  # fmt: skip
    # The feature dimension must be 7 to match the weight: no size tried is 7.
    w = numpy_helper.from_array(np.ones((7, 2), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "features"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])], initializer=[w],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    code, data, out = _run(tmp_path, model)
    err = capsys.readouterr().err
    assert code == 0 and pathlib.Path(out).exists()
    assert "optimize: warning: NOT CHECKED" in err and "--dim NAME=SIZE" in err and "features" in err
    assert "--inputs FILE.npz" in err
    assert data["check"]["checked"] is False and len(data["check"]["skipped"]) > 0
    assert data["check"]["ok"] is None  # not "ok": true, for a reader of that field alone
    pathlib.Path(out).unlink()
    code, data, out = _run(tmp_path, model, "--require-check")
    err = capsys.readouterr().err
    assert code == 1 and "NOT CHECKED" in err and "--require-check" in err
    assert not pathlib.Path(out).exists() and data["check"]["checked"] is False
    # The option the message names fixes it.
    code, data, _ = _run(tmp_path, model, "--require-check", "--dim", "features=7")
    assert code == 0 and data["check"]["checked"] and data["check"]["ok"]


def _range_behind_if(limit: np.ndarray) -> onnx.ModelProto:
    """``Range(0, If(Size(x) == 2: limit, else: 1), 1)`` beside a Gather out of ``x``'s range: onnxruntime
    loads it but runs it on no input (the check cannot run). The If hides ``limit``'s shape from
    onnxruntime's load-time shape inference; fold inlines the branch (``Size`` of a static input)."""
    def branch(name: str, value: np.ndarray) -> onnx.GraphProto:
        return helper.make_graph([helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value))],
                                 name, [], [helper.make_tensor_value_info(name, TensorProto.INT64, None)])  # fmt: skip

    def const(name: str, value: np.ndarray) -> onnx.NodeProto:
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value))

    nodes = [
        helper.make_node("Size", ["x"], ["size"]), const("two", np.array(2, np.int64)),
        helper.make_node("Equal", ["size", "two"], ["cond"]),
        helper.make_node("If", ["cond"], ["limit"], then_branch=branch("then", limit),
                         else_branch=branch("else", np.array(1, np.int64))),
        const("zero", np.array(0, np.int64)), const("one", np.array(1, np.int64)),
        helper.make_node("Range", ["zero", "limit", "one"], ["y"]),
        const("idx", np.array([5], np.int64)), helper.make_node("Gather", ["x", "idx"], ["g"]),
    ]  # fmt: skip
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.INT64, None),
                               helper.make_tensor_value_info("g", TensorProto.FLOAT, None)])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("scalar", [True, False])
def test_not_checked_output_must_load_where_the_original_does(scalar: bool, tmp_path: pathlib.Path,
                                                              capsys) -> None:  # fmt: skip
    import onnxruntime as ort

    # Range's limit as a [1] tensor: onnxruntime runs it (the If hides it) but refuses it inlined, at load.
    model = _range_behind_if(np.array(3 if scalar else [3], np.int64))
    ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])  # the original loads
    code, data, out = _run(tmp_path, model)
    err = capsys.readouterr().err
    assert data["check"]["checked"] is False and "Gather" in data["check"]["skipped"]
    if scalar:  # the no-op case: an output that loads is written, NOT CHECKED as before
        assert code == 0 and "optimize: warning: NOT CHECKED" in err, err
        written = onnx.load(out)
        assert "If" not in {n.op_type for n in written.graph.node}  # the branch was inlined here too
        ort.InferenceSession(out, providers=["CPUExecutionProvider"])
        return
    assert code == 1 and not pathlib.Path(out).exists(), err
    assert "the optimised model: onnxruntime fails building a session" in err and "Range" in err, err
    assert "where the original loads (NOT CHECKED" in err and len(err.strip().splitlines()) == 1, err


def test_no_check_and_require_check_contradict(tmp_path: pathlib.Path, capsys) -> None:
    assert cli.main([str(DEMO), "-o", str(tmp_path / "o.onnx"), "--no-check", "--require-check"]) == 2
    assert "contradict" in capsys.readouterr().err


# --- --inputs FILE.npz -------------------------------------------------------------------------


def _npz_member(archive: zipfile.ZipFile, name: str, header_shape: tuple[int, ...], body: bytes) -> None:
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buffer, {"descr": "<f4", "fortran_order": False, "shape": header_shape})
    archive.writestr(name + ".npy", buffer.getvalue() + body)


def test_inputs_file_is_read_from_its_directory_and_headers(tmp_path: pathlib.Path) -> None:
    inputs = {"x": ("float32", [None, 4, 8])}
    good = tmp_path / "good.npz"
    np.savez(good, x=np.ones((2, 4, 8), np.float32))
    assert npz.inspect(str(good), inputs) == [npz.Member("x", "float32", (2, 4, 8), 256)]
    # A member naming no input is refused before anything is read.
    other = tmp_path / "other.npz"
    np.savez(other, nosuch=np.ones(3, np.float32))
    with pytest.raises(ValueError, match="'nosuch' is not an input"):
        npz.inspect(str(other), inputs)
    # A header that claims more data than the member holds.
    short = tmp_path / "short.npz"
    with zipfile.ZipFile(short, "w") as archive:
        _npz_member(archive, "x", (1 << 20, 4, 8), b"\0" * 64)
    with pytest.raises(ValueError, match="declares"):
        npz.inspect(str(short), inputs)
    # A small file that expands past the limit: refused from the headers, nothing decompressed.
    bomb = tmp_path / "bomb.npz"
    with zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        _npz_member(archive, "x", (1 << 16, 4, 8), b"\0" * (4 * 8 * 4 << 16))  # 8 MiB of zeros
    assert bomb.stat().st_size < 100_000
    with pytest.raises(ValueError, match="over the check's limit"):
        npz.inspect(str(bomb), inputs, limit=1 << 20)
    # Wrong dtype or static dim: refused from the header.
    wrong = tmp_path / "wrong.npz"
    np.savez(wrong, x=np.ones((2, 5, 8), np.float32))
    with pytest.raises(ValueError, match="declared"):
        npz.inspect(str(wrong), inputs)
    np.savez(wrong, x=np.ones((2, 4, 8), np.float64))
    with pytest.raises(ValueError, match="takes float32"):
        npz.inspect(str(wrong), inputs)


def test_inputs_file_sets_the_sizes_of_the_generated_ones(tmp_path: pathlib.Path) -> None:
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, ["batch", "seq"])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, ["batch", "seq"])
    graph = helper.make_graph([helper.make_node("Add", ["a", "b"], ["y"])], "g", [a, b],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    given = tmp_path / "a.npz"
    np.savez(given, a=np.ones((3, 5), np.float32))
    result = passes.check(model, model, inputs_file=given)
    assert result.checked and result.ok, result.summary()
    assert result.inputs.given == ["a"] and result.inputs.shapes == {"a": [3, 5], "b": [3, 5]}


def test_bfloat16_inputs_saved_by_numpy_as_raw_bytes_are_read_as_bfloat16(tmp_path: pathlib.Path, capsys) -> None:
    import ml_dtypes

    x = helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [2, 3])
    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["f"], to=TensorProto.FLOAT), helper.make_node("Relu", ["f"], ["y"])],
        "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    values = np.array([[-1.5, 2.25, 3.0], [0.5, -0.0, 7.0]], dtype=ml_dtypes.bfloat16)
    given = tmp_path / "in.npz"
    np.savez(given, x=values)
    members = npz.inspect(str(given), {"x": ("bfloat16", [2, 3])})
    assert members == [npz.Member("x", "bfloat16", (2, 3), 12, raw=True)]
    loaded = npz.load(str(given), ["x"], {"x": "bfloat16"})["x"]
    assert loaded.dtype == values.dtype and loaded.tobytes() == values.tobytes()
    code, data, _ = _run(tmp_path, model, "--inputs", str(given))
    assert code == 0, capsys.readouterr().err
    assert data["check"]["checked"] is True and data["check"]["ok"] is True, data["check"]
    assert data["check"]["inputs"]["shapes"] == {"x": [2, 3]}
    # Generated bfloat16 inputs reach onnxruntime too (it reads ml_dtypes arrays as strings).
    code, data, _ = _run(tmp_path, model)
    assert code == 0 and data["check"]["checked"] is True and data["check"]["ok"] is True, data["check"]
    # Raw bytes are taken as the input's type only for a type numpy lacks: not for float16.
    with pytest.raises(ValueError, match="takes float16"):
        npz.inspect(str(given), {"x": ("float16", [2, 3])})


def _half_output_model(scale: float, to: int = TensorProto.BFLOAT16) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "k"], ["m"]), helper.make_node("Cast", ["m"], ["y"], to=to)],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64])],
        [helper.make_tensor_value_info("y", to, [64])],
        initializer=[numpy_helper.from_array(np.array(scale, np.float32), "k")])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)


@pytest.mark.parametrize(("to", "dtype"), [(TensorProto.BFLOAT16, "bfloat16"),
                                           (TensorProto.FLOAT8E4M3FN, "float8_e4m3fn"),
                                           (TensorProto.FLOAT8E5M2, "float8_e5m2")])  # fmt: skip
def test_bfloat16_and_float8_outputs_are_fetched_and_compared(to: int, dtype: str) -> None:
    """onnxruntime returns no numpy array of these types; the check reads the tensor's bytes
    (float8: before, "the original model does not run ... No corresponding Numpy type" and NOT CHECKED)."""
    same = passes.check(_half_output_model(2.0, to), _half_output_model(2.0, to))
    assert same.ok and not same.skipped, same
    assert same.outputs[0].dtype == dtype and same.outputs[0].max_abs_error == 0
    # 2x is far beyond each type's tolerance (rtol at most 0.25): the check must see it.
    far = passes.check(_half_output_model(2.0, to), _half_output_model(4.0, to))
    assert not far.ok and not far.skipped and far.outputs[0].max_abs_error > 0.1, far


def _float8_input_model(to_scale: float, elem: int) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["f"], to=TensorProto.FLOAT), helper.make_node("Mul", ["f", "k"], ["y"])],
        "g", [helper.make_tensor_value_info("x", elem, ["n", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 8])],
        initializer=[numpy_helper.from_array(np.array(to_scale, np.float32), "k")])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)


@pytest.mark.parametrize("elem", [TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E5M2FNUZ])
def test_float8_inputs_are_generated_and_fed(elem: int) -> None:
    """Before: NOT CHECKED, "cannot generate input 'x' of type tensor(float8e4m3fn)"."""
    same = passes.check(_float8_input_model(1.0, elem), _float8_input_model(1.0, elem))
    assert same.checked and same.ok, same.summary()
    sets = {r["name"]: r for r in same.inputs.sets}
    assert sets["edge"]["ran"] and sets["edge"]["ok"], sets  # edge values of the float8 type too
    far = passes.check(_float8_input_model(1.0, elem), _float8_input_model(2.0, elem))
    assert far.checked and not far.ok and far.outputs[0].max_abs_error > 0, far.summary()


def _cache_model(mask_dim: str) -> onnx.ModelProto:
    """y = Concat(past, x) + mask: runs only when the mask's length is past + seq (a KV cache and its mask)."""
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq"]),
              helper.make_tensor_value_info("past", TensorProto.FLOAT, ["batch", "past_len"]),
              helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["batch", mask_dim])]  # fmt: skip
    graph = helper.make_graph(
        [helper.make_node("Concat", ["past", "x"], ["all"], axis=1), helper.make_node("Add", ["all", "mask"], ["y"])],
        "cache", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", None])])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)


def test_a_cache_is_empty_in_the_first_tries_so_its_mask_fits(tmp_path: pathlib.Path, capsys) -> None:
    code, data, _ = _run(tmp_path, _cache_model("total"))
    assert code == 0, capsys.readouterr().err
    assert data["check"]["checked"] is True and data["check"]["ok"] is True, data["check"]
    dims = data["check"]["inputs"]["dims"]
    assert dims["past_len"] == 0 and dims["total"] == dims["seq"], dims


def test_a_dim_named_by_an_expression_is_computed_from_the_others() -> None:
    specs = plan.input_specs(_cache_model("past_len + seq"))
    tries, _ = plan.size_tries(specs, dims={"past_len": 3})
    assert tries and all(t["dims"]["past_len + seq"] == 3 + t["dims"]["seq"] for t in tries), tries
    assert tries[0]["inputs"]["mask"]["shape"] == [1, 3 + tries[0]["dims"]["seq"]]
    # Not an expression of known names: a size of its own role.
    other = plan.size_tries(plan.input_specs(_cache_model("len + unknown")))[0]
    assert other[0]["dims"]["len + unknown"] == plan.LADDERS["sequence"][0]
    assert plan._expression("__import__('os')", {"os"}) is None and plan._expression("a ** b", {"a", "b"}) is None
    # A hostile name is not parsed deeply: too long, or nested past the parser's limits.
    assert plan._expression("+".join(["a"] * 150), {"a"}) is None
    assert plan._evaluate(plan._expression("(" * 90 + "a" + ")" * 90, {"a"}), {"a": 5}) == 5
    assert plan._expression("-".join(["a", "1"]), {"a"}) is not None


def test_not_checked_quotes_the_first_sizes_error_and_the_last(tmp_path: pathlib.Path, capsys) -> None:
    model = _cache_model("total")
    model.graph.input[1].type.tensor_type.shape.dim[1].dim_param = "kv"  # not named as a cache: never empty
    code, data, _ = _run(tmp_path, model)
    assert code == 0 and data["check"]["checked"] is False
    reason = data["check"]["skipped"]
    tries = reason.count("(batch=")
    assert tries >= 2 and "at the last sizes:" in reason, reason
    first, last = reason.split("at the last sizes:")
    seq, kv = plan.LADDERS["sequence"], plan.LADDERS["other"]  # the mask (total = seq) against kv + seq
    assert f"{seq[0]} by {seq[0] + kv[0]}" in first and f"{seq[-1]} by {seq[-1] + kv[-1]}" in last, reason
