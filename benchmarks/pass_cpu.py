"""CPU seconds of each pass of one command, for two checkouts run one after the other.

On shared cores wall times say more about the neighbours than about the code; the CPU time of
each pass does not. Each run is a fresh ``python -m passes``-like child whose pass timer reads
``time.process_time`` (the report's per-pass seconds become CPU seconds; the phases stay wall),
and the checkouts' runs alternate. Prints, per checkout, the median of each pass over the runs
and the sum of the passes, then the process's own CPU (user+sys, children included: the check).

Usage::

    python benchmarks/pass_cpu.py MODEL [--repeat N] [--tree DIR ...] [-- optimize flags]

    # main against a branch, on the 10k chain, the default pipeline without its check:
    python benchmarks/pass_cpu.py /tmp/chain10k.onnx --tree /work/main --tree . -- --no-check
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

HERE = pathlib.Path(__file__).resolve().parent

_CHILD = """
import sys, time, types
from passes import loop
loop.time = types.SimpleNamespace(perf_counter=time.process_time)
import passes.cli
sys.exit(passes.cli.main(sys.argv[1:]))
"""


def _run(tree: pathlib.Path, model: str, flags: list[str], folder: pathlib.Path) -> tuple[dict[str, float], float]:
    report = folder / "report.json"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = {**os.environ, "PYTHONPATH": str(tree)}
    subprocess.run([sys.executable, "-c", _CHILD, model, "-o", str(folder / "out.onnx"), "-q", "--report",
                    str(report), *flags], env=env, check=True, stdout=subprocess.DEVNULL,
                   cwd=folder)  # not the caller's folder: a checkout there would come first on sys.path  # fmt: skip
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    passes = {p["name"]: p["seconds"] for p in json.loads(report.read_text())["passes"]}
    return passes, cpu


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    flags: list[str] = []
    if "--" in argv:
        argv, flags = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tree", action="append", type=pathlib.Path, help="a checkout (default: this one)")
    args = parser.parse_args(argv)
    trees = args.tree or [HERE.parent]
    runs: dict[pathlib.Path, list[tuple[dict[str, float], float]]] = {tree: [] for tree in trees}
    model = str(pathlib.Path(args.model).resolve())
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeat):
            for tree in trees:
                runs[tree].append(_run(tree.resolve(), model, flags, pathlib.Path(tmp)))
    for tree, results in runs.items():
        names = list(results[0][0])
        medians = {n: statistics.median(r[0].get(n, 0.0) for r in results) for n in names}
        total = statistics.median(sum(r[0].values()) for r in results)
        process = statistics.median(r[1] for r in results)
        cells = " ".join(f"{n} {s:.2f}" for n, s in medians.items())
        print(f"{tree}: {cells} | passes {total:.2f} | process {process:.2f} (CPU s, median of {len(results)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
