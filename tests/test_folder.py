"""``optimize DIR -o OUTDIR``: parsed once, each model's run gets only its own flags; the folders refused
with their reasons; a row per model that says why a check did not run; a totals line. (The mixed
folder, the exit codes, and the interrupt that still writes the report of the models that
finished: tests/test_deploy.py.)"""

from __future__ import annotations

import json
import pathlib
import shutil

import onnx
import pytest
from onnx import TensorProto, helper

from helpers import one_error_line, optimize_command
from passes.cli import folder

REPO = pathlib.Path(__file__).resolve().parent.parent
DEMO = REPO / "models" / "demo.onnx"


def custom_op_model(path: pathlib.Path) -> pathlib.Path:
    """A model onnxruntime cannot load (an op of an unregistered domain): its check cannot run."""
    graph = helper.make_graph(
        [helper.make_node("Foo", ["x"], ["y"], domain="com.example"), helper.make_node("Relu", ["y"], ["z"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    onnx.save_model(model, str(path))
    return path


def cells(stdout: str) -> dict[str, dict[str, str]]:
    """The folder table's rows by model, each a dict of its cells by column (the header aligns them)."""
    header, *rows = [line for line in stdout.splitlines() if line and not line.startswith("total: ")]
    names = header.split()
    starts = [header.index(n) for n in names]
    return {row.split()[0]: {n: row[a:b].strip() for n, a, b in zip(names, starts, [*starts[1:], None])}
            for row in rows}  # fmt: skip


def _files(folder: pathlib.Path) -> dict[pathlib.Path, bytes]:
    return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_the_output_folder_may_not_be_the_input_folder_or_inside_it(tmp_path: pathlib.Path) -> None:
    folder = tmp_path / "models"
    (folder / "sub").mkdir(parents=True)
    shutil.copy(DEMO, folder / "a.onnx")
    shutil.copy(DEMO, folder / "sub" / "b.onnx")
    before = _files(folder)
    line = one_error_line(optimize_command("models", "-o", "models", cwd=tmp_path))
    assert "the output folder is the input folder" in line and "no .onnx file" not in line
    line = one_error_line(optimize_command("models", "-o", "models/out", cwd=tmp_path))
    assert "inside the input folder" in line
    # DIR inside OUTDIR: models/sub/sub/b.onnx's output, models/sub/b.onnx, is another model of DIR.
    shutil.copy(DEMO, folder / "sub" / "sub.onnx")
    (folder / "sub" / "sub").mkdir()
    shutil.copy(DEMO, folder / "sub" / "sub" / "b.onnx")
    before = _files(folder)
    line = one_error_line(optimize_command("models/sub", "-o", "models", cwd=tmp_path))
    assert "would be written over the model" in line and "b.onnx" in line
    line = one_error_line(optimize_command("models", "-o", "out", "--report", "models/a.onnx", cwd=tmp_path))
    assert "--report models/a.onnx: a file under the input folder" in line
    assert _files(folder) == before and not (tmp_path / "out").exists()


def test_abbreviations_never_reach_the_models_runs(tmp_path: pathlib.Path) -> None:
    """``--out DIR``, ``--job 2``, ``--repo F`` are refused once, before any run; ``-oOUT`` and
    ``--report=F`` (argparse's own spellings) work: each model's run gets none of them."""
    folder = tmp_path / "in"
    folder.mkdir()
    shutil.copy(DEMO, folder / "a.onnx")
    for typed in (["--out", "out"], ["-o", "out", "--job", "2"], ["-o", "out", "--repo", "r.json"]):
        line = one_error_line(optimize_command("in", *typed, cwd=tmp_path))
        assert "did you mean" in line, line
    assert not (tmp_path / "out").exists()
    proc = optimize_command("in", "-oout", "--report=r.json", "-q", "--no-fuse", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (record,) = json.loads((tmp_path / "r.json").read_text())["models"]
    assert record["status"] == "ok" and record["report"]["status"] == "ok"
    simplify = next(p for p in record["report"]["passes"] if p["name"] == "simplify")
    assert "fused" not in simplify["stats"] or simplify["stats"]["fused"] == 0  # --no-fuse reached the run


def test_each_row_says_why_its_check_did_not_run_and_a_totals_line_ends_the_table(tmp_path: pathlib.Path) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    shutil.copy(DEMO, folder / "demo.onnx")
    custom_op_model(folder / "custom.onnx")
    (folder / "bad.onnx").write_bytes(b"not a model")
    proc = optimize_command("in", "-o", "out", "--report", "all.json", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    rows = cells(proc.stdout)
    assert rows["custom.onnx"]["check"] == "NOT CHECKED"
    assert rows["custom.onnx"]["status"].startswith("ok (not checked: the original model does not load")
    assert (rows["demo.onnx"]["check"], rows["demo.onnx"]["status"]) == ("ok", "ok")
    assert rows["bad.onnx"]["status"].startswith("error: ")
    total = proc.stdout.splitlines()[-1]
    assert total.startswith("total: 3 model(s): 2 ok (1 not checked), 1 error; the 2 written: nodes ")
    records = {r["model"]: r for r in json.loads((tmp_path / "all.json").read_text())["models"]}
    assert "com.example:Foo" in records["custom.onnx"]["report"]["check"]["reason"]
    # --no-check is said as such, not as NOT CHECKED
    proc = optimize_command("in", "-o", "out2", "--no-check", cwd=tmp_path)
    assert "NOT CHECKED" not in proc.stdout, proc.stdout
    rows = cells(proc.stdout)
    assert rows["demo.onnx"]["check"] == rows["custom.onnx"]["check"] == "--no-check"
    assert rows["demo.onnx"]["status"] == rows["custom.onnx"]["status"] == "ok"
    assert proc.stdout.splitlines()[-1].startswith("total: 3 model(s): 2 ok (2 not checked), 1 error")


@pytest.mark.parametrize("written, status, expected", [
    (True, "ok", ("ok", 0)), (True, "not checked", ("ok", 0)), (True, "check failed", ("check failed", 1)),
    (False, "error", ("interrupted", 143)), (None, None, ("interrupted", 143))])
def test_a_run_stopped_after_its_commit_counts_as_finished(tmp_path: pathlib.Path, written, status, expected) -> None:
    """Ctrl-C's SIGTERM may reach a model's run between its commit (output and report renamed
    together) and its exit: its output is whole and its report says so, so it is not "not finished"."""
    source, report = tmp_path / "in", tmp_path / "0.json"
    if written is not None:
        report.write_text(json.dumps({"written": written, "status": status}))
    record = folder.child_record(source, source / "m.onnx", tmp_path / "out" / "m.onnx", 143, "", report, 1.0)
    assert (record["status"], record["exit"]) == expected
    assert record["error"] is None and record["report"] == (None if written is None else json.loads(report.read_text()))
