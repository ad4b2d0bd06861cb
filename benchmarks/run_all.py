"""Runs every benchmark script in ``benchmarks/`` in turn and collects their results.

Each ``benchmarks/bench_*.py`` runs in its own process, one after the other
(never in parallel: they measure time and memory), with ``--quick`` when asked
(a script without that option then runs at its full size, and its status says
so) and ``--json FILE`` when the script accepts it (its ``--help`` says). The
results go to ``benchmarks/results/``:

- ``latest.json``: per benchmark, its command, exit status, duration and the
  JSON it wrote;
- ``latest.md``: a summary table, then per benchmark the table it printed;
- ``<name>.log``: what each script printed on stderr (progress, warnings).

Usage:
    python benchmarks/run_all.py [--quick] [--only bench_fold,...] [--timeout S] [--out DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import pathlib
import platform
import subprocess
import sys
import time
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results"


@dataclasses.dataclass
class Outcome:
    """One benchmark script's run."""

    name: str
    command: list[str]
    status: str  # "ok", "failed: <reason>"
    exit_code: int | None
    seconds: float
    results: Any = None
    stdout: str = ""


def scripts(only: set[str] | None = None) -> list[pathlib.Path]:
    """The benchmark scripts, in name order (``bench_*.py`` in this folder)."""
    found = sorted(HERE.glob("bench_*.py"))
    if only:
        unknown = only - {p.stem for p in found}
        if unknown:
            raise SystemExit(f"run_all: error: no benchmark named {', '.join(sorted(unknown))} "
                             f"(have: {', '.join(p.stem for p in found)})")
        found = [p for p in found if p.stem in only]
    return found


def _accepts(script: pathlib.Path) -> set[str]:
    """The options among ``--quick`` and ``--json`` that ``script --help`` mentions."""
    try:
        proc = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True,
                              timeout=120, cwd=REPO)
    except subprocess.TimeoutExpired:
        return set()
    return {opt for opt in ("--quick", "--json") if opt in proc.stdout}


def run_one(script: pathlib.Path, quick: bool, out: pathlib.Path, timeout: float) -> Outcome:
    accepted = _accepts(script)
    json_path = out / f"{script.stem}.json"
    json_path.unlink(missing_ok=True)
    command = [sys.executable, str(script.relative_to(REPO))]
    note = ""
    if quick:
        if "--quick" in accepted:
            command.append("--quick")
        else:
            note = " (it has no --quick option: ran at full size)"
    if "--json" in accepted:
        command += ["--json", str(json_path.relative_to(REPO) if json_path.is_relative_to(REPO) else json_path)]
    print(f"run_all: {' '.join(command[1:])}", file=sys.stderr, flush=True)
    start = time.perf_counter()
    log = out / f"{script.stem}.log"
    with log.open("w", encoding="utf-8") as err:
        try:
            proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=err, text=True, timeout=timeout, cwd=REPO)
        except subprocess.TimeoutExpired as e:
            stdout = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            return Outcome(script.stem, command, f"failed: timeout after {timeout:.0f} s", None,
                           time.perf_counter() - start, stdout=stdout)
    seconds = time.perf_counter() - start
    results = None
    if json_path.exists():
        try:
            results = json.loads(json_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            results = {"error": f"invalid JSON: {e}"}
    if proc.returncode == 0:
        status = "ok" + note
    else:
        tail = [line for line in log.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
        status = f"failed: exit {proc.returncode}" + (f": {tail[-1].strip()[:160]}" if tail else "")
    return Outcome(script.stem, command, status, proc.returncode, seconds, results, proc.stdout)


# --- markdown --------------------------------------------------------------------------------------


def _rows(results: Any) -> list[dict[str, Any]] | None:
    """The list of flat result rows in a benchmark's JSON, if it has one."""
    if isinstance(results, dict):
        for key in ("runs", "results", "rows"):
            if isinstance(results.get(key), list):
                results = results[key]
                break
    if isinstance(results, list) and results and all(isinstance(r, dict) for r in results):
        return results
    return None


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    if isinstance(value, (dict, list)):
        value = json.dumps(value, separators=(",", ":"))
    return str(value).replace("|", "\\|").replace("\n", " ")[:80]


def markdown_table(rows: list[dict[str, Any]]) -> str:
    columns = list(dict.fromkeys(k for row in rows for k in row if not isinstance(row[k], (dict, list))))
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row.get(c)) for c in columns) + " |")
    return "\n".join(lines)


def markdown(outcomes: list[Outcome], meta: dict[str, Any]) -> str:
    mode = "quick" if meta["quick"] else "full"
    parts = [
        f"# Benchmarks ({mode} run, {meta['date']})",
        "",
        f"Python {meta['python']}, {meta['machine']}, {meta['cpu_count']} CPUs. "
        "Regenerate with `python benchmarks/run_all.py" + (" --quick" if meta["quick"] else "") + "`.",
        "",
        "| benchmark | status | seconds |",
        "|---|---|---|",
    ]
    parts += [f"| {o.name} | {_cell(o.status)} | {o.seconds:.0f} |" for o in outcomes]
    for o in outcomes:
        parts += ["", f"## {o.name}", "", f"`{' '.join(o.command[1:])}`: {o.status}, {o.seconds:.0f} s", ""]
        if o.stdout.strip():
            parts += ["```text", o.stdout.rstrip(), "```"]
        rows = _rows(o.results)
        if rows:
            parts += ["", "<details><summary>all rows</summary>", "", markdown_table(rows), "", "</details>"]
    return "\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="pass --quick to every benchmark (smoke run)")
    parser.add_argument("--only", default="", help="comma-separated benchmark names (e.g. bench_fold)")
    parser.add_argument("--timeout", type=float, default=7200.0, help="seconds per benchmark (default 7200)")
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS, help="results folder (default benchmarks/results)")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    only = {n.strip().removesuffix(".py") for n in args.only.split(",") if n.strip()} or None
    meta = {
        "quick": args.quick,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "machine": f"{platform.system()} {platform.machine()}",
        "cpu_count": os.cpu_count(),
    }
    outcomes = [run_one(script, args.quick, out, args.timeout) for script in scripts(only)]
    latest = {**meta, "benchmarks": {o.name: {k: v for k, v in dataclasses.asdict(o).items() if k != "name"}
                                     for o in outcomes}}
    (out / "latest.json").write_text(json.dumps(latest, indent=2, default=str) + "\n", encoding="utf-8")
    (out / "latest.md").write_text(markdown(outcomes, meta), encoding="utf-8")
    for o in outcomes:
        print(f"{o.name:<24} {o.status}  ({o.seconds:.0f} s)")
    print(f"wrote {out / 'latest.json'} and {out / 'latest.md'}")
    return 0 if all(o.status == "ok" for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
