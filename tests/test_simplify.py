"""The simplify pass: each rule, each trap other tools fall into, in graphs, subgraphs and functions.

Every case runs the original and the simplified model in onnxruntime with its
own optimisations disabled and compares the outputs bit for bit (the fusions,
which change rounding, are compared within a tolerance and counted).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import helpers
import passes
from passes.simplify import SimplifyPass

F = TensorProto.FLOAT
RNG = np.random.default_rng(7)


def _model(nodes, inputs, outputs, initializers=(), opset=18, functions=(), ir_version=None) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], functions=list(functions))
    if ir_version is not None:
        model.ir_version = ir_version
    return model


_simplify = helpers.simplify_checked


_ops = helpers.ops_recursive


def _feeds(proto: onnx.ModelProto) -> dict[str, np.ndarray]:
    feeds = {}
    initializers = {i.name for i in proto.graph.initializer}
    for value in proto.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else 3 for d in tensor.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        if dtype == np.bool_:
            feeds[value.name] = RNG.random(shape) < 0.5
        elif np.issubdtype(dtype, np.integer):
            feeds[value.name] = RNG.integers(0, 3, shape).astype(dtype)
        else:
            feeds[value.name] = RNG.standard_normal(shape).astype(dtype)
    return feeds


def _assert_same(original: onnx.ModelProto, result: onnx.ModelProto, feeds=None, exact: bool = True) -> None:
    feeds = feeds or _feeds(original)
    for a, b in zip(helpers.ort_run(original, feeds), helpers.ort_run(result, feeds)):
        if exact:
            np.testing.assert_array_equal(np.signbit(a), np.signbit(b)) if a.dtype.kind == "f" else None
            np.testing.assert_array_equal(a, b)
        else:
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert [(o.name, o.type) for o in result.graph.output] == [(o.name, o.type) for o in original.graph.output]
    assert [(i.name, i.type) for i in result.graph.input] == [(i.name, i.type) for i in original.graph.input]


def _const(name: str, array: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(array), name))


def _io(name: str, shape, elem=F):
    return helper.make_tensor_value_info(name, elem, shape)


# --- each rule, with the op that must go and the ops that must stay ---------------------------

def _x(shape=(2, 3, 4)):
    return [_io("x", list(shape))]


CASES: dict[str, tuple[Callable[[], onnx.ModelProto], str, str, str]] = {}


def case(family: str, gone: str, kept: str = ""):
    def register(build: Callable[[], onnx.ModelProto]):
        CASES[build.__name__] = (build, family, gone, kept)
        return build

    return register


@case("noops", "Identity")
def identity():
    return _model([helper.make_node("Identity", ["x"], ["t"]), helper.make_node("Relu", ["t"], ["y"])],
                  _x(), [_io("y", [2, 3, 4])])


@case("noops", "Cast")
def cast_same_type():
    return _model([helper.make_node("Cast", ["x"], ["t"], to=F), helper.make_node("Relu", ["t"], ["y"])],
                  _x(), [_io("y", [2, 3, 4])])


@case("noops", "Dropout")
def inference_dropout():
    return _model([_const("r", np.float32(0.3)), helper.make_node("Dropout", ["x", "r"], ["t"]),
                   helper.make_node("Relu", ["t"], ["y"])], _x(), [_io("y", [2, 3, 4])])


@case("noops", "Expand")
def expand_same_shape():
    return _model([_const("s", np.array([2, 3, 4])), helper.make_node("Expand", ["x", "s"], ["t"]),
                   helper.make_node("Relu", ["t"], ["y"])], _x(), [_io("y", [2, 3, 4])])


@case("noops", "Reshape")
def reshape_same_symbolic_shape():
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Reshape", ["x", "s"], ["t"]),
             helper.make_node("Relu", ["t"], ["y"])]
    return _model(nodes, [_io("x", ["n", 3])], [_io("y", ["n", 3])])


@case("noops", "Transpose")
def identity_transpose():
    return _model([helper.make_node("Transpose", ["x"], ["t"], perm=[0, 1, 2]),
                   helper.make_node("Relu", ["t"], ["y"])], _x(), [_io("y", [2, 3, 4])])


@case("noops", "Pad")
def zero_pad():
    return _model([_const("p", np.zeros(6, np.int64)), helper.make_node("Pad", ["x", "p"], ["t"]),
                   helper.make_node("Relu", ["t"], ["y"])], _x(), [_io("y", [2, 3, 4])])


@case("noops", "Concat")
def one_input_concat():
    return _model([helper.make_node("Concat", ["x"], ["t"], axis=0), helper.make_node("Relu", ["t"], ["y"])],
                  _x(), [_io("y", [2, 3, 4])])


@case("noops", "Slice")
def full_slice():
    nodes = [_const("st", np.array([0])), _const("en", np.array([2**63 - 1])), _const("ax", np.array([1])),
             helper.make_node("Slice", ["x", "st", "en", "ax"], ["t"]), helper.make_node("Relu", ["t"], ["y"])]
    return _model(nodes, _x(), [_io("y", [2, 3, 4])])


@case("chains", "Reshape", kept="Reshape")
def reshape_chain():
    nodes = [_const("a", np.array([6, 4])), _const("b", np.array([4, 6])),
             helper.make_node("Reshape", ["x", "a"], ["t"]), helper.make_node("Reshape", ["t", "b"], ["y"])]
    return _model(nodes, _x(), [_io("y", [4, 6])])


@case("chains", "Unsqueeze", kept="Unsqueeze")
def unsqueeze_chain():
    nodes = [_const("a", np.array([0])), _const("b", np.array([-1, 2])),
             helper.make_node("Unsqueeze", ["x", "a"], ["t"]), helper.make_node("Unsqueeze", ["t", "b"], ["y"])]
    return _model(nodes, _x(), [_io("y", [None] * 6)])


@case("chains", "Unsqueeze")
def squeeze_unsqueeze():
    nodes = [_const("a", np.array([1])), helper.make_node("Unsqueeze", ["x", "a"], ["t"]),
             helper.make_node("Squeeze", ["t", "a"], ["u"]), helper.make_node("Relu", ["u"], ["y"])]
    return _model(nodes, _x(), [_io("y", [2, 3, 4])])


@case("chains", "Transpose", kept="Transpose")
def transpose_chain():
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 2, 0]),
             helper.make_node("Transpose", ["t"], ["y"], perm=[0, 2, 1])]
    return _model(nodes, _x(), [_io("y", [None] * 3)])


@case("chains", "Transpose", kept="Reshape")
def reshape_then_reshape_like_transpose():
    nodes = [_const("s", np.array([4, 1, 2, 3])), helper.make_node("Reshape", ["x", "s"], ["t"]),
             helper.make_node("Transpose", ["t"], ["u"], perm=[0, 2, 3, 1]), helper.make_node("Relu", ["u"], ["y"])]
    return _model(nodes, _x(), [_io("y", [4, 2, 3, 1])])


@case("chains", "Transpose", kept="Reshape")
def reshape_like_transpose_then_reshape():
    nodes = [_const("s", np.array([3, 8])), helper.make_node("Unsqueeze", ["x", "one"], ["t"]),
             helper.make_node("Transpose", ["t"], ["u"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["u", "s"], ["y"])]
    return _model([_const("one", np.array([1])), *nodes], _x(), [_io("y", [3, 8])])


@case("chains", "Reshape", kept="Transpose")
def transpose_between_reshapes():
    nodes = [_const("s1", np.array([4, 6, 5])), _const("s2", np.array([1, 4, 5, 6])),
             helper.make_node("Reshape", ["x", "s1"], ["t"]), helper.make_node("Transpose", ["t"], ["u"], perm=[0, 2, 1]),
             helper.make_node("Reshape", ["u", "s2"], ["v"]), helper.make_node("Relu", ["v"], ["y"])]
    return _model(nodes, _x((1, 4, 6, 5)), [_io("y", [1, 4, 5, 6])])


@case("chains", "Slice", kept="Slice")
def slice_chain():
    nodes = [_const("s1", np.array([1])), _const("e1", np.array([2**63 - 1])), _const("a1", np.array([1])),
             _const("p1", np.array([2])), _const("s2", np.array([0, -1])), _const("e2", np.array([4, -10])),
             _const("a2", np.array([-1, 0])), _const("p2", np.array([2, -1])),
             helper.make_node("Slice", ["x", "s1", "e1", "a1", "p1"], ["t"]),
             helper.make_node("Slice", ["t", "s2", "e2", "a2", "p2"], ["u"]), helper.make_node("Relu", ["u"], ["y"])]
    return _model(nodes, _x((3, 5, 6)), [_io("y", [None] * 3)])


@case("chains", "Cast")
def lossless_cast_chain():
    nodes = [helper.make_node("Cast", ["x"], ["t"], to=TensorProto.DOUBLE),
             helper.make_node("Cast", ["t"], ["u"], to=F), helper.make_node("Relu", ["u"], ["y"])]
    return _model(nodes, _x(), [_io("y", [2, 3, 4])])


@case("cse", "Shape", kept="Shape")
def duplicate_shapes():
    nodes = [helper.make_node("Shape", ["x"], ["s1"]), helper.make_node("Shape", ["x"], ["s2"]),
             helper.make_node("Add", ["s1", "s2"], ["y"])]
    return _model(nodes, [_io("x", ["n", 3])], [_io("y", [2], TensorProto.INT64)])


@case("shapes", "Gather")
def static_dim_of_dynamic_shape():
    nodes = [helper.make_node("Shape", ["x"], ["s"]), _const("i", np.array(1)),
             helper.make_node("Gather", ["s", "i"], ["d"], axis=0), _const("z", np.array([0])),
             helper.make_node("Unsqueeze", ["d", "z"], ["d1"]), _const("m", np.array([-1])),
             helper.make_node("Concat", ["m", "d1"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"])]
    return _model(nodes, [_io("x", ["batch", 6])], [_io("y", [None] * 2)])


@case("shapes", "Concat")
def computed_reshape_target():
    # [B, S, 8] -> [B, S, 2, 4] with the target built from Shape: becomes [0, 0, 2, 4].
    nodes = [helper.make_node("Shape", ["x"], ["s"], end=2), _const("tail", np.array([2, 4])),
             helper.make_node("Concat", ["s", "tail"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"])]
    return _model(nodes, [_io("x", ["b", "s", 8])], [_io("y", [None] * 4)])


@case("shapes", "Gather")
def head_split_target_from_shape_arithmetic():
    # x.view(x.size(0), x.size(1), -1, 4): the dims are copies of x's own, so [0, 0, -1, 4].
    nodes = [helper.make_node("Shape", ["x"], ["s"]), _const("i0", np.array(0)), _const("i1", np.array(1)),
             helper.make_node("Gather", ["s", "i0"], ["b"], axis=0), helper.make_node("Gather", ["s", "i1"], ["t"], axis=0),
             _const("z", np.array([0])), helper.make_node("Unsqueeze", ["b", "z"], ["b1"]),
             helper.make_node("Unsqueeze", ["t", "z"], ["t1"]), _const("tail", np.array([-1, 4])),
             helper.make_node("Concat", ["b1", "t1", "tail"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"])]
    return _model(nodes, [_io("x", ["b", "s", 8])], [_io("y", [None] * 4)])


@case("noops", "Reshape")
def reshape_to_its_own_dims_with_allowzero():
    # dynamo's ids.view(-1, ids.size(1)) with allowzero=1: the output is the input.
    nodes = [helper.make_node("Shape", ["x"], ["s"], start=1, end=2), _const("m", np.array([-1])),
             helper.make_node("Concat", ["m", "s"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["t"], allowzero=1), helper.make_node("Relu", ["t"], ["y"])]
    return _model(nodes, [_io("x", ["b", "s"])], [_io("y", ["b", "s"])])


@case("algebra", "Mul")
def times_one():
    return _model([_const("one", np.ones((3, 4), np.float32)), helper.make_node("Mul", ["x", "one"], ["t"]),
                   helper.make_node("Relu", ["t"], ["y"])], _x(), [_io("y", [2, 3, 4])])


@case("algebra", "Add")
def plus_minus_zero():
    return _model([_const("z", np.float32(-0.0)), helper.make_node("Add", ["x", "z"], ["t"]),
                   helper.make_node("Reciprocal", ["t"], ["y"])], _x(), [_io("y", [2, 3, 4])])


@case("algebra", "Sub")
def minus_zero():
    return _model([_const("z", np.float32(0.0)), helper.make_node("Sub", ["x", "z"], ["t"]),
                   helper.make_node("Reciprocal", ["t"], ["y"])], _x(), [_io("y", [2, 3, 4])])


@case("algebra", "And")
def and_true():
    return _model([_const("t", np.array(True)), helper.make_node("And", ["x", "t"], ["u"]),
                   helper.make_node("Not", ["u"], ["y"])], [_io("x", [3], TensorProto.BOOL)],
                  [_io("y", [3], TensorProto.BOOL)])


def _count(proto: onnx.ModelProto, op: str) -> int:
    return _ops(proto).count(op)


@pytest.mark.parametrize("name", sorted(CASES))
def test_rule_in_the_main_graph(name: str) -> None:
    build, family, gone, kept = CASES[name]
    original = build()
    result, stats = _simplify(original)
    assert any(rule.startswith(family + "/") for rule in stats["applied"]), stats
    assert _count(result, gone) < _count(original, gone), (_ops(original), _ops(result))
    if kept:
        assert kept in _ops(result)
    assert "Constant" not in _ops(result)  # main-graph constants are initializers
    _assert_same(original, result)
    again, _ = _simplify(result)
    assert _ops(again) == _ops(result)  # idempotent: one run reaches the fixpoint


def _in_if_branch(original: onnx.ModelProto) -> onnx.ModelProto:
    """The same computation inside both branches of an If on a bool input."""
    graph = original.graph
    renamed = [o.name + "_b" for o in graph.output]

    def branch(tag: str) -> onnx.GraphProto:
        nodes = []
        for node in graph.node:
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.output[:] = [renamed[[o.name for o in graph.output].index(o)] if o in [p.name for p in graph.output]
                              else f"{o}_{tag}" for o in node.output]
            copy.input[:] = [i if i in [v.name for v in graph.input] or not i else f"{i}_{tag}" for i in node.input]
            nodes.append(copy)
        outs = [helper.make_tensor_value_info(n, o.type.tensor_type.elem_type, None)
                for n, o in zip(renamed, graph.output)]
        return helper.make_graph(nodes, tag, [], outs)

    if_node = helper.make_node("If", ["cond"], [o.name for o in graph.output],
                               then_branch=branch("then"), else_branch=branch("else"))
    return _model([if_node], [*graph.input, _io("cond", [], TensorProto.BOOL)], list(graph.output))


@pytest.mark.parametrize("name", sorted(CASES))
def test_rule_in_if_branches(name: str) -> None:
    build, _, gone, _ = CASES[name]
    original = _in_if_branch(build())
    result, _ = _simplify(original)
    assert _count(result, gone) < _count(original, gone), (_ops(original), _ops(result))
    feeds = _feeds(build())
    for cond in (True, False):
        _assert_same(original, result, {**feeds, "cond": np.array(cond)})


def _in_function(original: onnx.ModelProto) -> onnx.ModelProto:
    graph = original.graph
    function = helper.make_function(
        "local", "F", [i.name for i in graph.input], [o.name for o in graph.output], list(graph.node),
        opset_imports=[helper.make_opsetid("", 18)])
    call = helper.make_node("F", [i.name for i in graph.input], [o.name for o in graph.output], domain="local")
    model = _model([call], list(graph.input), list(graph.output), functions=[function])
    model.opset_import.append(helper.make_opsetid("local", 1))
    return model


# Function bodies declare no types, and onnx infers none for them: only the rules that
# need neither an element type nor a shape apply there.
UNTYPED = ["identity", "inference_dropout", "identity_transpose", "zero_pad", "one_input_concat", "reshape_chain",
           "squeeze_unsqueeze", "transpose_chain", "duplicate_shapes"]


@pytest.mark.parametrize("name", UNTYPED)
def test_rule_in_a_function(name: str) -> None:
    build, _, gone, _ = CASES[name]
    original = _in_function(build())
    result, _ = _simplify(original)
    assert _count(result, gone) < _count(original, gone), (_ops(original), _ops(result))
    _assert_same(original, result, _feeds(build()))


def test_a_model_with_nothing_to_do_is_not_modified() -> None:
    original = _model([helper.make_node("Relu", ["x"], ["y"])], _x(), [_io("y", [2, 3, 4])])
    model = ir.serde.deserialize_model(original)
    pass_ = SimplifyPass()
    assert not pass_(model).modified and pass_.stats["applied"] == {}


# --- what other tools get wrong ------------------------------------------------------------------

def test_random_ops_are_never_merged() -> None:
    nodes = [helper.make_node("RandomNormalLike", ["x"], ["a"], seed=1.0),
             helper.make_node("RandomNormalLike", ["x"], ["b"], seed=1.0),
             helper.make_node("Sub", ["a", "b"], ["y"])]
    result, _ = _simplify(_model(nodes, _x(), [_io("y", [2, 3, 4])]))
    assert _ops(result).count("RandomNormalLike") == 2


def test_x_plus_zero_is_not_x() -> None:
    """-0 + 0 is +0: removing the Add would turn 1/x from +inf into -inf."""
    original = _model([_const("z", np.float32(0.0)), helper.make_node("Add", ["x", "z"], ["t"]),
                       helper.make_node("Reciprocal", ["t"], ["y"])], [_io("x", [2])], [_io("y", [2])])
    result, _ = _simplify(original)
    assert "Add" in _ops(result)
    feeds = {"x": np.array([-0.0, 1.0], np.float32)}
    assert helpers.ort_run(result, feeds)[0][0] == np.inf
    _assert_same(original, result, feeds)


def test_minus_zero_and_zero_attributes_are_not_merged() -> None:
    nodes = [helper.make_node("Constant", [], ["a"], value_float=0.0),
             helper.make_node("Constant", [], ["b"], value_float=-0.0),
             helper.make_node("Add", ["x", "a"], ["p"]), helper.make_node("Add", ["x", "b"], ["q"]),
             helper.make_node("Div", ["p", "q"], ["y"])]
    original = _model(nodes, [_io("x", [1])], [_io("y", [1])])
    result, _ = _simplify(original)
    _assert_same(original, result, {"x": np.array([-0.0], np.float32)})


def test_constants_are_compared_exactly() -> None:
    """A LayerNorm-style epsilon of 1e-12 stays, and so does x * 1.000001."""
    nodes = [_const("eps", np.float32(1e-12)), helper.make_node("Add", ["x", "eps"], ["v"]),
             helper.make_node("Sqrt", ["v"], ["s"]), _const("k", np.float32(1.000001)),
             helper.make_node("Mul", ["s", "k"], ["y"])]
    original = _model(nodes, _x(), [_io("y", [2, 3, 4])])
    result, _ = _simplify(original)
    assert {"Add", "Mul"} <= set(_ops(result))
    _assert_same(original, result, {"x": np.zeros((2, 3, 4), np.float32)})


def test_graph_inputs_keep_their_symbolic_dims() -> None:
    # onnxslim narrows n to 2 here (after an Expand to a constant shape).
    nodes = [_const("s", np.array([2, 1])), helper.make_node("Expand", ["x", "s"], ["t"]),
             helper.make_node("Relu", ["t"], ["y"])]
    original = _model(nodes, [_io("x", ["n", 1])], [_io("y", [None] * 2)])
    result, _ = _simplify(original)
    assert result.graph.input[0].type == original.graph.input[0].type
    _assert_same(original, result, {"x": np.ones((1, 1), np.float32)})


def test_matmul_add_is_not_turned_into_gemm() -> None:
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])]
    inits = [numpy_helper.from_array(RNG.standard_normal((4, 5)).astype(np.float32), "w"),
             numpy_helper.from_array(RNG.standard_normal(5).astype(np.float32), "b")]
    original = _model(nodes, _x(), [_io("y", [2, 3, 5])], initializers=inits)
    result, _ = _simplify(original)
    assert len(_ops(result)) <= 2 and "Gemm" not in _ops(result)


def test_initializers_that_are_inputs_are_left_alone() -> None:
    """IR 3 style: an initializer listed as a graph input may be overridden by a caller."""
    one = numpy_helper.from_array(np.ones((2, 3, 4), np.float32), "w")
    twin = numpy_helper.from_array(np.ones((2, 3, 4), np.float32), "v")
    nodes = [helper.make_node("Mul", ["x", "w"], ["a"]), helper.make_node("Mul", ["a", "v"], ["y"])]
    original = _model(nodes, [*_x(), _io("w", [2, 3, 4]), _io("v", [2, 3, 4])], [_io("y", [2, 3, 4])],
                      initializers=[one, twin])
    result, _ = _simplify(original)
    assert _ops(result) == ["Mul", "Mul"] and {i.name for i in result.graph.initializer} == {"w", "v"}
    feeds = {"x": np.ones((2, 3, 4), np.float32), "w": np.full((2, 3, 4), 2, np.float32),
             "v": np.full((2, 3, 4), 3, np.float32)}
    _assert_same(original, result, feeds)


def test_graph_outputs_keep_names_order_and_identity_producers() -> None:
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Identity", ["r"], ["out_b"]),
             helper.make_node("Identity", ["x"], ["out_a"]), helper.make_node("Identity", ["r"], ["tmp"]),
             helper.make_node("Neg", ["tmp"], ["out_c"])]
    original = _model(nodes, _x(), [_io("out_b", [2, 3, 4]), _io("out_a", [2, 3, 4]), _io("out_c", [2, 3, 4])])
    result, _ = _simplify(original)
    assert [o.name for o in result.graph.output] == ["out_b", "out_a", "out_c"]
    assert _ops(result).count("Identity") == 2  # the two producing outputs stay; the inner one goes
    _assert_same(original, result)


def test_broadcasting_identity_elements_are_kept() -> None:
    """x * ones((2, 3)) on a [3] input broadcasts: the Mul is not a no-op."""
    original = _model([_const("one", np.ones((2, 3), np.float32)), helper.make_node("Mul", ["x", "one"], ["y"])],
                      [_io("x", [3])], [_io("y", [2, 3])])
    result, _ = _simplify(original)
    assert "Mul" in _ops(result)


def test_declared_shapes_the_graph_contradicts_are_not_trusted() -> None:
    """An exporter declares y as [1, 6]; the graph computes [2, 3]: the Reshape must stay."""
    nodes = [_const("s", np.array([2, 3])), helper.make_node("Reshape", ["x", "s"], ["t"]),
             helper.make_node("Relu", ["t"], ["y"])]
    original = _model(nodes, [_io("x", [1, 6])], [_io("y", [2, 3])])
    original.graph.value_info.append(_io("t", [1, 6]))
    result, _ = _simplify(original, full_check=False)
    assert "Reshape" in _ops(result)


# --- the pipeline: fold and simplify to a fixpoint -------------------------------------------------

def test_one_run_reaches_what_two_runs_reach(tmp_path) -> None:
    import pathlib

    for path in sorted((pathlib.Path(__file__).parent.parent / "models" / "real").glob("tiny_bert*.onnx")):
        once = passes.optimize(onnx.load(str(path)), check=False)
        twice = passes.optimize(once, check=False)
        assert len(_ops(twice)) == len(_ops(once)), path.name


def test_no_fuse_and_skip_turn_it_off() -> None:
    original = identity()
    assert "Identity" in _ops(passes.optimize(original, skip=["simplify"]))
    assert "Identity" not in _ops(passes.optimize(original))
    assert passes.optimize(original, fuse=False) is not None


# --- a Transpose that moves only axes of size 1 is a Reshape ------------------------------------


def _reshape_transpose(target, perm, x_shape=(2, 3, 4), out_shape=None) -> onnx.ModelProto:
    nodes = [_const("s", np.array(target)), helper.make_node("Reshape", ["x", "s"], ["t"]),
             helper.make_node("Transpose", ["t"], ["y"], perm=perm)]
    return _model(nodes, [_io("x", list(x_shape))], [_io("y", out_shape or [None] * len(perm))])


@pytest.mark.parametrize(("target", "perm", "x_shape", "fires"), [
    ([4, 1, 6], [1, 0, 2], (2, 3, 4), True),  # only the 1 moves
    ([2, 12, 1], [0, 2, 1], ("n", 3, 4), True),  # the Reshape's result is static whatever n is
    ([0, 12, 1], [0, 2, 1], (2, 3, 4), False),  # the target copies dim 0
    ([2, 3, 4], [0, 2, 1], (2, 3, 4), False),  # a real transpose
    ([2, 1, 3, 4], [0, 2, 3, 1], (2, 3, 4), True),
    ([2, 1, 3, 4], [0, 3, 2, 1], (2, 3, 4), False),  # 3 and 4 swap
], ids=["one-moves", "symbolic-input", "copy", "real", "one-to-the-end", "swap"])
def test_a_transpose_of_a_reshape_is_a_reshape_only_when_it_moves_ones(target, perm, x_shape, fires) -> None:
    original = _reshape_transpose(target, perm, x_shape)
    result, stats = _simplify(original)
    assert stats["applied"].get("chains/reshape_like_transpose_of_reshape", 0) == int(fires), stats
    assert ("Transpose" in _ops(result)) != fires
    feeds = {"x": RNG.standard_normal([2 if d == "n" else d for d in x_shape]).astype(np.float32)}
    _assert_same(original, result, feeds)


def test_the_reshape_takes_a_transposed_graph_outputs_place() -> None:
    original = _reshape_transpose([4, 1, 6], [1, 0, 2], out_shape=[1, 4, 6])
    result, stats = _simplify(original)
    assert _ops(result) == ["Reshape"] and stats["applied"]["chains/reshape_like_transpose_of_reshape"] == 1
    assert result.graph.node[0].output[0] == "y"
    assert [d.dim_value for d in result.graph.output[0].type.tensor_type.shape.dim] == [1, 4, 6]
    _assert_same(original, result)


def test_a_transpose_of_dims_not_proved_to_be_one_before_a_reshape_stays() -> None:
    nodes = [_const("s", np.array([-1])), helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0, 2]),
             helper.make_node("Reshape", ["t", "s"], ["y"])]
    original = _model(nodes, [_io("x", ["n", "m", 4])], [_io("y", [None])])
    result, stats = _simplify(original)
    assert "Transpose" in _ops(result), stats  # n and m may both be 2: then the Transpose moves data
    _assert_same(original, result, {"x": RNG.standard_normal((2, 3, 4)).astype(np.float32)})


def test_a_shared_slice_is_taken_in_by_each_slice_after_it() -> None:
    """Swin's patch merging: x[:, a::2] sliced again on axis 2 twice, for two a: 6 Slices become 4."""
    nodes, outputs = [], []
    for a in (0, 1):
        nodes += [_const(f"s{a}", np.array([a])), _const(f"e{a}", np.array([2**63 - 1])),
                  _const("ax1" if a == 0 else "ax1_", np.array([1])), _const("two" if a == 0 else "two_", np.array([2])),
                  helper.make_node("Slice", ["x", f"s{a}", f"e{a}", "ax1" if a == 0 else "ax1_", "two" if a == 0
                                            else "two_"], [f"r{a}"])]  # fmt: skip
        for b in (0, 1):
            nodes += [_const(f"s{a}{b}", np.array([b])), _const(f"ax{a}{b}", np.array([2])),
                      helper.make_node("Slice", [f"r{a}", f"s{a}{b}", f"e{a}", f"ax{a}{b}", "two"], [f"y{a}{b}"])]
            outputs.append(_io(f"y{a}{b}", [None] * 4))
    original = _model(nodes, [_io("x", [1, 6, 6, 3])], outputs)
    result, stats = _simplify(original)
    assert _ops(result) == ["Slice"] * 4 and stats["applied"]["chains/slice_of_slice"] == 4, stats
    _assert_same(original, result)


