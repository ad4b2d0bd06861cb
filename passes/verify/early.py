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
sets: :meth:`Early.take` drops it anyway if the options changed) and only for
a model of at most :data:`EARLY_BYTES` (the child holds the original's session
while the parent holds the model: the peak grows by at most that much).

:meth:`Early.close` cancels it whatever the reason (the passes failed, the run
was refused or interrupted, the check never ran): the child is killed for good
(:meth:`passes.verify.child.Worker.stop`: the thread's request ends at once and
none starts another child), the thread is joined and the check's folder removed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from passes.verify import child
from passes.verify.check import Checker

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
    thread, on ``worker`` (the run's check child, which fold's confirmation then no longer borrows:
    its requests would interleave with the thread's, and a large one ends the child).

    :meth:`take` hands the checker over once the original's side is done; :meth:`close` (after the
    taken checker's exit) ends the thread, and cancels what was not taken.
    """

    def __init__(self, original: Any, check: Any, worker: child.Worker) -> None:
        self.check = check
        child.current.set(None)  # fold's confirmation starts its own child if it needs one
        self._worker = worker
        self._checker: Checker | None = new_checker(original, check, worker, rounding=True)
        self._checker.__enter__()
        self._error: BaseException | None = None
        self._done, self._end = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._run, args=(self._checker.start,), daemon=True,
                                        name="optimize-check-original")  # fmt: skip
        self._thread.start()

    def _run(self, start: Callable[[], None]) -> None:
        try:
            start()
        except BaseException as e:  # noqa: BLE001  raised again by take(), in the caller's thread
            self._error = e
        finally:
            self._done.set()
        # A child this thread started (the check's restart after a crash in one set) dies with the
        # thread (PR_SET_PDEATHSIG is the starting thread's): the thread lives until the check is over.
        self._end.wait()

    def take(self, check: Any, rounding: bool) -> Checker | None:
        """The checker, its original's side done, to compare the optimised model with (the caller
        exits it); None when the check's options are no longer those it started with (the caller
        checks anew, on a child of its own). An error the thread met is raised here."""
        if check is not self.check:
            self.close()
            return None
        self._done.wait()
        checker, self._checker = self._checker, None
        if self._error is not None:
            if checker is not None:
                checker.__exit__(None, None, None)
            raise self._error
        assert checker is not None
        checker.rounding = rounding
        return checker

    def close(self) -> None:
        """Ends it, once the check is over (the taken checker exited): what was not taken is
        cancelled (the child killed for good, the folder removed), and the thread ends."""
        checker, self._checker = self._checker, None
        if checker is not None:
            self._worker.stop()
            self._done.wait(_JOIN_SECONDS)
            checker.__exit__(None, None, None)
        self._end.set()
        self._thread.join(_JOIN_SECONDS)
