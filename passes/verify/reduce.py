"""The search for the smallest reproduction of a failed check (``--repro``).

Given two models that differ on some inputs (the original and the optimised
one, or one of their subgraphs each: :class:`Pair`), :meth:`Search.run`:

1. compares every value both name (the locator's comparison, else its own)
   and takes the *target*: the first value that differs, upstream of an output
   that differs, whose optimised value stands for the original's (fed the
   original's value there, the optimised model's outputs are no further off:
   a Conv into which a BatchNormalization was fused keeps the Conv's name, not
   its value); else that output;
2. builds the *region* of each model that computes the target from the values
   nearest to it that both name and that agree (:func:`passes.verify.region.cone`),
   the original's values of them captured in the check's child as the regions
   need them (within a byte budget), and asks the child whether the two
   regions, fed the same values, still differ beyond the target's tolerance.
   If not, the region grows (the cuts given up level by level, doubling, and
   at worst all: the whole cone from the graph inputs), then delta debugging
   (:func:`passes.verify.ddmin.ddmin`) over the region's nodes (the values they
   make, where it may be cut) gives back as many cuts as the difference allows;
3. where the region is one If, Loop or function call in both models and the
   difference arises inside, the branch taken, the body's first iteration or the
   inlined call becomes a pair of its own (:mod:`passes.verify.descend`),
   reduced alike.

Bounded (:class:`Budget`): past its time or when the child runs out of memory,
the search stops with the smallest reproduction found so far and says so.
"""

from __future__ import annotations

import dataclasses
import logging
import pathlib
import shutil
import time
from typing import Any

import numpy as np
import onnx

from passes.verify import descend, files as _files, locate as _locate, region
from passes.verify.ddmin import ddmin
from passes.verify.child import WorkerCrashed, WorkerTimeout

__all__ = ["Budget", "Found", "Pair", "Search", "now"]

logger = logging.getLogger(__name__)

#: Bytes of the original's values the search may capture to cut at (per level of subgraph).
CAPTURE_BYTES = 1 << 28

#: The values that differ tried as the target (:meth:`_Level._first_difference`) before the output.
MAX_TARGETS = 8

#: Values compared per run by the search's comparison, in bytes (as the locator's).
VALUES_BUDGET = 1 << 28


def now() -> float:
    """The clock of the budget (a test may replace it)."""
    return time.monotonic()


@dataclasses.dataclass
class Pair:
    """Two models to reduce: each with the folder its external data is relative to; their inputs:
    ``{"set": name or None}`` (a set of the check's, in its child) or ``{"feeds": saved values}``."""

    original: onnx.ModelProto
    optimized: onnx.ModelProto
    original_source: pathlib.Path
    optimized_source: pathlib.Path
    inputs: dict[str, Any]
    where: str = "the main graph"
    hint: str = ""
    values: dict[str, Any] | None = None  # the locator's comparison of every value both name, if it ran


@dataclasses.dataclass
class Found:
    """A reproduction: two region models, the captured values they read, their one output."""

    original: onnx.ModelProto
    optimized: onnx.ModelProto
    original_source: pathlib.Path
    optimized_source: pathlib.Path
    inputs: dict[str, dict[str, Any]]
    output: str
    comparison: dict[str, Any]
    where: str


class Budget:
    """Time and captured bytes the search may spend; ``stopped`` says why it stopped early, and
    ``notes`` what the budget left out (values not captured) though the search went on."""

    def __init__(self, seconds: float, capture_bytes: int | None = None) -> None:
        self.deadline = now() + seconds
        self.capture_bytes = CAPTURE_BYTES if capture_bytes is None else capture_bytes
        self.stopped = ""
        self.notes: list[str] = []

    def left(self) -> bool:
        if not self.stopped and now() >= self.deadline:
            self.stopped = "the time budget ran out"
        return not self.stopped


class _Stop(Exception):
    """The budget is spent (or the child cannot go on)."""


