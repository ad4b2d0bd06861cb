"""No-op nodes: ops whose output is their input, bit for bit.

Each rule makes the users of the node's output use its input instead; the
node is then dead and removed. Where the node's output is a graph output, its
input takes that place under the output's name, type and shape when nothing
else sees the renaming (see :meth:`Context.bypass`); otherwise the node stays.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from passes.ir import tensors
from passes.ir.schemas import trim_absent_inputs
from passes.simplify.rules import Context, Outcome, rule
from passes.simplify.shape_values import is_dim_of, reshape_restores, shape_value

__all__: list[str] = []

_INT64_BIG = 2**62


def _same_shape(ctx: Context, a: ir.Value | None, b: ir.Value | None) -> bool:
    """Whether inference proves ``a`` and ``b`` have the same shape (every dim an equal int or symbol)."""
    da, db = ctx.dims(a), ctx.dims(b)
    return da is not None and db is not None and da == db and None not in da


@rule("Identity", family="noops")
def identity(node: ir.Node, ctx: Context) -> Outcome:
    x = node.inputs[0] if node.inputs else None
    if x is None:
        return "no input"
    if node.outputs[0].is_graph_output():
        if ctx.scope.owner is not None:
            return _subgraph_output_identity(node, x)
        # Exporters name outputs with an Identity, and users look for it: issue #12 keeps them
        # (other no-ops producing an output go, their input taking the output's name).
        return "it produces a graph output (an Identity there is kept)"
    return ctx.bypass(node, x)


def _subgraph_output_identity(node: ir.Node, x: ir.Value) -> Outcome:
    """An Identity producing an output of a subgraph (If branch, Loop/Scan body) goes.

    A subgraph's outputs are bound to its node's by position, not by name, so
    ``x`` can take the output's place; it also takes the output's name (and its
    declared type and shape, where declared) unless a nested subgraph reads
    ``x`` (a renamed value there could be captured by a shadowing name). Kept
    when ``x`` is not computed by a node of this subgraph: an outer value (the
    ONNX checker and onnxruntime reject it as a subgraph output), a subgraph
    input or initializer (accepted by onnxruntime, not by every runtime), or
    when ``x`` already is an output of the subgraph (onnxruntime 1.32 returns
    wrong values for a value listed twice among a subgraph's outputs).
    """
    graph = node.graph
    producer = x.producer()
    if producer is None or producer.graph is not graph:
        return "it produces a subgraph output from an outer value or a subgraph input (kept: runtimes need it)"
    if x.is_graph_output():
        return "its input is already an output of the subgraph (onnxruntime mishandles a repeated output)"
    output = node.outputs[0]
    rename = all(use.node.graph is graph for use in x.uses())

    def rewrite() -> None:
        if rename:
            name = output.name
            output.name = None
            x.name = name
            x.doc_string = output.doc_string or x.doc_string
        if output.type is not None:
            x.type = output.type
        if output.shape is not None:
            x.shape = output.shape
        output.replace_all_uses_with(x, replace_graph_outputs=True)

    return rewrite


@rule("Cast", "CastLike", family="noops")
def cast_to_same_type(node: ir.Node, ctx: Context) -> Outcome:
    x = node.inputs[0]
    source = ctx.dtype(x)
    if node.op_type == "Cast":
        to = node.attributes.get_int("to", None)
        target = ir.DataType(to) if to is not None else None
    else:
        target = ctx.dtype(node.inputs[1] if len(node.inputs) > 1 else None)
    if source is None or target is None or source != target:
        return f"casts {source} to {target}"
    return ctx.bypass(node, x)


@rule("Dropout", family="noops")
def inference_dropout(node: ir.Node, ctx: Context) -> Outcome:
    if len(node.outputs) > 1 and (node.outputs[1].uses() or node.outputs[1].is_graph_output()):
        return "its mask is used"
    training = node.inputs[2] if len(node.inputs) > 2 else None
    if training is not None:
        mode = ctx.constant(training)
        if mode is None or bool(mode.reshape(-1)[0]):
            return "training_mode is not a constant false"
    return ctx.bypass(node, node.inputs[0])


def _keeps_each_dim(node: ir.Node, ctx: Context) -> bool:
    """Whether the target shape, as built, gives back every dim of the input (see shape_values).

    Reshape: see :func:`reshape_restores` (``0`` copies the input's dim when
    allowzero is 0). Expand: each entry, aligned from the right, is ``1`` or
    the input's dim.
    """
    x = node.inputs[0]
    target = node.inputs[1] if len(node.inputs) > 1 else None
    if node.op_type == "Reshape":
        return reshape_restores(ctx, target, x, copy_zero=not node.attributes.get_int("allowzero", 0))
    built = shape_value(ctx, target)
    dims = ctx.dims(x)
    if built is None or built.scalar or dims is None:
        return False
    entries = built.elements
    offset = len(dims) - len(entries)
    return offset >= 0 and all(
        e == 1 or (is_dim_of(ctx, e, x, offset + i, dims) and not (isinstance(e, int) and e <= 0))
        for i, e in enumerate(entries))


@rule("Expand", "Reshape", family="noops", name="same_shape")
def same_shape(node: ir.Node, ctx: Context) -> Outcome:
    x = node.inputs[0]
    if not (_same_shape(ctx, x, node.outputs[0]) or _keeps_each_dim(node, ctx)):
        return "the output's shape is not proved equal to the input's"
    return ctx.bypass(node, x)


@rule("Flatten", family="noops")
def flatten_of_a_matrix(node: ir.Node, ctx: Context) -> Outcome:
    """``Flatten`` of a rank-2 input at axis 1 gives ``[d0, d1]``: the input itself, for any dims."""
    dims = ctx.dims(node.inputs[0])
    if dims is None:
        return "the input's rank is unknown"
    axis = node.attributes.get_int("axis", 1)
    if not (len(dims) == 2 and axis in (1, -1)) and not _same_shape(ctx, node.inputs[0], node.outputs[0]):
        return "the output's shape is not proved equal to the input's"
    return ctx.bypass(node, node.inputs[0])


@rule("Transpose", family="noops")
def identity_transpose(node: ir.Node, ctx: Context) -> Outcome:
    perm = node.attributes.get_ints("perm", None)
    if perm is None:
        dims = ctx.dims(node.inputs[0])
        if dims is None or len(dims) > 1:
            return "reverses the axes"
    elif list(perm) != list(range(len(perm))):
        return "not the identity permutation"
    return ctx.bypass(node, node.inputs[0])


@rule("Pad", family="noops")
def zero_pad(node: ir.Node, ctx: Context) -> Outcome:
    pads = ctx.constant(node.inputs[1] if len(node.inputs) > 1 else None)
    if pads is None or pads.size == 0 or np.any(pads != 0):
        return "pads are not constant zeros"
    return ctx.bypass(node, node.inputs[0])


@rule("Concat", "Sum", "Max", "Min", "Mean", family="noops", name="single_input")
def single_input(node: ir.Node, ctx: Context) -> Outcome:
    if len(node.inputs) != 1 or node.inputs[0] is None:
        return "more than one input"
    return ctx.bypass(node, node.inputs[0])


@rule("Tile", family="noops")
def tile_by_ones(node: ir.Node, ctx: Context) -> Outcome:
    repeats = ctx.constant(node.inputs[1])
    if repeats is None or np.any(repeats != 1):
        return "repeats are not constant ones"
    return ctx.bypass(node, node.inputs[0])


@rule("Unsqueeze", family="noops")
def empty_unsqueeze(node: ir.Node, ctx: Context) -> Outcome:
    axes = ctx.constant(node.inputs[1] if len(node.inputs) > 1 else None)
    if axes is None or axes.size:
        return "axes are not a constant empty list"
    return ctx.bypass(node, node.inputs[0])


@rule("Slice", family="noops")
def full_slice(node: ir.Node, ctx: Context) -> Outcome:
    """``Slice`` from 0 to the end with step 1 on every axis it names."""
    dims = ctx.dims(node.inputs[0])
    params = [ctx.constant(v) if v is not None else None for v in node.inputs[1:5]]
    starts, ends = (params + [None, None])[:2]
    if dims is None or starts is None or ends is None:
        return "input rank or starts/ends unknown"
    axes = params[2] if len(params) > 2 and params[2] is not None else np.arange(len(starts))
    steps = params[3] if len(params) > 3 and params[3] is not None else np.ones(len(starts), np.int64)
    if len(node.inputs) > 3 and node.inputs[3] is not None and params[2] is None:
        return "axes are not constant"
    if len(node.inputs) > 4 and node.inputs[4] is not None and params[3] is None:
        return "steps are not constant"
    for start, end, axis, step in zip(starts.tolist(), ends.tolist(), axes.tolist(), steps.tolist()):
        dim = dims[axis] if -len(dims) <= axis < len(dims) else None
        if start != 0 or step != 1:
            return "a start is not 0 or a step not 1"
        if end < _INT64_BIG and not (isinstance(dim, int) and end >= dim):
            return "an end may cut the axis"
    return ctx.bypass(node, node.inputs[0])


# Recurrent ops: the index of each optional initial-state input (initial_h, initial_c).
_INITIAL_STATES = {"LSTM": (5, 6), "GRU": (5,), "RNN": (5,)}


def _zero_fill(ctx: Context, value: ir.Value) -> tuple[object, ...] | None:
    """The shape of ``value`` if it is a tensor of +0.0 everywhere, entry by entry (see shape_values), else None.

    Either a constant whose every element is +0 (not -0: ``-0 * x`` keeps a sign
    a missing state does not have), or ``ConstantOfShape`` whose value is +0
    (its default) with a shape built by shape arithmetic, or a constant Slice
    of either (TorchScript slices one layer's states from all layers' zeros).
    """
    array = ctx.constant(value)
    if array is not None:
        if array.dtype.kind != "f" or np.any(array != 0) or np.any(np.signbit(array)):
            return None
        return tuple(int(d) for d in array.shape)
    sliced = ctx.producer(value, "Slice")
    if sliced is not None:
        return _zero_slice(ctx, sliced)
    node = ctx.producer(value, "ConstantOfShape")
    if node is None:
        return None
    attr = node.attributes.get("value")
    if attr is not None:
        if not isinstance(attr, ir.Attr) or attr.is_ref() or attr.type != ir.AttributeType.TENSOR:
            return None
        fill = tensors.read_tensor(attr.as_tensor(), f"the value of ConstantOfShape {node.name!r}")
        if fill.dtype.kind != "f" or fill.size != 1 or fill.reshape(-1)[0] != 0 or np.signbit(fill.reshape(-1)[0]):
            return None
    built = shape_value(ctx, node.inputs[0])
    return None if built is None or built.scalar else built.elements


def _zero_slice(ctx: Context, node: ir.Node) -> tuple[object, ...] | None:
    """The shape of a Slice of a zero fill, when every sliced axis has a literal size and constant bounds."""
    source = _zero_fill(ctx, node.inputs[0])
    params = [ctx.constant(v) if v is not None else None for v in node.inputs[1:5]]
    if source is None or any(v is not None and p is None for v, p in zip(node.inputs[1:5], params)):
        return None
    starts, ends = params[0], params[1]
    if starts is None or ends is None:
        return None
    axes = params[2] if len(params) > 2 and params[2] is not None else np.arange(starts.size)
    steps = params[3] if len(params) > 3 and params[3] is not None else np.ones(starts.size, np.int64)
    shape = list(source)
    for start, end, axis, step in zip(starts.tolist(), ends.tolist(), axes.tolist(), steps.tolist()):
        if not -len(shape) <= axis < len(shape) or step <= 0 or not isinstance(shape[axis], int):
            return None
        shape[axis] = len(range(shape[axis])[start:end:step])  # Python clamps slices as ONNX does
    return tuple(shape)


@rule("LSTM", "GRU", "RNN", family="noops")
def zero_initial_state(node: ir.Node, ctx: Context) -> Outcome:
    """An initial state of +0 of the state's own shape is the spec's default for a missing one: drop it.

    The state's shape must be proved ``[num_directions, batch, hidden]``
    (``[batch, num_directions, hidden]`` with ``layout=1``), batch being the
    input's own dim (the same dim or an equal symbol), so that no run where the
    original would fail on a wrong shape runs now.
    """
    x = node.inputs[0]
    dims = ctx.dims(x)
    hidden = node.attributes.get_int("hidden_size", None)
    if dims is None or len(dims) != 3 or hidden is None:
        return "the input's rank or hidden_size is unknown"
    layout = node.attributes.get_int("layout", 0)
    directions = 2 if node.attributes.get_string("direction", "forward") == "bidirectional" else 1
    batch_axis = 0 if layout else 1  # of the input, and the batch's position in the state's shape
    expected = [None, directions, hidden] if layout else [directions, None, hidden]
    states = [i for i in _INITIAL_STATES[node.op_type] if i < len(node.inputs) and node.inputs[i] is not None]
    dropped = []
    for index in states:
        shape = _zero_fill(ctx, node.inputs[index])
        if shape is None or len(shape) != 3 or ctx.dtype(node.inputs[index]) != ctx.dtype(x):
            continue
        ok = True
        for position, (entry, want) in enumerate(zip(shape, expected)):
            if want is None:  # the batch entry
                ok &= is_dim_of(ctx, entry, x, batch_axis, dims)
            else:
                ok &= entry == want
        if ok:
            dropped.append(index)
    if not dropped:
        return "no initial state is a zero of the state's proved shape"

    def rewrite() -> None:
        for index in dropped:
            node.replace_input_with(index, None)
        trim_absent_inputs(node, ctx.opset)

    return rewrite


@rule("Where", family="noops")
def constant_condition(node: ir.Node, ctx: Context) -> Outcome:
    """``Where(c, a, b)`` with a constant ``c`` that is all true (all false) is ``a`` (``b``).

    Only where the output has the chosen input's shape (the condition and the
    other input broadcast into it, not beyond). Not for floats: the spec's Where
    copies the chosen bits, but onnxruntime's kernel turns a selected -0 into
    +0 (see README), so removing it would change what onnxruntime computes.
    Integers and booleans (the shape arithmetic of TorchScript's ``expand``) are
    copied exactly by both.
    """
    dtype = ctx.dtype(node.inputs[1])
    if dtype is None or dtype.is_floating_point():
        return "a float (or unknown) type: onnxruntime's Where does not keep -0"
    condition = ctx.constant(node.inputs[0])
    if condition is None or condition.size == 0 or condition.dtype != np.bool_:
        return "the condition is not a non-empty constant"
    if np.all(condition):
        chosen = node.inputs[1]
    elif not np.any(condition):
        chosen = node.inputs[2]
    else:
        return "the condition selects from both inputs"
    if not _same_shape(ctx, chosen, node.outputs[0]):
        return "the output's shape is not proved equal to the chosen input's"
    return ctx.bypass(node, chosen)
