"""Control flow as clean as the main graph (issue #24, part 2).

The rules: subgraph constants lifted to main-graph initializers (shared when
equal bit for bit; functions keep theirs), Identity nodes producing subgraph
outputs removed (kept where the output would be an outer value or a subgraph
input), an If whose condition an enclosing branch decides resolved, an If
whose branches are the same graph resolved. Each is checked on a model shaped
like a voice-activity detector with nested Ifs on a sample-rate input, and on
small cases, in onnxruntime (optimisations disabled) bit for bit, for both
values of the condition and edge values.
"""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

import helpers
import passes
from passes.simplify import SimplifyPass

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
SAMPLE_RATES = (16000, 8000, 0, -1, 16001, 2**63 - 1, -(2**63))


def _io(name: str, shape, elem=F) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _const(name: str, array) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(array)))


def _model(nodes, inputs, outputs, initializers=(), functions=(), ir_version=None, opset=18) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    imports = [helper.make_opsetid("", opset)] + ([helper.make_opsetid("local", 1)] if functions else [])
    model = helper.make_model(graph, opset_imports=imports, functions=list(functions))
    if ir_version is not None:
        model.ir_version = ir_version
    return model


def _branch(name: str, nodes, outputs) -> onnx.GraphProto:
    return helper.make_graph(nodes, name, [], [_io(o, None) for o in outputs])


# --- the sample-rate model -----------------------------------------------------------------------


def _rate_block(tag: str, t: str, c: str, w: float) -> list[onnx.NodeProto]:
    """What a TorchScript export writes for ``if sr == 16000`` repeated inside a branch on it.

    Three inner Ifs: on ``c`` itself, on ``Not(c)`` and on a recomputation of ``Equal(sr, 16000)``
    with its own constant; each branch scales ``t`` with its own Constant and names its output with
    an Identity.
    """
    def scaled(branch: str, factor: float, op: str = "Mul") -> onnx.GraphProto:
        p = f"{tag}_{branch}"
        return _branch(p, [_const(f"{p}_k", np.full([4], factor, np.float32)),
                           helper.make_node(op, [t, f"{p}_k"], [f"{p}_m"]),
                           helper.make_node("Identity", [f"{p}_m"], [f"{p}_out"])], [f"{p}_out"])

    return [
        helper.make_node("If", [c], [f"{tag}_a"], then_branch=scaled("a_then", w),
                         else_branch=scaled("a_else", -w)),
        helper.make_node("Not", [c], [f"{tag}_nc"]),
        helper.make_node("If", [f"{tag}_nc"], [f"{tag}_b"], then_branch=scaled("b_then", 0.5, "Add"),
                         else_branch=scaled("b_else", 0.25, "Sub")),
        _const(f"{tag}_16k", np.array(16000, np.int64)),
        helper.make_node("Equal", ["sr", f"{tag}_16k"], [f"{tag}_c2"]),
        helper.make_node("If", [f"{tag}_c2"], [f"{tag}_d"], then_branch=scaled("d_then", 3.0),
                         else_branch=scaled("d_else", 5.0)),
        helper.make_node("Sum", [f"{tag}_a", f"{tag}_b", f"{tag}_d"], [f"{tag}_sum"]),
    ]


def _same_branches(tag: str, t: str) -> onnx.NodeProto:
    """An If on a data-dependent condition whose branches compute the same thing."""
    def branch(p: str) -> onnx.GraphProto:
        return _branch(p, [_const(f"{p}_k", np.array([1.5, -0.0, 2.0, 0.0], np.float32)),
                           helper.make_node("Mul", [t, f"{p}_k"], [f"{p}_m"]),
                           helper.make_node("Relu", [f"{p}_m"], [f"{p}_r"]),
                           helper.make_node("Identity", [f"{p}_r"], [f"{p}_out"])], [f"{p}_out"])

    return helper.make_node("If", [f"{tag}_pos"], [f"{tag}_same"], then_branch=branch(f"{tag}_s_then"),
                            else_branch=branch(f"{tag}_s_else"))


