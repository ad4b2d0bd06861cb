"""The upgrade refuses a node onnxruntime runs at its version but has no CPU kernel for at the target's.

onnxruntime 1.32 runs RandomUniform-1 but has no kernel for RandomUniform-22 (nor for
RandomNormal(Like)/RandomUniformLike/Multinomial/MaxRoiPool/RoiAlign/GlobalLpPool-22, nor
Q/DQ and Optional*-28): a model carried to opset 22+ with one of them no longer loads, and
the check used to answer exit 1 with "a pass that changes a result is a bug". The upgrade
now refuses it in one line (exit 2) naming the op, its versions and the highest target that
keeps it, anywhere in the model (main graph, If/Loop bodies, functions).
"""

from __future__ import annotations

import copy
import os
import pathlib
import subprocess
import sys

import numpy as np
import onnx
import onnx.helper as oh
import onnx_ir as ir
import onnxruntime as ort
import pytest

from passes.errors import UpgradeError
from passes.upgrade import UpgradeOpsetPass
from passes.verify.probe import has_version_kernel, max_supported_opset

ROOT = pathlib.Path(__file__).resolve().parents[1]
F = onnx.TensorProto.FLOAT


def _model(nodes, inputs, outputs, opset=13, functions=(), domains=()):
    graph = oh.make_graph(nodes, "g", inputs, outputs)
    imports = [oh.make_opsetid("", opset)] + [oh.make_opsetid(d, 1) for d in domains]
    return oh.make_model(graph, opset_imports=imports, functions=list(functions), ir_version=8)


def _random_in_main():
    return _model(
        [oh.make_node("RandomUniform", [], ["r"], shape=[2, 3], seed=1.0), oh.make_node("Add", ["x", "r"], ["y"])],
        [oh.make_tensor_value_info("x", F, [2, 3])], [oh.make_tensor_value_info("y", F, [2, 3])],
    )


def _random_in_branch():
    then = oh.make_graph([oh.make_node("RandomUniformLike", ["x"], ["t"], seed=2.0)], "t", [],
                         [oh.make_tensor_value_info("t", F, [2, 3])])  # fmt: skip
    other = oh.make_graph([oh.make_node("Neg", ["x"], ["e"])], "e", [], [oh.make_tensor_value_info("e", F, [2, 3])])
    return _model(
        [oh.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
        [oh.make_tensor_value_info("x", F, [2, 3]), oh.make_tensor_value_info("c", onnx.TensorProto.BOOL, [])],
        [oh.make_tensor_value_info("y", F, [2, 3])],
    )


def _random_in_function():
    function = oh.make_function("local", "Noisy", ["a"], ["b"],
                                [oh.make_node("RandomNormalLike", ["a"], ["n"], seed=3.0), oh.make_node("Add", ["a", "n"], ["b"])],
                                [oh.make_opsetid("", 13)])  # fmt: skip
    return _model(
        [oh.make_node("Noisy", ["x"], ["y"], domain="local")],
        [oh.make_tensor_value_info("x", F, [2, 3])], [oh.make_tensor_value_info("y", F, [2, 3])],
        functions=[function], domains=["local"],
    )


def _loads(model: onnx.ModelProto) -> bool:
    try:
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as error:  # noqa: BLE001 (onnxruntime's exception types are pybind ones)
        assert "Could not find an implementation" in str(error)
        return False
    return True


def _upgraded(model: onnx.ModelProto, target: int) -> onnx.ModelProto:
    return ir.to_proto(UpgradeOpsetPass(target)(ir.from_proto(copy.deepcopy(model))).model)


@pytest.mark.parametrize("build, op", [(_random_in_main, "RandomUniform"), (_random_in_branch, "RandomUniformLike"),
                                       (_random_in_function, "RandomNormalLike")])  # fmt: skip
def test_a_version_without_kernel_is_refused_and_21_keeps_the_node(build, op) -> None:
    model = build()
    assert _loads(model)
    if has_version_kernel(op, 22) is not False:
        pytest.skip(f"this onnxruntime has a kernel for {op}-22")
    at_21 = _upgraded(model, 21)
    assert at_21.opset_import[0].version == 21 and _loads(at_21)
    for target in range(22, max_supported_opset() + 1):
        raw = _model(list(model.graph.node), list(model.graph.input), list(model.graph.output), opset=22,
                     functions=[copy.deepcopy(f) for f in model.functions],
                     domains=[i.domain for i in model.opset_import if i.domain])  # fmt: skip
        for function in raw.functions:
            function.opset_import[0].version = 22
        assert not _loads(raw)  # what the upgrade would write: onnxruntime does not load it
        with pytest.raises(UpgradeError) as refused:
            _upgraded(model, target)
        message = str(refused.value)
        assert f"no CPU kernel for {op}-22" in message and "--target-opset 21" in message and "\n" not in message


def test_versions_with_a_kernel_still_upgrade() -> None:
    """Conv-22 and Dropout-22 have kernels: carried to 23, the model loads and computes the same bits."""
    w = np.random.default_rng(0).standard_normal((2, 3, 3, 3)).astype(np.float32)
    graph = oh.make_graph(
        [oh.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), oh.make_node("Dropout", ["c"], ["y"])],
        "g", [oh.make_tensor_value_info("x", F, [1, 3, 4, 4])], [oh.make_tensor_value_info("y", F, [1, 2, 4, 4])],
        [onnx.numpy_helper.from_array(w, "w")],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 13)], ir_version=8)
    target = min(23, max_supported_opset())
    after = _upgraded(model, target)
    assert after.opset_import[0].version == target
    x = np.random.default_rng(1).standard_normal((1, 3, 4, 4)).astype(np.float32)
    run = lambda m: ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert run(model).tobytes() == run(after).tobytes()


def test_the_probe_agrees_with_onnxruntime_loading_the_op() -> None:
    """has_version_kernel against a one-node model onnxruntime loads or not (ops taking float inputs)."""
    cases = [("RandomUniform", 1), ("RandomUniform", 22), ("Conv", 22), ("GlobalLpPool", 2), ("GlobalLpPool", 22),
             ("Dropout", 22), ("Relu", 14), ("Softmax", 13)]  # fmt: skip
    for op, since in cases:
        schema = onnx.defs.get_schema(op, since, "")
        assert schema.since_version == since
        inputs = [f"i{k}" for k, p in enumerate(schema.inputs)
                  if p.option != onnx.defs.OpSchema.FormalParameterOption.Optional]  # fmt: skip
        attrs = {"shape": [2]} if op == "RandomUniform" else {}
        graph = oh.make_graph([oh.make_node(op, inputs, ["o"], **attrs)], "p",
                              [oh.make_tensor_value_info(i, F, None) for i in inputs], [oh.make_tensor_value_info("o", F, None)])  # fmt: skip
        model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", since)], ir_version=10)
        assert has_version_kernel(op, since) is _loads(model), (op, since)


def test_command_line_refusal_is_one_line_exit_2(tmp_path: pathlib.Path) -> None:
    if has_version_kernel("RandomUniform", 22) is not False or max_supported_opset() < 22:
        pytest.skip("this onnxruntime runs RandomUniform-22")
    source = tmp_path / "random.onnx"
    onnx.save(_random_in_main(), source)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-m", "passes", str(source), "-o", str(tmp_path / "out.onnx"),
                           "--target-opset", "22"], capture_output=True, text=True, env=env, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "out.onnx").exists()
    assert "no CPU kernel for RandomUniform-22" in done.stderr
