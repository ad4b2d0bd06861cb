"""Reshapes around a region: elementwise ops between two Reshapes, a row op between Flatten and Reshape."""

from __future__ import annotations

import onnx_ir as ir

from passes.simplify.rules import Context, Outcome, rule, sole_user
from passes.simplify.shape_values import reshape_restores

__all__: list[str] = []


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
