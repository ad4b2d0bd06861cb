"""Chains of two ops that are one op (or none).

* ``Reshape(Reshape(x, s1), s2) -> Reshape(x, s2)`` when ``s2`` is a constant
  that copies no dim (no ``0``, or ``allowzero=1``).
* ``Unsqueeze(Unsqueeze(x, a1), a2) -> Unsqueeze(x, a)``, ``a`` the combined axes.
* ``Squeeze(Unsqueeze(x, a), a) -> x`` and ``Unsqueeze(Squeeze(x, a), a) -> x``.
* ``Transpose(Transpose(x, p1), p2) -> Transpose(x, p1[p2])`` (or ``x``).
* A Transpose that only moves axes of size 1 (the other axes keep their
  order: ``[4, 1, 4, 16]`` by ``(0, 2, 1, 3)``) keeps the elements in memory
  order, so it is a Reshape: ``Transpose(Reshape(x, s), p) -> Reshape(x, s[p])``
  and ``Reshape(Transpose(x, p), s) -> Reshape(x, s)`` when ``s`` is a constant
  that copies no dim (attention over one token or one head).
* ``Reshape(Transpose(Reshape(x, s1), p), s2) -> Transpose(x, q)`` (and
  ``Reshape(Transpose(x, p), s2) -> Transpose(x, q)``) when every shape in the
  chain is static, the Reshapes only add or remove dims of size 1 and the
  rank comes back (attention over batch 1: [1, 4, 32, 16] ->
  [4, 32, 16] -> perm (0, 2, 1) -> [1, 4, 16, 32] is perm (0, 1, 3, 2)); ``q``
  moves x's other axes as ``p`` moves them and puts x's size-1 axes where
  the result has its own.
* ``Slice(Slice(x, s1, e1, a1, p1), s2, e2, a2, p2) -> Slice(x, s1+s2, e1+e2, a1+a2, p1+p2)``
  when the two slice different axes (each axis is clamped against its own
  dim, which the other slice does not change), all constants; a shared inner
  Slice whose users are all Slices is taken in by each (Swin's patch merging:
  x[:, 0::2, 0::2] and friends, 6 Slices become 4).
* ``Cast(Cast(x, T1), T2) -> Cast(x, T2)`` when ``T1`` holds every value of
  x's type exactly (``x`` itself when ``T2`` is x's type).
* ``Reshape(f(Reshape(x, s)), t) -> f(x)`` for elementwise ops ``f`` (dynamo's
  MLPs view a Gemm's matrix as [batch, seq, n] for the activation, then back)
  when every other input of ``f`` is a single element (so it broadcasts the
  same at either shape), the values between the Reshapes are used by ``f``
  alone, and ``t`` is proved to be x's shape
  (:func:`~passes.simplify.shape_values.reshape_restores`).
* ``Reshape(Softmax(Flatten(x, a), axis=-1), Shape(x)) -> Softmax(x, axis=a)``
  (LogSoftmax, Hardmax too), what the upgrade writes for the opset-12 ops'
  2-D coercion: from opset 13 when every dim of x after ``a`` is 1 (the
  pooled [n, c, 1, 1] of a CNN's head), before 13 always.

The inner node must have no other user (else the chain would be computed
twice), except an ``Unsqueeze`` or ``Slice`` whose users are all of its own
op: each takes it in; it is removed when it becomes dead.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from passes.simplify.rules import Context, Outcome, sole_user, rule
from passes.simplify.shape_values import reshape_restores

__all__: list[str] = []

_D = ir.DataType
_FLOATS = {_D.FLOAT16, _D.BFLOAT16, _D.FLOAT, _D.DOUBLE}
# Casting a value of the key type to any of these types is exact (every value is representable).
_EXACT_WIDENING: dict[ir.DataType, frozenset[ir.DataType]] = {
    _D.BOOL: frozenset({_D.INT8, _D.UINT8, _D.INT16, _D.UINT16, _D.INT32, _D.UINT32, _D.INT64, _D.UINT64, *_FLOATS}),
    _D.INT8: frozenset({_D.INT16, _D.INT32, _D.INT64, _D.FLOAT16, _D.FLOAT, _D.DOUBLE}),
    _D.UINT8: frozenset({_D.INT16, _D.UINT16, _D.INT32, _D.UINT32, _D.INT64, _D.UINT64, _D.FLOAT16, _D.FLOAT,
                         _D.DOUBLE}),
    _D.INT16: frozenset({_D.INT32, _D.INT64, _D.FLOAT, _D.DOUBLE}),
    _D.UINT16: frozenset({_D.INT32, _D.UINT32, _D.INT64, _D.UINT64, _D.FLOAT, _D.DOUBLE}),
    _D.INT32: frozenset({_D.INT64, _D.DOUBLE}),
    _D.UINT32: frozenset({_D.INT64, _D.UINT64, _D.DOUBLE}),
    _D.FLOAT16: frozenset({_D.FLOAT, _D.DOUBLE}),
    _D.BFLOAT16: frozenset({_D.FLOAT, _D.DOUBLE}),
    _D.FLOAT: frozenset({_D.DOUBLE}),
}  # fmt: skip


def _inner(node: ir.Node, ctx: Context, op_type: str, shared: bool = False) -> ir.Node | str:
    """The ``op_type`` node feeding ``node``, if merging them removes it.

    It must have no other user (else the chain would be computed twice), or,
    with ``shared``, only users of ``node``'s own op type, which each merge it
    into themselves (a shared ``Unsqueeze`` feeding two ``Unsqueeze``: three
    nodes become two).
    """
    inner = ctx.producer(node.inputs[0], op_type)
    if inner is None:
        return f"its input is not a {op_type}"
    output = inner.outputs[0]
    if sole_user(output):
        return inner
    if shared and not output.is_graph_output() and all(
            user.op_type == node.op_type and user.domain == node.domain and index == 0 for user, index in output.uses()):
        return inner
    return f"the {op_type} has other users"


def _axes(node: ir.Node, ctx: Context) -> list[int] | None:
    """The node's constant ``axes`` (input at opset >= 13, else attribute)."""
    if len(node.inputs) > 1:
        axes = ctx.constant(node.inputs[1])
        return None if axes is None else [int(a) for a in axes.reshape(-1)]
    if "axes" in node.attributes:
        return list(node.attributes.get_ints("axes", []))
    return None