class Search:
    """One reduction, with the check's child and its options.

    Args:
        worker: The check's child (:class:`passes.verify.child.Worker`), which holds its inputs.
        folder: An empty private folder for the candidates and the captured values.
        tolerance: ``(rtol, atol, precision, precision_tolerance)`` as the check's.
        normwise: Whether the failing set is compared against each output's largest magnitude too.
        budget: What the search may spend.
        timeout: Seconds one request to the child may take.
    """

    def __init__(self, worker: Any, folder: pathlib.Path, tolerance: tuple[Any, Any, Any, Any], normwise: bool,
                 budget: Budget, timeout: float) -> None:  # fmt: skip
        self.worker, self.folder, self.tolerance, self.normwise = worker, folder, tolerance, normwise
        self.budget, self.timeout = budget, timeout
        self.tests = 0
        self.nodes = (0, 0)  # the models' nodes where the search started (for the README)
        self._count = 0

    def _request(self, message: dict[str, Any], models: pathlib.Path) -> dict[str, Any]:
        """The child's answer to ``message``, within the budget; ``models``, the folder of the
        models it runs, is removed after (their links to the models' data files with it: a load of
        the input refuses a data file with more than one link)."""
        try:
            if not self.budget.left():
                raise _Stop
            seconds = min(self.timeout, self.budget.deadline - now())
            try:
                return self.worker.request(message, time.monotonic() + max(seconds, 0.0))
            except WorkerTimeout:
                self.budget.stopped = self.budget.stopped or "the time budget ran out"
            except WorkerCrashed as e:
                self.budget.stopped = f"the check's process stopped ({e}): the memory budget?"
            raise _Stop
        finally:
            shutil.rmtree(models, ignore_errors=True)

    def _folder(self, label: str) -> pathlib.Path:
        self._count += 1
        path = self.folder / f"{self._count}-{label}"
        path.mkdir(parents=True)
        return path

    def run(self, pair: Pair) -> Found | None:
        """The smallest reproduction of ``pair``'s first difference, or None (none found)."""
        try:
            return _Level(self, pair).run()
        except _Stop:
            return None


def _augmented(proto: onnx.ModelProto, source: pathlib.Path, names: list[str], types: dict[str, int],
               folder: pathlib.Path) -> str:  # fmt: skip
    """A copy of ``proto`` (external data relative to the folder ``source``) with ``names`` as
    outputs, saved to run in ``folder`` (see :func:`passes.verify.locate.augmented`)."""
    return str(_locate.augmented(proto, source / "model.onnx", names, types, folder))


