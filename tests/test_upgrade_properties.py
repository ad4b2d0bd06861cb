"""Property tests of the opset upgrade: random reduce ops, shapes, axes and keepdims; chains of adapted ops.

Whatever the op, shape, axes (absent, empty, positive or negative, in any
order) and keepdims, the upgraded model is valid and onnxruntime gives the
same bits as for the original. So does a chain of ops that the upgrade adapts
(Softmax family, Clip, Pad, Slice, Squeeze/Unsqueeze, Reduce, TopK, Split), each
reading the one before, the first also a graph output.
"""

from __future__ import annotations

import copy

import numpy as np
import onnx
import onnx.helper as oh
import onnx_ir as ir
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from passes.errors import UpgradeError
from passes.upgrade import UpgradeOpsetPass
from helpers import ort_run

REDUCE_OPS = (
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceMax",
    "ReduceMean",
    "ReduceMin",
    "ReduceProd",
    "ReduceSum",
    "ReduceSumSquare",
)
INTEGER_OPS = ("ReduceL1", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceSum", "ReduceSumSquare")


@st.composite
def reduce_nodes(draw: st.DrawFn, rank: int, source: int, index: int, is_int: bool) -> tuple[onnx.NodeProto, dict]:
    """One reduce node over an input of ``rank`` in the form the source opset uses."""
    op_type = draw(st.sampled_from(INTEGER_OPS if is_int else REDUCE_OPS))
    chosen = draw(st.one_of(st.none(), st.lists(st.integers(0, rank - 1), unique=True, max_size=rank)))
    axes = None if chosen is None else [a - rank if draw(st.booleans()) else a for a in chosen]
    keepdims = draw(st.sampled_from([None, 0, 1]))
    node = oh.make_node(op_type, ["x"], [f"y{index}"])
    if keepdims is not None:
        node.attribute.append(oh.make_attribute("keepdims", keepdims))
    initializers = {}
    axes_as_input = op_type == "ReduceSum" and source >= 13
    if axes is not None and axes_as_input:
        if axes:  # ReduceSum-13 with an empty axes input would mean the same as none
            node.input.append(f"axes{index}")
            initializers[f"axes{index}"] = np.array(axes, np.int64)
    elif axes is not None:
        node.attribute.append(oh.make_attribute("axes", axes, attr_type=onnx.AttributeProto.INTS))
    return node, initializers


@st.composite
def reduce_models(draw: st.DrawFn) -> tuple[onnx.ModelProto, np.ndarray]:
    source = draw(st.sampled_from([11, 12, 13, 17]))
    shape = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    is_int = draw(st.booleans())
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    if is_int:
        x = rng.integers(-3, 4, size=shape).astype(np.int32)
    else:
        x = (rng.random(shape) * 2 + 0.1).astype(np.float32)
    count = draw(st.integers(1, 4))
    nodes, initializers = [], {}
    for index in range(count):
        node, inits = draw(reduce_nodes(len(shape), source, index, is_int))
        nodes.append(node)
        initializers.update(inits)
    graph = oh.make_graph(
        nodes,
        "g",
        [oh.make_tensor_value_info("x", oh.np_dtype_to_tensor_dtype(x.dtype), x.shape)],
        [oh.make_empty_tensor_value_info(n.output[0]) for n in nodes],
        [onnx.numpy_helper.from_array(a, n) for n, a in initializers.items()],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", source)], ir_version=8)
    return onnx.shape_inference.infer_shapes(model, strict_mode=True), x


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reduce_models())
def test_random_reduce_models_are_bit_identical(case: tuple[onnx.ModelProto, np.ndarray]) -> None:
    model, x = case
    upgrade_pass = UpgradeOpsetPass()
    result = upgrade_pass(ir.from_proto(copy.deepcopy(model)))
    after = ir.to_proto(result.model)
    assert result.modified
    onnx.checker.check_model(after, full_check=True)
    for node in after.graph.node:
        assert not any(a.name == "axes" for a in node.attribute)
    for expected, actual in zip(ort_run(model, {"x": x}), ort_run(after, {"x": x})):
        assert expected.dtype == actual.dtype and expected.shape == actual.shape
        assert expected.tobytes() == actual.tobytes()
    again = UpgradeOpsetPass()(result.model)
    assert not again.modified


# --- chains: adapted ops reading adapted ops ---------------------------------------------------

_BIG = 2**63 - 1


@st.composite
def chain_models(draw: st.DrawFn) -> tuple[onnx.ModelProto, np.ndarray]:
    """A chain of ops the upgrade adapts, each reading the previous one, in the source opset's forms.

    The single-op tests cannot see one adapter's rewrite undone by the next node's commit (sweep6:
    a Clip-9 after a wrapped Softmax-9 read the 2-D value); here every step reads the last.
    """
    source = draw(st.sampled_from([9, 11]))
    shape, names, nodes = [2, 3, 4, 5], iter(range(1000)), []
    initializers: dict[str, np.ndarray] = {}

    def const(array: np.ndarray) -> str:
        name = f"c{next(names)}"
        initializers[name] = np.asarray(array)
        return name

    current = "x"
    for _ in range(draw(st.integers(2, 6))):
        out = f"v{next(names)}"
        step = draw(st.sampled_from(["softmax", "clip", "pad", "slice", "squeeze", "reduce", "topk", "split"]))
        axis = draw(st.sampled_from([2, 3]))
        if step == "softmax":
            op = draw(st.sampled_from(["Softmax", "LogSoftmax", "Hardmax"]))
            nodes.append(oh.make_node(op, [current], [out], axis=draw(st.sampled_from([0, 1, 2, 3, -1, -2]))))
        elif step == "clip":
            low, high = draw(st.sampled_from([-0.5, -0.0, 0.0])), draw(st.sampled_from([-0.0, 0.0, 0.3, 2.0]))
            if source < 11:
                nodes.append(oh.make_node("Clip", [current], [out], min=low, max=high))
            else:
                nodes.append(oh.make_node("Clip", [current, const(np.float32(low)), const(np.float32(high))], [out]))
        elif step == "pad":
            pads = [0] * 8
            pads[axis], pads[4 + axis] = draw(st.integers(0, 2)), draw(st.integers(0, 1))
            mode, value = draw(st.sampled_from(["constant", "edge"])), draw(st.sampled_from([-0.0, 0.0, 1.5]))
            if source < 11:
                nodes.append(oh.make_node("Pad", [current], [out], pads=pads, mode=mode, value=value))
            else:
                nodes.append(oh.make_node("Pad", [current, const(np.int64(pads)), const(np.float32(value))], [out], mode=mode))
            shape[axis] += pads[axis] + pads[4 + axis]
        elif step == "slice" and shape[axis] > 1:
            if source < 11:
                nodes.append(oh.make_node("Slice", [current], [out], starts=[1], ends=[_BIG], axes=[axis - 4]))
            else:
                nodes.append(oh.make_node("Slice", [current, const(np.int64([1])), const(np.int64([_BIG])), const(np.int64([axis]))], [out]))
            shape[axis] -= 1
        elif step == "squeeze":
            middle = f"v{next(names)}"
            nodes += [oh.make_node("Unsqueeze", [current], [middle], axes=[0]), oh.make_node("Squeeze", [middle], [out], axes=[0])]
        elif step == "reduce":
            op = draw(st.sampled_from(["ReduceSum", "ReduceMax", "ReduceMean"]))
            nodes.append(oh.make_node(op, [current], [out], axes=[axis], keepdims=1))
            shape[axis] = 1
        elif step == "topk":
            if source < 11:
                nodes.append(oh.make_node("TopK", [current], [out, f"i{next(names)}"], k=1, axis=axis))
            else:
                nodes.append(oh.make_node("TopK", [current, const(np.int64([1]))], [out, f"i{next(names)}"], axis=axis))
            shape[axis] = 1
        elif step == "split" and shape[axis] > 1:
            nodes.append(oh.make_node("Split", [current], [out, f"r{next(names)}"], axis=axis, split=[1, shape[axis] - 1]))
            shape[axis] = 1
        else:
            continue
        current = out
    assume(nodes)
    first = nodes[0].output[0]
    outputs = list(dict.fromkeys([current, first]))  # an adapted value that is read and a graph output
    graph = oh.make_graph(nodes, "g", [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3, 4, 5])],
                          [oh.make_empty_tensor_value_info(o) for o in outputs],
                          [onnx.numpy_helper.from_array(a, n) for n, a in initializers.items()])  # fmt: skip
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", source)], ir_version=6)
    x = np.random.default_rng(draw(st.integers(0, 2**16))).standard_normal((2, 3, 4, 5)).astype(np.float32)
    x[0, 0, 0, :3] = [np.nan, np.inf, -0.0]
    return onnx.shape_inference.infer_shapes(model), x


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chain_models(), st.sampled_from([13, 18]))
def test_chains_of_adapted_ops_are_bit_identical(case: tuple[onnx.ModelProto, np.ndarray], target: int) -> None:
    model, x = case
    try:
        after = ir.to_proto(UpgradeOpsetPass(target)(ir.from_proto(copy.deepcopy(model))).model)
    except UpgradeError as refused:
        # The one refusal documented for these ops (docs/passes.md): below opset 14 the Softmax
        # wrapping needs every dim of its input known. Right, and nothing to compare.
        assert target < 14 and "Reshape's allowzero (opset 14)" in str(refused)
        assume(False)
    onnx.checker.check_model(after, full_check=True)
    for expected, actual in zip(ort_run(model, {"x": x}), ort_run(after, {"x": x}), strict=True):
        assert expected.dtype == actual.dtype and expected.shape == actual.shape
        assert expected.tobytes() == actual.tobytes()