def _rewire(node: ir.Node, source: ir.Value) -> None:
    node.replace_input_with(0, source)


@rule("Reshape", family="chains")
def reshape_of_reshape(node: ir.Node, ctx: Context) -> Outcome:
    inner = _inner(node, ctx, "Reshape")
    if isinstance(inner, str):
        return inner
    shape = ctx.constant(node.inputs[1])
    if shape is None:
        return "the outer target shape is not constant"
    if not node.attributes.get_int("allowzero", 0) and np.any(shape == 0):
        return "the outer target copies a dim of the inner result"
    source = inner.inputs[0]
    return lambda: _rewire(node, source)


def _normalized(axes: list[int], rank: int | None) -> list[int] | None:
    if any(a < 0 for a in axes):
        if rank is None:
            return None
        axes = [a + rank if a < 0 else a for a in axes]
    return sorted(axes)


def _combined_unsqueeze(inner: ir.Node, node: ir.Node, ctx: Context) -> list[int] | str:
    """The axes of one Unsqueeze doing ``node``'s after ``inner``'s, or why there are none."""
    a1, a2 = _axes(inner, ctx), _axes(node, ctx)
    dims = ctx.dims(inner.inputs[0])
    rank = None if dims is None else len(dims)
    if a1 is None or a2 is None:
        return "axes are not constant"
    n1 = _normalized(a1, None if rank is None else rank + len(a1))
    n2 = _normalized(a2, None if rank is None else rank + len(a1) + len(a2))
    if n1 is None or n2 is None:
        return "negative axes of an input of unknown rank"
    # Positions of the inner's new dims after the outer inserts its own.
    final = list(n2)
    for position in n1:
        shifted = position
        for inserted in n2:
            if inserted <= shifted:
                shifted += 1
        final.append(shifted)
    return sorted(final)


