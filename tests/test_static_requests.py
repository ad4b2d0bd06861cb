"""Static-shape requests refused when they cannot hold (issue #34, item 6).

* A shape at which the original does not run in onnxruntime (a Reshape to a
  constant ``[16, 4, 16]`` of x ``[batch, seq, 64]`` asked at ``1, 32, 64``):
  exit 2, onnxruntime's message in one line, nothing written; in the main
  graph, an If branch and a function. Not refused where onnxruntime cannot
  load the model (a custom op) or runs it at no size: that is not the request.
* A ``--fix-dim`` of a dim no graph input carries (``o = Concat(x, x)``
  declared ``[M]``): refused, one line.
* Sizes ONNX cannot hold (2**63 and above), on every route.
"""

from __future__ import annotations

import json

import pathlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper as oh

import helpers
import passes

F = TensorProto.FLOAT
OPSETS = [oh.make_opsetid("", 17)]
MESSAGE = ("the model cannot run at these shapes (onnxruntime: Reshape node 'fixed': The input tensor cannot be "
           "reshaped to the requested shape. Input shape:{1,32,64}, requested shape:{16,4,16})")  # fmt: skip
#: onnxruntime names a function's node after the function when it inlines the call.
IN_FUNCTION = MESSAGE.replace("'fixed'", "'_inlfunc_Fixed_fixed'")
#: A subgraph's node fails inside its If node's message: both are named.
IN_BRANCH = MESSAGE.replace("'fixed'", "'fixed' (in If node 'choose')")


def _target() -> onnx.TensorProto:
    return onnx.numpy_helper.from_array(np.array([16, 4, 16], np.int64), "target")


def _x() -> onnx.ValueInfoProto:
    return oh.make_tensor_value_info("x", F, ["batch", "seq", 64])


def _main() -> onnx.ModelProto:
    """x[batch, seq, 64] -> Reshape to the constant [16, 4, 16] (runs only where batch * seq = 16)."""
    graph = oh.make_graph([oh.make_node("Reshape", ["x", "target"], ["y"], name="fixed")], "g", [_x()],
                          [oh.make_tensor_value_info("y", F, [16, 4, 16])], [_target()])  # fmt: skip
    return oh.make_model(graph, opset_imports=OPSETS, ir_version=8)


def _branch() -> onnx.ModelProto:
    """The Reshape in the branch an If takes on every input (its condition is computed, never folded)."""
    y = oh.make_tensor_value_info("y", F, [16, 4, 16])
    then = oh.make_graph([oh.make_node("Reshape", ["x", "target"], ["y"], name="fixed")], "then", [], [y])
    other = oh.make_graph([oh.make_node("Reshape", ["x", "target"], ["y2"], name="other")], "else", [],
                          [oh.make_tensor_value_info("y2", F, [16, 4, 16])])  # fmt: skip
    nodes = [oh.make_node("IsNaN", ["x"], ["nan"]), oh.make_node("Not", ["nan"], ["finite"]),
             oh.make_node("Cast", ["finite"], ["ones"], to=TensorProto.INT64),
             oh.make_node("ReduceMax", ["ones"], ["any"], keepdims=0),
             oh.make_node("Cast", ["any"], ["c"], to=TensorProto.BOOL),
             oh.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other, name="choose")]  # fmt: skip
    graph = oh.make_graph(nodes, "g", [_x()], [y], [_target()])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=8)


def _function() -> onnx.ModelProto:
    body = [oh.make_node("Constant", [], ["target"], value=_target()),
            oh.make_node("Reshape", ["x", "target"], ["y"], name="fixed")]  # fmt: skip
    function = oh.make_function("local", "Fixed", ["x"], ["y"], body, OPSETS)
    graph = oh.make_graph([oh.make_node("Fixed", ["x"], ["y"], domain="local", name="call")], "g", [_x()],
                          [oh.make_tensor_value_info("y", F, [16, 4, 16])])  # fmt: skip
    return oh.make_model(graph, opset_imports=[*OPSETS, oh.make_opsetid("local", 1)], ir_version=8,
                         functions=[function])  # fmt: skip


