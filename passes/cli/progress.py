"""The progress line the ``optimize`` command shows on a terminal.

One line on stderr, redrawn in place (``\\r``): the phase, and for a phase
with a known amount of work (writing external data) the bytes done, the total
and the rate; a pass, the nodes it has handled and the rate; a phase without
either (loading with its checks, the check) shows its elapsed time, redrawn
every quarter second by a timer thread so that a long phase is visibly alive.
When a phase ends its line is left with the time it took. Only on a
terminal, never with ``-q`` (the command decides: :class:`TerminalProgress`
draws wherever it is given).
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from typing import TextIO

from passes.phases import Listener

__all__ = ["TerminalProgress", "format_bytes"]

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def format_bytes(n: float) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    for unit in _UNITS:
        if abs(n) < 1024 or unit == _UNITS[-1]:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


class TerminalProgress(Listener):
    """Draws the progress line on ``stream`` (see the module docstring)."""

    def __init__(self, stream: TextIO | None = None, prog: str = "optimize", interval: float = 0.25) -> None:
        self.stream = stream or sys.stderr
        self.prog = prog
        self.interval = interval
        self._lock = threading.RLock()
        self._message: str | None = None
        self._total: int | None = None
        self._unit = ""
        self._done = 0
        self._start = 0.0
        self._drawn = 0.0
        self._timer: threading.Thread | None = None
        self._stop = threading.Event()

    def start(self, message: str, total: int | None = None, unit: str = "") -> None:
        with self._lock:
            if self._message is not None:
                self.end()
            self._message, self._total, self._unit, self._done = message, total, unit, 0
            self._start = time.perf_counter()
            self._draw()
            if self._timer is None:
                self._timer = threading.Thread(target=self._tick, name="progress", daemon=True)
                self._timer.start()

    def advance(self, amount: int) -> None:
        with self._lock:
            self._done += amount
            if time.perf_counter() - self._drawn >= self.interval:
                self._draw()

    def end(self) -> None:
        with self._lock:
            if self._message is None:
                return
            self._draw(final=True)
            self.stream.write("\n")
            self.stream.flush()
            self._message = None

    def clear(self) -> None:
        """Erases the line (before another message is printed); the next redraw brings it back."""
        with self._lock:
            if self._message is not None:
                self.stream.write("\r\033[K")
                self.stream.flush()

    def close(self) -> None:
        """Ends the current line and stops the timer thread."""
        self.end()
        self._stop.set()
        if self._timer is not None and self._timer is not threading.current_thread():
            self._timer.join(timeout=1)

    def _tick(self) -> None:
        while not self._stop.wait(self.interval):
            with self._lock:
                if self._message is not None:
                    self._draw()

    def _text(self, final: bool) -> str:
        elapsed = time.perf_counter() - self._start
        text = f"{self.prog}: {self._message}"
        if self._unit == "B" and (self._total or self._done):
            rate = f"{format_bytes(self._done / elapsed)}/s" if elapsed > 0 else "-"
            if final:
                return f"{text}: {format_bytes(self._done)} in {elapsed:.2f} s ({rate})"
            of = f" of {format_bytes(self._total)} ({100 * self._done / self._total:.0f}%)" if self._total else ""
            return f"{text}: {format_bytes(self._done)}{of}, {rate}, {elapsed:.1f} s"
        if self._unit == "nodes" and self._done:
            rate = f"{self._done / elapsed:,.0f} nodes/s" if elapsed > 0 else "-"
            if final:
                return f"{text}: {self._done:,} nodes in {elapsed:.2f} s ({rate})"
            return f"{text}: {self._done:,} nodes, {rate}, {elapsed:.1f} s"
        return f"{text}: {elapsed:.2f} s" if final else f"{text}... {elapsed:.1f} s"

    def _draw(self, final: bool = False) -> None:
        width = shutil.get_terminal_size((100, 20)).columns
        text = self._text(final)[: max(20, width - 1)]
        self.stream.write(f"\r\033[K{text}")
        self.stream.flush()
        self._drawn = time.perf_counter()
