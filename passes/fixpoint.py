"""Running passes in order, with the fold ⇄ simplify ⇄ decompose loop run to a fixpoint.

fold and simplify feed each other (a folded shape lets a Reshape chain go, a
removed no-op lets a constant fold), and decompose leaves constants and shape
arithmetic behind: consecutive runs of them are repeated until none of them
changes the model (at most :data:`MAX_ROUNDS` rounds; each pass's report
counts its rounds). A repeated pass's runs are merged into one: times and
counters summed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import onnx_ir as ir

from passes.errors import OptimizeError
from passes.phases import counting_nodes
from passes.report import PassRun

__all__ = ["FIXPOINT", "MAX_ROUNDS", "run"]

logger = logging.getLogger("passes.pipeline")

#: The passes that are repeated together while one of them changes the model.
FIXPOINT = frozenset({"fold", "simplify", "decompose"})
MAX_ROUNDS = 8


def run(steps: Sequence[tuple[str, ir.passes.PassBase]], model: ir.Model,
        progress: Callable[[str], None] | None = None) -> list[PassRun]:  # fmt: skip
    """Runs ``steps`` (name, pass) on ``model`` in order, repeating consecutive :data:`FIXPOINT` passes."""
    runs: list[PassRun] = []
    for group in _fixpoint_groups(steps):
        rounds = 0
        while True:
            rounds += 1
            modified = False
            for name, pass_ in group:
                with counting_nodes(progress, f"running {name}" + (f" (round {rounds})" if rounds > 1 else "")):
                    result = _run_pass(name, pass_, model)
                modified |= result.modified
                _merge_run(runs, result, rounds)
            if len(group) == 1 or not modified or rounds >= MAX_ROUNDS:
                break
    return runs


def _fixpoint_groups(steps: list[tuple[str, ir.passes.PassBase]]) -> list[list[tuple[str, ir.passes.PassBase]]]:
    groups: list[list[tuple[str, ir.passes.PassBase]]] = []
    for step in steps:
        if groups and step[0] in FIXPOINT and all(name in FIXPOINT for name, _ in groups[-1]):
            groups[-1].append(step)
        else:
            groups.append([step])
    return groups


def _run_pass(name: str, pass_: ir.passes.PassBase, model: ir.Model) -> PassRun:
    start = time.perf_counter()
    try:
        result = pass_(model)
    except ir.passes.PassError as e:
        cause = _root_cause(e)
        if isinstance(cause, OptimizeError):
            raise cause from e
        raise
    seconds = time.perf_counter() - start
    logger.info("pass %s: %.3f s, modified=%s", name, seconds, result.modified)
    return PassRun(name, seconds, bool(result.modified), dict(getattr(pass_, "stats", None) or {}))


def _merge_run(runs: list[PassRun], result: PassRun, rounds: int) -> None:
    """Adds a repeated pass's run to its first one: times and counters summed, ``rounds`` set."""
    previous = next((r for r in runs if r.name == result.name), None) if rounds > 1 else None
    if previous is None:
        runs.append(result)
        return
    previous.seconds += result.seconds
    previous.modified |= result.modified
    previous.stats = _add_stats(previous.stats, result.stats)
    previous.stats["rounds"] = rounds


def _add_stats(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    result = dict(a)
    for key, value in b.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = _add_stats(result[key], value)
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and isinstance(result.get(key), (int, float)):
            result[key] = result[key] + value
        else:
            result.setdefault(key, value)
    return result


def _root_cause(error: BaseException) -> BaseException:
    """The innermost :class:`OptimizeError` behind onnx_ir's PassError wrapping, if any."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OptimizeError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return error
