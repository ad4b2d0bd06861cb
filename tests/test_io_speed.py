"""Speed and memory at the floor: cheap start-up, weights copied by the kernel, one checker each way."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

REPO = pathlib.Path(__file__).resolve().parent.parent
HEAVY = ("numpy", "onnx", "onnx_ir", "ml_dtypes", "sympy", "onnxruntime", "refimpl")


def _cli(*args: str, cache: pathlib.Path | str, importtime: bool = False) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, ONNX_OPTIMIZE_CACHE_DIR=str(cache))
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    flags = ["-X", "importtime"] if importtime else []
    return subprocess.run([sys.executable, *flags, "-m", "passes", *args], capture_output=True, text=True,
                          env=env, timeout=300)  # fmt: skip


def _imported(stderr: str) -> set[str]:
    """Top-level packages named in ``-X importtime`` output."""
    return {m.group(1).split(".")[0] for m in re.finditer(r"^import time:.*\|\s+(\S+)$", stderr, re.M)}


# --- 1. start-up ----------------------------------------------------------------------------------


def test_help_from_the_cache_imports_nothing_heavy_and_reads_the_same(tmp_path: pathlib.Path) -> None:
    first = _cli("--help", cache=tmp_path)  # reads the classes, writes the cache
    assert first.returncode == 0, first.stderr
    assert (tmp_path / "declarations.json").is_file()
    second = _cli("--help", cache=tmp_path, importtime=True)
    assert second.returncode == 0
    assert second.stdout == first.stdout
    assert not _imported(second.stderr) & set(HEAVY), sorted(_imported(second.stderr) & set(HEAVY))


def test_missing_file_fails_without_importing_onnx(tmp_path: pathlib.Path) -> None:
    _cli("--help", cache=tmp_path)
    proc = _cli(str(tmp_path / "nope.onnx"), "-o", str(tmp_path / "out.onnx"), cache=tmp_path, importtime=True)
    assert proc.returncode == 2
    assert f"optimize: error: {tmp_path / 'nope.onnx'}: no such file" in proc.stderr
    assert not _imported(proc.stderr) & set(HEAVY)


def test_a_stale_or_broken_cache_is_read_from_the_classes_again(tmp_path: pathlib.Path) -> None:
    expected = _cli("--help", cache="").stdout  # no cache at all
    cache = tmp_path / "declarations.json"
    for text in ("not json", json.dumps({"key": "old", "passes": []})):
        cache.write_text(text)
        proc = _cli("--help", cache=tmp_path)
        assert proc.returncode == 0 and proc.stdout == expected
        assert json.loads(cache.read_text())["key"] != "old"


def _small_model(path: pathlib.Path) -> pathlib.Path:
    w = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(3, 4), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("ReduceL2", ["h"], ["y"], axes=[-1])],
        "small", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 1])], [w],
    )  # fmt: skip
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), str(path))
    return path


def test_a_run_from_the_cache_imports_only_the_passes_it_runs(tmp_path: pathlib.Path) -> None:
    src = _small_model(tmp_path / "m.onnx")
    _cli("--help", cache=tmp_path)
    out = tmp_path / "out.onnx"
    proc = _cli(str(src), "-o", str(out), "--passes", "upgrade", "--no-check", cache=tmp_path, importtime=True)
    assert proc.returncode == 0, proc.stderr
    imported = _imported(proc.stderr)
    assert "refimpl" not in imported and "onnxruntime" not in imported
    assert onnx.load(str(out)).opset_import[0].version == 18
    # --fold-size-limit is parsed by the fold class's own parser, fetched on use.
    bad = _cli(str(src), "-o", str(out), "--fold-size-limit", "lots", cache=tmp_path)
    assert bad.returncode == 2 and "invalid size 'lots'" in bad.stderr


def test_the_library_reads_the_classes_not_the_cache() -> None:
    from passes import fold, pipeline
    from passes.options import parse_size

    assert pipeline.PASSES["fold"].options == fold.ConstantFoldingPass.OPTIONS
    assert pipeline.PASSES["fold"].options[0].parse is parse_size
    assert pipeline.DEFAULT_FOLD_SIZE_LIMIT == fold.DEFAULT_SIZE_LIMIT


def test_upgrade_error_is_one_class() -> None:
    import pickle

    import onnx_ir as ir

    from passes import errors
    from passes.errors import UpgradeError

    assert errors.UpgradeError is UpgradeError and issubclass(UpgradeError, ir.passes.PassError)
    assert type(pickle.loads(pickle.dumps(UpgradeError("x")))) is UpgradeError
