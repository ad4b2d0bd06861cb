"""Decomposition of ReduceLogSumExp into primitive ONNX ops.

Runtimes and compilers without a ReduceLogSumExp kernel can run the result.
The rewrite is the max-shifted log-sum-exp::

    m  = ReduceMax(x, axes, keepdims=1)
    m' = Clip(m, -MAX, MAX)              # ±inf -> ±MAX: a finite shift
    s  = ReduceSum(Exp(x - m'), axes, keepdims)
    y  = Log(s) + m'                                  # keepdims=1
    y  = Log(s) + ReduceMax(m', axes, keepdims=0)     # keepdims=0

Why Clip rather than ``Where(IsInf(m), 0, m)``: both make the shift finite,
which is all the special cases need. A slice holding +inf gives
``Exp(inf - MAX) = inf``, so ``y = inf``; an all -inf slice gives
``Exp(-inf + MAX) = 0``, so ``y = Log(0) - MAX = -inf``; an empty slice has
``m = -inf`` and ``s = 0``, so ``y = -inf``. A finite ``m`` passes through
unchanged, so finite inputs compute exactly what the ``Where`` form computes.
Clip is one node and exists at every opset handled here (IsInf only from 10).
NaN propagates through ``x - m'`` whatever ReduceMax makes of it
(onnxruntime's ReduceMax drops a NaN in some positions). The keepdims=0 shift
is a ReduceMax of the small keepdims=1 shift over the same axes: exact (one
element per slice) and right for run-time axes and ``noop_with_empty_axes``
(where it is the identity), which a Squeeze is not. With empty axes and
``noop_with_empty_axes`` the result is the input bit for bit, ±inf, NaN and
-0 included (see ``_build``).

Long sums (at least ``_BLOCK_MIN`` = 64 terms; axes and the reduced sizes
known before run time) are computed in two levels: a Reshape splits the
longest reduced axis of length n = p*q into (p, q), q about the square root of
the number of terms, and two ReduceSums add q terms, then the rest. A runtime
that adds an axis sequentially (onnxruntime does for every reduced axis but
the innermost, and per SIMD lane on that one) has an error growing like
n*eps; two levels bring it to about (q + n/q)*eps. Measured in float32 with
onnxruntime: N(0,1) data of shape (8, 512, 512) over axis 1, up to 2.1 ulp
with one ReduceSum, 1.2 with two; 4096 two-valued terms over axis 0, 15 ulp
against 0.4.

float16 and bfloat16 inputs are computed in float32 between a Cast in and a
Cast out; float32 and float64 in their own type (no cast to float64).
Integer inputs and inputs of unknown element type are left as they are and
counted in ``stats``.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx.defs
import onnx_ir as ir

from passes.base import Pass, pass_stats
from passes.declarations import DECOMPOSE
from passes.decompose.shapes import note_types
from passes.ir import inference
from passes.ir.amplification import Amplified
from passes.ir.build import Builder, axes_are_input
from passes.ir.inference import is_static
from passes.ir.names import Names
from passes.ir.walk import Scope, default_opset, iter_scopes, normalize_domain

__all__ = ["DecomposeLogSumExpPass"]

logger = logging.getLogger(__name__)

_OP = "ReduceLogSumExp"

# Element type the arithmetic is done in, per input element type.
_COMPUTE_TYPE = {
    ir.DataType.FLOAT: ir.DataType.FLOAT,
    ir.DataType.DOUBLE: ir.DataType.DOUBLE,
    ir.DataType.FLOAT16: ir.DataType.FLOAT,
    ir.DataType.BFLOAT16: ir.DataType.FLOAT,
}
_NUMPY = {ir.DataType.FLOAT: np.float32, ir.DataType.DOUBLE: np.float64}

# Below opset 7 Sub/Add broadcast only through the legacy ``broadcast``
# attribute, which cannot broadcast the keepdims=1 maximum against the data.
_MIN_OPSET = 7

# Reductions of at least this many terms are summed in two levels.
_BLOCK_MIN = 64

#: Why a node is left in place, as counted in ``stats["declined"]``; :data:`AMPLIFIED` is followed by the op
#: that would amplify the decomposition's change of rounding (:mod:`passes.ir.amplification`).
INTEGER, UNKNOWN_TYPE, UNSUPPORTED = "integer input", "unknown element type", "unsupported opset or type"
AMPLIFIED = "rounding amplified by "


@dataclasses.dataclass
class _Reduction:
    """The reduction of the original node, reproduced on the new reduce ops.

    Attributes:
        axes: The ``axes`` attribute (opset < 18, ints) or input (opset >= 18,
            a value); None when absent.
        keepdims: The node's ``keepdims``.
        noop_with_empty_axes: The node's ``noop_with_empty_axes`` (opset >= 18).
    """

    axes: tuple[int, ...] | ir.Value | None
    keepdims: int
    noop_with_empty_axes: int

    @classmethod
    def of(cls, node: ir.Node, opset: int) -> _Reduction:
        keepdims = node.attributes.get_int("keepdims", 1)
        if axes_are_input(node.op_type, opset):
            axes = node.inputs[1] if len(node.inputs) > 1 else None
            return cls(axes, keepdims, node.attributes.get_int("noop_with_empty_axes", 0))
        ints = node.attributes.get_ints("axes", None)
        # An empty axes attribute reduces over all axes, as an absent one does.
        return cls(tuple(ints) if ints else None, keepdims, 0)

    def reduce(
        self, b: Builder, op_type: str, data: ir.Value, dtype: ir.DataType, tag: str, keepdims: int
    ) -> ir.Value:
        """``op_type(data)`` over the node's axes, keeping ``noop_with_empty_axes``."""
        attributes = {"keepdims": keepdims}
        if self.noop_with_empty_axes:
            attributes["noop_with_empty_axes"] = self.noop_with_empty_axes
        return b.with_axes(op_type, data, self.axes, dtype, tag, **attributes)

    def known_axes(self, rank: int) -> tuple[int, ...] | None:
        """The reduced axes, sorted and non-negative, when known before run time.

        None when they are computed at run time, out of range, or none at all
        (``noop_with_empty_axes`` with empty axes).
        """
        if isinstance(self.axes, ir.Value):
            if self.axes.is_graph_input():  # an initializer a caller may override
                return None
            try:
                tensor = ir.convenience.get_const_tensor(self.axes)
            except ValueError:
                return None
            if tensor is None:
                return None
            axes = tuple(int(a) for a in tensor.numpy().reshape(-1))
        else:
            axes = self.axes or ()
        if not axes:
            return None if self.noop_with_empty_axes else tuple(range(rank))
        if any(not -rank <= a < rank for a in axes):
            return None
        return tuple(sorted({a % rank for a in axes}))


