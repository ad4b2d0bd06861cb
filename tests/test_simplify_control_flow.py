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


def sample_rate_model(ir_version: int | None = None) -> onnx.ModelProto:
    """A voice-activity-detector-like model: nested Ifs on ``sr == 16000``, a Loop, a Scan, a function."""
    nodes = [_const("k16000", np.array(16000, np.int64)),
             helper.make_node("Equal", ["sr", "k16000"], ["c"]),
             helper.make_node("If", ["c"], ["y", "h_out"], then_branch=_rate_branch("r16", 1.0),
                              else_branch=_rate_branch("r8", -2.0)),
             *_loop(), *_scan(),
             helper.make_node("Rate", ["x", "sr"], ["fy"], domain="local")]
    return _model(nodes, [_io("x", [4]), _io("sr", [], I64), _io("h", [4])],
                  [_io("y", [4]), _io("h_out", [4]), _io("loop_s", [4]), _io("scan_acc", [4]),
                   _io("scan_xs", [3, 4]), _io("fy", [4])],
                  functions=[_function()], ir_version=ir_version)


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
