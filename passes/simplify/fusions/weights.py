"""BatchNormalization, and a per-channel Mul or Add, into the Conv/ConvTranspose/Gemm before them."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir

from passes.simplify.fusions import exact
from passes.simplify.fusions._common import fusable_producer
from passes.simplify.fusions.accept import Fusion
from passes.simplify.rules import Context, Outcome, Rewrite, rule, sole_user

__all__: list[str] = []

# Weights up to this many elements are read (ResNet-style 3x3x512x512 convolutions are 2.4M).
_WEIGHT_LIMIT = 1 << 24
_WEIGHT_TYPES = frozenset({np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)})
_PARAMETER_TYPES = frozenset({"float16", "float32", "float64", "bfloat16"})


@dataclasses.dataclass
class _Layer:
    """A Conv/ConvTranspose/Gemm whose weights may be rewritten.

    Attributes:
        node: The op.
        weight: Its weight (input 1), and ``w`` its value.
        bias: Its bias (input 2), and ``b`` its value; None when absent.
        channels: The number of output channels (columns for Gemm).
        axis: The axis of ``w`` along output channels.
    """

    node: ir.Node
    weight: ir.Value
    w: np.ndarray
    bias: ir.Value | None
    b: np.ndarray | None
    channels: int
    axis: int

    def per_channel(self, vector: np.ndarray) -> np.ndarray:
        """``vector`` (one value per output channel) shaped to broadcast against the weight."""
        shape = [1] * self.w.ndim
        shape[self.axis] = self.channels
        return vector.reshape(shape)

    def bias64(self) -> np.ndarray:
        """The bias in float64; an absent one is -0, the sum's identity (x + -0 is x, -0 included)."""
        return np.full(self.channels, -0.0) if self.b is None else self.b.astype(np.float64).reshape(-1)

    def fusion(self, ctx: Context, first: Rewrite, second: Rewrite) -> Fusion:
        """``first`` then ``second``, as a fusion whose output is this op's: ``[N, M, ...]`` of the weight's
        rank for a Conv (channels on axis 1), ``[N, M]`` for a Gemm, where inference does not say more."""
        output = self.node.outputs[0]
        rank = 2 if self.node.op_type == "Gemm" else self.w.ndim
        dims = ctx.dims(output) or (None, self.channels, *([None] * (rank - 2)))

        def rewrite() -> None:
            first()
            second()

        return Fusion(rewrite, output, dims=dims)

    def rewrite(self, ctx: Context, w: np.ndarray | None, b: np.ndarray | None) -> None:
        """Replaces the weight (unless ``w`` is None) and the bias (unless ``b`` is None), rounding once."""
        node, dtype = self.node, self.w.dtype
        if w is not None:
            value = ctx.new_constant(w.astype(dtype), f"{self.weight.name or 'weight'}_fused", before=node)
            node.replace_input_with(1, value)
        if b is not None:
            base = self.bias.name if self.bias is not None and self.bias.name else f"{self.weight.name}_bias"
            value = ctx.new_constant(b.astype(dtype), f"{base or 'bias'}_fused", before=node)
            if len(node.inputs) < 3:
                node.resize_inputs(3)
            node.replace_input_with(2, value)


def _read_weights(node: ir.Node, ctx: Context) -> tuple[ir.Value, np.ndarray, ir.Value | None, np.ndarray | None] | str:
    """The constant weight (input 1) and bias (input 2) of ``node``, if this op alone uses the weight."""
    if len(node.inputs) < 2 or node.inputs[1] is None:
        return "no weight"
    weight = node.inputs[1]
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    w = ctx.constant(weight, limit=_WEIGHT_LIMIT)
    if w is None:
        return f"the {node.op_type}'s weight is not a constant (or is a graph input, or is too large)"
    if w.dtype not in _WEIGHT_TYPES:
        return f"the {node.op_type}'s weight is {w.dtype}, not float16/float/double"
    if not sole_user(weight):
        return f"the {node.op_type}'s weight has other users (it would be duplicated)"
    b = None
    if bias is not None:
        b = ctx.constant(bias, limit=_WEIGHT_LIMIT)
        if b is None:
            return f"the {node.op_type}'s bias is not a constant (or is a graph input)"
        if b.dtype != w.dtype:
            return "the bias's type differs from the weight's"
        # A shared bias is fine: it is one value per channel, and its other users keep it.
    if not np.all(np.isfinite(w)) or (b is not None and not np.all(np.isfinite(b))):
        return "the weights are not all finite"
    return weight, w, bias, b


