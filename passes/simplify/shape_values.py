"""Shape arithmetic, symbolically: which dims of which tensors a small int tensor holds.

Exporters build Reshape targets and Expand shapes from ``Shape(x)``:
``Concat(Unsqueeze(Gather(Shape(x), 0)), Unsqueeze(Gather(Shape(x), 1)), [-1, 64])``.
:func:`shape_value` follows such a value back through Shape, Gather, Slice,
Unsqueeze, Squeeze, Concat, Cast, Identity and Where (with a constant
condition) and says, element by element,
what it holds: a literal int, or "dim ``j`` of tensor ``v``" (a :class:`DimOf`).
That is exact, not inferred: the element *is* that dim at run time. A dim that
shape inference proves static is given as its int.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir

from passes.ir.inference import shape_slice
from passes.simplify.rules import Context

__all__ = ["DimOf", "ShapeValue", "is_dim_of", "reshape_restores", "shape_value"]


@dataclasses.dataclass(frozen=True)
class DimOf:
    """Dim ``index`` of ``value`` (``value`` compared by identity)."""

    value: ir.Value
    index: int

    def __hash__(self) -> int:
        return hash((id(self.value), self.index))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DimOf) and other.value is self.value and other.index == self.index


Element = int | DimOf


@dataclasses.dataclass(frozen=True)
class ShapeValue:
    """The elements of a 0-D or 1-D int tensor (``scalar`` for 0-D)."""

    elements: tuple[Element, ...]
    scalar: bool = False


_INT_TYPES = (ir.DataType.INT64, ir.DataType.INT32)
_MAX_ELEMENTS = 64


def shape_value(ctx: Context, value: ir.Value | None, depth: int = 0) -> ShapeValue | None:
    """What ``value`` holds, element by element, or None when it is not such shape arithmetic."""
    if value is None or depth > 32:
        return None
    constant = ctx.constant(value)
    if constant is not None:
        if constant.dtype.kind not in "iu" or constant.ndim > 1 or constant.size > _MAX_ELEMENTS:
            return None
        return ShapeValue(tuple(int(v) for v in constant.reshape(-1)), constant.ndim == 0)
    node = value.producer()
    if node is None or node.domain not in ("", "ai.onnx"):
        return None
    handler = _HANDLERS.get(node.op_type)
    return None if handler is None else handler(ctx, node, depth + 1)


def is_dim_of(ctx: Context, entry: object, x: ir.Value, axis: int, dims: tuple) -> bool:
    """Whether ``entry`` (an int or a DimOf) is, at run time, dim ``axis`` of ``x`` (whose dims are ``dims``).

    A dim of another tensor counts when inference gives both the same int or symbol.
    """
    if isinstance(entry, DimOf):
        if entry.value is x:
            return entry.index == axis
        other = ctx.dims(entry.value)
        return other is not None and entry.index < len(other) and other[entry.index] == dims[axis] is not None
    return isinstance(entry, int) and isinstance(dims[axis], int) and entry == dims[axis]


def reshape_restores(ctx: Context, target: ir.Value | None, x: ir.Value, *, copy_zero: bool) -> bool:
    """Whether ``Reshape(t, target)``, for a ``t`` of as many elements as ``x``, has x's shape.

    Entry ``i`` of the target, as built, must be dim ``i`` of ``x`` (a positive
    int, or the dim itself), or ``0`` when ``copy_zero`` (allowzero 0 and ``t``
    is ``x``, whose dim it copies), except at most one ``-1``, which then can
    only be that dim too (the element counts are equal; the original fails
    where it would not be: a ``-1`` next to a zero dim).
    """
    built = shape_value(ctx, target)
    dims = ctx.dims(x)
    if built is None or built.scalar or dims is None:
        return False
    entries = built.elements
    if len(entries) != len(dims) or list(entries).count(-1) > 1:
        return False
    return all(e == -1 or (copy_zero and e == 0)
               or (is_dim_of(ctx, e, x, i, dims) and not (isinstance(e, int) and e <= 0))
               for i, e in enumerate(entries))  # fmt: skip


def _shape(ctx: Context, node: ir.Node, depth: int) -> ShapeValue | None:
    x = node.inputs[0]
    dims = ctx.dims(x)
    if dims is None:
        return None
    picked = shape_slice(range(len(dims)), node.attributes.get_int("start", 0), node.attributes.get_int("end", None))
    return ShapeValue(tuple(dims[i] if isinstance(dims[i], int) else DimOf(x, i) for i in picked.tolist()))


def _gather(ctx: Context, node: ir.Node, depth: int) -> ShapeValue | None:
    data, indices = shape_value(ctx, node.inputs[0], depth), ctx.constant(node.inputs[1])
    if data is None or data.scalar or indices is None or node.attributes.get_int("axis", 0) != 0:
        return None
    n = len(data.elements)
    flat = [int(i) for i in indices.reshape(-1)]
    if indices.ndim > 1 or any(not -n <= i < n for i in flat):
        return None
    return ShapeValue(tuple(data.elements[i] for i in flat), indices.ndim == 0)


def _slice(ctx: Context, node: ir.Node, depth: int) -> ShapeValue | None:
    data = shape_value(ctx, node.inputs[0], depth)
    params = [ctx.constant(v) if v is not None else None for v in node.inputs[1:5]]
    if data is None or data.scalar or any(v is not None and p is None for v, p in zip(node.inputs[1:5], params)):
        return None
    starts, ends = params[0], params[1]
    steps = params[3] if len(params) > 3 and params[3] is not None else np.ones(1, np.int64)
    if starts is None or ends is None or starts.size != 1 or steps.size != 1 or int(steps.reshape(-1)[0]) == 0:
        return None
    start, end, step = (int(a.reshape(-1)[0]) for a in (starts, ends, steps))
    return ShapeValue(data.elements[start:end:step])  # Python clamps slices as ONNX does


def _unsqueeze(ctx: Context, node: ir.Node, depth: int) -> ShapeValue | None:
    data = shape_value(ctx, node.inputs[0], depth)
    return ShapeValue(data.elements) if data is not None and data.scalar else None


def _squeeze(ctx: Context, node: ir.Node, depth: int) -> ShapeValue | None:
    data = shape_value(ctx, node.inputs[0], depth)
    return ShapeValue(data.elements, True) if data is not None and len(data.elements) == 1 else None


def _concat(ctx: Context, node: ir.Node, depth: int) -> ShapeValue | None:
    parts = [shape_value(ctx, v, depth) for v in node.inputs]
    if any(p is None or p.scalar for p in parts):
        return None
    return ShapeValue(tuple(e for p in parts for e in p.elements))  # type: ignore[union-attr]


def _same(ctx: Context, node: ir.Node, depth: int) -> ShapeValue | None:
    if node.op_type == "Cast" and node.attributes.get_int("to", 0) not in _INT_TYPES:
        return None
    return shape_value(ctx, node.inputs[0], depth)


def _where(ctx: Context, node: ir.Node, depth: int) -> ShapeValue | None:
    """``Where(c, x, y)`` with a constant ``c``: element by element, ``x``'s where ``c`` is true, else ``y``'s.

    TorchScript's ``expand(-1)`` handling picks 1 where a shape it built holds -1.
    Shapes broadcast as 1-D vectors: each of ``c``, ``x``, ``y`` has the output's
    length, or one element (or is a scalar).
    """
    condition = ctx.constant(node.inputs[0])
    x, y = shape_value(ctx, node.inputs[1], depth), shape_value(ctx, node.inputs[2], depth)
    if condition is None or x is None or y is None or condition.dtype != np.bool_ or condition.ndim > 1:
        return None
    picks = condition.reshape(-1).tolist()
    lengths = {len(picks), len(x.elements), len(y.elements)}
    n = max(lengths)
    if lengths - {1, n} or n == 0:
        return None

    def at(elements: tuple[Element, ...] | list[bool], i: int) -> object:
        return elements[0] if len(elements) == 1 else elements[i]

    chosen = tuple(at(x.elements, i) if at(picks, i) else at(y.elements, i) for i in range(n))
    return ShapeValue(chosen, condition.ndim == 0 and x.scalar and y.scalar)  # type: ignore[arg-type]


_HANDLERS = {
    "Shape": _shape,
    "Gather": _gather,
    "Slice": _slice,
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Concat": _concat,
    "Cast": _same,
    "Identity": _same,
    "Where": _where,
}
