"""Where fold's confirmation runs onnxruntime: the check's child while it is alive, else a child of
the pass's own (:class:`Runner`), with one idle child kept between the runs of a process."""

from __future__ import annotations

import atexit
import logging
import threading
import time
from typing import Any

__all__ = ["TIMEOUT", "Runner", "close_idle"]

logger = logging.getLogger("passes.fold.confirm")

#: Seconds onnxruntime may take for one session.
TIMEOUT = 120.0

#: One idle child kept between runs of this process (guarded by ``_IDLE_LOCK``): a program or a
#: test suite that optimises many models in one process pays onnxruntime's start-up once, not
#: once per fold pass. It runs only stateless requests (``constants``), so what one run asked
#: cannot change what the next computes; at most one is kept, and it ends with this process
#: (``atexit``, and the child watches its parent).
_idle: Any = None
_IDLE_LOCK = threading.Lock()


def _take_idle() -> Any:
    global _idle
    with _IDLE_LOCK:
        worker, _idle = _idle, None
    return worker if worker is not None and worker.alive else None


def _keep_idle(worker: Any) -> None:
    global _idle
    if not worker.alive:
        worker.close()
        return
    with _IDLE_LOCK:
        extra, _idle = _idle, worker
    if extra is not None:
        extra.close()


@atexit.register
def close_idle() -> None:
    """Ends the idle onnxruntime child a run of this process left waiting for the next, if any
    (at exit, and where a test needs to start from none)."""
    worker = _take_idle()
    if worker is not None:
        worker.close()


class Runner:
    """Where the sessions run: the check's child while it is alive and free (no other thread holds
    it: :meth:`passes.verify.child.Worker.take`; while the original's side of the check runs on it
    beside the passes, :mod:`passes.verify.early`, it is not), else a child of its own. It never
    waits for the check's child: a child it cannot take now is one it does without.

    Its own child is taken from the idle one a previous run of this process left (or started)
    on first use (:meth:`prestart`); :meth:`close` hands it back as the idle one, so that one
    onnxruntime process at most waits between runs, and none after a request that held much
    memory (``release``).
    """

    def __init__(self) -> None:
        self._own: Any = None
        self._lock = threading.Lock()
        #: The own child came from the idle slot and has not answered yet: if it died while it
        #: waited, the first request starts a fresh one instead of failing.
        self._reused = False

    @staticmethod
    def _borrow() -> Any:
        """The check's child, taken (the caller gives it back), if it is alive and free now; else None."""
        from passes.verify.child import current

        borrowed = current.get()
        if borrowed is None or not borrowed.alive or not borrowed.take():
            return None
        if borrowed.alive:
            return borrowed
        borrowed.give_back()
        return None

    def own_worker(self) -> Any:
        """Its own child (the idle one a previous run left, or a new one), not started yet if new."""
        if self._own is None:
            from passes.verify.child import Worker, default_memory_limit

            self._own = _take_idle()
            self._reused = self._own is not None
            if self._own is None:
                self._own = Worker(default_memory_limit())
        return self._own

    def prestart(self) -> None:
        """Starts the child now, so that its imports overlap with the rest of the sweep: its own,
        unless the check's is alive and free (then that one is used)."""
        with self._lock:
            borrowed = self._borrow()
            if borrowed is not None:
                borrowed.give_back()
                return
            try:
                self.own_worker().start()
            except OSError as e:
                logger.debug("cannot start onnxruntime's process yet: %s", e)

    def request(self, request: dict[str, Any], release: bool) -> dict[str, Any]:
        """The child's answer (``release``: end the child afterwards, it holds much memory).

        Raises:
            WorkerError, OSError: the child could not answer.
        """
        from passes.verify.child import WorkerCrashed

        with self._lock:
            borrowed = self._borrow()
            worker = borrowed if borrowed is not None else self.own_worker()
            try:
                try:
                    return worker.request(request, time.monotonic() + TIMEOUT)
                except WorkerCrashed:
                    if not (self._reused and worker is self._own):
                        raise
                    worker.close()  # it died while idle: once more with a fresh child
                    return worker.request(request, time.monotonic() + TIMEOUT)
            finally:
                if worker is self._own:
                    self._reused = False
                if release:
                    worker.close()
                if borrowed is not None:
                    borrowed.give_back()

    def close(self) -> None:
        with self._lock:
            if self._own is not None:
                _keep_idle(self._own)
                self._own = None
