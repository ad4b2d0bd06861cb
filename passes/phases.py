"""The phases of a run (load, passes, save, check): their times, and what a progress display is told.

:func:`passes.pipeline.optimize_file` runs each phase inside :meth:`Phases.phase`,
which times it (the report's ``phases``) and tells the ``progress`` callback.
That callback is either a plain ``Callable[[str], None]`` (called with a short
message as each phase or pass starts) or a :class:`Listener`, which is also told
the amount of work of a phase that has one (the bytes of external data to
write) as it is done, and when each phase ends.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Callable, Iterator

__all__ = ["Listener", "Phases", "counting_nodes", "node_done"]

# The current pass's node counter (a Listener's ``advance``), if a progress display wants one.
_nodes: contextvars.ContextVar[Callable[[int], None] | None] = contextvars.ContextVar("nodes", default=None)


def node_done(amount: int = 1) -> None:
    """A pass has handled ``amount`` more nodes (shown with the rate on a terminal; else nothing)."""
    advance = _nodes.get()
    if advance is not None:
        advance(amount)


@contextlib.contextmanager
def counting_nodes(progress: object, message: str) -> Iterator[None]:
    """Within the block, :func:`node_done` advances ``progress``'s line ``message`` (a :class:`Listener`).

    A plain callback is only told the message.
    """
    if not isinstance(progress, Listener):
        if progress is not None:
            progress(message)  # type: ignore[operator]
        yield
        return
    progress.start(message, None, "nodes")
    token = _nodes.set(progress.advance)
    try:
        yield
    finally:
        _nodes.reset(token)


class Listener:
    """A progress display (see :class:`passes.cli.progress.TerminalProgress`). Does nothing by itself."""

    def __call__(self, message: str) -> None:
        """A phase or a pass starts, with no amount of work known."""
        self.start(message)

    def start(self, message: str, total: int | None = None, unit: str = "") -> None:
        """A phase starts; ``total`` is its amount of work in ``unit`` (``"B"`` for bytes), if known."""

    def advance(self, amount: int) -> None:
        """``amount`` more of the current phase's work is done."""

    def end(self) -> None:
        """The current phase ended (normally or not)."""


class Phases:
    """Times the phases of one run and reports them to ``progress``.

    Attributes:
        seconds: Each phase's time so far, by name, in the order they ran.
    """

    def __init__(self, progress: Callable[[str], None] | None = None) -> None:
        self.progress = progress
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str, message: str | None, total: int | None = None,
              unit: str = "") -> Iterator[Callable[[int], None]]:  # fmt: skip
        """Times the block as phase ``name``; yields the callback that reports work done.

        With ``message`` None the phase is only timed (its steps report themselves).
        """
        listener = self.progress if isinstance(self.progress, Listener) and message is not None else None
        if listener is not None:
            listener.start(message, total, unit)
        elif self.progress is not None and message is not None:
            self.progress(message)
        start = time.perf_counter()
        try:
            yield listener.advance if listener is not None else _ignore
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
            if listener is not None:
                listener.end()


def _ignore(amount: int) -> None:
    pass
