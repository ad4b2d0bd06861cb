"""A --precision model must load in onnxruntime with its default graph optimisations.

The check compares with every graph optimisation off (ORT_DISABLE_ALL); a user's session runs
them all (ORT_ENABLE_ALL). onnxruntime 1.32 dies (SIGSEGV) building a default session for a
float16 ``Transpose(perm=[1, 0, 2])`` feeding a ``MatMul`` with a constant weight, which the
float32 original never has: found on a GRU exported by TorchScript (``--precision fp16``).
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from helpers import ort_run
from passes import cli
from passes.verify import default_load
from passes.verify.child import Worker


def _model(perm: list[int], element: int = TensorProto.FLOAT) -> onnx.ModelProto:
    """``MatMul(Transpose(x, perm), W)``, x [S, B, 8], W a constant [8, 8]."""
    dtype = helper.tensor_dtype_to_np_dtype(element)
    weight = np.random.default_rng(0).standard_normal((8, 8)).astype(dtype)
    graph = helper.make_graph(
        [helper.make_node("Transpose", ["x"], ["t"], perm=perm), helper.make_node("MatMul", ["t", "W"], ["y"])],
        "g", [helper.make_tensor_value_info("x", element, ["S", "B", 8])],
        [helper.make_tensor_value_info("y", element, None)], [numpy_helper.from_array(weight, "W")])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model


def _crashes_default_session(path: pathlib.Path) -> bool:
    code = "import sys, onnxruntime as o; o.InferenceSession(sys.argv[1], providers=['CPUExecutionProvider'])"
    return subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True).returncode < 0


@pytest.fixture
def crashing(tmp_path: pathlib.Path) -> pathlib.Path:
    """The float16 form of the pattern, skipped with an onnxruntime that loads it."""
    path = tmp_path / "half.onnx"
    onnx.save_model(_model([1, 0, 2], TensorProto.FLOAT16), str(path))
    if not _crashes_default_session(path):
        pytest.skip("this onnxruntime builds a default session for the float16 Transpose -> MatMul")
    return path


def test_the_probe_names_the_crash_and_passes_a_model_that_loads(tmp_path: pathlib.Path,
                                                                 crashing: pathlib.Path) -> None:  # fmt: skip
    """In the check's child: the crash ends it, the next request starts it again."""
    fine = tmp_path / "fine.onnx"
    onnx.save_model(_model([0, 2, 1], TensorProto.FLOAT16), str(fine))
    worker = Worker(0).start()
    try:
        deadline = time.monotonic() + 120
        problem = default_load.failure(worker, crashing, deadline)
        assert problem is not None and "ORT_ENABLE_ALL" in problem and "SIGSEGV" in problem, problem
        assert default_load.failure(worker, fine, deadline) is None
        assert default_load.failure(worker, tmp_path / "missing.onnx", deadline).startswith("onnxruntime fails")
    finally:
        worker.close()


def test_a_half_model_onnxruntime_crashes_on_is_refused_and_written_only_with_force(
        tmp_path: pathlib.Path, crashing: pathlib.Path) -> None:  # fmt: skip
    source, target, report = tmp_path / "m.onnx", tmp_path / "out.onnx", tmp_path / "r.json"
    onnx.save_model(_model([1, 0, 2]), str(source))
    code = cli.main([str(source), "-o", str(target), "-q", "--precision", "fp16", "--report", str(report)])
    assert code == 1 and not target.exists()
    written = json.loads(report.read_text())
    assert written["status"] == "check failed" and not written["written"]
    assert "ORT_ENABLE_ALL" in written["error"] and "--force" in written["error"], written["error"]
    (run,) = [p for p in written["passes"] if p["name"] == "precision"]
    assert run["modified"]  # the conversion happened: the refusal is the load's, not the search's
    assert cli.main([str(source), "-o", str(target), "-q", "--precision", "fp16", "--force"]) == 1
    assert _crashes_default_session(target)  # what --force wrote is the model refused
    x = np.random.default_rng(1).standard_normal((3, 2, 8)).astype(np.float32)
    (expected,), (actual,) = ort_run(str(source), {"x": x}), ort_run(str(target), {"x": x})  # optimisations off
    np.testing.assert_allclose(actual, expected, rtol=1e-2, atol=1e-2)


def test_without_the_pattern_the_half_model_is_written(tmp_path: pathlib.Path, crashing: pathlib.Path) -> None:
    source, target = tmp_path / "m.onnx", tmp_path / "out.onnx"
    onnx.save_model(_model([0, 2, 1]), str(source))
    assert cli.main([str(source), "-o", str(target), "-q", "--precision", "fp16"]) == 0
    assert not _crashes_default_session(target)
    half = onnx.load(str(target))
    assert any(n.op_type == "MatMul" for n in half.graph.node)
    assert {i.data_type for i in half.graph.initializer} == {TensorProto.FLOAT16}  # converted, not refused