def _rate_branch(tag: str, w: float) -> onnx.GraphProto:
    nodes = [_const(f"{tag}_w", np.linspace(-1, 1, 4, dtype=np.float32) * w),
             _const(f"{tag}_bias", np.full([4], 0.125, np.float32)),
             helper.make_node("Mul", ["x", f"{tag}_w"], [f"{tag}_t0"]),
             helper.make_node("Add", [f"{tag}_t0", f"{tag}_bias"], [f"{tag}_t"]),
             *_rate_block(tag, f"{tag}_t", "c", w),
             helper.make_node("ReduceSum", [f"{tag}_t"], [f"{tag}_total"], keepdims=0),
             _const(f"{tag}_zero", np.array(0.0, np.float32)),
             helper.make_node("Greater", [f"{tag}_total", f"{tag}_zero"], [f"{tag}_pos"]),
             _same_branches(tag, f"{tag}_t"),
             helper.make_node("Add", [f"{tag}_sum", f"{tag}_same"], [f"{tag}_y"]),
             helper.make_node("Identity", [f"{tag}_y"], [f"{tag}_y_out"]),
             helper.make_node("Identity", ["h"], [f"{tag}_h_out"])]  # an outer value: the Identity stays
    return _branch(tag, nodes, [f"{tag}_y_out", f"{tag}_h_out"])


def _loop() -> list[onnx.NodeProto]:
    """A Loop body with Constants and Identity outputs (the condition passed through stays)."""
    body = helper.make_graph(
        [_const("l_k", np.array([0.5, 1.0, -0.0, 2.0], np.float32)),
         helper.make_node("Identity", ["l_cond_in"], ["l_cond_out"]),
         helper.make_node("Mul", ["l_s", "l_k"], ["l_m"]),
         _const("l_one", np.full([4], 0.125, np.float32)),
         helper.make_node("Add", ["l_m", "l_one"], ["l_s2"]),
         helper.make_node("Identity", ["l_s2"], ["l_s_out"]),
         helper.make_node("Identity", ["l_s2"], ["l_scan_out"])],
        "loop", [_io("l_i", [], I64), _io("l_cond_in", [], B), _io("l_s", [4])],
        [_io("l_cond_out", [], B), _io("l_s_out", [4]), _io("l_scan_out", [4])])
    return [_const("trip", np.array(3, np.int64)), _const("go", np.array(True)),
            helper.make_node("Loop", ["trip", "go", "x"], ["loop_s", "loop_scan"], body=body)]


def _scan() -> list[onnx.NodeProto]:
    body = helper.make_graph(
        [_const("s_k", np.array(0.125, np.float32)),
         helper.make_node("Add", ["s_acc", "s_x"], ["s_a"]),
         helper.make_node("Mul", ["s_a", "s_k"], ["s_m"]),
         helper.make_node("Identity", ["s_m"], ["s_acc_out"]),
         helper.make_node("Identity", ["s_x"], ["s_x_out"])],  # a body input: stays
        "scan", [_io("s_acc", [4]), _io("s_x", [4])], [_io("s_acc_out", [4]), _io("s_x_out", [4])])
    return [helper.make_node("Scan", ["h", "loop_scan"], ["scan_acc", "scan_xs"], body=body, num_scan_inputs=1)]


def _function() -> onnx.FunctionProto:
    """A function with a Constant and an If on the sample rate: it cannot see the main graph."""
    def branch(p: str, factor: float) -> onnx.GraphProto:
        return _branch(p, [_const(f"{p}_k", np.array(factor, np.float32)),
                           helper.make_node("Mul", ["fx", f"{p}_k"], [f"{p}_m"]),
                           helper.make_node("Identity", [f"{p}_m"], [f"{p}_out"])], [f"{p}_out"])

    inner = helper.make_node("If", ["fc"], ["f_inner"], then_branch=branch("fi_then", 2.0),
                             else_branch=branch("fi_else", 4.0))
    outer_then = _branch("fo_then", [inner, helper.make_node("Identity", ["f_inner"], ["fo_then_out"])],
                         ["fo_then_out"])
    outer_else = branch("fo_else", 8.0)
    return helper.make_function(
        "local", "Rate", ["fx", "fsr"], ["fy"],
        [_const("f16k", np.array(16000, np.int64)), helper.make_node("Equal", ["fsr", "f16k"], ["fc"]),
         helper.make_node("If", ["fc"], ["fy"], then_branch=outer_then, else_branch=outer_else)],
        opset_imports=[helper.make_opsetid("", 18)])


