"""bench_llm (issue #37): the sized GPT-2 / Llama exports, the cache keys, the tables; no timing.

The exports are ``bench_simplify``'s, sized by ``ExportSpec(layers=, hidden=)``: the tiny ones
``bench_simplify`` measures keep their names (and so their cached files and table rows); a sized
export has the layers asked for. The tables give ratios to vc+onnxsim and say when ours' check
failed; ``bench_precision``'s cost table compares ours with onnxconverter-common plus our check.
"""

from __future__ import annotations

import pathlib
import sys

import onnx
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks"))
import bench_llm  # noqa: E402
import bench_precision  # noqa: E402
import bench_simplify  # noqa: E402
import harness  # noqa: E402


def test_unsized_exports_keep_their_names_and_sized_ones_say_their_size() -> None:
    names = [s.name for s in bench_simplify.EXPORTS]
    assert "hf_gpt2_ts_opset17" in names and "hf_llama_dynamo_opset18" in names
    assert not any("_L" in n for n in names)
    sized = bench_llm.specs(None, 64)
    assert [(s.arch, s.dynamo, s.layers, s.fold) for s in sized] == [
        ("hf_gpt2", False, bench_llm.TS_LAYERS, True), ("hf_gpt2", True, bench_llm.DYNAMO_LAYERS, False),
        ("hf_llama", False, bench_llm.TS_LAYERS, True), ("hf_llama", True, bench_llm.DYNAMO_LAYERS, False)]
    assert sized[0].name == f"hf_gpt2_L{bench_llm.TS_LAYERS}_h64_ts_opset17"
    # every size and exporter its own cache file
    keys = {s.name for layers in (2, 3) for hidden in (32, 64) for s in bench_llm.specs(layers, hidden)}
    assert len(keys) == 16
    with pytest.raises(ValueError, match="only hf_gpt2 and hf_llama"):
        bench_simplify.export_spec(bench_simplify.ExportSpec("hf_bert", False, 17, layers=3), "unused.onnx")


@pytest.mark.parametrize("layers", [1, 3])
def test_a_sized_gpt2_export_has_the_layers_asked_for(tmp_path: pathlib.Path, layers: int) -> None:
    pytest.importorskip("transformers")
    spec = bench_simplify.ExportSpec("hf_gpt2", False, 17, layers=layers, hidden=16)
    path = tmp_path / "m.onnx"
    bench_simplify.export_spec(spec, str(path))
    model = onnx.load(str(path))
    # GPT-2: two LayerNormalization per block and the final one; 4 MatMul/Gemm weights per block + the head
    assert harness.op_counts(model).get("LayerNormalization") == 2 * layers + 1
    embed = next(t for t in model.graph.initializer if list(t.dims) == [64, 16])  # vocab x hidden
    values = onnx.numpy_helper.to_array(embed)
    assert 0 not in values and 1 not in values  # perturbed


def _row(check_ok: bool, exit_code: int) -> dict:
    ours = {"seconds": 3.0, "peak_mib": 100.0, "nodes": 90, "error": "" if not exit_code else "check failed: x",
            "exit": [exit_code], "check_ok": [check_ok], "phases": {"load": 0.5, "check": 1.0},
            "pass_seconds": {"fold": 0.2}}
    return {"model": "m", "nodes": 200, "tools": {
        "vc+onnxsim": {"seconds": 2.0, "peak_mib": 400.0, "nodes": 120, "error": ""},
        "ours+check": ours,
        "onnxslim": {"seconds": None, "peak_mib": 50.0, "nodes": None, "error": "boom"}}}


def test_the_table_gives_ratios_to_onnxsim_and_ours_check() -> None:
    text = bench_llm.table([_row(True, 0), {"model": "n", "error": "export failed: why"}])
    ours = next(line for line in text.splitlines() if "ours+check" in line)
    assert "1.50x" in ours and "0.25x" in ours and "check passed" in ours and " 90 " in ours
    slim = next(line for line in text.splitlines() if "onnxslim" in line)
    assert "fail" in slim and "boom" in slim
    assert "export failed: why" in text
    failed = bench_llm.table([_row(False, 1)])
    assert "check passed" not in failed and "check failed: x" in failed
    assert "load 0.50 check 1.00 | fold 0.20" in bench_llm.phase_table([_row(True, 0)])


def test_bad_sizes_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        bench_llm.main(["--hidden", "40", "--list"])
    assert exit_info.value.code == 2 and "--hidden" in capsys.readouterr().err
    assert bench_llm.main(["--quick", "--list"]) == 0
    assert f"_L{bench_llm.QUICK_LAYERS}_h64_" in capsys.readouterr().out


def test_the_precision_cost_table_adds_our_check_to_onnxconverter_common() -> None:
    row = {"model": "m", "ours": {"exit": 0, "seconds": 3.0, "check_seconds": 1.0, "peak_mib": 200.0},
           "onnxconverter-common": {"exit": 0, "seconds": 2.0, "peak_mib": 100.0},
           "onnxslim": {"exit": 1, "seconds": None, "peak_mib": 80.0}}
    line = bench_precision.cost_table([row]).splitlines()[-1]
    # 3.0 / 2.0 = 1.50x alone; 3.0 / (2.0 + 1.0) = 1.00x with the check; RSS 2.00x
    assert line.startswith("| m | 3.00 (1.50x) | - | 1.00 | 1.00x | 200 (2.00x) | 2.00, 100 | fail (-) |")
    row["ours"]["precision_seconds"] = 0.5
    assert "| 3.00 (1.50x) | 0.50 | 1.00 |" in bench_precision.cost_table([row])
    row["onnxconverter-common"] = {"exit": 1, "seconds": 0.1, "peak_mib": 90.0, "error": "x"}
    assert "(failed)" in bench_precision.cost_table([row]) and "| 3.00 (-) |" in bench_precision.cost_table([row])
