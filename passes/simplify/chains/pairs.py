"""Two-op chains that are one op (or none): Reshape, Unsqueeze/Squeeze, Transpose, Cast and Concat pairs."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from passes.simplify.chains._common import axes_of, inner_node, rewire
from passes.simplify.rules import Context, Outcome, rule, sole_user
from passes.simplify.shape_values import is_dim_of, shape_value

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



@rule("Reshape", family="chains")
def reshape_of_reshape(node: ir.Node, ctx: Context) -> Outcome:
    inner = inner_node(node, ctx, "Reshape")
    if isinstance(inner, str):
        return inner
    source = inner.inputs[0]
    shape = ctx.constant(node.inputs[1])
    if shape is None:
        if not (node.attributes.get_int("allowzero", 0) or _copies_alike(node, inner, ctx)):
            return "the outer target is computed, and a 0 in it may copy a dim of the inner result"
        return lambda: rewire(node, source)
    if not node.attributes.get_int("allowzero", 0) and np.any(shape == 0):
        return "the outer target copies a dim of the inner result"
    return lambda: rewire(node, source)


def _copies_alike(node: ir.Node, inner: ir.Node, ctx: Context) -> bool:
    """Whether the outer Reshape's computed target, where a ``0`` copies a dim, copies the same from either input.

    For an inner result of rank 1 (a flatten, as TorchScript writes ``x.view(-1)``
    before ``.view(shape)``): a ``0`` past entry 0 fails the original (nothing to
    copy), and entry 0, when it is proved to be dim 0 of the inner's input
    (:func:`is_dim_of`) or a positive literal, copies ``0`` only when that dim is
    ``0``, so the flat count is ``0`` too: both copy ``0``.
    """
    built = shape_value(ctx, node.inputs[1])
    middle, x = ctx.dims(inner.outputs[0]), inner.inputs[0]
    dims = ctx.dims(x)
    if built is None or built.scalar or middle is None or len(middle) != 1 or not dims or not built.elements:
        return False
    first = built.elements[0]
    return (isinstance(first, int) and (first > 0 or first == -1)) or is_dim_of(ctx, first, x, 0, dims)


def _normalized(axes: list[int], rank: int | None) -> list[int] | None:
    if any(a < 0 for a in axes):
        if rank is None:
            return None
        axes = [a + rank if a < 0 else a for a in axes]
    return sorted(axes)


def _combined_unsqueeze(inner: ir.Node, node: ir.Node, ctx: Context) -> list[int] | str:
    """The axes of one Unsqueeze doing ``node``'s after ``inner``'s, or why there are none."""
    a1, a2 = axes_of(inner, ctx), axes_of(node, ctx)
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
    inner = inner_node(node, ctx, "Unsqueeze", shared=True)
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
    outer_axes, inner_axes = axes_of(node, ctx), axes_of(inner, ctx)
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
    inner = inner_node(node, ctx, "Transpose")
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
    return lambda: rewire(node, source)


def _axis(concat: ir.Node, rank: int | None) -> int | None:
    """The Concat's axis, made non-negative when ``rank`` is known (else as written)."""
    axis = concat.attributes.get_int("axis", None)
    if axis is None or axis >= 0 or rank is None:
        return axis
    return axis + rank


@rule("Concat", family="chains")
def concat_of_concat(node: ir.Node, ctx: Context) -> Outcome:
    """``Concat(.., Concat(a, b, axis=k), .., axis=k) -> Concat(.., a, b, ..)`` (every user of the inner a Concat).

    Concatenation is associative: the flat Concat joins the same pieces in the
    same order and refuses the same mismatches (an empty piece onnxruntime skips
    is skipped either way). The inner must be in the node's graph, not a graph
    output, and each of its uses a Concat on the same axis in that graph, which
    takes it in too (a shared ``Concat(h, w)`` joined after two prefixes: three
    nodes become two), so it becomes dead.
    """
    dims = ctx.dims(node.outputs[0])
    rank = None if dims is None else len(dims)
    axis = _axis(node, rank)
    if axis is None:
        return "no axis"
    taken = []
    for index, value in enumerate(node.inputs):
        inner = ctx.producer(value, "Concat")
        if (inner is not None and inner.graph is node.graph and _axis(inner, rank) == axis
                and not value.is_graph_output() and all(_joins_on(user, node, rank, axis) for user, _ in value.uses())):
            taken.append(index)
    if not taken:
        return "no input is a Concat on the same axis whose users are all such Concats"

    def rewrite() -> None:
        flat: list[ir.Value | None] = []
        for index, value in enumerate(node.inputs):
            producer = value.producer() if value is not None and index in taken else None
            flat.extend(producer.inputs if producer is not None else [value])
        node.resize_inputs(len(flat))
        for index, value in enumerate(flat):
            node.replace_input_with(index, value)

    return rewrite


def _joins_on(user: ir.Node, node: ir.Node, rank: int | None, axis: int) -> bool:
    """Whether ``user`` is a Concat of ``node``'s graph on ``axis`` (so :func:`concat_of_concat` takes its inputs in)."""
    return (user.op_type == "Concat" and user.domain == node.domain and user.graph is node.graph
            and _axis(user, rank) == axis)


# Ops that compute each output element from the elements at the same place of their
# (broadcast) inputs, whatever the shape: a Reshape commutes with them when every other
# input is a single element.
