"""The garbage collector during a run: paused while the model loads, the loaded model out of its scans.

CPython's cyclic collector makes a full collection each time the objects that
survived the last one grow by a quarter. Loading a 50,000-node model makes
millions of objects and no garbage, and so triggers several full collections,
and every later one rescans the whole model: a fifth of the CPU time of
``--passes upgrade`` on such a chain went there, with nothing collected. So
the collector is paused while the model loads (:func:`loading`), and what is
alive after the load is frozen (``gc.freeze``: left out of later collections;
the garbage the passes make is still collected) until :func:`thaw`, which the
run calls once it has released the model, and on every way out. A step that
makes an object per node for its own use is run paused too (:func:`paused`).

Each pass makes objects that outlive it (a decomposition's nodes, a fold's
tensors): unfrozen, every later full collection would rescan them all (on the
50,000-node chain the default pipeline spent 4 of its 15 CPU seconds in 19 full
collections). :func:`settle`, which the pass loop calls after each pass, collects
once what the pass left (a scan of the objects made since the last settle only)
and freezes the rest, so each object is scanned about once. What a later pass
drops of a frozen object waits for :func:`thaw`, as the loaded model's does.

A caller that froze objects of its own keeps them frozen: nothing is frozen
then (the run just collects as usual).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["loading", "paused", "settle", "thaw"]

_RARE = 1000  # young collections between two full ones while frozen (CPython's default: 10)
_thresholds: list[int] = []  # the collector's thresholds before the load, restored at the thaw
_frozen = False  # whether the objects in the permanent generation are ours to thaw


@contextlib.contextmanager
def paused(*, freeze: bool = False) -> Iterator[None]:
    """Within the block the collector is paused (a collector the caller paused stays paused).

    For a step that makes an object or more per node, all alive until it ends: the upgrade's
    plan of every node, the proto the save serialises. Each full collection their growth
    triggers would rescan them all and free nothing (50k nodes: 3 in the plan, 3 in the
    serialisation, ~0.25 s in all); the garbage the step makes is collected after it.

    ``freeze``: what the step leaves alive becomes part of the model (the upgrade's new nodes
    and inputs): when the run froze the loaded model (:func:`loading`), it is frozen with it,
    before the collector resumes (its first collection would scan it all: ~0.07 s after the
    upgrade of 50k nodes); :func:`thaw` returns it with the rest.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
        if freeze and _frozen:
            gc.freeze()
    finally:
        if enabled:
            gc.enable()


@contextlib.contextmanager
def loading() -> Iterator[None]:
    """Within the block the collector is paused; after it, every live object is frozen (see the
    module docstring) unless something else froze objects already."""
    global _frozen
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
        if not _frozen and gc.get_freeze_count() == 0:
            # before the collector resumes: its first collection would scan every object the
            # load made (50k nodes: ~0.2 s), all alive; frozen, they are out of its reach
            gc.freeze()
            _frozen = True
            _thresholds[:] = gc.get_threshold()
            gc.set_threshold(_thresholds[0], _thresholds[1], _RARE)
    finally:
        if enabled:
            gc.enable()


def thaw() -> None:
    """Returns what :func:`loading` froze to the collector (nothing if it froze nothing)."""
    global _frozen
    if _frozen:
        gc.unfreeze()
        gc.set_threshold(*_thresholds)
        _frozen = False


def settle() -> None:
    """After a step of the run: collects what it left behind and freezes what it made and kept
    (see the module docstring); nothing unless :func:`loading` froze the load."""
    if _frozen:
        gc.collect()
        gc.freeze()
