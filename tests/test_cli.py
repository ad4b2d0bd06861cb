"""The ``optimize`` command end to end: success, reports, every error path, atomic output."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

import helpers
import passes
from passes import cli, modelio, pipeline

REPO = pathlib.Path(__file__).resolve().parent.parent
DEMO = REPO / "models" / "demo.onnx"


def run_cli(*args: str, cwd: pathlib.Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "passes", *args],
        capture_output=True, text=True, cwd=cwd, timeout=300,
    )


def assert_one_line_error(proc: subprocess.CompletedProcess[str], code: int = 2) -> str:
    assert proc.returncode == code, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("optimize: error:")]
    assert len(errors) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    return errors[0]


def weighted_model(n_weights: int = 3, size: int = 4096, opset: int = 13) -> onnx.ModelProto:
    """x @ each weight, reduced with ReduceL2 over an axes attribute (opset 13)."""
    rng = np.random.default_rng(0)
    inits, nodes, prev = [], [], "x"
    for i in range(n_weights):
        w = rng.standard_normal((32, 32)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"h{i}"], name=f"mm{i}"))
        prev = f"h{i}"
    big = rng.standard_normal(size).astype(np.float32)
    inits.append(numpy_helper.from_array(big, "big"))
    nodes.append(helper.make_node("ReduceL2", [prev], ["y"], name="l2", axes=[-1], keepdims=1))
    nodes.append(helper.make_node("ReduceSum", ["big"], ["big_sum"], name="big_sum", keepdims=0))
    nodes.append(helper.make_node("Add", ["y", "big_sum"], ["z"], name="add"))
    graph = helper.make_graph(
        nodes, "weighted",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 32])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["n", 1])],
        initializer=inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


@pytest.fixture()
def demo(tmp_path: pathlib.Path) -> pathlib.Path:
    target = tmp_path / "demo.onnx"
    target.write_bytes(DEMO.read_bytes())
    return target


def test_demo_model_exists_and_is_valid() -> None:
    onnx.checker.check_model(onnx.load(str(DEMO)), full_check=True)


def test_help_lists_the_passes_that_exist() -> None:
    proc = run_cli("--help")
    assert proc.returncode == 0
    for name in pipeline.PASSES:
        assert name in proc.stdout
    assert "--target-opset" in proc.stdout and "exit codes" in proc.stdout


def test_end_to_end_on_demo(demo: pathlib.Path, tmp_path: pathlib.Path) -> None:
    before = demo.read_bytes()
    out = tmp_path / "demo.opt.onnx"
    report = tmp_path / "report.json"
    proc = run_cli(str(demo), "-o", str(out), "--report", str(report))
    assert proc.returncode == 0, proc.stderr
    assert demo.read_bytes() == before
    assert "check passed" in proc.stdout
    onnx.checker.check_model(onnx.load(str(out)), full_check=True)
    data = json.loads(report.read_text())
    assert data["written"] is True
    assert data["check"]["ok"] is True
    assert [o["name"] for o in data["check"]["outputs"]] == ["lse_flat", "log_sum"]
    assert data["before"]["nodes"] == 16
    assert [p["name"] for p in data["passes"][-2:]] == ["cleanup", "types"]
    # The optimised model computes the same thing on fresh inputs too.
    x = np.random.default_rng(3).standard_normal((5, 4, 8)).astype(np.float32)
    expected = helpers.ort_run(str(demo), {"x": x})
    actual = helpers.ort_run(str(out), {"x": x})
    for e, a in zip(expected, actual):
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6)
    # No temporary files are left behind.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo.onnx", "demo.opt.onnx", "report.json"]


def test_console_script_and_module_agree(demo: pathlib.Path, tmp_path: pathlib.Path) -> None:
    script = pathlib.Path(sys.executable).with_name("optimize")
    if not script.exists():
        pytest.skip("console script not installed in this environment")
    a, b = tmp_path / "a.onnx", tmp_path / "b.onnx"
    p1 = subprocess.run([str(script), str(demo), "-o", str(a), "-q"], capture_output=True, text=True)
    p2 = run_cli(str(demo), "-o", str(b), "-q")
    assert p1.returncode == p2.returncode == 0, p1.stderr + p2.stderr
    assert p1.stdout == p2.stdout == ""
    assert a.read_bytes() == b.read_bytes()  # deterministic output


def test_external_data_stays_external(tmp_path: pathlib.Path) -> None:
    src_dir = tmp_path / "src"
    src_dir.mkdir()
    src = src_dir / "model.onnx"
    onnx.save_model(weighted_model(), str(src), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="model.weights", size_threshold=512)
    assert (src_dir / "model.weights").exists()
    snapshot = {p.name: p.read_bytes() for p in src_dir.iterdir()}
    out = tmp_path / "out" / "opt.onnx"
    out.parent.mkdir()
    proc = run_cli(str(src), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert {p.name: p.read_bytes() for p in src_dir.iterdir()} == snapshot
    assert sorted(p.name for p in out.parent.iterdir()) == ["opt.onnx", "opt.onnx.data"]
    proto = onnx.load(str(out), load_external_data=False)
    external = [t.name for t in proto.graph.initializer if t.data_location == TensorProto.EXTERNAL]
    # The weights stay external; 'big' only fed a constant ReduceSum that was folded away.
    assert {"w0", "w1", "w2"} <= set(external)
    onnx.checker.check_model(str(out), full_check=True)
    x = np.random.default_rng(1).standard_normal((3, 32)).astype(np.float32)
    np.testing.assert_allclose(helpers.ort_run(str(out), {"x": x})[0],
                               helpers.ort_run(str(src), {"x": x})[0], rtol=1e-5)


def test_output_may_overwrite_input_safely(demo: pathlib.Path) -> None:
    x = np.random.default_rng(2).standard_normal((2, 4, 8)).astype(np.float32)
    expected = helpers.ort_run(str(demo), {"x": x})
    proc = run_cli(str(demo), "-o", str(demo))
    assert proc.returncode == 0, proc.stderr
    for e, a in zip(expected, helpers.ort_run(str(demo), {"x": x})):
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6)
    assert [p.name for p in demo.parent.iterdir()] == ["demo.onnx"]


def test_round_trip_keeps_names_metadata_and_custom_opsets(tmp_path: pathlib.Path) -> None:
    node = helper.make_node("Relu", ["x"], ["r"], name="my_relu", doc_string="relu doc")
    ident = helper.make_node("Identity", ["r"], ["y"], name="my_identity")
    graph = helper.make_graph(
        [node, ident], "named",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        value_info=[helper.make_tensor_value_info("r", TensorProto.FLOAT, [2, 3])],
        doc_string="graph doc",
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.example", 1)],
        ir_version=8, doc_string="model doc",
    )
    helper.set_model_props(model, {"author": "tests", "purpose": "round trip"})
    src = tmp_path / "named.onnx"
    onnx.save_model(model, str(src))
    out = tmp_path / "named.opt.onnx"
    proc = run_cli(str(src), "-o", str(out), "--passes", "", "-q")
    assert proc.returncode == 0, proc.stderr
    result = onnx.load(str(out))
    assert [n.name for n in result.graph.node] == ["my_relu", "my_identity"]
    assert result.graph.node[0].doc_string == "relu doc"
    assert [v.name for v in result.graph.value_info] == ["r"]
    assert result.graph.doc_string == "graph doc" and result.doc_string == "model doc"
    assert {p.key: p.value for p in result.metadata_props} == {"author": "tests", "purpose": "round trip"}
    assert [i.name for i in result.graph.input] == ["x"] and [o.name for o in result.graph.output] == ["y"]


# --- error paths: exit 2, one line, no output, input unchanged ------------------------------


def _expect_refusal(src: pathlib.Path, out: pathlib.Path, *extra: str, needle: str) -> None:
    before = src.read_bytes() if src.is_file() else None
    proc = run_cli(str(src), "-o", str(out), *extra)
    line = assert_one_line_error(proc)
    assert needle.lower() in line.lower(), line
    assert not out.exists()
    if before is not None:
        assert src.read_bytes() == before
    leftovers = [p.name for p in out.parent.iterdir() if p.name.startswith(".")] if out.parent.exists() else []
    assert leftovers == []


def test_missing_file(tmp_path: pathlib.Path) -> None:
    _expect_refusal(tmp_path / "nope.onnx", tmp_path / "out.onnx", needle="no such file")


def test_text_file(tmp_path: pathlib.Path) -> None:
    src = tmp_path / "notes.onnx"
    src.write_text("this is not a model\n" * 20)
    _expect_refusal(src, tmp_path / "out.onnx", needle="not")


def test_empty_file(tmp_path: pathlib.Path) -> None:
    src = tmp_path / "empty.onnx"
    src.write_bytes(b"")
    _expect_refusal(src, tmp_path / "out.onnx", needle="empty")


@pytest.mark.parametrize("fraction", [0.3, 0.6, 0.9])
def test_truncated_model(tmp_path: pathlib.Path, fraction: float) -> None:
    data = DEMO.read_bytes()
    src = tmp_path / "cut.onnx"
    src.write_bytes(data[: int(len(data) * fraction)])
    _expect_refusal(src, tmp_path / "out.onnx", needle="cut.onnx")


def test_missing_external_data(tmp_path: pathlib.Path) -> None:
    src = tmp_path / "model.onnx"
    onnx.save_model(weighted_model(), str(src), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="model.weights", size_threshold=512)
    (tmp_path / "model.weights").unlink()
    _expect_refusal(src, tmp_path / "out.onnx", needle="not found")


def test_truncated_external_data(tmp_path: pathlib.Path) -> None:
    src = tmp_path / "model.onnx"
    onnx.save_model(weighted_model(), str(src), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="model.weights", size_threshold=512)
    weights = tmp_path / "model.weights"
    weights.write_bytes(weights.read_bytes()[:100])
    _expect_refusal(src, tmp_path / "out.onnx", needle="truncated")


@pytest.mark.parametrize("location", ["../secret.bin", "/etc/passwd", "sub/../../secret.bin"])
def test_external_data_outside_the_folder_is_refused(tmp_path: pathlib.Path, location: str) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    (tmp_path / "secret.bin").write_bytes(b"\0" * 4096 * 4)
    model = weighted_model(n_weights=1, size=64)
    tensor = next(t for t in model.graph.initializer if t.name == "big")
    tensor.ClearField("float_data")
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    del tensor.external_data[:]
    tensor.external_data.add(key="location", value=location)
    src = folder / "model.onnx"
    src.write_bytes(model.SerializeToString())
    _expect_refusal(src, folder / "out.onnx", needle="outside")


def test_output_folder_missing(demo: pathlib.Path, tmp_path: pathlib.Path) -> None:
    _expect_refusal(demo, tmp_path / "no" / "such" / "out.onnx", needle="does not exist")


@pytest.mark.parametrize("extra", [
    ("--skip", "simplify", "--freeze-initializer-inputs"),
    ("--skip", "simplify", "--no-fuse"),
    ("--passes", "fold,simplify", "--target-opset", "19"),
    ("--passes", "upgrade", "--fold-size-limit", "2M"),
])
def test_an_option_of_a_pass_that_does_not_run_is_refused(demo: pathlib.Path, tmp_path: pathlib.Path, extra) -> None:
    """It would do nothing; the user asked for something, so say so (exit 2, nothing written)."""
    _expect_refusal(demo, tmp_path / "out.onnx", *extra, needle="which does not run")


def test_an_option_at_its_default_or_of_a_running_pass_is_fine(demo: pathlib.Path, tmp_path: pathlib.Path) -> None:
    assert cli.main([str(demo), "-o", str(tmp_path / "a.onnx"), "--skip", "fold", "--fold-size-limit", "1M", "-q"]) == 0
    assert cli.main([str(demo), "-o", str(tmp_path / "b.onnx"), "--passes", "simplify", "--no-fuse", "-q"]) == 0


def test_unknown_pass(demo: pathlib.Path, tmp_path: pathlib.Path) -> None:
    _expect_refusal(demo, tmp_path / "out.onnx", "--passes", "nosuchpass", needle="unknown pass")
    _expect_refusal(demo, tmp_path / "out.onnx", "--skip", "alsonot", needle="unknown pass")


def test_lower_target_opset(demo: pathlib.Path, tmp_path: pathlib.Path) -> None:
    at_19 = tmp_path / "m19.onnx"
    assert cli.main([str(demo), "-o", str(at_19), "--passes", "upgrade", "--target-opset", "19", "-q"]) == 0
    _expect_refusal(at_19, tmp_path / "out.onnx", "--target-opset", "18", needle="lower than the model's opset 19")
    _expect_refusal(demo, tmp_path / "out.onnx", "--target-opset", "11", needle="lower than the model's opset 13")
    _expect_refusal(demo, tmp_path / "out.onnx", "--target-opset", "6", needle="not supported: choose 7 to")


REAL = pathlib.Path(__file__).resolve().parents[1] / "models" / "real"


@pytest.mark.parametrize(("name", "target"), [
    ("small_cnn_opset11_nofold", 13), ("tiny_bert_opset11", 13), ("tiny_bert_opset11", 15),
    ("sk_logreg_zipmap_opset13", 15), ("sk_scaler_pca_logreg_opset11", 17), ("tiny_rnn_opset12", 17),
])  # fmt: skip
def test_targets_below_18_on_real_models(name: str, target: int, tmp_path: pathlib.Path) -> None:
    """The whole command at a deployment runtime's opset: valid there, proved by the check, or refused
    in one line naming the opset that can express it (never a model at another opset)."""
    out = tmp_path / "out.onnx"
    proc = run_cli(str(REAL / f"{name}.onnx"), "-o", str(out), "--target-opset", str(target), "-q")
    if proc.returncode == 2:
        assert name == "tiny_bert_opset11" and target < 14 and not out.exists()
        assert "needs Reshape's allowzero (opset 14)" in proc.stderr and proc.stderr.count("\n") == 1
        return
    assert proc.returncode == 0, proc.stderr
    model = onnx.load(str(out))
    onnx.checker.check_model(model, full_check=True)
    assert {o.domain or "ai.onnx": o.version for o in model.opset_import}["ai.onnx"] == target


def test_bad_usage(demo: pathlib.Path, tmp_path: pathlib.Path) -> None:
    proc = run_cli(str(demo))  # no -o
    assert proc.returncode == 2 and "optimize: error:" in proc.stderr and "Traceback" not in proc.stderr
    _expect_refusal(demo, tmp_path / "out.onnx", "--dim", "batch", needle="--dim")


def test_opset_newer_than_onnx_knows(tmp_path: pathlib.Path) -> None:
    model = onnx.load(str(DEMO))
    model.opset_import[0].version = onnx.defs.onnx_opset_version() + 5
    src = tmp_path / "future.onnx"
    src.write_bytes(model.SerializeToString())
    _expect_refusal(src, tmp_path / "out.onnx", needle="opset")


def test_invalid_graph_is_refused(tmp_path: pathlib.Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["undefined_name"], ["y"])], "broken",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    src = tmp_path / "broken.onnx"
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(src))
    _expect_refusal(src, tmp_path / "out.onnx", needle="invalid model")


# --- the check catches a real difference ------------------------------------------------------


class _NudgeInitializerPass(ir.passes.InPlacePass):
    """Test-only: scales the largest entry of an initializer by (1 + rel) (a deliberately wrong pass)."""

    def __init__(self, rel: float) -> None:
        super().__init__()
        self.rel = rel

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        value = model.graph.initializers["scale_base"]
        array = value.const_value.numpy().copy()
        i = int(np.argmax(np.abs(array)))
        array[i] = array[i] * np.float32(1 + self.rel)
        value.const_value = ir.tensor(array, name="scale_base")
        return ir.passes.PassResult(model, modified=True)


class _DropOutputPass(ir.passes.InPlacePass):
    def call(self, model: ir.Model) -> ir.passes.PassResult:
        model.graph.outputs.pop()
        return ir.passes.PassResult(model, modified=True)


def _with_pass(monkeypatch: pytest.MonkeyPatch, name: str, build) -> None:
    monkeypatch.setitem(pipeline.PASSES, name, pipeline.PassSpec(name, "test only", build))


def test_check_fails_on_a_wrong_constant(
    demo: pathlib.Path, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    _with_pass(monkeypatch, "nudge", lambda o: _NudgeInitializerPass(0.05))
    out = tmp_path / "out.onnx"
    before = demo.read_bytes()
    code = cli.main([str(demo), "-o", str(out), "--passes", "nudge"])
    err = capsys.readouterr().err
    assert code == 1
    assert "lse_flat" in err and "optimize: error: check failed" in err
    assert not out.exists() and demo.read_bytes() == before
    # --force writes it anyway, still exiting 1.
    code = cli.main([str(demo), "-o", str(out), "--passes", "nudge", "--force", "-q"])
    assert code == 1 and out.exists()


def test_check_tolerates_a_difference_within_tolerance(
    demo: pathlib.Path, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A relative change of 1e-6 (a few float32 ulp) is far below the default
    # float32 tolerance, but not zero.
    _with_pass(monkeypatch, "nudge", lambda o: _NudgeInitializerPass(1e-6))
    out = tmp_path / "out.onnx"
    assert cli.main([str(demo), "-o", str(out), "--passes", "nudge", "-q"]) == 0
    # ... but not below a tolerance of zero.
    assert cli.main([str(demo), "-o", str(out), "--passes", "nudge", "-q", "--rtol", "0", "--atol", "0"]) == 1


def test_check_fails_on_a_dropped_output(
    demo: pathlib.Path, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    _with_pass(monkeypatch, "drop", lambda o: _DropOutputPass())
    out = tmp_path / "out.onnx"
    assert cli.main([str(demo), "-o", str(out), "--passes", "drop"]) == 1
    captured = capsys.readouterr()
    # Said once: why on the output's line of the summary, the output's name in the error.
    assert "log_sum" in captured.err and "missing" in captured.out and "missing" not in captured.err
    assert not out.exists()
    # With -q there is no summary: the error says it all.
    assert cli.main([str(demo), "-o", str(out), "--passes", "drop", "-q"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and "log_sum" in captured.err and "missing" in captured.err


def test_inputs_file_is_used(demo: pathlib.Path, tmp_path: pathlib.Path) -> None:
    npz = tmp_path / "in.npz"
    np.savez(npz, x=np.ones((7, 4, 8), np.float32))
    report = tmp_path / "r.json"
    proc = run_cli(str(demo), "-o", str(tmp_path / "o.onnx"), "--inputs", str(npz), "--report", str(report), "-q")
    assert proc.returncode == 0, proc.stderr
    shapes = {o["name"]: o["shape"] for o in json.loads(report.read_text())["check"]["outputs"]}
    assert shapes == {"lse_flat": [7, 8], "log_sum": [7, 4]}
    proc = run_cli(str(demo), "-o", str(tmp_path / "o.onnx"), "--dim", "batch=3", "--report", str(report), "-q")
    shapes = {o["name"]: o["shape"] for o in json.loads(report.read_text())["check"]["outputs"]}
    assert shapes == {"lse_flat": [3, 8], "log_sum": [3, 4]}


# --- atomic write ------------------------------------------------------------------------------


def test_failure_while_saving_leaves_nothing(
    demo: pathlib.Path, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    real_save = modelio.save_model

    def failing_save(model, path, **kwargs):
        real_save(model, path, **kwargs)
        pathlib.Path(path).write_bytes(pathlib.Path(path).read_bytes()[:50])  # a partial file...
        raise OSError(28, "No space left on device")  # ...and then the disk fills up

    monkeypatch.setattr(modelio.save, "save_model", failing_save)
    out = tmp_path / "out.onnx"
    before = demo.read_bytes()
    code = cli.main([str(demo), "-o", str(out)])
    assert code == 2
    assert "optimize: error:" in capsys.readouterr().err
    assert not out.exists()
    assert demo.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo.onnx"]


def test_existing_output_survives_a_failed_run(demo: pathlib.Path, tmp_path: pathlib.Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out.onnx"
    out.write_bytes(b"previous result")
    _with_pass(monkeypatch, "drop", lambda o: _DropOutputPass())
    assert cli.main([str(demo), "-o", str(out), "--passes", "drop", "-q"]) == 1
    assert out.read_bytes() == b"previous result"


def test_sigterm_leaves_no_partial_output(demo: pathlib.Path, tmp_path: pathlib.Path) -> None:
    # A model big enough that saving takes a moment; terminate at once.
    big = tmp_path / "big.onnx"
    onnx.save_model(weighted_model(size=8_000_000), str(big))
    before = big.read_bytes()
    out = tmp_path / "out.onnx"
    proc = subprocess.Popen([sys.executable, "-m", "passes", str(big), "-o", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    import time
    time.sleep(1.0)
    proc.terminate()
    _, err = proc.communicate(timeout=120)
    assert "Traceback" not in err
    if out.exists():  # the signal came after the atomic rename: the output must be complete
        onnx.checker.check_model(str(out))
    else:
        assert proc.returncode == 143 and "no output written" in err
    assert big.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_inputs_that_do_not_fit_the_model_are_refused(demo: pathlib.Path, tmp_path: pathlib.Path) -> None:
    for name, array in [("x", np.ones((2, 5, 8), np.float32)),    # wrong shape
                        ("x", np.ones((2, 4, 8), np.float64)),    # wrong dtype
                        ("nosuch", np.ones((2, 4, 8), np.float32))]:  # not an input
        npz = tmp_path / "in.npz"
        np.savez(npz, **{name: array})
        _expect_refusal(demo, tmp_path / "out.onnx", "--inputs", str(npz), needle="--inputs")


def test_huge_generated_inputs_skip_the_check(demo: pathlib.Path, tmp_path: pathlib.Path) -> None:
    out = tmp_path / "out.onnx"
    proc = run_cli(str(demo), "-o", str(out), "--dim", f"batch={10**9}", "-q")
    assert proc.returncode == 0, proc.stderr
    assert "optimize: warning: NOT CHECKED" in proc.stderr and "--inputs" in proc.stderr  # even with -q
    assert out.exists()


def test_a_small_sparse_constant_is_made_dense_and_folds(tmp_path: pathlib.Path) -> None:
    """A sparse Constant of 4 values becomes a dense Constant at load (see passes/modelio/sparse.py), which
    folds: ``Mul(c, c)`` is one constant. (A huge one stays sparse: test_hostile.py.)"""
    values = numpy_helper.from_array(np.array([1.5, -0.0, -2.5], np.float32), "sp")
    indices = numpy_helper.from_array(np.array([0, 1, 3], np.int64), "sp_indices")
    sparse = helper.make_sparse_tensor(values, indices, [4])
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["c"], sparse_value=sparse),
         helper.make_node("Mul", ["c", "c"], ["s"]),
         helper.make_node("Div", ["x", "s"], ["y"])],
        "sparse",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    src = tmp_path / "sparse.onnx"
    onnx.save_model(model, str(src))
    out = tmp_path / "out.onnx"
    proc = run_cli(str(src), "-o", str(out), "-q")
    assert proc.returncode == 0, proc.stderr
    result = onnx.load(str(out))
    assert [n.op_type for n in result.graph.node] == ["Div"], result.graph
    assert not any(a.name == "sparse_value" for n in result.graph.node for a in n.attribute)
    for x in (np.array([1, -2, 3, 4], np.float32), np.array([-0.0, 0.0, np.inf, np.nan], np.float32)):
        expected, actual = helpers.ort_run(model, {"x": x})[0], helpers.ort_run(result, {"x": x})[0]
        assert expected.tobytes() == actual.tobytes()


def test_sparse_constants_are_kept_sparse(tmp_path: pathlib.Path, monkeypatch) -> None:
    """A sparse Constant over the dense limit is written back as it was (see passes/modelio/sparse.py)."""
    import passes.modelio.sparse as sparse_module

    monkeypatch.setattr(sparse_module, "DENSE_LIMIT", 8)  # the 16 bytes of this one are over it
    values = numpy_helper.from_array(np.array([1.5, -2.5], np.float32), "sp")
    indices = numpy_helper.from_array(np.array([0, 3], np.int64), "sp_indices")
    sparse = helper.make_sparse_tensor(values, indices, [4])
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["c"], sparse_value=sparse),
         helper.make_node("Add", ["x", "c"], ["t"]),
         helper.make_node("Mul", ["t", "c"], ["y"])],
        "sparse",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
    )
    src = tmp_path / "sparse.onnx"
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(src))
    out = tmp_path / "out.onnx"
    assert cli.main([str(src), "-o", str(out), "-q"]) == 0
    result = onnx.load(str(out))
    kept = [a.sparse_tensor for n in result.graph.node for a in n.attribute if a.name == "sparse_value"]
    assert [k.SerializeToString() for k in kept] == [sparse.SerializeToString()]
    assert [o.domain for o in result.opset_import] == [""]
    x = np.array([1, 2, 3, 4], np.float32)
    np.testing.assert_array_equal(helpers.ort_run(result, {"x": x})[0], (x + [1.5, 0, 0, -2.5]) * [1.5, 0, 0, -2.5])


def _zipmap_model(scale: float = 2.0) -> onnx.ModelProto:
    """scikit-learn classifier style: probabilities through ZipMap, a seq(map(int64, float)) output."""
    out_type = helper.make_sequence_type_proto(
        helper.make_map_type_proto(TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, None)))
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "scale"], ["logits"]),
         helper.make_node("ReduceMax", ["logits"], ["peak"], axes=[1], keepdims=1),
         helper.make_node("Sub", ["logits", "peak"], ["shifted"]),
         helper.make_node("Softmax", ["shifted"], ["proba"], axis=1),
         helper.make_node("ZipMap", ["proba"], ["zipped"], domain="ai.onnx.ml", classlabels_int64s=[3, 7])],
        "classifier",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2])],
        [helper.make_tensor_value_info("proba", TensorProto.FLOAT, ["n", 2]),
         helper.make_value_info("zipped", out_type)],
        initializer=[numpy_helper.from_array(np.array(scale, np.float32), "scale")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("ai.onnx.ml", 1)],
                             ir_version=8)


def test_map_typed_outputs_survive(tmp_path: pathlib.Path) -> None:
    src = tmp_path / "zipmap.onnx"
    onnx.save_model(_zipmap_model(), str(src))
    out = tmp_path / "out.onnx"
    report = tmp_path / "r.json"
    proc = run_cli(str(src), "-o", str(out), "--report", str(report), "-q")
    assert proc.returncode == 0, proc.stderr
    result = onnx.load(str(out))
    onnx.checker.check_model(result, full_check=True)
    assert {o.version for o in result.opset_import if o.domain == ""} == {18}
    assert result.graph.output[1].type == _zipmap_model().graph.output[1].type
    checked = {o["name"]: o for o in json.loads(report.read_text())["check"]["outputs"]}
    assert checked["zipped"]["ok"] and checked["proba"]["ok"]
    x = np.random.default_rng(0).standard_normal((3, 2)).astype(np.float32)
    assert helpers.ort_run(str(out), {"x": x})[1] == helpers.ort_run(str(src), {"x": x})[1]
    # The Python API on a ModelProto keeps the map type too, and leaves its argument alone.
    proto = _zipmap_model()
    again = passes.optimize(proto)
    assert again.graph.output[1].type == proto.graph.output[1].type
    assert proto == _zipmap_model()


def test_check_compares_map_outputs_with_tolerance() -> None:
    x = {"x": np.random.default_rng(1).standard_normal((4, 2)).astype(np.float32)}
    same = passes.check(_zipmap_model(2.0), _zipmap_model(2.0), inputs=x)
    assert same.ok and not same.skipped
    close = passes.check(_zipmap_model(2.0), _zipmap_model(2.0 * (1 + 1e-7)), inputs=x)
    assert close.ok
    far = passes.check(_zipmap_model(2.0), _zipmap_model(2.5), inputs=x)
    assert not far.ok and {o.name for o in far.failures} == {"proba", "zipped"}


def test_a_model_above_the_default_target_keeps_its_opset(tmp_path: pathlib.Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["x", "axes"], ["y"], keepdims=0)], "newer",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        initializer=[numpy_helper.from_array(np.array([1], np.int64), "axes")],
    )
    src = tmp_path / "newer.onnx"
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)]), str(src))
    out = tmp_path / "out.onnx"
    proc = run_cli(str(src), "-o", str(out), "-q")  # the default target (18) is below the model's 22
    assert proc.returncode == 0, proc.stderr
    assert {o.version for o in onnx.load(str(out)).opset_import if o.domain == ""} == {22}
    # ... but asking for a lower opset explicitly is an error.
    _expect_refusal(src, tmp_path / "out2.onnx", "--target-opset", "18", needle="lower")


def test_model_onnx_cannot_infer_strictly_inside_a_function_body_is_accepted(tmp_path: pathlib.Path) -> None:
    # onnx 1.23's MeanVarianceNormalization body fails strict inference (its Constant); the
    # model is valid and runs. Built like onnx's backend case test_mvn.
    graph = helper.make_graph(
        [helper.make_node("MeanVarianceNormalization", ["x"], ["y"])], "mvn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 3, 3, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 3, 3, 1])],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(onnx.shape_inference.InferenceError):
        onnx.checker.check_model(proto, full_check=True)
    src = tmp_path / "mvn.onnx"
    onnx.save_model(proto, str(src))
    proc = run_cli(str(src), "-o", str(tmp_path / "out.onnx"))
    assert proc.returncode == 0, proc.stderr
    assert "check passed" in proc.stdout


# --- a newcomer's habits (issue #26) --------------------------------------------------------------


def test_positional_output_as_onnxsim_and_onnxslim_take_it(demo: pathlib.Path, tmp_path: pathlib.Path) -> None:
    out = tmp_path / "pos.onnx"
    assert cli.main([str(demo), str(out), "-q"]) == 0 and out.exists()
    # The same path both ways is fine.
    same = tmp_path / "same.onnx"
    assert cli.main([str(demo), str(same), "-o", str(same), "-q"]) == 0 and same.exists()


def test_two_different_outputs_or_none_are_one_line_usage_errors(demo: pathlib.Path, tmp_path: pathlib.Path) -> None:
    a, b = tmp_path / "a.onnx", tmp_path / "b.onnx"
    line = assert_one_line_error(run_cli(str(demo), str(a), "-o", str(b)))
    assert "two outputs" in line and line.endswith("see optimize --help")
    assert not a.exists() and not b.exists()
    line = assert_one_line_error(run_cli(str(demo)))
    assert "no output" in line and line.endswith("see optimize --help")


def test_usage_errors_are_one_line_without_the_usage_block(demo: pathlib.Path, tmp_path: pathlib.Path) -> None:
    proc = run_cli(str(demo), str(tmp_path / "o.onnx"), "--target_opset", "19")
    line = assert_one_line_error(proc)
    assert len(proc.stderr.splitlines()) == 1 and "usage:" not in proc.stderr
    assert "did you mean --target-opset?" in line and line.endswith("; see optimize --help")
    proc = run_cli(str(demo), str(tmp_path / "o.onnx"), "--seed", "x")
    assert len(proc.stderr.splitlines()) == 1 and "--seed" in assert_one_line_error(proc)


def test_version_comes_from_the_package() -> None:
    proc = run_cli("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"optimize {passes.__version__}"


def test_no_check_says_the_result_was_not_checked(demo: pathlib.Path, tmp_path: pathlib.Path, capsys) -> None:
    assert cli.main([str(demo), str(tmp_path / "o.onnx"), "--no-check"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("not checked (--no-check)")


def test_a_dim_the_model_does_not_have_is_refused(demo: pathlib.Path, tmp_path: pathlib.Path) -> None:
    out = tmp_path / "o.onnx"
    before = demo.read_bytes()
    line = assert_one_line_error(run_cli(str(demo), str(out), "--dim", "sequence=20"))
    assert "no dim named 'sequence'" in line and "its dim names: 'batch'" in line
    assert not out.exists() and demo.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["demo.onnx"]  # nothing written, not even a temporary
    # The API refuses it too.
    with pytest.raises(passes.InputError, match="no dim named 'sequence'"):
        passes.optimize(str(demo), check=passes.CheckOptions(dims={"sequence": 20}))


def test_report_to_json_is_text_and_to_dict_the_dict(demo: pathlib.Path, tmp_path: pathlib.Path) -> None:
    report = pipeline.optimize_file(demo, tmp_path / "o.onnx", check=passes.CheckOptions(enabled=False))
    text = report.to_json()
    assert isinstance(text, str) and json.loads(text) == json.loads(json.dumps(report.to_dict()))
    assert report.to_dict()["after"]["nodes"] == report.after.nodes


def test_default_summary_leaves_out_zero_counters_and_what_did_not_apply(
    demo: pathlib.Path, tmp_path: pathlib.Path, capsys
) -> None:
    assert cli.main([str(demo), str(tmp_path / "o.onnx")]) == 0
    out = capsys.readouterr().out
    assert "declined" not in out and "=0 " not in out and not any(line.endswith("=0") for line in out.splitlines())
    # The pass that grows the model says why, and how to keep the op.
    decompose = next(line for line in out.splitlines() if line.startswith("decompose"))
    assert "ReduceLogSumExp → primitive ops" in decompose and "--skip decompose keeps it" in decompose
    # -v has every counter.
    assert cli.main([str(demo), str(tmp_path / "v.onnx"), "-v"]) == 0
    captured = capsys.readouterr()
    assert "declined: " in captured.out and "if_inlined=0" in captured.out


def test_v_is_a_line_or_two_per_pass_and_vv_the_lines_per_node(demo: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """``optimize demo.onnx out -v``: this tool's log, a line or two per pass run (the demo's loop runs
    fold, simplify and decompose 3 rounds); the rules that did not apply, one line per node, with -vv."""
    one = run_cli(str(demo), str(tmp_path / "a.onnx"), "-v", "--no-check")
    two = run_cli(str(demo), str(tmp_path / "b.onnx"), "-vv", "--no-check")
    assert one.returncode == 0 and two.returncode == 0
    runs = one.stderr.count("INFO: passes.pipeline: pass ")
    assert runs >= 6 and len(one.stderr.splitlines()) <= 2 * runs, one.stderr
    assert "DEBUG:" not in one.stderr and "does not apply" not in one.stderr
    assert "DEBUG: passes.simplify:" in two.stderr and "does not apply" in two.stderr
    assert "DEBUG: onnx_ir" in two.stderr


def test_a_check_failure_is_said_once_with_the_fusion_hint(tmp_path: pathlib.Path, capsys) -> None:
    """Conv+BatchNormalization at a zero tolerance: the fusion's rounding is blamed, --no-fuse is the way out."""
    src = REPO / "models" / "real" / "small_cnn_opset11_nofold.onnx"
    out = tmp_path / "o.onnx"
    assert cli.main([str(src), str(out), "--rtol", "0", "--atol", "0", "--no-unfused-fallback"]) == 1
    captured = capsys.readouterr()
    both = captured.out + captured.err
    assert both.count("differ beyond") == 2  # once per differing output, on its line
    assert both.count("first difference:") == 1 and both.count("introduced by pass 'simplify'") == 1
    assert "first difference:" in captured.err
    assert "hint: simplify's fusions (fused=4) change float rounding; --no-fuse" in captured.err
    assert "set --rtol/--atol" in captured.err  # a 1e-7 difference is rounding-sized
    assert "--skip simplify" not in captured.err
    assert not out.exists()
    assert cli.main([str(src), str(out), "--rtol", "0", "--atol", "0", "--no-fuse", "-q"]) == 0


