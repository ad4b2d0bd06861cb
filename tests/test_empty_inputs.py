"""Absent optional inputs (``""``) survive every pass where a later input or the op's arity needs them.

A node may leave an optional input out by giving ``""`` in its place:
``Loop(M, "")`` (a trip count, no condition, only scan outputs),
``Clip(x, "", max)``, ``Resize(x, "", scales)``, ``Pad(x, pads, "", axes)``.
An absent input at the end may be dropped only where the schema makes that
position optional on its own (:func:`passes.ir.schemas.kept_input_count`):
``Loop(M, "")`` without loop-carried values needs both (Loop takes at least
two inputs), ``Clip(x, min, "")`` is ``Clip(x, min)``. onnx_ir's dead-node
removal dropped every absent input at a node's end, so ``Loop(M, "")`` became
``Loop(M)`` and the run ended in an internal error (opset 18) or an upgrade
refusal (opset 13). Each model runs through every pass and is compared in
onnxruntime (optimisations disabled) bit for bit, in the main graph, an If
branch (decided and not) and a function; the written nodes are inspected.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

import helpers
import passes
from passes.cleanup import RemoveUnusedNodesPass
from passes.ir.schemas import kept_input_count

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _io(name: str, elem: int, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _m3(name: str = "M") -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=helper.make_tensor(f"{name}_v", I64, [], [3]))


def _scan_body(source: str) -> onnx.GraphProto:
    """A body with no loop-carried value: each iteration emits ``source * i``."""
    nodes = [helper.make_node("Identity", ["c"], ["c_out"]),
             helper.make_node("Cast", ["i"], ["fi"], to=F),
             helper.make_node("Mul", [source, "fi"], ["s_out"])]  # fmt: skip
    return helper.make_graph(nodes, "body", [_io("i", I64, []), _io("c", B, [])],
                             [_io("c_out", B, []), _io("s_out", F, [2])])  # fmt: skip


def _carried_body() -> onnx.GraphProto:
    """A body with one loop-carried value doubled each iteration."""
    nodes = [helper.make_node("Identity", ["c"], ["c_out"]), helper.make_node("Add", ["v_in", "v_in"], ["v_out"])]
    return helper.make_graph(nodes, "body", [_io("i", I64, []), _io("c", B, []), _io("v_in", F, [2])],
                             [_io("c_out", B, []), _io("v_out", F, [2])])  # fmt: skip


def _loop(kind: str, source: str, out: str) -> onnx.NodeProto:
    if kind == "scan":  # Loop(M, ""): the "" is needed, nothing follows it
        return helper.make_node("Loop", ["M", ""], [out], body=_scan_body(source))
    return helper.make_node("Loop", ["M", "", source], [out], body=_carried_body())


def _out_shape(kind: str) -> list:
    return [None, 2] if kind == "scan" else [2]


def _model(nodes, inputs, outputs, opset: int, functions=(), initializers=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    imports = [helper.make_opsetid("", opset)] + ([helper.make_opsetid("local", 1)] if functions else [])
    return helper.make_model(graph, opset_imports=imports, functions=list(functions))


def loop_main(kind: str, opset: int) -> onnx.ModelProto:
    """The trip count is a graph input: nothing folds the Loop."""
    return _model([_loop(kind, "x", "y")], [_io("x", F, [2]), _io("M", I64, [])], [_io("y", F, _out_shape(kind))], opset)


def loop_constant_trip(kind: str, opset: int) -> onnx.ModelProto:
    return _model([_m3(), _loop(kind, "x", "y")], [_io("x", F, [2])], [_io("y", F, _out_shape(kind))], opset)


def loop_in_branch(kind: str, opset: int, decided: bool = False) -> onnx.ModelProto:
    then = helper.make_graph([_m3(), _loop(kind, "x", "yb")], "then", [], [_io("yb", F, [None, 2] if kind == "scan" else [2])])
    other = helper.make_graph([helper.make_node("Mul", ["x", "x"], ["ye"])], "else", [], [_io("ye", F, [2])])
    if_node = helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other)
    if decided:  # simplify resolves the If and the Loop moves into the main graph
        cond = helper.make_node("Constant", [], ["cond"], value=helper.make_tensor("cv", B, [], [True]))
        return _model([cond, if_node], [_io("x", F, [2])], [_io("y", F, _out_shape(kind))], opset)
    return _model([if_node], [_io("x", F, [2]), _io("cond", B, [])], [_io("y", F, [None] * (2 if kind == "scan" else 1))], opset)


def loop_in_function(kind: str, opset: int) -> onnx.ModelProto:
    body = [_m3(), _loop(kind, "fx", "fy")]
    function = helper.make_function("local", "F", ["fx"], ["fy"], body, [helper.make_opsetid("", opset)])
    call = helper.make_node("F", ["x"], ["y"], domain="local")
    return _model([call], [_io("x", F, [2])], [_io("y", F, _out_shape(kind))], opset, functions=[function])


def single_op(op_type: str, inputs: list[str], opset: int, **attributes) -> onnx.ModelProto:
    """``op_type`` on the graph input ``x``; its other inputs are initializers (or "")."""
    init = {
        "mn": helper.make_tensor("mn", F, [], [-0.5]),
        "mx": helper.make_tensor("mx", F, [], [0.5]),
        "scales": helper.make_tensor("scales", F, [4], [1, 1, 2, 2]),
        "pads": helper.make_tensor("pads", I64, [2], [1, 2]),
        "axes": helper.make_tensor("axes", I64, [1], [-1]),
    }
    node = helper.make_node(op_type, inputs, ["y"], **attributes)
    x_shape, y_shape = {"Resize": ([1, 1, 2, 3], [1, 1, 4, 6]), "Pad": ([2, 3], [2, 6])}.get(op_type, ([2, 3], [2, 3]))
    used = [init[name] for name in inputs if name in init]
    return _model([node], [_io("x", F, x_shape)], [_io("y", F, y_shape)], opset, initializers=used)


def _feeds(model: onnx.ModelProto, rng: np.random.Generator) -> dict[str, np.ndarray]:
    feeds = {}
    for value in model.graph.input:
        elem = value.type.tensor_type.elem_type
        dims = [d.dim_value for d in value.type.tensor_type.shape.dim]
        if elem == I64:
            feeds[value.name] = np.array(3, np.int64)
        elif elem == B:
            feeds[value.name] = np.array(True)
        else:
            array = rng.standard_normal(dims).astype(np.float32)
            array.flat[0] = -0.0  # the sign of zero must survive
            feeds[value.name] = array
    return feeds


def _all_nodes(model: onnx.ModelProto):
    def walk(graph_nodes):
        for node in graph_nodes:
            yield node
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    yield from walk(attr.g.node)
    yield from walk(model.graph.node)
    for function in model.functions:
        yield from walk(function.node)


CASES = {
    **{f"{name}-{kind}-{opset}": (build, kind, opset)
       for name, build in [("main", loop_main), ("constant_trip", loop_constant_trip), ("branch", loop_in_branch),
                           ("decided_branch", lambda k, o: loop_in_branch(k, o, decided=True)),
                           ("function", loop_in_function)]
       for kind in ("scan", "carried") for opset in (13, 18)},
}  # fmt: skip

SINGLE = {
    "clip-no-min-13": ("Clip", ["x", "", "mx"], 13, {}),
    "clip-no-min-18": ("Clip", ["x", "", "mx"], 18, {}),
    "resize-no-roi-13": ("Resize", ["x", "", "scales"], 13, {"mode": "nearest"}),
    "resize-no-roi-18": ("Resize", ["x", "", "scales"], 18, {"mode": "nearest"}),
    "pad-no-value-18": ("Pad", ["x", "pads", "", "axes"], 18, {}),
}


def _optimized(proto: onnx.ModelProto) -> onnx.ModelProto:
    result = passes.optimize(proto, check=False)
    onnx.checker.check_model(result, full_check=True)
    return result


def _same_in_onnxruntime(original: onnx.ModelProto, result: onnx.ModelProto, **feeds_override) -> None:
    feeds = {**_feeds(original, np.random.default_rng(0)), **feeds_override}
    for want, got in zip(helpers.ort_run(original, feeds), helpers.ort_run(result, feeds), strict=True):
        np.testing.assert_array_equal(got, want, strict=True)
        assert np.array_equal(np.signbit(got), np.signbit(want))


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_loop_without_condition_keeps_its_empty_input(case: str) -> None:
    build, kind, opset = CASES[case]
    original = build(kind, opset)
    onnx.checker.check_model(original, full_check=True)
    result = _optimized(original)
    loops = [n for n in _all_nodes(result) if n.op_type == "Loop"]
    assert loops, "the Loop is gone"
    for loop in loops:
        assert loop.input[1] == "", loop.input
        assert len(loop.input) == (2 if kind == "scan" else 3), loop.input
    conditions = [{"cond": np.array(v)} for v in (True, False)] if "cond" in {i.name for i in original.graph.input} else [{}]
    for feeds in conditions:
        _same_in_onnxruntime(original, result, **feeds)


@pytest.mark.parametrize("case", list(SINGLE), ids=list(SINGLE))
def test_empty_input_in_the_middle_stays_in_place(case: str) -> None:
    op_type, inputs, opset, attributes = SINGLE[case]
    original = single_op(op_type, inputs, opset, **attributes)
    onnx.checker.check_model(original, full_check=True)
    result = _optimized(original)
    (node,) = [n for n in _all_nodes(result) if n.op_type == op_type]
    position = inputs.index("")
    assert node.input[position] == "" and len(node.input) == len(inputs), node.input
    assert all(node.input[i] for i in range(len(inputs)) if i != position), node.input
    _same_in_onnxruntime(original, result)


def test_an_empty_input_at_the_end_goes_where_the_schema_allows() -> None:
    original = single_op("Clip", ["x", "mn", ""], 18)
    model = ir.from_proto(original)
    assert RemoveUnusedNodesPass()(model).modified
    (node,) = model.graph
    assert [v.name for v in node.inputs] == ["x", "mn"]
    assert not RemoveUnusedNodesPass()(model).modified  # idempotent
    _same_in_onnxruntime(original, ir.to_proto(model))


def test_cleanup_keeps_a_loop_with_only_absent_inputs_and_reports_no_change() -> None:
    model = ir.from_proto(loop_main("scan", 18))
    assert not RemoveUnusedNodesPass()(model).modified
    (loop,) = model.graph
    assert len(loop.inputs) == 2 and loop.inputs[1] is None


@pytest.mark.parametrize(
    ("op_type", "inputs", "domain", "kept"),
    [
        ("Loop", ["M", None], "", 2),  # Loop takes at least two inputs
        ("Loop", ["M", None, "v", None], "", 4),  # a variadic list keeps its length
        ("Clip", ["x", None, None], "", 1),
        ("Clip", ["x", None, "mx"], "", 3),
        ("Pad", ["x", "pads", None, None], "", 2),
        ("Concat", ["a", None], "", 2),
        ("Custom", ["x", None], "com.example", 2),  # no schema: the arity is unknown
    ],
)
def test_kept_input_count_follows_the_schema(op_type, inputs, domain, kept) -> None:
    assert kept_input_count(inputs, op_type, 18, domain) == kept


def test_the_command_writes_a_loop_without_condition(tmp_path) -> None:
    source = tmp_path / "loop.onnx"
    original = loop_main("scan", 13)
    onnx.save(original, source)
    before = source.read_bytes()
    proc = helpers.optimize_command(str(source), "-o", "out.onnx", "-q", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert source.read_bytes() == before
    result = onnx.load(tmp_path / "out.onnx")
    (loop,) = [n for n in result.graph.node if n.op_type == "Loop"]
    assert list(loop.input) == ["M", ""]
    _same_in_onnxruntime(original, result)
