"""Fusions: BatchNormalization and per-channel Mul/Add into a preceding Conv/ConvTranspose/Gemm, MatMul+Add
into Gemm, a zero Pad into the Conv after it.

* ``BatchNormalization(Conv(x, W, b))`` -> ``Conv(x, W', b')`` with, per output
  channel, ``s = scale / sqrt(var + epsilon)``, ``W' = W * s`` and
  ``b' = (b - mean) * s + B`` (``b`` is 0 when absent).
* The same into ``ConvTranspose`` (``group=1``: output channels are axis 1 of
  its weight) and into ``Gemm`` (a BatchNormalization of its [N, M] output
  scales the columns of ``B``; the bias becomes ``(beta * C - mean) * s + B``
  and ``beta`` 1; ``alpha`` stays).
* ``Mul(Conv(x, W, b), c)`` -> ``Conv(x, W * c, b * c)`` and
  ``Add(Conv(x, W, b), c)`` -> ``Conv(x, W, b + c)`` for a constant ``c`` that is
  a scalar or per output channel (shape [M, 1, ...] or [1, M, 1, ...], no
  broadcast beyond the Conv's output).
* ``Add(MatMul(A, B), C)`` or ``Add(C, MatMul(A, B))`` -> ``Gemm(A, B, C)``
  (alpha, beta 1, no transposes), as onnxruntime's basic level does: the
  scikit-learn MLPs' layers. No weight changes; see below for when it applies.

* ``Conv(Pad(x, pads), W, b)`` -> ``Conv(x, W, b)`` with the Pad's spatial
  pads added to the Conv's (onnxsim's ``fuse_pad_into_conv``; TorchScript
  exports of TensorFlow-style "same" padding write it). No weight changes; see
  below for when it applies.

These are the only simplifications that change float results: the new
weights are computed in float64 and rounded once to the weights' type, and the
fused op rounds differently from the two it replaces (~1e-6 relative in
float32; a Gemm may add C in its own order, without rounding A @ B first;
integers would be exact, but are not fused, see below).
``SimplifyPass(fuse=False)`` (``--no-fuse``) turns them off; the pass counts
them as ``stats["fused"]``.

A fusion into Conv/ConvTranspose/Gemm applies only where it keeps the graph's
contract and its size:

* the weight, bias and every BatchNormalization parameter are constants
  (never an initializer that is a graph input: a caller may override it);
* the weight is used by this op alone (else it would be duplicated); a shared
  bias or parameter, one value per channel, is read and left to its other users;
* the op's output is used by the fused node alone and is not a graph output;
* the BatchNormalization is in inference mode, with no other output used;
* the weights are float16, float or double (bfloat16 is refused: rounded to
  its 8 significant bits, a fused weight moves the results by up to 0.4 %).

The new weights are new constants (initializers in the main graph, Constant
nodes in subgraphs and functions); the old ones become dead and are removed.
When the fused node's output is a graph output, the op's output takes its
place there with its name, type and shape. Ranks and channel counts are read
from the constants, not from shape inference, so these rules work in function
bodies (which have no types) too.

MatMul+Add becomes a Gemm only where that is a Gemm's meaning exactly, never
with Reshapes around it (onnxsim's N-D MatMul+Add):

* opset 11 or later (Gemm-11: C optional, unidirectionally broadcast);
* A and B have rank 2, proved (:meth:`Context.dims`: inference, or a graph
  input's declared shape), so in function bodies, which have no inferred
  shapes, it does not apply;
* the MatMul is in the Add's graph, and its output is used by the Add alone
  and is not a graph output;
* C (any value, not only a constant) has a static shape of rank <= 2 whose
  dims, right-aligned, are each 1 or the MatMul's [M, N] dim: the Add's
  output is the MatMul's shape (a C of [2, N] on a [1, N] product is refused);
* A, B and C have one element type that Gemm takes at the opset (read from
  its schema) and that is a float: onnxruntime has no integer Gemm kernel (it
  has integer MatMul and Add), so an integer Gemm would not run there.
  bfloat16 is taken (from Gemm-13): no weight is rounded, the Gemm at most
  skips the rounding of A @ B to bfloat16.

The Gemm is inserted before the Add and takes its output's name (the Add's
output keeps being a graph output under its name, type and shape); the
MatMul and Add become dead and are removed.

A Pad goes into the Conv after it where the Conv's own padding means the same:

* the Pad's mode is ``constant`` and its value +0 (absent, or a constant that
  is 0 and not -0: a window of -0 padding alone would sum to -0, where the
  Conv's implicit zeros give +0);
* its pads (and, from opset 18, its ``axes``) are constants, none negative (a
  negative pad crops), and none on the batch or channel axis;
* its output is used by the Conv alone (as X) and is not a graph output, in
  the same graph;
* the Conv's ``auto_pad`` is ``NOTSET`` (explicit pads), and the rank of its
  weight (a constant or a proved shape) is the Pad's rank.

In onnxruntime the fused Conv gives the same bits: its implicit padding is
the same zeros in the same sums. The rule is a fusion (``--no-fuse`` turns it
off) all the same, as a runtime may pick another Conv kernel for the smaller
input.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir

from passes.ir import schemas
from passes.ir.types import type_string
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
        return np.zeros(self.channels) if self.b is None else self.b.astype(np.float64).reshape(-1)

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
    producer = ctx.producer(value, op_type)
    if producer is None:
        return f"its input is not a {op_type}"
    if producer.graph is not node.graph:
        return f"the {op_type} is in another graph"
    if not sole_user(producer.outputs[0]):
        return f"the {op_type}'s output has other users (or is a graph output)"
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


def _batchnorm(node: ir.Node, ctx: Context, channels: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | str:
    """``(s, mean, B)`` in float64 for an inference BatchNormalization over ``channels`` channels."""
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
        s = scale / np.sqrt(var + epsilon)
    if not (np.all(np.isfinite(s)) and np.all(np.isfinite(mean)) and np.all(np.isfinite(shift))):
        return "the parameters give a non-finite scale or shift (var + epsilon <= 0?)"
    return s, mean, shift


def _batchnorm_into_conv(node: ir.Node, ctx: Context, op_type: str) -> Outcome:
    layer = _conv(node, ctx, node.inputs[0] if node.inputs else None, op_type)
    if isinstance(layer, str):
        return layer
    bypass = ctx.take_place(node.outputs[0], layer.node.outputs[0])
    params = _batchnorm(node, ctx, layer.channels)
    if isinstance(params, str):
        return params
    s, mean, shift = params
    w = layer.w.astype(np.float64) * layer.per_channel(s)
    b = (layer.bias64() - mean) * s + shift
    return _then(lambda: layer.rewrite(ctx, w, b), bypass)


def _then(first: Rewrite, second: Rewrite) -> Rewrite:
    def rewrite() -> None:
        first()
        second()

    return rewrite


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
    params = _batchnorm(node, ctx, channels)
    if isinstance(params, str):
        return params
    s, mean, shift = params
    layer = _Layer(gemm, weight, w, bias, c, channels, axis)
    beta = gemm.attributes.get_float("beta", 1.0)
    c64 = np.zeros(channels) if c is None else np.broadcast_to(c.astype(np.float64).reshape(-1), (channels,))
    new_w = w.astype(np.float64) * layer.per_channel(s)
    new_c = (beta * c64 - mean) * s + shift

    def rewrite() -> None:
        layer.rewrite(ctx, new_w, new_c)
        gemm.attributes.pop("beta", None)  # 1.0, the default

    return _then(rewrite, bypass)


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
    w = layer.w.astype(np.float64) * layer.per_channel(vector)
    b = None if layer.b is None else layer.bias64() * vector
    return _then(lambda: layer.rewrite(ctx, w, b), bypass)


@rule("Add", family="fuse")
def add_into_conv(node: ir.Node, ctx: Context) -> Outcome:
    found = _per_channel(node, ctx)
    if isinstance(found, str):
        return found
    layer, vector, bypass = found
    b = layer.bias64() + vector
    return _then(lambda: layer.rewrite(ctx, None, b), bypass)


# --- MatMul and Add into Gemm -------------------------------------------------------------------------


@rule("Add", family="fuse")
def matmul_add_into_gemm(node: ir.Node, ctx: Context) -> Outcome:
    """``Add(MatMul(A, B), C)`` or ``Add(C, MatMul(A, B))`` -> ``Gemm(A, B, C)`` for proven matrices."""
    if len(node.inputs) != 2 or any(v is None for v in node.inputs):
        return "not two inputs"
    reason = "neither input is a MatMul"
    for index in (0, 1):
        matmul = ctx.producer(node.inputs[index], "MatMul")
        c = node.inputs[1 - index]
        if matmul is None or c is None:
            continue
        found = _matmul_add(node, ctx, matmul, c)
        if not isinstance(found, str):
            return found
        reason = found
    return reason


def _matmul_add(node: ir.Node, ctx: Context, matmul: ir.Node, c: ir.Value) -> Outcome:
    opset = ctx.opset
    if opset < 11:
        return f"opset {opset} is before 11 (Gemm-11: C optional, unidirectionally broadcast to [M, N])"
    if matmul.graph is not node.graph:
        return "the MatMul is in another graph"
    if not sole_user(matmul.outputs[0]):
        return "the MatMul's output has other users (or is a graph output)"
    if len(matmul.inputs) != 2 or any(v is None for v in matmul.inputs):
        return "the MatMul has not two inputs"
    a, b = matmul.inputs
    matrices = []
    for label, value in (("A", a), ("B", b)):
        dims = ctx.dims(value)
        if dims is None:
            return f"the rank of the MatMul's {label} is not known (Gemm takes matrices only)"
        if len(dims) != 2:
            return f"the MatMul's {label} has rank {len(dims)} (Gemm takes matrices only)"
        matrices.append(dims)
    result = (matrices[0][0], matrices[1][1])  # [M, N]; a dim may be a symbol or None
    c_dims = ctx.static_dims(c)
    if c_dims is None:
        return "C's shape is not known statically"
    if len(c_dims) > 2:
        return f"C has rank {len(c_dims)}: the Add broadcasts the MatMul's result"
    padded = (1,) * (2 - len(c_dims)) + c_dims
    if any(d != 1 and d != want for d, want in zip(padded, result)):
        shown = ["?" if d is None else d for d in result]
        return f"C of shape {list(c_dims)} is not proven to broadcast to the MatMul's {shown} (it may broadcast it)"
    dtypes = {ctx.dtype(v) for v in (a, b, c)}
    dtype = dtypes.pop() if len(dtypes) == 1 else None
    if dtype is None:
        return "the element types of A, B and C are not known (or differ)"
    schema = schemas.schema_at("Gemm", opset)
    allowed = {t for constraint in schema.type_constraints for t in constraint.allowed_type_strs} if schema else ()
    if type_string(dtype) not in allowed:
        return f"{dtype.name} is not a Gemm type at opset {opset}"
    if not dtype.is_floating_point():
        return f"{dtype.name}: onnxruntime has no integer Gemm kernel (it has integer MatMul and Add ones)"
    return lambda: _write_gemm(node, ctx, matmul, c)


def _write_gemm(node: ir.Node, ctx: Context, matmul: ir.Node, c: ir.Value) -> None:
    """A ``Gemm(A, B, c)`` before the Add, taking the Add's output's place and name."""
    old = node.outputs[0]
    names = ctx.names()
    gemm = ir.Node("", "Gemm", [*matmul.inputs, c], name=names.node(f"{matmul.name or 'MatMul'}_gemm"))
    new = gemm.outputs[0]
    new.type, new.shape = old.type, old.shape  # what the model declared of the Add's output, if anything
    assert node.graph is not None
    node.graph.insert_before(node, gemm)  # A and B come before the MatMul, C before the Add
    if old.is_graph_output():
        ctx.take_place(old, new)()
        return
    name = old.name or names.value("gemm")
    old.name = names.value(f"{name}_replaced")
    new.name = name  # its users read the name they read before
    old.replace_all_uses_with(new)


# --- Pad into Conv --------------------------------------------------------------------------------


@rule("Conv", family="fuse")
def pad_into_conv(node: ir.Node, ctx: Context) -> Outcome:
    """``Conv(Pad(x, pads), W, b)`` -> ``Conv(x, W, b)`` with the Pad's spatial pads added to the Conv's."""
    pad = ctx.producer(node.inputs[0] if node.inputs else None, "Pad")
    if pad is None:
        return "its input is not a Pad"
    if pad.graph is not node.graph:
        return "the Pad is in another graph"
    if not sole_user(pad.outputs[0]):
        return "the Pad's output has other users (or is a graph output)"
    if node.attributes.get_string("auto_pad", "NOTSET") != "NOTSET":
        return f"the Conv's auto_pad is {node.attributes.get_string('auto_pad')} (its pads are computed)"
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
        node.attributes["pads"] = ir.AttrInt64s("pads", combined)
        node.replace_input_with(0, source)

    return rewrite


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
