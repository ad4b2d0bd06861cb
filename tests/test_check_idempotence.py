"""The ONNX checker on the result: what the original already had is not blamed on the passes, and
``optimize`` accepts its own output (each model optimised twice, the second run exits 0)."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from passes import cli, pipeline

REPO = pathlib.Path(__file__).resolve().parent.parent
MODELS = [REPO / "models" / "demo.onnx", *sorted((REPO / "models" / "real").glob("*.onnx"))]


def hidden_contradiction() -> onnx.ModelProto:
    """Declares output y as [2, 3] while computing Reshape(x[2, 3], [3, 2]); the shape goes through
    an Identity, so strict inference cannot see the contradiction until the shape is folded."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["shape"], ["shape2"], name="id"),
         helper.make_node("Reshape", ["x", "shape2"], ["y"], name="reshape")],
        "contradiction", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        initializer=[numpy_helper.from_array(np.array([3, 2], np.int64), "shape")],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _twice(tmp_path: pathlib.Path, src: pathlib.Path, *args: str) -> tuple[tuple[int, int], list[dict]]:
    first, second = tmp_path / "once.onnx", tmp_path / "twice.onnx"
    reports = [tmp_path / "r1.json", tmp_path / "r2.json"]
    codes = (cli.main([str(src), "-o", str(first), "--report", str(reports[0]), "-q", *args]),
             cli.main([str(first), "-o", str(second), "--report", str(reports[1]), "-q", *args]))  # fmt: skip
    return codes, [json.loads(r.read_text()) if r.exists() else {} for r in reports]


def test_a_declaration_the_original_contradicts_is_not_blamed_on_the_passes(tmp_path: pathlib.Path,
                                                                            capsys) -> None:  # fmt: skip
    src = tmp_path / "m.onnx"
    onnx.save_model(hidden_contradiction(), str(src))
    codes, (first, second) = _twice(tmp_path, src)
    assert codes == (0, 0), capsys.readouterr().err
    assert first["written"] and first["check"]["ok"]
    # Once the target is a constant, simplify corrects the declaration to what the graph computes (a note).
    assert first["notes"] == ["output 'y' was declared [2, 3] but the graph computes [3, 2]: "
                              "declared [3, 2] in the output"]  # fmt: skip
    assert first["check"]["notes"] == ["the original model declares output 'y' as [2, 3] but computes [3, 2]"]
    assert second["check"]["ok"] and second["notes"] == []
    onnx.checker.check_model(str(tmp_path / "once.onnx"), full_check=True)


def test_a_model_whose_declared_shape_strict_inference_contradicts_is_accepted(tmp_path: pathlib.Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2])])
    src = tmp_path / "m.onnx"
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(src))
    codes, (first, _) = _twice(tmp_path, src)
    assert codes == (0, 0)
    assert first["check"]["notes"] == ["the original model declares output 'y' as [3, 2] but computes [2, 3]"]


def test_a_declared_input_shape_that_contradicts_the_outputs_is_the_originals(tmp_path: pathlib.Path) -> None:
    # Found by test_fuzz: demo.onnx with x declared [batch, 0, 8] contradicts its own declared
    # outputs; after the passes (which declare initializers' shapes too) the same holds.
    model = onnx.load(str(REPO / "models" / "demo.onnx"))
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 0
    src = tmp_path / "m.onnx"
    onnx.save_model(model, str(src))
    codes, (first, _) = _twice(tmp_path, src)
    assert codes == (0, 0)
    assert any("'log_sum' is declared ['batch', 4] but its graph makes it ['batch', 0]" in n for n in first["notes"])


def test_a_failure_hidden_in_external_data_is_the_originals(tmp_path: pathlib.Path) -> None:
    # Found by test_fuzz: the Reshape target is external (load-time inference cannot read it)
    # and invalid; the result holds it inline, where strict inference sees it.
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b"])],
        initializer=[numpy_helper.from_array(np.array([-4753753369351241876, 7], np.int64), "shape")],
    )  # fmt: skip
    src = tmp_path / "m.onnx"
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(src),
                    save_as_external_data=True, location="m.data", size_threshold=0)  # fmt: skip
    out, report = tmp_path / "o.onnx", tmp_path / "r.json"
    assert cli.main([str(src), "-o", str(out), "--report", str(report), "-q"]) == 0
    data = json.loads(report.read_text())
    assert any(n.startswith("the optimised model fails the ONNX checker as the original does") for n in data["notes"])
    assert data["check"]["checked"] is False  # onnxruntime does not run the original either


class _WrongDeclaration(ir.passes.InPlacePass):
    """Test-only: declares a wrong shape for an intermediate value (a pass bug the checker catches)."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        node = next(n for n in model.graph if n.op_type == "Relu")
        node.outputs[0].type = ir.TensorType(ir.DataType.FLOAT)
        node.outputs[0].shape = ir.Shape([5, 5])
        return ir.passes.PassResult(model, modified=True)


def test_a_declaration_the_passes_wrote_is_their_fault(tmp_path: pathlib.Path, monkeypatch, capsys) -> None:
    spec = pipeline.PassSpec("wrong", "test only", lambda o: _WrongDeclaration())
    monkeypatch.setitem(pipeline.PASSES, "wrong", spec)
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["r"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(src))
    assert cli.main([str(src), "-o", str(out), "--passes", "wrong", "-q"]) == 1
    err = capsys.readouterr().err
    assert "the optimised model is invalid: value 'r' is declared [5, 5]" in err and "the passes wrote" in err
    assert not out.exists()


@pytest.mark.parametrize(
    "src", [pytest.param(p, id=p.stem) for p in MODELS])
def test_optimize_accepts_its_own_output(tmp_path: pathlib.Path, src: pathlib.Path, capsys) -> None:
    manifest = json.loads((REPO / "models" / "real" / "MANIFEST.json").read_text())["models"]
    model = onnx.load(str(src), load_external_data=False)
    named = {d.dim_param for i in model.graph.input for d in i.type.tensor_type.shape.dim if d.dim_param}
    # Only the manifest's dims the model has: the command refuses a --dim for any other name.
    dims = [f"--dim={k}={v}" for k, v in (manifest.get(src.stem, {}).get("dims") or {}).items() if k in named]
    codes, (first, second) = _twice(tmp_path, src, *dims)
    assert codes == (0, 0), capsys.readouterr().err
    assert first["check"]["checked"] and second["check"]["checked"]
