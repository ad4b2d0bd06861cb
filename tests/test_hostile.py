"""Hostile destinations and inputs: what the tool refuses, and that a refusal changes nothing.

Every refusal here is exit 2 with one ``optimize: error:`` line, no traceback,
no "internal error", and the input, an existing output and the files next to
them byte-identical (and devices, FIFOs and sockets still what they were).
Covered: destinations that are not regular files (the real ``/dev/null`` and
``/dev/full`` included: we run as root, where renaming over them replaces
them), outputs and reports that are symlinks or hard links (replaced, never
written through), output paths that cannot name a file, a ``.data`` file of
another model, a report that cannot be written,
strict JSON, a signal after the commit, odd external-data locations and
offsets, paths that are not UTF-8, a data file swapped after validation,
library log lines, and a sparse constant standing for 1 GiB.
"""

from __future__ import annotations

import errno
import importlib
import json
import math
import os
import pathlib
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import helpers
import passes
from passes import cli, modelio, pipeline
from passes.report import ModelSummary, PassRun, Report
from test_robustness import (
    _externalized_demo,
    add_w,
    expect_refusal,
    external,
    leftovers,
    one_error_line,
    snapshot,
    weights,
)

REPO = pathlib.Path(__file__).resolve().parent.parent
DEMO = REPO / "models" / "demo.onnx"
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def _kinds(folder: pathlib.Path) -> dict[str, str]:
    """What each entry of ``folder`` is (``stat.filemode``), symlinks not followed."""
    return {p.name: stat.filemode(os.lstat(p).st_mode)[0] for p in sorted(folder.iterdir())}


def _refused(capfd: pytest.CaptureFixture[str], argv: list[str], needle: str, *folders: pathlib.Path) -> str:
    """Runs the command in-process: exit 2, one line with ``needle``, every folder unchanged."""
    before = [(snapshot(f), _kinds(f)) for f in folders]
    code = cli.main(argv)
    line = one_error_line(capfd.readouterr().err)
    assert code == 2, line
    assert needle.lower() in line.lower(), line
    for folder, (files, kinds) in zip(folders, before):
        assert snapshot(folder) == files
        assert _kinds(folder) == kinds
        assert leftovers(folder) == [n for n in kinds if n.startswith(".")]
    return line


# --- destinations that are not regular files -----------------------------------------------------


def _make(kind: str, path: pathlib.Path) -> object:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        return sock
    elif kind == "char_device":  # a private /dev/null: same device numbers
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    elif kind == "folder":
        path.mkdir()
    elif kind == "symlink_to_fifo":
        os.mkfifo(path.with_name("real.fifo"))
        os.symlink("real.fifo", path)
    return None


_NEEDLES = {"fifo": "FIFO", "socket": "socket", "char_device": "character device", "folder": "folder",
            "symlink_to_fifo": "FIFO"}


@pytest.mark.parametrize("role", ["output", "output_data", "report"])
@pytest.mark.parametrize("kind", sorted(_NEEDLES))
def test_destination_that_is_not_a_regular_file_is_refused(
    kind: str, role: str, tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str]
) -> None:
    if kind == "char_device" and os.geteuid() != 0:
        pytest.skip("mknod needs root")
    src = _externalized_demo(tmp_path / "in") if role == "output_data" else tmp_path / "in" / "model.onnx"
    if role != "output_data":
        src.parent.mkdir()
        src.write_bytes(DEMO.read_bytes())
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "neighbour.txt").write_text("untouched")
    target = {"output": out_dir / "o.onnx", "output_data": out_dir / "o.onnx.data",
              "report": out_dir / "r.json"}[role]
    keep = _make(kind, target)
    argv = [str(src), "-o", str(out_dir / "o.onnx"), "-q"]
    if role == "report":
        (out_dir / "o.onnx").write_bytes(b"an existing output")  # must stay as it is
        argv += ["--report", str(target)]
    _refused(capfd, argv, _NEEDLES[kind], src.parent, out_dir)
    del keep


