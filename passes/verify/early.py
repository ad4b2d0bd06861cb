"""The original's side of the check, run while the passes run (issue #37).

What the check does with the original (read its graph, choose its inputs, run
it on them and on every other set, the larger sizes within their budget) does
not depend on the passes. :class:`Early` starts it as soon as the model is
loaded: a thread of the parent drives the check's child through it
(:meth:`passes.verify.check.Checker.start`), so that the child's sessions and
runs take the other core while the passes take this one; the thread waits on
the child's pipe without the GIL and holds it only between answers. At the end
only the optimised model's session and runs remain (the noise rerun of the
original loads it again where outputs differ, as before).

The verdicts are the same as a check run at the end: the same checker, the
same requests, the same time limit (the original's side counts in it). The
pipeline starts it only where nothing the passes do changes what it prepares
(not with the precision pass, whose result sets the check's tolerance and
sets: :meth:`Early.compare` drops it anyway if the options changed) and only for
a model of at most :data:`EARLY_BYTES` (the child holds the original's session
while the parent holds the model: the peak grows by at most that much).

The thread holds the child (:meth:`passes.verify.child.Worker.take`) only while it
works, the original's side and then the comparison; fold's confirmation borrows
it only when no one holds it, else uses a child of its own: nobody waits for it.

:meth:`Early.close` cancels it whatever the reason (the passes failed, the run
was refused or interrupted, the check never ran): the child is killed for good
(:meth:`passes.verify.child.Worker.stop`: the thread's request ends at once and
none starts another child), the thread is joined and the check's folder removed.
"""

from __future__ import annotations

import threading
from typing import Any

from passes.verify import child
from passes.verify.check import Checker
from passes.verify.result import CheckResult

__all__ = ["EARLY_BYTES", "Early", "new_checker"]

#: The original's files (model and external data) larger than this are checked at the end only.
EARLY_BYTES = 256 << 20

#: Seconds :meth:`Early.close` waits for the thread once the child is killed (it ends at once:
#: its request fails; only the reading of the original's graph is not interrupted).
_JOIN_SECONDS = 60.0


def new_checker(original: Any, check: Any, worker: child.Worker | None, rounding: bool) -> Checker:
    """The check's :class:`Checker` of ``original`` with the run's check options ``check`` (a
    :class:`passes.verify.gate.CheckOptions`), not yet entered."""
    return Checker(
        original, inputs=check.inputs, inputs_file=check.inputs_file, dims=dict(check.dims),
        shapes=dict(check.shapes), rtol=check.rtol, atol=check.atol, seed=check.seed, timeout=check.timeout,
        memory_limit=check.memory_limit, worker=worker, rounding=rounding, precision=check.precision,
        precision_tolerance=check.precision_tolerance, free_dims=dict(check.free_dims) if check.static else None,
    )  # fmt: skip


class Early:
    """The original's side of the check of ``original`` (a path) with ``check``, started now in a
    thread, on ``worker`` (the run's check child, taken by the caller: :meth:`child.Worker.take`).
    The thread holds the child while it works, so that fold's confirmation, which finds it held,
    uses a child of its own rather than interleave its requests with the thread's; it gives the
    child back once the original's side is done (fold may borrow it until :meth:`compare`; if
    fold's request ends it, a crash or a large request, the comparison restores the original's
    inputs and outputs first) and again once the comparison is done (the gate's reruns after a
    mismatch let fold borrow it between their requests, as at the end).

    :meth:`compare` gives the thread the optimised model once it is saved (compared while the
    caller runs the ONNX checker on it); :meth:`result` hands the checker and its result over;
    :meth:`close` (after the handed checker's exit) ends the thread and cancels what was not handed over.
    """

    def __init__(self, original: Any, check: Any, worker: child.Worker) -> None:
        self.check = check
        self._worker = worker
        self._held = True  # the child taken for the thread (guarded by _lock)
        self._lock = threading.Lock()
        self._checker: Checker | None = new_checker(original, check, worker, rounding=True)
        self._checker.__enter__()
        self._error: BaseException | None = None
        self._job: tuple[Any, bool] | None = None
        self._result: CheckResult | None = None
        self._go, self._compared, self._end = threading.Event(), threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._run, args=(self._checker,), daemon=True,
                                        name="optimize-check-original")  # fmt: skip
        self._thread.start()

    def _give_back(self, unless_asked: bool) -> None:
        """Gives the child back if the thread holds it (``unless_asked``: and no comparison was asked)."""
        with self._lock:
            if self._held and not (unless_asked and self._job is not None):
                self._held = False
                self._worker.give_back()

    def _run(self, checker: Checker) -> None:
        try:
            try:
                checker.start()
            finally:
                self._give_back(unless_asked=True)  # (fold may borrow it until compare())
            self._go.wait()  # compare(), or close()
            if self._job is not None:
                checker.rounding = self._job[1]
                self._result = checker.check(self._job[0])
        except BaseException as e:  # noqa: BLE001  raised again by result(), in the caller's thread
            self._error = e
        finally:
            self._give_back(unless_asked=False)
            self._compared.set()
        # A child this thread started (the check's restart after a crash in one set) dies with the
        # thread (PR_SET_PDEATHSIG is the starting thread's): the thread lives until the check is over.
        self._end.wait()

    def compare(self, staged: Any, check: Any, rounding: bool) -> bool:
        """Starts the comparison of ``staged`` with the original, after its side, on the thread;
        False (and nothing started: the caller checks anew, on a child of its own) when the check's
        options are no longer those it started with, or the child is held by someone else."""
        with self._lock:
            if self._checker is not None and check is self.check and (self._held or self._worker.take()):
                self._held = True
                self._job = (staged, rounding)
        if self._job is None:
            self.close()
            return False
        self._go.set()
        return True

    def result(self) -> tuple[Checker, CheckResult]:
        """The checker (the caller exits it; it holds the original's inputs for the locator and the
        reruns) and what :meth:`Checker.check` found; an error the thread met is raised here."""
        self._compared.wait()
        checker, self._checker = self._checker, None
        assert checker is not None
        if self._error is not None or self._result is None:
            checker.__exit__(None, None, None)
            raise self._error or RuntimeError("the check's thread gave no result")
        return checker, self._result

    def close(self) -> None:
        """Ends it, once the check is over (the handed checker exited): what was not handed over is
        cancelled (the child killed for good, the folder removed), and the thread ends."""
        checker, self._checker = self._checker, None
        if checker is not None:
            self._worker.stop()
            self._go.set()
            self._compared.wait(_JOIN_SECONDS)
            checker.__exit__(None, None, None)
        self._go.set()
        self._end.set()
        self._thread.join(_JOIN_SECONDS)
