"""Real models end to end: ``optimize`` with the default passes on the models people ship.

The models are the small ones committed in ``models/real/`` (PyTorch exports at
opsets 11-17 and skl2onnx conversions, see ``models/build_real_models.py`` and
``models/real/MANIFEST.json``) and the ones installed packages ship
(onnxruntime's datasets, the "light" ONNX Model Zoo architectures in onnx's
backend test data). For each: ``optimize`` exits 0, the output reaches the
target opset when the ``upgrade`` pass is registered, passes the full ONNX
checker, and onnxruntime gives the same outputs as on the original on seeded
inputs of our own (independently of the command's own check) within the
documented tolerances (``passes.verify.check.TOLERANCES``).

The heavy cases (``-m heavy`` runs only them) also rebuild the models with torch and
scikit-learn, which the README's test command installs (the ``real`` extra), and compare them
with the committed files; without those packages they are skipped with that reason.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import pathlib
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from passes import cli, pipeline
from passes.verify.check import TOLERANCES

REPO = pathlib.Path(__file__).resolve().parent.parent
REAL_DIR = REPO / "models" / "real"
MANIFEST_PATH = REAL_DIR / "MANIFEST.json"
TARGET_OPSET = pipeline.DEFAULT_TARGET_OPSET

#: Seed of this file's inputs; differs from the command's default seed (0) on purpose.
SEED = 1234
#: Size of a dynamic dimension the manifest does not name; differs from the command's default (2).
DIM = 3


def _load_builder() -> Any:
    spec = importlib.util.spec_from_file_location("build_real_models", REPO / "models" / "build_real_models.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("build_real_models", module)
    spec.loader.exec_module(module)
    return module


builder = _load_builder()
MANIFEST: dict[str, Any] = json.loads(MANIFEST_PATH.read_text(encoding="utf-8"))

#: Models the tool cannot optimise yet, with the reason. The marks are strict:
#: a fix makes the test XPASS and fail, so the entry must then be removed.
KNOWN_FAILURES: dict[str, str] = {}



@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    path: pathlib.Path
    manifest: dict[str, Any]
    dims: dict[str, int]


def _cases() -> list[Case]:
    cases = []
    committed = MANIFEST.get("models", {})
    for path in sorted(REAL_DIR.glob("*.onnx")):
        entry = committed.get(path.stem, {})
        cases.append(Case(path.stem, path, entry, dict(entry.get("dims") or builder.DEFAULT_DIMS)))
    installed = MANIFEST.get("installed", {})
    for item in builder.installed_models():
        cases.append(Case(item.name, item.path, installed.get(item.name, {}), dict(builder.DEFAULT_DIMS)))
    return cases


CASES = _cases()


def _params() -> Iterator[Any]:
    for case in CASES:
        marks = []
        if case.name in KNOWN_FAILURES:
            marks.append(pytest.mark.xfail(reason=KNOWN_FAILURES[case.name], strict=True))
        yield pytest.param(case, id=case.name, marks=marks)


PARAMS = list(_params())


@dataclasses.dataclass
class Run:
    code: int
    output: pathlib.Path
    report: dict[str, Any] | None
    stderr: str


_RUNS: dict[str, Run] = {}
_SUMMARY: list[tuple[str, Any, Any, Any, Any, Any]] = []


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return tmp_path_factory.mktemp("real")


@pytest.fixture(scope="module", autouse=True)
def _print_summary(pytestconfig: pytest.Config) -> Iterator[None]:
    """With ``-s``, prints the node counts of every model at the end of the module (with the manifest's).

    Not by default: pytest's output is pytest's own (the table landed among the
    progress dots). ``benchmarks/bench_simplify.py`` prints the same counts.
    """
    yield
    reporter = pytestconfig.pluginmanager.getplugin("terminalreporter")
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")
    if reporter is None or capture is None or not _SUMMARY or pytestconfig.getoption("capture") != "no":
        return
    with capture.global_and_fixture_disabled():
        reporter.write_line("")
        reporter.write_line(f"real models, default passes {list(pipeline.PASSES)}: nodes before -> after "
                            "(manifest: before -> after at its last run)")
        for name, before, after, m_before, m_after, opset in sorted(_SUMMARY):
            reporter.write_line(f"  {name:30} {before!s:>5} -> {after!s:<5} ({m_before!s:>5} -> {m_after!s:<5})"
                                f"  opset {opset}")


def _optimize(case: Case, workdir: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> Run:
    """Runs ``optimize`` (default passes, with its own check) once per model and memoizes it."""
    if case.name in _RUNS:
        return _RUNS[case.name]
    out = workdir / f"{case.name}.opt.onnx"
    report = workdir / f"{case.name}.report.json"
    argv = [str(case.path), "-o", str(out), "--report", str(report), "-q"]
    # --dim only for names the model has: the command refuses any other.
    model = onnx.load(str(case.path), load_external_data=False)
    named = {d.dim_param for i in model.graph.input for d in i.type.tensor_type.shape.dim if d.dim_param}
    for dim, size in case.dims.items():
        if dim in named:
            argv += ["--dim", f"{dim}={size}"]
    capsys.readouterr()
    code = cli.main(argv)
    err = capsys.readouterr().err
    data = json.loads(report.read_text()) if report.exists() else None
    _RUNS[case.name] = run = Run(code, out, data, err)
    return run


def _optimized(case: Case, workdir: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> Run:
    run = _optimize(case, workdir, capsys)
    assert run.code == 0, f"optimize exited {run.code}: {run.stderr.strip()}"
    return run


def _default_opset(model: onnx.ModelProto) -> int | None:
    return next((int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")), None)


# --- seeded inputs and onnxruntime, independent of passes.verify.check ------------------------------

_NP_TYPES = {
    "tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16,
    "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8, "tensor(bool)": np.bool_,
}


def _session(path: pathlib.Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _inputs(session: ort.InferenceSession, dims: Mapping[str, int]) -> dict[str, np.ndarray]:
    """Seeded inputs: floats normal, integers in [0, 4) (valid token ids), booleans fair."""
    rng = np.random.default_rng(SEED)
    feeds = {}
    for arg in session.get_inputs():
        if arg.type not in _NP_TYPES:
            pytest.skip(f"input {arg.name!r} of type {arg.type}: no generator for it in this test")
        dtype = _NP_TYPES[arg.type]
        shape = [d if isinstance(d, int) and d >= 0 else dims.get(d, DIM) if isinstance(d, str) else DIM
                 for d in arg.shape]
        if dtype is np.bool_:
            feeds[arg.name] = rng.random(shape) < 0.5
        elif np.issubdtype(dtype, np.integer):
            feeds[arg.name] = rng.integers(0, 4, size=shape).astype(dtype)
        else:
            feeds[arg.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def _assert_close(name: str, expected: Any, actual: Any) -> None:
    """``|actual - expected| <= atol + rtol * |expected|`` with the documented per-dtype tolerances."""
    if isinstance(expected, list):  # ZipMap: a sequence of maps
        assert isinstance(actual, list) and len(actual) == len(expected), name
        for i, (e, a) in enumerate(zip(expected, actual)):
            _assert_close(f"{name}[{i}]", e, a)
        return
    if isinstance(expected, dict):
        assert isinstance(actual, dict) and expected.keys() == actual.keys(), name
        for key in expected:
            _assert_close(f"{name}[{key!r}]", np.float32(expected[key]), np.float32(actual[key]))
        return
    expected, actual = np.asarray(expected), np.asarray(actual)
    assert actual.dtype == expected.dtype, f"{name}: dtype {actual.dtype} instead of {expected.dtype}"
    assert actual.shape == expected.shape, f"{name}: shape {actual.shape} instead of {expected.shape}"
    if str(expected.dtype) in TOLERANCES:
        rtol, atol = TOLERANCES[str(expected.dtype)]
        np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, equal_nan=True, err_msg=name)
    else:
        np.testing.assert_array_equal(actual, expected, err_msg=name)


# --- tests ----------------------------------------------------------------------------------------


def test_manifest_lists_every_committed_model() -> None:
    on_disk = {p.stem for p in REAL_DIR.glob("*.onnx")}
    assert on_disk == set(MANIFEST["models"]), "run models/build_real_models.py to refresh MANIFEST.json"
    assert on_disk == {spec.name for spec in builder.MODELS}
    for name, entry in MANIFEST["models"].items():
        path = REAL_DIR / entry["file"]
        assert path.stat().st_size == entry["size"], name
        assert path.stat().st_size <= 2 << 20, f"{name} is over 2 MB"
        for key in ("source", "license", "producer", "opset", "nodes_before"):
            assert entry.get(key) not in (None, ""), f"{name}: manifest lacks {key}"
    assert sum(p.stat().st_size for p in REAL_DIR.glob("*.onnx")) <= 10 << 20


def test_the_models_cover_what_users_ship() -> None:
    ops: set[str] = set()
    opsets: set[int] = set()
    for entry in MANIFEST["models"].values():
        ops |= set(entry["op_counts_before"])
        opsets.add(entry["opset"])
    for op in ("ReduceLogSumExp", "ReduceL2", "ReduceSumSquare", "ReduceMean", "Scan", "TopK",
               "ai.onnx.ml::ZipMap", "BatchNormalization", "LSTM", "GRU", "Split", "Resize",
               "LayerNormalization", "Softmax", "Erf", "DynamicQuantizeLinear", "MatMulInteger"):
        assert op in ops, f"no committed real model has {op}"
    assert {11, 12, 13, 14, 15, 16, 17} <= opsets


@pytest.mark.parametrize("case", PARAMS)
def test_optimize_succeeds(case: Case, workdir: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _optimized(case, workdir, capsys)
    assert run.output.exists()
    assert run.report is not None and run.report["written"]
    check = run.report["check"]
    assert check is not None and check["ok"], check
    before, after = run.report["before"], run.report["after"]
    if case.manifest:
        assert before["nodes"] == case.manifest["nodes_before"], "the report's node count differs from the manifest's"
        assert before["op_counts"] == case.manifest["op_counts_before"]
    last = case.manifest.get("last_run", {})
    opset = after["opset"].get("", after["opset"].get("ai.onnx"))
    _SUMMARY.append((case.name, before["nodes"], after["nodes"], case.manifest.get("nodes_before"),
                     last.get("nodes_after", last.get("error", "-")[:20] if last else "-"), opset))
    print(f"{case.name}: nodes {before['nodes']} -> {after['nodes']} "
          f"(manifest {case.manifest.get('nodes_before')} -> {last.get('nodes_after')}), opset {opset}")


@pytest.mark.parametrize("case", PARAMS)
def test_output_is_valid(case: Case, workdir: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _optimized(case, workdir, capsys)
    onnx.checker.check_model(str(run.output), full_check=True)


@pytest.mark.parametrize("case", PARAMS)
def test_output_reaches_target_opset(case: Case, workdir: pathlib.Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    if "upgrade" not in pipeline.PASSES:
        pytest.skip("the upgrade pass is not registered in passes.pipeline.PASSES")
    run = _optimized(case, workdir, capsys)
    original = onnx.load(str(case.path), load_external_data=False)
    optimized = onnx.load(str(run.output), load_external_data=False)
    if _default_opset(original) is None:
        # A model importing only ai.onnx.ml has no default-domain opset to upgrade.
        assert _default_opset(optimized) in (None, TARGET_OPSET)
    else:
        assert _default_opset(optimized) == TARGET_OPSET


@pytest.mark.parametrize("case", PARAMS)
def test_outputs_match_onnxruntime(case: Case, workdir: pathlib.Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    run = _optimized(case, workdir, capsys)
    original = _session(case.path)
    optimized = _session(run.output)
    feeds = _inputs(original, case.dims)
    names = [o.name for o in original.get_outputs()]
    assert sorted(o.name for o in optimized.get_outputs()) == sorted(names)
    wanted = {i.name for i in optimized.get_inputs()}
    expected = original.run(None, feeds)
    actual = dict(zip([o.name for o in optimized.get_outputs()],
                      optimized.run(None, {k: v for k, v in feeds.items() if k in wanted})))
    for name, value in zip(names, expected):
        _assert_close(name, value, actual[name])


# --- heavy: rebuild with torch and scikit-learn ----------------------------------------------------


@pytest.mark.heavy
@pytest.mark.parametrize("spec", builder.MODELS, ids=lambda s: s.name)
def test_rebuilt_model_matches_committed(spec: Any, request: pytest.FixtureRequest,
                                         tmp_path: pathlib.Path) -> None:
    """Rebuilding with the installed torch / scikit-learn gives the committed graph (op counts, opset)."""
    if spec.name.startswith("sk_"):
        pytest.importorskip("sklearn")
        pytest.importorskip("skl2onnx")
    else:
        pytest.importorskip("torch")
    model = spec.build()
    onnx.checker.check_model(model, full_check=True)
    path = tmp_path / f"{spec.name}.onnx"
    path.write_bytes(model.SerializeToString())
    fresh = builder.describe(path)
    committed = MANIFEST["models"][spec.name]
    assert fresh["opset"] == committed["opset"] == spec.opset
    assert fresh["op_counts_before"] == committed["op_counts_before"]
    assert abs(fresh["size"] - committed["size"]) <= committed["size"] // 10


# --- a dynamically quantized export: no rounding change where a quantizer amplifies it ---------------


def test_a_dynamically_quantized_export_equals_the_original_at_every_size(tmp_path: pathlib.Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """TinyBert exported at opset 14 (its LayerNorms as primitive ops) and then ``quantize_dynamic``: every
    LayerNorm feeds a DynamicQuantizeLinear (directly or through the residual), whose scale and rounding
    would turn the fused op's 1e-7 into whole quantization steps at some sizes (a 6e-3 change of the
    hidden state at batch 2, sequence 32, when fused). The fusions are declined with that reason, and what the
    quantizers feed is the original's bit for bit at every size; ``log_probs`` differs by the ReduceLogSumExp
    decomposition's rounding alone (it reaches no quantizer), within the check's tolerance."""
    src = REAL_DIR / "tiny_bert_opset14_qdyn.onnx"
    out, report_path = tmp_path / "q.onnx", tmp_path / "q.json"
    assert cli.main([str(src), "-o", str(out), "--report", str(report_path), "-q"]) == 0
    report = json.loads(report_path.read_text())
    simplify = next(p for p in report["passes"] if p["name"] == "simplify")
    declined = simplify["stats"]["declined"]
    assert declined["fusions/layer_norm: rounding amplified by DynamicQuantizeLinear"] == 5, declined
    assert "LayerNormalization" not in report["after"]["op_counts"]
    original, optimized = _session(src), _session(out)
    names = [o.name for o in original.get_outputs()]
    for batch in (1, 2, 4):
        for seq in (5, 16, 32):
            rng = np.random.default_rng(batch * 100 + seq)
            feeds = {"input_ids": rng.integers(0, 256, (batch, seq)), "attention_mask": np.ones((batch, seq), np.int64)}
            expected, actual = original.run(None, feeds), optimized.run(None, feeds)
            for name, e, a in zip(names, expected, actual):
                if name == "log_probs":
                    _assert_close(name, e, a)
                else:
                    np.testing.assert_array_equal(a, e, err_msg=f"{name} at batch {batch}, sequence {seq}")
