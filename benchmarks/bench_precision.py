"""Benchmark: ``--precision fp16`` against onnxconverter-common and onnxslim's float16 conversions.

For each float32 model (``models/real/``, the models of ``tests/test_precision.py`` and
``bench_llm``'s GPT-2 and Llama exports at ``--llm-layers`` layers, TorchScript and dynamo), each
tool in a fresh process (``harness.measure``: its imports first, then the clock over load,
conversion and save; its peak RSS), the tools' runs alternating, the median of ``--repeat``:

* ours: ``python -m passes IN -o OUT --precision fp16`` (all passes, its check, its
  search for float32 islands); the report gives the check's seconds;
* onnxconverter-common: ``float16.convert_float_to_float16(model, keep_io_types=True)`` + ``onnx.save``;
* onnxslim: ``onnxslim.slim(model, dtype="fp16")`` (its own simplifications too; it converts
  the inputs and outputs to float16 too: its inputs are given as float16, its outputs compared
  as float32).

Then each result: does it load in onnxruntime (CPU, graph optimisations off), the largest
absolute error of each float output against the float32 model on three input sets
(standard-normal floats; integer inputs in [0, 10), a ``mask`` input all ones), the file
size (with external data), and whether its inputs and outputs keep float32.

onnxruntime's CPU provider runs most float16 nodes through a float32 kernel between Casts
it inserts (and drops the Casts between two such nodes): the errors measured here are
mostly those of the float16 weights and boundaries, not of float16 arithmetic. Ours also
reports the error of its emulation (each half node's output rounded to float16), the
figure its search holds to the float16 tolerance (``emulated`` below).

A second table gives the cost: ours' time (the whole command: every pass, the precision pass's
search, the save and the check; the precision pass's own seconds and the check's from its report)
and peak RSS as ratios to onnxconverter-common's, and ours' time against onnxconverter-common's
plus ours' own check (issue #37's target: at most 1x). The peak RSS is the tool's process only:
ours' check and search run onnxruntime in a child process, not counted.

Needs onnxconverter-common and onnxslim (not dependencies of this project)::

    python -m venv .benchvenv && .benchvenv/bin/pip install -e '.[test]' onnxconverter-common onnxslim
    .benchvenv/bin/python benchmarks/bench_precision.py [--quick] [--repeat N] [--only PATTERN,...]
        [--llm-layers N] [--json out.json]
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import pathlib
import statistics
import sys
import tempfile
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from harness import REPO, Measurement, measure  # noqa: E402

REAL = REPO / "models" / "real"


def _models(folder: pathlib.Path) -> dict[str, pathlib.Path]:
    found = {p.stem: p for p in sorted(REAL.glob("*.onnx"))}
    sys.path.insert(0, str(REPO / "tests"))
    import test_precision  # the test models

    for name, build in test_precision.MODELS.items():
        path = folder / f"test_{name}.onnx"
        onnx.save_model(build(), str(path))
        found[f"test: {name}"] = path
    return found


def _has_float(path: pathlib.Path) -> bool:
    model = onnx.load(str(path), load_external_data=False)
    return any(t.data_type == onnx.TensorProto.FLOAT for t in model.graph.initializer)


def _session(path: pathlib.Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _feeds(session: ort.InferenceSession, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for info in session.get_inputs():
        shape = [d if isinstance(d, int) and d > 0 else 2 for d in info.shape]
        if "int" in info.type:
            value = np.ones(shape) if "mask" in info.name else rng.integers(0, 10, shape)
            feeds[info.name] = value.astype(np.int64 if "64" in info.type else np.int32)
        elif "double" in info.type:
            feeds[info.name] = rng.standard_normal(shape)
        else:
            feeds[info.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def _size(path: pathlib.Path) -> int:
    data = path.with_name(path.name + ".data")
    return path.stat().st_size + (data.stat().st_size if data.exists() else 0)


def _io_float32(original: pathlib.Path, converted: pathlib.Path) -> bool:
    a = onnx.load(str(original), load_external_data=False).graph
    b = onnx.load(str(converted), load_external_data=False).graph
    types = lambda vs: [(v.name, v.type.tensor_type.elem_type) for v in vs]  # noqa: E731
    return types(a.input) == types(b.input) and types(a.output) == types(b.output)


def _measure(original: pathlib.Path, converted: pathlib.Path) -> dict[str, Any]:
    try:
        reference, session = _session(original), _session(converted)
    except Exception as e:  # noqa: BLE001
        return {"loads": False, "error": str(e).splitlines()[0][:160], "bytes": _size(converted)}
    errors: dict[str, float] = {}
    for seed in (0, 1, 2):
        feeds = _feeds(reference, seed)
        wanted = {i.name: i.type for i in session.get_inputs()}  # onnxslim makes float16 inputs
        own = {k: v.astype(np.float16) if wanted.get(k) == "tensor(float16)" else v for k, v in feeds.items()}
        try:
            expected = reference.run(None, feeds)
            actual = session.run(None, own)
        except Exception as e:  # noqa: BLE001
            return {"loads": True, "runs": False, "error": str(e).splitlines()[0][:160], "bytes": _size(converted)}
        for info, e, a in zip(reference.get_outputs(), expected, actual):
            if not isinstance(e, np.ndarray) or e.dtype.kind != "f":
                continue
            with np.errstate(invalid="ignore"):
                both = np.isfinite(e) & np.isfinite(np.asarray(a, np.float64))
                placement = bool((np.isfinite(e) != np.isfinite(np.asarray(a, np.float64))).any())
                delta = float(np.abs(e[both] - np.asarray(a)[both]).max()) if both.any() else 0.0
            errors[info.name] = max(errors.get(info.name, 0.0), float("inf") if placement else delta)
    return {"loads": True, "runs": True, "max_abs_error": errors, "bytes": _size(converted),
            "io_float32": _io_float32(original, converted)}  # fmt: skip


# Each tool runs in a fresh process (``harness.measure``): its imports first, then the clock over
# load + conversion + save (ours: the whole command, its check included), its peak RSS reported.
_OURS = f"""
import json, sys, time
sys.path.insert(0, {str(REPO)!r})
src, dst, report = sys.argv[1:4]
import onnx, onnx_ir, numpy, refimpl
import passes.cli, passes.pipeline, passes.modelio.load, passes.modelio.validate
start = time.perf_counter()
code = passes.cli.main([src, "-o", dst, "-q", "--precision", "fp16", "--report", report, *sys.argv[4:]])
out = {{"seconds": time.perf_counter() - start, "exit": code}}
try:
    with open(report, encoding="utf-8") as file:
        r = json.load(file)
    out["check_seconds"] = (r.get("phases") or {{}}).get("check", 0.0)
    out["error"] = (r.get("error") or "")[:200]
    precision = next((p for p in r["passes"] if p["name"] == "precision"), {{}})
    out["precision_seconds"] = precision.get("seconds")
    stats = precision.get("stats") or {{}}
    out["emulated"] = stats.get("max_abs_error", {{}})
    out["islands"] = len(stats.get("islands", {{}}))
