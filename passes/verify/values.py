"""The runs that fetch the original's intermediate values: the locator's and the magnitudes'.

:func:`first_difference` runs copies of the original and of an optimised model
whose intermediate values are graph outputs (:mod:`passes.verify.locate` makes
them and names the values both compute the same way) on the set of inputs where
an output differed, and names the first node of the original whose output
differs. :func:`magnitudes` runs such a copy of the original on every set the
check ran and gives each float32 value's largest finite magnitude
(``--precision``'s range islands). Both ask the checker's child and use the
checker's public state (its folder, original, tolerances, the set and the outputs that
failed: the locator compares only the values those outputs depend on, so that an output left
out of the comparison as noise, see :mod:`passes.verify.verdict`, is not located either).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from typing import Any

import onnx

from passes.verify import files as _files, locate as _locate
from passes.verify.child import WorkerError
from passes.verify.result import FirstDifference

__all__ = ["LOCATE_BUDGET", "first_difference", "magnitudes", "upstream"]

#: Intermediate values fetched per run by the locator, in bytes.
LOCATE_BUDGET = 1 << 28


def first_difference(checker: Any, optimized: Any) -> FirstDifference:
    """The first node of ``checker``'s original whose output differs from ``optimized``'s (after a
    comparison that failed: on its first failing set).

    Raises:
        WorkerError: the child timed out or died.
    """
    assert checker.worker is not None and checker.folder is not None and checker.original_proto is not None
    assert checker.original_path is not None
    label = f"located-{len(list(checker.folder.glob('located-*')))}"
    opt_path, _ = _files.materialize(optimized, checker.folder, label)
    # copies that run need every attribute
    original, opt_proto = _files.whole(checker.original_path), _files.whole(opt_path)
    if checker.precision is not None:  # half values compared as float32 under their own names
        opt_proto = _locate.widened(original, opt_proto)
    correspondence = _locate.Correspondence(original, opt_proto, through_casts=checker.precision is not None)
    names, types = _locate.comparable_values(original, opt_proto, correspondence)
    if checker.failing_outputs:  # not the values only a noisy (not compared) output depends on
        feeding = upstream(original.graph, checker.failing_outputs)
        names = [n for n in names if n in feeding]
    if not names:
        return FirstDifference(message="the two models have no intermediate value in common")
    tolerances = _locate.value_tolerances(original, names, checker.rtol, checker.atol, checker.precision,
                                          checker.precision_tolerance)  # fmt: skip
    original_copy = _locate.augmented(original, checker.original_path, names, types,
                                      checker.folder / f"{label}-original")  # fmt: skip
    optimized_copy = _locate.augmented(opt_proto, opt_path, names, types, checker.folder / f"{label}-optimized")
    deadline = time.monotonic() + checker.timeout
    try:
        if not checker.worker.alive:
            checker.ready()
        answer = checker.worker.request(
            {"op": "values", "original": str(original_copy), "optimized": str(optimized_copy), "names": names,
             "tolerances": tolerances, "budget": LOCATE_BUDGET, "set": checker.failing_set,
             "rounding": checker.rounding, "half_io": checker.precision is not None}, deadline,
        )  # fmt: skip
    finally:  # the copies' links to the models' data files: a later load of the input refuses a linked file
        for copy in (original_copy, optimized_copy):
            shutil.rmtree(copy.parent, ignore_errors=True)
    if not answer.get("ok"):
        return FirstDifference(message=f"onnxruntime could not run the copies: {answer.get('error', '')}")
    checker.located_values = answer["values"]
    return _locate.first_difference(original, answer["values"], correspondence)


def upstream(graph: onnx.GraphProto, outputs: Sequence[str]) -> set[str]:
    """Every value of ``graph`` that ``outputs`` depend on (themselves included): a node read by
    a subgraph counts through the node that holds it."""
    producer = {out: node for node in graph.node for out in node.output if out}
    seen, todo = set(outputs), list(outputs)
    while todo:
        node = producer.get(todo.pop())
        if node is None:
            continue
        reads = [*node.input, *(n for a in node.attribute for g in ([a.g] if a.HasField("g") else a.graphs)
                                for inner in g.node for n in inner.input)]  # fmt: skip
        for name in reads:
            if name and name not in seen:
                seen.add(name)
                todo.append(name)
    return seen


def magnitudes(checker: Any) -> dict[str, float]:
    """The largest finite magnitude of each float32 value of the original's main graph over every
    set of inputs the check ran it on; empty when the child cannot answer."""
    if checker.original_path is None or checker.worker is None or checker.folder is None:
        return {}
    original = _files.whole(checker.original_path)
    types = _locate.tensor_types(original)
    outputs = {o.name for o in original.graph.output}
    names = [n for node in original.graph.node for n in node.output
             if n and types.get(n) == onnx.TensorProto.FLOAT and n not in outputs]  # fmt: skip
    names += [o.name for o in original.graph.output if types.get(o.name) == onnx.TensorProto.FLOAT]
    label = f"magnitudes-{len(list(checker.folder.glob('magnitudes-*')))}"
    copy = _locate.augmented(original, checker.original_path, names, types, checker.folder / label)
    deadline = time.monotonic() + checker.timeout
    try:
        if not checker.worker.alive:
            checker.ready()
        answer = checker.worker.request({"op": "magnitudes", "model": str(copy), "names": names}, deadline)
    except WorkerError:
        return {}
    finally:
        shutil.rmtree(copy.parent, ignore_errors=True)
    return dict(answer.get("values", {})) if answer.get("ok") else {}