@rule("Unsqueeze", family="chains")
def unsqueeze_of_unsqueeze(node: ir.Node, ctx: Context) -> Outcome:
    inner = _inner(node, ctx, "Unsqueeze", shared=True)
    if isinstance(inner, str):
        return inner
    if ctx.opset < 13:
        return "axes are attributes at this opset"
    combined = _combined_unsqueeze(inner, node, ctx)
    if isinstance(combined, str):
        return combined
    # A shared inner goes only if every user takes it in (else the merge would add a node).
    for user, _ in inner.outputs[0].uses():
        if user is not node and isinstance(_combined_unsqueeze(inner, user, ctx), str):
            return "another user of the inner Unsqueeze cannot take it in"
    source = inner.inputs[0]

    def rewrite() -> None:
        axes = ctx.new_constant(np.array(combined, dtype=np.int64), "unsqueeze_axes", before=node)
        node.replace_input_with(0, source)
        node.replace_input_with(1, axes)

    return rewrite


def _round_trip(node: ir.Node, ctx: Context, inner_op: str) -> Outcome:
    inner = ctx.producer(node.inputs[0], inner_op)
    if inner is None:
        return f"its input is not a {inner_op}"
    outer_axes, inner_axes = _axes(node, ctx), _axes(inner, ctx)
    if outer_axes is None or inner_axes is None or not inner_axes:
        return "axes are not constant, or the Squeeze has none"
    rank_out = ctx.dims(node.outputs[0])
    rank_in = ctx.dims(inner.inputs[0])
    unsq_rank = None
    if node.op_type == "Squeeze":  # Squeeze(Unsqueeze(x)): axes are of the unsqueezed tensor
        unsq_rank = None if rank_in is None else len(rank_in) + len(inner_axes)
    else:  # Unsqueeze(Squeeze(x)): axes of x, the unsqueezed tensor
        unsq_rank = None if rank_out is None else len(rank_out)
    a, b = _normalized(outer_axes, unsq_rank), _normalized(inner_axes, unsq_rank)
    if a is None or b is None or a != b:
        return "different axes (or negative axes of unknown rank)"
    return ctx.bypass(node, inner.inputs[0])


@rule("Squeeze", family="chains")
def squeeze_of_unsqueeze(node: ir.Node, ctx: Context) -> Outcome:
    return _round_trip(node, ctx, "Unsqueeze")


@rule("Unsqueeze", family="chains")
def unsqueeze_of_squeeze(node: ir.Node, ctx: Context) -> Outcome:
    return _round_trip(node, ctx, "Squeeze")


@rule("Transpose", family="chains")
def transpose_of_transpose(node: ir.Node, ctx: Context) -> Outcome:
    inner = _inner(node, ctx, "Transpose")
    if isinstance(inner, str):
        return inner
    p1, p2 = inner.attributes.get_ints("perm", None), node.attributes.get_ints("perm", None)
    if p1 is None or p2 is None or len(p1) != len(p2):
        return "a perm is implicit"
    combined = [p1[i] for i in p2]
    source = inner.inputs[0]
    if combined == list(range(len(combined))):
        return ctx.bypass(node, source)

    def rewrite() -> None:
        node.replace_input_with(0, source)
        node.attributes["perm"] = ir.AttrInt64s("perm", combined)

    return rewrite


def _moves_only_ones(node: ir.Node, ctx: Context) -> str | None:
    """Why the Transpose ``node`` may move an axis of size other than 1 (None: it moves only size-1 axes)."""
    dims = ctx.dims(node.inputs[0])
    if dims is None:
        return "the Transpose's input rank is unknown"
    perm = node.attributes.get_ints("perm", None)
    perm = list(range(len(dims)))[::-1] if perm is None else list(perm)
    if sorted(perm) != list(range(len(dims))):
        return "the Transpose's perm is not a permutation of its input's axes"
    kept = [axis for axis in perm if dims[axis] != 1]  # unknown dims count as not 1
    if kept != sorted(kept):
        return "the Transpose moves an axis whose size is not proved to be 1"
    return None


