"""modelio.data_files: the external-data files a loaded model's initializers refer to, in a
subgraph too; a model loaded without external data has none, known without a walk of its graphs."""

from __future__ import annotations

import pathlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from passes import modelio
from passes.ir import walk


def _model(tmp_path: pathlib.Path, external: bool) -> pathlib.Path:
    weight = numpy_helper.from_array(np.arange(512, dtype=np.float32), "w")
    body = helper.make_graph([helper.make_node("Add", ["w", "w"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, [512])], initializer=[weight])  # fmt: skip
    branch = helper.make_node("If", ["c"], ["y"], then_branch=body, else_branch=body)
    graph = helper.make_graph([branch], "g", [helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [512])])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    path = tmp_path / "m.onnx"
    if external:
        onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True, location="m.data",
                  size_threshold=0)  # fmt: skip
    else:
        onnx.save(model, path)
    return path


def test_a_subgraph_weight_in_a_data_file_is_found(tmp_path: pathlib.Path) -> None:
    model = modelio.load_model(_model(tmp_path, external=True))
    assert modelio.data_files(model) == {(tmp_path / "m.data").resolve()}


def test_a_model_loaded_without_external_data_has_none_without_a_walk(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = modelio.load_model(_model(tmp_path, external=False))

    def no_walk(model: object) -> list[object]:
        raise AssertionError("walked the graphs")

    monkeypatch.setattr(walk, "graphs", no_walk)
    assert modelio.data_files(model) == set()
