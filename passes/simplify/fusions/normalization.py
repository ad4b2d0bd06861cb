"""The normalisations exporters write as primitive ops, into ``LayerNormalization`` (opset 17) and
``RMSNormalization`` (opset 23).

``Add(Mul(Div(d, Sqrt(Add(ReduceMean(Pow(d, 2)), eps))), scale), bias)`` with
``d = Sub(x, ReduceMean(x))`` becomes ``LayerNormalization(x, scale, bias)``
(``axis`` the first reduced axis, ``epsilon`` eps, ``stash_type`` 1: the
statistics in float32, so a float16 pattern is not computed less precisely).
Accepted forms: ``Mul(d, d)`` for the square, ``Mul(d, Reciprocal(Sqrt(...)))`` (or ``Div(1, Sqrt(...))``)
for the division, ``eps + v``, either operand order of every Mul and Add, no
``Mul`` by a scale (ones). Where it applies:

* both ReduceMeans reduce exactly the trailing axes of ``x``, the same ones, with
  ``keepdims=1``; their axes are constants (inputs from opset 18); the shape of
  those axes is static (proved by inference), so in function bodies (no shapes)
  it does not apply;
* ``eps`` is a one-element constant, finite and >= 0, added inside the square
  root; the exponent is a constant 2;
* every intermediate value is used by the pattern alone and is not a graph
  output (a mean used elsewhere keeps the pattern);
* the scale and the bias are constants that broadcast over the normalised axes
  only (a scalar or a trailing shape; written out to the normalised shape when
  they are smaller), finite; the bias is required: onnxruntime's kernel gives
  a row of -0 the output -0 where the primitive ops give +0, and adding a bias
  makes every zero output +0 in both (``a + (-a)``, ``±0 + (+0)``), so a float
  bias has no -0 entry; its float16 kernel also gives some zero outputs of a
  zero-centred row the other sign before the bias, so a float16 bias has no
  zero entry at all;
* ``x`` is float or float16 (see ``_FLOATS``), the
  model's opset is 17 or later (below it the pattern is counted as fusable at
  a higher opset), and onnxruntime's CPU provider runs LayerNormalization at
  that opset and type (probed once a pattern is found).

``Mul(scale, Mul(x, Reciprocal(Sqrt(Add(ReduceMean(Pow(x, 2)), eps)))))``
(T5, Llama; ``Div(x, Sqrt(...))`` too, and with the statistics computed on
``Cast(x, to=float)`` and the result cast back to x's type before the scale)
becomes ``RMSNormalization(x, scale)`` (``stash_type`` 1), under the same
conditions on the axes, eps, the scale and the types, from opset 23; an ``x``
that is ``x' - ReduceMean(x')`` is a LayerNorm's and left to that rule. x (or
its Cast) may have other users: the fused op reads it. Compared with
onnxruntime's kernel on the same edge values, no zero changes sign, so no bias
is needed.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir

from passes.simplify.fusions._common import (
    AtHigherOpset,
    inner,
    operands,
    ort_runs,
    replace_output,
    scalar,
)
from passes.simplify.fusions.accept import Fusion
from passes.simplify.rules import Context, Outcome, rule

__all__: list[str] = []

#: The types fused: those whose edge values (±0, NaN, ±inf) were compared with onnxruntime's kernels.
#: Its CPU provider runs bfloat16 LayerNormalization too, but that was not compared; double is not
#: fused as ``stash_type=1`` would compute it in float32.
_FLOATS = (ir.DataType.FLOAT, ir.DataType.FLOAT16)


@dataclasses.dataclass
class _Statistics:
    """A matched ``(x - mean) / sqrt(var + eps)``: its input, reduced axes and epsilon."""

    x: ir.Value
    axes: list[int]
    epsilon: float
    widened: bool = False  # x is cast to float for the statistics (RMSNorm's Llama/T5 form)


@rule("Add", family="fuse")
def layer_norm(node: ir.Node, ctx: Context) -> Outcome:
    """``Add(Mul(normalised x, scale), bias)`` -> ``LayerNormalization(x, scale, bias)``."""
    if len(node.inputs) != 2 or any(v is None for v in node.inputs):
        return "not two inputs"
    reason = "no input is a normalisation (x - mean) / sqrt(var + eps) or its product by a scale"
    for index in (0, 1):
        head, bias = node.inputs[index], node.inputs[1 - index]
        candidates: list[tuple[ir.Value | None, ir.Value | None]] = [(head, None)]
        mul = inner(ctx, head, "Mul", node.graph)
        if mul is not None and len(mul.inputs) == 2:
            candidates += [(mul.inputs[0], mul.inputs[1]), (mul.inputs[1], mul.inputs[0])]
        for normalised, scale in candidates:
            found = _statistics(ctx, normalised, node.graph)
            if isinstance(found, str):
                if not found.startswith("not "):  # the pattern began there: say where it stopped
                    reason = found
                continue
            outcome = _layer_norm(node, ctx, found, scale, bias)
            if callable(outcome) or isinstance(outcome, AtHigherOpset):
                return outcome
            reason = outcome
    return reason


def _reciprocal_factors(multiplication: ir.Node, ctx: Context) -> list[tuple[ir.Value | None, ir.Value | None]]:
    """``(other factor, d)`` for each factor of ``multiplication`` that is ``Reciprocal(d)`` or
    ``Div(1, d)`` (TorchScript's ``rsqrt``): the same correctly rounded 1/d, bit for bit."""
    found: list[tuple[ir.Value | None, ir.Value | None]] = [
        (other, reciprocal.inputs[0] if reciprocal.inputs else None)
        for reciprocal, other in operands(multiplication, ctx, "Reciprocal")
    ]
    for division, other in operands(multiplication, ctx, "Div"):
        one = ctx.constant(division.inputs[0]) if len(division.inputs) == 2 else None
        if one is not None and one.size == 1 and one.ndim <= 1 and one.dtype.kind == "f" and one.reshape(-1)[0] == 1:
            found.append((other, division.inputs[1]))
    return found


def _statistics(ctx: Context, value: ir.Value | None, graph: ir.Graph | ir.Function | None) -> _Statistics | str:
    """``value = (x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps)`` in one of the written forms."""
    division = inner(ctx, value, "Div", graph)
    pairs: list[tuple[ir.Value | None, ir.Value | None]] = []
    if division is not None and len(division.inputs) == 2:
        pairs.append((division.inputs[0], division.inputs[1]))
    else:
        multiplication = inner(ctx, value, "Mul", graph)
        if multiplication is None:
            return "not (x - mean) divided by a root"
        pairs.extend(_reciprocal_factors(multiplication, ctx))
        if not pairs:
            return "not (x - mean) times the reciprocal of a root"
    d, root_value = pairs[0]
    root = inner(ctx, root_value, "Sqrt", graph)
    if root is None:
        return "the divisor is not a square root used by it alone"
    shifted = inner(ctx, root.inputs[0], "Add", graph)
    if shifted is None:
        return "the root is not of a sum (var + eps) used by it alone"
    variance = epsilon_value = None
    for mean_node, eps in operands(shifted, ctx, "ReduceMean"):
        variance, epsilon_value = mean_node, eps
    if variance is None:
        return "the root is not of mean + eps"
    epsilon = scalar(ctx, epsilon_value)
    if epsilon is None:
        return "eps is not a one-element float constant"
    if not np.isfinite(epsilon) or epsilon < 0:
        return f"eps is {epsilon}"
    sub = ctx.producer(d, "Sub")
    if sub is None or sub.graph is not graph or d is None or d.is_graph_output():
        return "the numerator is not x - mean"
    square = _square_of(ctx, variance.inputs[0] if variance.inputs else None, d, graph)
    if isinstance(square, str):
        return square
    square_uses = 2 if square.op_type == "Mul" else 1
    if len(d.uses()) != 1 + square_uses:
        return "x - mean has other users"
    mean = inner(ctx, sub.inputs[1] if len(sub.inputs) == 2 else None, "ReduceMean", graph)
    if mean is None or not mean.inputs or mean.inputs[0] is not sub.inputs[0]:
        return "the numerator is not x - ReduceMean(x) with the mean used by it alone"
    axes = [_axes(ctx, n) for n in (mean, variance)]
    for found in axes:
        if isinstance(found, str):
            return found
    x = sub.inputs[0]
    assert x is not None
    dims = ctx.dims(x)
    if dims is None:
        return "the rank of x is not known"
    rank = len(dims)
    normalised = [sorted({a + rank if a < 0 else a for a in found}) for found in axes]  # type: ignore[union-attr]
    if normalised[0] != normalised[1]:
        return f"the mean and the variance reduce different axes ({axes[0]} and {axes[1]})"
    reduced = normalised[0]
    if not reduced or reduced != list(range(rank - len(reduced), rank)):
        return f"the reduced axes {reduced} are not the trailing axes of rank {rank}"
    if len(ctx.dims(epsilon_value) or ()) > rank:
        return "eps has a higher rank than x"
    return _Statistics(x, reduced, epsilon)


def _square_of(ctx: Context, value: ir.Value | None, d: ir.Value,
               graph: ir.Graph | ir.Function | None) -> ir.Node | str:  # fmt: skip
    """The node computing ``d * d`` or ``Pow(d, 2)`` as ``value``, used by the variance alone."""
    power = inner(ctx, value, "Pow", graph)
    if power is not None:
        if len(power.inputs) != 2 or power.inputs[0] is not d:
            return "the variance is not of a power of x - mean"
        exponent = ctx.constant(power.inputs[1])
        if exponent is None or exponent.size != 1 or float(exponent.reshape(-1)[0]) != 2.0:
            return "the power is not a constant 2"
        return power
    product = inner(ctx, value, "Mul", graph)
    if product is not None and len(product.inputs) == 2 and product.inputs[0] is d and product.inputs[1] is d:
        return product
    return "the variance is not of (x - mean) squared"


def _axes(ctx: Context, node: ir.Node) -> list[int] | str:
    """The constant, non-empty axes of a ``keepdims=1`` ReduceMean."""
    if node.attributes.get_int("keepdims", 1) != 1:
        return "a ReduceMean has keepdims=0"
    if ctx.opset >= 18:
        array = ctx.constant(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] is not None else None
        if array is None:
            return "a ReduceMean's axes are not a constant"
        axes = [int(a) for a in array.reshape(-1)]
    else:
        axes = list(node.attributes.get_ints("axes", []))
    if not axes:
        return "a ReduceMean reduces every axis (no axes)"
    return axes


def _parameter(ctx: Context, value: ir.Value | None, dtype: ir.DataType, target: tuple[int, ...],
               rank: int, label: str) -> np.ndarray | str:  # fmt: skip
    """A constant scale or bias as an array of the normalised shape ``target``."""
    array = ctx.constant(value, limit=max(int(np.prod(target)), ctx.constant_limit))
    if array is None:
        return f"the {label} is not a (small enough) constant"
    if ctx.dtype(value) != dtype:
        return f"the {label} is not of x's type"
    if array.ndim > rank:
        return f"the {label} has a higher rank than x"
    shape = array.shape
    while shape and shape[0] == 1 and len(shape) > len(target):
        shape = shape[1:]
    if len(shape) > len(target):
        return f"the {label} of shape {list(array.shape)} broadcasts over axes that are not normalised"
    try:
        broadcast = np.broadcast_shapes(shape, target)
    except ValueError:
        return f"the {label} of shape {list(array.shape)} does not broadcast to {list(target)}"
    if broadcast != target:
        return f"the {label} of shape {list(array.shape)} broadcasts the normalised {list(target)}"
    full = np.broadcast_to(array.reshape(shape), target)
    if not np.all(np.isfinite(full.astype(np.float64))):
        return f"the {label} has a non-finite entry"
    return full


def _layer_norm(node: ir.Node, ctx: Context, stats: _Statistics, scale: ir.Value | None,
                bias: ir.Value | None) -> Outcome:  # fmt: skip
    dtype = ctx.dtype(stats.x)
    if dtype not in _FLOATS:
        return f"x is {dtype.name if dtype else 'of an unknown type'} (LayerNormalization takes floats)"
    dims = ctx.dims(stats.x) or ()
    target = tuple(dims[a] for a in stats.axes)
    if not all(isinstance(d, int) for d in target):
        return f"the normalised shape {list(target)} is not static"
    static: tuple[int, ...] = target  # type: ignore[assignment]
    if bias is None:
        return "no bias"
    bias_array = _parameter(ctx, bias, dtype, static, len(dims), "bias")
    if isinstance(bias_array, str):
        return bias_array
    zeros = bias_array == 0
    if dtype == ir.DataType.FLOAT and np.any(zeros & np.signbit(bias_array)):
        return "the bias has a -0 entry (a zero output would keep the sign onnxruntime's kernel gives it)"
    if dtype != ir.DataType.FLOAT and np.any(zeros):
        return (f"the {dtype.name} bias has a zero entry (onnxruntime's {dtype.name} kernel gives some zero "
                "outputs the other sign; a bias without zeros makes every zero output +0 in both)")  # fmt: skip
    if scale is None:
        scale_array: np.ndarray | str = np.ones(static, dtype=bias_array.dtype)
    else:
        scale_array = _parameter(ctx, scale, dtype, static, len(dims), "scale")
        if isinstance(scale_array, str):
            return scale_array
    axis = -len(static)
    if ctx.opset < 17:
        return AtHigherOpset("LayerNormalization", 17, ctx.opset)
    attributes = (("axis", axis), ("epsilon", float(np.float32(stats.epsilon))), ("stash_type", 1))
    if not ort_runs("LayerNormalization", ctx.opset, dtype, [(2, *static), static, static], attributes):
        return f"onnxruntime's CPU provider has no LayerNormalization-{ctx.opset} kernel for {dtype.name}"
    if float(np.float32(stats.epsilon)) != stats.epsilon:
        return f"eps {stats.epsilon!r} is not a float32 value (the attribute's type)"

    def rewrite() -> None:
        parameters = []
        for value, array, label in ((scale, scale_array, "scale"), (bias, bias_array, "bias")):
            if value is not None and value.shape is not None and tuple(value.shape) == static:
                parameters.append(value)  # already of the normalised shape
            else:
                parameters.append(ctx.new_constant(np.ascontiguousarray(array), f"layer_norm_{label}", node))
        fused = ir.Node("", "LayerNormalization", [stats.x, *parameters],
                        [ir.AttrInt64("axis", axis), ir.AttrFloat32("epsilon", stats.epsilon),
                         ir.AttrInt64("stash_type", 1)],
                        name=ctx.names().node(f"{node.name or 'Add'}_layer_norm"))  # fmt: skip
        replace_output(node, ctx, fused)

    return Fusion(rewrite, stats.x)


# --- RMSNormalization ---------------------------------------------------------------------------------


@rule("Mul", family="fuse")
def rms_norm(node: ir.Node, ctx: Context) -> Outcome:
    """``Mul(scale, x · 1/sqrt(mean(x²) + eps))`` -> ``RMSNormalization(x, scale)`` (opset 23)."""
    if len(node.inputs) != 2 or any(v is None for v in node.inputs):
        return "not two inputs"
    reason = "no input is x / sqrt(mean(x²) + eps)"
    for index in (0, 1):
        head, scale = node.inputs[index], node.inputs[1 - index]
        back = inner(ctx, head, "Cast", node.graph)  # the statistics in float32, cast back (Llama, T5)
        found = _root_mean_square(ctx, back.inputs[0] if back is not None else head, node.graph)
        if isinstance(found, str):
            if not found.startswith("not "):
                reason = found
            continue
        outcome = _rms_norm(node, ctx, found, scale, back)
        if callable(outcome) or isinstance(outcome, AtHigherOpset):
            return outcome
        reason = outcome
    return reason


def _root_mean_square(ctx: Context, value: ir.Value | None, graph: ir.Graph | ir.Function | None) -> _Statistics | str:
    """``value = xs / sqrt(mean(xs²) + eps)`` (``Div``, or ``Mul`` by a ``Reciprocal``); ``x`` is ``xs``
    or, where ``xs = Cast(x, to=float)`` is used by the pattern alone, ``x`` (``widened``)."""
    pairs: list[tuple[ir.Value | None, ir.Node | None]] = []
    division = inner(ctx, value, "Div", graph)
    if division is not None and len(division.inputs) == 2:
        pairs.append((division.inputs[0], inner(ctx, division.inputs[1], "Sqrt", graph)))
    else:
        multiplication = inner(ctx, value, "Mul", graph)
        if multiplication is None:
            return "not x divided by a root"
        for xs, divisor in _reciprocal_factors(multiplication, ctx):
            pairs.append((xs, inner(ctx, divisor, "Sqrt", graph)))
        if not pairs:
            return "not x times the reciprocal of a root"
    xs, root = pairs[0]
    if root is None or xs is None:
        return "the divisor is not a square root used by it alone"
    shifted = inner(ctx, root.inputs[0], "Add", graph)
    if shifted is None:
        return "the root is not of a sum (mean + eps) used by it alone"
    found = operands(shifted, ctx, "ReduceMean")
    if not found:
        return "the root is not of mean + eps"
    mean, epsilon_value = found[0]
    epsilon = scalar(ctx, epsilon_value)
    if epsilon is None:
        return "eps is not a one-element float constant"
    if not np.isfinite(epsilon) or epsilon < 0:
        return f"eps is {epsilon}"
    square = _square_of(ctx, mean.inputs[0] if mean.inputs else None, xs, graph)
    if isinstance(square, str):
        return square.replace("x - mean", "x")
    # x (or its Cast) stays where it has other users: the fused op reads x, nothing it removes.
    axes = _axes(ctx, mean)
    if isinstance(axes, str):
        return axes
    cast = ctx.producer(xs, "Cast")
    widened = (cast is not None and cast.graph is graph and bool(cast.inputs) and cast.inputs[0] is not None
               and cast.attributes.get_int("to", 0) == ir.DataType.FLOAT.value)  # fmt: skip
    x = cast.inputs[0] if widened else xs  # type: ignore[union-attr]
    assert x is not None
    centred = ctx.producer(x, "Sub")
    if centred is not None and len(centred.inputs) == 2 and ctx.producer(centred.inputs[1], "ReduceMean") is not None:
        return "x is x - ReduceMean(x): a LayerNorm's statistics (the layer_norm rule's)"
    dims = ctx.dims(x)
    if dims is None:
        return "the rank of x is not known"
    rank = len(dims)
    reduced = sorted({a + rank if a < 0 else a for a in axes})
    if reduced != list(range(rank - len(reduced), rank)):
        return f"the reduced axes {reduced} are not the trailing axes of rank {rank}"
    if len(ctx.dims(epsilon_value) or ()) > rank:
        return "eps has a higher rank than x"
    return _Statistics(x, reduced, epsilon, widened)


def _rms_norm(node: ir.Node, ctx: Context, stats: _Statistics, scale: ir.Value | None,
              back: ir.Node | None) -> Outcome:  # fmt: skip
    dtype = ctx.dtype(stats.x)
    if dtype not in _FLOATS:
        return f"x is {dtype.name if dtype else 'of an unknown type'} (RMSNormalization is fused for floats)"
    if stats.widened:
        if back is None or back.attributes.get_int("to", 0) != dtype.value:
            return "the result is not cast back to x's type"
    elif back is not None:
        return "the result is cast, and x was not"
    dims = ctx.dims(stats.x) or ()
    target = tuple(dims[a] for a in stats.axes)
    if not all(isinstance(d, int) for d in target):
        return f"the normalised shape {list(target)} is not static"
    static: tuple[int, ...] = target  # type: ignore[assignment]
    scale_array = _parameter(ctx, scale, dtype, static, len(dims), "scale")
    if isinstance(scale_array, str):
        return scale_array
    if ctx.opset < 23:
        return AtHigherOpset("RMSNormalization", 23, ctx.opset)
    attributes = (("axis", -len(static)), ("epsilon", stats.epsilon), ("stash_type", 1))
    if not ort_runs("RMSNormalization", ctx.opset, dtype, [(2, *static), static], attributes):
        return f"onnxruntime's CPU provider has no RMSNormalization-{ctx.opset} kernel for {dtype.name}"
    if float(np.float32(stats.epsilon)) != stats.epsilon:
        return f"eps {stats.epsilon!r} is not a float32 value (the attribute's type)"

    def rewrite() -> None:
        if scale is not None and scale.shape is not None and tuple(scale.shape) == static:
            parameter = scale
        else:
            parameter = ctx.new_constant(np.ascontiguousarray(scale_array), "rms_norm_scale", node)
        fused = ir.Node("", "RMSNormalization", [stats.x, parameter],
                        [ir.AttrInt64("axis", -len(static)), ir.AttrFloat32("epsilon", stats.epsilon),
                         ir.AttrInt64("stash_type", 1)],
                        name=ctx.names().node(f"{node.name or 'Mul'}_rms_norm"))  # fmt: skip
        replace_output(node, ctx, fused)

    return Fusion(rewrite, stats.x)