def _copies_no_dim(node: ir.Node, ctx: Context) -> np.ndarray | str:
    """The Reshape's constant target, if it copies no dim of its input (no ``0``, or ``allowzero``)."""
    target = ctx.constant(node.inputs[1]) if len(node.inputs) > 1 else None
    if target is None:
        return "the Reshape's target is not a constant"
    if not node.attributes.get_int("allowzero", 0) and np.any(target == 0):
        return "the Reshape's target copies a dim of its input"
    return target.reshape(-1)


@rule("Transpose", family="chains")
def reshape_like_transpose_of_reshape(node: ir.Node, ctx: Context) -> Outcome:
    """``Transpose(Reshape(x, s), p) -> Reshape(x, s[p])`` for a Transpose that moves only size-1 axes."""
    inner = _inner(node, ctx, "Reshape")
    if isinstance(inner, str):
        return inner
    if reason := _moves_only_ones(node, ctx):
        return reason
    target = _copies_no_dim(inner, ctx)
    if isinstance(target, str):
        return target
    perm = node.attributes.get_ints("perm", None)
    perm = list(range(len(target)))[::-1] if perm is None else list(perm)
    if len(perm) != len(target):
        return "the Reshape's target and the perm differ in rank"
    permuted = np.array([target[axis] for axis in perm], dtype=np.int64)
    source, allowzero = inner.inputs[0], inner.attributes.get_int("allowzero", 0)

    def rewrite() -> None:
        # A new Reshape makes the Transpose's result; the old one is left to die. Changing the old
        # one's target would change its output's shape, which inference gave for this sweep.
        names, old = ctx.names(), node.outputs[0]
        shape = ctx.new_constant(permuted, f"{inner.name or 'reshape'}_target", before=node)
        reshape = ir.Node("", "Reshape", [source, shape], [ir.AttrInt64("allowzero", 1)] if allowzero else [],
                          name=names.node(f"{node.name or 'Transpose'}_reshape"))
        new = reshape.outputs[0]
        new.name, new.type, new.shape = names.value(f"{old.name or 'transposed'}_reshaped"), old.type, old.shape
        assert node.graph is not None
        node.graph.insert_before(node, reshape)
        ctx.take_place(old, new)()

    return rewrite


@rule("Reshape", family="chains")
def reshape_of_reshape_like_transpose(node: ir.Node, ctx: Context) -> Outcome:
    """``Reshape(Transpose(x, p), s) -> Reshape(x, s)`` for a Transpose that moves only size-1 axes."""
    inner = _inner(node, ctx, "Transpose")
    if isinstance(inner, str):
        return inner
    if reason := _moves_only_ones(inner, ctx):
        return reason
    target = _copies_no_dim(node, ctx)
    if isinstance(target, str):
        return target
    source = inner.inputs[0]
    return lambda: _rewire(node, source)


