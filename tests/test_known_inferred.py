"""The last pass's inference, kept for the ``types`` step (passes.ir.known.keep_inferred): simplify keeps
the inference of its last round, which changed nothing; the pass loop forgets it once a pass changes the
model; the step writes the same bytes from it as from an inference of its own."""

from __future__ import annotations

import pathlib

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

import passes
from passes import loop
from passes.ir import known
from passes.shapes import value_info

F32 = TensorProto.FLOAT


def _symbolic(tmp_path: pathlib.Path, *, decompose: bool) -> pathlib.Path:
    """x[N, 4, 6] -> Reshape to (0, 24) -> Relu [-> ReduceLogSumExp] -> Neg: dims no table holds (N),
    a Reshape (simplify's shape rules infer), and with ``decompose`` a pass that changes the graph after."""
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]), helper.make_node("Relu", ["r"], ["a"])]
    last = "a"
    if decompose:
        nodes.append(helper.make_node("ReduceLogSumExp", ["a"], ["l"], axes=[1], keepdims=1))
        last = "l"
    nodes.append(helper.make_node("Neg", [last], ["y"]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F32, ["N", 4, 6])],
                              [helper.make_tensor_value_info("y", F32, None)],
                              [numpy_helper.from_array(np.array([0, 24], dtype=np.int64), "shape")])  # fmt: skip
    path = tmp_path / f"symbolic_{decompose}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


@pytest.mark.parametrize("decompose", [False, True])
def test_the_types_step_writes_the_same_from_the_kept_inference(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, decompose: bool
) -> None:
    source = _symbolic(tmp_path, decompose=decompose)
    inferred_by_step: list[bool] = []
    original = value_info.infer_all

    def spy(model: ir.Model, **kwargs: object) -> dict:
        inferred_by_step.append(True)
        return original(model, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(value_info, "infer_all", spy)
    passes.optimize(str(source), output=str(tmp_path / "kept.onnx"), check=False)
    kept_run = list(inferred_by_step)
    inferred_by_step.clear()
    monkeypatch.setattr(known, "inferred", lambda model: None)  # the step infers for itself
    passes.optimize(str(source), output=str(tmp_path / "inferred.onnx"), check=False)
    assert inferred_by_step == [True]
    if not decompose:
        assert kept_run == []  # simplify's last inference answered
    assert (tmp_path / "kept.onnx").read_bytes() == (tmp_path / "inferred.onnx").read_bytes()
    written = onnx.load(str(tmp_path / "kept.onnx"))
    stated = {info.name: info for info in written.graph.value_info}
    assert "r" in stated and stated["r"].type.tensor_type.shape.dim[0].dim_param  # the symbolic dim kept
    assert len(written.graph.value_info) == len(written.graph.node) - 1  # every intermediate is stated


class _Pass(ir.passes.InPlacePass):
    def __init__(self, modified: bool, keep: bool) -> None:
        super().__init__()
        self.modified, self.keep = modified, keep

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        if self.keep:
            known.keep_inferred(model, {})
        return ir.passes.PassResult(model, modified=self.modified)


def _model() -> ir.Model:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", F32, [2])],
                              [helper.make_tensor_value_info("y", F32, [2])])  # fmt: skip
    return ir.serde.deserialize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


@pytest.mark.parametrize(
    ("modified", "keep", "kept_after"),
    [(False, False, True), (True, False, False), (True, True, True), (False, True, True)],
)
def test_the_loop_forgets_the_kept_inference_once_a_pass_changes_the_model(
    modified: bool, keep: bool, kept_after: bool
) -> None:
    model = _model()
    known.begin(model)
    try:
        known.keep_inferred(model, {})
        before = known.inferred(model)
        loop.Record().call(0, "p", _Pass(modified, keep), model)
        assert (known.inferred(model) is not None) == kept_after
        if not keep and kept_after:
            assert known.inferred(model) is before
    finally:
        known.end(model)
    assert known.inferred(model) is None  # nothing outlives the run


def test_outside_a_run_nothing_is_kept() -> None:
    model = _model()
    known.keep_inferred(model, {})
    assert known.inferred(model) is None
