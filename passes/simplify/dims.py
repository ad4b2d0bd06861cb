"""Symbolic dims that onnx shape inference does not prove, derived from what the ops require.

onnx inference gives a dim it cannot compute a fresh symbol (``unk__N``):
the length of ``Range(0, Gather(Shape(x), 1), 1)``, a broadcast of two
different symbols, the dims of a Slice whose ends are computed (even on axes
it does not slice), an Expand to a computed shape. Rules then cannot prove
that a Reshape rebuilding ``[batch, seq, ...]`` from such a tensor restores
its shape. This module derives those dims again, in order over the main
graph, from exact facts only, and records each as an equality with the symbol
inference gave (a union-find over dims): every value inference gave that
symbol has the derived dim too.

What a run where the model succeeds must satisfy (every node of the main
graph runs; a node whose inputs do not fit fails the run), so each fact holds
for every input the model accepts:

* ``Range(0, n, 1)`` (integer) has ``max(n, 0)`` elements: ``n`` when ``n``
  is a dim (shape arithmetic, :mod:`shape_values`).
* Broadcasting (elementwise ops, Where, Expand, the batch dims of MatMul):
  each output dim is the one input dim that is not ``1``, when every such
  input dim is the same (an int ``k`` other than 1 decides alone: the others
  are then ``k`` or ``1``), or ``1`` when all are ``1``. With ``u = min(s, K)``
  for an int ``K >= 1``, the output dim of ``s`` and ``u`` is ``s``: if
  ``s <= K`` they are equal; else ``u = K < s``, so the broadcast succeeds
  only with ``K = 1``, and gives ``s``.
* MatMul's contracted dims are equal (onnxruntime checks them even for empty
  operands). Concat's inputs are not taken to agree on their other axes:
  onnxruntime skips an empty input, ``Concat([2, 3], [0, 5])`` runs.
* Ops whose output has their first input's shape (the schemas' "same shape
  as input": unary elementwise ops, Softmax/LogSoftmax/Hardmax, IsNaN, IsInf,
  Cast, CastLike, Identity, Clip, Dropout's output): each output dim is the
  input's. onnxruntime's kernels allocate the output with the input's shape.
* ``Transpose`` (``perm``, or reversed when absent; a perm that is not a
  permutation of the axes fails the node): output dim ``i`` is input dim
  ``perm[i]``.
* ``Reshape`` (opset >= 5) to a target built by shape arithmetic (with the
  integer arithmetic of :func:`dim_exprs.computed`): entry ``i`` is output
  dim ``i`` where it is an int ``k >= 1``; ``0`` is ``0`` with ``allowzero=1``
  and copies input dim ``i`` without it; a dim ``d`` proved ``>= 0`` (a value
  of ``Shape``, a sum of such) is output dim ``i`` with ``allowzero=1``, and
  without it when ``d`` is input dim ``i``, never 0 (a Conv's length) or a
  factor of input dim ``i`` (``k * d``: a 0 copies 0); an expression that may
  be negative only when it is input dim ``i``. A ``-1`` entry is sized as
  onnxruntime sizes it (:func:`_minus_one`) where the other entries cancel
  against the input's dims; a target that is not shape arithmetic gives nothing.
* ``Conv``, ``ConvTranspose``, ``MaxPool``, ``AveragePool``, ``LpPool``: spatial output dims as
  onnxruntime computes them, expressions of the input's dims (``floor((n + pads - dilation*(k-1)
  - 1) / stride) + 1`` for a Conv), some marked ``>= 1`` (:mod:`dim_windows` says which forms,
  and where it derives none); a Conv's ``n + pads - kernel`` is marked ``>= 0``.
* ``Resize`` to ``sizes`` built by shape arithmetic (every axis, stretched): its
  entries (each an int, or a dim proved ``>= 0``).
* ``Slice`` keeps the dims of the axes it does not slice; an axis sliced from
  0 with step 1 to a dim ``e`` of shape arithmetic has ``min(e, d)`` elements
  (``d`` the axis's dim): ``e`` when ``d`` is ``e``, ``min(e, K)`` when ``d``
  is an int ``K``; to an int ``-k``, ``d - k`` where that is proved ``>= 0``.

Main-graph nodes give facts for every value; an If branch's nodes for the values of that
branch only (its node runs only when the branch is taken: :func:`_derive_branches`); values
of Loop and Scan bodies and of functions keep inference's dims. Equalities that contradict
each other (two different ints) are not recorded: the model then never runs.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from passes.simplify import dim_exprs, dim_windows
from passes.simplify.dim_classes import Clamped, SymbolicDims, broadcast_dim, broadcast_shapes, clamp
from passes.simplify.dim_exprs import Expr
from passes.simplify.rules import Context
from passes.simplify.shape_values import DimOf

__all__ = ["Clamped", "SymbolicDims", "broadcast_dim", "derive"]

_INT64_BIG = 2**62

_BROADCASTING = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Mod", "BitShift", "PRelu",
    "And", "Or", "Xor", "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual",
    "Where", "Max", "Min", "Sum", "Mean", "BitwiseAnd", "BitwiseOr", "BitwiseXor",
})  # fmt: skip

_SAME_SHAPE = frozenset({
    "Abs", "Neg", "Floor", "Ceil", "Round", "Sign", "Reciprocal", "Sqrt", "Exp", "Log", "Erf",
    "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh",
    "Relu", "LeakyRelu", "Elu", "Selu", "Celu", "ThresholdedRelu", "Sigmoid", "HardSigmoid", "Tanh",
    "Softplus", "Softsign", "HardSwish", "Mish", "Gelu", "Shrink", "Not", "BitwiseNot",
    "IsNaN", "IsInf", "Softmax", "LogSoftmax", "Hardmax", "Cast", "CastLike", "Identity", "Clip", "Dropout",
})  # fmt: skip
"""Ops whose first output has their first input's shape (the ONNX schemas; other inputs are scalars,
a type (CastLike) or a training flag (Dropout), never broadcast into the output)."""


class _Deriver:
    """Derives the main graph's dims node by node (see the module docstring)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.found = SymbolicDims()

    def dims(self, value: ir.Value | None) -> tuple[object, ...] | None:
        if value is None:
            return None
        derived = self.found.shape(value)
        if derived is not None:
            return derived
        raw = self.ctx.dims(value)
        return None if raw is None else self.found.canonical(raw)

    def element(self, element: object) -> object:
        """A shape-arithmetic element as a dim: a literal, or the representative of the dim it is."""
        if isinstance(element, DimOf):
            dims = self.dims(element.value)
            return None if dims is None or element.index >= len(dims) else dims[element.index]
        return element

    def computed(self, value: ir.Value | None) -> dim_exprs.Computed | None:
        """The elements of a shape-arithmetic value as dims, each with whether it is ``>= 0``.

        See :func:`dim_exprs.computed`; each dim is its representative.
        """
        built = dim_exprs.computed(self.ctx, value, self.element, self.found.nonnegative)
        return None if built is None else [(self.found.find(dim), nonnegative) for dim, nonnegative in built]

    def entries(self, value: ir.Value | None) -> list[object] | None:
        """The elements of a 1-D shape-arithmetic value as dims (None for one that is not).

        An int is given as it is; an expression not proved ``>= 0`` is None (unknown).
        """
        built = self.computed(value)
        if built is None:
            return None
        return [d if isinstance(d, int) or nonnegative else None for d, nonnegative in built]

    def scalar(self, value: ir.Value | None) -> object:
        built = self.entries(value)
        return None if built is None or len(built) != 1 else built[0]

    def visit(self, node: ir.Node) -> None:
        derived: list[tuple[object, ...] | None] = [None] * len(node.outputs)
        if node.domain in ("", "ai.onnx"):
            handler = _HANDLERS.get(node.op_type)
            if node.op_type in _BROADCASTING:
                handler = _Deriver.broadcasting
            if handler is not None:
                derived = handler(self, node) or derived
        for output, ours in zip(node.outputs, derived):
            raw = self.ctx.dims(output)
            if raw is not None and ours is not None and len(raw) == len(ours):
                for a, b in zip(raw, ours):
                    self.found.union(a, b)
                shape = tuple(a if isinstance(a, int) or b is None else b for a, b in zip(raw, ours))
            else:
                shape = raw if raw is not None else ours
            if shape is not None:
                self.found.record(output, shape)

    # --- handlers: each returns the derived shape of each output (None where nothing is derived)

    def broadcasting(self, node: ir.Node) -> list[tuple[object, ...] | None] | None:
        if self.ctx.opset < 7:
            return None  # before opset 7, broadcasting was opt-in (attributes broadcast, axis)
        shapes = [self.dims(v) for v in node.inputs if v is not None]
        if not shapes or any(s is None for s in shapes):
            return None
        return [broadcast_shapes(shapes)]  # type: ignore[arg-type]

    def same_shape(self, node: ir.Node) -> list[tuple[object, ...] | None] | None:
        x = self.dims(node.inputs[0] if node.inputs else None)
        return None if x is None else [x]

    def transpose(self, node: ir.Node) -> list[tuple[object, ...] | None] | None:
        x = self.dims(node.inputs[0])
        if x is None:
            return None
        perm = node.attributes.get_ints("perm", None)
        perm = list(range(len(x)))[::-1] if perm is None else list(perm)
        if sorted(perm) != list(range(len(x))):
            return None  # the node fails
        return [tuple(x[p] for p in perm)]

    def reshape(self, node: ir.Node) -> list[tuple[object, ...] | None] | None:
        if self.ctx.opset < 5 or len(node.inputs) < 2:
            return None  # before opset 5, the shape was an attribute
        x = self.dims(node.inputs[0])
        target = self.computed(node.inputs[1])
        if target is None:
            return None
        allowzero = node.attributes.get_int("allowzero", 0) == 1
        out = [self._reshaped(entry, x, i, allowzero) for i, entry in enumerate(target)]
        minus = [i for i, (dim, _) in enumerate(target) if dim == -1]
        if len(minus) == 1 and x is not None:
            out[minus[0]] = _minus_one(x, out[: minus[0]] + out[minus[0] + 1 :], allowzero)
        return [tuple(out)]

    def _reshaped(self, entry: tuple[object, bool], x: tuple[object, ...] | None, i: int, allowzero: bool) -> object:
        """Output dim ``i`` of a Reshape of a tensor of dims ``x`` whose target entry ``i`` is ``entry``.

        ``entry`` is a dim and whether it is proved ``>= 0``: one that is not (an
        expression, maybe ``-1`` at run time) is output dim ``i`` only where it is
        input dim ``i`` (a size, so then ``>= 0``). Without allowzero, a dim that
        may be 0 copies input dim ``i`` then: it is output dim ``i`` where it is
        never 0 (a Conv's length) or input dim ``i`` is ``k`` times it.
        """
        own = x[i] if x is not None and i < len(x) else None
        dim, nonnegative = entry
        if isinstance(dim, int):
            if dim >= 1 or (dim == 0 and allowzero):
                return dim
            return own if dim == 0 else None  # 0 copies the input's dim; a -1 is sized by _minus_one
        if dim is None:
            return None
        if dim == own or (allowzero and nonnegative) or self.found.positive(dim):
            return dim
        multiple = isinstance(own, Expr) and own.const == 0 and len(own.terms) == 1 and own.terms[0][1] >= 1
        return dim if nonnegative and multiple and own.terms[0][0] == dim else None  # type: ignore[union-attr]

    def expand(self, node: ir.Node) -> list[tuple[object, ...] | None] | None:
        x = self.dims(node.inputs[0])
        target = self.entries(node.inputs[1])
        if x is None or target is None:
            return None
        return [broadcast_shapes([x, target])]

    def resize(self, node: ir.Node) -> list[tuple[object, ...] | None] | None:
        """``Resize`` (opset >= 11) to ``sizes`` over every axis, stretched: the output's dims are its entries.

        Not from ``scales``: onnxruntime multiplies in float32, which is not ``floor(n * scale)``
        past ``2**24`` (tests/test_simplify_pool_dims.py).
        """
        if self.ctx.opset < 11 or len(node.inputs) < 4 or node.inputs[3] is None or "axes" in node.attributes:
            return None
        if node.attributes.get_string("keep_aspect_ratio_policy", "stretch") != "stretch":
            return None
        x, sizes = self.dims(node.inputs[0]), self.entries(node.inputs[3])
        if sizes is None or (x is not None and len(x) != len(sizes)):
            return None
        return [tuple(sizes)]

    def range(self, node: ir.Node) -> list[tuple[object, ...] | None] | None:
        if len(node.inputs) < 3:
            return None
        start, delta = (self.ctx.constant(v) for v in (node.inputs[0], node.inputs[2]))
        if start is None or delta is None or start.dtype.kind not in "iu" or delta.dtype.kind not in "iu":
            return None
        if start.size != 1 or delta.size != 1 or int(start.reshape(-1)[0]) != 0 or int(delta.reshape(-1)[0]) != 1:
            return None
        length = self.scalar(node.inputs[1])
        return None if length is None or (isinstance(length, int) and length < 0) else [(length,)]

    def conv(self, node: ir.Node) -> list[tuple[object, ...] | None] | None:
        """``Conv``: spatial output dims as :func:`dim_windows.conv_lengths` gives them."""
        x, w = self.dims(node.inputs[0]), _weight_dims(self, node.inputs[1] if len(node.inputs) > 1 else None)
        if x is None or w is None or len(x) < 3 or len(w) != len(x):
            return None
        attrs = dim_windows.window(node, list(w[2:]))
        if attrs is None or attrs.spatial != len(x) - 2:
            return None
        for span in dim_windows.conv_spans(attrs, list(x[2:])):
            self.found.mark_nonnegative(span)
        return [(x[0], w[0], *self._lengths(dim_windows.conv_lengths(attrs, list(x[2:]))))]

    def conv_transpose(self, node: ir.Node) -> list[tuple[object, ...] | None] | None:
        """``ConvTranspose`` (explicit pads, no ``output_shape``): :func:`dim_windows.conv_transpose_lengths`."""
        x, w = self.dims(node.inputs[0]), _weight_dims(self, node.inputs[1] if len(node.inputs) > 1 else None)
        if x is None or w is None or len(x) < 3 or len(w) != len(x) or "output_shape" in node.attributes:
            return None
        attrs = dim_windows.window(node, list(w[2:]))
        if attrs is None or attrs.spatial != len(x) - 2:
            return None
        output_padding = list(node.attributes.get_ints("output_padding", [0] * attrs.spatial))
        group = node.attributes.get_int("group", 1)
        channels = w[1] * group if isinstance(w[1], int) else (w[1] if group == 1 else None)
        lengths = dim_windows.conv_transpose_lengths(attrs, list(x[2:]), output_padding)
        return [(x[0], channels, *self._lengths(lengths))]

    def pool(self, node: ir.Node) -> list[tuple[object, ...] | None] | None:
        """``MaxPool``/``AveragePool``/``LpPool``: :func:`dim_windows.pool_lengths` (each output, Indices too)."""
        x = self.dims(node.inputs[0])
        attrs = dim_windows.window(node, None)
        if x is None or len(x) < 3 or attrs is None or attrs.spatial != len(x) - 2:
            return None
        ceil_mode = node.attributes.get_int("ceil_mode", 0) == 1
        shape = (x[0], x[1], *self._lengths(dim_windows.pool_lengths(attrs, list(x[2:]), ceil_mode)))
        return [shape] * len(node.outputs)

    def _lengths(self, lengths: dim_windows.Lengths) -> list[object]:
        """The lengths as dims, each marked ``>= 1`` where it is."""
        for dim, positive in lengths:
            if positive:
                self.found.mark_positive(dim)
        return [dim for dim, _ in lengths]

    def matmul(self, node: ir.Node) -> list[tuple[object, ...] | None] | None:
        a, b = self.dims(node.inputs[0]), self.dims(node.inputs[1])
        if a is None or b is None or not a or not b:
            return None
        self.found.union(a[-1], b[-2] if len(b) >= 2 else b[0])
        if len(a) == 1:
            return [tuple(b[:-2]) + (b[-1],)] if len(b) >= 2 else [()]
        if len(b) == 1:
            return [tuple(a[:-1])]
        return [broadcast_shapes([a[:-2], b[:-2]]) + (a[-2], b[-1])]

    def slice(self, node: ir.Node) -> list[tuple[object, ...] | None] | None:
        if self.ctx.opset < 10:
            return None
        x = self.dims(node.inputs[0])
        if x is None:
            return None
        rank = len(x)
        inputs = list(node.inputs) + [None] * (5 - len(node.inputs))
        starts, axes, steps = (self.ctx.constant(v) if v is not None else None for v in (inputs[1], inputs[3], inputs[4]))
        ends = self.entries(inputs[2])
        if starts is None or ends is None or (inputs[3] is not None and axes is None) or (inputs[4] is not None and steps is None):
            return None
        starts = starts.reshape(-1).tolist()
        axes = np.arange(len(starts)) if axes is None else axes
        steps = np.ones(len(starts), np.int64) if steps is None else steps
        axes, steps = axes.reshape(-1).tolist(), steps.reshape(-1).tolist()
        if not len(starts) == len(ends) == len(axes) == len(steps) or any(not -rank <= a < rank for a in axes):
            return None
        out = list(x)
        for start, end, axis, step in zip(starts, ends, axes, steps):
            out[axis % rank] = self._sliced(x[axis % rank], start, end, step)
        return [tuple(out)]

    def _sliced(self, dim: object, start: int, end: object, step: int) -> object:
        """The length of ``dim[start:end:step]``, or None when not proved.

        ``dim[0:-k]`` has ``max(dim - k, 0)`` elements: ``dim - k`` where that is proved ``>= 0``.
        """
        if step == 0:
            return None
        if isinstance(end, int) and isinstance(dim, int):
            return len(range(dim)[start:end:step])
        if start != 0 or step != 1:
            return None
        if isinstance(end, int):
            if -_INT64_BIG < end < 0 and dim is not None:
                length = dim_exprs.add(dim, end)
                return length if self.found.nonnegative(length) else None
            if end < 0 or dim is None:
                return None
            return dim if end >= _INT64_BIG else clamp(dim, end)
        if end is None or dim is None:
            return None
        if end == dim:
            return dim
        return clamp(end, dim) if isinstance(dim, int) else None


