"""Declared negative dims are unknown dims (issue #34, item 5).

onnx-graphsurgeon and tract write an unknown dim as ``-1``; onnxruntime reads
any negative declared size as unknown. The load repairs them into unnamed dims
(a note in the report) on graph inputs, outputs and ``value_info`` of the main
graph, every subgraph and every function; no ``Shape`` folds to a negative
value, also when a model built in memory still holds one; the check generates
inputs for such an input, and ``--inputs`` and ``--input-shape`` take it.
"""

from __future__ import annotations

import pathlib

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import helper as oh, numpy_helper

import helpers
import passes
from passes import modelio, pipeline
from passes.modelio import repair
from passes.verify import plan

F, I64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64
OPSETS = [oh.make_opsetid("", 18)]


def _main() -> onnx.ModelProto:
    """``s = Shape(x)``, ``y = Relu(x)`` with x declared ``[-1, 3]`` (as graphsurgeon writes it)."""
    graph = oh.make_graph(
        [oh.make_node("Shape", ["x"], ["s"]), oh.make_node("Relu", ["x"], ["t"]), oh.make_node("Neg", ["t"], ["y"])],
        "g", [oh.make_tensor_value_info("x", F, [-1, 3])],
        [oh.make_tensor_value_info("s", I64, [2]), oh.make_tensor_value_info("y", F, [-1, 3])],
        value_info=[oh.make_tensor_value_info("t", F, [-1, 3])],
    )  # fmt: skip
    return oh.make_model(graph, opset_imports=OPSETS, ir_version=9)


def _branch() -> onnx.ModelProto:
    """An If whose branch takes ``Shape`` of a value it declares ``[-1, 3]`` (and outputs ``[-1]``)."""
    then = oh.make_graph(
        [oh.make_node("Relu", ["x"], ["t"]), oh.make_node("Shape", ["t"], ["s1"])], "then", [],
        [oh.make_tensor_value_info("s1", I64, [-1])], value_info=[oh.make_tensor_value_info("t", F, [-1, 3])],
    )  # fmt: skip
    other = oh.make_graph([oh.make_node("Shape", ["x"], ["s2"], start=1)], "else", [],
                          [oh.make_tensor_value_info("s2", I64, [-1])])  # fmt: skip
    graph = oh.make_graph(
        [oh.make_node("If", ["c"], ["s"], then_branch=then, else_branch=other)], "g",
        [oh.make_tensor_value_info("c", onnx.TensorProto.BOOL, []), oh.make_tensor_value_info("x", F, [-1, 3])],
        [oh.make_tensor_value_info("s", I64, [-1])],
    )  # fmt: skip
    return oh.make_model(graph, opset_imports=OPSETS, ir_version=9)


def _function() -> onnx.ModelProto:
    """A function ``F(x) = Shape(Relu(x))`` whose body declares ``t = Relu(x)`` as ``[-1, 3]`` (IR 10)."""
    body = [oh.make_node("Relu", ["x"], ["t"]), oh.make_node("Shape", ["t"], ["s"])]
    function = oh.make_function("local", "F", ["x"], ["s"], body, OPSETS)
    function.value_info.append(oh.make_tensor_value_info("t", F, [-1, 3]))
    graph = oh.make_graph([oh.make_node("F", ["x"], ["s"], domain="local")], "g",
                          [oh.make_tensor_value_info("x", F, [-1, 3])], [oh.make_tensor_value_info("s", I64, [2])])
    return oh.make_model(graph, opset_imports=[*OPSETS, oh.make_opsetid("local", 1)], ir_version=10,
                         functions=[function])  # fmt: skip


def _optimize(proto: onnx.ModelProto, tmp_path: pathlib.Path, **options) -> tuple[onnx.ModelProto, pipeline.Report]:
    src, dst = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(proto, src)
    report = pipeline.optimize_file(src, dst, **options)
    assert report.written and report.check is not None and report.check.ok, report.to_json()
    return onnx.load(dst), report