def sample_rate_model(ir_version: int | None = None, function: bool = True) -> onnx.ModelProto:
    """A voice-activity-detector-like model: nested Ifs on ``sr == 16000``, a Loop, a Scan, a function."""
    calls = [helper.make_node("Rate", ["x", "sr"], ["fy"], domain="local")] if function else []
    nodes = [_const("k16000", np.array(16000, np.int64)),
             helper.make_node("Equal", ["sr", "k16000"], ["c"]),
             helper.make_node("If", ["c"], ["y", "h_out"], then_branch=_rate_branch("r16", 1.0),
                              else_branch=_rate_branch("r8", -2.0)),
             *_loop(), *_scan(), *calls]
    return _model(nodes, [_io("x", [4]), _io("sr", [], I64), _io("h", [4])],
                  [_io("y", [4]), _io("h_out", [4]), _io("loop_s", [4]), _io("scan_acc", [4]),
                   _io("scan_xs", [3, 4])] + ([_io("fy", [4])] if function else []),
                  functions=[_function()] if function else [], ir_version=ir_version)


# --- helpers -------------------------------------------------------------------------------------


def _scopes(model: onnx.ModelProto) -> dict[str, collections.Counter[str]]:
    """The op counts of each scope: ``main``, each subgraph by its graph name, each function."""
    found: dict[str, collections.Counter[str]] = {}

    def walk(graph: onnx.GraphProto, name: str) -> None:
        found[name] = collections.Counter(n.op_type for n in graph.node)
        for node in graph.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    walk(attr.g, attr.g.name)

    walk(model.graph, "main")
    for function in model.functions:
        found[f"function {function.name}"] = collections.Counter(n.op_type for n in function.node)
        for node in function.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    walk(attr.g, f"function {attr.g.name}")
    return found


def _total(model: onnx.ModelProto, op: str | None = None) -> int:
    ops = helpers.ops_recursive(model)
    return len(ops) if op is None else ops.count(op)


def _optimize(proto: onnx.ModelProto, **options) -> onnx.ModelProto:
    """fold + simplify (the loop repeats them until nothing changes), then the full checker."""
    result = passes.optimize(proto, passes=["fold", "simplify"], check=False, **options)
    onnx.checker.check_model(result, full_check=True)
    return result


def _simplify(proto: onnx.ModelProto) -> tuple[onnx.ModelProto, dict]:
    model = ir.serde.deserialize_model(proto)
    pass_ = SimplifyPass()
    pass_(model)
    result = ir.serde.serialize_model(model)
    onnx.checker.check_model(result, full_check=True)
    return result, pass_.stats


def _feeds(sr: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(4).astype(np.float32)
    x[1] = -0.0
    return {"x": x, "sr": np.array(sr, np.int64), "h": rng.standard_normal(4).astype(np.float32)}


def _assert_same(original: onnx.ModelProto, result: onnx.ModelProto, feeds) -> None:
    for a, b in zip(helpers.ort_run(original, feeds), helpers.ort_run(result, feeds)):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))  # bit for bit, -0.0 included
    assert [(o.name, o.type) for o in result.graph.output] == [(o.name, o.type) for o in original.graph.output]


# --- the sample-rate model, every rule at once -----------------------------------------------------


@pytest.fixture(scope="module")
def rate_models() -> tuple[onnx.ModelProto, onnx.ModelProto]:
    original = sample_rate_model()
    onnx.checker.check_model(original, full_check=True)
    return original, _optimize(original)


@pytest.mark.parametrize("sr", SAMPLE_RATES)
def test_sample_rate_model_computes_the_same_bit_for_bit(rate_models, sr: int) -> None:
    original, result = rate_models
    for seed in range(3):
        _assert_same(original, result, _feeds(sr, seed))


