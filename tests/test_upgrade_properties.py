"""Property tests of the opset upgrade: random reduce ops, shapes, axes and keepdims.

Whatever the op, shape, axes (absent, empty, positive or negative, in any
order) and keepdims, the upgraded model is valid and onnxruntime gives the
same bits as for the original.
"""

from __future__ import annotations

import copy

import numpy as np
import onnx
import onnx.helper as oh
import onnx_ir as ir
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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