@rule("Reshape", family="chains")
def transpose_between_reshapes(node: ir.Node, ctx: Context) -> Outcome:
    """``Reshape(Transpose(Reshape(x, s1), p), s2) -> Transpose(x, q)`` when the Reshapes only move 1s.

    Without a first Reshape (or with one that has other users), ``Reshape(Transpose(x, p), s2)``.
    """
    transpose = _inner(node, ctx, "Transpose")
    if isinstance(transpose, str):
        return transpose
    first = ctx.producer(transpose.inputs[0], "Reshape")
    if first is not None and not sole_user(first.outputs[0]):
        first = None  # it stays: the chain starts at its output
    x = transpose.inputs[0] if first is None else first.inputs[0]
    d0, d1, d3 = (ctx.static_dims(v) for v in (x, transpose.inputs[0], node.outputs[0]))
    if d0 is None or d1 is None or d3 is None:
        return "a shape in the chain is not static"
    if len(d0) != len(d3):
        return "the chain changes the rank"
    perm = transpose.attributes.get_ints("perm", None)
    perm = list(range(len(d1)))[::-1] if perm is None else list(perm)
    if sorted(perm) != list(range(len(d1))):
        return "the Transpose's perm is not a permutation of its input's axes"
    d2 = [d1[a] for a in perm]

    def others(dims: Sequence[int]) -> list[int]:
        return [i for i, d in enumerate(dims) if d != 1]

    a0, a1, a2, a3 = others(d0), others(d1), others(d2), others(d3)
    if [d0[i] for i in a0] != [d1[i] for i in a1] or [d2[i] for i in a2] != [d3[i] for i in a3]:
        return "a Reshape does more than add or remove dims of size 1"
    position = {axis: k for k, axis in enumerate(a1)}
    q = [-1] * len(d3)
    for k, at in enumerate(a3):  # the k-th other axis of the result is this one of x
        q[at] = a0[position[perm[a2[k]]]]
    for at, axis in zip((i for i in range(len(d3)) if d3[i] == 1), (i for i in range(len(d0)) if d0[i] == 1)):
        q[at] = axis
    if q == list(range(len(q))):
        return ctx.bypass(node, x)

    def rewrite() -> None:
        node.op_type = "Transpose"
        for name in ("allowzero", "shape"):
            node.attributes.pop(name, None)
        node.attributes["perm"] = ir.AttrInt64s("perm", q)
        node.resize_inputs(1)
        node.replace_input_with(0, x)

    return rewrite


def _slice_parameters(node: ir.Node, ctx: Context, rank: int | None) -> list[list[int]] | str:
    """A Slice's constant ``[starts, ends, axes, steps]`` (axes made non-negative), or why there are none."""
    if ctx.opset < 10:
        return "a Slice before opset 10 (attributes, no steps)"
    inputs = [*node.inputs, None, None, None][:5]
    values = [ctx.constant(v) if v is not None else None for v in inputs[1:]]
    if values[0] is None or values[1] is None:
        return "a Slice's starts or ends are not constants"
    count = values[0].size
    starts, ends = [int(v) for v in values[0].reshape(-1)], [int(v) for v in values[1].reshape(-1)]
    defaults = (list(range(count)), [1] * count)
    rest = []
    for value, given, default in zip(inputs[3:], values[2:], defaults):
        if value is not None and given is None:
            return "a Slice's axes or steps are not constants"
        rest.append(default if value is None else [int(v) for v in given.reshape(-1)])
    axes, steps = rest
    if any(a < 0 for a in axes):
        if rank is None:
            return "a Slice's axis is negative and the rank is unknown"
        axes = [a + rank if a < 0 else a for a in axes]
    if not len(starts) == len(ends) == len(axes) == len(steps):
        return "a Slice's starts, ends, axes and steps differ in length"
    return [starts, ends, axes, steps]


@rule("Slice", family="chains")
def slice_of_slice(node: ir.Node, ctx: Context) -> Outcome:
    """``Slice(Slice(x, ...), ...) -> Slice(x, ...)`` for slices of different axes."""
    inner = _inner(node, ctx, "Slice", shared=True)
    if isinstance(inner, str):
        return inner
    source = inner.inputs[0]
    dims = ctx.dims(source)
    rank = None if dims is None else len(dims)
    first, second = _slice_parameters(inner, ctx, rank), _slice_parameters(node, ctx, rank)
    if isinstance(first, str):
        return first
    if isinstance(second, str):
        return second
    if set(first[2]) & set(second[2]):
        return "the two Slices slice a same axis"
    merged = [a + b for a, b in zip(first, second)]

    def rewrite() -> None:
        base = node.name or "slice"
        values = [ctx.new_constant(np.array(v, np.int64), f"{base}_{label}", before=node)
                  for v, label in zip(merged, ("starts", "ends", "axes", "steps"))]  # fmt: skip
        node.resize_inputs(5)
        node.replace_input_with(0, source)
        for index, value in enumerate(values, start=1):
            node.replace_input_with(index, value)

    return rewrite


