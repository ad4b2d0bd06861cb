"""The original's side of the check runs while the passes run (passes/verify/early.py, issue #37).

What the check finds is the same as when it all runs at the end; the original's runs are
done before the passes end; a run that fails, is refused or is not checked leaves no child
and no check folder behind; ``--no-check``, ``--precision`` and one core start nothing early.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tempfile
import threading
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from passes import pipeline
from passes.errors import CheckFailedError, InputError, OptimizeError
from passes.verify import check as check_module, child, early
from passes.verify.gate import CheckOptions
from test_check_inputs import cnn_model
from test_check_isolation import _workers_of
from test_check_locate import _Perturb
from test_check_noise import _noisy

REPO = pathlib.Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.usefixtures("no_idle_child")  # they count this process's children
DEMO = REPO / "models" / "demo.onnx"


class _Retype(ir.passes.InPlacePass):
    """Test-only: a wrong rewrite (the node that computes ``output`` becomes a ``op``)."""

    def __init__(self, output: str, op: str) -> None:
        super().__init__()
        self.output, self.op = output, op

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        next(n for n in model.graph if n.outputs[0].name == self.output).op_type = self.op
        return ir.passes.PassResult(model, modified=True)


class _Watch(ir.passes.InPlacePass):
    """Test-only: calls ``look`` while the passes run (changes nothing)."""

    def __init__(self, look: Any) -> None:
        super().__init__()
        self.look = look

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        self.look()
        return ir.passes.PassResult(model, modified=False)


def _register(monkeypatch: pytest.MonkeyPatch, name: str, build: Any) -> None:
    monkeypatch.setitem(pipeline.PASSES, name, pipeline.PassSpec(name, "test only", build))


def _without_seconds(value: Any) -> Any:
    """The report's check without its timings (all that may differ between two runs)."""
    if isinstance(value, dict):
        return {k: _without_seconds(v) for k, v in value.items() if k != "seconds"}
    if isinstance(value, list):
        return [_without_seconds(v) for v in value]
    return value


def _check_of(src: pathlib.Path, out: pathlib.Path, passes: list[str], **kwargs: Any) -> tuple[Any, Any]:
    """The run's check as JSON, and its error (None when it passed)."""
    try:
        report = pipeline.optimize_file(src, out, passes=passes, **kwargs)
        error = None
    except CheckFailedError as e:
        report, error = e.report, str(e)  # type: ignore[attr-defined]
    return _without_seconds(report.to_dict()["check"]), error