def _minus_one(x: tuple[object, ...], others: list[object], allowzero: bool) -> object:
    """The dim a Reshape of a tensor of dims ``x`` gives its ``-1`` entry, the others' output dims being ``others``.

    onnxruntime: without allowzero, the element count over the others' product
    (the node fails where that product is 0); with allowzero, the product of
    the input's non-zero dims over the others' non-zero ones. Each other dim
    that is not an int must be a dim of ``x`` (the pairs cancel, zero or not);
    what is left of ``x`` is ints ``>= 1`` (with allowzero), or ints and dims
    without it, giving the dims' product (:class:`dim_exprs.Product`) times the quotient of the ints.
    """
    left = list(x)
    wanted = 1
    for dim in others:
        if dim is None or (isinstance(dim, int) and dim < 1):
            return None
        if isinstance(dim, int):
            wanted *= dim
        elif dim in left:
            left.remove(dim)
        else:
            return None
    symbols = [d for d in left if not isinstance(d, int)]
    ints = [d for d in left if isinstance(d, int)]
    if None in symbols or (allowzero and symbols) or (allowzero and min(ints, default=1) < 1):
        return None
    have = int(np.prod(ints, dtype=np.int64)) if ints else 1
    if have % wanted:
        return None
    product: object = have // wanted
    for symbol in symbols:
        product = dim_exprs.multiply(product, symbol)
    return product