class _Level:
    """The search on one pair (the main graphs, or a subgraph of each)."""

    def __init__(self, search: Search, pair: Pair) -> None:
        self.search, self.pair = search, pair
        self.o, self.p = region.Index(pair.original.graph), region.Index(pair.optimized.graph)
        self.o_types = _locate.tensor_types(pair.original)
        self.p_types = _locate.tensor_types(pair.optimized)
        self.captured: dict[str, dict[str, Any]] = {}
        self.best: tuple[int, Found] | None = None
        self._tested: dict[tuple[tuple[int, ...], tuple[int, ...]], bool] = {}
        self.target = ""
        self.names: list[str] = []  # the values both models name (node outputs, in the original's order)
        self.tolerances: dict[str, tuple[float, float] | None] = {}
        self.agree: set[str] = set()  # those that agree within their tolerance: where a region may be cut
        self.tolerance: tuple[float, float] | None = None
        self.cuttable: set[str] = set()  # the values upstream of the target it may cut at
        self.captured_bytes = 0
        self.lost: set[str] = set()  # values the capture budget left out

    def run(self) -> Found | None:
        try:
            self._search()
        except _Stop:
            pass
        lost = self.lost & self._computed([self.target], set()) if self.lost and self.target else set()
        if lost:
            self.search.budget.notes.append(
                f"the capture budget ({self.search.budget.capture_bytes} bytes) left {len(lost)} value(s) "
                f"upstream of {self.target!r} in {self.pair.where} uncaptured, not cut at: the region may be larger")
        if self.best is None:
            return None
        found = self.best[1]
        if self.search.budget.left():
            try:
                deeper = self._descend()
            except _Stop:
                deeper = None
            except Exception:  # noqa: BLE001  a subgraph that cannot stand alone: the region as it is
                logger.debug("--repro: no reproduction inside %s", self.target, exc_info=True)
                deeper = None
            if deeper is not None:
                return deeper
        return found

    # --- the first difference and the values it is cut at --------------------------------------

    def _compared(self) -> dict[str, dict[str, Any]]:
        """Every value both models name, compared on the pair's inputs: the locator's comparison
        (``pair.values``), else the two models run with them all as outputs."""
        pair, search = self.pair, self.search
        rtol, atol, precision, precision_tolerance = search.tolerance
        compared = _locate.widened(pair.original, pair.optimized) if precision else pair.optimized
        # Every value both models name: the locator compares only those the passes left computed the
        # same way, but a fused node's value may still stand for the original's (tested by running it).
        names, types = _locate.comparable_values(pair.original, compared, by_name=True)
        self.names = [n for n in names if n in self.o.producer]
        self.tolerances = _locate.value_tolerances(pair.original, self.names, rtol, atol, precision,
                                                   precision_tolerance)  # fmt: skip
        if not self.names or (pair.values is not None and set(self.names) <= set(pair.values)):
            return pair.values or {}
        folder = search._folder("values")
        answer = search._request({
            "op": "values", **pair.inputs, "names": self.names, "tolerances": self.tolerances,
            "budget": VALUES_BUDGET, "half_io": precision is not None, "normwise": search.normwise,
            "original": _augmented(pair.original, pair.original_source, self.names, types, folder / "original"),
            "optimized": _augmented(compared, pair.optimized_source, self.names, types, folder / "optimized"),
        }, folder)  # fmt: skip
        return answer.get("values", {}) if answer.get("ok") else {}

    def _first_difference(self) -> str:
        """The target: the first value both models name that differs, upstream of an output that
        differs, and whose value in one model stands for the other's (:meth:`_stands_for`; tried in the
        original's order, the locator's first, ``hint``, among them); else the first output that differs.

        Values that agree within their tolerance are where the regions may be cut."""
        values = self._compared()
        ok = {n: bool(v.get("ok")) for n, v in values.items() if "error" not in v}
        self.agree = {n for n in self.names if ok.get(n)}
        outputs = [o.name for o in self.pair.original.graph.output if ok.get(o.name) is False]
        if not outputs:
            return ""
        upstream = self._computed(outputs, set())
        differing = [n for n in self.names if ok.get(n) is False and n in upstream and n not in outputs]
        # In the original's order (the earliest difference gives the smallest region), the locator's among them.
        tried = [n for n in dict.fromkeys([*differing[:MAX_TARGETS], self.pair.hint]) if n in differing]
        target = next((n for n in tried if self._stands_for(n, outputs, values)), outputs[0])
        self.tolerance = self.tolerances[target]
        return target

    def _computed(self, targets: list[str], cuts: set[str]) -> set[str]:
        """The values the original computes for ``targets`` from ``cuts`` (and the graph inputs)
        that the optimised model computes or holds as a constant on its way to them."""
        (o_nodes, *_), (p_nodes, _, p_weights, _) = (region.cone(index, targets, cuts) for index in (self.o, self.p))
        original = {n for i in o_nodes for n in self.o.nodes[i].output}
        return original & ({n for i in p_nodes for n in self.p.nodes[i].output} | set(p_weights))

    def _stands_for(self, name: str, outputs: list[str], values: dict[str, dict[str, Any]]) -> bool:
        """Whether the optimised model's ``name`` holds what the original's does (a Conv into which
        its BatchNormalization was fused keeps the Conv's name, not its value): fed the original's
        value there, the optimised model's differing ``outputs`` are no further from the original's
        than they were (4 times their error, plus their atol, for its own rounding downstream)."""
        self.target = name  # for the capture's note
        cone, inputs, weights, missing = region.cone(self.p, outputs, {name})
        if missing or name not in inputs:
            return False
        # With them, the values the target's nodes read where they agree: the tightest region's inputs.
        read = [n for index in (self.o, self.p) if name in index.producer
                for n in index.reads[index.producer[name]] if n in self.agree]  # fmt: skip
        required = [n for n in [name, *outputs] if n not in self.captured and n not in self.o.inputs]
        self._capture([*required, *(n for n in dict.fromkeys(read) if n not in self.captured and n not in required)],
                      len(required))  # fmt: skip
        if any(n not in self.captured for n in [*inputs, *outputs]):
            return False
        p_types = {n: self.p_types.get(n, self.o_types[n]) for n in [*inputs, *outputs]}
        fed = {n: (p_types[n], self.captured[n]["shape"]) for n in inputs}
        model = region.region_model(self.pair.optimized, self.p, cone, fed, weights, {o: p_types[o] for o in outputs},
                                    f"optimized, fed the original's {name!r}")  # fmt: skip
        folder = self.search._folder("stands-for")
        _locate.link_external(model, self.pair.optimized_source, folder)
        _files.save_proto(model, folder / "model.onnx")
        answer = self.search._request({
            "op": "regions", "optimized": str(folder / "model.onnx"), "expected": {o: self.captured[o] for o in outputs},
            "feeds": {n: self.captured[n] for n in inputs}, "normwise": self.search.normwise,
            "tolerances": {o: self.tolerances[o] for o in outputs}}, folder)  # fmt: skip
        if not answer.get("ok"):
            return False
        for compared in answer["outputs"]:
            before = float(values.get(compared["name"], {}).get("max_abs_error", float("inf")))
            atol = (self.tolerances.get(compared["name"]) or (0.0, 0.0))[1]
            if float(compared.get("max_abs_error", float("inf"))) > 4 * before + atol:
                return False
        return True

    def _capture(self, names: list[str], required: int = 0) -> None:
        """The original's values of ``names`` (and, the first time, the graph inputs) saved in the
        child: the first ``required`` ones (the target and the outputs) whatever their size, the
        others as many as the byte budget leaves room for; those it does not save are not cut at."""
        search = self.search
        folder = search._folder("captured")
        model = _augmented(self.pair.original, self.pair.original_source, names, self.o_types, folder / "model")
        answer = search._request({"op": "capture", "model": model, "names": names, **self.pair.inputs,
                                  "folder": str(folder / "values"), "inputs": not self.captured,
                                  "required": required, "budget": search.budget.capture_bytes - self.captured_bytes},
                                 folder / "model")  # fmt: skip
        if not answer.get("ok"):
            raise _Stop
        self.captured.update(answer["values"])
        self.captured_bytes += int(answer["bytes"])
        lost = {n for n in names[required:] if n not in self.captured}
        self.cuttable -= lost
        self.lost |= lost

    # --- regions ---------------------------------------------------------------------------------

    def _region(self, cuts: set[str]) -> tuple[Any, Any] | None:
        """Both models' regions of the target that ``cuts`` leave (None: not a region of both), the
        values they read captured first (a value the budget leaves out is not cut at)."""
        asked: set[str] = set()
        while True:
            cuts = cuts & self.cuttable
            o, p = region.cone(self.o, [self.target], cuts), region.cone(self.p, [self.target], cuts)
            if o[3] or p[3] or not o[0] or not (p[0] or self.target in p[2]):  # (a constant in the optimised)
                return None
            needed = [n for n in dict.fromkeys([*o[1], *p[1]]) if n not in self.captured]
            if not needed:
                return o, p
            if asked.issuperset(needed):
                return None  # a value no capture gives (an input of one model only)
            asked.update(needed)
            self._capture([n for n in needed if n not in self.o.inputs])

    def _test(self, cuts: set[str]) -> bool:
        """Whether the regions that ``cuts`` leave still differ (kept as the best when smaller)."""
        built = self._region(cuts)
        if built is None:
            return False
        (o_nodes, o_inputs, o_weights, _), (p_nodes, p_inputs, p_weights, _) = built
        key = (tuple(o_nodes), tuple(p_nodes))
        if key in self._tested:
            return self._tested[key]
        search, pair = self.search, self.pair

        def shape(name: str) -> list[int]:
            return self.captured[name]["shape"]

        def p_type(name: str) -> int:  # the half type where --precision converted it
            return self.p_types.get(name, self.o_types[name])

        label = f"the region of {self.target!r} in {pair.where}"
        original = region.region_model(pair.original, self.o, o_nodes,
                                       {n: (self.o_types[n], shape(n)) for n in o_inputs}, o_weights,
                                       {self.target: self.o_types[self.target]}, f"original: {label}")  # fmt: skip
        optimized = region.region_model(pair.optimized, self.p, p_nodes, {n: (p_type(n), shape(n)) for n in p_inputs},
                                        p_weights, {self.target: p_type(self.target)}, f"optimized: {label}")
        folder = search._folder("candidate")
        paths = []
        for name, model, source in (("original", original, pair.original_source),
                                    ("optimized", optimized, pair.optimized_source)):  # fmt: skip
            _locate.link_external(model, source, folder / name)
            _files.save_proto(model, folder / name / "model.onnx")
            paths.append(str(folder / name / "model.onnx"))
        inputs = {n: self.captured[n] for n in dict.fromkeys([*o_inputs, *p_inputs])}
        answer = search._request({"op": "regions", "original": paths[0], "optimized": paths[1], "feeds": inputs,
                                  "tolerances": {self.target: self.tolerance}, "normwise": search.normwise}, folder)
        search.tests += 1
        comparison = next((o for o in answer.get("outputs", []) if o["name"] == self.target), None)
        differs = bool(answer.get("ok")) and comparison is not None and not comparison["ok"]
        self._tested[key] = differs
        size = len(o_nodes) + len(p_nodes)
        if differs and (self.best is None or size < self.best[0]):
            self.best = (size, Found(original, optimized, pair.original_source, pair.optimized_source, inputs,
                                     self.target, comparison, pair.where))  # fmt: skip
        return differs

    def _frontier(self, cuts: set[str]) -> set[str]:
        built = self._region(cuts)
        if built is None:
            return set()
        return {n for n in [*built[0][1], *built[1][1]] if n in cuts and n in self.o.producer}

    def _search(self) -> None:
        self.target = self._first_difference()
        if not self.target:
            return
        self.cuttable = self.agree & self._computed([self.target], set()) - {self.target}
        every = set(self.cuttable)
        if self._test(every):
            return  # the tightest region differs: nothing to give up
        if not self._test(set()):
            return  # even the whole cone from the graph inputs does not differ again
        cuts, level, found = set(self.cuttable), 1, set()
        while True:  # give up the cuts nearest the target, level by level, doubling
            grown = set(cuts)
            for _ in range(level):
                grown -= self._frontier(grown)
            if grown == cuts:
                break  # the whole cone, tested above
            if self._test(grown):
                found = grown
                break
            cuts, level = grown, level * 2
        kept = [n for n in self.names if n in (self.cuttable - found) & self._inside(found)]
        missing = [n for n in kept if n not in self.captured]
        if missing:  # captured in one run, before delta debugging cuts at any of them
            self._capture(missing)
        kept = [n for n in kept if n in self.cuttable]
        ddmin(kept, lambda subset: self._test(self.cuttable - set(subset)))

    def _inside(self, cuts: set[str]) -> set[str]:
        """The values the regions that ``cuts`` leave compute."""
        built = self._region(cuts)
        if built is None:
            return set()
        return {n for index, (nodes, *_) in zip((self.o, self.p), built) for i in nodes for n in index.nodes[i].output}

    def _descend(self) -> Found | None:
        """The region, when it is one If, Loop or function call in both models, as a pair of its
        own (see :func:`passes.verify.descend.inside`), reduced."""
        assert self.best is not None
        found = self.best[1]
        inner = descend.inside(self.pair.original, self.pair.optimized, self.o, self.p, (self.o_types, self.p_types),
                               (found.original, found.optimized), found.inputs, self._value,
                               lambda: self.search._folder("first-iteration"))  # fmt: skip
        if inner is None:
            return None
        original, optimized, feeds, where = inner
        nested = Pair(original, optimized, self.pair.original_source, self.pair.optimized_source, {"feeds": feeds},
                      f"{where} in {self.pair.where}")  # fmt: skip
        return _Level(self.search, nested).run()

    def _value(self, name: str) -> np.ndarray | None:
        """The original's value of ``name`` in the region's inputs (captured) or initializers."""
        if name in self.captured:
            return np.load(self.captured[name]["path"], allow_pickle=False)
        if name in self.o.initializers:
            return onnx.numpy_helper.to_array(self.o.initializers[name], str(self.pair.original_source))
        return None
