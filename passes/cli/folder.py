"""``optimize DIR -o OUTDIR [--jobs N]``: every ``.onnx`` under DIR, each one a single run.

Each model is optimised by its own ``optimize`` process (``python -m passes
IN OUT ...`` with the same flags), so each has every guarantee of a single
run: validation, the atomic write with its own external data, the check, its
own exit code, no partial output when interrupted. Up to N of them run at
once (default: the cores). Subfolders are kept (``DIR/a/m.onnx`` ->
``OUTDIR/a/m.onnx``); files under OUTDIR are not read when OUTDIR is inside
DIR. A bad file never stops the others; at the end one table (model, nodes
before/after, size before/after, check, seconds, status), and with
``--report FILE.json`` one JSON with a record per model. The exit code is 0
when every model succeeded, else the worst (2 bad input, 1 a failed check).

Ctrl-C (or SIGTERM) stops the workers: each is sent SIGTERM, leaves no partial
output (its own guarantee), and the command exits 130 (143).

Past one machine this is a map step: run one ``optimize IN OUT --report
OUT.json`` per model in a CI matrix or a job array and merge the JSON records.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import Any

from passes.errors import EXIT_CHECK, EXIT_ERROR, EXIT_OK, InputError

__all__ = ["child_arguments", "run_folder"]

#: Flags of the parent only (with the number of values each takes): not passed to each model's run.
_PARENT_ONLY = {"-o": 1, "--output": 1, "--report": 1, "--jobs": 1, "-q": 0, "--quiet": 0}


def child_arguments(argv: Sequence[str], source: str, output_path: str | None) -> list[str]:
    """The flags every model's run takes: ``argv`` without the folders, ``-o``, ``--report``, ``--jobs``, ``-q``."""
    args: list[str] = []
    skip = 0
    positional_left = [p for p in (source, output_path) if p is not None]
    for token in argv:
        if skip:
            skip -= 1
            continue
        flag = token.split("=", 1)[0]
        if flag in _PARENT_ONLY and token.startswith("-"):
            skip = _PARENT_ONLY[flag] if "=" not in token else 0
            continue
        if token in positional_left:
            positional_left.remove(token)
            continue
        args.append(token)
    return args


def _models(source: pathlib.Path, target: pathlib.Path) -> list[pathlib.Path]:
    inside = target.resolve()
    found = []
    for path in sorted(source.rglob("*.onnx")):
        if path.is_file() and inside not in path.resolve().parents:
            found.append(path)
    return found


def _human(n: Any) -> str:
    if not isinstance(n, int):
        return "-"
    value, unit = float(n), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            break
        value /= 1024
    return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"


