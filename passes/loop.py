"""The one pass loop: every route (the command, ``passes.optimize``, ``build_pass_manager``) runs this.

The passes run in order as an ``onnx_ir`` pass manager. Consecutive passes
whose spec ``repeats`` (fold, simplify and decompose feed each other: a
folded shape lets a Reshape chain go, a removed no-op lets a constant fold,
decompose leaves shape arithmetic behind) form a nested manager that repeats
them until a whole round changes nothing, at most :data:`MAX_ROUNDS` rounds;
within it a pass is not run again while nothing changed since a run of it that
left the graph settled (:class:`_Changes`).

Each pass is wrapped so that its runs are recorded in one :class:`Record`:
a repeated pass's runs merge into one :class:`~passes.report.PassRun` (times
and counters summed, ``rounds`` counted), and the progress display is told
which pass and round is running.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import onnx_ir as ir

from passes import heap
from passes.errors import OptimizeError
from passes.ir import known
from passes.phases import counting_nodes
from passes.report import PassRun

__all__ = ["MAX_ROUNDS", "Record", "build", "run"]

logger = logging.getLogger("passes.pipeline")

MAX_ROUNDS = 8


class Record:
    """What the passes of one loop did, one :class:`PassRun` per step, in first-run order."""

    def __init__(self, progress: Callable[[str], None] | None = None, runs: list[PassRun] | None = None) -> None:
        """``runs``: the list to record into (a caller's, readable after a pass raised)."""
        self.progress = progress
        self.runs: list[PassRun] = [] if runs is None else runs
        self._by_step: dict[int, PassRun] = {}
        self._calls: dict[int, int] = {}

    def call(self, step: int, name: str, pass_: ir.passes.PassBase, model: ir.Model) -> ir.passes.PassResult:
        rounds = self._calls[step] = self._calls.get(step, 0) + 1
        start = time.perf_counter()
        kept = known.inferred(model)
        try:
            with counting_nodes(self.progress, f"running {name}" + (f" (round {rounds})" if rounds > 1 else "")):
                result = pass_(model)
        except OptimizeError as e:  # the report of a refused run says which pass refused, with its stats
            cause = _root_cause(e)
            self._add(step, PassRun(name, time.perf_counter() - start, False,
                                    dict(getattr(pass_, "stats", None) or {}), str(cause)), rounds)  # fmt: skip
            raise
        if result.modified and known.inferred(model) is kept:  # (a pass that kept one kept it as it left the model)
            known.forget_inferred(model)
        heap.settle()  # what the pass made and kept out of later collections' scans (counted in its time)
        seconds = time.perf_counter() - start
        logger.info("pass %s: %.3f s, modified=%s", name, seconds, result.modified)
        self._add(step, PassRun(name, seconds, bool(result.modified), dict(getattr(pass_, "stats", None) or {})),
                  rounds)  # fmt: skip
        return result

    def _add(self, step: int, run: PassRun, rounds: int) -> None:
        previous = self._by_step.get(step)
        if previous is None:
            self._by_step[step] = run
            self.runs.append(run)
            return
        previous.seconds += run.seconds
        previous.modified |= run.modified
        previous.stats = _add_stats(previous.stats, run.stats)
        previous.stats["rounds"] = rounds
        previous.error = run.error


class _Changes:
    """How many times a pass of one loop reported a change: a repeating pass whose last run on this
    model left it settled, with no change since, is not run again (the run would change nothing).

    A pass is settled after a run that changed nothing (the passes are deterministic functions
    of the graph) or after a run that says so itself (``settled``: simplify, whose last round
    changed nothing).
    """

    def __init__(self) -> None:
        self.count = 0
        self.settled_at: dict[int, int] = {}  # step -> the count when its last run left it settled

    def reset(self) -> None:
        self.count, self.settled_at = 0, {}

    def skip(self, step: int) -> bool:
        return self.settled_at.get(step) == self.count

    def ran(self, step: int, pass_: ir.passes.PassBase, result: ir.passes.PassResult) -> None:
        if result.modified:
            self.count += 1
        if not result.modified or getattr(pass_, "settled", False):
            self.settled_at[step] = self.count
        else:
            self.settled_at.pop(step, None)


class _Recorded(ir.passes.InPlacePass):
    """A pass whose runs go into a :class:`Record` (in a repeating group, skipped when settled)."""

    def __init__(self, name: str, inner: ir.passes.PassBase, record: Record, changes: _Changes | None = None) -> None:
        super().__init__()
        self.name, self.inner, self.record, self.changes = name, inner, record, changes

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        if self.changes is None:
            return self.record.call(id(self), self.name, self.inner, model)
        if self.changes.skip(id(self)):
            logger.info("pass %s: skipped, nothing changed since its last run settled", self.name)
            return ir.passes.PassResult(model, modified=False)
        result = self.record.call(id(self), self.name, self.inner, model)
        self.changes.ran(id(self), self.inner, result)
        return result

    def __repr__(self) -> str:
        return f"{self.name}: {self.inner!r}"


class _Repeating(ir.passes.InPlacePass):
    """A group of repeating passes: their manager, with what settled forgotten at each run (a manager
    may run again on another model, or on this one changed by the caller in between)."""

    def __init__(self, manager: ir.passes.PassManager, changes: _Changes) -> None:
        super().__init__()
        self.manager, self.changes = manager, changes

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        self.changes.reset()
        return self.manager(model)

    def __repr__(self) -> str:
        return repr(self.manager)


class _Nothing(ir.passes.InPlacePass):
    """What a run of no pass does (onnx_ir's managers take at least one pass)."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        return ir.passes.PassResult(model, modified=False)


def build(steps: Sequence[tuple[str, ir.passes.PassBase, bool]], record: Record) -> ir.passes.PassManager:
    """The pass manager running ``steps`` (name, pass, repeats) in order, repeating consecutive repeaters
    (no step: a manager that changes nothing, as the search for the pass that brought a mismatch
    runs the load and the save alone)."""
    if not steps:
        return ir.passes.PassManager([_Nothing()], steps=1)
    groups: list[list[tuple[str, ir.passes.PassBase, bool]]] = []
    for step in steps:
        if groups and step[2] and groups[-1][-1][2]:
            groups[-1].append(step)
        else:
            groups.append([step])
    managed: list[ir.passes.PassBase] = []
    for group in groups:
        if len(group) > 1:
            changes = _Changes()
            wrapped = [_Recorded(name, pass_, record, changes) for name, pass_, _ in group]
            managed.append(_Repeating(ir.passes.PassManager(wrapped, steps=MAX_ROUNDS, early_stop=True), changes))
        else:
            managed.extend(_Recorded(name, pass_, record) for name, pass_, _ in group)
    return ir.passes.PassManager(managed, steps=1)


def run(manager: ir.passes.PassManager, model: ir.Model) -> ir.passes.PassResult:
    """Runs ``manager`` on ``model``; what a pass raised is raised as itself, not wrapped in the
    managers' PassErrors (a pass's :class:`OptimizeError` is the user's one-line error)."""
    known.begin(model)  # the types the passes learn and keep up to date, for this run only
    try:
        return manager(model)
    except ir.passes.PassError as e:
        cause = _root_cause(e)
        if cause is not e:
            raise cause from e
        raise
    finally:
        known.end(model)


def _add_stats(a: dict[str, Any], b: dict[str, Any], nested: bool = False) -> dict[str, Any]:
    """The stats of two runs of a pass, summed. Inside a table of counts (``nested``), a count that
    sums to 0 is dropped, and so is a table left empty: a pass that reports the change since its
    previous run (simplify's ``fusable_at_higher_opset``: found in an early run, gone by the last)
    would otherwise show ``Attention@23 x0``."""
    result = dict(a)
    for key, value in b.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = _add_stats(result[key], value, nested=True)
            if not result[key] and (a[key] or value):
                del result[key]
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and isinstance(result.get(key), (int, float)):
            result[key] = result[key] + value
            if nested and result[key] == 0:
                del result[key]
        else:
            result.setdefault(key, value)
    return result


def _root_cause(error: BaseException) -> BaseException:
    """What a pass raised, behind onnx_ir's PassError wrapping (plain ``PassError``s, ``raise ... from``)."""
    seen: BaseException | None = error
    while seen is not None:
        if type(seen) is not ir.passes.PassError or isinstance(seen, OptimizeError):
            return seen
        seen = seen.__cause__
    return error