def _link(kind: str, folder: pathlib.Path, src: pathlib.Path, name: str) -> pathlib.Path | None:
    """Makes ``folder/name`` a link of ``kind``; returns the file it leads to (None: nothing there)."""
    path = folder / name
    if kind == "symlink_to_a_file":
        (folder / "theirs.onnx").write_bytes(b"someone else's file")
        os.symlink("theirs.onnx", path)
        return folder / "theirs.onnx"
    if kind == "symlink_to_the_input":
        os.symlink(os.path.relpath(src, folder), path)
        return src
    if kind == "dangling_symlink":
        os.symlink("nowhere.onnx", path)
        return None
    os.link(src, path)  # a hard link to the input
    return src


_LINKS = ["symlink_to_a_file", "symlink_to_the_input", "dangling_symlink", "hard_link_to_the_input"]


@pytest.mark.parametrize("kind", _LINKS)
def test_an_output_that_is_a_link_is_replaced_never_written_through(
    kind: str, tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """OUTPUT a symlink or a hard link: the link becomes our regular file; what it led to (the input,
    another file) keeps its bytes, and a dangling link's target is not created."""
    src = tmp_path / "in" / "model.onnx"
    src.parent.mkdir()
    src.write_bytes(DEMO.read_bytes())
    out = tmp_path / "o.onnx"
    led_to = _link(kind, tmp_path, src, out.name)
    before = snapshot(src.parent), (led_to.read_bytes() if led_to is not None else None)
    code = cli.main([str(src), "-o", str(out), "-q"])
    assert code == 0, capfd.readouterr().err
    assert (snapshot(src.parent), led_to.read_bytes() if led_to is not None else None) == before
    assert stat.S_ISREG(os.lstat(out).st_mode) and not (tmp_path / "nowhere.onnx").exists()
    onnx.checker.check_model(str(out), full_check=True)
    assert leftovers(tmp_path) == [] and leftovers(src.parent) == []


@pytest.mark.parametrize("kind", ["symlink_to_the_input", "hard_link_to_the_input"])
def test_a_report_linked_to_the_input_never_writes_the_input(
    kind: str, tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A symlink is the input by another name (refused, nothing written); a hard link is replaced by
    the report, the input's bytes unchanged."""
    src = tmp_path / "in" / "model.onnx"
    src.parent.mkdir()
    src.write_bytes(DEMO.read_bytes())
    report = tmp_path / "r.json"
    _link(kind, tmp_path, src, report.name)
    argv = [str(src), "-o", str(tmp_path / "o.onnx"), "--report", str(report), "-q"]
    if kind == "symlink_to_the_input":
        _refused(capfd, argv, "a model file of this run", src.parent, tmp_path)
        return
    before = snapshot(src.parent)
    assert cli.main(argv) == 0, capfd.readouterr().err
    assert snapshot(src.parent) == before
    assert json.loads(report.read_text())["written"] is True and not report.samefile(src)
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize(("output", "needle"), [("f.txt/o.onnx", "not a folder"), ("", "is a folder")],
                         ids=["a file as a folder", "empty"])
def test_an_output_path_that_cannot_be_a_file_is_refused(
    output: str, needle: str, tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    src = tmp_path / "model.onnx"
    src.write_bytes(DEMO.read_bytes())
    (tmp_path / "f.txt").write_text("a file")
    monkeypatch.chdir(tmp_path)
    _refused(capfd, [str(src), "-o", output, "-q"], needle, tmp_path)


def test_a_symlinked_output_has_its_data_file_checked_before_any_work(
    tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str],
) -> None:
    """OUTPUT a dangling symlink, OUTPUT.data a FIFO: the data file the save would write is next to
    OUTPUT as given, so it is refused before the run (no report written), as for a plain OUTPUT."""
    src = tmp_path / "model.onnx"
    src.write_bytes(DEMO.read_bytes())
    out, report = tmp_path / "out.onnx", tmp_path / "report.json"
    os.symlink("nowhere.onnx", out)
    os.mkfifo(tmp_path / "out.onnx.data")
    _refused(capfd, [str(src), "-o", str(out), "--report", str(report), "-q", "--no-check"],
             "out.onnx.data (the output's data file): is a FIFO", tmp_path)


@pytest.fixture()
def real_devices() -> None:
    """The test uses the real /dev/null and /dev/full: if a regression replaced one, put it back."""
    yield
    broken = []
    for name, minor in (("null", 3), ("full", 7)):
        path = pathlib.Path("/dev") / name
        if not stat.S_ISCHR(os.lstat(path).st_mode):
            broken.append(str(path))
            path.unlink()
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, minor))
            os.chmod(path, 0o666)
    assert not broken, f"{broken} had been replaced by a regular file (restored)"


