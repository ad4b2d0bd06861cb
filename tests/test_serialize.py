"""passes.modelio.serialize writes onnx_ir's bytes exactly, whatever the graph holds.

Each model is built so that one thing the fast path must get right (or hand to onnx_ir) is there:
symbolic and unnamed dims, denotations, doc strings and metadata on nodes, attributes and values,
every attribute kind, absent inputs and trailing unnamed outputs, subgraphs, functions at IR 9 and
10 with reference attributes, quantization annotations; and every model of ``models/``.
"""

from __future__ import annotations

import pathlib

import hypothesis.strategies as st
import numpy as np
import onnx
import onnx_ir as ir
import pytest
from hypothesis import given, settings
from onnx import TensorProto, helper

from passes.modelio import load
from passes.modelio.serialize import serialize_model

REPO = pathlib.Path(__file__).resolve().parent.parent
SAMPLES = sorted((REPO / "models").glob("*.onnx")) + sorted((REPO / "models" / "real").glob("*.onnx"))


def _same(model: ir.Model) -> bytes:
    expected = ir.serde.serialize_model(model).SerializeToString()
    got = serialize_model(model).SerializeToString()
    assert got == expected
    return got


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_the_sample_models(path: pathlib.Path) -> None:
    _same(load.load_model(path))


def _chain(dims: list[int | str | None], *, ir_version: int = 10) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="r", doc_string="a doc"),
        helper.make_node("LeakyRelu", ["a"], ["b"], name="l", alpha=-0.0),
        helper.make_node("Transpose", ["b"], ["c"], name="t", **({"perm": list(range(len(dims)))} if dims else {})),
        helper.make_node("Cast", ["c"], ["d"], name="c", to=TensorProto.FLOAT),
        helper.make_node("Identity", ["d"], ["y"], name="i"),
    ]
    graph = helper.make_graph(nodes, "g", [x], [y], value_info=[
        helper.make_tensor_value_info(v, TensorProto.FLOAT, dims) for v in "abcd"])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=ir_version)


def test_value_info_with_symbols_denotations_doc_strings_and_metadata() -> None:
    model = ir.serde.deserialize_model(_chain(["batch", None, 3]))
    values = {v.name: v for node in model.graph for v in node.outputs}
    values["a"].doc_string = "the first"
    values["b"].metadata_props["k"] = "v"
    values["c"].shape.set_denotation(0, "DATA_BATCH")  # type: ignore[union-attr]
    values["d"].type = ir.TensorType(ir.DataType.FLOAT, denotation="TENSOR")
    next(iter(model.graph)).metadata_props["m"] = "n"
    proto = onnx.ModelProto.FromString(_same(model))
    assert [vi.name for vi in proto.graph.value_info] == ["a", "b", "c", "d"]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.one_of(st.integers(0, 5), st.sampled_from(["n", "m", None])), max_size=4),
       st.lists(st.one_of(st.integers(0, 5), st.sampled_from(["n", "m", None])), max_size=4))
def test_shared_types_are_copied_only_between_equal_types(first: list, second: list) -> None:
    """Values of equal and of different shapes, in either order: each value_info is its own type."""
    model = ir.serde.deserialize_model(_chain(first))
    values = [v for node in model.graph for v in node.outputs][:-1]
    for value, dims in zip(values, [first, second, first, second]):
        value.shape = ir.Shape(dims)
    values[1].dtype = ir.DataType.DOUBLE
    _same(model)


def test_every_attribute_kind_absent_inputs_and_unnamed_outputs() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    nodes = [
        helper.make_node("Custom", ["x", "", "x"], ["a", "", ""], domain="my", name="c", i=-3, f=1e40,
                         s="é", ints=[-1, 2**40], floats=[0.5, -0.0], strings=["a", "b"],
                         t=helper.make_tensor("t", TensorProto.INT64, [2], [1, 2])),
        helper.make_node("Clip", ["x", "", ""], ["b"], name=""),
    ]
    nodes[0].attribute[0].doc_string = "an attribute doc"
    graph = helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("b", TensorProto.FLOAT, [2])])
    model = ir.serde.deserialize_model(helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 18), helper.make_opsetid("my", 1)]))  # fmt: skip
    proto = onnx.ModelProto.FromString(_same(model))
    assert list(proto.graph.node[0].output) == ["a"]
    assert list(proto.graph.node[0].input) == ["x", "", "x"]


def _with_function(ir_version: int) -> onnx.ModelProto:
    body = [helper.make_node("Relu", ["u"], ["r"]), helper.make_node("LeakyRelu", ["r"], ["w"])]
    ref = helper.AttributeProto(name="alpha", type=helper.AttributeProto.FLOAT, ref_attr_name="a")
    body[1].attribute.append(ref)
    function = helper.make_function("f", "F", ["u"], ["w"], body, [helper.make_opsetid("", 18)], attributes=["a"])
    then = helper.make_graph([helper.make_node("Neg", ["x"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2])])  # fmt: skip
    other = helper.make_graph([helper.make_node("Abs", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2])])  # fmt: skip
    nodes = [
        helper.make_node("F", ["x"], ["y0"], domain="f", a=0.5),
        helper.make_node("If", ["c"], ["y1"], then_branch=then, else_branch=other),
        helper.make_node("Add", ["y0", "y1"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
                                           helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
                              value_info=[helper.make_tensor_value_info("y0", TensorProto.FLOAT, [2])])  # fmt: skip
    return helper.make_model(graph, functions=[function], ir_version=ir_version,
                             opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("f", 1)])  # fmt: skip


@pytest.mark.parametrize("ir_version", [9, 10])
def test_subgraphs_functions_and_reference_attributes(ir_version: int) -> None:
    model = ir.serde.deserialize_model(_with_function(ir_version))
    function = next(iter(model.functions.values()))
    for node in function:
        for value in node.outputs:
            value.type, value.shape = ir.TensorType(ir.DataType.FLOAT), ir.Shape([2])  # IR 9: in the main graph
    _same(model)


def test_quantization_annotations_keep_onnx_irs_order() -> None:
    proto = _chain([2])
    for name in ("x", "b", "y"):
        annotation = proto.graph.quantization_annotation.add()
        annotation.tensor_name = name
        annotation.quant_parameter_tensor_names.add(key="SCALE_TENSOR", value=f"{name}_scale")
    model = ir.serde.deserialize_model(proto)
    assert [a.tensor_name for a in onnx.ModelProto.FromString(_same(model)).graph.quantization_annotation] == [
        "x", "b", "y"]  # fmt: skip


def test_initializers_and_an_empty_graph() -> None:
    weight = helper.make_tensor("w", TensorProto.FLOAT, [2], np.array([1, 2], np.float32))
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], [weight])  # fmt: skip
    _same(ir.serde.deserialize_model(helper.make_model(graph)))
    empty = helper.make_graph([], "e", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])])  # fmt: skip
    _same(ir.serde.deserialize_model(helper.make_model(empty)))
