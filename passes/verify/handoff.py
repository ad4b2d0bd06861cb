"""What a pass that checks its own candidates hands the final check (issue #37).

The precision search (:mod:`passes.precision`) runs the check's original on its inputs and every
set, then compares its candidates with it. :class:`Handoff` lends it the run's check child (started
with the run) and gives the final check (:class:`passes.verify.gate.Gate`) the search's checker,
so that the original runs once per set in the whole run, on one child. Light: no onnx, no numpy.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator
from typing import Any

from passes.verify.gate import CheckOptions, current_check

__all__ = ["Handoff", "handoff", "passes_checked"]


class Handoff:
    """The run's check child, lent to a pass that checks its own candidates while the passes run (the
    precision search), and what that pass measured of the original, for the final check.

    The search takes the child (:meth:`lend`: started with the run, its imports done: no second
    child) and compares its candidates with ``original`` (the run's source, the final check's
    original); once its check passes it :meth:`keep`s its checker, and the final check reuses what
    it measured of the original (its inputs, its outputs on every set, its reruns for noise:
    :meth:`take`) where the final check's options are those the search ran with. The pipeline
    closes it whatever happens (:meth:`close`: a checker not taken is exited, the child left to its
    owner). Outside the passes (the blame's reruns) there is none: a search starts its own child.
    """

    def __init__(self, original: Any, worker: Any) -> None:
        self.original, self.worker = original, worker
        self._kept: tuple[Any, CheckOptions] | None = None

    def lend(self) -> Any:
        """The child, taken for the caller (give it back with :meth:`give_back`); None if there is
        none alive or someone holds it."""
        if self.worker is None or not self.worker.alive or not self.worker.take():
            return None
        return self.worker

    def give_back(self) -> None:
        self.worker.give_back()

    def keep(self, checker: Any, check: CheckOptions) -> None:
        """Keeps ``checker`` (entered, its original this one's), which ran with ``check``, for :meth:`take`
        (the original's session in the child dropped meanwhile: a rerun for noise loaded it)."""
        self.close()
        checker.release()
        self._kept = (checker, check)

    def take(self, check: CheckOptions) -> Any:
        """The kept checker, if it ran with ``check``'s options (the caller exits it), else None."""
        kept, self._kept = self._kept, None
        if kept is not None and _same_options(kept[1], check):
            return kept[0]
        if kept is not None:
            kept[0].__exit__(None, None, None)
        return None

    def close(self) -> None:
        kept, self._kept = self._kept, None
        if kept is not None:
            kept[0].__exit__(None, None, None)


def _same_options(a: CheckOptions, b: CheckOptions) -> bool:
    """The same options field by field (the same objects, or equal plain values: the arrays of
    ``inputs`` have no truth value to compare)."""
    def same(x: Any, y: Any) -> bool:
        return x is y or (isinstance(x, (str, int, float, tuple, type(None))) and type(x) is type(y) and x == y)

    return all(same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(CheckOptions))


#: While the passes run, the run's :class:`Handoff` (None elsewhere).
handoff: contextvars.ContextVar[Handoff | None] = contextvars.ContextVar("passes_check_handoff", default=None)


@contextlib.contextmanager
def passes_checked(check: CheckOptions, handed: Handoff | None) -> Iterator[None]:
    """While the passes run: :data:`current_check` is ``check`` and :data:`handoff` is ``handed``."""
    tokens = current_check.set(check), handoff.set(handed)
    try:
        yield
    finally:
        handoff.reset(tokens[1])
        current_check.reset(tokens[0])