def _weight_dims(deriver: _Deriver, w: ir.Value | None) -> tuple[object, ...] | None:
    """The dims of a weight: derived, else its tensor's (an initializer loaded without a declared shape)."""
    dims = deriver.dims(w)
    if dims is None and w is not None and w.const_value is not None:
        return tuple(int(d) for d in w.const_value.shape)
    return dims


_HANDLERS = {
    **{op: _Deriver.same_shape for op in _SAME_SHAPE},
    "Transpose": _Deriver.transpose,
    "Reshape": _Deriver.reshape,
    "Expand": _Deriver.expand,
    "Resize": _Deriver.resize,
    "Range": _Deriver.range,
    "MatMul": _Deriver.matmul,
    "Conv": _Deriver.conv,
    "ConvTranspose": _Deriver.conv_transpose,
    **{op: _Deriver.pool for op in ("MaxPool", "AveragePool", "LpPool")},
    "Slice": _Deriver.slice,
}


def derive(graph: ir.Graph, ctx: Context) -> SymbolicDims:
    """The dims of ``graph``'s values (the main graph), derived from what its nodes require, and of its
    If branches' values (:meth:`SymbolicDims.in_graph`).

    ``ctx`` gives inference's dims (:meth:`Context.dims` without derived dims).
    """
    deriver = _Deriver(ctx)
    for value in (*graph.inputs, *graph.initializers.values()):
        raw = ctx.dims(value)
        if raw is not None:
            deriver.found.record(value, raw)
    for node in graph:
        deriver.visit(node)
    _derive_branches(graph, deriver)
    return deriver.found


def _derive_branches(graph: ir.Graph, parent: _Deriver) -> None:
    """Each If branch of ``graph``'s nodes, derived on a fork of ``parent``'s facts, then its own branches.

    The fork is taken once ``graph`` is derived whole: every node of ``graph`` runs
    in a run where the branch does (the main graph's in every run that succeeds,
    an enclosing branch's whenever it is taken), so all of ``graph``'s facts hold
    inside; an If's output is the output of the branch taken, so a main-graph fact about
    it (a symbol inference gives both) holds for that branch's output too. Not so for a
    Loop or Scan body: its values change size from one iteration to the next, and a
    main-graph fact about the node's output fixes only the last iteration's (or the
    stacked) size, so no fork is made there (its values keep inference's dims, not
    canonicalised by main-graph facts).
    """
    for node in graph:
        if node.op_type != "If" or node.domain not in ("", "ai.onnx"):
            continue
        for attr in node.attributes.values():
            if isinstance(attr, ir.Attr) and not attr.is_ref() and attr.type == ir.AttributeType.GRAPH:
                deriver = _Deriver(parent.ctx)
                deriver.found = parent.found.fork(attr.value)
                for inner in attr.value:
                    deriver.visit(inner)
                _derive_branches(attr.value, deriver)