@rule("Cast", family="chains")
def cast_of_cast(node: ir.Node, ctx: Context) -> Outcome:
    inner = ctx.producer(node.inputs[0], "Cast")
    if inner is None:
        return "its input is not a Cast"
    source = inner.inputs[0]
    original, middle = ctx.dtype(source), ctx.dtype(inner.outputs[0])
    if original is None or middle is None or middle not in _EXACT_WIDENING.get(original, ()):
        return f"{original} -> {middle} is not exact"
    target = node.attributes.get_int("to", None)
    if target is not None and ir.DataType(target) == original:
        return ctx.bypass(node, source)
    return lambda: _rewire(node, source)


# Ops that compute each output element from the elements at the same place of their
# (broadcast) inputs, whatever the shape: a Reshape commutes with them when every other
# input is a single element.
_ELEMENTWISE = frozenset({
    "Abs", "Acos", "Acosh", "Asin", "Asinh", "Atan", "Atanh", "Ceil", "Cos", "Cosh", "Erf", "Exp", "Floor",
    "IsInf", "IsNaN", "Log", "Neg", "Not", "Reciprocal", "Relu", "Round", "Sigmoid", "Sign", "Sin", "Sinh",
    "Softplus", "Softsign", "Sqrt", "Tan", "Tanh", "Gelu", "HardSigmoid", "HardSwish", "LeakyRelu", "Elu",
    "Selu", "Celu", "ThresholdedRelu", "Mish", "Cast", "Identity", "BitwiseNot",
    "Add", "Sub", "Mul", "Div", "Pow", "Mod", "Max", "Min", "Sum", "Mean", "Equal", "Less", "Greater",
    "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor",
    "PRelu", "Where", "Clip",
})  # fmt: skip
_REGION_LIMIT = 64


def _elementwise_region(end: ir.Value, graph: ir.Graph | None, ctx: Context) -> tuple[ir.Node, list[ir.Node]] | str:
    """The inner Reshape and the elementwise nodes between its output and ``end``.

    Every input of a region node is the Reshape's output, another region value or a
    single element (rank at most that of the Reshape's input and of its output, all
    dims 1); every region value but ``end`` is used only inside the region.
    """
    inner: ir.Node | None = None
    region: dict[ir.Node, None] = {}
    pending = [end]
    singles: list[ir.Value] = []
    while pending:
        value = pending.pop()
        producer = value.producer()
        if producer is not None and producer.op_type == "Reshape" and producer.domain in ("", "ai.onnx") \
                and value is not end:
            if inner is not None and producer is not inner:
                return "the elementwise ops read two Reshapes"
            inner = producer
            continue
        if producer is None or producer.graph is not graph or producer.domain not in ("", "ai.onnx") \
                or producer.op_type not in _ELEMENTWISE:
            singles.append(value)
            continue
        if producer in region:
            continue
        region[producer] = None
        if len(region) > _REGION_LIMIT:
            return f"more than {_REGION_LIMIT} elementwise ops"
        pending.extend(v for v in producer.inputs if v is not None)
    if inner is None or not region:
        return "its input is not elementwise ops of a Reshape"
    source_dims = ctx.dims(inner.inputs[0])
    middle_dims = ctx.dims(inner.outputs[0])
    if source_dims is None or middle_dims is None:
        return "the rank of the inner Reshape's input or output is not known"
    for value in singles:
        dims = ctx.dims(value)
        if dims is None or len(dims) > min(len(source_dims), len(middle_dims)) or any(d != 1 for d in dims):
            return "an elementwise op reads a value that is not a single element (it would broadcast differently)"
    for node in region:
        for output in node.outputs:
            if output is end:
                continue
            if output.is_graph_output() or any(user not in region for user, _ in output.uses()):
                return "a value between the Reshapes is used outside the elementwise ops"
    return inner, list(region)


