"""Dead-node removal that keeps the absent inputs a node needs.

onnx_ir's ``RemoveUnusedNodesPass`` removes nodes whose outputs nothing uses
(in every graph, subgraph and function) and unused initializers, and also
leaves out every kept node's absent inputs (``""``) at its end. That is the
same node only where the schema says so (:func:`passes.ir.schemas.kept_input_count`):
``Loop(M, "")`` with no loop-carried value would become ``Loop(M)``, which
neither the checker nor a runtime accepts, and a custom op's arity is unknown.
"""

from __future__ import annotations

import onnx_ir as ir
import onnx_ir.passes.common as common_passes

from passes.ir.schemas import kept_input_count
from passes.ir.walk import iter_nodes

__all__ = ["remove_unused_nodes", "remove_unused_nodes_and_say"]


def remove_unused_nodes(model: ir.Model) -> bool:
    """onnx_ir's removal of dead nodes and unused initializers; whether it changed the model.

    The inputs onnx_ir's pass left out were all absent, so each kept node gets
    back as many as :func:`passes.ir.schemas.kept_input_count` keeps (none for
    an op without a schema). Inputs left out count as a change, which onnx_ir's
    ``modified`` does not count.
    """
    return remove_unused_nodes_and_say(model)[0]


def remove_unused_nodes_and_say(model: ir.Model) -> tuple[bool, bool]:
    """:func:`remove_unused_nodes` (its result first), and whether a kept node changed: its inputs
    (absent ones at its end left out), its outputs (unused optional ones at its end left out) or its
    attributes (an inference BatchNormalization's ``training_mode``), for a caller whose findings
    hold across the removal of what nothing uses but not across a change of a node that stays."""
    counts: dict[ir.Node, tuple[int, int]] = {}
    sizes: dict[ir.Node, tuple[int, int, int]] = {}
    for node, scope in iter_nodes(model):
        inputs = node.inputs
        sizes[node] = (len(inputs), len(node.outputs), len(node.attributes))
        if not inputs or inputs[-1] is not None:  # onnx_ir leaves out absent inputs at the end only
            continue
        opset = scope.opset(node.domain)
        kept = len(inputs) if opset is None else kept_input_count(inputs, node.op_type, opset, node.domain)
        counts[node] = (len(inputs), kept)
    modified = common_passes.RemoveUnusedNodesPass()(model).modified
    for node, (before, kept) in counts.items():
        if node.graph is None:  # removed
            continue
        if len(node.inputs) < kept:
            node.resize_inputs(kept)
        modified |= len(node.inputs) != before
    kept_changed = any(node.graph is not None and (len(node.inputs), len(node.outputs), len(node.attributes)) != size
                       for node, size in sizes.items())  # fmt: skip
    return modified, kept_changed
