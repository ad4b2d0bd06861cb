"""Benchmark: ``--precision fp16`` against onnxconverter-common and onnxslim's float16 conversions.

For each float32 model (``models/real/`` and the models of ``tests/test_precision.py``):

* ours: ``python -m passes IN -o OUT --precision fp16`` (all passes, its check, its
  search for float32 islands), in a subprocess; exit code and wall time;
* onnxconverter-common: ``float16.convert_float_to_float16(model, keep_io_types=True)``;
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

Needs onnxconverter-common and onnxslim (not dependencies of this project)::

    python -m venv .benchvenv && .benchvenv/bin/pip install -e '.[test]' onnxconverter-common onnxslim
    .benchvenv/bin/python benchmarks/bench_precision.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

REPO = pathlib.Path(__file__).resolve().parent.parent
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


def _ours(source: pathlib.Path, target: pathlib.Path) -> dict[str, Any]:
    report = target.with_suffix(".json")
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "passes", str(source), "-o", str(target), "--precision", "fp16",
                           "--report", str(report)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    seconds = time.perf_counter() - start
    result: dict[str, Any] = {"seconds": round(seconds, 2), "exit": done.returncode}
    if done.returncode != 0:
        result["error"] = (done.stderr.strip().splitlines() or [""])[-1][:200]
        return result
    stats = [p for p in json.loads(report.read_text())["passes"] if p["name"] == "precision"][0]["stats"]
    result["emulated"] = stats.get("max_abs_error", {})
    result["islands"] = len(stats.get("islands", {}))
    return result


def _onnxconverter(source: pathlib.Path, target: pathlib.Path) -> dict[str, Any]:
    from onnxconverter_common import float16

    start = time.perf_counter()
    try:
        model = float16.convert_float_to_float16(onnx.load(str(source)), keep_io_types=True)
        onnx.save_model(model, str(target))
    except Exception as e:  # noqa: BLE001
        return {"seconds": round(time.perf_counter() - start, 2), "exit": 1, "error": str(e).splitlines()[0][:200]}
    return {"seconds": round(time.perf_counter() - start, 2), "exit": 0}


def _onnxslim(source: pathlib.Path, target: pathlib.Path) -> dict[str, Any]:
    import onnxslim

    start = time.perf_counter()
    try:
        model = onnxslim.slim(str(source), dtype="fp16")
        onnx.save_model(model, str(target))
    except Exception as e:  # noqa: BLE001
        return {"seconds": round(time.perf_counter() - start, 2), "exit": 1, "error": str(e).splitlines()[0][:200]}
    return {"seconds": round(time.perf_counter() - start, 2), "exit": 0}


TOOLS = {"ours": _ours, "onnxconverter-common": _onnxconverter, "onnxslim": _onnxslim}


def run() -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-precision-") as folder:
        work = pathlib.Path(folder)
        for name, source in _models(work).items():
            if not _has_float(source):
                continue
            row: dict[str, Any] = {"model": name, "float32_bytes": _size(source)}
            for tool, convert in TOOLS.items():
                target = work / f"{source.stem}.{tool}.onnx"
                result = convert(source, target)
                if result["exit"] == 0:
                    result.update(_measure(source, target))
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the rows there")
    parser.add_argument("--table", help="print the table of rows written before by --json, and stop")
    args = parser.parse_args()
    if args.table:
        print(table(json.loads(pathlib.Path(args.table).read_text())))
        return
    rows = run()
    print(table(rows))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
