"""Declared shapes the graph contradicts once its constants are known, corrected.

A model may declare an output ``[a, b]`` that its graph computes as
``[2, 3, 4]``: onnx's strict inference cannot see it while the Reshape target
is computed, and onnxruntime returns what the graph computes whatever the
declaration says. Once fold has made the target a constant, strict inference
sees the contradiction and the ONNX checker refuses the model. The declaration
is then corrected to what inference proves (its int dims; where inference has
only a symbol, the declared name at that position if the rank is the same,
else an unnamed dim), in every graph, for graph outputs and ``value_info``
alike. Values and results do not change.
"""

from __future__ import annotations

from collections.abc import Mapping

import onnx_ir as ir

from passes.ir import walk
from passes.ir.inference import known_dims as _dims

__all__ = ["correct_declared_shapes"]


def _contradicts(declared: tuple, inferred: tuple) -> bool:
    if len(declared) != len(inferred):
        return True
    return any(isinstance(a, int) and isinstance(b, int) and a != b for a, b in zip(declared, inferred))


def correct_declared_shapes(
    model: ir.Model, inferred: Mapping[ir.Value, tuple[ir.DataType | None, ir.Shape | None]]
) -> tuple[int, list[str]]:
    """Replaces each declared shape that ``inferred`` (the pass's inference of this very graph, which
    ignores declared shapes: :func:`passes.ir.inference.infer_all`) contradicts; how many, and a note
    per graph output. (No inference of its own: that would decode the attribute lists a model leaves
    in its file.)"""
    candidates = [v for graph in walk.graphs(model) for node in graph for v in node.outputs if v.shape is not None]
    notes = []
    count = 0
    for value in candidates:
        found = inferred.get(value, (None, None))[1]
        if found is None or value.shape is None:
            continue
        declared, proved = _dims(value.shape), _dims(found)
        if not _contradicts(declared, proved):
            continue
        count += 1
        value.shape = ir.Shape(_corrected(declared, proved))
        if value.is_graph_output():
            notes.append(f"output {value.name!r:.100} was declared {list(declared)} but the graph computes "
                         f"{list(proved)}: declared {list(_dims(value.shape))} in the output")  # fmt: skip
    return count, notes


def _corrected(declared: tuple, proved: tuple) -> list[int | str | None]:
    """The proved dims; where only a symbol is proved, the declared name at that position (same rank), else none."""
    same_rank = len(declared) == len(proved)
    return [p if isinstance(p, int) else (declared[i] if same_rank and not isinstance(declared[i], int) else None)
            for i, p in enumerate(proved)]  # fmt: skip
