"""Delta debugging's minimisation (Zeller and Hildebrandt, "Simplifying and Isolating
Failure-Inducing Input", 2002): ``--repro``'s search gives back the region's cuts with it."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["ddmin"]


def ddmin(items: list[str], holds: Callable[[list[str]], bool]) -> list[str]:
    """Delta debugging (Zeller's ``ddmin``): a subset of ``items`` for which ``holds`` is still
    true and from which no single item can be removed (``holds(items)`` must be true)."""
    n = 2
    while len(items) >= 2:
        chunks = [c for c in (items[i * len(items) // n : (i + 1) * len(items) // n] for i in range(n)) if c]
        complements = [[x for x in items if x not in c] for c in chunks] if n > 2 else []
        reduced = next((c for c in chunks if holds(c)), None)
        if reduced is not None:
            items, n = reduced, 2
            continue
        reduced = next((c for c in complements if holds(c)), None)
        if reduced is not None:
            items, n = reduced, max(n - 1, 2)
            continue
        if n >= len(items):
            break
        n = min(len(items), 2 * n)
    return [] if len(items) == 1 and holds([]) else items
