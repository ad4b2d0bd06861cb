"""The rotate-half rotary embedding exporters write as primitive ops, into ``RotaryEmbedding`` (opset 23).

``Add(Mul(x, cos), Mul(rotate_half(x), sin))`` with
``rotate_half(x) = Concat(Neg(x2), x1, axis=-1)``, ``x1 = Slice(x, 0:D/2)`` and
``x2 = Slice(x, D/2:)`` on the last axis (HF Llama, Mistral, Qwen: both exporters)
becomes ``RotaryEmbedding(x, cos_half, sin_half)`` (``interleaved=0``, full
rotation, no ``position_ids``): the kernel computes ``x1·c - x2·s`` and
``x2·c + x1·s`` from caches ``c``, ``s`` of the half width, which is the
primitive graph's arithmetic exactly where ``cos`` and ``sin`` are a half
repeated twice on the last axis. Accepted forms: either operand order of the
Add and of each Mul, ``Mul(x2, -1)`` for the ``Neg``, a second Slice ending
anywhere at or past ``D``.

The halves are proved equal, never assumed. ``cos`` (and ``sin``) is
``Unsqueeze(e, axes=[1])`` (broadcast over the heads) of an ``e`` of shape
``[b, S, D]`` built from a value whose halves are equal by a chain that keeps
them equal, and the half cache is that chain applied to the half:

* ``Concat(f, f, axis=-1)`` of one value ``f`` (the exporters' ``cat(freqs,
  freqs)``): the half is ``f``;
* a constant whose two halves are equal bit for bit (a -0 is not a +0): the
  half is its first half, a new constant;
* ``Cos``, ``Sin``, ``Cast`` of such a value, a ``Mul`` of it by a
  one-element constant (``attention_scaling``), a ``Gather`` of it on an axis
  other than the last (``cos_cached[position_ids]``): the same op on the half.

``cos`` may also be a constant itself (a folded graph), of a shape that
broadcasts over the heads, with equal halves. Where it applies:

* ``x`` has rank 4 ``[B, H, S, D]`` with a static, even ``D`` (proved by
  inference, so in function bodies, which have no shapes, it does not apply);
  ``e`` has rank 3, its ``S`` is ``x``'s (the same int or symbol) and its
  batch ``b`` is ``x``'s or 1: a batch of 1 is expanded to ``x``'s
  (``Expand(half, Concat(Shape(v)[0:1], [1, 1]))``, ``v`` a graph input whose
  first dim is ``x``'s batch symbol, else ``x``: one Shape and one pair of
  Expands for every fusion of the graph, after ``cse``), as onnxruntime's kernel
  takes 3-D caches of exactly ``x``'s batch (it refuses a batch of 1 against a
  batch of 2 where the primitive ops broadcast);
* every cache value is in ``[-1, 1]`` or NaN: a ``Cos`` or ``Sin`` in the
  chain, after it only ``Cast`` and ``Mul`` by a constant of magnitude <= 1,
  or a constant with no entry beyond 1 in magnitude (see below);
* every intermediate of the rotation (both Muls, the Concat, the Neg, the
  Slices) is used by the pattern alone and is not a graph output; ``x``,
  ``cos`` and ``sin`` may have other users (Q and K share ``cos`` and ``sin``);
* ``x`` is float or float16, the model's opset is 23 or later (below it the
  pattern is counted as fusable at a higher opset), and onnxruntime's CPU
  provider runs RotaryEmbedding at that opset and type (probed once a pattern
  is found).

Compared with onnxruntime 1.32's kernel (AVX2, ``tests/test_simplify_rotary.py``)
on ±0, NaN, ±inf, float max, subnormals, ±1e30 and caches with ±0 entries:

* float16: bit for bit (its CPU provider computes the primitive float16 ops in
  float32 as the kernel does, and products of float16 values are exact there);
* float: the kernel's fused multiply-adds (``fma(x1, c, -(x2·s))``) round once
  where the primitive ops round twice. With caches in ``[-1, 1]`` no product
  overflows, so NaN and the infinities are where the primitive ops put them;
  a zero differs in sign only where a product underflows: ``x1·c`` of a
  subnormal ``x1`` is a nonzero value below 2^-150, which the primitive ``Mul``
  rounds to -0 and the ``Add`` of a -0 turns into +0, where the fused op gives
  -0, the sign of the exact result. That is rounding, like the Gemm fusion's
  (``Add(MatMul)`` rounds ``A @ B`` first); no condition on the caches excludes
  it (``x`` is the input). A cache with entries beyond 1 (``1e30``) is refused:
  there ``x·c`` overflows to inf in the primitive ops and ``inf - inf`` is NaN
  where the kernel's exact product gives -inf;
* sums within an ulp of the largest finite value may round to it in one and to
  inf in the other (as every fusion at the edge of the range).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from passes.simplify.fusions._common import AtHigherOpset, inner, ort_runs, replace_output
from passes.simplify.fusions.accept import Fusion
from passes.simplify.rules import Context, Dim, Outcome, rule

__all__: list[str] = []

#: The types fused: those compared with onnxruntime's kernel on edge values (it has no bfloat16 one).
_FLOATS = (ir.DataType.FLOAT, ir.DataType.FLOAT16)
#: Ops that map a value with equal halves to one with equal halves, elementwise.
_UNARY = ("Cos", "Sin", "Cast")
#: How many ops a cache's chain may have (``Cast(Mul(Cos(Concat)))`` is four).
_DEPTH = 6

Graph = ir.Graph | ir.Function | None
Build = Callable[[ir.Node], ir.Value]  # makes the half cache before a node


@dataclasses.dataclass
class _Half:
    """How to build the first half (on the last axis) of a value whose halves are equal."""

    build: Build
    bounded: bool  # every value is in [-1, 1] or NaN


@rule("Add", family="fuse")
def rotary_embedding(node: ir.Node, ctx: Context) -> Outcome:
    """``x · cos + rotate_half(x) · sin`` -> ``RotaryEmbedding(x, cos_half, sin_half)`` (opset 23)."""
    if len(node.inputs) != 2 or any(v is None for v in node.inputs):
        return "not two inputs"
    products = [inner(ctx, v, "Mul", node.graph) for v in node.inputs]
    if any(p is None or len(p.inputs) != 2 or any(v is None for v in p.inputs) for p in products):
        return "not a sum of two products used by it alone"
    reason = "no product is rotate_half(x) · sin"
    for index in (0, 1):
        straight, turned = products[index], products[1 - index]
        assert straight is not None and turned is not None
        for j in (0, 1):
            concat = inner(ctx, turned.inputs[j], "Concat", node.graph)
            if concat is None:
                continue
            found = _rotate_half(ctx, concat, node.graph)
            if isinstance(found, str):
                reason = found
                continue
            x, width = found
            if x not in straight.inputs:
                reason = "the other product is not of the rotated x"
                continue
            cos = straight.inputs[1] if straight.inputs[0] is x else straight.inputs[0]
            outcome = _fuse(node, ctx, x, width, cos, turned.inputs[1 - j])
            if callable(outcome) or isinstance(outcome, AtHigherOpset):
                return outcome
            reason = outcome
    return reason


def _rotate_half(ctx: Context, concat: ir.Node, graph: Graph) -> tuple[ir.Value, int] | str:
    """``(x, D)`` if ``concat`` is ``Concat(-x2, x1)`` of the halves of ``x``'s last axis of static size D."""
    if len(concat.inputs) != 2:
        return "the rotation is not a Concat of two halves"
    negated, first = concat.inputs
    x2 = _negated(ctx, negated, graph)
    if x2 is None:
        return "the rotation's first half is not -x2 (Neg, or Mul by -1) used by it alone"
    low = inner(ctx, first, "Slice", graph)
    high = inner(ctx, x2, "Slice", graph)
    if low is None or high is None or not low.inputs or not high.inputs:
        return "the rotated halves are not Slices used by it alone"
    x = low.inputs[0]
    if x is None or high.inputs[0] is not x:
        return "the halves are not of the same x"
    dims = ctx.dims(x)
    if dims is None or not dims or not isinstance(dims[-1], int):
        return "the last dim of x is not static"
    rank, width = len(dims), dims[-1]
    if width <= 0 or width % 2:
        return f"the last dim of x is {width}, not even"
    axis = concat.attributes.get_int("axis", 0)
    if axis not in (-1, rank - 1):
        return f"the halves are concatenated on axis {axis}, not the last"
    half = width // 2
    if _slice_range(ctx, low, rank, width) != (0, half):
        return f"x1 is not x[..., 0:{half}]"
    if _slice_range(ctx, high, rank, width) != (half, width):
        return f"x2 is not x[..., {half}:]"
    return x, width


