"""Which nodes the ``--precision`` pass keeps in float32: before the search, from the graph alone;
then from what the check measured.

* :func:`amplified_islands`: every node that makes a float32 value from which a rounding-sized
  change reaches an op that turns it into a whole step (a Cast to an integer, a comparison, an
  ArgMax...: :class:`passes.ir.amplification.Amplified`, the notion simplify's fusions avoid such
  places with), or that is such an op for a float32 input it would take in the half type. No
  tolerance accepts such a step, and the check sees it only where its inputs cross a threshold.
* :func:`range_islands`: every node that takes or makes a value whose magnitude on the check's
  inputs (the range probe, :func:`passes.verify.values.magnitudes`; a weight's own values)
  exceeds the limit.
* :func:`check_islands`: after a comparison that failed, from the locator's answer (the first
  node of the original whose output differs, and its comparison of every value both models
  compute): the located node, if it is half; else its weights, if they are half; else the
  *path of largest error*: from each output that differs back to the graph's inputs, through
  each node's input whose error is the largest in units of its tolerance, every half node on it
  that makes a float value (a Shape or an IsNaN carries no rounding). The first difference alone
  walks up the earliest layers while the error builds in the later ones (a transformer whose
  LayerNormalizations magnify the rounding of the residual stream in every layer); the path
  puts the whole chain that carries the error to the output back in float32 in one round, and
  the search's pruning then returns what is not needed. Where the path adds nothing (the
  locator compared nothing further up), the half nodes upstream of the located node.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence
from typing import Any

import onnx_ir as ir

from passes.ir.amplification import Amplified, amplifying_inputs
from passes.precision import lazy as _lazy
from passes.precision.plan import FLOAT, Plan, scopes

__all__ = ["amplified_islands", "check_islands", "error_path", "range_islands"]

Key = tuple[str, str]


def amplified_islands(model: ir.Model, plan: Plan, islands: dict[Key, str], exact: set[Key]) -> None:
    """Adds each node that may be half (in any scope) whose float32 output reaches an amplifying op,
    or that is one for an input it would take in the half type; its weights stay float32 too
    (``exact``: a weight's rounding is such a change). Nodes already islands are left as they are."""
    amplified = Amplified(model)  # (its walk runs on the first question)
    for scope in scopes(model):
        types = plan.types.get(scope.key, {})
        for node in scope.body:
            key = (scope.key, node.name)
            if key not in plan.slots or key in islands:
                continue
            ins, why, amplifying = plan.slots[key][0], None, amplifying_inputs(node)
            for i, value in enumerate(node.inputs):
                if value is not None and i < len(ins) and ins[i] and any(v is value for v in amplifying):
                    why = f"amplified: its input {value.name} would be rounded to the half type"
            for value in node.outputs:
                reached = amplified.reason(value) if types.get(value.name) == FLOAT else None
                if reached is not None:
                    why = f"amplified: {value.name} reaches {reached}"
                    break
            if why is not None:
                islands[key] = why + " (a rounding change there is a whole step)"
                exact.add(key)


def range_islands(reference: ir.Model, plan: Plan, magnitudes: dict[str, float], limit: float,
                  islands: dict[Key, str]) -> None:  # fmt: skip
    """Adds each main-graph node that takes or makes a value larger than ``limit`` (``magnitudes``
    gains the float32 weights' own, read a chunk at a time)."""
    for node in reference.graph:
        key = ("", node.name)
        if key not in plan.slots or key in islands:
            continue
        values = [v for v in (*node.inputs, *node.outputs) if v is not None]
        for v in values:
            if v.name not in magnitudes and v.const_value is not None and v.dtype == FLOAT:
                magnitudes[v.name] = _lazy.largest(v.const_value)  # a chunk at a time
        big = [(v.name, magnitudes[v.name]) for v in values if magnitudes.get(v.name, 0.0) > limit]
        if big:
            name, size = max(big, key=lambda x: x[1])
            islands[key] = f"range: {name} reaches {size:.3g} on the check's inputs (limit {limit:g})"


def _float_weights(node: ir.Node) -> bool:
    return any(v is not None and v.const_value is not None and v.dtype == FLOAT for v in node.inputs)


def check_islands(plan: Plan, found: Any, islands: dict[Key, str], reference: ir.Model, exact: set[Key],
                  located: Mapping[str, Mapping[str, Any]], failing: Sequence[str], magnitudes: Mapping[str, float],
                  tolerance: tuple[float, float]) -> bool:  # fmt: skip
    """Puts the located node back to float32 (its weights still stored in the half type); if it
    already is, its weights back to float32 too; if they already are (or it has none), the half
    nodes on the path of largest error (:func:`error_path`); if there are none, the weights of
    its float32 nodes; if they are float32 too, the half nodes upstream of the located node that
    make a float value. False if none of these adds anything (or the locator named no node).

    ``located``: the locator's comparison of each value (``max_abs_error``, ``ok``);
    ``failing``: the outputs that differ; ``magnitudes``: each value's largest magnitude (the
    range probe's); ``tolerance``: the half type's (rtol, atol)."""
    if not found.node:  # the locator did not run, or named nothing: its values say nothing new
        return False
    key = ("", found.node)
    if key in plan.slots and key not in islands:
        islands[key] = f"check: {found.output} differs by {found.max_abs_error:.3g} in the half type"
        return True
    start = next((node for node in reference.graph if node.name == found.node), None)
    if start is not None and key in islands and key not in exact and _float_weights(start):
        exact.add(key)
        islands[key] += "; its weights too"
        return True
    path = error_path(reference, located, failing, magnitudes, tolerance)
    added = False
    for node, value, excess in path:
        pkey = ("", node.name)
        if pkey in plan.slots and pkey not in islands and any(plan.slots[pkey][1]):
            islands[pkey] = (f"check: on the path of largest error to an output that differs: {value} is off "
                             f"by {excess:.3g}x its tolerance in the half type")  # fmt: skip
            added = True
    if added:
        return True
    for node, _, _ in path:  # the whole path is float32 already: its weights too
        pkey = ("", node.name)
        if pkey in islands and pkey not in exact and _float_weights(node):
            exact.add(pkey)
            islands[pkey] += "; its weights too (on the path of largest error)"
            added = True
    return added or (start is not None and _upstream(plan, found, start, islands, reference, exact))


def _upstream(plan: Plan, found: Any, start: ir.Node, islands: dict[Key, str], reference: ir.Model,
              exact: set[Key]) -> bool:  # fmt: skip
    """The nearest half nodes upstream of the located node (through float32 ones) that make a float
    value, back to float32; where they are, their weights. The last resort: the path of largest
    error ends where the locator compared nothing."""
    added, seen, queue = False, {start.name}, collections.deque([start])
    while queue:
        node = queue.popleft()  # (a list's pop(0) is a copy a node: quadratic on a 10k-node graph)
        for value in node.inputs:
            producer = value.producer() if value is not None else None
            if producer is None or producer.name in seen or producer.graph is not reference.graph:
                continue
            seen.add(producer.name)
            pkey = ("", producer.name)
            if pkey in plan.slots and pkey not in islands and any(plan.slots[pkey][1]):
                islands[pkey] = f"check: feeds {found.node}, whose output {found.output} differs"
                added = True
                continue
            if pkey in islands and pkey not in exact and _float_weights(producer):
                exact.add(pkey)
                islands[pkey] += f"; its weights too (feeds {found.node})"
                added = True
            queue.append(producer)
    return added


def error_path(reference: ir.Model, located: Mapping[str, Mapping[str, Any]], failing: Sequence[str],
               magnitudes: Mapping[str, float], tolerance: tuple[float, float]) -> list[tuple[ir.Node, str, float]]:
    """The main-graph nodes on the path of largest error from each output in ``failing`` back
    towards the inputs (each output's producer, then the producer of its input whose error is the
    largest in units of its tolerance, ``atol + rtol * magnitude``, while one has an error), with
    the value it makes on the path and that value's error in units of its tolerance; each node
    once, nearest the outputs first."""
    rtol, atol = tolerance
    producers: dict[str, ir.Node] = {}
    excess: dict[str, float] = {}
    for node in reference.graph:  # in order; a value the locator did not compare (a sequence, a
        # value the passes rewrote) counts the largest error of its producer's inputs
        inherited = max([excess.get(v.name, 0.0) for v in node.inputs if v is not None] + [0.0])
        for v in node.outputs:
            producers[v.name] = node
            compared = located.get(v.name)
            excess[v.name] = inherited
            if compared and "max_abs_error" in compared:
                excess[v.name] = float(compared["max_abs_error"]) / (atol + rtol * float(magnitudes.get(v.name, 0.0)))
    path: list[tuple[ir.Node, str, float]] = []
    seen: set[int] = set()
    for output in failing:
        name: str | None = output
        while name is not None:
            node = producers.get(name)
            if node is None or id(node) in seen:
                break
            seen.add(id(node))
            path.append((node, name, excess[name]))
            inputs = [(excess[v.name], v.name) for v in node.inputs if v is not None and v.name in producers]
            inputs = [pair for pair in inputs if pair[0] > 0.0]
            name = max(inputs)[1] if inputs else None
    return path