@pytest.mark.parametrize(("axes", "reason"), [([1, 1], "slice a same axis"), ([1, -2], "slice a same axis")])
def test_slices_of_a_same_axis_stay(axes, reason, caplog) -> None:
    import logging

    nodes = [_const("s", np.array([1])), _const("e", np.array([5])), _const("a1", np.array([axes[0]])),
             _const("a2", np.array([axes[1]])), helper.make_node("Slice", ["x", "s", "e", "a1"], ["t"]),
             helper.make_node("Slice", ["t", "s", "e", "a2"], ["y"])]
    original = _model(nodes, _x((3, 6, 4)), [_io("y", [None] * 3)])
    with caplog.at_level(logging.DEBUG, logger="passes.simplify"):
        result, _ = _simplify(original)
    assert _ops(result).count("Slice") == 2 and reason in caplog.text
    _assert_same(original, result)


@pytest.mark.parametrize(("x_shape", "s1", "perm", "s2", "expected"), [
    ((1, 4, 6, 5), [4, 6, 5], [0, 2, 1], [1, 4, 5, 6], [0, 1, 3, 2]),
    ((1, 4, 6, 5), [4, 6, 5], [0, 2, 1], [4, 1, 5, 6], [1, 0, 3, 2]),  # the 1 ends up second
    ((2, 1, 6), [2, 6], [1, 0], [6, 1, 2], [2, 1, 0]),
    ((1, 4, 6, 5), [4, 6, 5], [0, 1, 2], [1, 4, 6, 5], None),  # the identity: x itself
], ids=["whisper", "one-moves", "matrix", "identity"])
def test_a_transpose_between_reshapes_of_ones_is_one_transpose(x_shape, s1, perm, s2, expected) -> None:
    nodes = [_const("s1", np.array(s1)), _const("s2", np.array(s2)), helper.make_node("Reshape", ["x", "s1"], ["t"]),
             helper.make_node("Transpose", ["t"], ["u"], perm=perm), helper.make_node("Reshape", ["u", "s2"], ["v"]),
             helper.make_node("Relu", ["v"], ["y"])]
    original = _model(nodes, _x(x_shape), [_io("y", list(s2))])
    result, _ = _simplify(original)
    if expected is None:
        assert _ops(result) == ["Relu"]
    else:
        assert _ops(result) == ["Transpose", "Relu"]
        assert helper.get_attribute_value(result.graph.node[0].attribute[0]) == expected
    _assert_same(original, result)


