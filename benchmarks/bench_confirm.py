"""The cost of confirming folded values with onnxruntime: ``optimize M -o out.onnx`` with and without it.

Each model is optimised by the command (``python -m passes M -o OUT --report R``)
in a fresh process, ``--repeat`` times with confirmation (the default) and as
many with ``--no-fold-confirm``, alternating; the figures are the medians of
the wall time of the whole command and of the fold pass (from the report), and
their ratios. Models: ``models/demo.onnx``, every ``models/real/*.onnx``, a
5,000-node foldable chain (``Add``/``Mul``, all of it sent to onnxruntime) and,
without ``--quick``, a 64 MiB weight through ``Mul`` and ``Transpose`` (one
session over it; run with ``--no-check``, see :data:`NO_CHECK`). The machine's
load moves the wall times by more than confirmation costs on the small
models: the ``added/wall`` column (the fold pass's extra seconds over the
whole run) is the steadier figure.

Usage::

    python benchmarks/bench_confirm.py [--quick] [--repeat N] [--json out.json]
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

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = pathlib.Path(__file__).resolve().parents[1]
F32 = TensorProto.FLOAT


def _model(nodes, inputs, outputs, initializers) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "bench", inputs, outputs, initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


def foldable_chain(n: int) -> onnx.ModelProto:
    """``c -> Add/Mul -> ... (n nodes) -> Add(x, .)``: everything but the last Add folds."""
    nodes, prev = [], "c"
    for i in range(n):
        nodes.append(helper.make_node("Mul" if i % 2 else "Add", [prev, "k"], [f"v{i}"], name=f"n{i}"))
        prev = f"v{i}"
    nodes.append(helper.make_node("Add", ["x", prev], ["y"], name="out"))
    inits = [numpy_helper.from_array(np.full(16, 0.5, np.float32), "c"),
             numpy_helper.from_array(np.full(16, 0.999, np.float32), "k")]  # fmt: skip
    return _model(nodes, [helper.make_tensor_value_info("x", F32, [16])],
                  [helper.make_tensor_value_info("y", F32, [16])], inits)  # fmt: skip


def weight_transform(rows: int) -> onnx.ModelProto:
    """A ``rows x rows`` float32 weight through Mul and Transpose into a MatMul."""
    weight = np.random.default_rng(0).standard_normal((rows, rows), dtype=np.float32)
    nodes = [helper.make_node("Mul", ["w", "half"], ["wm"]), helper.make_node("Transpose", ["wm"], ["wt"]),
             helper.make_node("MatMul", ["x", "wt"], ["y"])]  # fmt: skip
    inits = [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(np.array(0.5, np.float32), "half")]
    return _model(nodes, [helper.make_tensor_value_info("x", F32, [1, rows])],
                  [helper.make_tensor_value_info("y", F32, [1, rows])], inits)  # fmt: skip


#: Models run with ``--no-check`` (both ways): onnxruntime prepacks a MatMul's constant weight, whose
#: result then differs by rounding beyond the check's tolerance on a 4096-wide product (not a fold issue).
NO_CHECK = {"weight_64mib.onnx"}


def run(model: pathlib.Path, folder: pathlib.Path, confirm: bool) -> tuple[float, float, dict]:
    """One run of the command: (wall seconds, fold seconds, fold stats)."""
    out, report = folder / "out.onnx", folder / "report.json"
    args = [sys.executable, "-m", "passes", str(model), "-o", str(out), "--report", str(report), "-q"]
    if not confirm:
        args.append("--no-fold-confirm")
    if model.name in NO_CHECK:
        args.append("--no-check")
    start = time.perf_counter()
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{model.name}: exit {done.returncode}: {done.stderr.strip()[-300:]}")
    data = json.loads(report.read_text())
    fold = next((p for p in data["passes"] if p["name"] == "fold"), {"seconds": 0.0, "stats": {}})
    return wall, fold["seconds"], fold["stats"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer models, one repeat")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", help="also write the figures there")
    args = parser.parse_args()
    repeat = 1 if args.quick else args.repeat
    with tempfile.TemporaryDirectory() as tmp:
        folder = pathlib.Path(tmp)
        models = [ROOT / "models" / "demo.onnx"]
        if not args.quick:
            models += sorted((ROOT / "models" / "real").glob("*.onnx"))
        chain = folder / "chain_5k.onnx"
        onnx.save(foldable_chain(5000), chain)
        models.append(chain)
        if not args.quick:
            weight = folder / "weight_64mib.onnx"
            onnx.save(weight_transform(4096), weight)
            models.append(weight)
        rows = []
        header = (f"{'model':<34} {'confirmed':>9} {'other':>6} {'wall on':>8} {'wall off':>8} {'ratio':>6}"
                  f" {'fold on':>8} {'fold off':>8} {'added/wall':>10}")  # fmt: skip
        print(header)
        print("-" * len(header))
        for model in models:
            on, off, stats = [], [], {}
            for _ in range(repeat):
                wall, fold, stats = run(model, folder, True)
                on.append((wall, fold))
                off.append(run(model, folder, False)[:2])
            wall_on, fold_on = (statistics.median(x) for x in zip(*on))
            wall_off, fold_off = (statistics.median(x) for x in zip(*off))
            other = sum(stats.get("disagrees_with_onnxruntime", {}).values()) + sum(stats.get("unconfirmed", {}).values())
            row = {"model": model.name, "confirmed": stats.get("confirmed", 0), "not_confirmed": other,
                   "wall_on": wall_on, "wall_off": wall_off, "ratio": wall_on / wall_off,
                   "fold_on": fold_on, "fold_off": fold_off, "added_share": (fold_on - fold_off) / wall_on}  # fmt: skip
            rows.append(row)
            print(f"{model.name[:34]:<34} {row['confirmed']:>9} {other:>6} {wall_on:>8.3f} {wall_off:>8.3f}"
                  f" {row['ratio']:>5.2f}x {fold_on:>8.3f} {fold_off:>8.3f} {row['added_share']:>9.1%}")  # fmt: skip
    print("\nratio: wall time with confirmation over without (medians of", repeat, "runs each);",
          "added/wall: the fold pass's extra seconds as a share of the run with confirmation.")  # fmt: skip
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"repeat": repeat, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
