"""Scaled dot-product attention exporters write as primitive ops, into ``Attention`` (opset 23).

``MatMul(Softmax(scale · MatMul(Q, Kᵀ) [+ mask], axis=-1), V)`` becomes
``Attention(Q, K, V[, mask], scale=scale)``. Accepted forms: the scale as ``Mul`` by a
one-element constant (either order), ``Div`` by a power of two, split between Q and Kᵀ
(``MatMul(Q · √s, Kᵀ · √s)``, the TorchScript and dynamo exporters' ``sdpa``), or absent
(scale 1); the mask added in either order. onnxruntime's kernel computes ``(Q @ Kᵀ) · scale``
with the rounding of ``Mul(MatMul(Q, Kᵀ), scale)`` (bit for bit in our trials). A ``Div`` by √8
rounds the scores otherwise (the kernel multiplies by its inverse), and the Softmax turns an ulp of
a large score into a relative change of the same size in its output: on ``x · 30 + 5`` inputs
beyond the check's float tolerance (1.9e-3 in 4 of 20 trials at D = 8), so a Div is taken only
by a power of two, which scales exactly. A split factor that is a power of two goes into the
scale (exact too); another (8^-¼ at D = 8) stays where it is: Q keeps its ``Mul``, and K is
``Mul(K, f)`` (a scalar commutes with the Transpose exactly), so the kernel rounds as the chain
does. A split factor that is not a constant yet (the exporters' ``Sqrt`` of a shape's scale,
which folds) waits for it.

``K`` is ``Kᵀ``'s Transpose source with the composed permutation (BERT's
``Transpose(perm=[0, 2, 3, 1])`` of the ``[B, L, H, D]`` projection becomes one
``Transpose(perm=[0, 2, 1, 3])``; none where the permutations cancel), or a new Transpose of ``Kᵀ``.
K and V repeated by Llama's ``repeat_kv`` (``Reshape(Expand(Unsqueeze(x, [2]), [b, h, n, l, d]),
[b, h·n, l, d])``, every dim proved, the same n for both) are read before the repeat: the kernel's
grouped-query attention gives head ``i`` of Q head ``i // n`` of K and V, the same bits (compared
on edge values).

Where it applies:

* Q, Kᵀ and V are proved of rank 4 (so not in function bodies, which have no shapes) with the
  same batch and the same heads (the same int or symbol): onnxruntime's kernel does not broadcast
  them as MatMul does (it refuses a Q of batch 1 against a K of batch 2);
* the Softmax is on the last axis (opset 13 or later: Softmax-11 normalises the flattened
  trailing axes); every intermediate (the scores, the scaled scores, their sum with the mask, the
  Softmax, the scaled Q and Kᵀ) is used by the pattern alone and is not a graph output;
* the scale is the product of one-element float constants of rank <= 4, finite, positive and
  normal in float (a zero scale makes ``inf · 0`` NaN; the kernel's attribute is a float);
* the mask is a float of rank 2 to 4 whose last two dims are proved to be the query's and the
  keys' sequence lengths (the kernel refuses a mask broadcast on those axes, which ``Add`` takes)
  and whose leading dims are 1 or the batch and heads;
* **no row of the mask is fully masked** (every entry of a row ``-inf`` or the lowest float):
  onnxruntime 1.32's kernel gives such a row the output 0 whatever the scores (NaN scores
  included), where the primitive ops give NaN (``-inf`` everywhere) or the mean of V (the
  lowest float everywhere: equal scores). A constant mask is checked row by row; a computed one
  must have a lower bound above the lowest float by an interval walk (constants, ``Where``,
  ``Cast``, ``Add``/``Sub``/``Mul``/``Neg`` and the shape ops). The exporters' own masks,
  ``Where(mask, 0, finfo.min)`` (or ``-inf``) of the ``attention_mask`` input, can fully mask a
  row (a padded sequence, left padding under a causal mask), so they are declined;
* Q, K and V are float (the float16 kernel was not compared), the model's opset is 23 or later
  (below it the pattern is counted as fusable at a higher opset), and onnxruntime's CPU provider
  runs Attention at that opset (probed once a pattern is found).

Compared with the primitive ops in onnxruntime 1.32 (``tests/test_simplify_attention.py``) on
normal values and on ±0, NaN, ±inf, ±float max and ±1e30 in Q, K, V and the mask (partly masked
rows with ``-inf`` and the lowest float included): NaN, the infinities and the sign of zero in
the same places, the finite values equal or within rounding. What stays, as for every fusion:
scores within a factor ``scale`` of the largest float may overflow in one and not the other.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import onnx_ir as ir

from passes.simplify.fusions._common import AtHigherOpset, inner, ort_runs, replace_output, scalar
from passes.simplify.fusions.accept import Fusion
from passes.simplify.rules import Context, Dim, Outcome, rule

__all__: list[str] = []

Graph = ir.Graph | ir.Function | None

#: The lowest float: a mask row of nothing above it is one onnxruntime's kernel zeroes.
_LOWEST = float(np.finfo(np.float32).min)
#: A computed mask's lower bound must clear the lowest float by this much (the walk's bounds are
#: computed in float64 and not rounded outward; a float32 op rounds by far less than this).
_MARGIN = 1e-3
#: Ops whose output holds only values of their first input (or of all inputs, for Concat).
_SAME_VALUES = ("Unsqueeze", "Squeeze", "Reshape", "Expand", "Transpose", "Identity", "Slice", "Gather",
                "Tile", "Flatten", "Concat")  # fmt: skip
_DEPTH = 12


@dataclasses.dataclass
class _Pattern:
    """A matched attention: Q, Kᵀ (as the scores' MatMul reads it, unscaled), the scale and the mask."""

    q: ir.Value
    kt: ir.Value
    scale: float
    mask: ir.Value | None
    k_factor: ir.Value | None = None  # a constant Kᵀ is multiplied by before the MatMul (not a power of two)


@rule("MatMul", family="fuse")
def attention(node: ir.Node, ctx: Context) -> Outcome:
    """``MatMul(Softmax(scale · Q @ Kᵀ [+ mask]), V)`` -> ``Attention(Q, K, V[, mask])`` (opset 23)."""
    if len(node.inputs) != 2 or any(v is None for v in node.inputs):
        return "not two inputs"
    softmax = inner(ctx, node.inputs[0], "Softmax", node.graph)
    if softmax is None or len(softmax.inputs) != 1:
        return "its first input is not a Softmax used by it alone"
    if ctx.opset < 13:
        return "a Softmax before opset 13 (it normalises the flattened trailing axes)"
    logits = softmax.inputs[0]
    rank = len(ctx.dims(logits) or ())
    if softmax.attributes.get_int("axis", -1) not in (-1, rank - 1) or rank == 0:
        return "the Softmax is not on the last axis (or the scores' rank is not proved)"
    found = _logits(ctx, logits, node.graph)
    if isinstance(found, str):
        return found
    return _fuse(node, ctx, found, node.inputs[1])  # type: ignore[arg-type]


def _logits(ctx: Context, value: ir.Value | None, graph: Graph) -> _Pattern | str:
    """The attention whose (masked) scores ``value`` is."""
    total = inner(ctx, value, "Add", graph)
    if total is None:
        return _scores(ctx, value, graph, None)
    if len(total.inputs) != 2 or any(v is None for v in total.inputs):
        return "the masked scores are not an Add of two inputs"
    reason = ""
    for index in (0, 1):
        found = _scores(ctx, total.inputs[index], graph, total.inputs[1 - index])
        if not isinstance(found, str):
            return found
        reason = reason or found
    return reason


def _scores(ctx: Context, value: ir.Value | None, graph: Graph, mask: ir.Value | None) -> _Pattern | str:
    """``scale · MatMul(Q, Kᵀ)`` (the scale a Mul, a Div, split between Q and Kᵀ, or none)."""
    scale = 1.0
    product = inner(ctx, value, "MatMul", graph)
    if product is None:
        scaled = inner(ctx, value, "Mul", graph) or inner(ctx, value, "Div", graph)
        if scaled is None or len(scaled.inputs) != 2:
            return "the Softmax's input is not scaled scores (Mul, Div or MatMul) used by it alone"
        sides = (0,) if scaled.op_type == "Div" else (0, 1)
        for index in sides:
            factor = _factor(ctx, scaled.inputs[1 - index])
            product = inner(ctx, scaled.inputs[index], "MatMul", graph)
            if factor is not None and product is not None:
                if scaled.op_type == "Div" and not _power_of_two(factor):
                    return (f"the scores are divided by {factor!r}, not a power of two: the kernel multiplies by its "
                            "inverse, which rounds differently, and the Softmax amplifies that")  # fmt: skip
                scale = 1.0 / factor if scaled.op_type == "Div" else factor
                break
        else:
            return "the scores are not a MatMul scaled by a one-element float constant, finite and positive"
    if len(product.inputs) != 2 or any(v is None for v in product.inputs):
        return "the scores' MatMul has not two inputs"
    q, kt = product.inputs
    k_factor: ir.Value | None = None
    for index, side in enumerate((q, kt)):  # sdpa's MatMul(Q · √s, Kᵀ · √s)
        split = inner(ctx, side, "Mul", graph)
        if split is None or len(split.inputs) != 2 or any(v is None for v in split.inputs):
            continue
        for j in (0, 1):
            operand = split.inputs[1 - j]
            factor = _factor(ctx, operand)
            if factor is None:
                if ctx.constant(operand) is None and _one_element(ctx, operand):
                    return ("Q or Kᵀ is scaled by a one-element value that is not a constant (yet: the exporters' "
                            "Sqrt of a shape's scale folds)")  # fmt: skip
                continue
            if _power_of_two(factor):  # exact: the kernel's scale takes it
                scale *= factor
                q, kt = (split.inputs[j], kt) if index == 0 else (q, split.inputs[j])
            elif index == 1:  # Kᵀ · f: K is f times the transposed source (Q · f stays as it is)
                kt, k_factor = split.inputs[j], operand
            break
    with np.errstate(all="ignore"):
        rounded = float(np.float32(scale))
    if not (math.isfinite(rounded) and rounded >= float(np.finfo(np.float32).tiny)):
        return f"the scale {scale!r} is not finite, positive and normal in float"
    assert q is not None and kt is not None
    return _Pattern(q, kt, rounded, mask, k_factor)


def _one_element(ctx: Context, value: ir.Value | None) -> bool:
    dims = ctx.dims(value)
    return dims is not None and all(d == 1 for d in dims)


def _factor(ctx: Context, value: ir.Value | None) -> float | None:
    """A one-element float constant of rank <= 4 that is finite and positive, as a float."""
    array = ctx.constant(value)
    number = scalar(ctx, value)
    if array is None or number is None or array.ndim > 4 or not math.isfinite(number) or number <= 0:
        return None
    return number


def _power_of_two(number: float) -> bool:
    """Whether scaling by ``number`` is exact (but for underflow and overflow): a positive power of two."""
    return number > 0 and math.frexp(number)[0] == 0.5


def _fuse(node: ir.Node, ctx: Context, found: _Pattern, v: ir.Value) -> Outcome:
    types = {ctx.dtype(x) for x in (found.q, found.kt, v)}
    if types != {ir.DataType.FLOAT}:
        return "Q, K and V are not all float (Attention is fused for float only)"
    dq, dk, dv = (ctx.dims(x) for x in (found.q, found.kt, v))
    if dq is None or dk is None or dv is None or not len(dq) == len(dk) == len(dv) == 4:
        return "Q, Kᵀ and V are not proved of rank 4"
    if not (_same(dq[0], dk[0]) and _same(dq[0], dv[0])):
        return f"the batch of Q, Kᵀ and V is not proved the same ({dq[0]}, {dk[0]}, {dv[0]})"
    if not (_same(dq[1], dk[1]) and _same(dq[1], dv[1])):
        return f"the heads of Q, Kᵀ and V are not proved the same ({dq[1]}, {dk[1]}, {dv[1]})"
    if found.mask is not None:
        why = _mask_refusal(ctx, found.mask, (dq[0], dq[1], dq[2], dk[3]))
        if why is not None:
            return why
    if ctx.opset < 23:
        return AtHigherOpset("Attention", 23, ctx.opset)
    shapes = [(1, 1, 2, 4), (1, 1, 3, 4), (1, 1, 3, 4)] + ([(1, 1, 2, 3)] if found.mask is not None else [])
    if not ort_runs("Attention", ctx.opset, ir.DataType.FLOAT, shapes):
        return f"onnxruntime's CPU provider has no Attention-{ctx.opset} kernel for FLOAT"

    source, perm = _key_source(ctx, found.kt)
    key, value = _unrepeated(ctx, source), _unrepeated(ctx, v)
    grouped = perm == [0, 1, 2, 3] and key is not None and value is not None and key[1] == value[1]
    if grouped:  # grouped-query attention: the kernel repeats K and V itself
        source, v = key[0], value[0]  # type: ignore[index]

    def rewrite() -> None:
        k = _transposed(ctx, node, source, perm)
        if found.k_factor is not None:
            names = ctx.names()
            scaled = ir.Node("", "Mul", [k, found.k_factor], name=names.node("attention_key_scaled"))
            scaled.outputs[0].name = names.value("attention_key_scaled")
            node.graph.insert_before(node, scaled)  # type: ignore[union-attr]
            k = scaled.outputs[0]
        inputs = [found.q, k, v] + ([found.mask] if found.mask is not None else [])
        fused = ir.Node("", "Attention", inputs, [ir.AttrFloat32("scale", found.scale)],
                        name=ctx.names().node(f"{node.name or 'MatMul'}_attention"))  # fmt: skip
        replace_output(node, ctx, fused)

    # The output's shape is checked here (batch, heads, Q's sequence, V's head size), not by vet's walk.
    return Fusion(rewrite, found.q, reads=(found.q, found.kt, v, found.mask, found.k_factor))


def _same(a: Dim, b: Dim) -> bool:
    return a is not None and a == b


def _key_source(ctx: Context, kt: ir.Value) -> tuple[ir.Value, list[int]]:
    """K ``[B, H, L, D]`` as ``(source, perm)``: Kᵀ's Transpose source with the composed permutation,
    or Kᵀ with the last two axes swapped."""
    transpose = ctx.producer(kt, "Transpose")
    if transpose is not None and transpose.inputs and transpose.inputs[0] is not None:
        inner_perm = list(transpose.attributes.get_ints("perm", []))
        if sorted(inner_perm) == [0, 1, 2, 3]:
            return transpose.inputs[0], [inner_perm[i] for i in (0, 1, 3, 2)]
    return kt, [0, 1, 3, 2]


def _transposed(ctx: Context, before: ir.Node, source: ir.Value, perm: list[int]) -> ir.Value:
    """``source`` transposed by ``perm`` (a new Transpose before ``before``, none for the identity)."""
    if perm == [0, 1, 2, 3]:
        return source
    names = ctx.names()
    new = ir.Node("", "Transpose", [source], [ir.AttrInt64s("perm", perm)], name=names.node("attention_key"))
    new.outputs[0].name = names.value("attention_key")
    assert before.graph is not None
    before.graph.insert_before(before, new)
    return new.outputs[0]


def _unrepeated(ctx: Context, value: ir.Value | None) -> tuple[ir.Value, int] | None:
    """``(x, n)`` if ``value`` is Llama's ``repeat_kv(x, n)``: ``Reshape(Expand(Unsqueeze(x, [2]), [b, h, n, l,
    d]), [b, h · n, l, d])``, every dim proved: each head of x repeated n times in a row, which is how
    the kernel reads K and V of fewer heads than Q (head ``i`` of Q takes head ``i // n``)."""
    reshape = ctx.producer(value, "Reshape")
    expand = ctx.producer(reshape.inputs[0] if reshape is not None and reshape.inputs else None, "Expand")
    unsqueeze = ctx.producer(expand.inputs[0] if expand is not None and expand.inputs else None, "Unsqueeze")
    if unsqueeze is None or not unsqueeze.inputs or unsqueeze.inputs[0] is None:
        return None
    x = unsqueeze.inputs[0]
    dims, wide, out = ctx.dims(x), ctx.dims(expand.outputs[0]), ctx.dims(value)  # type: ignore[union-attr]
    if dims is None or wide is None or out is None or len(dims) != 4 or len(wide) != 5 or len(out) != 4:
        return None
    b, heads, length, size = dims
    repeat = wide[2]
    if not (isinstance(heads, int) and isinstance(repeat, int) and repeat > 1 and out[1] == heads * repeat):
        return None
    if not all(_same(a, c) for a, c in ((b, wide[0]), (heads, wide[1]), (length, wide[3]), (size, wide[4]))):
        return None
    if not all(_same(a, c) for a, c in ((b, out[0]), (length, out[2]), (size, out[3]))):
        return None
    single = ctx.dims(unsqueeze.outputs[0])  # [b, h, 1, l, d]: the new axis is the one Expand repeats
    if single is None or len(single) != 5 or single[2] != 1:
        return None
    if not all(_same(a, c) for a, c in zip(dims, single[:2] + single[3:])):
        return None
    return x, repeat


def _mask_refusal(ctx: Context, mask: ir.Value, scores: tuple[Dim, ...]) -> str | None:
    """Why ``mask`` may not be Attention's (its shape, or a row onnxruntime's kernel would zero), or None."""
    if ctx.dtype(mask) != ir.DataType.FLOAT:
        return "the mask is not float"
    dims = ctx.dims(mask)
    if dims is None or not 2 <= len(dims) <= 4:
        return "the mask is not proved of rank 2 to 4"
    if not (_same(dims[-2], scores[2]) and _same(dims[-1], scores[3])):
        return (f"the mask's last dims {list(dims[-2:])} are not proved to be the sequence lengths "
                f"{list(scores[2:])} (onnxruntime's kernel does not broadcast them)")  # fmt: skip
    for mine, theirs in zip(dims[:-2], scores[4 - len(dims) : 2]):
        if mine != 1 and not _same(mine, theirs):
            return f"the mask's dims {list(dims)} do not broadcast to the scores' {list(scores)}"
    array = ctx.constant(mask)
    if array is not None:
        rows = array.reshape(-1, array.shape[-1]) if array.shape[-1] else np.zeros((1, 0), array.dtype)
        if np.any(np.all(rows <= _LOWEST, axis=1)):
            return ("a row of the constant mask is fully masked (-inf or the lowest float): onnxruntime's kernel "
                    "gives it 0, the primitive ops NaN or the mean of V")  # fmt: skip
        return None
    bounds = _bounds(ctx, mask, _DEPTH)
    if bounds is None or not bounds[0] > _LOWEST * (1 - _MARGIN):
        return ("the mask may fully mask a row (-inf or the lowest float in every entry): onnxruntime's kernel "
                "gives it 0, the primitive ops NaN or the mean of V")  # fmt: skip
    return None


def _bounds(ctx: Context, value: ir.Value | None, depth: int) -> tuple[float, float] | None:
    """An interval holding every non-NaN value of ``value`` (float64, not rounded outward), or None."""
    if value is None or depth == 0:
        return None
    array = ctx.constant(value)
    if array is not None:
        if array.size == 0 or array.dtype.kind not in "biuf":
            return None
        finite = array[~np.isnan(array)] if array.dtype.kind == "f" else array
        return (float(finite.min()), float(finite.max())) if finite.size else None
    producer = value.producer()
    if producer is None or producer.domain not in ("", "ai.onnx") or producer.graph is not value.graph:
        dtype = ctx.dtype(value)
        if dtype is not None and dtype.is_integer():
            info = np.iinfo(dtype.numpy())
            return float(info.min), float(info.max)
        return (0.0, 1.0) if dtype == ir.DataType.BOOL else None
    op = producer.op_type
    inputs = list(producer.inputs)
    if op in _SAME_VALUES:
        data = inputs if op == "Concat" else inputs[:1]
        return _union([_bounds(ctx, v, depth - 1) for v in data])
    if op == "Where" and len(inputs) == 3:
        return _union([_bounds(ctx, v, depth - 1) for v in inputs[1:]])
    if op == "Cast" and len(inputs) == 1:
        return _cast_bounds(_bounds(ctx, inputs[0], depth - 1), producer.attributes.get_int("to", 0))
    if op == "Neg" and len(inputs) == 1:
        inside = _bounds(ctx, inputs[0], depth - 1)
        return None if inside is None else (-inside[1], -inside[0])
    if op in ("Add", "Sub", "Mul") and len(inputs) == 2:
        a, b = (_bounds(ctx, v, depth - 1) for v in inputs)
        if a is None or b is None:
            return None
        with np.errstate(all="ignore"):
            if op == "Add":
                ends = [a[0] + b[0], a[1] + b[1]]
            elif op == "Sub":
                ends = [a[0] - b[1], a[1] - b[0]]
            else:
                ends = [x * y for x in a for y in b]
        if any(math.isnan(e) for e in ends):
            return None
        return min(ends), max(ends)
    return None


def _cast_bounds(bounds: tuple[float, float] | None, to: int) -> tuple[float, float] | None:
    """The bounds of a Cast ``to`` (an ONNX type) of values within ``bounds``: floats keep them (a value
    beyond float's range becomes inf, which the caller's margin refuses), integers truncate them
    (None beyond the type's range), bool is 0 or 1."""
    if bounds is None:
        return None
    target = ir.DataType(to)
    if target == ir.DataType.BOOL:
        return 0.0, 1.0
    if target.is_floating_point():
        return bounds
    if target.is_integer():
        info = np.iinfo(target.numpy())
        if bounds[0] < info.min or bounds[1] > info.max:
            return None
        return float(math.trunc(bounds[0])), float(math.trunc(bounds[1]))
    return None


def _union(parts: list[tuple[float, float] | None]) -> tuple[float, float] | None:
    if not parts or any(p is None for p in parts):
        return None
    return min(p[0] for p in parts), max(p[1] for p in parts)  # type: ignore[index]
