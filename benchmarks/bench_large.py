"""A 15 GB model through ``optimize --no-check``, against copying its weights with ``cp``.

The model is built at run time and costs no disk until something is written:
224 float32 4096x4096 MatMul weights (14 GiB) as external data in one file
made with ``os.truncate`` (a sparse file of zeros), and an opset-13 graph
``x -> MatMul(w0) -> ... -> MatMul(w223) -> ReduceL2(axes=[-1]) ->
ReduceLogSum(axes=[-1])``. The passes upgrade the Reduce ops (axes become
inputs) and touch no weight, so the output's data file is a copy of the
input's: the floor is the time of copying the file.

Measured, alternating the tools and taking the median of ``--repeat`` runs:

- ``optimize``: ``python -m passes IN -o OUT --no-check -q`` (load with its
  validation and the ONNX checker, the passes, the save, the checker on the output),
  and the phase times of its ``--report`` (the ``save`` phase is the one that
  compares with ``cp``; the rest is start-up, validation and the passes);
- ``cp``: ``cp --sparse=never IN.data OUT.data`` (writes every byte, as the
  output's data file must be written).

Both write a real (not sparse) copy, so the disk needs the size of the weights
free; the script checks first (``shutil.disk_usage``, what ``df`` shows) and
removes what it wrote after each run. On a sparse input ``cp --sparse=never``
does not read the source at all (it finds the holes and writes zeros from a
buffer), while any copy that reads, the kernel's included, pays for reading
the holes; ``--dense`` writes the input for real, as a real model's weights
are, so that both read and write every byte. Peak RSS is the child's (``/usr/bin/time -v`` when present, else
``ru_maxrss`` of the child). ``--quick`` uses 16 weights (1 GiB).

Usage:
    python benchmarks/bench_large.py [--quick] [--weights N] [--repeat N] [--dir DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent

SIDE = 4096
WEIGHT_BYTES = SIDE * SIDE * 4
FULL_WEIGHTS = 224
QUICK_WEIGHTS = 16


def build_model(folder: pathlib.Path, weights: int, dense: bool = False) -> pathlib.Path:
    """Writes ``model.onnx`` and its ``model.onnx.data`` (sparse, or ``dense``) into ``folder``; returns its path."""
    import onnx
    from onnx import TensorProto, helper

    data_name = "model.onnx.data"
    inits, nodes, prev = [], [], "x"
    for i in range(weights):
        tensor = TensorProto(name=f"w{i}", data_type=TensorProto.FLOAT, dims=[SIDE, SIDE])
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", data_name), ("offset", str(i * WEIGHT_BYTES)), ("length", str(WEIGHT_BYTES))):
            tensor.external_data.add(key=key, value=value)
        inits.append(tensor)
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"h{i}"], name=f"mm{i}"))
        prev = f"h{i}"
    nodes.append(helper.make_node("ReduceL2", [prev], ["l2"], name="l2", axes=[-1], keepdims=1))
    nodes.append(helper.make_node("ReduceLogSum", ["l2"], ["y"], name="logsum", axes=[-1], keepdims=1))
    graph = helper.make_graph(
        nodes, "large",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", SIDE])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 1])],
        inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8,
                              producer_name="onnx-optimize benchmarks/bench_large.py")  # fmt: skip
    path = folder / "model.onnx"
    onnx.save_model(model, str(path))
    with open(folder / data_name, "wb") as f:
        if dense:  # every block allocated: what a real model's weights are
            block = bytes(64 << 20)
            for _ in range(weights * WEIGHT_BYTES // len(block)):
                f.write(block)
        os.truncate(f.fileno(), weights * WEIGHT_BYTES)
    return path


def _run(command: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """Runs ``command``; its wall time, exit status and peak RSS (MiB)."""
    timer = shutil.which("time") or ("/usr/bin/time" if os.path.exists("/usr/bin/time") else None)
    with tempfile.NamedTemporaryFile("r", suffix=".time") as stats:
        full = [timer, "-v", "-o", stats.name, *command] if timer else command
        start = time.perf_counter()
        proc = subprocess.run(full, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - start
        rss_kib = 0
        if timer:
            for line in stats.read().splitlines():
                if "Maximum resident set size" in line:
                    rss_kib = int(line.rsplit(":", 1)[1])
        else:
            rss_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    error = "" if proc.returncode == 0 else (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
    return {"seconds": wall, "exit": proc.returncode, "peak_rss_mib": rss_kib / 1024, "error": error}


def _remove(*paths: pathlib.Path) -> None:
    for path in paths:
        path.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_WEIGHTS} weights (1 GiB) instead of {FULL_WEIGHTS}")
    parser.add_argument("--weights", type=int, default=None, help="number of 64 MiB weights (overrides --quick)")
    parser.add_argument("--repeat", type=int, default=None, help="runs per tool (default: 3, quick: 3)")
    parser.add_argument("--dense", action="store_true",
                        help="write the input's weights for real (needs twice the disk): cp then has to read them "
                             "too, as with a real model; a sparse input lets cp skip reading its holes")
    parser.add_argument("--dir", type=pathlib.Path, default=None, help="where to build the model (default: a temp folder)")
    parser.add_argument("--json", type=pathlib.Path, default=None, help="where to save the measurements")
    args = parser.parse_args(argv)
    weights = args.weights or (QUICK_WEIGHTS if args.quick else FULL_WEIGHTS)
    repeat = args.repeat or 3
    nbytes = weights * WEIGHT_BYTES
    parent = args.dir or pathlib.Path(tempfile.gettempdir())
    free = shutil.disk_usage(parent).free
    needed = nbytes * (2 if args.dense else 1) + (256 << 20)
    if free < needed:
        print(f"bench_large: skipped: {free / 2**30:.1f} GiB free in {parent}, needs {needed / 2**30:.1f} GiB",
              file=sys.stderr)  # fmt: skip
        if args.json:
            args.json.write_text(json.dumps({"meta": {"skipped": "not enough free disk"}, "results": []}) + "\n")
        return 0
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    results: dict[str, list[dict[str, Any]]] = {"optimize": [], "cp": []}
    folder = pathlib.Path(tempfile.mkdtemp(prefix="bench_large.", dir=parent))
    try:
        src = build_model(folder, weights, dense=args.dense)
        out = folder / "out.onnx"
        copy = folder / "copy.data"
        for i in range(repeat):
            for tool in ("optimize", "cp") if i % 2 == 0 else ("cp", "optimize"):
                if tool == "optimize":
                    report = folder / "report.json"
                    run = _run([sys.executable, "-m", "passes", str(src), "-o", str(out), "--no-check", "-q",
                                "--report", str(report)], env)  # fmt: skip
                    data = out.with_name(out.name + ".data")
                    run["output_bytes"] = data.stat().st_size if data.exists() else 0
                    if report.exists():
                        run["phases"] = json.loads(report.read_text()).get("phases", {})
                    _remove(out, data, report)
                else:
                    run = _run(["cp", "--sparse=never", str(src) + ".data", str(copy)])
                    _remove(copy)
                results[tool].append(run)
                print(f"bench_large: {tool} run {i + 1}: {run['seconds']:.2f} s, {run['peak_rss_mib']:.0f} MiB"
                      + (f" ({run['error']})" if run["error"] else ""), file=sys.stderr, flush=True)  # fmt: skip
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    summary = {
        tool: {
            "median_seconds": statistics.median(r["seconds"] for r in runs),
            "median_peak_rss_mib": statistics.median(r["peak_rss_mib"] for r in runs),
            "ok": all(r["exit"] == 0 for r in runs),
        }
        for tool, runs in results.items()
    }
    phase_names = {name for r in results["optimize"] for name in r.get("phases", {})}
    summary["optimize"]["median_phase_seconds"] = {
        name: statistics.median(r["phases"].get(name, 0.0) for r in results["optimize"] if "phases" in r)
        for name in sorted(phase_names)
    }
    ratio = summary["optimize"]["median_seconds"] / summary["cp"]["median_seconds"]
    gib = nbytes / 2**30
    print(f"{'tool':<10} {'median s':>9} {'x cp':>6} {'GiB/s':>7} {'peak MiB':>9}  ok")
    for tool, s in summary.items():
        print(f"{tool:<10} {s['median_seconds']:>9.2f} {s['median_seconds'] / summary['cp']['median_seconds']:>6.2f} "
              f"{gib / s['median_seconds']:>7.2f} {s['median_peak_rss_mib']:>9.0f}  {'yes' if s['ok'] else 'NO'}")  # fmt: skip
    phases = summary["optimize"]["median_phase_seconds"]
    if phases:
        cp = summary["cp"]["median_seconds"]
        print("optimize phases (median s): " + ", ".join(f"{k} {v:.2f}" for k, v in phases.items())
              + (f"; save / cp = {phases['save'] / cp:.2f}" if "save" in phases else ""))  # fmt: skip
    if args.json:
        meta = {"weights": weights, "bytes": nbytes, "dense": args.dense, "repeat": repeat, "optimize_over_cp": ratio, "dir": str(parent)}
        args.json.write_text(json.dumps({"meta": meta, "summary": summary, "results": results}, indent=2) + "\n")
    return 0 if all(s["ok"] for s in summary.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