class _Pool:
    """The running children, so that an interrupt can stop them all."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.children: set[subprocess.Popen[bytes]] = set()
        self.stopping = False

    def run(self, command: list[str]) -> tuple[int, str]:
        with self.lock:
            if self.stopping:
                return 128 + signal.SIGTERM, "not started: interrupted"
            child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     start_new_session=True)  # fmt: skip
            self.children.add(child)
        try:
            _, err = child.communicate()
        finally:
            with self.lock:
                self.children.discard(child)
        return child.returncode, err.decode("utf-8", "replace")

    def stop(self) -> None:
        with self.lock:
            self.stopping = True
            for child in self.children:
                try:
                    child.send_signal(signal.SIGTERM)
                except OSError:
                    pass


def _record(source: pathlib.Path, model: pathlib.Path, out: pathlib.Path, code: int, err: str,
            report_file: pathlib.Path, seconds: float) -> dict[str, Any]:  # fmt: skip
    record: dict[str, Any] = {"model": str(model.relative_to(source)), "input": str(model), "output": str(out),
                              "exit": code, "seconds": round(seconds, 3)}  # fmt: skip
    errors = [line for line in err.splitlines() if line.startswith("optimize: error:")]
    record["error"] = errors[0][len("optimize: error: "):] if errors and code else None
    try:
        record["report"] = json.loads(report_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        record["report"] = None
    record["status"] = {EXIT_OK: "ok", EXIT_CHECK: "check failed", EXIT_ERROR: "error"}.get(code, "interrupted")
    return record


def _status(record: dict[str, Any]) -> str:
    """``ok``, ``check failed`` (its sentences are on stderr), or ``error: why`` (cut)."""
    if record["status"] != "error" or not record["error"]:
        return record["status"]
    error = record["error"]
    return "error: " + (error if len(error) <= 100 else error[:97] + "...")


def _table(records: list[dict[str, Any]]) -> str:
    rows = [("model", "nodes", "size", "check", "seconds", "status")]
    for r in records:
        report = r["report"] or {}
        before, after = report.get("before") or {}, report.get("after") or {}
        check = report.get("check") or {}
        checked = ("ok" if check.get("ok") else "FAILED") if check.get("checked") else ("NOT CHECKED" if report else "-")
        rows.append((
            r["model"],
            f"{before.get('nodes', '-')} -> {after.get('nodes', '-')}" if report else "-",
            f"{_human(before.get('file_bytes'))} -> {_human(after.get('file_bytes'))}" if report else "-",
            checked, f"{r['seconds']:.2f}", _status(r),
        ))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row[:5], widths)) + "  " + row[5] for row in rows)


def run_folder(source: pathlib.Path, target: pathlib.Path, flags: Sequence[str], *, jobs: int | None,
               report_path: str | None, quiet: bool, out: Any = None) -> int:  # fmt: skip
    """Optimises every ``.onnx`` under ``source`` into ``target`` with ``flags`` (see :func:`child_arguments`
    and the module docstring); returns the exit code."""
    out = out or sys.stdout
    if target.exists() and not target.is_dir():
        raise InputError(f"{target}: not a folder (the output of a folder of models is a folder)")
    if jobs is not None and jobs < 1:
        raise InputError(f"--jobs {jobs}: must be >= 1")
    models = _models(source, target)
    if not models:
        raise InputError(f"{source}: no .onnx file under it")
    workers = min(jobs or os.cpu_count() or 1, len(models))
    pool = _Pool()
    created: list[pathlib.Path] = []
    records: list[dict[str, Any] | None] = [None] * len(models)
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="optimize-folder-"))

    def one(index: int) -> None:
        model = models[index]
        dst = target / model.relative_to(source)
        report_file = scratch / f"{index}.json"
        start = time.perf_counter()
        code, err = pool.run([sys.executable, "-m", "passes", str(model), "-o", str(dst), "--report",
                              str(report_file), "-q", *flags])  # fmt: skip
        records[index] = _record(source, model, dst, code, err, report_file, time.perf_counter() - start)

    try:
        for folder in sorted({(target / m.relative_to(source)).parent for m in models}):
            missing = [p for p in (folder, *folder.parents) if not p.exists()]
            folder.mkdir(parents=True, exist_ok=True)
            created.extend(reversed(missing))
        with concurrent.futures.ThreadPoolExecutor(workers) as executor:
            futures = [executor.submit(one, i) for i in range(len(models))]
            try:
                for future in futures:
                    while True:
                        try:
                            future.result(timeout=0.2)  # wakes up for a signal
                            break
                        except concurrent.futures.TimeoutError:
                            continue
            except BaseException:
                pool.stop()
                for future in futures:
                    future.cancel()
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        for folder in reversed(created):  # the folders made for models none of which was written
            try:
                folder.rmdir()
            except OSError:
                pass
    done = [r for r in records if r is not None]
    if not quiet:
        print(_table(done), file=out, flush=True)
    if report_path is not None:
        text = json.dumps({"models": done}, indent=2) + "\n"
        tmp = pathlib.Path(report_path).with_name(f".{pathlib.Path(report_path).name}.tmp")
        try:
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, report_path)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise InputError(f"{report_path}: cannot write the report ({e.strerror or e})") from e
    failed = [r for r in done if r["exit"] != EXIT_OK]
    for r in failed:
        print(f"optimize: error: {r['model']}: {r['error'] or r['status']}", file=sys.stderr, flush=True)
    return max((r["exit"] for r in done), default=EXIT_OK)
