"""CPU seconds of the load, the save and onnxruntime's session of one model, for checkouts run alternately.

What a run pays around its passes on a large graph (issue #37): ``load_model``, ``save_model`` of
the loaded model, and the check child's onnxruntime session of the file (``passes.verify.ort_io.session``:
graph optimisations off). Each checkout's turn is a fresh child (imports done before the timer),
timing each step with ``time.process_time`` ``--times`` times (the median, the first one dropped);
the checkouts' turns alternate ``--repeat`` times and the medians of their medians are printed.
On shared cores the CPU of a step says what its wall time cannot.

Usage::

    python benchmarks/io_cpu.py MODEL [--repeat N] [--times K] [--tree DIR ...]

    # the load of the 10k chain, integ against this checkout; then the save and the session of its output:
    python benchmarks/io_cpu.py chain10k.onnx --repeat 6 --tree /work/wt/integ --tree .
    python -m passes chain10k.onnx -o out.onnx --no-check && python benchmarks/io_cpu.py out.onnx
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent

_CHILD = """
import gc, json, statistics, sys, time
from passes.modelio import load_model, save_model
from passes.verify.ort_io import session
import onnxruntime  # noqa: F401  (imported before the timer)
model, out, times = sys.argv[1], sys.argv[2], int(sys.argv[3])

def timed(step):
    seconds = []
    for _ in range(times + 1):
        gc.collect()
        start = time.process_time()
        step()
        seconds.append(time.process_time() - start)
    return statistics.median(seconds[1:])

loaded = load_model(model)
print(json.dumps({"load": timed(lambda: load_model(model)), "save": timed(lambda: save_model(loaded, out)),
                  "session": timed(lambda: session(model))}))
"""


def _turn(tree: pathlib.Path, model: str, times: int, folder: pathlib.Path) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # (as an install runs)
    env["PYTHONPATH"] = str(tree)
    done = subprocess.run([sys.executable, "-c", _CHILD, model, str(folder / "out.onnx"), str(times)], env=env,
                          check=True, capture_output=True, text=True, cwd=folder)  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--repeat", type=int, default=3, help="turns of each checkout (alternating)")
    parser.add_argument("--times", type=int, default=5, help="timings of each step in a turn")
    parser.add_argument("--tree", action="append", type=pathlib.Path, help="a checkout (default: this one)")
    args = parser.parse_args(argv)
    trees = [t.resolve() for t in (args.tree or [HERE.parent])]
    model = str(pathlib.Path(args.model).resolve())
    turns: dict[pathlib.Path, list[dict[str, float]]] = {tree: [] for tree in trees}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeat):
            for tree in trees:
                turns[tree].append(_turn(tree, model, args.times, pathlib.Path(tmp)))
    for tree, found in turns.items():
        cells = " ".join(f"{step} {statistics.median(t[step] for t in found):.3f}" for step in found[0])
        print(f"{tree}: {cells} (CPU s, median of {len(found)} turns of {args.times})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