def _refused(proto: onnx.ModelProto, args: list[str], keywords: dict, message: str, tmp_path: pathlib.Path,
             capsys, *, loaded: bool = True) -> None:  # fmt: skip
    """Exit 2 with ``message`` as the one line, no output, the input untouched; the API alike. ``loaded``: refused
    after the model was loaded, so the ``--report`` asked for says so (refused at argument validation: nothing)."""
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(proto, src)
    before = src.read_bytes()
    code, text, err = helpers.run_cli([str(src), "-o", str(out), "--report", str(tmp_path / "r.json"), *args], capsys)
    assert code == 2, err
    assert err.splitlines() == [f"optimize: error: {message}"]
    assert text == "" and src.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.onnx", *(["r.json"] if loaded else [])]
    if loaded:
        report = json.loads((tmp_path / "r.json").read_text(encoding="utf-8"))
        assert (report["status"], report["written"], report["error"]) == ("error", False, message)
    with pytest.raises(passes.InputError) as api:
        passes.optimize(src, output=out, **keywords)
    assert str(api.value) == f"{src}: {message}" or str(api.value) == message
    assert not out.exists()
    with pytest.raises(passes.InputError) as api:
        passes.optimize(onnx.load(src), **keywords)
    assert str(api.value) == message


@pytest.mark.parametrize("build", [_main, _branch, _function], ids=["main", "branch", "function"])
def test_a_shape_the_original_does_not_run_at_is_refused_with_onnxruntime_s_message(build, tmp_path, capsys) -> None:
    message = {_main: MESSAGE, _branch: IN_BRANCH, _function: IN_FUNCTION}[build]
    _refused(build(), ["--input-shape", "x:1,32,64"], {"input_shapes": {"x": (1, 32, 64)}},
             f"--input-shape 'x:1,32,64': {message}", tmp_path, capsys)  # fmt: skip


def test_a_fixed_dim_the_original_does_not_run_at_is_refused(tmp_path, capsys) -> None:
    _refused(_main(), ["--fix-dim", "batch=1", "--fix-dim", "seq=32"], {"fix_dims": {"batch": 1, "seq": 32}},
             f"--fix-dim 'batch=1' --fix-dim 'seq=32': {MESSAGE}", tmp_path, capsys)  # fmt: skip


@pytest.mark.parametrize("build", [_main, _branch, _function], ids=["main", "branch", "function"])
def test_a_shape_the_original_runs_at_is_declared_and_equal_in_onnxruntime(build, tmp_path, capsys) -> None:
    """The no-op of the refusal: at 2 x 8 x 64 (16 rows) the model runs, and the result is the original's."""
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(build(), src)
    code, _, err = helpers.run_cli([str(src), "-o", str(out), "--input-shape", "x:2,8,64", "-q"], capsys)
    assert code == 0, err
    result = onnx.load(out)
    assert helpers.dims_of(result.graph.input[0]) == [2, 8, 64]
    x = np.random.default_rng(0).standard_normal((2, 8, 64)).astype(np.float32)
    (expected,), (got,) = helpers.ort_run(str(src), {"x": x}), helpers.ort_run(result, {"x": x})
    assert expected.tobytes() == got.tobytes() and got.shape == (16, 4, 16)


def test_a_model_onnxruntime_cannot_load_is_not_refused_for_it(tmp_path, capsys) -> None:
    """A custom op: onnxruntime runs the original at no shape, so the request is not what fails."""
    graph = oh.make_graph([oh.make_node("Scramble", ["x"], ["t"], domain="custom.ops"),
                           oh.make_node("Reshape", ["t", "target"], ["y"], name="fixed")], "g", [_x()],
                          [oh.make_tensor_value_info("y", F, [16, 4, 16])], [_target()])  # fmt: skip
    graph.value_info.append(oh.make_tensor_value_info("t", F, ["batch", "seq", 64]))
    proto = oh.make_model(graph, opset_imports=[*OPSETS, oh.make_opsetid("custom.ops", 1)], ir_version=8)
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(proto, src)
    code, text, err = helpers.run_cli([str(src), "-o", str(out), "--input-shape", "x:1,32,64"], capsys)
    assert code == 0, err
    assert "NOT CHECKED: the original model does not load in onnxruntime" in text and out.exists()


