"""What the chain rules share: the inner node of a chain, a node's constant axes, rewiring."""

from __future__ import annotations

import onnx_ir as ir

from passes.simplify.rules import Context, sole_user

__all__ = ["axes_of", "inner_node", "rewire"]


def inner_node(node: ir.Node, ctx: Context, op_type: str, shared: bool = False) -> ir.Node | str:
    """The ``op_type`` node feeding ``node``, if merging them removes it.

    It must have no other user (else the chain would be computed twice), or,
    with ``shared``, only users of ``node``'s own op type, which each merge it
    into themselves (a shared ``Unsqueeze`` feeding two ``Unsqueeze``: three
    nodes become two).
    """
    inner = ctx.producer(node.inputs[0], op_type)
    if inner is None:
        return f"its input is not a {op_type}"
    output = inner.outputs[0]
    if sole_user(output):
        return inner
    if shared and not output.is_graph_output() and all(
            user.op_type == node.op_type and user.domain == node.domain and index == 0 for user, index in output.uses()):
        return inner
    return f"the {op_type} has other users"


def axes_of(node: ir.Node, ctx: Context) -> list[int] | None:
    """The node's constant ``axes`` (input at opset >= 13, else attribute)."""
    if len(node.inputs) > 1:
        axes = ctx.constant(node.inputs[1])
        return None if axes is None else [int(a) for a in axes.reshape(-1)]
    if "axes" in node.attributes:
        return list(node.attributes.get_ints("axes", []))
    return None


def rewire(node: ir.Node, source: ir.Value) -> None:
    node.replace_input_with(0, source)