def test_a_pass_blamed_for_a_large_difference_gets_the_skip_hint(
    demo: pathlib.Path, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    _with_pass(monkeypatch, "nudge", lambda o: _NudgeInitializerPass(0.05))
    assert cli.main([str(demo), str(tmp_path / "o.onnx"), "--passes", "nudge"]) == 1
    err = capsys.readouterr().err
    assert "hint: --skip nudge optimises without that pass" in err and "please report it" in err
    assert "--rtol/--atol" not in err and "--no-fuse" not in err


def _layer_norm_shape_model(dtype: int, path: pathlib.Path) -> pathlib.Path:
    """``Add -> LayerNormalization -> MatMul``, reshaped to the LayerNormalization's own shape (a no-op
    simplify removes), with weights of ``dtype``."""
    rng = np.random.default_rng(0)
    kind = onnx.helper.tensor_dtype_to_np_dtype(dtype)
    weights = [numpy_helper.from_array((rng.standard_normal(shape) * scale + shift).astype(kind), name)
               for name, shape, scale, shift in (("b0", 32, 0.1, 0), ("g", 32, 0.1, 1), ("b", 32, 0.1, 0),
                                                 ("W", (32, 32), 0.2, 0))]  # fmt: skip
    nodes = [helper.make_node("Add", ["X", "b0"], ["a"]),
             helper.make_node("LayerNormalization", ["a", "g", "b"], ["n"], axis=-1, epsilon=1e-5),
             helper.make_node("MatMul", ["n", "W"], ["m"]), helper.make_node("Shape", ["n"], ["s"]),
             helper.make_node("Reshape", ["m", "s"], ["Y"])]  # fmt: skip
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", dtype, ["b", "s", 32])],
                              [helper.make_tensor_value_info("Y", dtype, None)], weights)  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_a_float16_difference_from_an_exact_rewrite_gets_the_half_hint(tmp_path: pathlib.Path, capsys) -> None:
    # onnxruntime's CPU provider computes the float16 LayerNormalization in float32 where a Shape reads
    # it, and rounds it where nothing does: removing the no-op Reshape moves a MatMul result near 0 by a
    # float16 rounding, beyond float16's default tolerance.
    src = _layer_norm_shape_model(onnx.TensorProto.FLOAT16, tmp_path / "h.onnx")
    out = tmp_path / "o.onnx"
    assert cli.main([str(src), str(out), "-q"]) == 1, "onnxruntime now rounds this float16 graph alike"
    err = capsys.readouterr().err
    assert "introduced by pass 'simplify'" in err
    assert "--skip simplify optimises without that pass; the differing outputs depend on float16 values" in err
    assert "a pass that changes a result is a bug" not in err and not out.exists()
    assert cli.main([str(src), str(out), "-q", "--rtol", "0.01", "--atol", "0.01"]) == 0
    kept = [n.op_type for n in onnx.load(out).graph.node]
    assert "Shape" not in kept and "Reshape" not in kept
    # The same graph in float32: the rewrite is exact there, and the run passes bit for bit.
    src32 = _layer_norm_shape_model(onnx.TensorProto.FLOAT, tmp_path / "f.onnx")
    assert cli.main([str(src32), str(out), "-q", "--rtol", "0", "--atol", "0"]) == 0


