"""What the fusions share: the op a fused node's input comes from, if it may be rewritten."""

from __future__ import annotations

import onnx_ir as ir

from passes.simplify.rules import Context, sole_user

__all__ = ["fusable_producer"]


def fusable_producer(node: ir.Node, ctx: Context, value: ir.Value | None, op_type: str) -> ir.Node | str:
    """The ``op_type`` node producing ``value`` (an input of ``node``), if fusing it into ``node``
    removes it: in ``node``'s graph, its output used by ``node`` alone and no graph output."""
    producer = ctx.producer(value, op_type)
    if producer is None:
        return f"its input is not a {op_type}"
    if producer.graph is not node.graph:
        return f"the {op_type} is in another graph"
    if not sole_user(producer.outputs[0]):
        return f"the {op_type}'s output has other users (or is a graph output)"
    return producer