@pytest.mark.parametrize(("x_shape", "s1", "perm", "s2"), [
    ((2, 3, 4), [6, 4], [1, 0], [4, 6]),  # the first Reshape merges dims
    ((1, 4, 6), [4, 6], [1, 0], [24]),  # the rank changes
    ((1, 4, 6), [4, 6], [1, 0], [2, 3, 4]),  # the last Reshape splits a dim
], ids=["merge", "rank", "split"])
def test_a_transpose_between_reshapes_that_move_data_stays(x_shape, s1, perm, s2) -> None:
    nodes = [_const("s1", np.array(s1)), _const("s2", np.array(s2)), helper.make_node("Reshape", ["x", "s1"], ["t"]),
             helper.make_node("Transpose", ["t"], ["u"], perm=perm),
             helper.make_node("Reshape", ["u", "s2"], ["y"])]
    original = _model(nodes, _x(x_shape), [_io("y", list(s2))])
    result, stats = _simplify(original)
    assert "chains/transpose_between_reshapes" not in stats["applied"], stats
    assert "Transpose" in _ops(result)
    _assert_same(original, result)


def test_small_external_tensors_reach_shape_inference(tmp_path) -> None:
    """A model saved with every initializer external: inference still reads a Reshape target's values."""
    from passes.modelio import load_model

    nodes = [helper.make_node("Reshape", ["x", "s"], ["t"]), helper.make_node("Shape", ["t"], ["u"]),
             helper.make_node("Cast", ["u"], ["y"], to=F), helper.make_node("Relu", ["t"], ["r"])]
    proto = _model(nodes, _x(), [_io("y", [2]), _io("r", [None, None])],
                   initializers=[numpy_helper.from_array(np.array([6, 4], np.int64), "s")])
    path = tmp_path / "m.onnx"
    onnx.save_model(proto, str(path), save_as_external_data=True, location="m.data", size_threshold=0)
    model = load_model(path)
    assert isinstance(model.graph.initializers["s"].const_value, ir.ExternalTensor)
    pass_ = SimplifyPass()
    pass_(model)
    assert pass_.stats["applied"].get("shapes/static_shape") == 1, pass_.stats
    assert "Shape" not in [n.op_type for n in model.graph]


