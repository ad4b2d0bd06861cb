"""Folder mode against one command per model (issue #25).

``optimize DIR -o OUTDIR --jobs N`` runs one ``optimize`` process per model, N at
a time; a user without it runs ``optimize M -o OUT`` once per model, one after
the other. Both do the same work per model (load, passes, the check, save), so
the figure is the speed-up the workers give on this machine's cores, against
the sum of the one-by-one runs.

The folder is the models in ``models/`` and ``models/real/`` (copied, with
their external data, into a temporary folder), repeated ``--copies`` times so
that there is enough work to share. Every run's outputs are compared: the same
files, each valid for the ONNX checker.

Usage::

    python benchmarks/bench_folder.py [--jobs 2] [--copies 2] [--repeat 3]
"""

from __future__ import annotations

import argparse
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
sys.path.insert(0, str(HERE))
from harness import child_env  # noqa: E402  (stdlib only at import)


def _models() -> list[pathlib.Path]:
    return sorted([*REPO.glob("models/*.onnx"), *REPO.glob("models/real/*.onnx")])


def _command() -> list[str]:
    return [sys.executable, "-m", "passes"]


def _env() -> dict[str, str]:
    return child_env(REPO)


def _one_by_one(folder: pathlib.Path, out: pathlib.Path) -> float:
    start = time.perf_counter()
    for model in sorted(folder.rglob("*.onnx")):
        target = out / model.relative_to(folder)
        target.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([*_command(), str(model), "-o", str(target), "-q"], check=True, env=_env(),
                       stdout=subprocess.DEVNULL)  # fmt: skip
    return time.perf_counter() - start


def _folder(folder: pathlib.Path, out: pathlib.Path, jobs: int) -> float:
    start = time.perf_counter()
    subprocess.run([*_command(), str(folder), "-o", str(out), "--jobs", str(jobs), "-q"], check=True, env=_env(),
                   stdout=subprocess.DEVNULL)  # fmt: skip
    return time.perf_counter() - start


def _outputs(out: pathlib.Path) -> list[str]:
    return sorted(str(p.relative_to(out)) for p in out.rglob("*.onnx"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--copies", type=int, default=2, help="copies of the sample models in the folder")
    parser.add_argument("--repeat", type=int, default=3, help="alternating runs of each; the median is shown")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-folder-") as tmp:
        root = pathlib.Path(tmp)
        folder = root / "in"
        for copy in range(args.copies):
            for model in _models():
                target = folder / f"copy{copy}" / model.name
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(model, target)
        count = len(list(folder.rglob("*.onnx")))
        times: dict[str, list[float]] = {"one by one": [], "--jobs 1": [], f"--jobs {args.jobs}": []}
        expected: list[str] | None = None
        for _ in range(args.repeat):
            for name in times:
                out = root / "out"
                shutil.rmtree(out, ignore_errors=True)
                out.mkdir()
                if name == "one by one":
                    seconds = _one_by_one(folder, out)
                else:
                    seconds = _folder(folder, out, int(name.split()[-1]))
                produced = _outputs(out)
                if expected is None:
                    expected = produced
                assert produced == expected, f"{name}: other outputs"
                times[name].append(seconds)
        for path in (root / "out").rglob("*.onnx"):
            subprocess.run([sys.executable, "-c", "import onnx, sys; onnx.checker.check_model(sys.argv[1], full_check=True)",
                            str(path)], check=True)  # fmt: skip

    base = statistics.median(times["one by one"])
    print(f"{count} models ({args.copies} copies of models/ and models/real/), {os.cpu_count()} cores, "
          f"median of {args.repeat} alternating runs; every output valid (onnx.checker)")  # fmt: skip
    print(f"{'run':<14}{'seconds':>10}{'speed-up':>10}")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:<14}{median:>10.1f}{base / median:>9.2f}x")


if __name__ == "__main__":
    main()
