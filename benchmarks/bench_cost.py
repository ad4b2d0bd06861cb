"""Cost that grows with the graph: long chains and a large tree ensemble, ours next to the other tools.

Cases (each tool in a fresh subprocess, the tools' runs alternating, the median of ``--repeat``):

* ``chain 10k``: 10,000 chained opset-13 reduce nodes (axes attributes), the default pipeline
  with its onnxruntime check (``optimize+check``) and without (``optimize``), against
  ``vc+onnxsim`` (onnx.version_converter then onnxsim.simplify) and ``onnxslim``, and
  ``check-floor``: what any run of ours with its check pays in the libraries whatever its passes
  do: onnx_ir's load of the input, onnx_ir's save of our output and onnxruntime's session of that
  output (the check's second session; the original's session overlaps the passes). The output is
  made first by an untimed ``--no-check`` run in the same child;
* ``chain 50k``: 50,000 of them, ``--passes upgrade --no-check`` (``upgrade``) against
  ``onnx.version_converter`` alone (``vc``), and ``ir-floor``: onnx_ir's own load and save,
  which every run of ours pays;
* ``trees``: a scikit-learn RandomForest of 1,200 trees on random data through skl2onnx (about
  70 MiB of TreeEnsembleClassifier attributes): ``--precision fp16`` (``fp16``, nothing in it
  can take float16) against the same run without it (``optimize``), both ``--no-check``.

The time is the child's own (imports excluded); the peak RSS is the child's.

Usage::

    python benchmarks/bench_cost.py [--quick] [--repeat N] [--cases chain10k,chain50k,trees] [--json FILE]
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import tempfile

import numpy as np
import onnx

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_upgrade import reduce_chain  # noqa: E402
from harness import REPO, Measurement, measure, save_json, tool_installed, tool_snippet  # noqa: E402

TARGET = 18

_OURS = f"""
import json, sys, time
sys.path.insert(0, {str(REPO)!r})
src, dst = sys.argv[1], sys.argv[2]
import onnx, onnx_ir, numpy
import passes.cli, passes.pipeline, passes.modelio.load, passes.modelio.validate
start = time.perf_counter()
code = passes.cli.main([src, "-o", dst, "-q", *sys.argv[3:]])
if code:
    sys.exit(code)
print(json.dumps({{"seconds": time.perf_counter() - start}}))
"""

_VC = """
import json, sys, time
src, dst = sys.argv[1], sys.argv[2]
import onnx, onnx.version_converter
start = time.perf_counter()
onnx.save(onnx.version_converter.convert_version(onnx.load(src), 18), dst)
print(json.dumps({"seconds": time.perf_counter() - start}))
"""

_IR_FLOOR = """
import json, sys, time
src, dst = sys.argv[1], sys.argv[2]
import onnx_ir as ir
start = time.perf_counter()
ir.save(ir.load(src), dst)
print(json.dumps({"seconds": time.perf_counter() - start}))
"""

_CHECK_FLOOR = f"""
import json, os, sys, tempfile, time
sys.path.insert(0, {str(REPO)!r})
src, dst = sys.argv[1], sys.argv[2]
import onnx_ir as ir, onnxruntime as ort
import passes.cli
made = dst + ".ours.onnx"
if passes.cli.main([src, "-o", made, "-q", "--no-check", *sys.argv[3:]]):
    sys.exit(1)