@pytest.mark.usefixtures("real_devices")
@pytest.mark.parametrize("device", ["/dev/null", "/dev/full"])
@pytest.mark.parametrize("role", ["-o", "--report"])
def test_real_dev_null_and_dev_full_are_refused(
    device: str, role: str, tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str]
) -> None:
    if not os.path.exists(device):
        pytest.skip(f"no {device} here")
    src = tmp_path / "model.onnx"
    src.write_bytes(DEMO.read_bytes())
    before = os.stat(device)
    argv = [str(src), "-o", device] if role == "-o" else [str(src), "-o", str(tmp_path / "o.onnx"), "--report", device]
    _refused(capfd, [*argv, "-q"], "character device", tmp_path)
    after = os.stat(device)
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev and after.st_ino == before.st_ino
    assert not [p for p in pathlib.Path("/dev").iterdir() if p.name.startswith(f".{pathlib.Path(device).name}.")]


# --- OUTPUT.data of another model -----------------------------------------------------------------


def test_data_file_of_another_model_is_not_replaced(tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str]) -> None:
    src = _externalized_demo(tmp_path / "in")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    # OUT does not exist: OUT.data is someone else's (say other.onnx's, copied under that name).
    (out_dir / "o.onnx.data").write_bytes(b"another model's weights")
    line = _refused(capfd, [str(src), "-o", str(out_dir / "o.onnx"), "-q"], "--replace-data", src.parent, out_dir)
    assert "does not exist" in line
    # OUT exists but is a model that does not refer to OUT.data.
    (out_dir / "o.onnx").write_bytes(DEMO.read_bytes())
    line = _refused(capfd, [str(src), "-o", str(out_dir / "o.onnx"), "-q"], "another model", src.parent, out_dir)
    assert "does not refer to it" in line
    # OUT exists and is not a model at all.
    (out_dir / "o.onnx").write_bytes(b"not a model")
    _refused(capfd, [str(src), "-o", str(out_dir / "o.onnx"), "-q"], "--replace-data", src.parent, out_dir)
    # --force is about the check, not this.
    _refused(capfd, [str(src), "-o", str(out_dir / "o.onnx"), "-q", "--force"], "--replace-data", src.parent, out_dir)
    # --replace-data replaces it.
    before = snapshot(src.parent)
    assert cli.main([str(src), "-o", str(out_dir / "o.onnx"), "-q", "--replace-data"]) == 0
    onnx.checker.check_model(str(out_dir / "o.onnx"), full_check=True)
    assert snapshot(src.parent) == before


