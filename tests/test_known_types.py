"""One inference a run, kept up to date (passes.ir.known): what the table answers is what inference
would find, and it answers nothing once the graph no longer has the types it holds."""

from __future__ import annotations

import pathlib

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import passes
from passes.decompose import DecomposeLogSumExpPass
from passes.ir import inference, known

F32, F64, F16 = TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16


def _chain(shape: list[int], axes: list[int] | None, *, keepdims: int = 1, noop: int = 0, opset: int = 18,
           elem: int = F32, subgraph: bool = False) -> ir.Model:  # fmt: skip
    """z = Neg(ReduceLogSumExp(Relu(x))): the values between are untyped, so the decomposition infers."""
    inits, inputs = [], ["a"]
    attrs = {"keepdims": keepdims}
    if noop:
        attrs["noop_with_empty_axes"] = noop
    if axes is not None and opset >= 18:
        inits.append(numpy_helper.from_array(np.array(axes, dtype=np.int64), "axes"))
        inputs.append("axes")
    elif axes is not None:
        attrs["axes"] = axes
    nodes = [helper.make_node("Relu", ["x"], ["a"]),
             helper.make_node("ReduceLogSumExp", inputs, ["y"], name="lse", **attrs),
             helper.make_node("Neg", ["y"], ["z"])]  # fmt: skip
    if subgraph:
        branch = helper.make_graph([helper.make_node("Identity", ["z"], ["b"])], "b", [],
                                   [helper.make_tensor_value_info("b", elem, None)])  # fmt: skip
        nodes.append(helper.make_node("If", ["c"], ["w"], then_branch=branch, else_branch=branch))
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", elem, shape)]
        + ([helper.make_tensor_value_info("c", TensorProto.BOOL, [])] if subgraph else []),
        [helper.make_tensor_value_info("w" if subgraph else "z", elem, None)], inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    return ir.serde.deserialize_model(model)


def _same_as_inference(model: ir.Model, found: dict) -> None:
    expected = inference.infer_all(model, remember=False)
    assert set(found) == {v for node in model.graph for v in node.outputs if v.name}
    for value, (dtype, shape) in found.items():
        assert expected[value][0] == dtype, value.name
        assert tuple(expected[value][1]) == tuple(shape), value.name


@settings(max_examples=60, deadline=None)
@given(
    shape=st.lists(st.integers(1, 12), min_size=1, max_size=3),
    axes=st.one_of(st.none(), st.lists(st.integers(-3, 2), min_size=0, max_size=3, unique=True)),
    keepdims=st.sampled_from([0, 1]),
    noop=st.sampled_from([0, 1]),
    opset=st.sampled_from([11, 13, 14, 18]),
    elem=st.sampled_from([F32, F64, F16]),
)
def test_the_decomposition_notes_what_inference_would_find(
    shape: list[int], axes: list[int] | None, keepdims: int, noop: int, opset: int, elem: int
) -> None:
    assume(axes is None or all(-len(shape) <= a < len(shape) for a in axes))
    assume(not noop or opset >= 18)
    assume(opset >= 18 or axes != [])  # an empty attribute list: see test_decompose
    model = _chain(shape, axes, keepdims=keepdims, noop=noop, opset=opset, elem=elem)
    known.begin(model)
    result = DecomposeLogSumExpPass()(model)
    assert result.modified
    found = known.lookup(model)
    assert found is not None  # every value: the inferred ones and the ones the decomposition built
    _same_as_inference(model, found)


def test_a_long_sum_in_two_levels_is_noted_too() -> None:
    model = _chain([4, 96, 5], [1], keepdims=1)
    known.begin(model)
    DecomposeLogSumExpPass()(model)
    assert "Reshape" in {n.op_type for n in model.graph}
    found = known.lookup(model)
    assert found is not None
    _same_as_inference(model, found)


def _typed() -> tuple[ir.Model, dict]:
    model = _chain([3, 4], [1])
    known.begin(model)
    found = inference.infer_all(model)
    assert known.lookup(model) == {v: found[v] for v in found}
    return model, found