def test_sample_rate_model_is_cleaned_like_the_main_graph(rate_models) -> None:
    original, result = rate_models
    before, after = _scopes(original), _scopes(result)
    # Every If branch and loop body: no Constant node left (all lifted: none produces an output).
    for name, ops in after.items():
        if not name.startswith("function") and name != "main":
            assert ops["Constant"] == 0, (name, ops)
    # The nested Ifs on the sample rate are gone (taken from what the enclosing branch decides), and
    # so is the data-dependent If whose branches are the same: the outer If and the function's stay
    # (ops_recursive does not count the function's inner If, which is resolved too).
    assert _total(original, "If") == 10 and _total(result, "If") == 2, after
    assert all(ops["If"] == 0 for name, ops in after.items() if name != "main" and name != "function Rate"), after
    # Identity nodes: only where a subgraph output is an outer value (h) or a body input (the
    # Loop's condition, the Scan's element), or where its input is already another output.
    kept = {name: ops["Identity"] for name, ops in after.items() if ops["Identity"]}
    assert kept == {"r16": 1, "r8": 1, "loop": 2, "scan": 1}, kept
    # The function keeps its Constant nodes (it cannot see the main graph's initializers).
    assert after["function Rate"]["Constant"] == 1
    assert _total(result) < _total(original) / 2, (_total(original), _total(result))


def test_sample_rate_model_equal_constants_become_one_initializer(rate_models) -> None:
    _, result = rate_models
    contents = [(i.data_type, tuple(i.dims), numpy_helper.to_array(i).tobytes()) for i in result.graph.initializer]
    assert len(contents) == len(set(contents))
    names = {i.name for i in result.graph.initializer}
    assert len(names) == len(result.graph.initializer)


def test_sample_rate_model_one_run_is_the_fixpoint(rate_models) -> None:
    _, result = rate_models
    again = _optimize(result)
    assert helpers.ops_recursive(again) == helpers.ops_recursive(result)
    model = ir.serde.deserialize_model(result)
    assert not SimplifyPass()(model).modified


# --- rule 1: subgraph constants become main-graph initializers ------------------------------------


def _if_model(then_nodes, then_outputs, else_nodes, else_outputs, *, shape=(2,), initializers=(),
              ir_version=None, extra=()) -> onnx.ModelProto:
    """``y = If(cond)`` on a bool input, with ``x`` (float, ``shape``) as an outer value."""
    if_node = helper.make_node("If", ["cond"], ["y"], then_branch=_branch("then", then_nodes, then_outputs),
                               else_branch=_branch("else", else_nodes, else_outputs))
    return _model([*extra, if_node], [_io("x", list(shape)), _io("cond", [], B)], [_io("y", list(shape))],
                  initializers=initializers, ir_version=ir_version)


def _scaled(tag: str, k, op: str = "Mul", x: str = "x") -> tuple[list[onnx.NodeProto], list[str]]:
    return [_const(f"{tag}_k", np.asarray(k, np.float32)), helper.make_node(op, [x, f"{tag}_k"], [f"{tag}_y"])], \
        [f"{tag}_y"]


def _check_both(original: onnx.ModelProto, result: onnx.ModelProto, x=(-0.0, 3.0)) -> None:
    for cond in (True, False):
        _assert_same(original, result, {"x": np.array(x, np.float32), "cond": np.array(cond)})


def test_branch_constants_become_one_shared_initializer_each() -> None:
    then_nodes, then_out = _scaled("t", [2.0, 3.0])
    else_nodes, else_out = _scaled("e", [2.0, 3.0], "Add")
    original = _if_model(then_nodes, then_out, else_nodes, else_out)
    result, stats = _simplify(original)
    scopes = _scopes(result)
    assert scopes["then"]["Constant"] == scopes["else"]["Constant"] == 0, scopes
    assert [numpy_helper.to_array(i).tolist() for i in result.graph.initializer] == [[2.0, 3.0]]
    assert stats["applied"]["constants/subgraph_constant_to_initializer"] == 1, stats
    assert stats["applied"]["constants/subgraph_constant_shared"] == 1, stats
    _check_both(original, result)


def test_minus_zero_and_zero_constants_are_not_shared() -> None:
    then_nodes, then_out = _scaled("t", [-0.0, 1.0], "Add")
    else_nodes, else_out = _scaled("e", [0.0, 1.0], "Add")
    original = _if_model(then_nodes, then_out, else_nodes, else_out)
    result, _ = _simplify(original)
    values = sorted(numpy_helper.to_array(i).tobytes() for i in result.graph.initializer)
    assert len(values) == 2 and "If" in helpers.ops_recursive(result)  # two constants, two different branches
    _check_both(original, result)


