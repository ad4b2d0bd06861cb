"""The load's check of every tensor and every string field (passes.modelio.tensor_data.check_tensors).

The text is checked by one parse in C of a proto3 copy of onnx.proto, and the tensors are
found by a walk that enters only the fields that can hold one: a bad tensor or a bad string
anywhere (subgraphs, function bodies, sparse tensors, attribute lists) is still refused, with
the same message the walk over every message gave.
"""

from __future__ import annotations

import pathlib

import onnx
import pytest
from onnx import TensorProto, helper

from passes.errors import InputError
from passes.modelio.tensor_data import check_tensors


def _bad(name: str) -> onnx.TensorProto:
    tensor = helper.make_tensor(name, TensorProto.FLOAT, [2], [1.0, 2.0])
    tensor.ClearField("float_data")
    tensor.raw_data = b"\0" * 4  # two floats need 8 bytes
    return tensor


def _good(name: str) -> onnx.TensorProto:
    return helper.make_tensor(name, TensorProto.FLOAT, [1], [1.0])


def _model(*, constant: onnx.TensorProto | None = None, inner_init: onnx.TensorProto | None = None,
           function_value: onnx.TensorProto | None = None, listed: onnx.TensorProto | None = None,
           sparse_values: onnx.TensorProto | None = None, inner_name: str = "inner") -> onnx.ModelProto:
    inner = helper.make_node("Constant", [], ["c"], value=constant or _good("v"), name=inner_name)
    body = helper.make_graph([inner], "body", [], [helper.make_tensor_value_info("c", TensorProto.FLOAT, None)],
                             initializer=[inner_init or _good("i2")])
    branch = helper.make_node("If", ["cond"], ["o"], then_branch=body, else_branch=body)
    custom = helper.make_node("Custom", ["o"], ["p"], domain="dom", alpha=1.0, tensors=[_good("l0"), listed or _good("l1")])
    values = sparse_values or helper.make_tensor("sv", TensorProto.FLOAT, [1], [5.0])
    indices = helper.make_tensor("si", TensorProto.INT64, [1], [0])
    sparse = helper.make_node("Constant", [], ["s"], sparse_value=helper.make_sparse_tensor(values, indices, [3]))
    graph = helper.make_graph([branch, custom, sparse], "g", [helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("p", TensorProto.FLOAT, None)], initializer=[_good("i1")])
    body_f = helper.make_node("Constant", [], ["y"], value=function_value or _good("fv"))
    function = helper.make_function("dom", "F", [], ["y"], [body_f], [helper.make_opsetid("", 18)])
    return helper.make_model(graph, functions=[function], opset_imports=[helper.make_opsetid("", 18),
                                                                         helper.make_opsetid("dom", 1)])


def test_a_valid_model_passes() -> None:
    assert check_tensors(_model(), pathlib.Path(".")) == 0


@pytest.mark.parametrize("where", ["constant", "inner_init", "function_value", "listed", "sparse_values"])
def test_a_bad_tensor_is_refused_wherever_it_is(where: str) -> None:
    model = _model(**{where: _bad(f"bad_{where}")})
    with pytest.raises(InputError, match=f"tensor 'bad_{where}': raw_data has 4 bytes"):
        check_tensors(model, pathlib.Path("."))


@pytest.mark.parametrize("field", ["name", "input"])
def test_a_string_that_is_not_utf8_is_refused_and_named(field: str) -> None:
    model = _model(inner_name="zq")
    model.graph.node[0].attribute[0].g.node[0].input.append("zr")
    bad = onnx.ModelProto()
    bad.ParseFromString(model.SerializeToString().replace(b"zq" if field == "name" else b"zr", b"\xff\xfe"))
    with pytest.raises(InputError, match=f"^NodeProto.{field} is not valid UTF-8 text$"):
        check_tensors(bad, pathlib.Path("."))