def _with_ones(dims: list[int], ones: list[int]) -> list[int]:
    """``dims`` with a 1 inserted before each position listed in ``ones`` (a position past the end appends)."""
    out = list(dims)
    for at in sorted(ones, reverse=True):
        out.insert(min(at, len(out)), 1)
    return out


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_reshapes_and_transposes_of_size_one_axes_property(data) -> None:
    """Reshapes that only move 1s around a Transpose: the chain rules keep every bit and fire only when proved.

    x has its non-1 dims with 1s put anywhere; the first Reshape puts them
    elsewhere, a random perm follows, and the last Reshape either only moves 1s
    again (to x's rank) or reshapes for real.
    """
    core = data.draw(st.lists(st.integers(2, 4), min_size=1, max_size=3), label="non-1 dims")
    ones0 = data.draw(st.lists(st.integers(0, 3), max_size=2), label="1s of x")
    ones1 = data.draw(st.lists(st.integers(0, 3), max_size=2), label="1s after the first Reshape")
    d0, d1 = _with_ones(core, ones0), _with_ones(core, ones1)
    perm = data.draw(st.permutations(range(len(d1))), label="perm")
    d2 = [d1[a] for a in perm]
    moved = [d for d in d2 if d != 1]
    last_ones = [i for i in range(len(d0)) if d0[i] == 1]
    d3 = _with_ones(moved, data.draw(st.permutations(last_ones), label="1s of the result"))
    if data.draw(st.booleans(), label="a real last Reshape"):
        d3 = [int(np.prod(d3))]
    nodes = [_const("s1", np.array(d1)), _const("s3", np.array(d3)), helper.make_node("Reshape", ["x", "s1"], ["t"]),
             helper.make_node("Transpose", ["t"], ["u"], perm=list(perm)), helper.make_node("Reshape", ["u", "s3"], ["v"]),
             helper.make_node("Relu", ["v"], ["y"])]
    original = _model(nodes, _x(d0), [_io("y", d3)])
    result, stats = _simplify(original)
    _assert_same(original, result)
    ops = _ops(result)
    if len(d3) == len(d0):  # only 1s move: one Transpose or one Reshape is left at most
        assert ops.count("Reshape") + ops.count("Transpose") <= 1, (d0, d1, perm, d3, ops)
    kept = [a for a in perm if d1[a] != 1]
    if kept != sorted(kept):  # the Transpose moves data: some Transpose must stay
        assert "Transpose" in ops, (d0, d1, perm, d3, ops)


def test_a_moved_reshape_keeps_other_rules_inference_true() -> None:
    """SegFormer's keys: a Reshape whose Transpose moves only a 1, then a real Transpose, in one sweep.

    Rewriting the first Reshape in place changed its output's shape under the
    sweep's inference, and a later rule built an invalid model from it.
    """
    nodes = [_const("s", np.array([1, 8, -1, 4])), helper.make_node("Reshape", ["x", "s"], ["v"], allowzero=1),
             helper.make_node("Transpose", ["v"], ["t1"], perm=[0, 2, 1, 3]),
             helper.make_node("Transpose", ["t1"], ["t2"], perm=[0, 1, 3, 2]),
             helper.make_node("Reshape", ["t2", "s2"], ["r"]), helper.make_node("MatMul", ["q", "r"], ["y"])]
    original = _model([_const("s2", np.array([1, 4, 8])), *nodes], [_io("x", [1, 8, 4]), _io("q", [1, 5, 4])],
                      [_io("y", [1, 5, 8])])
    result, _ = _simplify(original)  # the full check rejects a shape that inference contradicts
    assert _ops(result).count("Transpose") + _ops(result).count("Reshape") <= 2, _ops(result)
    _assert_same(original, result)
