"""Start-up: ``optimize --help`` and an error on a missing file, against a bare interpreter.

Each command runs in a fresh process; the runs of the three commands
alternate and the median wall time of ``--repeat`` runs is reported, with its
ratio to ``python -c pass``. The passes' declarations are cached (see
``passes/registry.py``) in a temporary folder that one untimed ``--help`` fills
first, as any earlier run of the command would have; ``cold --help`` is the
first run with an empty cache (it imports the passes), measured once per repeat.

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
    cache = pathlib.Path(tempfile.mkdtemp(prefix="bench_startup."))
    env = dict(os.environ, ONNX_OPTIMIZE_CACHE_DIR=str(cache))
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    cli = [sys.executable, "-m", "passes"]
    commands = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "--help": [*cli, "--help"],
        "missing file": [*cli, str(cache / "missing.onnx"), "-o", str(cache / "out.onnx")],
    }
    times: dict[str, list[float]] = {name: [] for name in [*commands, "cold --help"]}
    try:
        for _ in range(repeat):
            (cache / "declarations.json").unlink(missing_ok=True)
            times["cold --help"].append(_time(commands["--help"], env))
            for name, command in commands.items():
                times[name].append(_time(command, env))
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    medians = {name: statistics.median(t) for name, t in times.items()}
    base = medians["python -c pass"]
    print(f"{'command':<16} {'median s':>9} {'x python':>9}")
    for name, m in medians.items():
        print(f"{name:<16} {m:>9.3f} {m / base:>9.2f}")
    if args.json:
        args.json.write_text(json.dumps({"meta": {"repeat": repeat}, "medians": medians, "runs": times}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
