"""Dead-node removal that keeps every output of a node that stays, and the absent inputs it needs.

Nodes whose outputs nothing uses go (in every graph, subgraph and function, a
node's subgraphs swept after the nodes that follow it, as onnx_ir's
``RemoveUnusedNodesPass`` does), and so do the main graph's unused initializers
that are neither graph inputs nor outputs. Unlike onnx_ir's pass, a node that
stays keeps all its outputs: onnx_ir leaves out unused optional ones, and that
can change the kernel onnxruntime picks and what it computes (a MaxPool without
its ``Indices`` runs a kernel that makes a NaN in a window the window's maximum,
where the original's gives NaN). A kept node's absent inputs (``""``) at its end
are left out only where the schema allows it (:func:`passes.ir.schemas.trim_absent_inputs`):
``Loop(M, "")`` with no loop-carried value would become ``Loop(M)``, which
neither the checker nor a runtime accepts, and a custom op's arity is unknown.
"""

from __future__ import annotations

import onnx_ir as ir

from passes.ir.schemas import trim_absent_inputs
from passes.ir.walk import opset_of

__all__ = ["remove_unused_nodes", "remove_unused_nodes_and_say"]


_GRAPH_TYPES = (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)


def remove_unused_nodes(model: ir.Model) -> bool:
    """Removes dead nodes and unused initializers (see the module); whether it changed the model."""
    return remove_unused_nodes_and_say(model)[0]


def remove_unused_nodes_and_say(model: ir.Model) -> tuple[bool, bool]:
    """:func:`remove_unused_nodes` (its result first), and whether a node that stays changed (absent
    inputs at its end left out), for a caller whose findings hold across the removal of what nothing
    uses but not across a change of a node that stays."""
    state = [False, False]  # removed something, a kept node changed
    main = model.opset_imports
    _sweep(model.graph, main, state)
    for function in model.functions.values():
        _sweep(function, {**main, **function.opset_imports}, state)
    graph = model.graph
    used = frozenset((*graph.inputs, *graph.outputs))
    for value in list(graph.initializers.values()):
        if not value.uses() and value not in used:
            assert value.name is not None
            del graph.initializers[value.name]
            state[0] = True
    return state[0] or state[1], state[1]


def _sweep(graph: ir.Graph | ir.Function, opsets: dict[str, int], state: list[bool]) -> None:
    outputs = frozenset(graph.outputs)
    for node in reversed(graph):
        for o in node.outputs:  # a loop, not any(): no generator a node (a sweep walks every node)
            if o in outputs or o.uses():
                break
        else:
            graph.remove(node, safe=True)
            state[0] = True
            continue
        inputs = node.inputs
        if inputs and inputs[-1] is None and trim_absent_inputs(node, opset_of(opsets, node.domain)):
            state[1] = True
        stored = node.attributes
        for attr in getattr(stored, "data", stored).values():  # the attributes' own dict, without a view
            if attr.type not in _GRAPH_TYPES or attr.is_ref():
                continue
            if attr.type == ir.AttributeType.GRAPH:
                _sweep(attr.as_graph(), {**opsets, **attr.as_graph().opset_imports}, state)
            elif attr.type == ir.AttributeType.GRAPHS:
                for sub in attr.as_graphs():
                    _sweep(sub, {**opsets, **sub.opset_imports}, state)