def test_data_file_refused_at_the_commit_when_the_output_grows_external(
    tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An inline input whose output needs external data: the commit itself checks OUT.data."""
    src = _externalized_demo(tmp_path / "in")
    inline = onnx.load(str(src))  # with its weights read in
    src = tmp_path / "model.onnx"
    onnx.save_model(inline, str(src))
    shutil.rmtree(tmp_path / "in")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "o.onnx.data").write_bytes(b"another model's weights")
    real = modelio.save_model
    monkeypatch.setattr(modelio.save, "save_model", lambda model, path, **kw: real(model, path, external_data=True))
    _refused(capfd, [str(src), "-o", str(out_dir / "o.onnx"), "-q"], "--replace-data", tmp_path, out_dir)


def test_rerunning_into_our_own_output_with_external_data_succeeds(
    tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str]
) -> None:
    src = _externalized_demo(tmp_path / "in")
    out = tmp_path / "out" / "b.onnx"
    out.parent.mkdir()
    (out.parent / "neighbour.onnx.data").write_bytes(b"untouched")
    assert cli.main([str(src), "-o", str(out), "-q"]) == 0, capfd.readouterr().err
    first = snapshot(out.parent)
    assert "b.onnx.data" in first
    assert cli.main([str(src), "-o", str(out), "-q"]) == 0, capfd.readouterr().err
    assert snapshot(out.parent) == first
    # And the output optimised into itself (-o INPUT) with its data file.
    assert cli.main([str(out), "-o", str(out), "-q"]) == 0, capfd.readouterr().err
    onnx.checker.check_model(str(out), full_check=True)


# --- the report ---------------------------------------------------------------------------------


def test_report_that_is_a_folder_leaves_the_output_as_it_was(
    tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "in" / "model.onnx"
    src.parent.mkdir()
    src.write_bytes(DEMO.read_bytes())
    out_dir = tmp_path / "out"
    (out_dir / "r.json").mkdir(parents=True)
    (out_dir / "o.onnx").write_bytes(b"the previous output")
    _refused(capfd, [str(src), "-o", str(out_dir / "o.onnx"), "--report", str(out_dir / "r.json"), "-q"],
             "is a folder", src.parent, out_dir)


def test_report_on_a_full_disk_leaves_the_output_as_it_was(
    tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "in" / "model.onnx"
    src.parent.mkdir()
    src.write_bytes(DEMO.read_bytes())
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "o.onnx").write_bytes(b"the previous output")
    (out_dir / "r.json").write_text("the previous report")
    real = Report.write_json

    def full(self: Report, path: object) -> None:
        if not isinstance(path, (str, os.PathLike)):  # the staged report (a stream)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(self, path)

    monkeypatch.setattr(Report, "write_json", full)
    _refused(capfd, [str(src), "-o", str(out_dir / "o.onnx"), "--report", str(out_dir / "r.json"), "-q"],
             "no space left", src.parent, out_dir)


def test_report_temporary_names_are_unique(tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str]) -> None:
    """A file named like the old fixed temporary name (.NAME.tmp) is neither overwritten nor removed."""
    src = tmp_path / "model.onnx"
    src.write_bytes(DEMO.read_bytes())
    (tmp_path / ".r.json.tmp").write_text("somebody's file")
    assert cli.main([str(src), "-o", str(tmp_path / "o.onnx"), "--report", str(tmp_path / "r.json"), "-q"]) == 0
    assert (tmp_path / ".r.json.tmp").read_text() == "somebody's file"
    assert leftovers(tmp_path) == [".r.json.tmp"]
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["written"] is True
    assert stat.S_IMODE((tmp_path / "r.json").stat().st_mode) == 0o666 & ~_umask()


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _no_constants(name: str) -> object:
    raise ValueError(f"not strict JSON: {name}")


def test_report_is_strict_json() -> None:
    summary = ModelSummary({}, 0, 0, 0, {"": 18})
    report = Report("in.onnx", "out.onnx", summary, summary,
                    [PassRun("p", math.inf, True, {"a": math.nan, "b": np.float32(-np.inf), "c": [np.float64(np.inf)],
                                                   "d": np.int64(3), "e": np.array([1.5, np.nan])})])
    text = _json_text(report)
    data = json.loads(text, parse_constant=_no_constants)
    assert data["passes"][0]["seconds"] == "inf"
    assert data["passes"][0]["stats"] == {"a": "nan", "b": "-inf", "c": ["inf"], "d": 3, "e": [1.5, "nan"]}


def _json_text(report: Report) -> str:
    import io

    stream = io.StringIO()
    report.write_json(stream)
    return stream.getvalue()


def test_report_after_a_failed_check_is_strict_json(
    tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An infinite error (the optimised model gives inf where the original gives a number)."""
    from passes.verify.result import CheckResult, OutputComparison

    from passes.verify import gate

    def failing(self, staged):  # noqa: ANN001
        result = CheckResult(ok=False, outputs=[OutputComparison(
            "y", False, "float32", (4,), max_abs_error=math.inf, max_rel_error=math.nan, mismatches=4)])
        return gate.Verdict("the check found a difference", result=result)

    monkeypatch.setattr(gate.Gate, "verify", failing)
    src = tmp_path / "model.onnx"
    src.write_bytes(DEMO.read_bytes())
    code = cli.main([str(src), "-o", str(tmp_path / "o.onnx"), "--report", str(tmp_path / "r.json"), "-q"])
    assert code == 1
    one_error_line(capfd.readouterr().err)
    assert not (tmp_path / "o.onnx").exists()
    data = json.loads((tmp_path / "r.json").read_text(), parse_constant=_no_constants)
    assert data["written"] is False
    assert data["check"]["outputs"][0]["max_abs_error"] == "inf"


# --- a signal after the commit ------------------------------------------------------------------

# main() has returned (the output is complete) when the signal comes: what happens then is
# the process's business (passes.cli.command.run), not main()'s.
_SIGNAL_AFTER_MAIN = """
import os, signal, sys
from passes.cli import command
real = command._main
def main_then_signal(*args):
    code = real(*args)
    os.kill(os.getpid(), signal.SIGTERM)
    return code
command._main = main_then_signal
sys.argv[0] = "optimize"
import passes.__main__ as entry
entry.main()
"""


def test_signal_right_after_the_run_says_what_happened(tmp_path: pathlib.Path) -> None:
    src = tmp_path / "model.onnx"
    src.write_bytes(DEMO.read_bytes())
    out = tmp_path / "o.onnx"
    proc = subprocess.run([sys.executable, "-c", _SIGNAL_AFTER_MAIN, str(src), "-o", str(out), "-q"],
                          capture_output=True, text=True, timeout=300, env=ENV)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr
    assert one_error_line(proc.stderr) == "optimize: error: interrupted; the output was already written"
    onnx.checker.check_model(str(out), full_check=True)
    assert leftovers(tmp_path) == []


def test_signal_as_soon_as_the_output_appears(tmp_path: pathlib.Path) -> None:
    """Sent when OUT appears: the run ends either normally or with the one line, never by the raw signal."""
    src = tmp_path / "model.onnx"
    src.write_bytes(DEMO.read_bytes())
    for attempt in range(3):
        out = tmp_path / f"o{attempt}.onnx"
        proc = subprocess.Popen([sys.executable, "-m", "passes", str(src), "-o", str(out), "-q"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
        deadline = time.monotonic() + 120
        while not out.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.001)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode in (0, 128 + signal.SIGTERM), (proc.returncode, err)
        if proc.returncode:
            assert one_error_line(err) == "optimize: error: interrupted; the output was already written"
        onnx.checker.check_model(str(out), full_check=True)
    assert leftovers(tmp_path) == []


def test_a_signal_as_the_clean_up_begins_still_removes_the_staging_folder(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The interrupt lands while the clean-up is setting up its deferral (the window CI once hit)."""
    import contextlib

    @contextlib.contextmanager
    def interrupted_on_entry():
        raise KeyboardInterrupt
        yield  # pragma: no cover

    with pytest.raises(KeyboardInterrupt), modelio.staged_output(tmp_path / "out.onnx") as staged:
        (staged.folder / "part").write_bytes(b"x")
        monkeypatch.setattr(modelio.save, "signals_deferred", interrupted_on_entry)
    assert list(tmp_path.iterdir()) == []


# --- external data: odd locations and offsets ---------------------------------------------------

ODD_EXTERNAL = {
    "symlink_loop": (lambda: external(weights(), "loop.bin"), "symlink loop"),
    "location_of_5000_characters": (lambda: external(weights(), "a" * 5000), "File name too long"),
    "offset_superscript_two": (lambda: external(weights(), "w.bin", offset="\u00b2"), "not a non-negative integer"),
    "offset_of_5000_digits": (lambda: external(weights(), "w.bin", offset="0" * 5000),
                              "not a non-negative integer"),
    "offset_arabic_indic": (lambda: external(weights(), "w.bin", offset="\u0660"), "not a non-negative integer"),
    "length_arabic_indic": (lambda: external(weights(), "w.bin", length="\u0661\u0666"), "not a non-negative integer"),
    "offset_with_spaces": (lambda: external(weights(), "w.bin", offset=" 0"), "not a non-negative integer"),
    "location_of_the_folder_itself": (lambda: external(weights(), "."), "refusing to read it"),
    "location_through_a_subfolder_out": (lambda: external(weights(), "a/../../w.bin"), "outside the model's folder"),
}


@pytest.mark.parametrize("case", sorted(ODD_EXTERNAL))
def test_odd_external_data_is_refused_cleanly(case: str, tmp_path: pathlib.Path,
                                              capfd: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "w.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    os.symlink("loop.bin", folder / "loop.bin")
    build, needle = ODD_EXTERNAL[case]
    (folder / "model.onnx").write_bytes(add_w(build()).SerializeToString())
    line = expect_refusal(capfd, folder / "model.onnx", needle=needle)
    assert len(line) < 600, line


def test_huge_option_values_are_refused_in_a_short_line(
    tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "model.onnx"
    src.write_bytes(DEMO.read_bytes())
    for flag in ("--fold-size-limit", "--seed", "--target-opset", "--dim"):
        value = "n=" + "9" * 400 if flag == "--dim" else "9" * 400
        try:
            code = cli.main([str(src), "-o", str(tmp_path / "o.onnx"), flag, value])
        except SystemExit as e:  # argparse's refusal
            code = e.code
        assert code == 2
        line = one_error_line(capfd.readouterr().err)
        assert flag in line and len(line) < 200, line
        assert not (tmp_path / "o.onnx").exists()


# --- paths that are not UTF-8 -------------------------------------------------------------------


def _run_bytes(*argv: bytes) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([os.fsencode(sys.executable), b"-m", b"passes", *argv, b"-q"],
                          capture_output=True, timeout=300, env=ENV)


def _one_line(proc: subprocess.CompletedProcess[bytes]) -> str:
    return one_error_line(proc.stderr.decode("utf-8", "backslashreplace"))


def test_output_name_that_is_not_utf8_is_refused(tmp_path: pathlib.Path) -> None:
    folder = os.fsencode(tmp_path)
    src = tmp_path / "model.onnx"
    src.write_bytes(DEMO.read_bytes())
    (tmp_path / "o.onnx").write_bytes(b"existing")
    before = snapshot(tmp_path)
    proc = _run_bytes(os.fsencode(src), b"-o", folder + b"/out\xff.onnx")
    assert proc.returncode == 2
    assert "not valid UTF-8" in _one_line(proc)
    assert snapshot(tmp_path) == before and sorted(os.listdir(folder)) == [b"model.onnx", b"o.onnx"]


def test_model_folder_that_is_not_utf8(tmp_path: pathlib.Path) -> None:
    """Without external data it works; with external data (read by onnx by path) it is refused."""
    folder = os.fsencode(tmp_path) + b"/models\xff"
    os.mkdir(folder)
    with open(folder + b"/inline.onnx", "wb") as f:
        f.write(DEMO.read_bytes())
    with open(folder + b"/w.bin", "wb") as f:
        f.write(np.arange(4, dtype=np.float32).tobytes())
    with open(folder + b"/external.onnx", "wb") as f:
        f.write(add_w(external(weights(), "w.bin")).SerializeToString())
    before = {name: open(folder + b"/" + name, "rb").read() for name in os.listdir(folder)}
    out = os.fsencode(tmp_path / "o.onnx")
    proc = _run_bytes(folder + b"/external.onnx", b"-o", out)
    assert proc.returncode == 2
    assert "not valid UTF-8" in _one_line(proc)
    assert not os.path.exists(out)
    proc = _run_bytes(folder + b"/inline.onnx", b"-o", out, b"--report", folder + b"/r\xff.json")
    assert proc.returncode == 0, proc.stderr
    onnx.checker.check_model(str(tmp_path / "o.onnx"))
    json.loads(open(folder + b"/r\xff.json", "rb").read())
    assert {n: open(folder + b"/" + n, "rb").read() for n in before} == before


# --- a data file swapped after validation ---------------------------------------------------------


def _swap_after(monkeypatch: pytest.MonkeyPatch, target: object, name: str, swap) -> None:  # noqa: ANN001
    real = getattr(target, name)

    def wrapper(*args, **kwargs):
        result = real(*args, **kwargs)
        swap()
        return result

    monkeypatch.setattr(target, name, wrapper)


def _to_symlink(folder: pathlib.Path, target: str) -> None:
    (folder / "w.bin").unlink()
    os.symlink(target, folder / "w.bin")


SWAPS = {
    # inside the folder: validation would have accepted the link, but it is not the file it saw
    "symlink_inside": lambda folder: _to_symlink(folder, "other.bin"),
    "symlink_outside": lambda folder: _to_symlink(folder, str(folder.parent / "secret.bin")),
    "symlink_to_a_fifo": lambda folder: _to_symlink(folder, "pipe"),
    "rewritten": lambda folder: (folder / "w.bin").write_bytes(np.ones(4, np.float32).tobytes()),
    "removed": lambda folder: (folder / "w.bin").unlink(),
}


@pytest.mark.parametrize("when", ["after_validation", "during_the_passes"])
@pytest.mark.parametrize("how", sorted(SWAPS))
def test_data_file_swapped_after_validation_is_refused(
    how: str, when: str, tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    data = np.arange(4, dtype=np.float32).tobytes()
    (folder / "w.bin").write_bytes(data)
    (folder / "other.bin").write_bytes(np.full(4, 7, np.float32).tobytes())
    (tmp_path / "secret.bin").write_bytes(b"secret!!" * 2)
    os.mkfifo(folder / "pipe")
    (folder / "model.onnx").write_bytes(add_w(external(weights(), "w.bin")).SerializeToString())
    if when == "after_validation":
        _swap_after(monkeypatch, importlib.import_module("passes.modelio.validate"), "check_validity",
                    lambda: SWAPS[how](folder))
    else:
        _swap_after(monkeypatch, pipeline.RunSpec, "run", lambda: SWAPS[how](folder))
    out = tmp_path / "o.onnx"
    code = cli.main([str(folder / "model.onnx"), "-o", str(out), "-q"])
    line = one_error_line(capfd.readouterr().err)
    assert code == 2, line
    assert "changed after it was validated" in line or "cannot read external data" in line, line
    assert not out.exists() and leftovers(tmp_path) == [] and leftovers(folder) == []
    assert (tmp_path / "secret.bin").read_bytes() == b"secret!!" * 2
    assert (folder / "other.bin").read_bytes() == np.full(4, 7, np.float32).tobytes()


# --- library log lines --------------------------------------------------------------------------


def test_library_warnings_are_shown_only_with_verbose(tmp_path: pathlib.Path) -> None:
    """onnx_ir warns that a string attribute is not UTF-8: not the user's business without -v."""
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Constant", [], ["y"], value_string=b"\xff\xfe")], "g", [],
        [helper.make_tensor_value_info("y", TensorProto.STRING, [])]), opset_imports=[helper.make_opsetid("", 13)])
    src = tmp_path / "model.onnx"
    onnx.save_model(model, str(src))
    quiet = subprocess.run([sys.executable, "-m", "passes", str(src), "-o", str(tmp_path / "o.onnx"), "--no-check"],
                           capture_output=True, text=True, timeout=300, env=ENV)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    verbose = subprocess.run([sys.executable, "-m", "passes", str(src), "-o", str(tmp_path / "o.onnx"), "-v",
                              "--no-check"], capture_output=True, text=True, timeout=300, env=ENV)
    assert verbose.returncode == 0 and "invalid UTF-8" in verbose.stderr


# --- sparse constants -----------------------------------------------------------------------------


def _sparse_model(dims: list[int], count: int = 1) -> onnx.ModelProto:
    """y = x + sum of ``count`` sparse constants of ``dims`` (two non-zero values each)."""
    nodes, total = [], "x"
    size = int(np.prod(dims))
    for i in range(count):
        sparse = helper.make_sparse_tensor(
            numpy_helper.from_array(np.array([1.5, -2.5 - i], np.float32), f"v{i}"),
            numpy_helper.from_array(np.array([0, size - 1 - i], np.int64), f"i{i}"), dims)
        nodes += [helper.make_node("Constant", [], [f"c{i}"], sparse_value=sparse),
                  helper.make_node("ReduceSum", [f"c{i}"], [f"s{i}"], keepdims=0),
                  helper.make_node("Add", [total, f"s{i}"], [f"t{i}"])]
        total = f"t{i}"
    nodes.append(helper.make_node("Identity", [total], ["y"]))
    graph = helper.make_graph(nodes, "sparse", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


_BOUNDED = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (768 << 20, 768 << 20))
from passes.cli import command
sys.exit(command.main(sys.argv[1:]))
"""


@pytest.mark.parametrize("count", [1, 3])
def test_sparse_constant_of_a_gibibyte_stays_sparse(count: int, tmp_path: pathlib.Path) -> None:
    model = _sparse_model([16384, 16384], count)  # each stands for 1 GiB of float32
    src = tmp_path / "model.onnx"
    onnx.save_model(model, str(src))
    assert src.stat().st_size < 250 * count
    out = tmp_path / "o.onnx"
    proc = subprocess.run([sys.executable, "-c", _BOUNDED, str(src), "-o", str(out), "-q", "--no-check"],
                          capture_output=True, text=True, timeout=300, env=ENV)  # (a hang guard)
    assert proc.returncode == 0, proc.stderr  # within 768 MiB of address space: never densified
    assert out.stat().st_size < 400 * count
    result = onnx.load(str(out))
    kept = [a.sparse_tensor.SerializeToString() for n in result.graph.node for a in n.attribute
            if a.type == onnx.AttributeProto.SPARSE_TENSOR]
    original = [a.sparse_tensor.SerializeToString() for n in model.graph.node for a in n.attribute
                if a.type == onnx.AttributeProto.SPARSE_TENSOR]
    assert kept == original
    assert [o.domain for o in result.opset_import] == [""]
    onnx.checker.check_model(result, full_check=True)


def test_sparse_constant_larger_than_the_fold_limit_computes_the_same(
    tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str]
) -> None:
    model = _sparse_model([1024, 1024], 2)  # 4 MiB each, above the default fold limit
    src = tmp_path / "model.onnx"
    onnx.save_model(model, str(src))
    out = tmp_path / "o.onnx"
    assert cli.main([str(src), "-o", str(out), "-q"]) == 0, capfd.readouterr().err  # with the check
    result = onnx.load(str(out))
    assert sum(a.type == onnx.AttributeProto.SPARSE_TENSOR for n in result.graph.node for a in n.attribute) == 2
    x = {"x": np.array(0.25, np.float32)}
    np.testing.assert_array_equal(helpers.ort_run(result, x)[0], helpers.ort_run(model, x)[0])


def test_a_model_without_outputs_is_refused(tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str]) -> None:
    """Every node of a graph without outputs is dead: the result would be an empty graph, which
    onnxruntime 1.32 cannot build a session of, while the original loads (and runs nothing)."""
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])], [])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)  # valid for onnx
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(model, src)
    before = src.read_bytes()
    assert cli.main([str(src), "-o", str(out), "-q"]) == 2
    err = capfd.readouterr().err
    assert err.strip().endswith("the model's graph has no outputs: it computes nothing") and err.count("\n") == 1
    assert not out.exists() and src.read_bytes() == before
    with pytest.raises(passes.InputError, match="has no outputs"):
        passes.optimize(model)
