"""The simplify rules that close gaps to other tools (issue #12), each exact, with the cases where they must not apply.

* a no-op feeding a graph output: its input takes the output's place (name,
  type and shape kept) when nothing else sees the renaming;
* ``Flatten`` of a matrix at axis 1;
* a zero initial state of LSTM/GRU/RNN of the state's proved shape (the spec's default);
* ``Equal`` of shape arithmetic with a negative constant, and ``Where`` with a
  constant condition on integers (TorchScript's ``expand(-1)`` handling);
* a shared ``Unsqueeze`` feeding only ``Unsqueeze`` nodes.

Each runs in onnxruntime (optimisations disabled) before and after, in the
main graph, in If branches and, where no type is needed, in a function.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
import pytest
from hypothesis import event, given, reject, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import helpers
import passes
from test_simplify import _assert_same, _const, _feeds, _in_function, _in_if_branch, _io, _model, _ops, _simplify

F, I64 = TensorProto.FLOAT, TensorProto.INT64

CASES: dict[str, tuple[Callable[[], onnx.ModelProto], str, str]] = {}
UNTYPED: list[str] = []


def case(rule: str, gone: str, untyped: bool = False):
    def register(build: Callable[[], onnx.ModelProto]):
        CASES[build.__name__] = (build, rule, gone)
        if untyped:
            UNTYPED.append(build.__name__)
        return build

    return register


@case("noops/cast_to_same_type", "Cast")
def cast_producing_an_output():
    nodes = [helper.make_node("Relu", ["x"], ["t"]), helper.make_node("Cast", ["t"], ["y"], to=F)]
    return _model(nodes, [_io("x", [2, 3])], [_io("y", [2, 3])])


@case("noops/flatten_of_a_matrix", "Flatten")
def flatten_of_a_matrix():
    nodes = [helper.make_node("Flatten", ["x"], ["t"], axis=1), helper.make_node("Relu", ["t"], ["y"])]
    return _model(nodes, [_io("x", ["n", "m"])], [_io("y", [None, None])])


def _lstm(layout: int = 0, fill: float | None = None, batch_from: str = "x", hidden: int = 4,
          direction: str = "forward", sliced: tuple[int, int, int] | None = None) -> onnx.ModelProto:  # fmt: skip
    """An LSTM whose initial h and c are ConstantOfShape([dirs, batch, hidden]) built from Shape(batch_from).

    ``sliced=(axis, start, end)``: TorchScript's form, a Slice of the zeros of all layers (two here).
    """
    dirs = 2 if direction == "bidirectional" else 1
    rng = np.random.default_rng(3)
    axis = 0 if layout else 1
    state = [_const("w", rng.standard_normal((dirs, 4 * hidden, 5)).astype(np.float32)),
             _const("r", rng.standard_normal((dirs, 4 * hidden, hidden)).astype(np.float32)),
             _const("d", np.array([dirs])), _const("h", np.array([hidden]))]
    state += [helper.make_node("Shape", [batch_from], ["s"]), _const("i", np.array(axis)),
              helper.make_node("Gather", ["s", "i"], ["b"], axis=0), _const("z", np.array([0])),
              helper.make_node("Unsqueeze", ["b", "z"], ["b1"])]
    order = ["b1", "d", "h"] if layout else ["d", "b1", "h"]
    state.append(helper.make_node("Concat", order, ["shape"], axis=0))
    kwargs = {} if fill is None else {"value": helper.make_tensor("v", F, [1], [fill])}
    if sliced is not None and sliced[0] == 0:
        state[2] = _const("d", np.array([2 * dirs]))  # the states of two layers
    state.append(helper.make_node("ConstantOfShape", ["shape"], ["all" if sliced else "zeros"], **kwargs))
    if sliced is not None:
        axis_, start, end = sliced
        state += [_const("sa", np.array([axis_])), _const("ss", np.array([start])), _const("se", np.array([end])),
                  helper.make_node("Slice", ["all", "ss", "se", "sa"], ["zeros"])]
    lstm = helper.make_node("LSTM", ["x", "w", "r", "", "", "zeros", "zeros"], ["y"], hidden_size=hidden,
                            layout=layout, direction=direction)  # fmt: skip
    x_shape = ["b", "t", 5] if layout else ["t", "b", 5]
    inputs = [_io("x", x_shape)] + ([_io("other", ["k", "k"])] if batch_from == "other" else [])
    y_shape = ["b", "t", dirs, hidden] if layout else ["t", dirs, "b", hidden]
    return _model([*state, lstm], inputs, [_io("y", y_shape)])


@case("noops/zero_initial_state", "ConstantOfShape")
def lstm_zero_initial_state():
    return _lstm()


@case("noops/zero_initial_state", "ConstantOfShape")
def lstm_zero_initial_state_sliced_from_all_layers():
    return _lstm(sliced=(0, 1, 2))


@case("noops/zero_initial_state", "ConstantOfShape")
def lstm_zero_initial_state_bidirectional():
    return _lstm(fill=0.0, direction="bidirectional")


def test_zero_initial_state_batch_first() -> None:
    """layout=1 (onnxruntime has no kernel for it: onnx's reference evaluator compares)."""
    from onnx.reference import ReferenceEvaluator

    original = _lstm(layout=1, direction="bidirectional")
    result, stats = _simplify(original)
    assert stats["applied"].get("noops/zero_initial_state") and "ConstantOfShape" not in _ops(result)
    x = np.random.default_rng(2).standard_normal((3, 2, 5)).astype(np.float32)
    expected, = ReferenceEvaluator(original).run(None, {"x": x})
    got, = ReferenceEvaluator(result).run(None, {"x": x})
    np.testing.assert_array_equal(expected, got)


def _expand_like_torchscript(dtype=I64) -> onnx.ModelProto:
    """TorchScript's ``t.expand(x.size(0), x.size(1))``: a shape, its -1 entries replaced by 1."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]), _const("i0", np.array(0)), _const("i1", np.array(1)),
             helper.make_node("Gather", ["s", "i0"], ["d0"], axis=0),
             helper.make_node("Gather", ["s", "i1"], ["d1"], axis=0), _const("z", np.array([0])),
             helper.make_node("Unsqueeze", ["d0", "z"], ["u0"]), helper.make_node("Unsqueeze", ["d1", "z"], ["u1"]),
             helper.make_node("Concat", ["u0", "u1"], ["c"], axis=0), _const("m", np.array([-1, -1])),
             helper.make_node("Equal", ["c", "m"], ["e"]), _const("ones", np.array([1, 1])),
             helper.make_node("Where", ["e", "ones", "c"], ["target"]),
             helper.make_node("Expand", ["v", "target"], ["y"])]
    return _model(nodes, [_io("x", ["n", "m"]), _io("v", [1, "m"], dtype)], [_io("y", ["n", "m"], dtype)])


@case("shapes/compare_shape_value", "Equal")
def expand_with_minus_one_handling():
    return _expand_like_torchscript()


@case("noops/constant_condition", "Where")
def expand_with_minus_one_handling_where():
    return _expand_like_torchscript()


def _shape_rebuilt(order: tuple[int, ...] = (0, 1), x_dims=("n", "m"), cast_to=None) -> onnx.ModelProto:
    """TorchScript's ``v.expand(x.size(0), x.size(1))`` without the -1 handling: a Concat of x's dims."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]), _const("z", np.array([0]))]
    parts = []
    for k, i in enumerate(order):
        nodes += [_const(f"i{k}", np.array(i)), helper.make_node("Gather", ["s", f"i{k}"], [f"d{k}"], axis=0),
                  helper.make_node("Unsqueeze", [f"d{k}", "z"], [f"u{k}"])]
        parts.append(f"u{k}")
    nodes.append(helper.make_node("Concat", parts, ["c"], axis=0))
    target = "c"
    if cast_to is not None:
        nodes += [helper.make_node("Cast", ["c"], ["ci"], to=cast_to), helper.make_node("Cast", ["ci"], ["cc"], to=I64)]
        target = "cc"
    nodes.append(helper.make_node("Expand", ["v", target], ["y"]))
    out = [x_dims[i] for i in order]
    return _model(nodes, [_io("x", list(x_dims)), _io("v", [1] * len(order))], [_io("y", out)])


@case("shapes/whole_shape", "Concat")
def shape_rebuilt_dim_by_dim():
    return _shape_rebuilt()


@case("chains/unsqueeze_of_unsqueeze", "Unsqueeze", untyped=True)
def shared_unsqueeze():
    nodes = [_const("a", np.array([0, 1])), _const("b", np.array([3])), _const("c", np.array([2])),
             helper.make_node("Unsqueeze", ["x", "a"], ["u"]), helper.make_node("Unsqueeze", ["u", "b"], ["p"]),
             helper.make_node("Unsqueeze", ["u", "c"], ["q"]), helper.make_node("Add", ["p", "q"], ["y"])]
    return _model(nodes, [_io("x", [3])], [_io("y", [1, 1, 3, 3])])


def _gelu_between_reshapes(target=(-1, 8), bias_shape=None, extra_output: bool = False, y_shape=("n", 8),
                           then_relu: bool = False) -> onnx.ModelProto:
    """Dynamo's MLP activation: ``x`` [n, 8] viewed as [-1, 2, 4], a tanh-GELU, viewed back as ``target``."""
    f = np.float32
    nodes = [_const("s", np.array([-1, 2, 4])), _const("t", np.array(target)), _const("three", f(3.0)),
             _const("k", f(0.044715)), _const("c", f(0.7978846)), _const("one", f(1.0)), _const("half", f(0.5)),
             helper.make_node("Reshape", ["x", "s"], ["r"]),
             helper.make_node("Pow", ["r", "three"], ["p"]), helper.make_node("Mul", ["p", "k"], ["a"]),
             helper.make_node("Add", ["r", "a"], ["b"]), helper.make_node("Mul", ["b", "c"], ["bc"]),
             helper.make_node("Tanh", ["bc"], ["th"]), helper.make_node("Add", ["th", "one"], ["u"]),
             helper.make_node("Mul", ["r", "half"], ["h"]), helper.make_node("Mul", ["h", "u"], ["g"])]
    last = "g"
    if bias_shape is not None:
        bias = np.random.default_rng(5).standard_normal(bias_shape).astype(f)
        nodes += [_const("bias", bias), helper.make_node("Add", ["g", "bias"], ["gb"])]
        last = "gb"
    outputs = [_io("y", list(y_shape))]
    if then_relu:
        nodes += [helper.make_node("Reshape", [last, "t"], ["v"]), helper.make_node("Relu", ["v"], ["y"])]
    else:
        nodes.append(helper.make_node("Reshape", [last, "t"], ["y"]))
    if extra_output:
        outputs.append(_io("h", [None, 2, 4]))
    return _model(nodes, [_io("x", ["n", 8])], outputs)


@case("chains/reshape_around_elementwise", "Reshape")
def reshape_around_elementwise():
    """Both Reshapes go; the GELU's Mul takes the output's name."""
    return _gelu_between_reshapes()


@case("chains/reshape_around_elementwise", "Reshape")
def reshape_around_elementwise_inside():
    return _gelu_between_reshapes(then_relu=True)


def _row_op_flattened(op="Softmax", x_dims=("n", 6, 1, 1), axis=1, opset=18, row_axis=-1, constant_target=False):
    """What the upgrade writes for an opset-12 Softmax over axis 1 of an [n, c, 1, 1] tensor."""
    nodes = [helper.make_node("Flatten", ["x"], ["f"], axis=axis),
             helper.make_node(op, ["f"], ["r"], axis=row_axis)]
    if constant_target:
        nodes += [_const("s", np.array(x_dims)), helper.make_node("Reshape", ["r", "s"], ["y"])]
    else:
        nodes += [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Reshape", ["r", "s"], ["y"])]
    return _model(nodes, [_io("x", list(x_dims))], [_io("y", list(x_dims))], opset=opset)


@case("chains/row_op_through_flatten", "Flatten")
def softmax_through_flatten():
    return _row_op_flattened()


@case("chains/row_op_through_flatten", "Flatten")
def hardmax_through_flatten_to_a_constant_shape():
    return _row_op_flattened("Hardmax", (2, 5, 1), constant_target=True)


def _run(original: onnx.ModelProto, result: onnx.ModelProto, feeds=None) -> None:
    _assert_same(original, result, feeds)
    assert [(o.name, o.type) for o in result.graph.output] == [(o.name, o.type) for o in original.graph.output]


@pytest.mark.parametrize("name", sorted(CASES))
def test_rule_in_the_main_graph(name: str) -> None:
    build, rule, gone = CASES[name]
    original = build()
    result, stats = _simplify(original)
    assert stats["applied"].get(rule), stats
    assert _ops(result).count(gone) < _ops(original).count(gone), (_ops(original), _ops(result))
    _run(original, result)
    again, stats_again = _simplify(result)
    assert _ops(again) == _ops(result) and not stats_again["applied"].get(rule)  # idempotent


@pytest.mark.parametrize("name", sorted(CASES))
def test_rule_in_if_branches(name: str) -> None:
    build, _, gone = CASES[name]
    original = _in_if_branch(build())
    result, _ = _simplify(original)
    assert _ops(result).count(gone) < _ops(original).count(gone), (_ops(original), _ops(result))
    feeds = _feeds(build())
    for cond in (True, False):
        _run(original, result, {**feeds, "cond": np.array(cond)})


@pytest.mark.parametrize("name", UNTYPED)
def test_rule_in_a_function(name: str) -> None:
    build, _, gone = CASES[name]
    original = _in_function(build())
    result, _ = _simplify(original)
    assert _ops(result).count(gone) < _ops(original).count(gone), (_ops(original), _ops(result))
    _run(original, result, _feeds(build()))


# --- where they must not apply ---------------------------------------------------------------------

def _kept(original: onnx.ModelProto, op: str, feeds=None) -> onnx.ModelProto:
    result, _ = _simplify(original)
    assert _ops(result).count(op) == _ops(original).count(op), (_ops(original), _ops(result))
    _run(original, result, feeds)
    return result


def test_a_no_op_of_a_graph_input_or_a_shared_value_keeps_producing_the_output() -> None:
    nodes = [helper.make_node("Cast", ["x"], ["a"], to=F), helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Identity", ["r"], ["b"]), helper.make_node("Neg", ["r"], ["c"])]
    original = _model(nodes, [_io("x", [2])], [_io("a", [2]), _io("b", [2]), _io("c", [2])])
    result = _kept(original, "Identity")
    assert _ops(result).count("Cast") == 1


def test_an_identity_producing_a_graph_output_is_kept_even_of_a_value_computed_for_it() -> None:
    nodes = [helper.make_node("Neg", ["x"], ["t"]), helper.make_node("Identity", ["t"], ["y"])]
    original = _model(nodes, [_io("x", [2])], [_io("y", [2])])
    result = _kept(original, "Identity")
    assert [o.name for o in result.graph.output] == ["y"]


def test_a_no_op_of_an_outer_value_keeps_producing_a_branch_output() -> None:
    branch = helper.make_graph([helper.make_node("Identity", ["r"], ["out"])], "b", [], [_io("out", [2])])
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("If", ["cond"], ["y"], then_branch=branch, else_branch=branch)]
    original = _model(nodes, [_io("x", [2]), _io("cond", [], TensorProto.BOOL)], [_io("y", [2])])
    _kept(original, "Identity", {"x": np.array([-1.0, 2.0], np.float32), "cond": np.array(True)})


def test_the_renamed_value_keeps_the_declared_output_type_and_shape() -> None:
    original = cast_producing_an_output()
    result, _ = _simplify(original)
    (output,) = result.graph.output
    assert output == original.graph.output[0] and result.graph.node[-1].output[0] == "y"


@pytest.mark.parametrize("shape,axis", [((2, 3, 4), 1), ((2, 3), 0), ((4,), 0), ((2, 3, 4), -1)])
def test_flatten_that_reshapes_stays(shape, axis) -> None:
    nodes = [helper.make_node("Flatten", ["x"], ["t"], axis=axis), helper.make_node("Relu", ["t"], ["y"])]
    _kept(_model(nodes, [_io("x", list(shape))], [_io("y", [None, None])]), "Flatten")


@settings(max_examples=25, deadline=None)
@given(rank=st.integers(1, 4), data=st.data())
def test_flatten_property(rank: int, data) -> None:
    shape = data.draw(st.lists(st.integers(0, 3), min_size=rank, max_size=rank))
    axis = data.draw(st.integers(-rank, rank))
    nodes = [helper.make_node("Flatten", ["x"], ["t"], axis=axis), helper.make_node("Neg", ["t"], ["y"])]
    original = _model(nodes, [_io("x", shape)], [_io("y", [None, None])])
    result, _ = _simplify(original)
    feeds = {"x": np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
    _run(original, result, feeds)
    if rank == 2 and axis in (1, -1):
        assert "Flatten" not in _ops(result)


def _lstm_wrong_layout() -> onnx.ModelProto:
    """A batch-first state shape ([batch, dirs, hidden]) given to a layout-0 LSTM: it runs for batch 1 only."""
    model = _lstm(layout=0)
    concat = next(n for n in model.graph.node if n.op_type == "Concat")
    concat.input[:] = ["b1", "d", "h"]
    return model


@pytest.mark.parametrize("build,batch", [
    (lambda: _lstm(fill=-0.0), 3),  # -0 is not the missing state's +0
    (lambda: _lstm(fill=1.0), 3),
    (lambda: _lstm(batch_from="other"), 3),  # the size of another tensor: not proved to be x's batch
    (_lstm_wrong_layout, 1),
    (lambda: _lstm(sliced=(1, 0, 1)), 1),  # a slice of the batch axis: its size is not proved
], ids=["minus_zero", "one", "other_batch", "wrong_layout", "sliced_batch"])
def test_initial_states_that_are_not_the_default_stay(build, batch) -> None:
    original = build()
    feeds = {"x": np.random.default_rng(1).standard_normal((2, batch, 5)).astype(np.float32)}
    if any(i.name == "other" for i in original.graph.input):
        feeds["other"] = np.zeros((3, 3), np.float32)  # the same size: the original runs
    _kept(original, "ConstantOfShape", feeds)


def test_equal_of_a_dim_with_a_size_stays() -> None:
    model = _expand_like_torchscript()
    m = next(n for n in model.graph.node if n.output[0] == "m")
    m.attribute[0].t.CopyFrom(onnx.numpy_helper.from_array(np.array([3, -1]), "m"))
    result = _kept(model, "Equal", {"x": np.ones((3, 2), np.float32), "v": np.ones((1, 2), np.int64)})
    assert "Where" in _ops(result)


def test_where_on_floats_stays() -> None:
    """onnxruntime's Where turns a selected -0 into +0: removing it would change the result."""
    nodes = [_const("c", np.array([True, True])), helper.make_node("Where", ["c", "x", "z"], ["y"])]
    original = _model(nodes, [_io("x", [2]), _io("z", [2])], [_io("y", [2])])
    _kept(original, "Where", {"x": np.array([-0.0, 1.0], np.float32), "z": np.zeros(2, np.float32)})


def test_where_that_broadcasts_stays() -> None:
    nodes = [_const("c", np.ones((2, 2), bool)), helper.make_node("Where", ["c", "x", "z"], ["y"])]
    original = _model(nodes, [_io("x", [2], I64), _io("z", [2], I64)], [_io("y", [2, 2], I64)])
    _kept(original, "Where")


@pytest.mark.parametrize("order, dims", [((1, 0), ("n", "m")), ((0,), ("n", "m")), ((0, 0), ("n", "n")),
                                         ((0, 1, 1), ("n", "m", 3))])  # fmt: skip
def test_a_concat_that_is_not_the_whole_shape_in_order_stays(order, dims) -> None:
    sizes = {"n": 2, "m": 3}
    feeds = {"x": np.zeros([sizes.get(d, d) for d in dims], np.float32), "v": np.ones([1] * len(order), np.float32)}
    original = _shape_rebuilt(order, dims)
    result, stats = _simplify(original)
    assert not stats["applied"].get("shapes/whole_shape"), stats
    assert "Shape" in _ops(result)  # the output is still built from x's dims, not from Shape(x) whole
    _run(original, result, feeds)


def test_a_shared_unsqueeze_with_a_user_that_cannot_merge_stays() -> None:
    nodes = [_const("a", np.array([0])), helper.make_node("Unsqueeze", ["x", "a"], ["u"]),
             helper.make_node("Unsqueeze", ["u", "k"], ["p"]), _const("b", np.array([0])),
             helper.make_node("Unsqueeze", ["u", "b"], ["q"]), helper.make_node("Identity", ["p"], ["y"]),
             helper.make_node("Identity", ["q"], ["w"])]
    original = _model(nodes, [_io("x", [3]), _io("k", [1], I64)], [_io("y", [None] * 3), _io("w", [1, 1, 3])])
    _kept(original, "Unsqueeze", {"x": np.ones(3, np.float32), "k": np.array([2])})


@settings(max_examples=40, deadline=None)
@given(k=st.lists(st.integers(-3, 3), min_size=1, max_size=2), n=st.integers(0, 3), m=st.integers(0, 3))
def test_equal_of_shape_arithmetic_property(k, n, m) -> None:
    """Folded or not, the comparison gives what onnxruntime computes, for any constant and any sizes."""
    model = _expand_like_torchscript()
    node = next(n_ for n_ in model.graph.node if n_.output[0] == "m")
    node.attribute[0].t.CopyFrom(onnx.numpy_helper.from_array(np.array(k), "m"))
    where = next(n_ for n_ in model.graph.node if n_.op_type == "Where")
    where.input[1] = "c"  # Where(e, c, c) is c: the model runs for any k
    model.graph.output[0].CopyFrom(_io("y", [None, None], I64))
    model.graph.node.append(helper.make_node("Cast", ["e"], ["ei"], to=I64))
    model.graph.output.append(_io("ei", [None], I64))
    feeds = {"x": np.ones((n, m), np.float32), "v": np.ones((1, m), np.int64)}
    result, _ = _simplify(model)
    _run(model, result, feeds)
    if all(v < 0 for v in k):
        assert "Equal" not in _ops(result)


def test_reshape_around_elementwise_leaves_only_the_elementwise_ops() -> None:
    result, _ = _simplify(_gelu_between_reshapes())
    assert "Reshape" not in _ops(result) and [o.name for o in result.graph.output] == ["y"]


@pytest.mark.parametrize("variant", [
    {"target": (-1, 4), "y_shape": (None, 4)},  # another shape than x's
    {"target": (0, 8)},  # a copied dim: of the middle tensor, not of x
    {"bias_shape": (4,)},  # broadcast along the middle tensor's last axis: not the same after the Reshape
    {"bias_shape": (1, 1, 1, 1), "y_shape": (None, None, None)},  # a single element of a higher rank
    {"extra_output": True},  # a value between the Reshapes is a graph output
])
def test_reshape_around_elementwise_that_is_not_the_identity_stays(variant) -> None:
    original = _gelu_between_reshapes(**variant)
    result, stats = _simplify(original, full_check=False)
    assert not stats["applied"].get("chains/reshape_around_elementwise"), stats
    if variant.get("y_shape") == (None, None, None):  # a declaration the graph contradicts: corrected
        assert stats["applied"].get("declared/shape") == 1, stats
        feeds = {"x": np.arange(24, dtype=np.float32).reshape(3, 8) - 11.5}
        for a, b in zip(helpers.ort_run(original, feeds), helpers.ort_run(result, feeds), strict=True):
            assert a.shape == b.shape and a.tobytes() == b.tobytes()
        onnx.checker.check_model(result, full_check=True)
        return
    _run(original, result)


_FACTORS = st.sampled_from([(2, 3, 4), (6, 4), (4, 6), (24,), (2, 12), (3, 8), (1, 24), (2, 3, 2, 2)])


@settings(max_examples=40, deadline=None)
@given(x_shape=_FACTORS, middle=_FACTORS, target=_FACTORS, minus=st.integers(-1, 3),
       ops=st.lists(st.sampled_from(["Neg", "Tanh", "Mul", "Add", "Mul", "AddRow"]), min_size=1, max_size=3),
       rank_of_single=st.integers(0, 2), back=st.booleans())
def test_reshape_around_elementwise_property(x_shape, middle, target, minus, ops, rank_of_single, back) -> None:
    """Any Reshape/elementwise/Reshape sandwich computes the same after the pass, whether the rule applies or not."""
    f = np.float32
    target = x_shape if back else target
    wanted = list(target)
    if 0 <= minus < len(wanted):
        wanted[minus] = -1
    nodes = [_const("s", np.array(middle)), _const("t", np.array(wanted)),
             _const("single", np.full((1,) * rank_of_single, 1.5, f)),
             _const("row", np.arange(middle[-1], dtype=f) + 0.5),
             helper.make_node("Reshape", ["x", "s"], ["v0"])]
    for i, op in enumerate(ops):
        a, b = f"v{i}", f"v{i + 1}"
        if op in ("Neg", "Tanh"):
            nodes.append(helper.make_node(op, [a], [b]))
        elif op == "AddRow":  # broadcasts along the middle tensor's last axis
            nodes.append(helper.make_node("Add", [a, "row"], [b]))
        else:
            nodes.append(helper.make_node(op, [a, "single"], [b]))
    nodes.append(helper.make_node("Reshape", [f"v{len(ops)}", "t"], ["y"]))
    out_rank = max(len(target), 0)
    original = _model(nodes, [_io("x", list(x_shape))], [_io("y", [None] * out_rank)])
    try:
        onnx.checker.check_model(onnx.shape_inference.infer_shapes(original, strict_mode=True), full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError):
        reject()  # a single element of a higher rank than the target: not a valid model
    result, stats = _simplify(original, full_check=False)
    applied = stats["applied"].get("chains/reshape_around_elementwise", 0)
    event("applied" if applied else "left")
    uses_single = any(op in ("Mul", "Add") for op in ops)
    assert not applied or (tuple(target) == tuple(x_shape) and "AddRow" not in ops
                           and (not uses_single or rank_of_single <= min(len(x_shape), len(middle)))), (stats, ops)
    _run(original, result)


def test_row_op_through_flatten_before_opset_13_is_one_op_whatever_the_dims() -> None:
    """Before opset 13 the op flattens the same way itself (the wrappers above build opset-18 branches)."""
    original = _row_op_flattened("LogSoftmax", ("n", 2, 3), opset=11, row_axis=1)
    result, stats = _simplify(original)
    assert _ops(result) == ["LogSoftmax"] and stats["applied"]["chains/row_op_through_flatten"] == 1
    _run(original, result)


@pytest.mark.parametrize("variant", [
    {"x_dims": ("n", 2, 3)},  # from opset 13 the op would normalise over axis 1 alone, not 2 x 3
    {"x_dims": ("n", 2, "m")},
    {"x_dims": ("n", 6, 1, 1), "row_axis": 0},  # over the rows' other axis
    {"x_dims": (2, 5, 1), "constant_target": True, "axis": 3},  # rows of one element: Flatten at the end
])
def test_row_op_through_flatten_that_is_not_one_op_stays(variant) -> None:
    original = _row_op_flattened(**variant)
    result, stats = _simplify(original)
    assert not stats["applied"].get("chains/row_op_through_flatten"), stats
    _run(original, result)


def test_an_old_softmax_over_channels_comes_out_of_the_upgrade_as_one_op() -> None:
    """The squeezenet ending: Softmax-9 over axis 1 of the pooled [n, c, 1, 1] tensor."""
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["p"]), helper.make_node("Softmax", ["p"], ["y"], axis=1)]
    original = _model(nodes, [_io("x", ["n", 6, 3, 3])], [_io("y", ["n", 6, 1, 1])], opset=9)
    result = passes.optimize(original)
    assert _ops(result) == ["GlobalAveragePool", "Softmax"], _ops(result)
    _run(original, result)
