"""YOLOv5's Focus, four strided Slices concatenated on the channels, into ``SpaceToDepth``.

``Concat(x[..., 0::2, 0::2], x[..., 1::2, 0::2], x[..., 0::2, 1::2], x[..., 1::2, 1::2], axis=1)``
(the four offsets in any order) is ``SpaceToDepth(x, blocksize=2)`` with its channels reordered:
SpaceToDepth puts offset ``(i, j)`` and channel ``c`` at channel ``(2i + j) · C + c``, so a
``Gather(axis=1)`` by those indices in the Concat's order follows it (none when the order is
SpaceToDepth's own, ``(0, 0), (0, 1), (1, 0), (1, 1)``). onnxruntime's basic level writes the same
(5 nodes become 2 on a YOLOv5-style export). Both ops only move elements, so the rewrite is exact
bit for bit (NaN payloads too). Where it applies:

* each Slice (opset 10 or later: constant starts, ends, axes and steps) slices axes 2 and 3 alone
  with step 2, starts 0 or 1 and ends at or past the dim (a static dim, or an end of 2^62 and more:
  the exporters' INT64_MAX), of the same x, and is used by the Concat alone; the Concat has those
  four inputs, one per offset, on axis 1;
* x has rank 4 and a static channel count C (proved by inference; so not in function bodies);
* onnxruntime's CPU provider runs SpaceToDepth for x's type at the model's opset (probed once).

An odd or 1-long H or W fails both: the four Slices differ in size there, which the Concat refuses,
and SpaceToDepth needs multiples of 2 (an empty H or W gives an empty output in both).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from passes.simplify.fusions._common import ort_runs, replace_output
from passes.simplify.rules import Context, Outcome, rule, sole_user

__all__: list[str] = []

_PAST_ANY_DIM = 1 << 62


@rule("Concat", family="chains")
def focus_to_space_to_depth(node: ir.Node, ctx: Context) -> Outcome:
    """``Concat`` of the four 2x2 strided Slices of one x -> ``SpaceToDepth(x, 2)`` (then a channel Gather)."""
    if len(node.inputs) != 4 or node.attributes.get_int("axis", 0) not in (1, -3):
        return "not a Concat of four values on the channel axis"
    if ctx.opset < 10:
        return "Slice-1 (attributes) is not read"
    slices = [ctx.producer(v, "Slice") for v in node.inputs]
    if any(s is None or s.graph is not node.graph or not sole_user(s.outputs[0]) for s in slices):
        return "its inputs are not Slices it alone uses"
    x = slices[0].inputs[0]  # type: ignore[union-attr]
    dims = ctx.dims(x)
    if x is None or dims is None or len(dims) != 4 or not isinstance(dims[1], int):
        return "x is not proved of rank 4 with a static channel count"
    offsets = []
    for piece in slices:
        assert piece is not None
        found = _offset(ctx, piece, x, dims)
        if isinstance(found, str):
            return found
        offsets.append(found)
    if sorted(offsets) != [(0, 0), (0, 1), (1, 0), (1, 1)]:
        return f"the Slices' offsets {offsets} are not the four of a 2x2 block"
    dtype = ctx.dtype(x)
    if dtype is None or not ort_runs("SpaceToDepth", ctx.opset, dtype, [(1, 1, 2, 2)], [("blocksize", 2)]):
        return f"onnxruntime's CPU provider has no SpaceToDepth-{ctx.opset} kernel for {dtype}"
    channels = dims[1]
    order = np.array([(2 * i + j) * channels + c for i, j in offsets for c in range(channels)], np.int64)

    def rewrite() -> None:
        names = ctx.names()
        base = node.name or "focus"
        moved = ir.Node("", "SpaceToDepth", [x], [ir.AttrInt64("blocksize", 2)], name=names.node(f"{base}_s2d"))
        if np.array_equal(order, np.arange(order.size)):
            replace_output(node, ctx, moved)
            return
        moved.outputs[0].name = names.value(f"{base}_s2d")
        assert node.graph is not None
        node.graph.insert_before(node, moved)
        indices = ctx.new_constant(order, f"{base}_channels", before=node)
        gather = ir.Node("", "Gather", [moved.outputs[0], indices], [ir.AttrInt64("axis", 1)],
                         name=names.node(f"{base}_channels"))  # fmt: skip
        replace_output(node, ctx, gather)

    return rewrite


def _offset(ctx: Context, piece: ir.Node, x: ir.Value, dims: tuple) -> tuple[int, int] | str:
    """``(start on H, start on W)`` of a step-2 Slice of x's axes 2 and 3 to their ends, else why not."""
    if len(piece.inputs) != 5 or piece.inputs[0] is not x:
        return "a Slice of another value, or without axes and steps"
    arrays = [ctx.constant(v) for v in piece.inputs[1:]]
    if any(a is None or a.dtype.kind != "i" or a.size != 2 for a in arrays):
        return "a Slice whose starts, ends, axes or steps are not two constants"
    starts, ends, axes, steps = ([int(v) for v in a.reshape(-1)] for a in arrays)  # type: ignore[union-attr]
    by_axis = {a + 4 if a < 0 else a: (s, e, p) for a, s, e, p in zip(axes, starts, ends, steps)}
    if sorted(by_axis) != [2, 3]:
        return "a Slice of other axes than H and W"
    found = []
    for axis in (2, 3):
        start, end, step = by_axis[axis]
        dim = dims[axis]
        if step != 2 or start not in (0, 1):
            return "a Slice that is not x[..., a::2, b::2] with a, b in {0, 1}"
        if end < _PAST_ANY_DIM and not (isinstance(dim, int) and end >= dim):
            return "a Slice that may end before the dim"
        found.append(start)
    return found[0], found[1]
