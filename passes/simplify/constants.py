"""Main-graph ``Constant`` nodes become initializers.

A ``Constant`` node and an initializer hold the same tensor; the other tools
store constants as initializers, and users compare node counts. Only the main
graph's (IR >= 4, where an initializer need not be an input): subgraphs and
functions keep Constant nodes (see :mod:`passes.fold` for why). A Constant
that produces a graph output, or whose value is an attribute reference or a
sparse tensor, stays a node.

onnx_ir's ``LiftConstantsToInitializersPass`` is not used: it also lifts the
Constants of subgraphs into subgraph initializers, and by default skips
small tensors and the ``value_*`` forms.
"""

from __future__ import annotations

import collections

import onnx_ir as ir

from passes.ir.tensors import constant_tensor

__all__ = ["lift_main_graph_constants"]


def lift_main_graph_constants(model: ir.Model, applied: collections.Counter[str]) -> bool:
    """Turns the main graph's Constant nodes into initializers; whether any was."""
    if model.ir_version < 4:
        return False
    graph = model.graph
    lifted = []
    for node in graph:
        if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or node.outputs[0].is_graph_output():
            continue
        if "sparse_value" in node.attributes:
            continue
        tensor = constant_tensor(node, dense_limit=0)
        if tensor is None:
            continue
        lifted.append((node, tensor))
    for node, tensor in lifted:
        old = node.outputs[0]
        value = ir.Value(name=old.name, type=ir.TensorType(tensor.dtype), shape=ir.Shape(tensor.shape),
                         doc_string=old.doc_string, metadata_props=dict(old.metadata_props) or None)  # fmt: skip
        value.const_value = tensor
        old.replace_all_uses_with(value)
        old.name = None
        graph.remove(node, safe=True)
        graph.register_initializer(value)
        applied["constants/constant_to_initializer"] += 1
    return bool(lifted)