def test_a_lifted_constant_does_not_capture_or_get_captured_by_a_shadowing_name() -> None:
    """The main graph has ``k`` = 10; the then-branch shadows it with its own ``k`` = 2, the else-branch reads
    the outer one. The ONNX checker and onnxruntime refuse the shadowing (SSA across scopes), onnx_ir reads it
    by scope; lifted, the branch's ``k`` gets another name, and the result is valid."""
    then_nodes = [_const("k", np.array(2.0, np.float32)), helper.make_node("Mul", ["x", "k"], ["t_y"])]
    else_nodes = [helper.make_node("Mul", ["x", "k"], ["e_y"])]
    original = _if_model(then_nodes, ["t_y"], else_nodes, ["e_y"],
                         initializers=[numpy_helper.from_array(np.array(10.0, np.float32), "k")])
    result, _ = _simplify(original)
    assert sorted(i.name for i in result.graph.initializer) == ["k", "k_1"]
    assert _scopes(result)["then"]["Constant"] == 0
    x = np.array([-0.0, 3.0], np.float32)
    for cond, factor in ((True, 2.0), (False, 10.0)):
        (y,) = helpers.ort_run(result, {"x": x, "cond": np.array(cond)})
        np.testing.assert_array_equal(y.view(np.uint8), (x * np.float32(factor)).view(np.uint8))


def test_a_constant_producing_a_branch_output_stays() -> None:
    original = _if_model([_const("t_y", np.array([1.0, 2.0], np.float32))], ["t_y"],
                         [helper.make_node("Neg", ["x"], ["e_y"])], ["e_y"])
    result, stats = _simplify(original)
    assert _scopes(result)["then"]["Constant"] == 1 and not result.graph.initializer, stats
    _check_both(original, result)


def test_below_ir_4_branch_constants_stay() -> None:
    then_nodes, then_out = _scaled("t", [2.0, 3.0])
    else_nodes, else_out = _scaled("e", [4.0, 3.0])
    original = _if_model(then_nodes, then_out, else_nodes, else_out, ir_version=3)
    result, stats = _simplify(original)
    assert _scopes(result)["then"]["Constant"] == 1 and not result.graph.initializer, stats
    _check_both(original, result)


def test_a_function_keeps_its_constant_nodes(rate_models) -> None:
    original, result = rate_models
    function = result.functions[0]
    constants = [n for n in function.node if n.op_type == "Constant"]
    assert len(constants) == 1 and constants[0].output[0] == "f16k"
    inner = [a.g for n in function.node for a in n.attribute if a.type == onnx.AttributeProto.GRAPH]
    assert all(any(n.op_type == "Constant" for n in g.node) for g in inner)  # branch constants stay nodes


# --- rule 2: Identity nodes producing subgraph outputs --------------------------------------------


def test_an_identity_producing_a_branch_output_goes_and_the_output_keeps_its_name() -> None:
    then = [helper.make_node("Neg", ["x"], ["t_n"]), helper.make_node("Identity", ["t_n"], ["t_y"])]
    other = [helper.make_node("Abs", ["x"], ["e_a"]), helper.make_node("Relu", ["e_a"], ["e_r"]),
             helper.make_node("Identity", ["e_a"], ["e_y"])]  # e_a has another user
    original = _if_model(then, ["t_y"], other, ["e_y"])
    result, stats = _simplify(original)
    scopes = _scopes(result)
    assert scopes["then"]["Identity"] == 0 and scopes["else"]["Identity"] == 0, scopes
    branches = {a.name: a.g for a in result.graph.node[0].attribute}
    assert [o.name for o in branches["then_branch"].output] == ["t_y"]
    assert [o.name for o in branches["else_branch"].output] == ["e_y"]
    _check_both(original, result)


def test_an_identity_of_an_outer_value_or_an_input_or_a_repeated_output_stays() -> None:
    then = [helper.make_node("Identity", ["x"], ["t_y"]), helper.make_node("Identity", ["x"], ["t_z"])]
    other = [helper.make_node("Neg", ["x"], ["e_n"]), helper.make_node("Identity", ["e_n"], ["e_y"]),
             helper.make_node("Identity", ["e_n"], ["e_z"])]
    if_node = helper.make_node("If", ["cond"], ["y", "z"], then_branch=_branch("then", then, ["t_y", "t_z"]),
                               else_branch=_branch("else", other, ["e_y", "e_z"]))
    original = _model([if_node], [_io("x", [2]), _io("cond", [], B)], [_io("y", [2]), _io("z", [2])])
    result, _ = _simplify(original)
    scopes = _scopes(result)
    assert scopes["then"]["Identity"] == 2 and scopes["else"]["Identity"] == 1, scopes
    branch = next(a.g for a in result.graph.node[0].attribute if a.name == "else_branch")
    assert len({o.name for o in branch.output}) == 2  # never the same value twice (onnxruntime mishandles it)
    _check_both(original, result)