@rule("Reshape", family="chains")
def reshape_around_elementwise(node: ir.Node, ctx: Context) -> Outcome:
    """``Reshape(f(Reshape(x, s)), t) -> f(x)`` for elementwise ``f`` when ``t`` gives back x's shape."""
    if len(node.inputs) < 2 or node.inputs[0] is None:
        return "no target shape"
    end = node.inputs[0]
    if not sole_user(end):
        return "its input has other users (or is a graph output)"
    found = _elementwise_region(end, node.graph, ctx)
    if isinstance(found, str):
        return found
    inner, region = found
    source = inner.inputs[0]
    # A 0 would copy a dim of the elementwise result, which has the middle shape, not x's.
    if not reshape_restores(ctx, node.inputs[1], source, copy_zero=False):
        return "the target is not proved to be the inner Reshape's input shape"
    bypass = ctx.bypass(node, end)
    if isinstance(bypass, str):
        return bypass
    middle = inner.outputs[0]

    def rewrite() -> None:
        for op in region:
            for index, value in enumerate(op.inputs):
                if value is middle:
                    op.replace_input_with(index, source)
            for output in op.outputs:
                output.shape = None  # it now has x's shape; inference finds it again
        bypass()

    return rewrite


_ROW_OPS = ("Softmax", "LogSoftmax", "Hardmax")


@rule("Reshape", family="chains")
def row_op_through_flatten(node: ir.Node, ctx: Context) -> Outcome:
    """``Reshape(Softmax(Flatten(x, a), axis=-1), Shape(x)) -> Softmax(x, axis=a)`` (LogSoftmax, Hardmax too).

    The upgrade writes this for a Softmax-1..12 whose axis is not the last (the
    old ops worked on the input flattened to 2-D at ``axis``). From opset 13 it
    is one op when every dim after ``a`` is 1 (or there is none); before 13 it
    always is (the op flattens the same way itself).
    """
    row = None if node.inputs[0] is None else node.inputs[0].producer()
    if row is None or row.op_type not in _ROW_OPS or row.domain not in ("", "ai.onnx"):
        return "its input is not a Softmax, LogSoftmax or Hardmax"
    if not sole_user(row.outputs[0]) or row.graph is not node.graph:
        return f"the {row.op_type}'s output has other users"
    flatten = ctx.producer(row.inputs[0], "Flatten")
    if flatten is None or not sole_user(flatten.outputs[0]):
        return f"the {row.op_type}'s input is not a Flatten used by it alone"
    if row.attributes.get_int("axis", -1 if ctx.opset >= 13 else 1) not in (-1, 1):
        return f"the {row.op_type} does not work on the rows of the flattened input"
    x = flatten.inputs[0]
    dims = ctx.dims(x)
    if dims is None:
        return "the rank of the Flatten's input is not known"
    rank = len(dims)
    axis = flatten.attributes.get_int("axis", 1)
    axis = axis + rank if axis < 0 else axis
    if not 0 <= axis <= rank:
        return "the Flatten's axis is out of range"
    if axis == rank:
        return "Flatten at the last boundary (rows of one element)"
    if ctx.opset >= 13 and any(d != 1 for d in dims[axis + 1:]):
        return "a dim after the axis is not 1: the op would work on one axis, not the flattened rows"
    # A 0 would copy a dim of the 2-D rows, not x's.
    if not reshape_restores(ctx, node.inputs[1] if len(node.inputs) > 1 else None, x, copy_zero=False):
        return "the Reshape does not restore the Flatten's input shape"
    bypass = ctx.bypass(node, row.outputs[0])
    if isinstance(bypass, str):
        return bypass

    def rewrite() -> None:
        row.replace_input_with(0, x)
        row.attributes["axis"] = ir.AttrInt64("axis", axis)
        row.outputs[0].shape = None  # it now has x's shape
        bypass()

    return rewrite
