"""The precision search hands its checker to the final check (passes/verify/handoff.py, issue #37).

In a run with ``--precision``, the search compares its candidates with the run's original on the
run's check child; the final check reuses what it measured of the original (its inputs, its runs
on every set): the original is prepared once and runs once per set in the whole run, on one child,
and the report and the written model are those of a run whose final check measures it again.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

import onnx
import pytest

from passes import cli
from passes.verify import child, original as original_module
from test_check_isolation import _workers_of
from test_precision import large_values
from test_precision_search import deep_chain

pytestmark = pytest.mark.usefixtures("no_idle_child")  # they count this process's children


def _record(monkeypatch: pytest.MonkeyPatch) -> tuple[list[dict[str, Any]], list[int]]:
    """Every request sent to a check child, and one entry per child process started."""
    requests: list[dict[str, Any]] = []
    started: list[int] = []
    request, start = child.Worker.request, child.Worker.start

    def recorded_request(self: child.Worker, message: dict[str, Any], deadline: float) -> dict[str, Any]:
        requests.append(message)
        return request(self, message, deadline)

    def recorded_start(self: child.Worker) -> child.Worker:
        if not self.alive:
            started.append(1)
        return start(self)

    monkeypatch.setattr(child.Worker, "request", recorded_request)
    monkeypatch.setattr(child.Worker, "start", recorded_start)
    return requests, started


def _run(folder: pathlib.Path, model: onnx.ModelProto, name: str) -> tuple[int, pathlib.Path, dict[str, Any]]:
    source, target, report = folder / "m.onnx", folder / f"{name}.onnx", folder / f"{name}.json"
    if not source.exists():
        onnx.save_model(model, str(source))
    code = cli.main([str(source), "-o", str(target), "--precision", "fp16", "--report", str(report), "-q"])
    return code, target, json.loads(report.read_text())


def _without_times(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_times(v) for k, v in value.items() if k not in ("seconds", "phases", "output")}
    if isinstance(value, list):
        return [_without_times(v) for v in value]
    return value


@pytest.mark.parametrize("make", [large_values, deep_chain], ids=["range-islands", "located-islands"])
def test_the_original_runs_once_per_set_and_the_report_is_unchanged(
    make: Any, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reused: one child, one ``prepare`` (of the run's source), each set run once; measured again
    (the search's checker not reused): two ``prepare``s, each set twice; the same written bytes,
    the same report but for the times (verdicts, sets, sizes proven, errors)."""
    requests, started = _record(monkeypatch)
    code, target, report = _run(tmp_path, make(), "reused")
    assert code == 0, report
    prepares = [r for r in requests if r["op"] == "prepare"]
    assert [pathlib.Path(r["model"]) for r in prepares] == [(tmp_path / "m.onnx").resolve()]
    sets = [json.dumps(r["set"], sort_keys=True) for r in requests if r["op"] == "add_set"]
    assert sets and len(sets) == len(set(sets)), sets
    assert len(started) == 1
    (search,) = [p["stats"] for p in report["passes"] if p["name"] == "precision"]
    assert search["check_ok"] is True and report["check"]["ok"] is True
    assert search["proven_sizes"] == report["check"]["inputs"]["sizes"]
    assert sum(r["op"] == "compare" for r in requests) == search["check_rounds"] + 1  # the search's, the final one

    requests.clear()
    started.clear()
    monkeypatch.setattr(original_module.OriginalSide, "reuse", lambda self: False)
    code, again, measured = _run(tmp_path, make(), "measured")
    assert code == 0, measured
    assert sum(r["op"] == "prepare" for r in requests) == 2
    assert sorted(json.dumps(r["set"], sort_keys=True) for r in requests if r["op"] == "add_set") == sorted(sets * 2)
    assert target.read_bytes() == again.read_bytes()
    assert _without_times(report) == _without_times(measured)
    assert not _workers_of(os.getpid())


def test_a_refused_search_leaves_no_child(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The search still differs after its rounds (exit 1): its checker is not handed over, and no
    check child of this process outlives the run."""
    from passes.precision import islands as islands_module

    monkeypatch.setattr(islands_module, "error_path", lambda *args: [])
    code, target, report = _run(tmp_path, deep_chain(), "refused")
    assert code == 1 and not target.exists()
    assert [p["stats"]["check_ok"] for p in report["passes"] if p["name"] == "precision"] == [False]
    assert not _workers_of(os.getpid())


def test_the_search_alone_measures_its_own_model(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pass run alone (no run's check to hand to): the search compares with the model it was
    given, on a child of its own, which it ends."""
    import onnx_ir as ir

    from passes.precision import PrecisionPass

    requests, started = _record(monkeypatch)
    model = ir.serde.deserialize_model(large_values())
    result = PrecisionPass("fp16")(model)
    assert result.modified
    (prepare,) = [r for r in requests if r["op"] == "prepare"]
    assert pathlib.Path(prepare["model"]).name == "model.onnx"  # the search's copy, not a file of the run
    assert len(started) == 1
    assert not _workers_of(os.getpid())


def test_an_interrupt_in_the_search_ends_the_lent_child(tmp_path: pathlib.Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """An interrupt while the search holds the run's child (here, as its range probe starts): the
    run ends with it, the child is killed (not asked for anything more: a request may be under
    way), and none outlives the run."""
    from passes import pipeline
    from passes.verify import check as check_module

    sent: list[int] = []

    def interrupted(self: Any, above: float | None = None) -> dict[str, float]:
        assert self.keep_worker and self.worker.alive  # the run's child, lent
        sent.append(len(requests))
        raise KeyboardInterrupt

    requests, started = _record(monkeypatch)
    monkeypatch.setattr(check_module.Checker, "magnitudes", interrupted)
    source = tmp_path / "m.onnx"
    onnx.save_model(large_values(), str(source))
    with pytest.raises(KeyboardInterrupt):
        pipeline.optimize_file(source, tmp_path / "o.onnx", precision="fp16")
    assert sent and len(requests) == sent[0]  # nothing asked of it after the interrupt
    assert len(started) == 1 and not (tmp_path / "o.onnx").exists()
    assert not _workers_of(os.getpid())


def test_the_in_memory_route_hands_over_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """``passes.optimize`` on a ``ModelProto``: one child, the original prepared once (the bytes the
    caller gave, not the search's copy), and the result computes in float16 what the original does."""
    import numpy as np

    import passes
    from helpers import ort_run

    requests, started = _record(monkeypatch)
    model = large_values()
    result = passes.optimize(model, precision="fp16")
    assert sum(r["op"] == "prepare" for r in requests) == 1 and len(started) == 1
    assert any(i.data_type == onnx.TensorProto.FLOAT16 for i in result.graph.initializer)
    x = np.random.default_rng(7).standard_normal((4, 16)).astype(np.float32)
    (expected,), (actual,) = ort_run(model, {"x": x}), ort_run(result, {"x": x})
    assert np.abs(actual - expected).max() <= 1e-3 + 1e-2 * np.abs(expected).max()
    assert not _workers_of(os.getpid())
