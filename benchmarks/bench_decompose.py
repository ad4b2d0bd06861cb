"""Benchmark: the decomposed ReduceLogSumExp against onnxruntime's native kernel.

For each case (shape, axis, dtype) it builds a one-node ReduceLogSumExp model and
its decomposition (``passes.decompose.DecomposeLogSumExpPass``) and measures in
onnxruntime on the CPU with one thread:

* latency: median (and 10th/90th percentile) of ``--repeat`` runs after warm-up,
  with graph optimisations disabled (ORT_DISABLE_ALL) and at ORT_ENABLE_ALL, the
  default a user deploys with; ratio = decomposed / native (< 1: faster);
* peak memory: each (model, level) runs in a fresh Python subprocess that imports
  onnxruntime and allocates the input, resets the kernel's peak-RSS counter
  (``/proc/self/clear_refs``) and reads the current RSS (the baseline), then
  creates the session, runs it 10 times and reads the peak RSS (``VmHWM``).
  The difference is the peak memory the session and its runs add (the arena
  with the intermediates and the output; there are no weights). "extra" =
  decomposed minus native: what the decomposition costs on top of the native op;
* accuracy: the largest error of each output in ulp of the result, against
  log-sum-exp computed in long double from the same inputs (N(0, 1) data).

Usage::

    python benchmarks/bench_decompose.py [--repeat 30] [--json results.json] [--quick]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
from onnx import helper, numpy_helper

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from passes.decompose import DecomposeLogSumExpPass  # noqa: E402

CASES = [((64, 4096), -1), ((8, 512, 512), 1)]
QUICK_CASES = [((16, 1024), -1), ((2, 256, 256), 1)]
DTYPES = {"float32": np.float32, "float16": np.float16}
LEVELS = {"disable_all": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
          "enable_all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}  # fmt: skip

_MEMORY_PROBE = """
import resource, sys
import numpy as np, onnxruntime as ort

def status_kib(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":"))

path, level, dtype, repeat = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
shape = tuple(int(d) for d in sys.argv[5].split(","))
x = np.random.default_rng(0).standard_normal(shape).astype(dtype)
try:  # Linux >= 4.0: writing 5 resets the peak RSS (VmHWM) to the current RSS
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = status_kib("VmRSS")
except OSError:  # no reset: fall back on the high-water mark so far
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
options = ort.SessionOptions()
options.graph_optimization_level = ort.GraphOptimizationLevel(level)
options.intra_op_num_threads = 1
options.inter_op_num_threads = 1
session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
for _ in range(repeat):
    session.run(None, {"x": x})
