"""Shapes through control flow (issue #38, item 3).

An If's output has the shape its two branches agree on (static dims, or the same
symbol on both sides), so a condition computed from the shape of that output
(``Shape -> Gather -> Equal -> If``, as a voice-activity detector writes it)
folds, and fold inlines the branch it takes. Checked on models built with
onnx.helper: the graph inspected for the Ifs that must go and the one that must
stay, and the outputs compared in onnxruntime bit for bit for both values of the
first If's condition; where the branches disagree nothing folds.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import helpers
import passes

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _io(name: str, shape, elem=F) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _branch(name: str, nodes, output: str) -> onnx.GraphProto:
    return helper.make_graph(nodes, name, [], [_io(output, None)])


def _const(name: str, value) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value)))


def _first_if(tag: str, then_op: str = "Relu", else_op: str = "Sigmoid", x: str = "x", x_else: str | None = None,
              c: str = "c") -> onnx.NodeProto:
    """``y = If(c) then then_op(x) else else_op(x_else)``: both branches keep the shape of their input."""
    return helper.make_node(
        "If", [c], [f"{tag}y"],
        then_branch=_branch(f"{tag}then", [helper.make_node(then_op, [x], [f"{tag}t"])], f"{tag}t"),
        else_branch=_branch(f"{tag}else", [helper.make_node(else_op, [x_else or x], [f"{tag}e"])], f"{tag}e"))


def _second_if(tag: str, y: str, axis: int, other: str | None = None, k: int = 64) -> list[onnx.NodeProto]:
    """``Shape(y)[axis] == k`` (or ``== Shape(other)[axis]``) as the condition of an If on ``y``."""
    nodes = [helper.make_node("Shape", [y], [f"{tag}s"]), _const(f"{tag}i", np.array(axis, np.int64)),
             helper.make_node("Gather", [f"{tag}s", f"{tag}i"], [f"{tag}d"])]
    if other is None:
        nodes.append(_const(f"{tag}k", np.array(k, np.int64)))
    else:
        nodes += [helper.make_node("Shape", [other], [f"{tag}os"]),
                  helper.make_node("Gather", [f"{tag}os", f"{tag}i"], [f"{tag}k"])]
    nodes.append(helper.make_node("Equal", [f"{tag}d", f"{tag}k"], [f"{tag}e"]))
    nodes.append(helper.make_node(
        "If", [f"{tag}e"], [f"{tag}z"],
        then_branch=_branch(f"{tag}then2", [helper.make_node("Neg", [y], [f"{tag}n"])], f"{tag}n"),
        else_branch=_branch(f"{tag}else2", [helper.make_node("Abs", [y], [f"{tag}a"])], f"{tag}a")))
    return nodes


def _model(nodes, outputs: list[str], inputs=None) -> onnx.ModelProto:
    inputs = inputs or [_io("x", ["N", 64]), _io("c", [], B)]
    graph = helper.make_graph(nodes, "g", inputs, [_io(o, [None, None]) for o in outputs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(model)
    return model


def _optimize(model: onnx.ModelProto) -> onnx.ModelProto:
    result = passes.optimize(model, check=False)
    onnx.checker.check_model(result, full_check=True)
    return result


def _feeds(model: onnx.ModelProto, c: bool, n: int = 3) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(int(c))
    feeds = {}
    for i, value in enumerate(model.graph.input):
        if value.type.tensor_type.elem_type == B:
            feeds[value.name] = np.array(c != bool(i % 2))  # the conditions alternate: both branches of each run
        else:
            x = rng.standard_normal((n, 64)).astype(np.float32)
            x.reshape(-1)[:4] = [-0.0, 0.0, np.inf, np.nan]
            feeds[value.name] = x
    return feeds


def _assert_same(original: onnx.ModelProto, result: onnx.ModelProto) -> None:
    for c in (False, True):
        feeds = _feeds(original, c)
        for a, b in zip(helpers.ort_run(original, feeds), helpers.ort_run(result, feeds), strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape
            np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))  # bit for bit


def _ifs(model: onnx.ModelProto) -> int:
    return helpers.ops_recursive(model).count("If")


@pytest.mark.parametrize(("axis", "other"), [(1, None), (0, "x")], ids=["static_dim", "same_symbol"])
def test_a_condition_from_the_shape_of_an_if_output_folds(axis: int, other: str | None) -> None:
    """Both branches give ``[N, 64]``: ``dim 1 == 64`` and ``dim 0 == x.shape[0]`` are true, the second If goes."""
    original = _model([_first_if("a"), *_second_if("b", "ay", axis, other)], ["bz"])
    result = _optimize(original)
    ops = helpers.ops_recursive(result)
    assert ops.count("If") == 1 and "Neg" in ops and "Abs" not in ops, ops
    assert not {"Shape", "Gather", "Equal"} & set(ops), ops
    _assert_same(original, result)


def test_a_false_condition_from_the_shape_takes_the_else_branch() -> None:
    original = _model([_first_if("a"), *_second_if("b", "ay", 1, k=65)], ["bz"])
    result = _optimize(original)
    ops = helpers.ops_recursive(result)
    assert ops.count("If") == 1 and "Abs" in ops and "Neg" not in ops, ops
    _assert_same(original, result)


def test_nested_ifs_agree_through_every_level() -> None:
    """The first If's then branch is itself an If (on another input); the chain sits in a branch of a third If."""
    inner = _first_if("i", c="e")
    outer = helper.make_node(
        "If", ["d"], ["oy"],
        then_branch=_branch("othen", [inner, helper.make_node("Neg", ["iy"], ["on"])], "on"),
        else_branch=_branch("oelse", [helper.make_node("Tanh", ["x"], ["ot"])], "ot"))
    holder = helper.make_node(
        "If", ["c"], ["hz"],
        then_branch=_branch("hthen", [outer, *_second_if("b", "oy", 0, "x")], "bz"),
        else_branch=_branch("helse", [helper.make_node("Exp", ["x"], ["he"])], "he"))
    original = _model([holder], ["hz"], [_io("x", ["N", 64]), _io("c", [], B), _io("d", [], B), _io("e", [], B)])
    result = _optimize(original)
    ops = helpers.ops_recursive(result)
    assert "Abs" not in ops and not {"Shape", "Gather", "Equal"} & set(ops), ops
    assert ops.count("If") == 3, ops  # the holder, the outer and the inner If stay: their conditions are inputs
    _assert_same(original, result)


