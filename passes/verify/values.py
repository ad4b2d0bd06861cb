"""The runs that fetch the original's intermediate values: the locator's and the magnitudes'.

:func:`first_difference` runs copies of the original and of an optimised model
whose intermediate values are graph outputs (:mod:`passes.verify.locate` makes
them and names the values both compute the same way) on the set of inputs where
an output differed, and names the first node of the original whose output
differs. :func:`magnitudes` runs a copy of the original whose outputs are
reductions of its values (scalars) on every set the check ran and gives each
float32 value's largest finite magnitude (``--precision``'s range islands). Both ask the checker's child and use the
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

from passes.lazy import lazy_module
from passes.verify import files as _files
from passes.verify.child import WorkerError
from passes.verify.result import FirstDifference

_locate = lazy_module("passes.verify.locate")  # after a difference, or for --precision's ranges

__all__ = ["LOCATE_BUDGET", "finite_maxima", "first_difference", "magnitudes", "reductions", "upstream"]

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


def magnitudes(checker: Any, above: float | None = None) -> dict[str, float]:
    """The largest finite magnitude of each float32 value of the original's main graph over every
    set of inputs the check ran it on; empty when the child cannot answer.

    One run of the original per set, fetching scalars, not the values (which at a long sequence
    are attention scores of hundreds of MiB each): :func:`reductions` gives each value's max, min
    and sum; where the sum is finite on every set so is every element, and the magnitude is the
    max's or the min's. The few values whose sum is not (a mask's -inf, a NaN, or a sum of
    finite values that overflows: a mask of -3.4e38) are measured again by :func:`finite_maxima`
    (each value's largest finite magnitude, computed in the graph), one more run per set; with
    ``above`` (``--precision``'s range limit), not those whose max or min is finite on some set
    and larger than ``above`` in magnitude: it is an element's value, so the value holds one
    above the limit, and its magnitude is given as that element's (the largest finite one unless
    an infinity or a NaN beside it hid a larger one, which changes no decision at the limit).
    """
    if checker.original_path is None or checker.worker is None or checker.folder is None:
        return {}
    original = _files.whole(checker.original_path)
    types = _locate.tensor_types(original)
    outputs = {o.name for o in original.graph.output}
    names = [n for node in original.graph.node for n in node.output
             if n and types.get(n) == onnx.TensorProto.FLOAT and n not in outputs]  # fmt: skip
    names += [o.name for o in original.graph.output if types.get(o.name) == onnx.TensorProto.FLOAT]
    if not names:
        return {}
    proto, triples = reductions(original, names)
    answer = _measure(checker, original, proto, [o for triple in triples.values() for o in triple])
    if answer is None:
        return {}
    largest, nonfinite = answer["values"], set(answer.get("nonfinite", ()))
    found: dict[str, float] = {}
    again = []
    for name, (high, low, total) in triples.items():
        bound = max(float(largest.get(high, 0.0)), float(largest.get(low, 0.0)))
        if total in nonfinite and (above is None or bound <= above):
            again.append(name)
        elif high in largest or low in largest:
            found[name] = bound
    if again:
        masked = finite_maxima(original, again)
        if masked is None:  # below opset 9: the values themselves, 64 a run
            label = f"magnitudes-{len(list(checker.folder.glob('magnitudes-*')))}"
            copy = _locate.augmented(original, checker.original_path, again, types, checker.folder / label)
            answer = _request(checker, {"op": "magnitudes", "model": str(copy), "names": again}, copy.parent)
            found.update({k: float(v) for k, v in (answer or {}).get("values", {}).items()})
        else:
            proto, maxima = masked
            answer = _measure(checker, original, proto, list(maxima.values()))
            values = (answer or {}).get("values", {})
            found.update({name: float(values[out]) for name, out in maxima.items() if out in values})
    return found


def _measure(checker: Any, original: onnx.ModelProto, proto: onnx.ModelProto,
             outputs: list[str]) -> dict[str, Any] | None:  # fmt: skip
    """The child's ``magnitudes`` answer for ``proto`` (a copy of ``original`` with scalar outputs):
    every output in one run per set, onnxruntime running the nodes in their order (a value's
    reductions right after it, so that it is freed as in the original); None if it cannot answer."""
    label = f"magnitudes-{len(list(checker.folder.glob('magnitudes-*')))}"
    _locate.link_external(original, checker.original_path.parent, checker.folder / label)
    copy = checker.folder / label / "model.onnx"
    onnx.save_model(proto, str(copy))
    return _request(checker, {"op": "magnitudes", "model": str(copy), "names": outputs, "chunk": len(outputs),
                              "ordered": True}, copy.parent)  # fmt: skip


def _request(checker: Any, request: dict[str, Any], folder: Any) -> dict[str, Any] | None:
    deadline = time.monotonic() + checker.timeout
    try:
        if not checker.worker.alive:
            checker.ready()
        answer = checker.worker.request(request, deadline)
    except WorkerError:
        return None
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return answer if answer.get("ok") else None


def _with_outputs(original: onnx.ModelProto, names: Sequence[str],
                  make: Any) -> tuple[onnx.ModelProto, dict[str, Any], str]:  # fmt: skip
    """A copy of ``original`` whose only outputs are what ``make(value, key, prefix)`` adds (nodes
    and output names) for each value in ``names``, its nodes right after the value's node; each
    value's output names; the prefix no name of ``original`` starts with."""
    wanted = set(names)
    taken = {n for node in original.graph.node for n in (*node.input, *node.output)}
    taken |= {i.name for i in (*original.graph.input, *original.graph.initializer)}
    prefix = "magnitude"
    while any(n.startswith(prefix) for n in taken):
        prefix += "_"
    copy = onnx.ModelProto()
    copy.CopyFrom(original)
    graph = copy.graph
    nodes = list(graph.node)
    del graph.node[:]
    del graph.output[:]
    made: dict[str, Any] = {}
    for node in nodes:
        graph.node.append(node)
        for value in node.output:
            if value in wanted and value not in made:
                added, outputs = make(value, f"{prefix}_{len(made)}", prefix)
                graph.node.extend(added)
                made[value] = outputs
                for name in [outputs] if isinstance(outputs, str) else outputs:
                    graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, []))
    return copy, made, prefix


