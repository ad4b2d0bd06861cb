"""No-op nodes: ops whose output is their input, bit for bit.

Each rule makes the users of the node's output use its input instead; the
node is then dead and removed. A node whose output is a graph output stays
(see :meth:`Context.bypass`).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from passes.simplify.rules import Context, Outcome, rule
from passes.simplify.shape_values import DimOf, shape_value

__all__: list[str] = []

_INT64_BIG = 2**62


def _same_shape(ctx: Context, a: ir.Value | None, b: ir.Value | None) -> bool:
    """Whether inference proves ``a`` and ``b`` have the same shape (every dim an equal int or symbol)."""
    da, db = ctx.dims(a), ctx.dims(b)
    return da is not None and db is not None and da == db and None not in da


@rule("Identity", family="noops")
def identity(node: ir.Node, ctx: Context) -> Outcome:
    x = node.inputs[0] if node.inputs else None
    if x is None:
        return "no input"
    return ctx.bypass(node, x)


@rule("Cast", "CastLike", family="noops")
def cast_to_same_type(node: ir.Node, ctx: Context) -> Outcome:
    x = node.inputs[0]
    source = ctx.dtype(x)
    if node.op_type == "Cast":
        to = node.attributes.get_int("to", None)
        target = ir.DataType(to) if to is not None else None
    else:
        target = ctx.dtype(node.inputs[1] if len(node.inputs) > 1 else None)
    if source is None or target is None or source != target:
        return f"casts {source} to {target}"
    return ctx.bypass(node, x)


@rule("Dropout", family="noops")
def inference_dropout(node: ir.Node, ctx: Context) -> Outcome:
    if len(node.outputs) > 1 and (node.outputs[1].uses() or node.outputs[1].is_graph_output()):
        return "its mask is used"
    training = node.inputs[2] if len(node.inputs) > 2 else None
    if training is not None:
        mode = ctx.constant(training)
        if mode is None or bool(mode.reshape(-1)[0]):
            return "training_mode is not a constant false"
    return ctx.bypass(node, node.inputs[0])


def _keeps_each_dim(node: ir.Node, ctx: Context) -> bool:
    """Whether the target shape, as built, gives back every dim of the input (see shape_values).

    Reshape: entry ``i`` is dim ``i`` of the input (or ``0``, "copy", when
    allowzero is 0), except at most one ``-1``, which then can only be that
    dim too (the original fails where it would not be: a ``-1`` next to a zero
    dim). Expand: each entry, aligned from the right, is ``1`` or the input's dim.
    """
    x = node.inputs[0]
    built = shape_value(ctx, node.inputs[1] if len(node.inputs) > 1 else None)
    dims = ctx.dims(x)
    if built is None or built.scalar or dims is None:
        return False

    def is_dim(element: object, i: int) -> bool:
        if isinstance(element, DimOf):
            if element.value is x:
                return element.index == i
            other = ctx.dims(element.value)  # another tensor's dim, equal by inference's symbols
            return other is not None and element.index < len(other) and other[element.index] == dims[i] is not None
        return isinstance(element, int) and isinstance(dims[i], int) and element == dims[i] and element > 0

    entries = built.elements
    if node.op_type == "Reshape":
        copy_zero = not node.attributes.get_int("allowzero", 0)
        if len(entries) != len(dims) or list(entries).count(-1) > 1:
            return False
        return all(e == -1 or (copy_zero and e == 0) or is_dim(e, i) for i, e in enumerate(entries))
    offset = len(dims) - len(entries)
    return offset >= 0 and all(e == 1 or is_dim(e, offset + i) for i, e in enumerate(entries))


@rule("Expand", "Reshape", family="noops", name="same_shape")
def same_shape(node: ir.Node, ctx: Context) -> Outcome:
    x = node.inputs[0]
    if not (_same_shape(ctx, x, node.outputs[0]) or _keeps_each_dim(node, ctx)):
        return "the output's shape is not proved equal to the input's"
    return ctx.bypass(node, x)


@rule("Transpose", family="noops")
def identity_transpose(node: ir.Node, ctx: Context) -> Outcome:
    perm = node.attributes.get_ints("perm", None)
    if perm is None:
        dims = ctx.dims(node.inputs[0])
        if dims is None or len(dims) > 1:
            return "reverses the axes"
    elif list(perm) != list(range(len(perm))):
        return "not the identity permutation"
    return ctx.bypass(node, node.inputs[0])


@rule("Pad", family="noops")
def zero_pad(node: ir.Node, ctx: Context) -> Outcome:
    pads = ctx.constant(node.inputs[1] if len(node.inputs) > 1 else None)
    if pads is None or pads.size == 0 or np.any(pads != 0):
        return "pads are not constant zeros"
    return ctx.bypass(node, node.inputs[0])


@rule("Concat", "Sum", "Max", "Min", "Mean", family="noops", name="single_input")
def single_input(node: ir.Node, ctx: Context) -> Outcome:
    if len(node.inputs) != 1 or node.inputs[0] is None:
        return "more than one input"
    return ctx.bypass(node, node.inputs[0])


@rule("Tile", family="noops")
def tile_by_ones(node: ir.Node, ctx: Context) -> Outcome:
    repeats = ctx.constant(node.inputs[1])
    if repeats is None or np.any(repeats != 1):
        return "repeats are not constant ones"
    return ctx.bypass(node, node.inputs[0])


@rule("Unsqueeze", family="noops")
def empty_unsqueeze(node: ir.Node, ctx: Context) -> Outcome:
    axes = ctx.constant(node.inputs[1] if len(node.inputs) > 1 else None)
    if axes is None or axes.size:
        return "axes are not a constant empty list"
    return ctx.bypass(node, node.inputs[0])


@rule("Slice", family="noops")
def full_slice(node: ir.Node, ctx: Context) -> Outcome:
    """``Slice`` from 0 to the end with step 1 on every axis it names."""
    dims = ctx.dims(node.inputs[0])
    params = [ctx.constant(v) if v is not None else None for v in node.inputs[1:5]]
    starts, ends = (params + [None, None])[:2]
    if dims is None or starts is None or ends is None:
        return "input rank or starts/ends unknown"
    axes = params[2] if len(params) > 2 and params[2] is not None else np.arange(len(starts))
    steps = params[3] if len(params) > 3 and params[3] is not None else np.ones(len(starts), np.int64)
    if len(node.inputs) > 3 and node.inputs[3] is not None and params[2] is None:
        return "axes are not constant"
    if len(node.inputs) > 4 and node.inputs[4] is not None and params[3] is None:
        return "steps are not constant"
    for start, end, axis, step in zip(starts.tolist(), ends.tolist(), axes.tolist(), steps.tolist()):
        dim = dims[axis] if -len(dims) <= axis < len(dims) else None
        if start != 0 or step != 1:
            return "a start is not 0 or a step not 1"
        if end < _INT64_BIG and not (isinstance(dim, int) and end >= dim):
            return "an end may cut the axis"
    return ctx.bypass(node, node.inputs[0])
