"""Into a region that is one If, Loop or function call: the graph inside it as a pair of its own.

When the smallest region of both models is the same control-flow node or call
of a model-local function, fed the same values, the difference arises inside
it. :func:`inside` makes what runs there a model of each side
(:mod:`passes.verify.region`): the If branch taken (by the condition's value),
the Loop body on its first iteration (iteration number 0, the condition, the
carried values' initial values as inputs), or the call inlined. The search
(:mod:`passes.verify.reduce`) then reduces that pair as it did the main graphs.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import onnx

from passes.verify import region

__all__ = ["inside"]

#: Element types by value name.
Types = Mapping[str, int]


#: The pair inside: its two models, their inputs (saved values by name) and where it is.
Inside = tuple[onnx.ModelProto, onnx.ModelProto, dict[str, Any], str]


def inside(original: onnx.ModelProto, optimized: onnx.ModelProto, o: region.Index, p: region.Index,
           types: tuple[Types, Types], regions: tuple[onnx.ModelProto, onnx.ModelProto],
           inputs: Mapping[str, dict[str, Any]], value: Callable[[str], np.ndarray | None],
           folder: Callable[[], pathlib.Path]) -> Inside | None:  # fmt: skip
    """The pair inside the region, its inputs (saved values by name) and where it is, or None.

    Args:
        original, optimized: The two models the regions are of.
        o, p: Their graphs' indexes.
        types: Each model's element types by value name.
        regions: The two region models (one node each, else there is nothing inside to go to).
        inputs: The saved values the regions read, by name.
        value: The original's value of a name among the regions' inputs or initializers (None if unknown).
        folder: A new private folder, for the values the Loop's first iteration adds.
    """
    if len(regions[0].graph.node) != 1 or len(regions[1].graph.node) != 1:
        return None
    o_node, p_node = regions[0].graph.node[0], regions[1].graph.node[0]
    if (o_node.op_type, o_node.domain) != (p_node.op_type, p_node.domain):
        return None
    if (o_node.domain, o_node.op_type) in {(f.domain, f.name) for f in original.functions}:
        kind = "call"
    else:
        kind = o_node.op_type if o_node.domain in ("", "ai.onnx") else ""
    if kind not in ("If", "Loop", "call"):
        return None
    (o_types, p_types), output = types, next(n for n in o_node.output if n)
    o_pos, p_pos = o.producer[output], p.producer[output]
    feeds = dict(inputs)
    o_inputs = {n: (o_types[n], s["shape"]) for n, s in feeds.items()}
    p_inputs = {n: (p_types.get(n, o_types[n]), s["shape"]) for n, s in feeds.items()}
    if kind == "If":
        cond = value(o_node.input[0])
        if cond is None:
            return None
        then = bool(cond.reshape(-1)[0])
        o_model = region.branch_model(original, o, o_pos, then, o_inputs)
        p_model = region.branch_model(optimized, p, p_pos, then, p_inputs, list(o_node.output))
        return o_model, p_model, feeds, f"the {'then' if then else 'else'}_branch of If node {o_node.name!r}"
    if kind == "Loop":
        first = _first_iteration(o_node, inputs, o_types, value, folder)
        if first is None:
            return None
        body = next(a.g for a in o_node.attribute if a.name == "body")
        formal, outputs = [i.name for i in body.input], [o.name for o in body.output]
        for name, (saved, elem_type) in zip(formal, first):
            feeds[name] = saved
            o_inputs[name] = p_inputs[name] = (elem_type, saved["shape"])
        o_model = region.body_model(original, o, o_pos, o_inputs)
        p_model = region.body_model(optimized, p, p_pos, p_inputs, formal, outputs)
        return o_model, p_model, feeds, f"the body of Loop node {o_node.name!r} (its first iteration)"
    o_inputs.update({n: (o_types.get(n, 0), None) for n in o_node.output if n})
    p_inputs.update({n: (p_types.get(n, 0), None) for n in p_node.output if n})
    o_model = region.call_model(original, o, o_pos, o_inputs)
    p_model = region.call_model(optimized, p, p_pos, p_inputs)
    return o_model, p_model, feeds, f"function {o_node.domain}::{o_node.op_type} called by node {o_node.name!r}"


def _first_iteration(node: onnx.NodeProto, inputs: Mapping[str, dict[str, Any]], types: Types,
                     value: Callable[[str], np.ndarray | None],
                     folder: Callable[[], pathlib.Path]) -> list[tuple[dict[str, Any], int]] | None:  # fmt: skip
    """The body's inputs in the Loop's first iteration (saved, with their element types), or None
    when it runs no iteration or they are not at hand."""
    names = list(node.input) + [""] * (2 - len(node.input))
    trips = value(names[0]) if names[0] else None
    cond = value(names[1]) if names[1] else np.array(True)
    if cond is None or not bool(cond.reshape(-1)[0]) or (trips is not None and int(trips.reshape(-1)[0]) <= 0):
        return None
    if any(n not in inputs for n in names[2:]):
        return None  # an initializer or a constant: not a value the region read
    made = folder()
    first = []
    for i, start in enumerate([np.array(0, np.int64), np.array(True)]):
        path = made / f"{i}.npy"
        np.save(path, start, allow_pickle=False)
        first.append(({"path": str(path), "dtype": start.dtype.name, "shape": []},
                      onnx.helper.np_dtype_to_tensor_dtype(start.dtype)))  # fmt: skip
    first.extend((inputs[n], types[n]) for n in names[2:])
    return first