@pytest.fixture
def private_tmp(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    """The check's folders go here (others' runs share the system's)."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


CASES = {
    # sets at a larger size (batch, height, width), edge values, 0-sized dims
    "cnn": (lambda: cnn_model(), None),
    # a mismatch: located, and the pass named by reruns on the same checker
    "cnn-perturbed": (lambda: cnn_model(), ["upgrade", "perturb", "fold"]),
    # the original crashes onnxruntime on its 0-sized set: the child the thread restarts lives on
    "rnn": (lambda: onnx.load(str(REPO / "models" / "real" / "tiny_rnn_opset12.onnx")), None),
    # a mismatch beside a random output: the rerun of the original loads its dropped session again
    "noisy": (lambda: _noisy(), ["upgrade", "retype"]),
    # the ONNX checker refuses the output: the comparison started beside it is dropped
    "invalid": (lambda: cnn_model(), ["upgrade", "unknown-op"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_check_finds_the_same_early_and_at_the_end(case: str, tmp_path: pathlib.Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    build, passes = CASES[case]
    if case == "cnn-perturbed":  # (a registered pass would run in the default pipeline of the others)
        _register(monkeypatch, "perturb", lambda o: _Perturb("relu1"))
    elif case == "noisy":
        _register(monkeypatch, "retype", lambda o: _Retype("y2", "Sigmoid"))
    elif case == "invalid":
        _register(monkeypatch, "unknown-op", lambda o: _Retype("r1", "NoSuchOp"))
    src = tmp_path / "m.onnx"
    onnx.save_model(build(), str(src))
    started = []
    real_start = check_module.Checker.start
    monkeypatch.setattr(check_module.Checker, "start", lambda self: (started.append(1), real_start(self)))
    found = _check_of(src, tmp_path / "o.onnx", passes)
    assert started == [1]
    monkeypatch.setattr(early, "EARLY_BYTES", -1)  # the whole check at the end, as before
    assert _check_of(src, tmp_path / "o.onnx", passes) == found
    assert started == [1]
    if case == "rnn":
        assert found[1] is None and "zero-dims" in {s["name"] for s in found[0]["inputs"]["sets"] if s["note"]}
    elif case == "cnn":
        assert found[1] is None and {s["name"] for s in found[0]["inputs"]["sets"] if s["ran"]} == {
            "normal", "larger", "edge", "edge-nonfinite", "zero-dims"}
    elif case == "cnn-perturbed":
        assert found[0]["first_difference"]["pass_name"] == "perturb" and "perturb" in found[1]
    elif case == "noisy":
        assert found[1] is not None and found[0]["first_difference"]["output"] == "y2", found
    else:
        assert "the optimised model is invalid" in found[1] and "NoSuchOp" in found[1], found
        assert found[0]["checked"] is False and _workers_of(os.getpid()) == []


def test_the_original_runs_while_the_passes_run(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
                                                private_tmp: pathlib.Path) -> None:  # fmt: skip
    """A pass that waits sees the original's side done (in another thread) before the passes end; the
    child is held meanwhile (fold's confirmation uses its own), then fold borrows it: when a borrower
    ends it (fold's large requests do), the comparison restores the original's inputs and outputs."""
    done, seen = threading.Event(), {}
    real_start = check_module.Checker.start

    def start(self: check_module.Checker) -> None:
        seen["main thread"] = threading.current_thread() is threading.main_thread()
        seen["busy"] = not self.worker.take()
        real_start(self)
        done.set()

    def look() -> None:
        seen["done"] = done.wait(120)
        borrowed = child.current.get()
        seen["idle"] = borrowed is not None and borrowed.alive and borrowed.take()
        borrowed.close()  # as fold's confirmation does after a large request
        borrowed.give_back()

    monkeypatch.setattr(check_module.Checker, "start", start)
    _register(monkeypatch, "watch", lambda o: _Watch(look))
    src = tmp_path / "m.onnx"
    onnx.save_model(cnn_model(), str(src))
    report = pipeline.optimize_file(src, tmp_path / "o.onnx", passes=["upgrade", "watch", "fold"])
    assert seen == {"main thread": False, "busy": True, "done": True, "idle": True}
    assert report.check.ok and report.check.checked
    assert {s["name"] for s in report.check.inputs.sets if s["ran"]} == {
        "normal", "larger", "edge", "edge-nonfinite", "zero-dims"}
    assert list(private_tmp.iterdir()) == [] and _workers_of(os.getpid()) == []


def test_a_pass_that_fails_stops_the_early_check(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
                                                 private_tmp: pathlib.Path) -> None:  # fmt: skip
    def fail() -> None:
        assert _workers_of(os.getpid()), "the check's child runs the original meanwhile"
        raise OptimizeError("the toy pass refuses")

    _register(monkeypatch, "fail", lambda o: _Watch(fail))
    src = tmp_path / "m.onnx"
    onnx.save_model(cnn_model(), str(src))
    with pytest.raises(OptimizeError, match="the toy pass refuses"):
        pipeline.optimize_file(src, tmp_path / "o.onnx", passes=["upgrade", "fail"])
    assert list(private_tmp.iterdir()) == [] and _workers_of(os.getpid()) == []
    assert not (tmp_path / "o.onnx").exists()


def test_refused_inputs_stop_the_early_check(tmp_path: pathlib.Path, private_tmp: pathlib.Path) -> None:
    src, given = tmp_path / "m.onnx", tmp_path / "in.npz"
    onnx.save_model(cnn_model(), str(src))
    np.savez(given, nope=np.zeros((1, 3, 8, 8), np.float32))
    with pytest.raises(InputError, match="nope"):
        pipeline.optimize_file(src, tmp_path / "o.onnx", check=CheckOptions(inputs_file=given))
    assert list(private_tmp.iterdir()) == [] and _workers_of(os.getpid()) == []


@pytest.mark.parametrize("how", ["no-check", "precision", "one-core"])
def test_nothing_starts_early_without_a_check_or_with_precision_or_one_core(how: str, tmp_path: pathlib.Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    made = []
    monkeypatch.setattr(early.Early, "__init__", lambda self, *a: made.append(a) or pytest.fail("started early"))
    seen = {}
    _register(monkeypatch, "watch", lambda o: _Watch(lambda: seen.setdefault("workers", _workers_of(os.getpid()))))
    src = tmp_path / "m.onnx"
    onnx.save_model(cnn_model(), str(src))
    if how == "no-check":
        report = pipeline.optimize_file(src, tmp_path / "o.onnx", passes=["upgrade", "watch"],
                                        check=CheckOptions(enabled=False))  # fmt: skip
        assert seen["workers"] == [] and report.check is None
    elif how == "precision":
        report = pipeline.optimize_file(src, tmp_path / "o.onnx", passes=["upgrade", "watch", "precision"],
                                        precision="fp16")  # fmt: skip
        assert report.check is not None and report.check.checked
    else:
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
        monkeypatch.setattr(os, "cpu_count", lambda: 1)
        report = pipeline.optimize_file(src, tmp_path / "o.onnx", passes=["upgrade", "watch"])
        assert report.check.ok and report.check.checked
    assert made == []



_RUN_RECORDING_FOLD = """
import json, sys, threading
from passes import cli
from passes.fold import runner
from passes.verify import child

runner.TIMEOUT = 3600.0  # a wait for the check's child would be a hang, not 120 s
asked, request = [], runner.Runner.request

def recording(self, *args, **kwargs):
    borrowed = child.current.get()
    answer = request(self, *args, **kwargs)
    asked.append([threading.current_thread().name, self._own is None and borrowed is not None])
    return answer

runner.Runner.request = recording
code = cli.main(sys.argv[2:])
with open(sys.argv[1], "w") as f:
    json.dump(asked, f)
sys.exit(code)
"""


def test_fold_never_waits_for_the_checks_child(tmp_path: pathlib.Path) -> None:
    """The reruns after a mismatch (a fused Conv compared at ``--rtol 0 --atol 0``) run fold, which confirms
    its folds in onnxruntime: the check's child, done with the comparison, is free and fold borrows it
    between the gate's requests (while the original's side holds it, fold uses a child of its own). Fold
    never waits for a child it cannot take: it waited its 120 s TIMEOUT a request for the child the gate
    held. The run (a few seconds) is a process given 60 s, with fold's TIMEOUT raised: a wait is a hang."""
    src = REPO / "models" / "real" / "small_cnn_opset11_nofold.onnx"
    asked, report = tmp_path / "asked.json", tmp_path / "r.json"
    command = [sys.executable, "-c", _RUN_RECORDING_FOLD, str(asked), str(src), "-o", str(tmp_path / "o.onnx"),
               "--passes", "upgrade,fold,simplify", "--rtol", "0", "--atol", "0", "--no-unfused-fallback", "--report", str(report), "-q"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=tmp_path,
                              env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail("the run stalled: fold waited for the check's child")
    assert done.returncode == 1, done.stderr
    found = json.loads(report.read_text())["check"]["first_difference"]
    assert found["pass_name"] == "simplify" and found["pipelines"][0]["ok"] is True, found
    borrowed = [b for _, b in json.loads(asked.read_text())]
    assert len(borrowed) >= 2 and borrowed[-1], borrowed  # fold in the passes, then in the rerun: borrowed