@dataclasses.dataclass(frozen=True)
class _Split:
    """How a long sum is done in two levels: axis ``axis`` of length outer*inner is split.

    Attributes:
        dims: The data's shape (ints where static, None where not).
        axes: The reduced axes, sorted and non-negative.
        axis: The reduced axis that is split.
        outer: Its outer part p.
        inner: Its inner part q (summed first).
    """

    dims: tuple[int | None, ...]
    axes: tuple[int, ...]
    axis: int
    outer: int
    inner: int

    @classmethod
    def plan(cls, shape: ir.Shape | None, reduction: _Reduction, opset: int) -> _Split | None:
        """A split for a sum of at least ``_BLOCK_MIN`` terms, or None when there is none."""
        if shape is None or opset < 13:
            return None
        dims = tuple(d if isinstance(d, int) else None for d in shape)
        axes = reduction.known_axes(len(dims))
        if axes is None or 0 in dims:
            return None
        # Without static dims the Reshape target comes from Shape, which may hold a
        # run-time 0: that needs allowzero (opset 14).
        if None in dims and opset < 14:
            return None
        known = [(n, a) for a in axes if (n := dims[a]) is not None]
        terms = math.prod(n for n, _ in known)
        if terms < _BLOCK_MIN:
            return None
        n, axis = max(known)  # the longest axis; the last of equals
        target = math.sqrt(terms)
        divisors = [q for q in range(2, n) if n % q == 0]
        if not divisors:  # n is prime
            return None
        inner = min(divisors, key=lambda q: abs(math.log(q / target)))
        return cls(dims, axes, axis, n // inner, inner)

    def sum(self, b: Builder, e: ir.Value, dtype: ir.DataType, keepdims: int) -> ir.Value:
        """``ReduceSum(e, axes, keepdims)`` adding ``inner`` terms first, then the rest."""
        a = self.axis
        if None not in self.dims:
            dims = [*self.dims[:a], self.outer, self.inner, *self.dims[a + 1 :]]
            target = b.constant(np.array(dims, dtype=np.int64), "block_shape")
        else:
            parts = [b.constant(np.array([self.outer, self.inner], dtype=np.int64), "block_dims")]
            if a > 0:
                parts.insert(0, self._dims(b, e, 0, a, "shape_head"))
            if a + 1 < len(self.dims):
                parts.append(self._dims(b, e, a + 1, len(self.dims), "shape_tail"))
            target = b.op("Concat", parts, ir.DataType.INT64, "block_shape", axis=0)
        attributes = {"allowzero": 1} if b.opset >= 14 else {}
        blocks = b.op("Reshape", [e, target], dtype, "blocks", **attributes)
        partial = b.with_axes("ReduceSum", blocks, (a + 1,), dtype, "block_sum", keepdims=1)
        rest = {ax + (ax > a) for ax in self.axes} | {a, a + 1}
        total = b.with_axes("ReduceSum", partial, tuple(sorted(rest)), dtype, "sum", keepdims=0)
        if keepdims:
            total = b.with_axes("Unsqueeze", total, self.axes, dtype, "sum_keepdims")
        return total

    @staticmethod
    def _dims(b: Builder, value: ir.Value, start: int, end: int, tag: str) -> ir.Value:
        if b.opset >= 15:
            return b.op("Shape", [value], ir.DataType.INT64, tag, start=start, end=end)
        shape = b.op("Shape", [value], ir.DataType.INT64, f"{tag}_full")
        starts = b.constant(np.array([start], dtype=np.int64), f"{tag}_start")
        ends = b.constant(np.array([end], dtype=np.int64), f"{tag}_end")
        return b.op("Slice", [shape, starts, ends], ir.DataType.INT64, tag)


#: The clamp's bound constants already made in a scope, by (scope body, element type): a decomposition
#: reads those an earlier one of the same call made (whose nodes come before it in the scope's order).
Bounds = dict[tuple[object, ir.DataType], tuple[ir.Value, ir.Value]]


def _clamp(b: Builder, m: ir.Value, dtype: ir.DataType, made: tuple[ir.Value, ir.Value] | None
           ) -> tuple[ir.Value, tuple[ir.Value, ir.Value] | None]:  # fmt: skip
    """``m`` with -inf/+inf replaced by the lowest/largest finite value of ``dtype``, and the bounds'
    constants when it made them (None when it used ``made``, an earlier decomposition's, or none)."""
    big = np.finfo(_NUMPY[dtype]).max
    if dtype == ir.DataType.FLOAT and b.opset < 11:  # Clip-6: float32 bounds as attributes
        return b.op("Clip", [m], dtype, "shift", min=float(-big), max=float(big)), None
    new = None if made is not None else (b.constant(np.array(-big, dtype=_NUMPY[dtype]), "shift_min"),
                                         b.constant(np.array(big, dtype=_NUMPY[dtype]), "shift_max"))  # fmt: skip
    lo, hi = made or new  # type: ignore[misc]
    if dtype == ir.DataType.FLOAT or b.opset >= 12:
        return b.op("Clip", [m, lo, hi], dtype, "shift"), new
    # Double below opset 12: Min/Max (broadcasting from opset 8, see _unsupported).
    # Clip-11 allows double, but onnxruntime implements Clip-11 for float only.
    return b.op("Max", [b.op("Min", [m, hi], dtype, "shift_upper"), lo], dtype, "shift"), new


# What shape inference found for values the model leaves untyped: (element type, shape).
Inferred = Mapping[ir.Value, tuple[ir.DataType | None, ir.Shape | None]]


def _element_type(node: ir.Node, inferred: Inferred) -> ir.DataType | None:
    """The node's element type T: from its data input, else from its output (also T),
    else from shape inference."""
    x = node.inputs[0] if node.inputs else None
    for value in (x, node.outputs[0]):
        if value is not None and value.dtype is not None:
            return value.dtype
    return inferred.get(x, (None, None))[0] if x is not None else None


def _input_shape(x: ir.Value, inferred: Inferred) -> ir.Shape | None:
    """The data input's shape: the model's if static, else shape inference's if it has one."""
    if is_static(x.shape) or x not in inferred:
        return x.shape
    return inferred[x][1] or x.shape


def _unsupported(dtype: ir.DataType, opset: int | None) -> str | None:
    """Why the rewrite cannot be written at ``opset`` for ``dtype``, or None."""
    if dtype not in _COMPUTE_TYPE:
        return f"element type {dtype.name} is not a type of {_OP}"
    if opset is None:
        return "the default domain is not imported"
    if opset < _MIN_OPSET:
        return f"Sub and Add have no multidirectional broadcasting at opset {opset}"
    if dtype == ir.DataType.BFLOAT16 and opset < 13:
        return f"Cast has no bfloat16 at opset {opset}"
    if dtype == ir.DataType.DOUBLE and opset < 8:
        return f"no op clamps a double shift at opset {opset} (Min/Max broadcast from 8)"
    return None


class DecomposeLogSumExpPass(Pass, spec=DECOMPOSE):
    """Rewrites every ReduceLogSumExp into ReduceMax, Clip, Sub, Exp, ReduceSum, Log, Add.

    Rewrite rule (T in {float, double}; float16 and bfloat16 are cast to float
    before and back after)::

        y = ReduceLogSumExp(x, axes, keepdims=k, noop_with_empty_axes=n)
        ->
        m  = ReduceMax(x, axes, keepdims=1, noop_with_empty_axes=n)
        m' = Clip(m, lowest(T), max(T))
        s  = ReduceSum(Exp(Sub(x, m')), axes, keepdims=k, noop_with_empty_axes=n)
        t  = m'                                                       if k == 1
        t  = ReduceMax(m', axes, keepdims=0, noop_with_empty_axes=n)  if k == 0
        y  = Add(Log(s), t)                                           if n == 0
        y  = Sub(t, Sub(0, Log(s)))                                   if n == 1

    The reduce ops take ``axes`` in the form of the opset that applies to the
    node (an attribute before 18, an input from 18; ReduceSum's is an input
    from 13) and the node's own axes: constant, graph input or computed. A sum
    of at least 64 terms over axes known before run time is done in two
    levels (Reshape, ReduceSum, ReduceSum, Unsqueeze for k == 1); see the
    module docstring. The two forms of the last step are equal bit for bit but
    for the sign of a zero: the n == 1 form gives back -0 for -0, so that with
    empty axes the result is exactly the input.

    Nodes are rewritten in the main graph, in every subgraph and in every
    model-local function; the output value keeps its name, type and shape.
    The clamp's two bound constants are made by the first decomposition of a
    call in each graph (or function) and element type, and read by the later ones.
    Left in place and counted: a node whose result reaches an op that would
    amplify the decomposition's change of rounding (a quantizer, a Cast to an
    integer, a comparison, an ArgMax...: :mod:`passes.ir.amplification`; the
    decomposition rounds otherwise than onnxruntime's kernel), integer inputs (onnxruntime's integer kernel
    does not compute the mathematical definition), inputs of unknown type,
    opsets that cannot express the rewrite, and functions whose opset import
    differs from the model's for an op the rewrite needs (the checker requires
    both to resolve every op of a function alike).

    Attributes:
        stats: After each call (:func:`passes.base.pass_stats`): ``applied``
            (``{"ReduceLogSumExp": n}``) and ``declined``, the nodes left in place by
            reason: :data:`INTEGER`, :data:`UNKNOWN_TYPE`, :data:`UNSUPPORTED`
            (opset, element type or function opset) and :data:`AMPLIFIED` followed by the op.
    """

    def __init__(self) -> None:
        super().__init__()
        self.stats: dict[str, Any] = pass_stats({}, {})

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        applied: collections.Counter[str] = collections.Counter()
        declined: collections.Counter[str] = collections.Counter()
        names: Names | None = None
        bounds: Bounds = {}  # one pair of clamp constants per scope and type, not one per decomposition
        model_opset = default_opset(model.opset_imports)
        targets = [
            (node, scope)
            for scope in iter_scopes(model)
            for node in scope.body  # not iter_nodes: a tuple a node, for the few nodes asked for
            if node.op_type == _OP and normalize_domain(node.domain) == ""
        ]
        # One run of shape inference for the inputs whose type or shape the model leaves open: of the
        # whole model, kept for the run (passes.ir.known), with the types of the values built here.
        unknown = [
            x for node, _ in targets
            if (x := node.inputs[0] if node.inputs else None) is not None
            and (_element_type(node, {}) is None or not is_static(x.shape))
        ]  # fmt: skip
        inferred = inference.infer_all(model) if unknown else {}
        amplified = Amplified(model)  # one walk, if there is a ReduceLogSumExp to ask about
        for node, scope in targets:
            reason = _skip_reason(node, scope, inferred)
            if reason is None and (amplifier := amplified.reason(node.outputs[0])) is not None:
                logger.info("%s %r: left in place: its result reaches %s, which would amplify the decomposition's "
                            "change of rounding", _OP, node.name, amplifier)  # fmt: skip
                reason = f"{AMPLIFIED}{amplifier}"
            if reason is None:
                names = names or Names(model)
                nodes, y, made = _build(node, scope, names, inferred, bounds)
                reason = _function_conflict(nodes, node, scope, model_opset)
            if reason is not None:
                declined[reason] += 1
                continue
            ir.convenience.replace_nodes_and_values(scope.body, node, [node], nodes, [node.outputs[0]], [y])
            bounds.update(made)  # once its nodes are in the scope, the later decompositions read its bounds
            note_types(model, nodes)
            logger.debug("decomposed %s %r into %s nodes", _OP, node.name, len(nodes))
            applied[_OP] += 1
        self.stats = pass_stats(applied, declined)
        if applied:
            logger.info("decomposed %s %s node(s); stats %s", applied[_OP], _OP, self.stats)
        return ir.passes.PassResult(model, modified=bool(applied))


def _skip_reason(node: ir.Node, scope: Scope, inferred: Inferred) -> str | None:
    """The ``stats`` key of why ``node`` is left in place, or None to decompose it."""
    dtype = _element_type(node, inferred)
    if dtype is None:
        logger.warning("%s %r: element type unknown, left in place", _OP, node.name)
        return UNKNOWN_TYPE
    if dtype.is_integer():
        logger.info("%s %r: integer input (%s) left in place", _OP, node.name, dtype.name)
        return INTEGER
    why = _unsupported(dtype, scope.opset(""))
    if why is not None:
        logger.warning("%s %r: left in place: %s", _OP, node.name, why)
        return UNSUPPORTED
    return None


def _function_conflict(nodes: list[ir.Node], node: ir.Node, scope: Scope, model_opset: int | None) -> str | None:
    """:data:`UNSUPPORTED` if a new op in a function has another schema at the model's opset."""
    opset = scope.opset("")
    if not scope.in_function or model_opset is None or opset == model_opset:
        return None
    for op_type in sorted({n.op_type for n in nodes}):
        here = onnx.defs.get_schema(op_type, opset).since_version
        there = onnx.defs.get_schema(op_type, model_opset).since_version
        if here != there:
            logger.warning("%s %r: left in place: the function imports opset %s where %s is version %s, the model "
                           "opset %s where it is version %s", _OP, node.name, opset, op_type, here, model_opset, there)
            return UNSUPPORTED
    return None


def _build(node: ir.Node, scope: Scope, names: Names, inferred: Inferred, bounds: Bounds
           ) -> tuple[list[ir.Node], ir.Value, Bounds]:  # fmt: skip
    """The replacement nodes of ``node`` (see the pass's docstring), the new output, and the clamp's
    bounds if it made them (else it reads those ``bounds`` holds for the scope and type)."""
    opset = scope.opset("")
    dtype = _element_type(node, inferred)
    x = node.inputs[0]
    assert opset is not None and dtype is not None and x is not None  # _skip_reason
    compute = _COMPUTE_TYPE[dtype]
    reduction = _Reduction.of(node, opset)
    split = _Split.plan(_input_shape(x, inferred), reduction, opset)
    b = Builder(node.name or node.outputs[0].name or _OP, names, opset)

    if compute != dtype:
        x = b.op("Cast", [x], compute, "cast_in", to=compute.value)
    shift, made = _clamp(b, reduction.reduce(b, "ReduceMax", x, compute, "max", keepdims=1), compute,
                         bounds.get((scope.body, compute)))  # fmt: skip
    exp = b.op("Exp", [b.op("Sub", [x, shift], compute, "sub")], compute, "exp")
    if split is not None:
        total = split.sum(b, exp, compute, reduction.keepdims)
    else:
        total = reduction.reduce(b, "ReduceSum", exp, compute, "sum", keepdims=reduction.keepdims)
    if not reduction.keepdims:
        shift = reduction.reduce(b, "ReduceMax", shift, compute, "shift_squeezed", keepdims=0)
    log = b.op("Log", [total], compute, "log")
    if reduction.noop_with_empty_axes:
        # With empty axes each "slice" is one element, s = 1 and y = m' + Log(1) = m' + 0,
        # which turns m' = -0 into +0. m' - (0 - Log(s)) is the same sum, bit for bit, except
        # that it keeps -0: the identity is then exact. (Where(s == 1, m', y) would be too,
        # but onnxruntime's Where returns +0 for a selected -0.)
        zero = b.constant(np.array(0, dtype=_NUMPY[compute]), "zero")
        y = b.op("Sub", [shift, b.op("Sub", [zero, log], compute, "neg_log")], compute, "result")
    else:
        y = b.op("Add", [log, shift], compute, "add")
    if compute != dtype:
        y = b.op("Cast", [y], dtype, "cast_out", to=dtype.value)
    return b.nodes, y, {} if made is None else {(scope.body, compute): made}