def _negated(ctx: Context, value: ir.Value | None, graph: Graph) -> ir.Value | None:
    """``v`` if ``value`` is ``Neg(v)`` or ``Mul(v, -1)`` used by one node alone (both are exact)."""
    negation = inner(ctx, value, "Neg", graph)
    if negation is not None:
        return negation.inputs[0] if len(negation.inputs) == 1 else None
    product = inner(ctx, value, "Mul", graph)
    if product is None or len(product.inputs) != 2:
        return None
    for index in (0, 1):
        minus_one = ctx.constant(product.inputs[1 - index])
        if (minus_one is not None and minus_one.size == 1 and minus_one.ndim <= 1 and minus_one.dtype.kind == "f"
                and minus_one.reshape(-1)[0] == -1):  # fmt: skip
            return product.inputs[index]
    return None


def _slice_range(ctx: Context, node: ir.Node, rank: int, width: int) -> tuple[int, int] | None:
    """``(start, end)`` of a step-1 Slice of the last axis alone (constant inputs), clamped to ``width``."""
    if ctx.opset < 10 or len(node.inputs) < 4:
        return None  # Slice-1's attributes, or no axes (then every axis is sliced)
    arrays = [ctx.constant(v) if v is not None else None for v in node.inputs[1:]]
    if any(a is None or a.dtype.kind != "i" or a.size != 1 for a in arrays):
        return None
    start, end, axis, *rest = (int(a.reshape(-1)[0]) for a in arrays)  # type: ignore[union-attr]
    if axis not in (-1, rank - 1) or (rest and rest[0] != 1):
        return None
    start, end = (v + width if v < 0 else v for v in (start, end))
    return max(0, min(start, width)), max(0, min(end, width))