class _WarnEachRoundPass(ir.passes.InPlacePass):
    """Test-only: warns the same thing in every round of the loop (and a second thing once)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        import logging

        self.calls += 1
        logging.getLogger("passes.toy").warning("the same warning, round after round")
        if self.calls == 1:
            logging.getLogger("passes.toy").warning("another warning")
        return ir.passes.PassResult(model, modified=self.calls < 3)


class _RefusePass(ir.passes.InPlacePass):
    def call(self, model: ir.Model) -> ir.passes.PassResult:
        raise passes.InputError("the toy pass refuses this model")


def test_warnings_before_an_error_are_each_said_once(demo: pathlib.Path, tmp_path: pathlib.Path,
                                                      monkeypatch: pytest.MonkeyPatch, capsys) -> None:  # fmt: skip
    """A pass that warns in each of its rounds, then a refusal: each warning once, then the one error line."""
    warn = _WarnEachRoundPass()
    monkeypatch.setitem(pipeline.PASSES, "warn", pipeline.PassSpec("warn", "test only", lambda o: warn, repeats=True))
    monkeypatch.setitem(pipeline.PASSES, "refuse", pipeline.PassSpec("refuse", "test only", lambda o: _RefusePass()))
    assert cli.main([str(demo), str(tmp_path / "o.onnx"), "--passes", "fold,warn,refuse"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert warn.calls == 3  # the loop ran it three rounds
    assert err == ["optimize: WARNING: passes.toy: the same warning, round after round",
                   "optimize: WARNING: passes.toy: another warning",
                   "optimize: error: the toy pass refuses this model"]


def test_the_summary_reads_without_a_manual(demo: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """``optimize MODEL OUT``: the tolerance's source is the dtype (or the flag), a long list of kinds
    names the three most frequent, a pass that changed nothing shows only its name, and an output
    that passed with a relative error beyond rtol says which bound its elements met."""
    proc = run_cli(str(REPO / "models" / "real" / "sk_mlp_opset13.onnx"), str(tmp_path / "m.onnx"))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "(rtol 0.0001 atol 1e-05: float32's default)" in proc.stdout and "value '" not in proc.stdout
    converted = next(line for line in lines if line.strip().startswith("converted: "))
    assert converted.strip() == "converted: 11 in 7 kinds: Cast x3, Add x2, MatMul x2 and 4 more"
    for name in ("fold", "decompose", "cleanup"):  # changed nothing: the name, the time and "no"
        (line,) = [line for line in lines if line.startswith(name + " ")]
        assert line.split()[1:] == [line.split()[1], "no"], line
    proc = run_cli(str(demo), str(tmp_path / "d.onnx"), "--rtol", "1e-9")
    assert proc.returncode == 0, proc.stderr
    lse = next(line for line in proc.stdout.splitlines() if line.strip().startswith("lse_flat: ok"))
    assert "max rel 8.52e-08 (beyond rtol 1e-09 only within atol 1e-05)" in lse, lse
    assert lse.endswith("(rtol 1e-09 (--rtol) atol 1e-05 (float32's default))"), lse
    proc = run_cli(str(demo), str(tmp_path / "d.onnx"), "--rtol", "1e-3", "--atol", "1e-3")
    assert "(rtol 0.001 atol 0.001: --rtol --atol)" in proc.stdout


def test_one_error_figure_per_output_with_precision(tmp_path: pathlib.Path) -> None:
    """``--precision fp16``: the check's error per output, not also the search's (the JSON has both)."""
    report = tmp_path / "r.json"
    proc = run_cli(str(REPO / "models" / "real" / "small_cnn_opset13.onnx"), str(tmp_path / "h.onnx"),
                   "--precision", "fp16", "--report", str(report))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("max abs") == 2 and "max_abs_error" not in proc.stdout
    assert "(rtol 0.01 atol 0.001: float16's default (--precision fp16))" in proc.stdout
    (run,) = [r for r in json.loads(report.read_text())["passes"] if r["name"] == "precision"]
    assert set(run["stats"]["max_abs_error"]) == {"log_probs", "features"}
