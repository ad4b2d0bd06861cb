"""YOLOv5's Focus (four strided Slices concatenated) into SpaceToDepth: ``passes/simplify/chains/space_to_depth.py``.

Each positive case builds the form torch's TorchScript exporter writes for ``torch.cat([x[..., ::2, ::2],
x[..., 1::2, ::2], x[..., ::2, 1::2], x[..., 1::2, 1::2]], 1)`` (two chained Slices per piece, merged by
``slice_of_slice`` first), runs the simplify pass and asserts the checker accepts the result, the
Slices and the Concat are gone, and onnxruntime computes the same bits (NaN payloads, ±0 and ±inf
included). Each trap asserts the Concat stays, with its reason logged.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import helpers

LOGGER = "passes.simplify"
RULE = "chains/focus_to_space_to_depth"
YOLO = [(0, 0), (1, 0), (0, 1), (1, 1)]  # YOLOv5's order: a channel Gather follows
DCR = [(0, 0), (0, 1), (1, 0), (1, 1)]  # SpaceToDepth's own order: nothing follows
BIG = 2**63 - 1


def _io(name: str, shape, dtype=np.float32) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), shape)


def focus_nodes(offsets=YOLO, suffix: str = "", inline: bool = False, step: int = 2, end: int = BIG, axis: int = 1,
                chained: bool = True) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:  # fmt: skip
    nodes: list[onnx.NodeProto] = []
    initializers: list[onnx.TensorProto] = []
    count = [0]

    def const(values) -> str:
        count[0] += 1
        name = f"c{count[0]}{suffix}"
        tensor = numpy_helper.from_array(np.array(values, np.int64), name)
        if inline:
            nodes.append(helper.make_node("Constant", [], [name], value=tensor))
        else:
            initializers.append(tensor)
        return name

    pieces = []
    for index, (i, j) in enumerate(offsets):
        out = f"piece{index}{suffix}"
        if chained:  # torch: x[..., i::2, :] then [..., j::2]
            rows = f"rows{index}{suffix}"
            nodes.append(helper.make_node("Slice", ["x", const([i]), const([end]), const([2]), const([step])], [rows]))
            nodes.append(helper.make_node("Slice", [rows, const([j]), const([BIG]), const([3]), const([step])], [out]))
        else:
            nodes.append(helper.make_node("Slice", ["x", const([i, j]), const([end, BIG]), const([2, 3]),
                                                   const([step, step])], [out]))  # fmt: skip
        pieces.append(out)
    nodes.append(helper.make_node("Concat", pieces, [f"y{suffix}"], axis=axis))
    return nodes, initializers


def focus(shape=("batch", 3, "h", "w"), dtype=np.float32, extra_output: str | None = None,
          **options) -> onnx.ModelProto:  # fmt: skip
    nodes, initializers = focus_nodes(**options)
    channels = f"4{shape[1]}" if isinstance(shape[1], str) else 4 * shape[1]
    outputs = [_io("y", [shape[0], channels, "oh", "ow"], dtype)]
    if extra_output:
        outputs.append(_io(extra_output, [shape[0], shape[1], "ph", "pw"], dtype))
    graph = helper.make_graph(nodes, "g", [_io("x", list(shape), dtype)], outputs, initializer=initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _edge_input(shape, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    flat = x.reshape(-1)
    picks = rng.choice(flat.size, size=min(flat.size, 12), replace=False)
    flat[picks] = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 3.4e38, -3.4e38, 1e-45, -1e-45, 1.0, -1.0, 0.5],
                           np.float32)[: picks.size]  # fmt: skip
    flat[picks[4:5]] = np.frombuffer(np.uint32(0x7FC01234).tobytes(), np.float32)  # a NaN with a payload
    return x


def _bit_for_bit(original: onnx.ModelProto, result: onnx.ModelProto, shapes) -> None:
    for seed, shape in enumerate(shapes):
        feeds = {"x": _edge_input(shape, seed)}
        expected, actual = helpers.ort_run(original, feeds)[0], helpers.ort_run(result, feeds)[0]
        assert expected.shape == actual.shape and expected.tobytes() == actual.tobytes()


@pytest.mark.parametrize("offsets", [YOLO, DCR, [(1, 1), (0, 1), (1, 0), (0, 0)]], ids=["yolo", "dcr", "reversed"])
@pytest.mark.parametrize("chained", [True, False], ids=["torch_chained", "merged"])
def test_focus_becomes_space_to_depth(offsets, chained: bool) -> None:
    original = focus(offsets=offsets, chained=chained)
    result, stats = helpers.simplify_checked(original)
    ops = helpers.ops_recursive(result)
    assert stats["applied"].get(RULE) == 1, stats
    assert "Slice" not in ops and "Concat" not in ops and ops.count("SpaceToDepth") == 1, ops
    assert ops.count("Gather") == (0 if offsets == DCR else 1), ops
    _bit_for_bit(original, result, [(1, 3, 8, 8), (2, 3, 4, 6), (3, 3, 16, 2), (2, 3, 0, 4)])


def test_odd_sizes_fail_in_both() -> None:
    """An odd H: the Slices differ in size, which the Concat refuses; SpaceToDepth needs an even H."""
    original = focus()
    result, _ = helpers.simplify_checked(original)
    feeds = {"x": np.ones((1, 3, 5, 4), np.float32)}
    for model in (original, result):
        with pytest.raises(Exception):
            helpers.ort_run(model, feeds)


def test_focus_is_idempotent() -> None:
    once, _ = helpers.simplify_checked(focus())
    twice, stats = helpers.simplify_checked(once)
    assert RULE not in stats["applied"] and helpers.ops_recursive(twice).count("SpaceToDepth") == 1


TRAPS = {
    "a step of 3": (dict(step=3), "not x[..., a::2, b::2]"),
    "two pieces of one offset": (dict(offsets=[(0, 0), (0, 0), (0, 1), (1, 1)]), "are not the four of a 2x2 block"),
    "a Slice that ends before the dim": (dict(end=4), "may end before the dim"),
    "a Concat on the batch axis": (dict(axis=0), "not a Concat of four values on the channel axis"),
    "a piece used elsewhere": (dict(extra_output="piece1"), "not Slices it alone uses"),
    "a dynamic channel count": (dict(shape=("batch", "c", "h", "w")), "static channel count"),
}


@pytest.mark.parametrize("trap", sorted(TRAPS))
def test_focus_trap(trap: str, caplog) -> None:
    options, reason = TRAPS[trap]
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        result, stats = helpers.simplify_checked(focus(chained=False, **options))
    assert RULE not in stats["applied"] and "SpaceToDepth" not in helpers.ops_recursive(result), stats
    assert reason in caplog.text, caplog.text


def test_focus_in_if_branches_but_not_in_a_function(caplog) -> None:
    branches = []
    for suffix in ("_then", "_else"):
        nodes, _ = focus_nodes(suffix=suffix, inline=True, chained=False)
        branches.append(helper.make_graph(nodes, "b" + suffix, [], [_io("y" + suffix, [1, 12, 4, 4])]))
    if_node = helper.make_node("If", ["cond"], ["y"], then_branch=branches[0], else_branch=branches[1])
    inputs = [_io("x", [1, 3, 8, 8]), _io("cond", [], np.bool_)]
    graph = helper.make_graph([if_node], "g", inputs, [_io("y", [1, 12, 4, 4])])
    original = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    result, stats = helpers.simplify_checked(original)
    assert stats["applied"][RULE] == 2 and helpers.ops_recursive(result).count("SpaceToDepth") == 2, stats
    for cond in (True, False):
        feeds = {"x": _edge_input((1, 3, 8, 8)), "cond": np.array(cond)}
        assert helpers.ort_run(original, feeds)[0].tobytes() == helpers.ort_run(result, feeds)[0].tobytes()

    nodes, _ = focus_nodes(inline=True, chained=False)
    function = helper.make_function("local", "F", ["x"], ["y"], nodes, opset_imports=[helper.make_opsetid("", 17)])
    call = helper.make_node("F", ["x"], ["y"], domain="local")
    graph = helper.make_graph([call], "g", inputs[:1], [_io("y", [1, 12, 4, 4])])
    model = helper.make_model(graph, functions=[function],
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)])
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        result, stats = helpers.simplify_checked(model)
    assert RULE not in stats["applied"] and "static channel count" in caplog.text
