"""``chains/concat_of_concat``: a Concat of a Concat on the same axis is one Concat.

TorchScript builds a target shape as Concat(Slice(Shape(y)), Concat(dims...)) when
``F.interpolate(size=(h, w))`` meets the sizes of another tensor (the sweep's warp
module: onnxslim wrote one Concat, we two). Each case runs in onnxruntime (its
optimisations off) before and after, bit for bit: concatenation moves data only.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from test_simplify import _assert_same, _in_function, _in_if_branch, _io, _model, _ops, _simplify

F = TensorProto.FLOAT
RULE = "chains/concat_of_concat"


def _nested(inner_axis: int = 1, outer_axis: int = 1, inner_first: bool = False) -> onnx.ModelProto:
    """y = Concat(c, Concat(a, b, inner_axis), outer_axis), or with the inner Concat first."""
    inner = helper.make_node("Concat", ["a", "b"], ["t"], axis=inner_axis)
    pieces = ["t", "c"] if inner_first else ["c", "t"]
    outer = helper.make_node("Concat", pieces, ["y"], axis=outer_axis)
    inputs = [_io("a", [2, 3, 4]), _io("b", [2, 1, 4]), _io("c", [2, 5, 4])]
    return _model([inner, outer], inputs, [_io("y", [2, 9, 4])])


@pytest.mark.parametrize(("inner_axis", "outer_axis", "inner_first"),
                         [(1, 1, False), (1, 1, True), (-2, 1, False), (1, -2, True), (-2, -2, False)])
def test_a_concat_of_a_concat_on_the_same_axis_is_one_concat(inner_axis, outer_axis, inner_first) -> None:
    original = _nested(inner_axis, outer_axis, inner_first)
    result, stats = _simplify(original)
    assert _ops(result) == ["Concat"] and stats["applied"].get(RULE) == 1, stats
    expected = ["a", "b", "c"] if inner_first else ["c", "a", "b"]
    assert list(result.graph.node[0].input) == expected
    _assert_same(original, result)
    again, stats_again = _simplify(result)
    assert _ops(again) == ["Concat"] and not stats_again["applied"].get(RULE)  # idempotent


def test_in_if_branches_and_in_a_function() -> None:
    feeds = {"a": np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32),
             "b": np.full((2, 1, 4), -0.0, np.float32), "c": np.full((2, 5, 4), np.nan, np.float32)}
    branched = _in_if_branch(_nested())
    result, _ = _simplify(branched)
    assert _ops(result).count("Concat") == 2, _ops(result)  # one a branch
    for cond in (True, False):
        _assert_same(branched, result, {**feeds, "cond": np.array(cond)})
    function = _in_function(_nested(-2, -2))
    result, _ = _simplify(function)
    assert _ops(result).count("Concat") == 1, _ops(result)
    _assert_same(function, result, feeds)


def test_shape_arithmetic_of_two_levels_is_one_concat() -> None:
    """Shape(x)[:2] joined with a Concat of two dims of z: what TorchScript writes for interpolate(size=...)."""
    nodes = [helper.make_node("Shape", ["x"], ["sx"], start=0, end=2),
             helper.make_node("Shape", ["z"], ["sz"], start=2, end=3),
             helper.make_node("Shape", ["z"], ["sw"], start=3, end=4),
             helper.make_node("Concat", ["sz", "sw"], ["hw"], axis=0),
             helper.make_node("Concat", ["sx", "hw"], ["size"], axis=0),
             helper.make_node("Resize", ["x", "", "", "size"], ["y"], mode="linear")]
    original = _model(nodes, [_io("x", ["n", 3, "h", "w"]), _io("z", ["n", 1, "H", "W"])], [_io("y", [None] * 4)])
    result, stats = _simplify(original)
    assert _ops(result).count("Concat") == 1 and stats["applied"].get(RULE) == 1, stats
    rng = np.random.default_rng(1)
    for h, w, big_h, big_w in ((4, 5, 8, 3), (1, 1, 1, 7)):
        feeds = {"x": rng.standard_normal((2, 3, h, w)).astype(np.float32),
                 "z": rng.standard_normal((2, 1, big_h, big_w)).astype(np.float32)}
        _assert_same(original, result, feeds)


def _shared(second_axis: int = 0, twice: bool = False) -> onnx.ModelProto:
    """``hw = Concat(h, w)`` joined after two prefixes (SegFormer's dynamo export, issue #38), the second on
    ``second_axis`` (of the rank-1 pieces, ``-1`` is ``0``); ``twice``: the first takes hw twice."""
    nodes = [helper.make_node("Concat", ["h", "w"], ["hw"], axis=0),
             helper.make_node("Concat", ["p", "hw", "hw"] if twice else ["p", "hw"], ["y1"], axis=0),
             helper.make_node("Concat", ["q", "hw"], ["y2"], axis=second_axis)]
    return _model(nodes, [_io(n, [k]) for n, k in (("h", 1), ("w", 2), ("p", 2), ("q", 0))],
                  [_io("y1", [None]), _io("y2", [None])])


@pytest.mark.parametrize(("second_axis", "twice"), [(0, False), (-1, False), (0, True)])
def test_a_concat_shared_by_concats_on_its_axis_is_taken_in_by_each(second_axis: int, twice: bool) -> None:
    original = _shared(second_axis, twice)
    result, stats = _simplify(original)
    assert _ops(result) == ["Concat", "Concat"] and stats["applied"].get(RULE) == 2, (_ops(result), stats)
    assert [list(n.input) for n in result.graph.node] == [
        ["p", "h", "w", "h", "w"] if twice else ["p", "h", "w"], ["q", "h", "w"]]
    rng = np.random.default_rng(2)
    _assert_same(original, result, {n: rng.standard_normal(k).astype(np.float32)
                                    for n, k in (("h", 1), ("w", 2), ("p", 2), ("q", 0))})


@pytest.mark.parametrize("variant", ["other axis", "inner also an output", "inner used elsewhere",
                                     "shared with another axis"])
def test_a_concat_that_cannot_be_taken_in_stays(variant) -> None:
    inner_axis = 2 if variant == "other axis" else 1
    nodes = [helper.make_node("Concat", ["a", "a"], ["t"], axis=inner_axis)]
    pieces = {"other axis": ["t", "c"]}.get(variant, ["t", "a"])
    nodes.append(helper.make_node("Concat", pieces, ["y"], axis=1))
    if variant == "shared with another axis":
        nodes.append(helper.make_node("Concat", ["t", "t"], ["z"], axis=2))
    outputs = [_io("y", [None] * 3)]
    if variant == "inner also an output":
        outputs.append(_io("t", [None] * 3))
    if variant == "shared with another axis":
        outputs.append(_io("z", [None] * 3))
    if variant == "inner used elsewhere":
        nodes.append(helper.make_node("Relu", ["t"], ["r"]))
        outputs.append(_io("r", [None] * 3))
    original = _model(nodes, [_io("a", [2, 3, 3]), _io("c", [2, 3, 6])], outputs)
    result, stats = _simplify(original)
    kept = 3 if variant == "shared with another axis" else 2
    assert _ops(result).count("Concat") == kept and not stats["applied"].get(RULE), (variant, stats)
    _assert_same(original, result)


def test_mismatched_pieces_fail_the_same() -> None:
    """The inner Concat refuses pieces whose other dims differ; the flat one refuses them too."""
    original = _nested()
    result, _ = _simplify(original)
    import helpers

    feeds = {"a": np.zeros((2, 3, 4), np.float32), "b": np.zeros((2, 1, 5), np.float32),
             "c": np.zeros((2, 5, 4), np.float32)}
    for model in (original, result):
        model = onnx.ModelProto.FromString(model.SerializeToString())
        for value in (*model.graph.input, *model.graph.output):
            value.type.tensor_type.ClearField("shape")
        with pytest.raises(Exception, match="(?i)concat"):
            helpers.ort_run(model, feeds)


@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.integers(0, 3), min_size=3, max_size=5), split=st.integers(0, 4), start=st.integers(0, 4))
def test_property_any_nesting_of_pieces_gives_the_same_tensor(sizes, split, start) -> None:
    """Pieces of any length (0 too) on axis 0 of a [k, 2] tensor, a run of them concatenated first."""
    start, split = min(start, len(sizes) - 1), min(split, len(sizes))
    end = max(split, start + 1)
    names = [f"p{i}" for i in range(len(sizes))]
    inner = helper.make_node("Concat", names[start:end], ["t"], axis=0)
    outer = helper.make_node("Concat", [*names[:start], "t", *names[end:]], ["y"], axis=0)
    original = _model([inner, outer], [_io(n, [k, 2]) for n, k in zip(names, sizes)], [_io("y", [sum(sizes), 2])])
    result, _ = _simplify(original)
    assert _ops(result) == ["Concat"]
    rng = np.random.default_rng(sum(sizes))
    _assert_same(original, result, {n: rng.standard_normal((k, 2)).astype(np.float32) for n, k in zip(names, sizes)})