output = ir.load(made)
options = ort.SessionOptions()
options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
start = time.perf_counter()
ir.load(src)
ir.save(output, dst)
ort.InferenceSession(dst, options, providers=["CPUExecutionProvider"])
seconds = time.perf_counter() - start
os.unlink(made)
print(json.dumps({{"seconds": seconds}}))
"""

#: case -> {tool: (snippet, extra arguments)}; the first tool is the reference of the ratios.
_TOOLS: dict[str, dict[str, tuple[str, list[str]]]] = {
    "chain10k": {
        "vc+onnxsim": (tool_snippet("vc+onnxsim", TARGET), []),
        "optimize+check": (_OURS, ["--target-opset", str(TARGET)]),
        "optimize": (_OURS, ["--target-opset", str(TARGET), "--no-check"]),
        "onnxslim": (tool_snippet("onnxslim", TARGET), []),
        "check-floor": (_CHECK_FLOOR, ["--target-opset", str(TARGET)]),
    },
    "chain50k": {
        "vc": (_VC, []),
        "upgrade": (_OURS, ["--passes", "upgrade", "--target-opset", str(TARGET), "--no-check"]),
        "ir-floor": (_IR_FLOOR, []),
    },
    "trees": {
        "optimize": (_OURS, ["--no-check"]),
        "fp16": (_OURS, ["--no-check", "--precision", "fp16"]),
    },
}


def tree_ensemble(trees: int) -> onnx.ModelProto:
    """A RandomForestClassifier of ``trees`` full-depth trees on random data, through skl2onnx."""
    from sklearn.ensemble import RandomForestClassifier
    from skl2onnx import to_onnx

    rng = np.random.default_rng(0)
    x = rng.standard_normal((4000, 20)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] * x[:, 2] + rng.standard_normal(4000) > 0).astype(np.int64) + (x[:, 3] > 1)
    forest = RandomForestClassifier(n_estimators=trees, random_state=0, n_jobs=1).fit(x, y)
    return to_onnx(forest, x[:1], options={"zipmap": False}, target_opset={"": 15, "ai.onnx.ml": 3})


def build(case: str, folder: pathlib.Path, quick: bool) -> pathlib.Path:
    """Writes the input model of ``case``; returns its path."""
    path = folder / f"{case}.onnx"
    if case == "chain10k":
        onnx.save(reduce_chain(1000 if quick else 10_000), path)
    elif case == "chain50k":
        onnx.save(reduce_chain(5000 if quick else 50_000), path)
    else:
        onnx.save(tree_ensemble(60 if quick else 1200), path)
    return path


def _median(runs: list[Measurement]) -> tuple[float | None, float]:
    times = [m.seconds for m in runs if m.ok and m.seconds is not None]
    return (statistics.median(times) if len(times) == len(runs) else None), max(m.peak_rss_mib for m in runs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, one run: a smoke test")
    parser.add_argument("--repeat", type=int, default=None, help="runs per tool and case (default 3)")
    parser.add_argument("--cases", default=",".join(_TOOLS), help="comma-separated subset of %(default)s")
    parser.add_argument("--json", type=pathlib.Path, default=None, help="where to save the measurements")
    args = parser.parse_args(argv)
    repeat = args.repeat or (1 if args.quick else 3)
    cases = [c for c in args.cases.split(",") if c]
    unknown = sorted(set(cases) - set(_TOOLS))
    if unknown:
        parser.error(f"unknown cases: {', '.join(unknown)} (known: {', '.join(_TOOLS)})")
    results: list[Measurement] = []
    lines = [f"{'case':<10} {'tool':<15} {'median s':>9} {'ratio':>7} {'peak MiB':>9}"]
    with tempfile.TemporaryDirectory() as tmp:
        folder = pathlib.Path(tmp)
        for case in cases:
            src = build(case, folder, args.quick)
            # the other tools only where installed (ours, vc and the floor need what we need)
            tools = {t: v for t, v in _TOOLS[case].items() if t not in ("vc+onnxsim", "onnxslim") or not tool_installed(t)}
            runs: dict[str, list[Measurement]] = {t: [] for t in tools}
            for index in range(repeat):  # alternating: load on the machine falls on every tool alike
                for tool, (snippet, extra) in tools.items():
                    dst = folder / f"{case}.{tool}.{index}.onnx"
                    m = measure(tool, case, snippet, [str(src), str(dst), *extra])
                    runs[tool].append(m)
                    results.append(m)
                    dst.unlink(missing_ok=True)
                    print(f"{case} / {tool}: {m.seconds} s, {m.peak_rss_mib:.0f} MiB {m.error}", flush=True)
            reference = None
            for tool, measured in runs.items():
                seconds, rss = _median(measured)
                reference = seconds if reference is None else reference
                ratio = f"{seconds / reference:.2f}x" if seconds is not None and reference else "-"
                shown = f"{seconds:.3f}" if seconds is not None else "fail"
                lines.append(f"{case:<10} {tool:<15} {shown:>9} {ratio:>7} {rss:>9.0f}")
    print()
    print("\n".join(lines))
    if args.json is not None:
        save_json(args.json, results, {"repeat": repeat, "quick": args.quick, "target_opset": TARGET})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
