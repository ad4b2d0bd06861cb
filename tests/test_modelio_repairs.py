"""Models onnxruntime runs and the ONNX checker refuses, repaired at load without changing meaning
(issue #29, item 5): graph inputs/outputs without a ``shape`` field, nodes out of topological order
(main graph and subgraphs), an empty graph name. Each repair is a note in the report; every other
checker failure stays a refusal that names the value or node at fault.
"""

from __future__ import annotations

import pathlib

import numpy as np
import onnx
import pytest
from onnx import helper as oh, numpy_helper

import helpers
from passes import modelio, pipeline
from passes.errors import InputError
from passes.modelio import repair

F = onnx.TensorProto.FLOAT


def _model(nodes, inputs, outputs, *, name: str = "g", initializers=()) -> onnx.ModelProto:
    graph = oh.make_graph(nodes, name, inputs, outputs, initializer=list(initializers))
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=8)


def _optimize(proto: onnx.ModelProto, tmp_path: pathlib.Path) -> tuple[onnx.ModelProto, list[str]]:
    src, dst = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(proto, src)
    report = pipeline.optimize_file(src, dst)
    assert report.written and report.check is not None and report.check.ok, report.to_json()
    return onnx.load(dst), report.notes


def _same_bits(original: onnx.ModelProto, result: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    for a, b in zip(helpers.ort_run(original, feeds), helpers.ort_run(result, feeds), strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.tobytes() == b.tobytes()


EDGES = np.array([0.0, -0.0, 1.5, -2.0, np.inf, -np.inf, np.nan], np.float32)


# --- a missing shape field --------------------------------------------------------------------------


def test_inputs_and_outputs_without_a_shape_field_are_an_unknown_shape(tmp_path) -> None:
    """As onnx-graphsurgeon and ``make_tensor_value_info(name, T, None)`` write them: any rank runs, before
    and after (no shape field is "any rank", which no written shape can say: it stays as it was)."""
    proto = _model([oh.make_node("Abs", ["x"], ["t"]), oh.make_node("Neg", ["t"], ["y"])],
                   [oh.make_tensor_value_info("x", F, None)], [oh.make_tensor_value_info("y", F, None)])  # fmt: skip
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(proto)
    result, notes = _optimize(proto, tmp_path)
    assert "graph input 'x' declares no shape: read as an unknown shape" in notes
    assert "graph output 'y' declares no shape: read as an unknown shape" in notes
    assert not result.graph.input[0].type.tensor_type.HasField("shape")
    for x in (EDGES, EDGES.reshape(7, 1, 1)):
        _same_bits(proto, result, {"x": x})


def test_a_shapeless_input_with_a_shape_conflict_elsewhere_is_still_checked(tmp_path) -> None:
    """The structural check sees the field; strict inference still runs (an int64 into Abs of float out)."""
    proto = _model([oh.make_node("Abs", ["x"], ["y"])], [oh.make_tensor_value_info("x", F, None)],
                   [oh.make_tensor_value_info("y", onnx.TensorProto.INT64, None)])  # fmt: skip
    src = tmp_path / "in.onnx"
    onnx.save(proto, src)
    with pytest.raises(InputError, match="invalid model"):
        modelio.load_model(src)


# --- nodes out of order ---------------------------------------------------------------------------


def _unsorted(branch: bool = True) -> onnx.ModelProto:
    """Main graph: the If comes before the Sign whose output its branch reads; the branch (if ``branch``):
    Neg before the Abs it reads."""
    z = oh.make_tensor_value_info("z", F, [7])
    body = [oh.make_node("Neg", ["u"], ["z"], name="neg"), oh.make_node("Abs", ["t"], ["u"], name="abs")]
    then = oh.make_graph(body if branch else body[::-1], "then", [], [z])
    other = oh.make_graph([oh.make_node("Identity", ["t"], ["z"], name="id")], "else", [], [z])
    nodes = [oh.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other, name="if"),
             oh.make_node("Sign", ["x"], ["t"], name="sign"),
             oh.make_node("ReduceSum", ["t"], ["s"], keepdims=0, name="sum"),
             oh.make_node("Greater", ["s", "zero"], ["c"], name="greater")]  # fmt: skip
    return _model(nodes, [oh.make_tensor_value_info("x", F, [7])], [oh.make_tensor_value_info("y", F, [7])],
                  initializers=[numpy_helper.from_array(np.float32(0), "zero")])  # fmt: skip


def test_nodes_out_of_order_are_sorted(tmp_path) -> None:
    """onnxruntime sorts a main graph itself (it refuses an unsorted subgraph: see the next test)."""
    proto = _unsorted(branch=False)
    with pytest.raises(onnx.checker.ValidationError, match="topologically sorted"):
        onnx.checker.check_model(proto)
    result, notes = _optimize(proto, tmp_path)
    assert notes == ["the nodes of the main graph were not in topological order: sorted (stable)"]
    onnx.checker.check_model(result, full_check=True)
    for x in (EDGES, -EDGES, np.abs(EDGES)):
        _same_bits(proto, result, {"x": x})


def test_a_subgraph_out_of_order_is_sorted_too(tmp_path) -> None:
    proto = _unsorted()
    src, dst = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(proto, src)
    report = pipeline.optimize_file(src, dst)  # not checked: onnxruntime refuses the original
    assert "the nodes of subgraph 'then' were not in topological order: sorted (stable)" in report.notes
    result = onnx.load(dst)
    onnx.checker.check_model(result, full_check=True)
    for x in (EDGES, -EDGES, np.abs(EDGES)):
        expected = np.negative(np.abs(np.sign(x))) if np.sign(x).sum() > 0 else np.sign(x)
        np.testing.assert_array_equal(helpers.ort_run(result, {"x": x})[0], expected)


def test_the_sort_is_stable_and_leaves_a_sorted_graph_alone() -> None:
    proto = _unsorted()
    assert repair.repair(proto) == ["the nodes of subgraph 'then' were not in topological order: sorted (stable)",
                                    "the nodes of the main graph were not in topological order: sorted (stable)"]
    assert [n.name for n in proto.graph.node] == ["sign", "sum", "greater", "if"]  # the If waits for its reads
    assert repair.repair(proto) == []  # the no-op case


def test_a_cycle_is_not_sorted_and_is_refused_naming_the_node(tmp_path) -> None:
    proto = _model([oh.make_node("Abs", ["b"], ["a"], name="first"), oh.make_node("Neg", ["a"], ["b"], name="second")],
                   [oh.make_tensor_value_info("x", F, [2])], [oh.make_tensor_value_info("a", F, [2])])  # fmt: skip
    src = tmp_path / "in.onnx"
    onnx.save(proto, src)
    with pytest.raises(InputError, match="topologically sorted.*first"):
        modelio.load_model(src)


# --- an empty graph name --------------------------------------------------------------------------


def test_an_empty_main_graph_name_gets_one(tmp_path) -> None:
    proto = _model([oh.make_node("Neg", ["x"], ["y"])], [oh.make_tensor_value_info("x", F, [7])],
                   [oh.make_tensor_value_info("y", F, [7])], name="")  # fmt: skip
    result, notes = _optimize(proto, tmp_path)
    assert notes == ["the main graph had an empty name: named 'main_graph'"]
    assert result.graph.name == "main_graph"
    onnx.checker.check_model(result, full_check=True)
    _same_bits(proto, result, {"x": EDGES})


def test_a_model_needing_no_repair_has_no_note(tmp_path) -> None:
    proto = _model([oh.make_node("Neg", ["x"], ["y"])], [oh.make_tensor_value_info("x", F, [7])],
                   [oh.make_tensor_value_info("y", F, [7])])  # fmt: skip
    _, notes = _optimize(proto, tmp_path)
    assert notes == []


# --- what stays refused ---------------------------------------------------------------------------


def test_other_checker_failures_stay_refusals_and_name_the_value_cut_short(tmp_path) -> None:
    """An output with no element type: refused, naming the output, its 2 MB name cut to ~100 characters."""
    name = "y" * 2_000_000
    output = onnx.ValueInfoProto(name=name)
    output.type.tensor_type.shape.SetInParent()
    proto = _model([oh.make_node("Neg", ["x"], [name])], [oh.make_tensor_value_info("x", F, [7])], [output])
    src = tmp_path / "in.onnx"
    onnx.save(proto, src)
    with pytest.raises(InputError) as raised:
        modelio.load_model(src)
    message = str(raised.value)
    assert "graph output 'yyyy" in message and "elem_type" in message, message[:500]
    assert len(message) < 600, len(message)


# --- a small sparse Constant (not a repair: read densely, the same tensor) -------------------------


def test_a_small_sparse_constant_in_an_if_branch_is_made_dense(tmp_path) -> None:
    values = numpy_helper.from_array(np.array([1.5, -0.0], np.float32), "sp")
    sparse = oh.make_sparse_tensor(values, numpy_helper.from_array(np.array([1, 2], np.int64), "idx"), [3])
    z = oh.make_tensor_value_info("z", F, [3])
    then = oh.make_graph([oh.make_node("Constant", [], ["c"], sparse_value=sparse),
                          oh.make_node("Mul", ["x", "c"], ["z"])], "then", [], [z])  # fmt: skip
    other = oh.make_graph([oh.make_node("Identity", ["x"], ["z"])], "else", [], [z])
    proto = _model([oh.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other)],
                   [oh.make_tensor_value_info("cond", onnx.TensorProto.BOOL, []),
                    oh.make_tensor_value_info("x", F, [3])], [oh.make_tensor_value_info("y", F, [3])])  # fmt: skip
    result, _ = _optimize(proto, tmp_path)
    assert "sparse_value" not in str(result.graph)
    for x in (np.array([np.inf, -2.0, np.nan], np.float32), np.array([0.0, -0.0, np.inf], np.float32)):
        _same_bits(proto, result, {"cond": np.array(True), "x": x})