after = status_kib("VmHWM")
print(before, after)
"""


def native_model(shape: tuple[int, ...], axis: int, dtype: type) -> onnx.ModelProto:
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    out_shape = [1 if i == axis % len(shape) else d for i, d in enumerate(shape)]
    node = helper.make_node("ReduceLogSumExp", ["x", "axes"], ["y"], name="lse", keepdims=1)
    graph = helper.make_graph(
        [node], "bench", [helper.make_tensor_value_info("x", elem, shape)],
        [helper.make_tensor_value_info("y", elem, out_shape)],
        [numpy_helper.from_array(np.array([axis], np.int64), "axes")],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


def decomposed_model(native: onnx.ModelProto) -> onnx.ModelProto:
    model = ir.serde.deserialize_model(native)
    DecomposeLogSumExpPass()(model)
    return ir.serde.serialize_model(model)


def session(model: onnx.ModelProto, level: ort.GraphOptimizationLevel) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def latencies(sessions: dict[str, ort.InferenceSession], x: np.ndarray, repeat: int) -> dict[str, dict[str, float]]:
    """Runs the sessions interleaved (so load changes hit both alike); ms statistics per session."""
    for s in sessions.values():
        for _ in range(3):
            s.run(None, {"x": x})
    times: dict[str, list[float]] = {name: [] for name in sessions}
    for _ in range(repeat):
        for name, s in sessions.items():
            start = time.perf_counter()
            s.run(None, {"x": x})
            times[name].append((time.perf_counter() - start) * 1e3)
    return {
        name: {"median_ms": statistics.median(t), "p10_ms": float(np.percentile(t, 10)),
               "p90_ms": float(np.percentile(t, 90))}  # fmt: skip
        for name, t in times.items()
    }


def peak_rss_delta_mb(path: pathlib.Path, level: ort.GraphOptimizationLevel, x: np.ndarray, repeat: int) -> float:
    args = [sys.executable, "-c", _MEMORY_PROBE, str(path), str(int(level)), x.dtype.name, str(repeat),
            ",".join(map(str, x.shape))]  # fmt: skip
    before, after = map(int, subprocess.run(args, check=True, capture_output=True, text=True).stdout.split())
    return (after - before) / 1024  # KiB


def max_ulp_error(got: np.ndarray, x: np.ndarray, axis: int) -> float:
    """Largest |got - truth| in ulp of the output type at the truth (long-double oracle)."""
    xl = x.astype(np.longdouble)
    m = np.max(xl, axis=axis, keepdims=True)
    truth = m + np.log(np.sum(np.exp(xl - m), axis=axis, keepdims=True))
    finfo = np.finfo(x.dtype)
    exponent = np.maximum(np.floor(np.log2(np.abs(truth))), finfo.minexp)
    return float(np.max(np.abs(got.astype(np.longdouble) - truth) / np.exp2(exponent - finfo.nmant)))


def run(repeat: int, quick: bool, workdir: pathlib.Path) -> list[dict[str, Any]]:
    results = []
    for shape, axis in QUICK_CASES if quick else CASES:
        for dtype_name, dtype in DTYPES.items():
            x = np.random.default_rng(0).standard_normal(shape).astype(dtype)
            models = {"native": native_model(shape, axis, dtype)}
            models["decomposed"] = decomposed_model(models["native"])
            paths = {}
            for name, model in models.items():
                paths[name] = workdir / f"lse_{name}_{dtype_name}_{'x'.join(map(str, shape))}.onnx"
                onnx.save(model, paths[name])
            row: dict[str, Any] = {"shape": list(shape), "axis": axis, "dtype": dtype_name}
            for level_name, level in LEVELS.items():
                sessions = {name: session(model, level) for name, model in models.items()}
                lat = latencies(sessions, x, repeat)
                mem = {name: peak_rss_delta_mb(paths[name], level, x, min(repeat, 10)) for name in models}
                row[level_name] = {
                    "latency": lat,
                    "ratio": lat["decomposed"]["median_ms"] / lat["native"]["median_ms"],
                    "peak_rss_delta_mb": mem,
                    "extra_peak_rss_mb": mem["decomposed"] - mem["native"],
                }
                if level_name == "disable_all":
                    row["max_ulp_error"] = {
                        name: max_ulp_error(s.run(None, {"x": x})[0], x, axis) for name, s in sessions.items()
                    }
            results.append(row)
            report(row)
    return results


def report(row: dict[str, Any]) -> None:
    head = f"{row['dtype']:8} {str(tuple(row['shape'])):15} axis {row['axis']:>2}"
    for level_name in LEVELS:
        r = row[level_name]
        lat, mem = r["latency"], r["peak_rss_delta_mb"]
        print(
            f"{head}  {level_name:11}  native {lat['native']['median_ms']:8.3f} ms  "
            f"decomposed {lat['decomposed']['median_ms']:8.3f} ms  ratio {r['ratio']:5.2f}  "
            f"peak RSS +{mem['native']:6.1f} / +{mem['decomposed']:6.1f} MB (extra {r['extra_peak_rss_mb']:+6.1f} MB)"
        )
    err = row["max_ulp_error"]
    print(f"{head}  max error: native {err['native']:.2f} ulp, decomposed {err['decomposed']:.2f} ulp")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=30, help="timed runs per session (default 30)")
    parser.add_argument("--json", type=pathlib.Path, help="write the figures to this file")
    parser.add_argument("--quick", action="store_true", help="small shapes, for a smoke test")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        results = run(args.repeat, args.quick, pathlib.Path(tmp))
    if args.json:
        meta = {"onnxruntime": ort.__version__, "threads": 1, "repeat": args.repeat}
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