# --- rule 3: an If whose condition an enclosing branch decides ------------------------------------


def _nested(inner_cond_nodes, inner_cond: str) -> onnx.ModelProto:
    inner_then, inner_then_out = _scaled("it", [2.0, 3.0])
    inner_else, inner_else_out = _scaled("ie", [5.0, 7.0])
    inner = helper.make_node("If", [inner_cond], ["t_y"], then_branch=_branch("inner_then", inner_then,
                                                                              inner_then_out),
                             else_branch=_branch("inner_else", inner_else, inner_else_out))
    other = [helper.make_node("Neg", ["x"], ["e_y"])]
    return _if_model([*inner_cond_nodes, inner], ["t_y"], other, ["e_y"])


@pytest.mark.parametrize("nodes,cond,taken", [
    ([], "cond", "Mul"),
    ([helper.make_node("Not", ["cond"], ["n1"])], "n1", "Mul"),
    ([helper.make_node("Not", ["cond"], ["n1"]), helper.make_node("Not", ["n1"], ["n2"])], "n2", "Mul"),
], ids=["same", "not", "not_not"])
def test_an_if_on_the_enclosing_condition_takes_its_branch(nodes, cond, taken) -> None:
    original = _nested(nodes, cond)
    result = _optimize(original)
    assert _total(result, "If") == 1, _scopes(result)
    (constant,) = {tuple(numpy_helper.to_array(i).tolist()) for i in result.graph.initializer}
    assert constant == ((2.0, 3.0) if cond != "n1" else (5.0, 7.0))
    _check_both(original, result)
    _, stats = _simplify(original)
    assert stats["applied"]["control_flow/known_condition"] == 1, stats


def test_a_recomputed_condition_is_known_and_a_different_one_is_not() -> None:
    """``Equal(sr, 16000)`` again inside the branch is known; ``Equal(sr, 8000)`` is not."""
    def model(rate: int) -> onnx.ModelProto:
        inner_then, inner_then_out = _scaled("it", [2.0, 3.0])
        inner_else, inner_else_out = _scaled("ie", [5.0, 7.0])
        then = [_const("rate", np.array(rate, np.int64)), helper.make_node("Equal", ["sr", "rate"], ["c2"]),
                helper.make_node("If", ["c2"], ["t_y"], then_branch=_branch("inner_then", inner_then, inner_then_out),
                                 else_branch=_branch("inner_else", inner_else, inner_else_out))]
        if_node = helper.make_node("If", ["c"], ["y"], then_branch=_branch("then", then, ["t_y"]),
                                   else_branch=_branch("else", [helper.make_node("Neg", ["x"], ["e_y"])], ["e_y"]))
        return _model([_const("k", np.array(16000, np.int64)), helper.make_node("Equal", ["sr", "k"], ["c"]),
                       if_node], [_io("x", [2]), _io("sr", [], I64)], [_io("y", [2])])

    for rate, ifs in ((16000, 1), (8000, 2)):
        original = model(rate)
        result = _optimize(original)
        assert _total(result, "If") == ifs, (rate, _scopes(result))
        for sr in SAMPLE_RATES:
            _assert_same(original, result, {"x": np.array([-0.0, 3.0], np.float32), "sr": np.array(sr, np.int64)})


