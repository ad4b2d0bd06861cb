"""The parent's side of the check's child process (see :mod:`passes.verify.worker`).

:class:`Worker` starts :mod:`passes.verify.worker` (:func:`passes.children.module_command`) on first use, sends
it one request at a time and waits for the answer until a deadline. The wait
is in Python (``select`` on the child's pipe), so SIGINT and SIGTERM reach the
parent's handlers at once; whatever ends the wait (an answer, a deadline, an
interrupt) the child is killed on :meth:`Worker.close`. A child that dies
(a signal such as SIGFPE or SIGSEGV inside onnxruntime, the memory bound)
becomes :class:`WorkerCrashed`, one that runs out of time :class:`WorkerTimeout`,
each naming what it was doing.
"""

from __future__ import annotations

import contextvars
import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from passes import children

__all__ = ["WorkerCrashed", "WorkerError", "WorkerTimeout", "Worker", "default_memory_limit"]


#: The child a route started for its check (``gate.start_worker``), in this thread's context: fold's
#: confirmation (``passes.fold.confirm``) borrows it between the check's requests while it is alive
#: and no other thread holds it (:meth:`Worker.take`), instead of starting a second onnxruntime process.
current: contextvars.ContextVar[Worker | None] = contextvars.ContextVar("passes_verify_worker", default=None)


class WorkerError(Exception):
    """The child could not answer.

    Attributes:
        phase: What it was doing (``"running the original model (try 1 of 4)"``...).
    """

    def __init__(self, message: str, phase: str) -> None:
        super().__init__(message)
        self.phase = phase


class WorkerCrashed(WorkerError):
    """The child died (a signal, the memory bound, an exit)."""


class WorkerTimeout(WorkerError):
    """The child did not answer before the deadline."""


def default_memory_limit() -> int:
    """Three quarters of the physical memory (0 when unknown: no bound)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * 3 // 4)
    except (ValueError, OSError, AttributeError):
        return 0


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


class Worker:
    """One child process running the onnxruntime sessions.

    :meth:`start` may be called early (the optimiser starts it before the
    passes run, so that the child's imports overlap with them); :meth:`request`
    starts it if needed, and again after a crash.

    Args:
        memory_limit: The child's address-space bound in bytes (0: none).
    """

    def __init__(self, memory_limit: int = 0) -> None:
        self.memory_limit = memory_limit
        self.process: subprocess.Popen[bytes] | None = None
        self._buffer = b""
        self._stderr: Any = None
        #: Set by :meth:`stop`: no request starts the child again.
        self.stopped = False
        self._holder = threading.Lock()  # held by whoever :meth:`take` gave the child to

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> Worker:
        """Starts the child unless it is running (it imports numpy and onnxruntime at once)."""
        if self.alive:
            return self
        self.close()
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115  closed in close()
        self.process = subprocess.Popen(
            children.module_command("passes.verify.worker", str(self.memory_limit), str(os.getpid())),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, env=children.child_env(),
            close_fds=True,
        )  # fmt: skip
        self._buffer = b""
        return self

    def request(self, message: dict[str, Any], deadline: float) -> dict[str, Any]:
        """Sends ``message`` and returns the child's result.

        Args:
            message: The request (see :mod:`passes.verify.worker`).
            deadline: ``time.monotonic()`` by which the answer must be in.

        Raises:
            WorkerCrashed: the child died.
            WorkerTimeout: no answer by the deadline (the child is killed).
        """
        if not self.alive:
            if self.stopped:
                raise WorkerCrashed("the check was stopped", "starting the check's process")
            self.start()
        assert self.process is not None and self.process.stdin is not None and self.process.stdout is not None
        phase = "starting the check's process"
        try:
            self.process.stdin.write((json.dumps(message) + "\n").encode())
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):
            raise self._crashed(phase) from None
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            while True:
                line = self._line()
                if line is not None:
                    answer = json.loads(line)
                    if "phase" in answer:
                        phase = answer["phase"]
                        continue
                    return answer["result"]
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self.kill()
                    raise WorkerTimeout("timed out", phase)
                if not selector.select(remaining):
                    continue
                chunk = os.read(self.process.stdout.fileno(), 1 << 16)
                if not chunk:
                    raise self._crashed(phase)
                self._buffer += chunk

    def _line(self) -> bytes | None:
        newline = self._buffer.find(b"\n")
        if newline < 0:
            return None
        line, self._buffer = self._buffer[:newline], self._buffer[newline + 1 :]
        return line

    def _crashed(self, phase: str) -> WorkerCrashed:
        assert self.process is not None
        try:
            code = self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
            code = self.process.returncode
        if code is not None and code < 0:
            how = f"onnxruntime crashed ({_signal_name(-code)})"
            if -code == signal.SIGKILL and self.memory_limit:
                how += " (killed: out of memory?)"
        else:
            how = f"the check's process exited with status {code}"
        tail = self._stderr_tail()
        return WorkerCrashed(how + (f": {tail}" if tail else ""), phase)

    def _stderr_tail(self) -> str:
        if self._stderr is None:
            return ""
        try:
            self._stderr.seek(0, os.SEEK_END)
            size = self._stderr.tell()
            self._stderr.seek(max(0, size - 4000))
            text = self._stderr.read().decode("utf-8", "replace")
        except OSError:
            return ""
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        return lines[-1][:300] if lines else ""

    def take(self) -> bool:
        """Takes the child for the caller alone if no one holds it, without waiting: True when taken
        (give it back with :meth:`give_back`). A thread that drives it beside others (the original's
        side of the check, :mod:`passes.verify.early`) holds it meanwhile; a borrower that finds it
        held (fold's confirmation) uses a child of its own instead of waiting or interleaving requests."""
        return self._holder.acquire(blocking=False)

    def give_back(self) -> None:
        """Gives back the child :meth:`take` gave (from any thread)."""
        self._holder.release()

    def stop(self) -> None:
        """Kills the child for good, from any thread: the request under way ends as
        :class:`WorkerCrashed`, and so does any later one instead of starting another child (the
        original's side of the check run early, :mod:`passes.verify.early`, is cancelled so)."""
        self.stopped = True
        self.kill()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def close(self) -> None:
        """Ends the child (it keeps nothing worth a goodbye: killed at once) and releases its pipes.

        Under coverage (the suite's measurement, docs/tests.md) the child is first let end on its
        own, for at most 10 s: its stdin closed, its loop ends and coverage writes what it ran.
        """
        if "coverage" in sys.modules and self.alive:
            assert self.process is not None and self.process.stdin is not None
            try:
                self.process.stdin.close()
                self.process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()
        process, self.process = self.process, None
        if process is not None:
            for stream in (process.stdin, process.stdout):
                if stream is not None:
                    try:
                        stream.close()
                    except OSError:
                        pass
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