def _negative(model: onnx.ModelProto) -> list[int]:
    """Every negative int in the model's declared dims and initializers' values."""
    found = []
    for graph in [model.graph, *(a.g for n in model.graph.node for a in n.attribute if a.HasField("g"))]:
        for info in [*graph.input, *graph.output, *graph.value_info]:
            found += [d for d in helpers.dims_of(info) if isinstance(d, int) and d < 0]
        found += [v for t in graph.initializer if t.data_type == I64 for v in numpy_helper.to_array(t).ravel() if v < 0]
        found += [v for n in graph.node if n.op_type == "Constant"
                  for v in numpy_helper.to_array(n.attribute[0].t).ravel() if v < 0]  # fmt: skip
    for function in model.functions:
        for info in function.value_info:
            found += [d for d in helpers.dims_of(info) if isinstance(d, int) and d < 0]
    return found


def _same(original: onnx.ModelProto, result: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    for a, b in zip(helpers.ort_run(original, feeds), helpers.ort_run(result, feeds), strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("rows", [1, 4, 0])
def test_a_declared_minus_one_in_the_main_graph_is_an_unknown_dim(tmp_path, rows) -> None:
    proto = _main()
    result, report = _optimize(proto, tmp_path)
    assert any(n.startswith("declared negative dims") and "graph input 'x' [-1, 3]" in n
               and "graph output 'y' [-1, 3]" in n and "graph value 't' [-1, 3]" in n for n in report.notes)  # fmt: skip
    assert "Shape" in helpers.ops_recursive(result)  # not folded: the dim is unknown
    assert _negative(result) == []
    assert helpers.dims_of(result.graph.input[0]) == [None, 3]
    x = np.linspace(-2, 2, rows * 3, dtype=np.float32).reshape(rows, 3)
    _same(proto, result, {"x": x})
    assert helpers.ort_run(result, {"x": x})[0].tolist() == [rows, 3]
    # the check generated x (its dims known, its -1 unknown): a size of 1 and a 0-sized set
    assert report.check.inputs.generated == ["x"] and report.check.inputs.shapes["x"][1] == 3


def test_a_declared_minus_one_in_an_if_branch(tmp_path) -> None:
    proto = _branch()
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    assert sorted(repair.unknown_negative_dims(copy)) == [
        "graph input 'x' [-1, 3]", "graph output 's' [-1]", "subgraph 'else' output 's2' [-1]",
        "subgraph 'then' output 's1' [-1]", "subgraph 'then' value 't' [-1, 3]"]  # fmt: skip
    result, report = _optimize(proto, tmp_path)
    assert any(n.startswith("declared negative dims") and n.endswith(" and 2 more") for n in report.notes)
    assert _negative(result) == []
    for c in (True, False):
        for rows in (1, 5):
            feeds = {"c": np.array(c), "x": np.ones((rows, 3), np.float32)}
            _same(proto, result, feeds)
            assert helpers.ort_run(result, feeds)[0].tolist() == ([rows, 3] if c else [3])


def test_a_declared_minus_one_in_a_function(tmp_path) -> None:
    proto = _function()
    result, report = _optimize(proto, tmp_path)
    assert any("function 'F' value 't' [-1, 3]" in n for n in report.notes)
    assert _negative(result) == []
    for rows in (1, 6):
        feeds = {"x": np.ones((rows, 3), np.float32)}
        _same(proto, result, feeds)
        assert helpers.ort_run(result, feeds)[0].tolist() == [rows, 3]


def test_inputs_and_input_shape_are_taken_for_a_minus_one_dim(tmp_path) -> None:
    proto = _main()
    x = np.arange(12, dtype=np.float32).reshape(4, 3) - 6
    inputs = tmp_path / "x.npz"
    np.savez(inputs, x=x)
    from passes.verify.gate import CheckOptions

    result, report = _optimize(proto, tmp_path, check=CheckOptions(inputs_file=inputs))
    assert report.check.inputs.given == ["x"]
    _same(proto, result, {"x": x})
    result, report = _optimize(proto, tmp_path, input_shapes={"x": (4, 3)})
    assert helpers.dims_of(result.graph.input[0]) == [4, 3]
    assert "Shape" not in helpers.ops_recursive(result)  # static now: folded to [4, 3]
    assert helpers.ort_run(result, {"x": x})[0].tolist() == [4, 3]
    _same(proto, result, {"x": x})


def test_the_check_plans_an_unread_original_with_minus_one_as_unknown() -> None:
    """The check reads the original's file, which keeps its -1: the plan reads it as an unknown dim."""
    specs = plan.input_specs(_main())
    assert specs[0].dims == [None, 3] and specs[0].roles == ["batch", "static"]
    assert plan.declared_output_shapes(_main()) == {"s": [2], "y": [None, 3]}


def test_the_repair_reaches_nested_types_and_leaves_other_dims() -> None:
    seq = oh.make_tensor_sequence_value_info("q", F, [-2, "n", 4])
    graph = oh.make_graph([oh.make_node("SequenceConstruct", ["x"], ["q"])], "g",
                          [oh.make_tensor_value_info("x", F, [-1, "n", 4])], [seq])  # fmt: skip
    proto = oh.make_model(graph, opset_imports=OPSETS)
    assert repair.unknown_negative_dims(proto) == ["graph input 'x' [-1, n, 4]", "graph output 'q' [-2, n, 4]"]
    assert helpers.dims_of(proto.graph.input[0]) == [None, "n", 4]
    dims = proto.graph.output[0].type.sequence_type.elem_type.tensor_type.shape.dim
    assert [d.WhichOneof("value") for d in dims] == [None, "dim_param", "dim_value"]
    assert repair.unknown_negative_dims(proto) == []  # nothing left: the no-op


def test_no_shape_folds_to_a_negative_value_in_a_model_built_in_memory() -> None:
    """A negative dim that reaches the passes without the load (an IR built in memory): fold and
    simplify read it as unknown, never as a size."""
    from passes.fold import ConstantFoldingPass
    from passes.simplify import SimplifyPass

    for build in (_main, _branch, _function):
        proto = build()
        model = ir.serde.deserialize_model(proto)
        ConstantFoldingPass(confirm=False)(model)
        SimplifyPass()(model)
        out = ir.serde.serialize_model(model)
        assert all(v >= 0 for t in out.graph.initializer if t.data_type == I64 for v in numpy_helper.to_array(t).ravel())
        for graph in [out.graph, *(a.g for n in out.graph.node for a in n.attribute if a.HasField("g")),
                      *out.functions]:  # fmt: skip
            for node in graph.node:
                if node.op_type == "Constant":
                    assert (numpy_helper.to_array(node.attribute[0].t) >= 0).all(), node


def test_a_model_without_negative_dims_has_no_such_note(tmp_path) -> None:
    proto = _main()
    for info in [*proto.graph.input, *proto.graph.output, *proto.graph.value_info]:
        for d in info.type.tensor_type.shape.dim:
            if d.dim_value < 0:
                d.dim_param = "batch"
    _, report = _optimize(proto, tmp_path)
    assert not any("negative" in n for n in report.notes)
    assert modelio.model_notes(modelio.load_model(tmp_path / "in.onnx")) == []


@pytest.mark.parametrize("build", [_main, _branch, _function], ids=["main", "branch", "function"])
def test_a_model_built_in_memory_is_repaired_in_place_too(build) -> None:
    """``passes.optimize(ir_model)`` optimises the caller's IR in place: its -1 dims become unknown there
    too (the branch's Shape declared [-1] made the result fail the checker)."""
    proto = build()
    model = ir.serde.deserialize_model(proto)
    out = ir.serde.serialize_model(passes.optimize(model))
    assert _negative(out) == []
    feeds = {"x": np.ones((5, 3), np.float32)} | ({"c": np.array(True)} if build is _branch else {})
    _same(proto, out, feeds)