def test_a_shadowing_value_of_the_same_name_is_another_condition() -> None:
    """The then-branch defines its own ``cond`` (the outer name shadowed, which the ONNX checker and
    onnxruntime refuse, and onnx_ir reads by scope): its If is not decided by the outer ``cond``."""
    inner_then, inner_then_out = _scaled("it", [2.0, 3.0])
    inner_else, inner_else_out = _scaled("ie", [5.0, 7.0])
    then = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0), _const("zero", np.array(0.0, np.float32)),
            helper.make_node("Greater", ["s", "zero"], ["cond"]),
            helper.make_node("If", ["cond"], ["t_y"], then_branch=_branch("inner_then", inner_then, inner_then_out),
                             else_branch=_branch("inner_else", inner_else, inner_else_out))]
    original = _if_model(then, ["t_y"], [helper.make_node("Neg", ["x"], ["e_y"])], ["e_y"])
    model = ir.serde.deserialize_model(original)
    pass_ = SimplifyPass()
    pass_(model)
    assert "control_flow/known_condition" not in pass_.stats["applied"], pass_.stats
    assert _total(ir.serde.serialize_model(model), "If") == 2


def test_an_if_in_a_loop_inside_the_branch_is_decided_too() -> None:
    inner_then, inner_then_out = _scaled("it", [2.0, 3.0], x="l_s")
    inner_else, inner_else_out = _scaled("ie", [5.0, 7.0], x="l_s")
    body = helper.make_graph(
        [helper.make_node("If", ["cond"], ["l_s2"], then_branch=_branch("inner_then", inner_then, inner_then_out),
                          else_branch=_branch("inner_else", inner_else, inner_else_out)),
         helper.make_node("Identity", ["l_c"], ["l_c_out"])],
        "body", [_io("l_i", [], I64), _io("l_c", [], B), _io("l_s", [2])], [_io("l_c_out", [], B), _io("l_s2", [2])])
    then = [_const("n", np.array(2, np.int64)), helper.make_node("Loop", ["n", "", "x"], ["t_y"], body=body)]
    original = _if_model(then, ["t_y"], [helper.make_node("Neg", ["x"], ["e_y"])], ["e_y"])
    result = _optimize(original)
    assert _total(result, "If") == 1, _scopes(result)
    _check_both(original, result)


# --- rule 4: an If whose branches are the same ----------------------------------------------------


def test_an_if_with_the_same_branches_takes_one() -> None:
    then, then_out = _scaled("t", [2.0, -0.0])
    other, other_out = _scaled("e", [2.0, -0.0])
    original = _if_model(then, then_out, other, other_out)
    result = _optimize(original)
    assert helpers.ops_recursive(result) == ["Mul"], _scopes(result)
    _check_both(original, result)


@pytest.mark.parametrize("ir_version", [3, None], ids=["constants_stay", "constants_lifted"])
def test_branches_differing_in_the_sign_of_a_zero_are_not_the_same(ir_version) -> None:
    then, then_out = _scaled("t", [2.0, -0.0], "Add")
    other, other_out = _scaled("e", [2.0, 0.0], "Add")
    original = _if_model(then, then_out, other, other_out, ir_version=ir_version)
    result = _optimize(original)
    assert _total(result, "If") == 1
    _check_both(original, result)


def test_random_branches_are_never_the_same() -> None:
    def random(tag: str) -> list[onnx.NodeProto]:
        return [helper.make_node("RandomNormalLike", ["x"], [f"{tag}_y"], seed=1.0)]

    original = _if_model(random("t"), ["t_y"], random("e"), ["e_y"])
    model = ir.serde.deserialize_model(original)
    pass_ = SimplifyPass()
    assert not pass_(model).modified
    assert pass_.stats["declined"]["control_flow/same_branches"] == 1


def test_same_branches_on_a_condition_of_unknown_size_stay() -> None:
    """``If`` fails on a condition that is not one element: taking a branch would hide that."""
    then, then_out = _scaled("t", [2.0, 3.0])
    other, other_out = _scaled("e", [2.0, 3.0])
    if_node = helper.make_node("If", ["cond"], ["y"], then_branch=_branch("then", then, then_out),
                               else_branch=_branch("else", other, other_out))
    original = _model([if_node], [_io("x", [2]), _io("cond", ["n"], B)], [_io("y", [2])])
    result = _optimize(original)
    assert _total(result, "If") == 1
    _assert_same(original, result, {"x": np.array([1.0, 2.0], np.float32), "cond": np.array([True])})


# --- nothing to do ---------------------------------------------------------------------------------


