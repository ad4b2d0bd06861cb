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

Long sums (at least ``BLOCK_MIN`` = 64 terms; axes and the reduced sizes
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
import functools
import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx.defs
import onnx_ir as ir

from passes.base import Pass, pass_stats
from passes.declarations import DECOMPOSE
from passes.decompose.reduction import Reduction, Split
from passes.decompose.shapes import note_types
from passes.ir import inference
from passes.ir.amplification import Amplified
from passes.ir.build import Builder
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

#: Why a node is left in place, as counted in ``stats["declined"]``; :data:`AMPLIFIED` is followed by the op
#: that would amplify the decomposition's change of rounding (:mod:`passes.ir.amplification`).
INTEGER, UNKNOWN_TYPE, UNSUPPORTED = "integer input", "unknown element type", "unsupported opset or type"
FUNCTION_BODY = "onnxruntime runs its function body"
AMPLIFIED = "rounding amplified by "


#: The clamp's bound constants already made in a scope, by (scope body, element type): a decomposition
#: reads those an earlier one of the same call made (whose nodes come before it in the scope's order).
Bounds = dict[tuple[object, ir.DataType], tuple[ir.Value, ir.Value]]


def _bound(b: Builder, array: np.ndarray, tag: str, main: bool) -> ir.Value:
    """A clamp bound: a ``Constant`` node, or in the main graph an initializer the caller registers, named
    as the node's output (simplify lifts the node so: on the 10k chain, a simplify round and a fold run)."""
    if not main:
        return b.constant(array, tag)
    name = b.names.value(f"{b.names.node(f'{b.prefix}/{tag}')}_output")  # (the node's name is only reserved)
    value = ir.Value(name=name, type=ir.TensorType(ir.DataType.from_numpy(array.dtype)), shape=ir.Shape(array.shape))
    value.const_value = ir.Tensor(array)
    return value


def _clamp(b: Builder, m: ir.Value, dtype: ir.DataType, made: tuple[ir.Value, ir.Value] | None, main: bool
           ) -> tuple[ir.Value, tuple[ir.Value, ir.Value] | None]:  # fmt: skip
    """``m`` with -inf/+inf replaced by the lowest/largest finite value of ``dtype``, and the bounds
    when it made them (None when it used ``made``, an earlier decomposition's, or none; see _bound)."""
    big = np.finfo(_NUMPY[dtype]).max
    if dtype == ir.DataType.FLOAT and b.opset < 11:  # Clip-6: float32 bounds as attributes
        return b.op("Clip", [m], dtype, "shift", min=float(-big), max=float(big)), None
    new = None if made is not None else (_bound(b, np.array(-big, dtype=_NUMPY[dtype]), "shift_min", main),
                                         _bound(b, np.array(big, dtype=_NUMPY[dtype]), "shift_max", main))  # fmt: skip
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
    call in each graph (or function) and element type, and read by the later ones
    (initializers in the main graph, Constant nodes elsewhere).
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
            (opset, element type or function opset), :data:`FUNCTION_BODY` and :data:`AMPLIFIED`
            followed by the op.
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
            main = scope.body is model.graph and model.ir_version >= 4  # its constants: initializers
            if reason is None:
                names = names or Names(model)
                nodes, y, made = _build(node, scope, names, inferred, bounds, main)
                reason = _function_conflict(nodes, node, scope, model_opset)
            if reason is not None:
                declined[reason] += 1
                continue
            ir.convenience.replace_nodes_and_values(scope.body, node, [node], nodes, [node.outputs[0]], [y])
            for bound in [b for pair in made.values() for b in pair] if main else ():  # see _bound
                model.graph.register_initializer(bound)
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
    if _runs_function_body(scope.opset("")):
        logger.info("%s %r: left in place: onnxruntime has no kernel for its version and computes its function "
                    "body (in double, without the shift), which the decomposition does not reproduce", _OP, node.name)
        return FUNCTION_BODY
    return None


@functools.cache
def _runs_function_body(opset: int) -> bool:
    """Whether onnxruntime computes the op at ``opset`` by its schema's function body (no CPU kernel:
    ReduceLogSumExp-28 in onnxruntime 1.32). That body computes ``Log(ReduceSum(Exp(x)))`` in double,
    without the shift: inf for a float32 ``[1e30, 0]`` where the decomposition gives 1e30, and other
    roundings elsewhere; onnxruntime's result is the original's. Asked above opset 21 only (every
    supported onnxruntime has the kernels below), so onnxruntime is not imported otherwise."""
    if opset <= 21:
        return False
    from passes.verify.probe import has_version_kernel

    return has_version_kernel(_OP, onnx.defs.get_schema(_OP, opset).since_version) is not True


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


def _build(node: ir.Node, scope: Scope, names: Names, inferred: Inferred, bounds: Bounds, main: bool
           ) -> tuple[list[ir.Node], ir.Value, Bounds]:  # fmt: skip
    """The replacement nodes of ``node`` (see the pass's docstring), the new output, and the clamp's
    bounds if it made them (else it reads those ``bounds`` holds for the scope and type)."""
    opset = scope.opset("")
    dtype = _element_type(node, inferred)
    x = node.inputs[0]
    assert opset is not None and dtype is not None and x is not None  # _skip_reason
    compute = _COMPUTE_TYPE[dtype]
    reduction = Reduction.of(node, opset)
    split = Split.plan(_input_shape(x, inferred), reduction, opset)
    b = Builder(node.name or node.outputs[0].name or _OP, names, opset)

    if compute != dtype:
        x = b.op("Cast", [x], compute, "cast_in", to=compute.value)
    shift, made = _clamp(b, reduction.reduce(b, "ReduceMax", x, compute, "max", keepdims=1), compute,
                         bounds.get((scope.body, compute)), main)  # fmt: skip
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
