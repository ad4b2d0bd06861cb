"""``--precision`` where nothing can take the half type: the model is left as it is, the report says
why, and neither the search (its onnxruntime runs, its copies of the model) nor a decode of a large
attribute list happens."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

from helpers import ort_run
from passes import cli
from passes.modelio import detach
from passes.precision import PrecisionPass


def trees(count: int, seed: int = 0) -> onnx.ModelProto:
    """A TreeEnsembleClassifier of ``count`` one-split trees on random features and thresholds (its
    type constraint T1 has no float16), then an ArgMax-free int64 label and float32 scores."""
    rng = np.random.default_rng(seed)
    per = 3  # a branch and two leaves
    tree_ids = np.repeat(np.arange(count), per)
    node_ids = np.tile(np.arange(per), count)
    features = np.repeat(rng.integers(0, 4, count), per)
    values = np.repeat(rng.standard_normal(count).astype(np.float32), per)
    leaf = np.tile([False, True, True], count)
    node = helper.make_node(
        "TreeEnsembleClassifier", ["x"], ["label", "scores"], domain="ai.onnx.ml",
        classlabels_int64s=[0, 1],
        nodes_treeids=tree_ids.tolist(), nodes_nodeids=node_ids.tolist(), nodes_featureids=features.tolist(),
        nodes_values=values.tolist(), nodes_modes=["LEAF" if x else "BRANCH_LEQ" for x in leaf],
        nodes_truenodeids=np.tile([1, 0, 0], count).tolist(), nodes_falsenodeids=np.tile([2, 0, 0], count).tolist(),
        nodes_hitrates=[1.0] * (per * count), nodes_missing_value_tracks_true=[0] * (per * count),
        class_treeids=np.repeat(np.arange(count), 2).tolist(), class_nodeids=np.tile([1, 2], count).tolist(),
        class_ids=np.tile([1, 1], count).tolist(), class_weights=rng.random(2 * count).astype(np.float32).tolist(),
        post_transform="NONE",
    )  # fmt: skip
    graph = helper.make_graph([node], "trees", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("label", TensorProto.INT64, ["N"]),
                               helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", 2])])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])
    model.ir_version = 8
    return model


def _run(tmp_path: pathlib.Path, model: onnx.ModelProto, *flags: str) -> tuple[pathlib.Path, pathlib.Path, dict]:
    source, target, report = tmp_path / "m.onnx", tmp_path / f"m{len(flags)}.onnx", tmp_path / "r.json"
    if not source.exists():
        onnx.save_model(model, str(source))
    assert cli.main([str(source), "-o", str(target), "-q", "--report", str(report), *flags]) == 0
    return source, target, json.loads(report.read_text())


def test_a_tree_ensemble_is_left_as_it_is_and_the_report_says_why(tmp_path: pathlib.Path) -> None:
    model = trees(50)
    source, plain, _ = _run(tmp_path, model)
    _, half, report = _run(tmp_path, model, "--precision", "fp16")
    assert half.read_bytes() == plain.read_bytes()
    (run,) = [p for p in report["passes"] if p["name"] == "precision"]
    assert not run["modified"] and not run["stats"]["applied"]
    assert run["stats"]["check_rounds"] == 0  # no search: the model was never checked in the half type
    skipped = run["stats"]["skipped"]
    assert "TreeEnsembleClassifier" in skipped and "tensor(float16)" in skipped, skipped
    assert report["check"]["ok"]  # the run's own check, of a float32 model
    x = np.random.default_rng(1).standard_normal((8, 4)).astype(np.float32)
    for expected, actual in zip(ort_run(str(source), {"x": x}), ort_run(str(half), {"x": x})):
        np.testing.assert_array_equal(actual, expected)


def test_a_lone_node_after_the_trees_stays_float32_and_two_convert() -> None:
    """The no-op decision is exact, not a shortcut for models with trees: an Add alone after the
    scores stays float32 (convert leaves a half node between float32 ones) and the report says so;
    an Add then a Mul convert."""
    model = trees(5)
    model.graph.node.append(helper.make_node("Add", ["scores", "scores"], ["doubled"]))
    model.graph.output.append(helper.make_tensor_value_info("doubled", TensorProto.FLOAT, ["N", 2]))
    precision = PrecisionPass("fp16", check=False)
    assert not precision(ir.serde.deserialize_model(model)).modified
    assert "Add: alone between float32 nodes" in precision.stats["skipped"]
    model.graph.output[-1].name = "squared"
    model.graph.node.append(helper.make_node("Mul", ["doubled", "doubled"], ["squared"]))
    ir_model = ir.serde.deserialize_model(model)
    precision = PrecisionPass("fp16", check=False)
    assert precision(ir_model).modified and "skipped" not in precision.stats
    (add,) = [n for n in ir_model.graph if n.op_type == "Add"]
    assert add.outputs[0].dtype == ir.DataType.FLOAT16


def test_the_lists_of_a_large_ensemble_are_never_decoded(tmp_path: pathlib.Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    model = trees(150_000)
    source = tmp_path / "m.onnx"
    onnx.save_model(model, str(source))
    assert source.stat().st_size > detach.MIN_FILE  # its lists are left in the file at load

    def refuse(*args: object) -> None:
        raise AssertionError("a detached attribute list was decoded")

    monkeypatch.setattr(detach, "_decode", refuse)
    report = tmp_path / "r.json"
    assert cli.main([str(source), "-o", str(tmp_path / "o.onnx"), "-q", "--no-check", "--precision", "fp16",
                     "--report", str(report)]) == 0  # fmt: skip
    (run,) = [p for p in json.loads(report.read_text())["passes"] if p["name"] == "precision"]
    assert not run["modified"] and "TreeEnsembleClassifier" in run["stats"]["skipped"]