def test_control_flow_with_nothing_to_clean_is_not_modified() -> None:
    then = [helper.make_node("Neg", ["x"], ["t_y"])]
    other = [helper.make_node("Abs", ["x"], ["e_a"]), helper.make_node("Relu", ["e_a"], ["e_y"])]
    original = _if_model(then, ["t_y"], other, ["e_y"])
    model = ir.serde.deserialize_model(original)
    pass_ = SimplifyPass()
    assert not pass_(model).modified and pass_.stats["applied"] == {}
    assert _scopes(ir.serde.serialize_model(model)) == _scopes(original)


def test_below_ir_4_the_sample_rate_model_is_still_resolved_exactly() -> None:
    """Simplify alone (the pipeline's loader raises the IR version): no initializer is made, the decided Ifs
    get Constant conditions in their branches (fold would inline them), and the model computes the same."""
    original = sample_rate_model(ir_version=3, function=False)
    result, stats = _simplify(original)
    assert result.ir_version == 3 and not result.graph.initializer, stats
    assert stats["applied"]["control_flow/known_condition"] == 6, stats
    for sr in SAMPLE_RATES:
        _assert_same(original, result, _feeds(sr))


def test_an_identity_output_whose_input_a_nested_subgraph_reads_goes_without_renaming() -> None:
    """``t_n`` is read inside the inner If: it becomes the branch output under its own name."""
    inner = helper.make_node("If", ["cond"], ["t_i"],
                             then_branch=_branch("inner_then", [helper.make_node("Abs", ["t_n"], ["a"])], ["a"]),
                             else_branch=_branch("inner_else", [helper.make_node("Neg", ["t_n"], ["b"])], ["b"]))
    then = [helper.make_node("Neg", ["x"], ["t_n"]), inner, helper.make_node("Identity", ["t_n"], ["t_y"])]
    if_node = helper.make_node("If", ["cond"], ["y", "z"], then_branch=_branch("then", then, ["t_y", "t_i"]),
                               else_branch=_branch("else", [helper.make_node("Abs", ["x"], ["e_y"]),
                                                            helper.make_node("Neg", ["x"], ["e_z"])], ["e_y", "e_z"]))
    original = _model([if_node], [_io("x", [2]), _io("cond", [], B)], [_io("y", [2]), _io("z", [2])])
    result, _ = _simplify(original)
    branch = next(a.g for a in result.graph.node[0].attribute if a.name == "then_branch")
    assert "Identity" not in [n.op_type for n in branch.node] and branch.output[0].name == "t_n"
    _check_both(original, result)


@pytest.mark.parametrize("sr", SAMPLE_RATES)
def test_simplify_alone_leaves_constant_conditions_that_compute_the_same(sr: int) -> None:
    """Without fold the decided Ifs keep their branches, on a constant condition: still exact."""
    original = sample_rate_model()
    result, stats = _simplify(original)
    assert stats["applied"]["control_flow/known_condition"] == 7, stats  # 6 in the branches, 1 in the function
    assert stats["applied"]["control_flow/same_branches"] == 2, stats
    _assert_same(original, result, _feeds(sr))


@pytest.mark.parametrize("is_input", [False, True], ids=["initializer", "initializer_input"])
def test_a_branch_constant_equal_to_a_main_initializer_uses_it_unless_callers_may_override_it(is_input) -> None:
    then_nodes, then_out = _scaled("t", [2.0, 3.0])
    weight = numpy_helper.from_array(np.array([2.0, 3.0], np.float32), "w")
    extra = [helper.make_node("Mul", ["x", "w"], ["u"])]
    original = _if_model(then_nodes, then_out, [helper.make_node("Neg", ["x"], ["e_y"])], ["e_y"],
                         initializers=[weight], extra=extra)
    original.graph.output.append(_io("u", [2]))
    if is_input:
        original.graph.input.append(_io("w", [2]))
    result, stats = _simplify(original)
    assert _scopes(result)["then"]["Constant"] == 0
    assert len(result.graph.initializer) == (2 if is_input else 1), stats
    feeds = {"x": np.array([-0.0, 3.0], np.float32)}
    for cond in (True, False):
        _assert_same(original, result, {**feeds, "cond": np.array(cond)})
    if is_input:  # a caller's w reaches the main graph's Mul, not the branch
        feeds = {**feeds, "cond": np.array(True), "w": np.array([7.0, 7.0], np.float32)}
        _assert_same(original, result, feeds)