def _fuse(node: ir.Node, ctx: Context, x: ir.Value, width: int, cos: ir.Value | None,
          sin: ir.Value | None) -> Outcome:  # fmt: skip
    dtype = ctx.dtype(x)
    if dtype not in _FLOATS:
        return f"x is {dtype.name if dtype else 'of an unknown type'} (RotaryEmbedding is fused for floats)"
    dims = ctx.dims(x)
    if dims is None or len(dims) != 4:
        return "x is not of rank 4 [batch, heads, sequence, head size]"
    caches = []
    for value, label in ((cos, "cos"), (sin, "sin")):
        found = _cache(ctx, value, dims, node.graph)
        if isinstance(found, str):
            return f"{label}: {found}"
        caches.append(found)
    (cos_half, cos_batch), (sin_half, sin_batch) = caches
    if not (cos_half.bounded and sin_half.bounded):
        return "a cache may hold values beyond [-1, 1] (x · cache could overflow where the kernel's product does not)"
    if ctx.opset < 23:
        return AtHigherOpset("RotaryEmbedding", 23, ctx.opset)
    half = width // 2
    if not ort_runs("RotaryEmbedding", ctx.opset, dtype, [(1, 1, 2, width), (1, 2, half), (1, 2, half)]):
        return f"onnxruntime's CPU provider has no RotaryEmbedding-{ctx.opset} kernel for {dtype.name}"
    expand = not (cos_batch and sin_batch)

    def rewrite() -> None:
        names = ctx.names()
        halves = [cos_half.build(node), sin_half.build(node)]
        if expand:  # a batch of 1: the kernel takes caches of x's batch exactly
            source = _batch_source(ctx, x, dims[0], node.graph)
            first = [ir.AttrInt64("start", 0), ir.AttrInt64("end", 1)]
            shape = _new(ctx, node, "Shape", [source], "rotary_batch", first)
            ones = _ones(ctx, node)
            target = _new(ctx, node, "Concat", [shape, ones], "rotary_cache_shape", [ir.AttrInt64("axis", 0)])
            halves = [_new(ctx, node, "Expand", [h, target], "rotary_cache") for h in halves]
        fused = ir.Node("", "RotaryEmbedding", [x, *halves], name=names.node(f"{node.name or 'Add'}_rotary"))
        replace_output(node, ctx, fused)

    return Fusion(rewrite, x, reads=(cos, sin))