def _conv(node: ir.Node, ctx: Context, value: ir.Value | None, op_type: str) -> _Layer | str:
    """The Conv/ConvTranspose producing ``value`` (the fused node's input), if its weights may change."""
    producer = fusable_producer(node, ctx, value, op_type)
    if isinstance(producer, str):
        return producer
    weights = _read_weights(producer, ctx)
    if isinstance(weights, str):
        return weights
    weight, w, bias, b = weights
    if w.ndim < 3:
        return f"the {op_type}'s weight has rank {w.ndim}"
    if op_type == "ConvTranspose":
        if producer.attributes.get_int("group", 1) != 1:
            return "a grouped ConvTranspose (output channels are spread over groups)"
        channels, axis = w.shape[1], 1
    else:
        channels, axis = w.shape[0], 0
    if b is not None and b.shape != (channels,):
        return f"the bias's shape {b.shape} is not [{channels}]"
    return _Layer(producer, weight, w, bias, b, channels, axis)


# --- BatchNormalization ---------------------------------------------------------------------------


def _batchnorm(node: ir.Node, ctx: Context, channels: int,
               dtype: np.dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | str:  # fmt: skip
    """``(s, mean, B, shifted)`` in float64 for an inference BatchNormalization over ``channels`` channels
    whose scale may be folded into weights of ``dtype`` (:mod:`.exact`); ``shifted`` is, per channel,
    whether ``B - mean * s`` is nonzero."""
    opset = ctx.opset
    if opset < 7:
        return "BatchNormalization before opset 7 (is_test, consumed_inputs) is not fused"
    if opset < 9 and node.attributes.get_int("spatial", 1) != 1:
        return "spatial=0 (per-activation statistics)"
    if opset >= 14:
        if node.attributes.get_int("training_mode", 0) != 0:
            return "training mode"
        if any(out.uses() or out.is_graph_output() for out in node.outputs[1:]):
            return "its running mean or variance is used"
    elif len(node.outputs) > 1:
        return "more than one output: training mode at this opset"
    if len(node.inputs) != 5 or any(v is None for v in node.inputs):
        return "not five inputs"
    params = []
    for value in node.inputs[1:]:
        array = ctx.constant(value)
        if array is None:
            return "a parameter is not a constant (or is a graph input)"
        if array.dtype.name not in _PARAMETER_TYPES:
            return f"a parameter is {array.dtype}"
        if array.shape != (channels,):
            return f"a parameter's shape {array.shape} is not [{channels}] (the channels of the op before)"
        params.append(array.astype(np.float64))
    scale, shift, mean, var = params
    epsilon = node.attributes.get_float("epsilon", 1e-5)
    with np.errstate(all="ignore"):
        inverse = 1 / np.sqrt(var + epsilon)
        s = scale * inverse
    why = exact.bias_refusal({"1 / sqrt(var + epsilon)": inverse, "the mean": mean, "B": shift}, dtype)
    if why is not None:
        return why
    shifted, why = exact.shift_refusal(s, mean, shift, dtype)
    if why is not None:
        return why
    return s, mean, shift, shifted


def _fused(layer: _Layer, s: np.ndarray, b: np.ndarray | None,
           shifted: np.ndarray | None) -> tuple[np.ndarray, str | None]:  # fmt: skip
    """The weights scaled by ``s`` per channel, and why they (or the new bias ``b``) may not be written.

    ``shifted`` as for :func:`exact.scale_refusal`; a channel whose new bias is 0 counts as not shifted.
    """
    dtype = layer.w.dtype
    w = layer.w.astype(np.float64) * layer.per_channel(s)
    if shifted is not None and b is not None:
        shifted = shifted & (b != 0) & (b.astype(dtype) != 0)
    why = (exact.scale_refusal(s, dtype, shifted=shifted) or exact.weight_refusal(layer.w, w, dtype)
           or (None if b is None else exact.bias_refusal({"the fused bias": b}, dtype)))  # fmt: skip
    return w, why


def _batchnorm_into_conv(node: ir.Node, ctx: Context, op_type: str) -> Outcome:
    layer = _conv(node, ctx, node.inputs[0] if node.inputs else None, op_type)
    if isinstance(layer, str):
        return layer
    bypass = ctx.take_place(node.outputs[0], layer.node.outputs[0])
    params = _batchnorm(node, ctx, layer.channels, layer.w.dtype)
    if isinstance(params, str):
        return params
    s, mean, shift, shifted = params
    with np.errstate(all="ignore"):
        b = (layer.bias64() - mean) * s + shift
    w, why = _fused(layer, s, b, shifted)
    if why is not None:
        return why
    return layer.fusion(ctx, lambda: layer.rewrite(ctx, w, b), bypass)


@rule("BatchNormalization", family="fuse")
def batchnorm_into_conv(node: ir.Node, ctx: Context) -> Outcome:
    return _batchnorm_into_conv(node, ctx, "Conv")


@rule("BatchNormalization", family="fuse")
def batchnorm_into_conv_transpose(node: ir.Node, ctx: Context) -> Outcome:
    return _batchnorm_into_conv(node, ctx, "ConvTranspose")


@rule("BatchNormalization", family="fuse")
def batchnorm_into_gemm(node: ir.Node, ctx: Context) -> Outcome:
    gemm = ctx.producer(node.inputs[0] if node.inputs else None, "Gemm")
    if gemm is None:
        return "its input is not a Gemm"
    if gemm.graph is not node.graph:
        return "the Gemm is in another graph"
    if ctx.opset < 7:
        return "Gemm before opset 7 (broadcast attribute) is not fused"
    if not sole_user(gemm.outputs[0]):
        return "the Gemm's output has other users (or is a graph output)"
    weights = _read_weights(gemm, ctx)
    if isinstance(weights, str):
        return weights
    weight, w, bias, c = weights
    if w.ndim != 2:
        return f"the Gemm's B has rank {w.ndim}"
    transposed = gemm.attributes.get_int("transB", 0) != 0
    channels, axis = (w.shape[0], 0) if transposed else (w.shape[1], 1)
    if c is not None:
        padded = (1,) * (2 - c.ndim) + c.shape if c.ndim <= 2 else None
        if padded is None or padded[0] != 1 or padded[1] not in (1, channels):
            return f"C of shape {c.shape} is not the same for every row"
    bypass = ctx.take_place(node.outputs[0], gemm.outputs[0])
    params = _batchnorm(node, ctx, channels, w.dtype)
    if isinstance(params, str):
        return params
    s, mean, shift, shifted = params
    layer = _Layer(gemm, weight, w, bias, c, channels, axis)
    beta = gemm.attributes.get_float("beta", 1.0)
    c64 = layer.bias64() if c is None else np.broadcast_to(c.astype(np.float64).reshape(-1), (channels,))
    with np.errstate(all="ignore"):
        new_c = (beta * c64 - mean) * s + shift
    new_w, why = _fused(layer, s, new_c, shifted)
    if why is not None:
        return why

    def rewrite() -> None:
        layer.rewrite(ctx, new_w, new_c)
        gemm.attributes.pop("beta", None)  # 1.0, the default

    return layer.fusion(ctx, rewrite, bypass)


# --- a per-channel Mul or Add -----------------------------------------------------------------------


def _per_channel(node: ir.Node, ctx: Context) -> tuple[_Layer, np.ndarray, Rewrite] | str:
    """The Conv, the constant as one float64 value per output channel, and the bypass of ``node``."""
    if len(node.inputs) != 2 or any(v is None for v in node.inputs):
        return "not two inputs"
    reason = "neither input is a Conv"
    for index in (0, 1):
        if ctx.producer(node.inputs[index], "Conv") is None:
            continue
        found = _channel_constant(node, ctx, index)
        if not isinstance(found, str):
            return found
        reason = found
    return reason


def _channel_constant(node: ir.Node, ctx: Context, index: int) -> tuple[_Layer, np.ndarray, Rewrite] | str:
    c = ctx.constant(node.inputs[1 - index])
    if c is None:
        return "the other input is not a constant (or is a graph input)"
    layer = _conv(node, ctx, node.inputs[index], "Conv")
    if isinstance(layer, str):
        return layer
    if c.dtype != layer.w.dtype:
        return f"the constant is {c.dtype}, the Conv {layer.w.dtype}"
    rank = layer.w.ndim  # the Conv's output rank
    if c.ndim > rank:
        return "the constant has a higher rank than the Conv's output"
    padded = (1,) * (rank - c.ndim) + c.shape
    if padded[0] != 1 or padded[1] not in (1, layer.channels) or any(d != 1 for d in padded[2:]):
        return f"the constant's shape {c.shape} is not per channel of a [N, {layer.channels}, ...] output"
    if not np.all(np.isfinite(c)):
        return "the constant is not finite"
    bypass = ctx.take_place(node.outputs[0], layer.node.outputs[0])
    vector = np.broadcast_to(c.astype(np.float64).reshape(-1), (layer.channels,))
    return layer, vector, bypass


@rule("Mul", family="fuse")
def mul_into_conv(node: ir.Node, ctx: Context) -> Outcome:
    found = _per_channel(node, ctx)
    if isinstance(found, str):
        return found
    layer, vector, bypass = found
    b = None if layer.b is None else layer.bias64() * vector
    w, why = _fused(layer, vector, b, None)
    if why is not None:
        return why
    return layer.fusion(ctx, lambda: layer.rewrite(ctx, w, b), bypass)


@rule("Add", family="fuse")
def add_into_conv(node: ir.Node, ctx: Context) -> Outcome:
    found = _per_channel(node, ctx)
    if isinstance(found, str):
        return found
    layer, vector, bypass = found
    b = layer.bias64() + vector
    why = exact.bias_refusal({"the fused bias": b}, layer.w.dtype)
    if why is not None:
        return why
    return layer.fusion(ctx, lambda: layer.rewrite(ctx, None, b), bypass)
