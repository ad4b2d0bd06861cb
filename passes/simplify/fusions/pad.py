"""A zero Pad into the Conv after it."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from passes.simplify.fusions._common import fusable_producer
from passes.simplify.fusions.accept import Fusion
from passes.simplify.rules import Context, Outcome, rule

__all__: list[str] = []


# --- Pad into Conv --------------------------------------------------------------------------------


@rule("Conv", family="fuse")
def pad_into_conv(node: ir.Node, ctx: Context) -> Outcome:
    """``Conv(Pad(x, pads), W, b)`` -> ``Conv(x, W, b)`` with the Pad's spatial pads added to the Conv's.

    A Conv with ``auto_pad=VALID`` pads nothing, so it takes the Pad's pads as its own
    (TensorFlow-style "same" padding exported as an asymmetric Pad before a stride-2 Conv).
    """
    pad = fusable_producer(node, ctx, node.inputs[0] if node.inputs else None, "Pad")
    if isinstance(pad, str):
        return pad
    auto_pad = node.attributes.get_string("auto_pad", "NOTSET")
    if auto_pad not in ("NOTSET", "VALID"):
        return f"the Conv's auto_pad is {auto_pad} (its pads are computed from the input's size)"
    if auto_pad == "VALID" and "pads" in node.attributes:
        return "the Conv has both auto_pad=VALID and pads"
    weight = node.inputs[1] if len(node.inputs) > 1 else None
    weight_dims = ctx.dims(weight)
    if weight_dims is None:
        return "the rank of the Conv's weight is not known"
    spatial = _zero_pads(pad, ctx, len(weight_dims))
    if isinstance(spatial, str):
        return spatial
    rank = len(weight_dims)
    pads = list(node.attributes.get_ints("pads", [0] * (2 * (rank - 2))))
    if len(pads) != 2 * (rank - 2):
        return f"the Conv's pads {pads} do not have {2 * (rank - 2)} entries"
    combined = [a + b for a, b in zip(pads, spatial)]
    source = pad.inputs[0]

    def rewrite() -> None:
        if "auto_pad" in node.attributes:
            del node.attributes["auto_pad"]  # VALID is no padding: the pads say it from now on
        node.attributes["pads"] = ir.AttrInt64s("pads", combined)
        node.replace_input_with(0, source)

    return Fusion(rewrite, node.outputs[0])  # no broadcast: the Conv's output keeps its shape


def _zero_pads(pad: ir.Node, ctx: Context, rank: int) -> list[int] | str:
    """The pads of a zero-constant ``Pad`` of rank ``rank`` on its spatial axes, in a Conv's layout."""
    mode = pad.attributes.get_string("mode", "constant")
    if mode != "constant":
        return f"the Pad's mode is {mode}"
    if ctx.opset < 11:
        pads = list(pad.attributes.get_ints("pads", []))
        value: np.ndarray | None = np.asarray(pad.attributes.get_float("value", 0.0))
        axes = None
    else:
        inputs = list(pad.inputs) + [None] * 3
        found = ctx.constant(inputs[1])
        if found is None:
            return "the Pad's pads are not a constant"
        pads = [int(v) for v in found.reshape(-1)]
        value = np.zeros(()) if inputs[2] is None else ctx.constant(inputs[2])
        if value is None:
            return "the Pad's value is not a constant"
        axes_value = inputs[3] if ctx.opset >= 18 else None
        axes = None if axes_value is None else ctx.constant(axes_value)
        if axes_value is not None and axes is None:
            return "the Pad's axes are not a constant"
    if value.size != 1 or value.reshape(-1)[0] != 0 or np.signbit(value.reshape(-1)[0]):
        return "the Pad's value is not +0"
    if axes is None:
        axes_list = list(range(len(pads) // 2))
    else:
        axes_list = [int(a) + rank if int(a) < 0 else int(a) for a in axes.reshape(-1)]
    if len(pads) != 2 * len(axes_list) or len(axes_list) != len(set(axes_list)):
        return f"the Pad's pads {pads} do not match its axes"
    if axes is None and len(axes_list) != rank:
        return f"the Pad has rank {len(axes_list)}, the Conv's weight {rank}"
    if any(not 0 <= a < rank for a in axes_list):
        return f"the Pad's axes {axes_list} are not axes of rank {rank}"
    if any(p < 0 for p in pads):
        return "the Pad crops (a negative pad)"
    begins, ends = [0] * rank, [0] * rank
    count = len(axes_list)
    for i, axis in enumerate(axes_list):
        begins[axis], ends[axis] = pads[i], pads[count + i]
    if begins[0] or ends[0] or begins[1] or ends[1]:
        return "the Pad pads the batch or channel axis"
    return begins[2:] + ends[2:]