# --- a declared shape the folded graph contradicts ------------------------------------------------


def _declared_rank_2(branch: bool) -> onnx.ModelProto:
    """``Neg(Reshape(x, Compress(t, keep)))``: the target is [2, 3, 4] once folded (onnx's inference cannot
    see through the Compress before), the output is declared [a, b]."""
    nodes = [oh.make_node("Compress", ["t", "keep"], ["ks"], axis=0), oh.make_node("Reshape", ["x", "ks"], ["r"]),
             oh.make_node("Neg", ["r"], ["y"])]  # fmt: skip
    consts = [numpy_helper.from_array(np.array([2, 9, 3, 4], np.int64), "t"),
              numpy_helper.from_array(np.array([1, 0, 1, 1], bool), "keep")]  # fmt: skip
    y = oh.make_tensor_value_info("y", F, ["a", "b"])
    inputs = [oh.make_tensor_value_info("x", F, [24])]
    if branch:
        body = [oh.make_node("Constant", [], [c.name], value=c) for c in consts] + nodes
        then = oh.make_graph(body, "then", [], [y])
        four_by_six = numpy_helper.from_array(np.array([4, 6], np.int64), "s")
        other = oh.make_graph([oh.make_node("Constant", [], ["s"], value=four_by_six),
                               oh.make_node("Reshape", ["x", "s"], ["y"])], "else", [], [y])  # fmt: skip
        nodes, consts = [oh.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other)], []
        inputs.insert(0, oh.make_tensor_value_info("cond", onnx.TensorProto.BOOL, []))
        y = oh.make_tensor_value_info("y", F, None)  # the If's output: any rank (each branch its own)
    proto = _model(nodes, inputs, [y], initializers=consts)
    if not branch:
        onnx.checker.check_model(proto, full_check=True)
    return proto


