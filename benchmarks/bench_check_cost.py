"""The cost of checking at more than one size: the whole run with and without the larger sets, against vc+onnxsim.

Per model, each in a fresh interpreter on the same file (wall time of the whole process, what a
user waits for):

- ``vc+onnxsim``: ``onnx.version_converter.convert_version(m, 18)`` then ``onnxsim.simplify``
  (no check at all);
- ``optimize, one size``: ``optimize IN OUT`` with the larger sets switched off
  (``passes.verify.sets.LARGER_BYTES = -1``: every larger set over the budget), i.e. the check
  as it was before it explored sizes (edge values, NaN/infinity and 0-sized sets still run);
- ``optimize, sizes``: ``optimize IN OUT`` as shipped (each dynamic dim also at a larger size,
  within the budget).

The original's second runs (the noise rule) cost nothing here: they happen only where outputs
differ. Printed side by side, with each ``optimize`` time as a ratio to vc+onnxsim's and the
check's own seconds (from ``--report``) and the sizes it checked.

With ``--flags '--precision fp16'`` both ``optimize`` runs convert to float16: the search's check
runs the long sequence set (4096) too.

Usage:
    python benchmarks/bench_check_cost.py [--models NAME,...] [--repeat N] [--flags '--precision fp16']
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from harness import measure, tool_installed, tool_snippet  # noqa: E402

MODELS = ("demo.onnx", "real/small_cnn_opset13.onnx", "real/tiny_bert_opset17.onnx",
          "real/tiny_bert_opset14_qdyn.onnx", "real/tiny_rnn_opset12.onnx")  # fmt: skip

_OURS = """
import json, sys, time
sys.path.insert(0, {repo!r})
start = time.perf_counter()
from passes.verify import sets
if {one_size!r}:
    sets.LARGER_BYTES = -1
from passes.cli import command
src, dst, report = sys.argv[1], sys.argv[2], sys.argv[3]
code = command.main([src, dst, "--report", report, *sys.argv[4:]])
seconds = time.perf_counter() - start
data = json.load(open(report))
check = data.get("check") or {{}}
inputs = check.get("inputs") or {{}}
print(json.dumps({{"seconds": seconds, "exit": code, "check_seconds": (check.get("seconds") or {{}}).get("check"),
                  "sizes": inputs.get("sizes"), "status": data.get("status")}}))
"""


def _best(runs: list) -> object:
    ok = [r for r in runs if r.ok]
    return min(ok, key=lambda r: r.wall_seconds) if ok else runs[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--repeat", type=int, default=3, help="runs per tool and model; the fastest is kept")
    parser.add_argument("--flags", default="", help="more flags for optimize, e.g. '--precision fp16'")
    args = parser.parse_args()
    have_onnxsim = tool_installed("vc+onnxsim") == ""
    print(f"{'model':<34}{'vc+onnxsim':>11}{'one size':>18}{'sizes':>18}{'check 1':>9}{'check n':>9}  sizes checked")
    for name in args.models.split(","):
        src = REPO / "models" / name
        with tempfile.TemporaryDirectory() as tmp:
            out, report = pathlib.Path(tmp) / "out.onnx", pathlib.Path(tmp) / "r.json"
            found = {}
            for label, snippet in (("one", _OURS.format(repo=str(REPO), one_size=True)),
                                   ("sizes", _OURS.format(repo=str(REPO), one_size=False))):  # fmt: skip
                found[label] = _best([measure(label, name, snippet, [src, out, report, *args.flags.split()])
                                     for _ in range(args.repeat)])
            reference = None
            if have_onnxsim:
                sim = _best([measure("vc+onnxsim", name, tool_snippet("vc+onnxsim"), [src, out])
                             for _ in range(args.repeat)])  # fmt: skip
                reference = sim.wall_seconds if sim.ok else None

        def cell(m: object) -> str:
            if not m.ok:
                return "failed"
            ratio = f" ({m.wall_seconds / reference:.2f}x)" if reference else ""
            return f"{m.wall_seconds:.2f}s{ratio}"

        one, sizes = found["one"], found["sizes"]
        sizes_text = "; ".join(f"{k} {','.join(map(str, v))}" for k, v in (sizes.extra.get("sizes") or {}).items())
        print(f"{name:<34}{(f'{reference:.2f}s' if reference else 'n/a'):>11}{cell(one):>18}{cell(sizes):>18}"
              f"{one.extra.get('check_seconds') or 0:>8.2f}s{sizes.extra.get('check_seconds') or 0:>8.2f}s  "
              f"{sizes_text or 'static'}")  # fmt: skip


if __name__ == "__main__":
    main()