except (OSError, ValueError, KeyError) as error:
    out["error"] = f"no report: {{error}}"
print(json.dumps(out))
"""

_ONNXCONVERTER = """
import json, sys, time
src, dst = sys.argv[1:3]
import onnx
from onnxconverter_common import float16
start = time.perf_counter()
try:
    model = float16.convert_float_to_float16(onnx.load(src), keep_io_types=True)
    onnx.save_model(model, dst)
    out = {"exit": 0}
except Exception as e:
    out = {"exit": 1, "error": (str(e).splitlines() or [type(e).__name__])[0][:200]}
out["seconds"] = time.perf_counter() - start
print(json.dumps(out))
"""

_ONNXSLIM = """
import json, sys, time
src, dst = sys.argv[1:3]
import onnx, onnxslim
start = time.perf_counter()
try:
    onnx.save_model(onnxslim.slim(src, dtype="fp16"), dst)
    out = {"exit": 0}
except Exception as e:
    out = {"exit": 1, "error": (str(e).splitlines() or [type(e).__name__])[0][:200]}
out["seconds"] = time.perf_counter() - start
print(json.dumps(out))
"""


def _run_tool(snippet: str, extra: list[str]) -> Any:
    def run(source: pathlib.Path, target: pathlib.Path) -> Measurement:
        args = [str(source), str(target), *([str(target.with_suffix(".json"))] if snippet is _OURS else []), *extra]
        return measure("tool", source.stem, snippet, args)

    return run


TOOLS = {"ours": _run_tool(_OURS, []), "onnxconverter-common": _run_tool(_ONNXCONVERTER, []),
         "onnxslim": _run_tool(_ONNXSLIM, [])}


def _llm_exports(layers: int) -> dict[str, pathlib.Path]:
    """``bench_llm``'s GPT-2 and Llama exports at ``layers`` layers (cached there; none if 0)."""
    if not layers:
        return {}
    import bench_llm

    found = {}
    for spec in bench_llm.specs(layers, bench_llm.HIDDEN):
        path, error = bench_llm.exported(spec, bench_llm.CACHE, 3600)
        if path is None:
            print(f"{spec.name}: export failed: {error}", file=sys.stderr)
        else:
            found[spec.name] = path
    return found


def _result(runs: list[Measurement]) -> dict[str, Any]:
    """One tool's runs on one model: the first run's report, the median time, the largest peak RSS."""
    first = runs[0]
    result: dict[str, Any] = dict(first.extra)
    if not all(m.ok for m in runs):
        failed = next(m for m in runs if not m.ok)
        return {"exit": 1, "error": failed.error, "seconds": None, "peak_mib": failed.peak_rss_mib}
    result["seconds"] = statistics.median(m.seconds for m in runs)
    result["peak_mib"] = max(m.peak_rss_mib for m in runs)
    for key in ("check_seconds", "precision_seconds"):
        if key in result:
            result[key] = statistics.median(m.extra.get(key) or 0.0 for m in runs)
    return result


