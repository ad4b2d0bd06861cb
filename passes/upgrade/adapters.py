"""Per-op adapters of the opset upgrade: the schema changes that break the old meaning.

An adapter handles one *schema step* of one operator: the change between the
schema that applied before ``since`` and the one introduced at ``since`` (for
example ``("ReduceMean", 18)``: ``axes`` moved from an attribute to an input).
Adapters never touch the graph while planning. They edit a
:class:`~passes.upgrade.draft.Draft` (op type, attributes, inputs, number of
outputs) and may queue *hooks*, small graph edits run only once every node of
the model has been planned; a plan that fails leaves the model untouched.
An adapter whose step changes a meaning that the schemas do not show carries
the description of that change (``change``); :mod:`passes.upgrade.registry`
holds them, with the few such changes that have no adapter.

The adapters cover the breaking steps of onnx's own C++ converter
(``onnx/version_converter/convert.h``) that exporters emit, with the
corrections needed to keep the exact onnxruntime results (Resize-10 and
Upsample nearest rounding, BatchNormalization training mode, Hardmax-13).
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from passes.upgrade.attributes import (
    AttributeToInput,
    as_adapters,
    int_attr,
    string_attr,
    typed_scalar,
)
from passes.upgrade.draft import Draft, Edits, dtype_of
from passes.upgrade.plan import PlanContext
from passes.upgrade.registry import add, constant_array, register
from passes.upgrade.schemas import reduce_ops_by_axes_version

__all__ = ["ATTRIBUTE_TO_INPUT"]

def _is_used(value: ir.Value) -> bool:
    return bool(value.uses()) or value.is_graph_output()


# --- attribute -> input ----------------------------------------------------------------------

#: Attributes that became inputs, all moved by one body (:meth:`AttributeToInput.move`);
#: the rows of one (op, version) make one adapter, which moves them in order.
ATTRIBUTE_TO_INPUT: tuple[AttributeToInput, ...] = (
    # No axes, or axes=[], reduces over all axes; the new version says the same with
    # no axes input and noop_with_empty_axes left at its default 0. (ReduceSum-13,
    # the others at 18, as the schemas say.)
    *(
        AttributeToInput(op_types, since, "axes", 1, keep_empty=False)
        for since, op_types in reduce_ops_by_axes_version().items()
    ),
    AttributeToInput(("Squeeze",), 13, "axes", 1, keep_empty=False),
    AttributeToInput(("Unsqueeze",), 13, "axes", 1),
    AttributeToInput(("Split",), 13, "split", 1, keep_empty=False),
    AttributeToInput(("Slice",), 10, "starts", 1, required=True),
    AttributeToInput(("Slice",), 10, "ends", 2, required=True),
    AttributeToInput(("Slice",), 10, "axes", 3),
    AttributeToInput(("TopK",), 10, "k", 1, scalar_to_1d=True, required=True),
    AttributeToInput(("Upsample",), 9, "scales", 1, required=True),
    # The ratio input defaults to 0.5, as the attribute did; the inference behaviour
    # is unchanged. Spec and onnxruntime disagree on the inference-mode mask of
    # Dropout-10/11: the onnx reference gives all True, as for Dropout-12+,
    # onnxruntime's Dropout-10 kernel all False. The spec decides: the mask is kept.
    AttributeToInput(("Dropout",), 12, "ratio", 1),
    AttributeToInput(("DFT",), 20, "axis", 2, old_default=1, base_name="dft_axis",  # DFT-17's default
                     change="the default axis changed from 1 to -2"),
)


for _adapter in as_adapters(ATTRIBUTE_TO_INPUT):
    add(_adapter)


# --- other changes of inputs, attributes and outputs -----------------------------------------


@register("Split", 18, "num_outputs from the outputs",
           change="without a 'split' input the 'num_outputs' attribute is required")
def _split_18(draft: Draft, ctx: PlanContext) -> str | None:
    if draft.input(1) is None and "num_outputs" not in draft.attributes:
        draft.attributes["num_outputs"] = ir.AttrInt64("num_outputs", draft.num_outputs)
    return None


_PADS = AttributeToInput(("Pad",), 11, "pads", 1, required=True)


def _is_plus_zero(value: float) -> bool:
    return value == 0.0 and math.copysign(1.0, value) > 0


@register("Pad", 11, "pads/value attributes -> inputs")
def _pad_11(draft: Draft, ctx: PlanContext) -> str | None:
    if reason := _PADS.move(draft, ctx):
        return reason
    value = draft.attributes.pop("value", None)
    mode = string_attr(draft, "mode", "constant")
    if mode is None:
        return "attribute 'mode' is a reference"
    if value is None or mode != "constant" or (not value.is_ref() and _is_plus_zero(value.as_float())):
        return None  # constant_value defaults to +0 (a -0 pad is written: its sign shows), other modes ignore it
    scalar = typed_scalar(value, ctx, draft.input(0), "pad_value")
    if isinstance(scalar, str):
        return scalar
    draft.set_input(2, scalar)
    return None


@register("Clip", 11, "min/max attributes -> inputs")
def _clip_11(draft: Draft, ctx: PlanContext) -> str | None:
    for index, name in ((1, "min"), (2, "max")):
        attr = draft.attributes.pop(name, None)
        if attr is None:
            continue  # an absent bound is an absent input: no clipping on that side
        scalar = typed_scalar(attr, ctx, draft.input(0), f"clip_{name}")
        if isinstance(scalar, str):
            return scalar
        draft.set_input(index, scalar)
    return None


@register("Dropout", 10, "drop the unused mask output", change="the 'mask' output became tensor(bool)")
def _dropout_10(draft: Draft, ctx: PlanContext) -> str | None:
    if draft.num_outputs > 1:
        if _is_used(draft.outputs[1]):
            return "the 'mask' output is used and its type changes to bool"
        draft.num_outputs = 1
    return None


# --- renamed / deprecated ops ----------------------------------------------------------------


@register("Upsample", 10, "Upsample -> Resize", change="Upsample is deprecated in favour of Resize")
def _upsample_10(draft: Draft, ctx: PlanContext) -> str | None:
    # Upsample-9 and Resize-10 have the same inputs and attributes; the Resize-11
    # step then pins Upsample's coordinate rules.
    draft.op_type = "Resize"
    draft.notes.add("upsample")
    return None


@register("Scatter", 11, "Scatter -> ScatterElements", change="Scatter is deprecated in favour of ScatterElements")
def _scatter_11(draft: Draft, ctx: PlanContext) -> str | None:
    draft.op_type = "ScatterElements"
    return None


@register("Resize", 11, "pin Resize-10 coordinates",
           change="Resize-10 used asymmetric coordinates; the new default is half_pixel")
def _resize_11(draft: Draft, ctx: PlanContext) -> str | None:
    """Resize-10 (and Upsample) map output x to input x / scale (asymmetric).

    For nearest, onnxruntime and the opset-10 conformance tests take floor when
    upsampling and ceil when downsampling, per axis. One ``nearest_mode`` can
    only say that when all scales are known and on the same side of 1 (Upsample
    scales are >= 1 by definition).
    """
    mode = string_attr(draft, "mode", "nearest")
    if mode is None:
        return "attribute 'mode' is a reference"
    draft.inputs = [draft.input(0), None, draft.input(1)]  # roi is inserted before scales
    draft.attributes["coordinate_transformation_mode"] = ir.AttrString(
        "coordinate_transformation_mode", "asymmetric"
    )
    if mode != "nearest":
        return None
    if "upsample" in draft.notes:
        nearest = "floor"
    else:
        scales = constant_array(draft.input(2))
        if scales is None:
            return "nearest mode with scales unknown before run time"
        if np.all(scales >= 1):
            nearest = "floor"
        elif np.all(scales <= 1):
            nearest = "ceil"
        else:
            return "nearest mode with scales both above and below 1"
    draft.attributes["nearest_mode"] = ir.AttrString("nearest_mode", nearest)
    return None


@register("Resize", 13, "check removed modes",
           change="coordinate_transformation_mode 'tf_half_pixel_for_nn' was removed")
def _resize_13(draft: Draft, ctx: PlanContext) -> str | None:
    if string_attr(draft, "coordinate_transformation_mode", "half_pixel") in (None, "tf_half_pixel_for_nn"):
        return "coordinate_transformation_mode 'tf_half_pixel_for_nn' has no equivalent"
    return None


@register("RoiAlign", 16, "pin output_half_pixel",
           change="the new default coordinate_transformation_mode 'half_pixel' shifts every sample")
def _roialign_16(draft: Draft, ctx: PlanContext) -> str | None:
    if "coordinate_transformation_mode" not in draft.attributes:
        draft.attributes["coordinate_transformation_mode"] = ir.AttrString(
            "coordinate_transformation_mode", "output_half_pixel"
        )
    return None


@register("GridSample", 20, "rename modes", change="modes 'bilinear'/'bicubic' were renamed 'linear'/'cubic'")
def _gridsample_20(draft: Draft, ctx: PlanContext) -> str | None:
    mode = string_attr(draft, "mode", "bilinear")
    if mode is None:
        return "attribute 'mode' is a reference"
    renamed = {"bilinear": "linear", "bicubic": "cubic"}.get(mode)
    if renamed is not None and "mode" in draft.attributes:
        draft.attributes["mode"] = ir.AttrString("mode", renamed)
    return None


# --- BatchNormalization ----------------------------------------------------------------------


@register("BatchNormalization", 9, "drop spatial=1")
def _batchnorm_9(draft: Draft, ctx: PlanContext) -> str | None:
    spatial = int_attr(draft, "spatial", 1)
    if spatial != 1:
        return "spatial=0 (per-activation statistics) has no equivalent"
    draft.attributes.pop("spatial", None)
    return None


@register("BatchNormalization", 14, "training outputs -> training_mode",
           change="training mode is set by 'training_mode' instead of the number of outputs")
def _batchnorm_14(draft: Draft, ctx: PlanContext) -> str | None:
    """Opset 9-13 runs in training mode when it has more than one output.

    Opset 14 says so with ``training_mode=1`` and exactly three outputs (Y,
    running mean, running variance); saved_mean and saved_var are gone.
    """
    if draft.num_outputs == 1:
        return None
    for index in (3, 4):
        if index < draft.num_outputs and _is_used(draft.outputs[index]):
            name = "saved_mean" if index == 3 else "saved_var"
            return f"output {index} ({name}) is used and no longer exists"
    draft.num_outputs = 3
    draft.attributes["training_mode"] = ir.AttrInt64("training_mode", 1)
    draft.hooks.append(_name_outputs)
    return None


def _name_outputs(node: ir.Node, rw: Edits) -> None:
    """Names outputs that the new schema requires but the old node left unnamed."""
    for index, value in enumerate(node.outputs):
        if not value.name:
            value.name = rw.fresh_value_name(f"{node.name or node.op_type}_output_{index}")


# --- Softmax family --------------------------------------------------------------------------


@register(("Softmax", "LogSoftmax", "Hardmax"), 13, "2-D coercion -> one axis (Flatten/Reshape unless it is the last)",
           change="'axis' no longer flattens the input to 2-D")
def _softmax_13(draft: Draft, ctx: PlanContext) -> str | None:
    """Up to opset 12 the op flattens the input to 2-D at ``axis`` and works on rows.

    If ``axis`` is the last axis that is the same as opset 13; otherwise
    ``Reshape(op(Flatten(x, axis), axis=-1), Shape(x), allowzero=1)``, exact for zero-sized dims too.
    At a target below 14 Reshape has no ``allowzero`` (a 0 in ``Shape(x)`` would copy a dim of the
    2-D value): the wrapping is then written only where every dim of ``x`` is known and positive.
    """
    axis = int_attr(draft, "axis", 1)
    if axis is None:
        return "attribute 'axis' is a reference"
    x = draft.input(0)
    rank = ctx.rank_of(x) if isinstance(x, ir.Value) else None
    last = axis == -1 or (rank is not None and (axis + rank if axis < 0 else axis) == rank - 1)
    if last:
        draft.attributes["axis"] = ir.AttrInt64("axis", axis)
        return None
    allowzero = ctx.target >= _RESHAPE_ALLOWZERO
    if not allowzero:
        shape = ctx.shape_of(x) if isinstance(x, ir.Value) else None
        if shape is None or not all(isinstance(d, int) and d > 0 for d in shape):
            return (f"flattening at axis {axis} and back needs Reshape's allowzero (opset {_RESHAPE_ALLOWZERO})"
                    " unless every dim of the input is known and positive: choose --target-opset"
                    f" {_RESHAPE_ALLOWZERO} or higher")
    draft.attributes["axis"] = ir.AttrInt64("axis", -1)
    draft.hooks.append(lambda node, rw: _wrap_in_flatten(node, rw, axis, allowzero))
    return None


#: The opset whose Reshape has ``allowzero``.
_RESHAPE_ALLOWZERO = 14


def _wrap_in_flatten(node: ir.Node, rw: Edits, axis: int, allowzero: bool) -> None:
    x = node.inputs[0]
    assert x is not None
    base = node.name or node.op_type
    shape = rw.add_node("Shape", [x], base_name=f"{base}_shape", before=node)
    flat = rw.add_node("Flatten", [x], [ir.AttrInt64("axis", axis)], base_name=f"{base}_flatten", before=node)
    node.replace_input_with(0, flat.outputs[0])
    y = node.outputs[0]
    # allowzero=1: a 0 in Shape(x) is a zero-sized dim, not "copy the 2-D input's dim" (which fails or
    # is wrong). Without it (a target below 14) the planner made sure no dim is 0.
    reshape = rw.add_node("Reshape", [y, shape.outputs[0]], [ir.AttrInt64("allowzero", 1)] if allowzero else [],
                          base_name=f"{base}_reshape", after=node)  # fmt: skip
    result = reshape.outputs[0]
    # Every reader of y, drafts of nodes still to be committed included (a Clip-11 or Squeeze-13
    # after the Softmax was planned reading y), reads the reshaped value.
    rw.redirect(y, result)
    reshape.replace_input_with(0, y)
    # The user-visible name and type stay on the final value.
    result.name, y.name = y.name, rw.fresh_value_name(f"{y.name}_2d")
    result.type, result.shape = y.type, y.shape
    y.shape = None


# --- GroupNormalization ----------------------------------------------------------------------


@register("GroupNormalization", 21, "per-group scale/bias -> per-channel",
           change="scale and bias are per channel instead of per group")
def _groupnorm_21(draft: Draft, ctx: PlanContext) -> str | None:
    """Opset 18 scale/bias have one value per group, opset 21 one per channel.

    Each value is repeated C / num_groups times. Opset 18 computes in the input
    type (its function body); opset 21 computes the statistics in ``stash_type``
    (default float), so it is pinned to the input type. onnxruntime computes
    opset 18 in float for float16 inputs, against its function body; the spec
    decides, so float16 results differ from onnxruntime's by rounding.
    """
    groups = int_attr(draft, "num_groups", 0)
    if groups is None or groups <= 0:
        return "attribute 'num_groups' is a reference or missing"
    dtype = dtype_of(draft.input(0))
    if dtype is None:
        return "the input's element type is unknown, so stash_type cannot be pinned"
    if dtype != ir.DataType.FLOAT:
        draft.attributes["stash_type"] = ir.AttrInt64("stash_type", int(dtype))
    x = draft.input(0)
    channels = None
    shape = x.shape if isinstance(x, ir.Value) else None
    if shape is not None and shape.rank() >= 2 and isinstance(shape[1], int):
        channels = shape[1]
    draft.hooks.append(lambda node, rw: _repeat_per_channel(node, rw, groups, channels))
    return None


def _repeat_per_channel(node: ir.Node, rw: Edits, groups: int, channels: int | None) -> None:
    base = node.name or node.op_type
    if channels is not None:
        repeats = rw.const(np.asarray([1, channels // groups], np.int64), "groupnorm_repeat")
    else:
        c = rw.add_node(
            "Shape",
            [node.inputs[0]],
            [ir.AttrInt64("start", 1), ir.AttrInt64("end", 2)],
            base_name=f"{base}_channels",
            before=node,
        )
        per_group = rw.add_node(
            "Div",
            [c.outputs[0], rw.const(np.asarray([groups], np.int64), "num_groups")],
            base_name=f"{base}_per_group",
            before=node,
        )
        repeats = rw.add_node(
            "Concat",
            [rw.const(np.asarray([1], np.int64), "one"), per_group.outputs[0]],
            [ir.AttrInt64("axis", 0)],
            base_name=f"{base}_repeat",
            before=node,
        ).outputs[0]
    column = rw.const(np.asarray([-1, 1], np.int64), "column_shape")
    flat = rw.const(np.asarray([-1], np.int64), "flat_shape")
    for index, name in ((1, "scale"), (2, "bias")):
        value = node.inputs[index]
        col = rw.add_node("Reshape", [value, column], base_name=f"{base}_{name}_col", before=node)
        wide = rw.add_node("Expand", [col.outputs[0], repeats], base_name=f"{base}_{name}_wide", before=node)
        per_channel = rw.add_node("Reshape", [wide.outputs[0], flat], base_name=f"{base}_{name}_c", before=node)
        node.replace_input_with(index, per_channel.outputs[0])