def test_an_if_in_a_loop_body_folds_there() -> None:
    """The chain inside a Loop body, on an If of the body: it folds in the body too."""
    body_nodes = [helper.make_node("Identity", ["cond_in"], ["cond_out"]), _first_if("a", x="v_in"),
                  *_second_if("b", "ay", 1)]
    body = helper.make_graph(body_nodes, "body", [_io("i", [], I64), _io("cond_in", [], B), _io("v_in", ["N", 64])],
                             [_io("cond_out", None, B), _io("bz", None)])
    trips = _const("trips", np.array(2, np.int64))
    original = _model([trips, helper.make_node("Loop", ["trips", "c", "x"], ["v"], body=body)], ["v"])
    result = _optimize(original)
    ops = helpers.ops_recursive(result)
    assert ops.count("If") == 1 and "Abs" not in ops and "Equal" not in ops, ops
    _assert_same(original, result)


@pytest.mark.parametrize("disagree", ["static", "symbolic"])
def test_branches_that_disagree_leave_the_condition(disagree: str) -> None:
    """Negative case: one branch keeps ``[N, 64]``, the other gives ``[N, 63]`` (a Slice) or ``[M, 64]`` (another
    input): the dim compared is unknown after the If, so the second If and its condition stay."""
    if disagree == "static":
        nodes = [_const("st", np.array([0], np.int64)), _const("en", np.array([63], np.int64)),
                 _const("ax", np.array([1], np.int64)),
                 helper.make_node("If", ["c"], ["ay"],
                                  then_branch=_branch("then", [helper.make_node("Relu", ["x"], ["t"])], "t"),
                                  else_branch=_branch("else", [helper.make_node("Slice", ["x", "st", "en", "ax"],
                                                                                ["e"])], "e")),
                 *_second_if("b", "ay", 1)]
        inputs = None
    else:
        nodes = [_first_if("a", x_else="w"), *_second_if("b", "ay", 0, "x")]
        inputs = [_io("x", ["N", 64]), _io("w", ["M", 64]), _io("c", [], B)]
    original = _model(nodes, ["bz"], inputs)
    result = _optimize(original)
    ops = helpers.ops_recursive(result)
    assert ops.count("If") == 2 and "Equal" in ops and {"Neg", "Abs"} <= set(ops), ops
    if disagree == "static":
        _assert_same(original, result)
    else:
        for c in (False, True):
            feeds = _feeds(original, c)
            feeds["w"] = feeds["w"][:2]  # M = 2, N = 3: the condition is false on one branch, true on the other
            for a, b in zip(helpers.ort_run(original, feeds), helpers.ort_run(result, feeds), strict=True):
                np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


def test_the_no_op_case_a_condition_on_an_input_stays() -> None:
    """No shape arithmetic: ``If(c)`` on an input is left, and the model computes the same."""
    original = _model([_first_if("a")], ["ay"])
    result = _optimize(original)
    assert _ifs(result) == 1
    _assert_same(original, result)