def test_a_model_that_runs_at_no_size_is_not_refused_for_the_request(tmp_path, capsys) -> None:
    """x[batch, 64] reshaped to [7, 9]: 64 * batch is never 63, so no size is the request's fault."""
    graph = oh.make_graph([oh.make_node("Reshape", ["x", "target"], ["y"])], "g",
                          [oh.make_tensor_value_info("x", F, ["batch", 64])], [oh.make_tensor_value_info("y", F, [7, 9])],
                          [onnx.numpy_helper.from_array(np.array([7, 9], np.int64), "target")])  # fmt: skip
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(oh.make_model(graph, opset_imports=OPSETS, ir_version=8), src)
    code, text, err = helpers.run_cli([str(src), "-o", str(out), "--input-shape", "x:1,64"], capsys)
    assert code == 0, err
    assert "NOT CHECKED: the original model does not run in onnxruntime on generated inputs" in text and out.exists()


def _concat() -> onnx.ModelProto:
    """``o = Concat(x, x)`` with x ``[N]`` and o declared ``[M]`` (M is what the graph makes: 2N)."""
    graph = oh.make_graph([oh.make_node("Concat", ["x", "x"], ["o"], axis=0)], "g",
                          [oh.make_tensor_value_info("x", F, ["N"])], [oh.make_tensor_value_info("o", F, ["M"])])  # fmt: skip
    return oh.make_model(graph, opset_imports=OPSETS, ir_version=8)


def test_a_fix_dim_no_input_carries_is_refused(tmp_path, capsys) -> None:
    _refused(_concat(), ["--fix-dim", "M=5"], {"fix_dims": {"M": 5}},
             "--fix-dim 'M=5': no graph input carries 'M', only values the graph computes: their size is what "
             "the graph makes of its inputs (its inputs' dim names: 'N')", tmp_path, capsys)  # fmt: skip


def test_a_fix_dim_an_input_carries_is_taken(tmp_path, capsys) -> None:
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(_concat(), src)
    code, _, err = helpers.run_cli([str(src), "-o", str(out), "--fix-dim", "N=5", "-q"], capsys)
    assert code == 0, err
    result = onnx.load(out)
    assert helpers.dims_of(result.graph.input[0]) == [5]
    x = np.arange(5, dtype=np.float32)
    assert helpers.ort_run(result, {"x": x})[0].tolist() == helpers.ort_run(str(src), {"x": x})[0].tolist()


@pytest.mark.parametrize("size", [2**63, 2**64 + 3, 10**29])
@pytest.mark.parametrize("flag", ["--fix-dim", "--input-shape"])
def test_a_size_onnx_cannot_hold_is_refused_at_argument_validation(flag, size, tmp_path, capsys) -> None:
    args = ["--fix-dim", f"N={size}"] if flag == "--fix-dim" else ["--input-shape", f"x:{size}"]
    keywords = {"fix_dims": {"N": size}} if flag == "--fix-dim" else {"input_shapes": {"x": (size,)}}
    shown = f"'N={size}'" if flag == "--fix-dim" else f"'x:{size}'"
    _refused(_concat(), args, keywords,
             f"{flag} {shown}: size {size} is over the largest dim ONNX holds (2**63 - 1)", tmp_path, capsys,
             loaded=False)  # fmt: skip
    with pytest.raises(passes.InputError, match="over the largest dim ONNX holds"):
        passes.build_pass_manager(**keywords)


def test_the_largest_size_onnx_holds_passes_argument_validation(tmp_path, capsys) -> None:
    """2**63 - 1 is a size ONNX holds: not refused as malformed (the model then cannot take it: one line)."""
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(_concat(), src)
    code, _, err = helpers.run_cli([str(src), "-o", str(out), "--fix-dim", f"N={2**63 - 1}"], capsys)
    assert code == 2 and len(err.splitlines()) == 1 and "over the largest" not in err and "internal" not in err
    assert not out.exists()
