"""Partial shapes: the dims shape inference proves, as constants.

* ``Shape(x)`` (with Shape-15's ``start``/``end``) whose dims are all static
  becomes a constant, even when other dims of ``x`` are not (fold only folds
  a fully static shape).
* ``Gather(Shape(x), i)`` (axis 0) and ``Slice(Shape(x), ...)`` with constant
  indices whose selected dims are static become constants; what follows
  (Unsqueeze, Concat, Cast...) then folds.
* ``Reshape(x, t)`` with a computed target ``t`` whose result inference knows
  becomes ``Reshape(x, c)``: ``c[i]`` is the dim where it is static, ``0``
  (copy) where it is proved equal to the input's dim at the same position
  (``allowzero=0`` only), and ``-1`` for at most one other dim when every
  other entry is a static positive size (so an empty input cannot make ``-1``
  ambiguous).
* ``Concat`` of every dim of ``x`` in order is the output of a ``Shape(x)``
  that comes before it.
* ``Equal`` of shape arithmetic and a constant, or of two shape arithmetics,
  whose every pair of elements is decided (a dim is never negative; two dims
  with the same symbol are equal) becomes a constant.

A dim is known only when inference derives it from the graph inputs (the
shapes the model declares for computed values are not used); a symbolic dim
is equal to another only when inference gives both the same symbol, or when
what the ops require proves them equal (:mod:`passes.simplify.dims`).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from passes.ir import checked_inputs
from passes.ir.inference import shape_slice
from passes.simplify.rules import Context, Dim, Outcome, rule
from passes.simplify.shape_values import DimOf, shape_value

__all__: list[str] = []


def _shape_dims(node: ir.Node, ctx: Context) -> list[Dim] | None:
    """The dims a Shape node outputs (its start/end applied), or None."""
    dims = ctx.dims(node.inputs[0])
    if dims is None:
        return None
    rank = len(dims)
    start = node.attributes.get_int("start", 0)
    end = node.attributes.get_int("end", rank)
    picked = shape_slice(list(range(rank)), start, end)
    return [dims[i] for i in picked.tolist()]


def _replace_by_constant(node: ir.Node, ctx: Context, array: np.ndarray) -> Outcome:
    output = node.outputs[0]
    if output.is_graph_output():
        return "its output is a graph output"

    def rewrite() -> None:
        value = ctx.new_constant(array, f"{output.name or node.op_type}_static", before=node)
        output.replace_all_uses_with(value)

    return rewrite


def _static(dims: list[Dim]) -> np.ndarray | None:
    if any(not isinstance(d, int) for d in dims):
        return None
    return np.array(dims, dtype=np.int64)


@rule("Shape", family="shapes", name="static_shape")
def static_shape(node: ir.Node, ctx: Context) -> Outcome:
    dims = _shape_dims(node, ctx)
    array = None if dims is None else _static(dims)
    if array is None:
        return "some dims are not static"
    return _replace_by_constant(node, ctx, array)


@rule("Gather", family="shapes", name="gather_of_shape")
def gather_of_shape(node: ir.Node, ctx: Context) -> Outcome:
    shape = ctx.producer(node.inputs[0], "Shape")
    indices = ctx.constant(node.inputs[1])
    if shape is None or indices is None or node.attributes.get_int("axis", 0) != 0:
        return "not a Gather of a Shape with constant indices"
    dims = _shape_dims(shape, ctx)
    if dims is None:
        return "the rank is unknown"
    flat = indices.reshape(-1).astype(np.int64)
    if np.any(flat < -len(dims)) or np.any(flat >= len(dims)):
        return "indices out of range"
    picked = _static([dims[int(i)] for i in flat])
    if picked is None:
        return "a gathered dim is not static"
    return _replace_by_constant(node, ctx, picked.reshape(indices.shape))


@rule("Slice", family="shapes", name="slice_of_shape")
def slice_of_shape(node: ir.Node, ctx: Context) -> Outcome:
    shape = ctx.producer(node.inputs[0], "Shape")
    if shape is None:
        return "not a Slice of a Shape"
    params = [ctx.constant(v) if v is not None else None for v in node.inputs[1:5]]
    given = [v is not None for v in node.inputs[1:5]]
    if any(g and p is None for g, p in zip(given, params)):
        return "slice parameters are not constant"
    dims = _shape_dims(shape, ctx)
    if dims is None:
        return "the rank is unknown"
    starts, ends = params[0], params[1]
    axes = params[2] if len(params) > 2 and params[2] is not None else np.zeros(1, np.int64)
    steps = params[3] if len(params) > 3 and params[3] is not None else np.ones(1, np.int64)
    if starts is None or ends is None or starts.size != 1 or axes.reshape(-1)[0] not in (0, -1):
        return "not a one-axis slice"
    start, end, step = int(starts.reshape(-1)[0]), int(ends.reshape(-1)[0]), int(steps.reshape(-1)[0])
    if step == 0:
        return "step 0"
    selected = list(range(len(dims)))[start:end:step]  # Python clamps slices as ONNX does
    picked = _static([dims[i] for i in selected])
    if picked is None:
        return "a sliced dim is not static"
    return _replace_by_constant(node, ctx, picked)


def _target_from_shape_value(node: ir.Node, ctx: Context) -> list[int | None] | None:
    """The target entry by entry from the arithmetic that built it; None where a dim is not a copy."""
    built = shape_value(ctx, node.inputs[1])
    if built is None or built.scalar:
        return None
    x = node.inputs[0]
    dims_x = ctx.dims(x)
    entries: list[int | None] = []
    for i, element in enumerate(built.elements):
        if isinstance(element, int):
            entries.append(element)  # a literal of the original target, -1 and 0 included
            continue
        copied = element.value is x and element.index == i
        if not copied and dims_x is not None and i < len(dims_x):
            other = ctx.dims(element.value)
            mine = dims_x[i]
            copied = other is not None and mine is not None and element.index < len(other) and other[element.index] == mine
        entries.append(0 if copied else None)
    return entries


def _target_from_inference(node: ir.Node, ctx: Context) -> list[int | None] | str:
    inputs, outputs = ctx.dims(node.inputs[0]), ctx.dims(node.outputs[0])
    if inputs is None or outputs is None:
        return "shapes unknown"
    entries: list[int | None] = []
    for i, dim in enumerate(outputs):
        if isinstance(dim, int) and dim > 0:
            entries.append(dim)
        elif dim == 0:
            if i >= len(inputs) or inputs[i] != 0:
                return "a zero-size dim would read as 'copy'"
            entries.append(0)
        elif dim is not None and i < len(inputs) and inputs[i] == dim:
            entries.append(0)
        else:
            entries.append(None)
    return entries


@rule("Reshape", family="shapes", name="constant_reshape_target")
def constant_reshape_target(node: ir.Node, ctx: Context) -> Outcome:
    """A computed target -> a constant one (see the module docstring)."""
    target = node.inputs[1] if len(node.inputs) > 1 else None
    if target is None or ctx.constant(target) is not None:
        return "the target is already constant"
    if target.is_graph_input() or target.producer() is None:
        return "the target is a graph input"
    if node.attributes.get_int("allowzero", 0):
        return "allowzero=1"
    entries = _target_from_shape_value(node, ctx)
    if entries is None or None in entries:
        inferred = _target_from_inference(node, ctx)
        if isinstance(inferred, str):
            return inferred
        if entries is None or inferred.count(None) < entries.count(None):
            entries = inferred
    unknown = [i for i, e in enumerate(entries) if e is None]
    if len(unknown) > 1 or (unknown and -1 in entries):
        return "more than one dim is neither static nor copied"
    if unknown:
        others = [e for i, e in enumerate(entries) if i != unknown[0]]
        if any(e is None or e <= 0 for e in others):
            return "-1 would be ambiguous for an empty input"
        entries[unknown[0]] = -1
    array = np.array(entries, dtype=np.int64)
    if (why := checked_inputs.rejected("Reshape", 1, array)) is not None:
        return f"the Reshape always fails on {why}"  # as a constant it would make the model invalid

    def rewrite() -> None:
        value = ctx.new_constant(array, f"{node.name or 'reshape'}_target", before=node)
        node.replace_input_with(1, value)

    return rewrite


@rule("Equal", family="shapes", name="compare_shape_value")
def compare_shape_value(node: ir.Node, ctx: Context) -> Outcome:
    """``Equal(s, k)`` of shape arithmetic ``s`` and a constant or shape arithmetic ``k``, where every
    pair of elements is decided.

    A dim is never negative, so it never equals a negative int (TorchScript's
    ``expand(-1)`` handling compares a shape with ``-1``); literal elements are
    compared as they are; two dims are equal when they are the same dim of the
    same value, or when inference (or what the ops require) gives both the same
    symbol: ``x.shape[0] == y.shape[0]`` for a ``y`` computed from ``x``, or
    the output of an If whose branches agree on that dim. Where a pair may or
    may not be equal, the node stays.
    """
    sides = []
    for value in node.inputs[:2]:
        built = shape_value(ctx, value)
        if built is None:
            return "not a comparison of shape arithmetic with a constant or shape arithmetic"
        elements = np.empty(len(built.elements), dtype=object)
        elements[:] = list(built.elements)
        sides.append(elements.reshape(()) if built.scalar else elements)
    try:
        shape = np.broadcast_shapes(sides[0].shape, sides[1].shape)
    except ValueError:
        return "the shapes do not broadcast"
    result = []
    for a, b in zip(*(np.broadcast_to(side, shape).reshape(-1) for side in sides)):
        equal = _same_size(ctx, a, b)
        if equal is None:
            return "a dim that is not static may or may not equal the other side"
        result.append(equal)
    return _replace_by_constant(node, ctx, np.array(result, dtype=bool).reshape(shape))


def _same_size(ctx: Context, a: int | DimOf, b: int | DimOf) -> bool | None:
    """Whether two elements of shape arithmetic are equal at run time; None when that is not decided."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if isinstance(a, int) or isinstance(b, int):
        return False if min(v for v in (a, b) if isinstance(v, int)) < 0 else None  # a dim is never negative
    if a == b:
        return True
    da, db = ctx.dims(a.value), ctx.dims(b.value)
    if da is None or db is None or a.index >= len(da) or b.index >= len(db):
        return None
    return True if da[a.index] is not None and da[a.index] == db[b.index] else None


