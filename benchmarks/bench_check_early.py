"""The check's original side run while the passes run (issue #37): the whole run with it and without it.

Per model, ``optimize IN -o OUT -q --report R`` in a fresh interpreter, the variants' runs
alternating (run 1 of each, then run 2 of each...):

- ``early``: as shipped (:mod:`passes.verify.early`: the original's session and runs while the
  passes run, for a model of at most ``EARLY_BYTES``);
- ``at end``: the same tree with ``passes.verify.gate.start_early`` returning None (the whole check after
  the save, fold's confirmation borrowing the check's child);
- ``--baseline DIR``: another checkout run the same way (e.g. main before this change), optional.

Printed per variant: the median wall time of the whole process, its CPU seconds (user + sys of the
process and of its children, the check's child included), the median of the report's ``check`` and
``passes`` phases; and vc+onnxsim's wall time (``onnx.version_converter`` then ``onnxsim``, no check)
as the reference. Wall times on shared cores are noisy: compare CPU seconds, and the medians.

Usage:
    python benchmarks/bench_check_early.py [--models PATH,...] [--repeat N] [--baseline DIR] [--flags ...]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import onnx

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from bench_upgrade import reduce_chain  # noqa: E402
from harness import child_env, measure, tool_installed, tool_snippet  # noqa: E402

#: Built here (``bench_upgrade.reduce_chain``: the chains of ``bench_cost.py``), by name.
CHAINS = {"chain10k": 10_000, "chain50k": 50_000}
MODELS = ("chain10k", "chain50k", "models/demo.onnx", "models/real/small_cnn_opset13.onnx",
          "models/real/tiny_bert_opset17.onnx")  # fmt: skip

_RUN = """
import sys
sys.path.insert(0, {repo!r})
if {at_end!r}:  # (gate is light: patching it imports nothing the run would not)
    from passes.verify import gate
    gate.start_early = lambda *args: None
from passes.__main__ import main
sys.argv = ["optimize", *sys.argv[1:]]
main()
"""


def _once(repo: pathlib.Path, at_end: bool, src: pathlib.Path, tmp: pathlib.Path, flags: list[str]) -> dict:
    """One run: wall, CPU (the process and its children), the report's phases."""
    report = tmp / "r.json"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _RUN.format(repo=str(repo), at_end=at_end), str(src), "-o",
                           str(tmp / "out.onnx"), "-q", "--report", str(report), *flags],
                          env=child_env(repo), capture_output=True, text=True, check=False)  # fmt: skip
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode != 0:
        return {"ok": False, "error": (done.stderr.strip().splitlines() or ["?"])[-1][:200]}
    phases = json.loads(report.read_text()).get("phases", {})
    return {"ok": True, "wall": wall, "cpu": cpu, "check": phases.get("check", 0.0), "passes": phases.get("passes", 0.0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--models", default=",".join(MODELS),
                        help="paths (relative ones from the repository), or chain10k, chain50k (built here)")
    parser.add_argument("--repeat", type=int, default=5, help="runs per variant and model (medians printed)")
    parser.add_argument("--baseline", default=None, help="another checkout to run the same way (e.g. main)")
    parser.add_argument("--flags", default="", help="more flags for optimize")
    args = parser.parse_args()
    variants = [("early", REPO, False), ("at end", REPO, True)]
    if args.baseline:
        variants.append(("baseline", pathlib.Path(args.baseline).resolve(), False))
    have_onnxsim = tool_installed("vc+onnxsim") == ""
    print(f"{'model':<38}{'variant':<10}{'wall':>8}{'cpu':>8}{'check':>8}{'passes':>8}  vs vc+onnxsim")
    for name in args.models.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            src = pathlib.Path(name) if os.path.isabs(name) else REPO / name
            if name in CHAINS:
                src = pathlib.Path(tmp) / f"{name}.onnx"
                onnx.save(reduce_chain(CHAINS[name]), str(src))
            runs: dict[str, list[dict]] = {label: [] for label, _, _ in variants}
            for _ in range(args.repeat):
                for label, repo, at_end in variants:
                    runs[label].append(_once(repo, at_end, src, pathlib.Path(tmp), args.flags.split()))
            reference = None
            if have_onnxsim:
                sims = [measure("vc+onnxsim", name, tool_snippet("vc+onnxsim"), [src, pathlib.Path(tmp) / "s.onnx"])
                        for _ in range(args.repeat)]  # fmt: skip
                walls = [m.wall_seconds for m in sims if m.ok]
                reference = statistics.median(walls) if walls else None
        for label, _, _ in variants:
            ok = [r for r in runs[label] if r["ok"]]
            if not ok:
                print(f"{src.name:<38}{label:<10} failed: {runs[label][-1]['error']}")
                continue
            med = {k: statistics.median(r[k] for r in ok) for k in ("wall", "cpu", "check", "passes")}
            ratio = f"{med['wall'] / reference:.2f}x of {reference:.2f}s" if reference else "n/a"
            print(f"{src.name:<38}{label:<10}{med['wall']:>7.2f}s{med['cpu']:>7.2f}s{med['check']:>7.2f}s"
                  f"{med['passes']:>7.2f}s  {ratio}")  # fmt: skip


if __name__ == "__main__":
    main()