def run(repeat: int = 1, only: str = "", llm_layers: int = 4) -> list[dict[str, Any]]:
    rows = []
    patterns = [p for p in only.split(",") if p]
    with tempfile.TemporaryDirectory(prefix="bench-precision-") as folder:
        work = pathlib.Path(folder)
        models = {**_models(work), **_llm_exports(llm_layers)}
        for name, source in models.items():
            if patterns and not any(fnmatch.fnmatchcase(name, p) for p in patterns):
                continue
            if not _has_float(source):
                continue
            row: dict[str, Any] = {"model": name, "float32_bytes": _size(source)}
            runs: dict[str, list[Measurement]] = {tool: [] for tool in TOOLS}
            for index in range(repeat):  # alternating: the machine's load falls on every tool alike
                for tool, convert in TOOLS.items():
                    target = work / f"{source.stem}.{tool}.{index}.onnx"
                    runs[tool].append(convert(source, target))
            for tool in TOOLS:
                result = _result(runs[tool])
                if result["exit"] == 0:
                    result.update(_measure(source, work / f"{source.stem}.{tool}.0.onnx"))
                row[tool] = result
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def _why(result: dict[str, Any]) -> str:
    text = result.get("error", "")
    for cut in ("failed:", "Error:", "INVALID_ARGUMENT :", "FAIL :"):
        if cut in text:
            text = text.split(cut, 1)[1].strip() or text
    return text[:70]


def _cell(result: dict[str, Any], original_bytes: int) -> str:
    if result.get("exit"):
        return f"refused/failed: {_why(result)}"
    if not result.get("loads"):
        return f"does not load: {_why(result)}"
    if not result.get("runs"):
        return f"does not run: {_why(result)}"
    worst = max(result["max_abs_error"].values(), default=0.0)
    text = f"{worst:.2g}, {result['bytes'] / original_bytes:.0%} size, {result['seconds']:.1f} s"
    if not result.get("io_float32", True):
        text += ", I/O not float32"
    if "emulated" in result:
        text += f", emulated {max(result['emulated'].values(), default=0.0):.2g}, {result['islands']} islands"
    return text


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| model | ours | onnxconverter-common | onnxslim |", "|---|---|---|---|"]
    for row in rows:
        cells = [_cell(row[tool], row["float32_bytes"]) for tool in TOOLS]
        lines.append(f"| {row['model']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _ratio(value: float | None, reference: float | None) -> str:
    return f"{value / reference:.2f}x" if value is not None and reference else "-"


def cost_table(rows: list[dict[str, Any]]) -> str:
    """Time and peak RSS against onnxconverter-common; the target: ours at most its time plus our check."""
    lines = ["| model | ours s (x occ) | its precision pass s | its check s | x (occ + check) | ours MiB (x occ) | "
             "occ s, MiB | onnxslim s (x occ) |", "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        ours, occ, slim = row["ours"], row["onnxconverter-common"], row["onnxslim"]
        ref = occ.get("seconds") if not occ.get("exit") else None
        check = ours.get("check_seconds")
        with_check = ref + check if ref is not None and check is not None else None
        shown = lambda r: f"{r['seconds']:.2f}" if r.get("seconds") is not None else "fail"  # noqa: E731
        own = ours.get("precision_seconds")
        occ_cell = f"{shown(occ)}, {occ.get('peak_mib', 0):.0f}" + (" (failed)" if occ.get("exit") else "")
        lines.append(
            f"| {row['model']} | {shown(ours)} ({_ratio(ours.get('seconds'), ref)}) | "
            f"{'-' if own is None else f'{own:.2f}'} | {'-' if check is None else f'{check:.2f}'} | {_ratio(ours.get('seconds'), with_check)} | "
            f"{ours.get('peak_mib', 0):.0f} ({_ratio(ours.get('peak_mib'), occ.get('peak_mib'))}) | {occ_cell} | "
            f"{shown(slim)} ({_ratio(slim.get('seconds'), ref)}) |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one run per tool (the default runs 3)")
    parser.add_argument("--repeat", type=int, default=None, help="runs per tool and model, alternating (default 3)")
    parser.add_argument("--only", default="", help="comma-separated model names or shell patterns")
    parser.add_argument("--llm-layers", type=int, default=4,
                        help="layers of bench_llm's GPT-2 and Llama exports added to the models (0: none; default 4)")
    parser.add_argument("--json", help="also write the rows there")
    parser.add_argument("--table", help="print the tables of rows written before by --json, and stop")
    args = parser.parse_args(argv)
    if args.table:
        rows = json.loads(pathlib.Path(args.table).read_text())
    else:
        rows = run(args.repeat or (1 if args.quick else 3), args.only, args.llm_layers)
    print(table(rows))
    print()
    print(cost_table(rows))
    if args.json and not args.table:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