@rule("Concat", family="shapes", name="whole_shape")
def whole_shape(node: ir.Node, ctx: Context) -> Outcome:
    """A Concat of every dim of ``x`` in order (shape arithmetic) is ``Shape(x)``: an existing one's output.

    TorchScript rebuilds a shape dim by dim (``Concat(Unsqueeze(Gather(Shape(x), 0)), ...)``)
    to feed an Expand; the ``Shape(x)`` it gathered from already holds exactly
    that. Each element must be dim ``i`` of ``x`` at position ``i`` (or the int
    inference proves dim ``i`` is), for all of ``x``'s dims, as int64; the
    Shape node must take all of ``x``'s dims and come before the Concat in the
    same graph (so every user still follows its producer).
    """
    output = node.outputs[0]
    if ctx.dtype(output) != ir.DataType.INT64:
        return "not an int64 shape"
    built = shape_value(ctx, output)
    if built is None or built.scalar:
        return "not shape arithmetic"
    sources = {id(e.value): e.value for e in built.elements if isinstance(e, DimOf)}
    if len(sources) != 1:
        return "not the dims of one tensor"
    (x,) = sources.values()
    dims = ctx.dims(x)
    if dims is None or len(dims) != len(built.elements):
        return "not every dim of the tensor"
    for i, element in enumerate(built.elements):
        if not (element == DimOf(x, i) or (isinstance(element, int) and element == dims[i])):
            return "not the tensor's dims in order"
    for shape in _earlier_full_shapes(node, x, len(dims)):
        return ctx.bypass(node, shape.outputs[0])
    return "no Shape of the whole tensor before it in this graph"


def _earlier_full_shapes(node: ir.Node, x: ir.Value, rank: int) -> list[ir.Node]:
    """The Shape nodes of all of ``x``'s dims that come before ``node`` in its graph."""
    candidates = set()
    for user, _ in x.uses():
        if user.op_type == "Shape" and user.domain in ("", "ai.onnx") and user.graph is node.graph:
            picked = shape_slice(list(range(rank)), user.attributes.get_int("start", 0),
                                 user.attributes.get_int("end", rank))  # fmt: skip
            if picked.tolist() == list(range(rank)):
                candidates.add(user)
    if not candidates:
        return []
    found = []
    for other in node.graph:
        if other is node:
            return found
        if other in candidates:
            found.append(other)
    return found