def reductions(original: onnx.ModelProto, names: Sequence[str]) -> tuple[onnx.ModelProto, dict[str, tuple[str, ...]]]:
    """A copy of ``original`` whose outputs are each value's ``ReduceMax``, ``ReduceMin`` and
    ``ReduceSum`` (scalars: no copy of the value); each value's three output names."""

    def make(value: str, k: str, prefix: str) -> tuple[list[onnx.NodeProto], tuple[str, ...]]:
        outputs = (f"{k}_max", f"{k}_min", f"{k}_sum")
        ops = ("ReduceMax", "ReduceMin", "ReduceSum")
        return [onnx.helper.make_node(op, [value], [o], keepdims=0) for op, o in zip(ops, outputs)], outputs

    copy, made, _ = _with_outputs(original, names, make)
    return copy, made


def finite_maxima(original: onnx.ModelProto, names: Sequence[str]) -> tuple[onnx.ModelProto, dict[str, str]] | None:
    """A copy of ``original`` whose outputs are each value's largest finite magnitude
    (``ReduceMax`` of ``|x|`` where ``|x| < inf``, else 0; an empty value's is -inf, which the child
    skips); each value's output name. None below opset 9 (``Where``)."""
    opset = next((o.version for o in original.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < 9:
        return None

    def make(value: str, k: str, prefix: str) -> tuple[list[onnx.NodeProto], str]:
        return [onnx.helper.make_node("Abs", [value], [f"{k}_abs"]),
                onnx.helper.make_node("Less", [f"{k}_abs", f"{prefix}_inf"], [f"{k}_finite"]),  # NaN, inf: False
                onnx.helper.make_node("Where", [f"{k}_finite", f"{k}_abs", f"{prefix}_zero"], [f"{k}_kept"]),
                onnx.helper.make_node("ReduceMax", [f"{k}_kept"], [k], keepdims=0)], k  # fmt: skip

    copy, made, prefix = _with_outputs(original, names, make)
    copy.graph.initializer.extend([onnx.helper.make_tensor(f"{prefix}_inf", onnx.TensorProto.FLOAT, [], [float("inf")]),
                                   onnx.helper.make_tensor(f"{prefix}_zero", onnx.TensorProto.FLOAT, [], [0.0])])
    return copy, made

