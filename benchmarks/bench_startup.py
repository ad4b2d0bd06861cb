"""Start-up: ``optimize --help`` and an error on a missing file, against a bare interpreter.

Each command runs in a fresh process; the runs alternate and the median wall
time of ``--repeat`` runs is reported, with its ratio to ``python -c pass``.
The passes' declarations are a light module (``passes/declarations.py``):
nothing is cached, so the first run is like any other. To show that another
install of the package changes nothing, the same commands also run from a
second copy of the package in a temporary folder, alternating with this one.

Usage:
    python benchmarks/bench_startup.py [--quick] [--repeat N] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent


def _time(command: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, env=env, capture_output=True, check=False)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 runs instead of 9")
    parser.add_argument("--repeat", type=int, default=None, help="runs per command")
    parser.add_argument("--json", type=pathlib.Path, default=None, help="where to save the measurements")
    args = parser.parse_args(argv)
    repeat = args.repeat or (3 if args.quick else 9)
    folder = pathlib.Path(tempfile.mkdtemp(prefix="bench_startup."))
    second = folder / "second-install"
    for package in ("passes", "refimpl"):
        shutil.copytree(REPO / package, second / package, ignore=shutil.ignore_patterns("__pycache__"))
    envs = {
        "": dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])),
        " (2nd install)": dict(os.environ, PYTHONPATH=os.pathsep.join([str(second), os.environ.get("PYTHONPATH", "")])),
    }
    cli = [sys.executable, "-m", "passes"]
    commands = {
        "--help": [*cli, "--help"],
        "missing file": [*cli, str(folder / "missing.onnx"), "-o", str(folder / "out.onnx")],
    }
    times: dict[str, list[float]] = {"python -c pass": []}
    times.update({f"{name}{suffix}": [] for suffix in envs for name in commands})
    try:
        for _ in range(repeat):
            times["python -c pass"].append(_time([sys.executable, "-c", "pass"], envs[""]))
            for suffix, env in envs.items():
                for name, command in commands.items():
                    times[f"{name}{suffix}"].append(_time(command, env))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    medians = {name: statistics.median(t) for name, t in times.items()}
    base = medians["python -c pass"]
    print(f"{'command':<28} {'median s':>9} {'x python':>9}")
    for name, m in medians.items():
        print(f"{name:<28} {m:>9.3f} {m / base:>9.2f}")
    if args.json:
        args.json.write_text(json.dumps({"meta": {"repeat": repeat}, "medians": medians, "runs": times}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