def test_a_declared_output_rank_the_folded_reshape_contradicts_is_corrected(tmp_path) -> None:
    proto = _declared_rank_2(branch=False)
    result, notes = _optimize(proto, tmp_path)
    assert notes == ["output 'y' was declared ['a', 'b'] but the graph computes [2, 3, 4]: "
                     "declared [2, 3, 4] in the output"]  # fmt: skip
    onnx.checker.check_model(result, full_check=True)
    _same_bits(proto, result, {"x": np.tile(EDGES, 4)[:24]})


def test_a_declared_branch_output_rank_is_corrected_too(tmp_path) -> None:
    proto = _declared_rank_2(branch=True)
    result, _ = _optimize(proto, tmp_path)
    with repair.shape_fields_present(result):
        onnx.checker.check_model(result)
    onnx.shape_inference.infer_shapes(result, check_type=True, strict_mode=True)  # the branch's declaration fixed
    for cond in (True, False):
        _same_bits(proto, result, {"cond": np.array(cond), "x": np.tile(EDGES, 4)[:24]})


def test_repairs_apply_to_a_model_with_external_data(tmp_path) -> None:
    """The checker reads such a model through its file, which is not repaired: it checks the repaired model
    without its external tensors instead (their data was checked at load)."""
    weight = numpy_helper.from_array(np.arange(4096, dtype=np.float32), "w")
    proto = _model([oh.make_node("Neg", ["t"], ["y"]), oh.make_node("Add", ["x", "w"], ["t"])],
                   [oh.make_tensor_value_info("x", F, None)], [oh.make_tensor_value_info("y", F, None)], name="",
                   initializers=[weight])  # fmt: skip
    src, dst = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save_model(proto, src, save_as_external_data=True, location="in.data", size_threshold=0)
    report = pipeline.optimize_file(src, dst)
    assert report.written and report.check.ok, report.to_json()
    assert len(report.notes) == 4, report.notes  # named, sorted, an input and an output without a shape
    x = np.tile(EDGES, 586)[:4096]
    expected = helpers.ort_run(str(src), {"x": x})[0]
    assert expected.tobytes() == helpers.ort_run(str(dst), {"x": x})[0].tobytes()


def test_a_refusal_names_the_node_at_fault_not_an_if_before_it(tmp_path) -> None:
    """Checked alone, an If whose branch reads an outer value looks invalid: it is not the one named."""
    z = oh.make_tensor_value_info("z", F, [7])
    then = oh.make_graph([oh.make_node("Neg", ["x"], ["z"])], "then", [], [z])
    nodes = [oh.make_node("If", ["c"], ["y"], then_branch=then, else_branch=then, name="if"),
             oh.make_node("Relu", ["x"], ["r"], name="bad_relu", not_an_attribute=1)]  # fmt: skip
    proto = _model(nodes, [oh.make_tensor_value_info("c", onnx.TensorProto.BOOL, []),
                           oh.make_tensor_value_info("x", F, [7])],
                   [oh.make_tensor_value_info("y", F, [7]), oh.make_tensor_value_info("r", F, [7])])  # fmt: skip
    src = tmp_path / "in.onnx"
    onnx.save(proto, src)
    with pytest.raises(InputError, match="Relu node 'bad_relu'"):
        modelio.load_model(src)
