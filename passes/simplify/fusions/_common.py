"""What the fusions share: the op a fused node's input comes from, if it may be rewritten; for the
fusions into standard ops, the runtime's kernels, the opset a fusion waits for, and matching helpers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import onnx_ir as ir

from passes.simplify.rules import Context, sole_user

__all__ = ["AtHigherOpset", "fusable_producer", "inner", "operands", "ort_runs", "replace_output", "scalar"]


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


class AtHigherOpset(str):
    """A reason a fusion does not apply that is only the opset: ``key`` (``"Gelu@20"``) names the op
    and the opset that would take it; the simplify pass counts these (``fusable_at_higher_opset``)."""

    key: str
    stat = "fusable_at_higher_opset"

    def __new__(cls, op_type: str, since: int, opset: int) -> AtHigherOpset:
        reason = super().__new__(cls, f"a {op_type} pattern, but {op_type} is an op from opset {since} "
                                      f"(the model's is {opset})")  # fmt: skip
        reason.key = f"{op_type}@{since}"
        return reason


def inner(ctx: Context, value: ir.Value | None, op_type: str, graph: ir.Graph | ir.Function | None) -> ir.Node | None:
    """The ``op_type`` node producing ``value`` in ``graph``, if ``value`` is used by one node alone
    (once) and is not a graph output: a node a fusion may remove."""
    node = ctx.producer(value, op_type)
    if node is None or node.graph is not graph or value is None or not sole_user(value):
        return None
    return node


def operands(node: ir.Node, ctx: Context, op_type: str) -> list[tuple[ir.Node, ir.Value]]:
    """For a two-input commutative ``node``: each ``(producer, other input)`` where one input is
    made by an ``op_type`` node that ``node`` alone uses (see :func:`inner`)."""
    found = []
    if len(node.inputs) != 2 or any(v is None for v in node.inputs):
        return found
    for index in (0, 1):
        producer = inner(ctx, node.inputs[index], op_type, node.graph)
        if producer is not None:
            found.append((producer, node.inputs[1 - index]))
    return found


def scalar(ctx: Context, value: ir.Value | None) -> float | None:
    """The value of a one-element float constant, if ``value`` is one (any rank)."""
    array = ctx.constant(value)
    if array is None or array.size != 1 or array.dtype.kind != "f":
        return None
    return float(array.reshape(-1)[0])


def ort_runs(op_type: str, opset: int, dtype: ir.DataType, shapes: Sequence[tuple[int, ...]],
             attributes: Sequence[tuple[str, Any]] = ()) -> bool:  # fmt: skip
    """Whether onnxruntime's CPU provider has a kernel for ``op_type`` at ``opset`` and ``dtype``.

    Asked only once a pattern is found: the probe imports onnxruntime (see
    :func:`passes.verify.probe.runs_op`; its answer is cached for the process).
    """
    from passes.verify.probe import runs_op  # onnxruntime, only where a fusion would be written

    return runs_op(op_type, opset, int(dtype), tuple(tuple(s) for s in shapes), tuple(attributes))


def replace_output(node: ir.Node, ctx: Context, fused: ir.Node) -> None:
    """Inserts ``fused`` before ``node`` and makes its output replace ``node``'s (under its name)."""
    fused_output = fused.outputs[0]
    old = node.outputs[0]
    names = ctx.names()
    fused_output.type, fused_output.shape = old.type, old.shape
    assert node.graph is not None
    node.graph.insert_before(node, fused)
    if old.is_graph_output():
        ctx.take_place(old, fused_output)()
        return
    name = old.name or names.value(fused.op_type)
    old.name = names.value(f"{name}_replaced")
    fused_output.name = name  # its users read the name they read before
    old.replace_all_uses_with(fused_output)
