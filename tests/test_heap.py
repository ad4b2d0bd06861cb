"""The collector during a run (passes.heap): paused while the model loads, the loaded model frozen
out of its scans, everything handed back to it when the run ends, on every way out."""

from __future__ import annotations

import gc
import pathlib

import onnx
import pytest

import passes
from passes import heap
from passes.errors import InputError


def test_loading_pauses_then_freezes_and_thaw_gives_back() -> None:
    assert gc.get_freeze_count() == 0
    with heap.loading():
        assert not gc.isenabled()
        kept = [[] for _ in range(1000)]
    assert gc.isenabled() and gc.get_freeze_count() >= len(kept)
    heap.thaw()
    assert gc.get_freeze_count() == 0
    heap.thaw()  # twice: nothing to give back


def test_paused_pauses_then_resumes_on_every_way_out() -> None:
    with heap.paused():
        assert not gc.isenabled()
    assert gc.isenabled() and gc.get_freeze_count() == 0  # paused only: nothing frozen
    with pytest.raises(KeyError):
        with heap.paused():
            raise KeyError("out")
    assert gc.isenabled()
    gc.disable()
    try:
        with heap.paused():
            pass
        assert not gc.isenabled()  # the caller's pause stands
    finally:
        gc.enable()


def test_what_a_paused_step_keeps_joins_the_frozen_model() -> None:
    with heap.loading():
        pass
    try:
        before = gc.get_freeze_count()
        with heap.paused():
            passing = [[] for _ in range(1000)]
        assert gc.isenabled() and gc.get_freeze_count() == before  # only what asks to be kept
        with heap.paused(freeze=True):
            kept = [[] for _ in range(1000)]
        assert gc.isenabled() and gc.get_freeze_count() >= before + len(kept) + len(passing)
    finally:
        heap.thaw()
    assert gc.get_freeze_count() == 0


def test_the_upgrade_and_the_save_leave_the_collector_running(tmp_path: pathlib.Path) -> None:
    """The upgrade pauses the collector while it plans and commits, the save while it serialises."""
    source = pathlib.Path(__file__).resolve().parents[1] / "models" / "demo.onnx"
    passes.optimize(str(source), output=str(tmp_path / "out.onnx"), check=False, passes=["upgrade"])
    assert gc.isenabled() and gc.get_freeze_count() == 0
    onnx.checker.check_model(str(tmp_path / "out.onnx"), full_check=True)


def test_a_caller_that_froze_keeps_its_objects_frozen() -> None:
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with heap.loading():
            pass
        heap.thaw()
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()


def test_a_paused_collector_stays_paused() -> None:
    gc.disable()
    try:
        with heap.loading():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
        heap.thaw()


@pytest.mark.parametrize("args", [{}, {"passes": ["nope"]}, {"target_opset": 7}])
def test_every_run_gives_the_model_back_to_the_collector(tmp_path: pathlib.Path, args: dict) -> None:
    """A run that writes, one refused before the load, one a pass refuses after it."""
    source = pathlib.Path(__file__).resolve().parents[1] / "models" / "demo.onnx"
    try:
        passes.optimize(str(source), output=str(tmp_path / "out.onnx"), check=False, **args)
    except InputError:
        assert args
    except passes.OptimizeError:
        assert args
    assert gc.get_freeze_count() == 0 and gc.isenabled()
    if not args:
        onnx.checker.check_model(str(tmp_path / "out.onnx"))


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_settle_collects_what_a_pass_dropped_and_freezes_what_it_kept() -> None:
    before = gc.get_threshold()
    with heap.loading():
        pass
    try:
        assert gc.get_threshold()[2] > before[2]  # full collections rare while the load is frozen
        frozen = gc.get_freeze_count()
        kept = [_Cycle() for _ in range(100)]
        dropped = [_Cycle() for _ in range(100)]
        del dropped  # cyclic garbage a pass leaves
        heap.settle()
        assert not any(isinstance(o, _Cycle) for o in gc.get_objects())  # collected, or frozen out of scans
        assert frozen + len(kept) <= gc.get_freeze_count() < frozen + len(kept) + 100
    finally:
        heap.thaw()
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == before
    heap.settle()  # nothing frozen: nothing happens
    assert gc.get_freeze_count() == 0


def test_settle_freezes_nothing_for_a_caller_that_froze() -> None:
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with heap.loading():
            pass
        kept = [_Cycle() for _ in range(10)]
        heap.settle()
        assert gc.get_freeze_count() == frozen and kept
    finally:
        heap.thaw()
        gc.unfreeze()