def test_outside_a_run_nothing_is_kept() -> None:
    model = _chain([3, 4], [1])
    inference.infer_all(model)
    assert known.lookup(model) is None
    known.begin(model)
    known.end(model)
    assert known.lookup(model) is None


def test_an_input_rewired_to_another_shape_fails_the_value_and_what_reads_it() -> None:
    model, _ = _typed()
    relu, lse, _ = list(model.graph)
    other = ir.Value(name="x2", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([5, 4]))
    model.graph.inputs.append(other)
    relu.replace_input_with(0, other)  # a: [3, 4] -> [5, 4], the value kept (as simplify's region rules do)
    assert known.lookup(model) is None


def test_an_input_rewired_to_a_value_of_the_same_type_keeps_the_table() -> None:
    model, _ = _typed()
    relu = next(iter(model.graph))
    other = ir.Value(name="x2", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([3, 4]))
    model.graph.inputs.append(other)
    relu.replace_input_with(0, other)
    assert known.lookup(model) is not None


def test_an_attribute_replaced_fails_the_table() -> None:
    model, _ = _typed()
    lse = list(model.graph)[1]
    lse.attributes["keepdims"] = ir.AttrInt64("keepdims", 1)  # equal, but another attribute: not trusted
    assert known.lookup(model) is None


def test_a_value_retyped_in_place_fails_the_table() -> None:
    model, _ = _typed()
    list(model.graph)[0].outputs[0].type = ir.TensorType(ir.DataType.FLOAT16)  # as --precision retypes
    assert known.lookup(model) is None


def test_a_new_node_not_noted_fails_the_table() -> None:
    model, _ = _typed()
    neg = list(model.graph)[2]
    extra = ir.node("Abs", [neg.outputs[0]])
    model.graph.append(extra)
    assert known.lookup(model) is None
    known.note(model, extra.outputs[0], ir.DataType.FLOAT, (3, 1))
    assert known.lookup(model) is not None


def test_a_node_holding_subgraphs_is_never_trusted() -> None:
    model = _chain([3, 4], [1], subgraph=True)
    known.begin(model)
    inference.infer_all(model)
    assert known.lookup(model) is None


def test_the_types_step_writes_the_same_from_the_table_as_from_inference(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default run on an untyped chain: the same bytes whether the step asks the table or infers."""
    nodes, previous = [], "x"
    ops = ["ReduceLogSumExp", "ReduceMax", "ReduceSum", "ReduceLogSumExp", "ReduceMean"] * 3
    for i, op in enumerate(ops):  # the first sums 70 terms in two levels; the last drops its axis
        nodes.append(helper.make_node(op, [previous], [f"v{i}"], axes=[(i + 1) % 3], keepdims=i + 1 < len(ops)))
        previous = f"v{i}"
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", F32, [6, 70, 3])],
                              [helper.make_tensor_value_info(previous, F32, None)])  # fmt: skip
    source = tmp_path / "chain.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)], ir_version=7), source)
    asked: list[bool] = []
    original = known.lookup

    def spy(model: ir.Model) -> dict | None:
        found = original(model)
        asked.append(found is not None)
        return found

    monkeypatch.setattr(known, "lookup", spy)
    passes.optimize(str(source), output=str(tmp_path / "table.onnx"), check=False)
    assert asked == [True]  # the step took every type from the table
    monkeypatch.setattr(known, "lookup", lambda model: None)
    passes.optimize(str(source), output=str(tmp_path / "inferred.onnx"), check=False)
    assert (tmp_path / "table.onnx").read_bytes() == (tmp_path / "inferred.onnx").read_bytes()
    written = onnx.load(str(tmp_path / "table.onnx"))
    assert len(written.graph.value_info) == len(written.graph.node) - 1  # every intermediate is stated


def test_a_graph_input_given_another_shape_in_place_fails_the_table() -> None:
    model, _ = _typed()
    model.graph.inputs[0].shape = ir.Shape([5, 4])  # the same value, another shape
    assert known.lookup(model) is None