def _batch_source(ctx: Context, x: ir.Value, batch: Dim, graph: Graph) -> ir.Value:
    """A graph input whose first dim is proved to be ``batch`` (the same symbol), else ``x``: every
    fusion of the graph then reads the batch from one Shape, and shares the Expands (``cse``)."""
    if isinstance(graph, ir.Graph) and isinstance(batch, str):
        for value in graph.inputs:
            dims = ctx.dims(value)
            if dims and dims[0] == batch:
                return value
    return x


def _ones(ctx: Context, node: ir.Node) -> ir.Value:
    """An int64 ``[1, 1]`` initializer of the graph (the first fusion's), else a new constant: the second
    fusion's Expand target is then the first's, which ``cse`` merges in the same pass."""
    graph = node.graph
    if ctx.initializers and isinstance(graph, ir.Graph):
        for value in graph.initializers.values():
            if value.dtype == ir.DataType.INT64 and value.shape is not None and tuple(value.shape) == (2,):
                array = ctx.constant(value)
                if array is not None and array.tolist() == [1, 1]:
                    return value
    return ctx.new_constant(np.ones(2, dtype=np.int64), "rotary_ones", node)


def _new(ctx: Context, before: ir.Node, op_type: str, inputs: list[ir.Value | None], base: str,
         attributes: list[ir.Attr] | None = None) -> ir.Value:  # fmt: skip
    """The output of a new ``op_type`` node inserted before ``before``."""
    names = ctx.names()
    node = ir.Node("", op_type, inputs, attributes or [], name=names.node(base))
    node.outputs[0].name = names.value(base)
    assert before.graph is not None
    before.graph.insert_before(before, node)
    return node.outputs[0]


def _cache(ctx: Context, value: ir.Value | None, dims: tuple[Dim, ...], graph: Graph) -> tuple[_Half, bool] | str:
    """How to build the ``[b, S, D/2]`` cache of ``value`` (broadcast against x's ``dims``), and whether
    ``b`` is x's batch (else it is 1, to expand)."""
    width = dims[-1]
    assert isinstance(width, int)
    array = ctx.constant(value)
    if array is not None:  # a folded cache: [.., 1, S, D] with the heads' axis of 1
        if array.ndim > 4 or array.shape[-1] != width:
            return f"a constant of shape {list(array.shape)} (not [.., 1, S, {width}])"
        shaped = array.reshape((1,) * (4 - array.ndim) + array.shape)
        if shaped.shape[1] != 1:
            return f"a constant of shape {list(array.shape)} (not over the heads)"
        halved = _constant_half(ctx, shaped[:, 0], value)
        if isinstance(halved, str):
            return halved
        cache_dims: tuple[Dim, ...] = shaped.shape[0], shaped.shape[2], width
    else:
        unsqueeze = ctx.producer(value, "Unsqueeze")
        if unsqueeze is None or unsqueeze.graph is not graph or _unsqueeze_axes(ctx, unsqueeze) != [1]:
            return "not Unsqueeze(e, axes=[1]) nor a constant"
        source = unsqueeze.inputs[0]
        found = _half(ctx, source, graph, width, _DEPTH)
        if isinstance(found, str):
            return found
        halved = found
        cache_dims = ctx.dims(source) or ()
    if len(cache_dims) != 3 or cache_dims[2] != width:
        return f"the cache's shape {list(cache_dims)} is not [batch, sequence, {width}]"
    batch, sequence = cache_dims[0], cache_dims[1]
    if sequence != dims[2] or sequence is None:
        return f"its sequence dim {sequence} is not proved to be x's {dims[2]}"
    if batch is not None and batch == dims[0]:
        return halved, True
    if batch != 1:
        return f"its batch dim {batch} is neither 1 nor x's {dims[0]}"
    return halved, False


def _unsqueeze_axes(ctx: Context, node: ir.Node) -> list[int] | None:
    if ctx.opset < 13:
        return list(node.attributes.get_ints("axes", []))
    axes = ctx.constant(node.inputs[1]) if len(node.inputs) == 2 else None
    return None if axes is None else [int(a) for a in axes.reshape(-1)]


def _constant_half(ctx: Context, array: np.ndarray, value: ir.Value | None) -> _Half | str:
    """The first half of ``array``'s last axis as a new constant, if both halves are equal bit for bit."""
    half = array.shape[-1] // 2
    low, high = np.ascontiguousarray(array[..., :half]), np.ascontiguousarray(array[..., half:])
    if array.dtype.kind != "f" or low.tobytes() != high.tobytes():
        return "its two halves are not equal bit for bit"
    with np.errstate(invalid="ignore"):
        bounded = bool(np.all(np.isnan(low) | (np.abs(low) <= 1)))
    base = f"{value.name or 'cache'}_half" if value is not None else "cache_half"
    return _Half(lambda before: ctx.new_constant(low, base, before), bounded)


def _half(ctx: Context, value: ir.Value | None, graph: Graph, width: int, depth: int) -> _Half | str:
    """How to build ``value[..., :width/2]`` from ops on a value whose halves are equal by construction."""
    if value is None or depth == 0:
        return "not built from a half repeated twice (Concat(f, f), or a constant with equal halves)"
    array = ctx.constant(value)
    if array is not None:
        if array.ndim == 0 or array.shape[-1] != width:
            return f"a constant of shape {list(array.shape)}"
        return _constant_half(ctx, array, value)
    producer = value.producer()
    if producer is None or producer.domain not in ("", "ai.onnx") or producer.graph is not graph:
        return "not built from a half repeated twice (Concat(f, f), or a constant with equal halves)"
    op = producer.op_type
    if any(attr.is_ref() for attr in producer.attributes.values()):
        return f"a {op} with an attribute reference"
    if op == "Concat":
        if (len(producer.inputs) != 2 or producer.inputs[0] is None or producer.inputs[0] is not producer.inputs[1]
                or producer.attributes.get_int("axis", 0) not in (-1, (_rank(ctx, value) or 0) - 1)):  # fmt: skip
            return "a Concat that is not of one value with itself on the last axis"
        return _Half(_existing(producer.inputs[0]), False)
    if op in _UNARY and len(producer.inputs) == 1:
        found = _half(ctx, producer.inputs[0], graph, width, depth - 1)
        if isinstance(found, str):
            return found
        return _Half(_copy(ctx, producer, [found.build]), op in ("Cos", "Sin") or (op == "Cast" and found.bounded))
    if op == "Mul" and len(producer.inputs) == 2:
        for index in (0, 1):
            factor = ctx.constant(producer.inputs[1 - index])
            if factor is None or factor.size != 1 or factor.dtype.kind != "f":
                continue
            found = _half(ctx, producer.inputs[index], graph, width, depth - 1)
            if isinstance(found, str):
                return found
            builds = [found.build, _existing(producer.inputs[1 - index])]
            if index == 1:
                builds.reverse()
            with np.errstate(invalid="ignore"):
                small = bool(abs(float(factor.reshape(-1)[0])) <= 1)
            return _Half(_copy(ctx, producer, builds), found.bounded and small)
        return "a Mul by a value that is not a one-element constant"
    if op == "Gather" and len(producer.inputs) == 2:
        data = producer.inputs[0]
        rank = _rank(ctx, data)
        axis = producer.attributes.get_int("axis", 0)
        if rank is None or axis in (-1, rank - 1):
            return "a Gather on the last axis (or of an unknown rank)"
        found = _half(ctx, data, graph, width, depth - 1)
        if isinstance(found, str):
            return found
        return _Half(_copy(ctx, producer, [found.build, _existing(producer.inputs[1])]), found.bounded)
    return f"built by a {op}, which is not known to keep equal halves"


def _existing(value: ir.Value | None) -> Build:
    """A builder that makes nothing: ``value`` is in the graph already."""
    assert value is not None
    return lambda before: value


def _rank(ctx: Context, value: ir.Value | None) -> int | None:
    dims = ctx.dims(value)
    return None if dims is None else len(dims)


def _copy(ctx: Context, node: ir.Node, builds: list[Build]) -> Build:
    """A builder of a copy of ``node`` whose inputs are the values ``builds`` make."""

    def build(before: ir.Node) -> ir.Value:
        inputs = [b(before) for b in builds]
        attributes = [ir.Attr(a.name, a.type, a.value) for a in node.attributes.values()]
        return _new(ctx, before, node.op_type, inputs, f"{node.name or node.op_type.lower()}_half", attributes)

    return build
