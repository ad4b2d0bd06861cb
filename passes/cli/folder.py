"""``optimize DIR -o OUTDIR [--jobs N]``: every ``.onnx`` under DIR, each one a single run.

Each model is optimised by its own ``optimize`` process (``python -m passes
IN OUT ...`` with the same flags), so each has every guarantee of a single
run: validation, the atomic write with its own external data, the check, its
own exit code, no partial output when interrupted. Up to N of them run at
once (default: the cores). Subfolders are kept (``DIR/a/m.onnx`` ->
``OUTDIR/a/m.onnx``); files under OUTDIR are not read when OUTDIR is inside
DIR. The command line is parsed once, by the parent (no abbreviations: see
:mod:`passes.cli.args`); each run gets the flags that are not the parent's own
(:func:`child_arguments`). OUTDIR may be neither DIR nor inside it, and no
model's output may be another model of DIR. A bad file never stops the
others; at the end one table (model, nodes before/after, size before/after,
check, seconds, status: a model whose check could not run says why, one run
with ``--no-check`` says so), a totals line, and with ``--report FILE.json``
one JSON with a record per model. The exit code is 0 when every model
succeeded, else the worst (2 bad input, 1 a failed check).

Ctrl-C (or SIGTERM) stops the workers: each is sent SIGTERM, leaves no partial
output (its own guarantee); the table, the totals and the report list the
models that finished (the report adds ``"interrupted": true`` and
``"not_finished"``), and the command exits 130 (143).

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

from passes import children
from passes.atomic import write_text
from passes.errors import EXIT_CHECK, EXIT_ERROR, EXIT_OK, InputError, cut

__all__ = ["child_arguments", "child_record", "run_folder"]

#: The parent's own arguments (argparse dests): each model's run gets the others (see :func:`child_arguments`).
_PARENT_ONLY = frozenset({"output", "report", "jobs", "quiet"})


def child_arguments(groups: Sequence[tuple[str | None, list[str]]]) -> list[str]:
    """The flags every model's run takes: the command line's arguments as its parser grouped them
    (``passes.cli.args``' ``groups``), without the folders (the positionals), ``-o``, ``--report``,
    ``--jobs`` and ``-q``."""
    return [token for dest, tokens in groups if dest is not None and dest not in _PARENT_ONLY for token in tokens]


def _refuse_overlap(source: pathlib.Path, target: pathlib.Path, report_path: str | None) -> None:
    """OUTDIR must be neither DIR nor inside it: a run would write over its inputs, or the next run read
    its outputs as models; the report may not replace a file under DIR (a model, its data)."""
    src, dst = source.resolve(), target.resolve()
    report = pathlib.Path(report_path).resolve() if report_path is not None else None
    if report is not None and src in report.parents and report.exists():
        raise InputError(f"--report {report_path}: a file under the input folder {source} (a model or its "
                         "data, which the runs read); choose another name")
    if dst == src:
        raise InputError(f"-o {target}: the output folder is the input folder {source}; the models would be "
                         "written over themselves (choose another folder)")
    if src in dst.parents:
        raise InputError(f"-o {target}: the output folder is inside the input folder {source}; the next run "
                         "would read its models as inputs (choose a folder outside it)")


def _models(source: pathlib.Path, target: pathlib.Path) -> list[pathlib.Path]:
    """The ``.onnx`` files under ``source``; refused if one's output would be another's input (DIR
    inside OUTDIR: ``optimize a/b -o a`` writes ``a/b/m.onnx`` for ``a/b/b/m.onnx``)."""
    found = [path for path in sorted(source.rglob("*.onnx")) if path.is_file()]
    inputs = {path.resolve(): path for path in found}
    for path in found:
        clash = inputs.get((target / path.relative_to(source)).resolve())
        if clash is not None:
            raise InputError(f"-o {target}: the output of {path} would be written over the model {clash} "
                             "(choose a folder outside the input folder)")
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
            child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                                     env=children.child_env())  # fmt: skip
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


def child_record(source: pathlib.Path, model: pathlib.Path, out: pathlib.Path, code: int, err: str,
                 report_file: pathlib.Path, seconds: float) -> dict[str, Any]:  # fmt: skip
    """The table's and the report's record of one model's run: its exit ``code``, its stderr ``err``
    and the report it wrote (``report_file``; a run stopped after its commit counts as finished)."""
    try:
        report = json.loads(report_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        report = None
    if code not in (EXIT_OK, EXIT_CHECK, EXIT_ERROR) and isinstance(report, dict) and report.get("written") is True:
        # Stopped by an interrupt after its commit (the report is renamed with the output): it finished.
        code = EXIT_CHECK if report.get("status") == "check failed" else EXIT_OK
    record: dict[str, Any] = {"model": str(model.relative_to(source)), "input": str(model), "output": str(out),
                              "exit": code, "seconds": round(seconds, 3)}  # fmt: skip
    errors = [line for line in err.splitlines() if line.startswith("optimize: error:")]
    record["error"] = errors[0][len("optimize: error: "):] if errors and code else None
    record["report"] = report
    record["status"] = {EXIT_OK: "ok", EXIT_CHECK: "check failed", EXIT_ERROR: "error"}.get(code, "interrupted")
    return record


def _check_cell(report: dict[str, Any]) -> str:
    """``ok``, ``FAILED``, ``NOT CHECKED``, ``--no-check``, or ``-`` when the run stopped before the check."""
    check = report.get("check") or {}
    if check.get("checked"):
        return "ok" if check.get("ok") else "FAILED"
    if check.get("reason") == "--no-check":
        return "--no-check"
    return "NOT CHECKED" if report.get("written") else "-"


def _status(record: dict[str, Any]) -> str:
    """``ok``, ``ok (not checked: why)``, ``check failed`` (its sentences are on stderr), or ``error: why``
    (cut)."""
    report = record["report"] or {}
    check = report.get("check") or {}
    if record["status"] == "ok" and _check_cell(report) == "NOT CHECKED":
        return "ok (not checked: " + cut(str(check.get("reason") or "see the record"), 120) + ")"
    if record["status"] != "error" or not record["error"]:
        return record["status"]
    return "error: " + cut(record["error"], 100)


def _table(records: list[dict[str, Any]]) -> str:
    rows = [("model", "nodes", "size", "check", "seconds", "status")]
    for r in records:
        report = r["report"] or {}
        before, after = report.get("before") or {}, report.get("after") or {}
        rows.append((
            r["model"],
            f"{before.get('nodes', '-')} -> {after.get('nodes', '-')}" if report else "-",
            f"{_human(before.get('file_bytes'))} -> {_human(after.get('file_bytes'))}" if report else "-",
            _check_cell(report) if report else "-", f"{r['seconds']:.2f}", _status(r),
        ))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row[:5], widths)) + "  " + row[5] for row in rows)


def _totals(records: list[dict[str, Any]], seconds: float, not_finished: int) -> str:
    """``total: 4 model(s): 2 ok (1 not checked), 1 check failed, 1 error; the 2 written: nodes 120 -> 80,
    size 1.2 MiB -> 1.1 MiB; 9.5 s`` (and ``N not finished`` after an interrupt)."""
    counts: dict[str, int] = {}
    for r in records:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    unchecked = sum(1 for r in records if r["status"] == "ok" and _check_cell(r["report"] or {}) != "ok")
    parts = []
    for status in ("ok", "check failed", "error"):
        if counts.get(status):
            parts.append(f"{counts[status]} {status}" + (f" ({unchecked} not checked)" if status == "ok" and unchecked
                                                         else ""))  # fmt: skip
    if not_finished:
        parts.append(f"{not_finished} not finished")
    written = [r["report"] for r in records if r["report"] and r["report"].get("written")]
    text = f"total: {len(records) + not_finished} model(s): " + ", ".join(parts or ["none"])
    if written:
        nodes = (sum(w["before"]["nodes"] for w in written), sum(w["after"]["nodes"] for w in written))
        sizes = [sum(w[k].get("file_bytes") or 0 for w in written) for k in ("before", "after")]
        text += (f"; the {len(written)} written: nodes {nodes[0]} -> {nodes[1]}, size {_human(sizes[0])} -> "
                 f"{_human(sizes[1])}")
    return text + f"; {seconds:.1f} s"


def _write_report(report_path: str, document: dict[str, Any]) -> None:
    try:
        write_text(report_path, json.dumps(document, indent=2) + "\n")
    except OSError as e:
        raise InputError(f"{report_path}: cannot write the report ({e.strerror or e})") from e


def run_folder(source: pathlib.Path, target: pathlib.Path, flags: Sequence[str], *, jobs: int | None,
               report_path: str | None, quiet: bool, out: Any = None) -> int:  # fmt: skip
    """Optimises every ``.onnx`` under ``source`` into ``target`` with ``flags`` (see :func:`child_arguments`
    and the module docstring); returns the exit code.

    Interrupted (KeyboardInterrupt: SIGINT, or SIGTERM as the command raises it), the runs are stopped,
    the table and the report say what finished, and the interrupt is raised again.
    """
    out = out or sys.stdout
    if target.exists() and not target.is_dir():
        raise InputError(f"{target}: not a folder (the output of a folder of models is a folder)")
    if jobs is not None and jobs < 1:
        raise InputError(f"--jobs {jobs}: must be >= 1")
    _refuse_overlap(source, target, report_path)
    models = _models(source, target)
    if not models:
        raise InputError(f"{source}: no .onnx file under it")
    workers = min(jobs or os.cpu_count() or 1, len(models))
    pool = _Pool()
    created: list[pathlib.Path] = []
    records: list[dict[str, Any] | None] = [None] * len(models)
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="optimize-folder-"))
    started = time.perf_counter()
    interrupted: BaseException | None = None

    def one(index: int) -> None:
        model = models[index]
        dst = target / model.relative_to(source)
        report_file = scratch / f"{index}.json"
        start = time.perf_counter()
        code, err = pool.run(children.module_command("passes", str(model), "-o", str(dst), "--report",
                                                     str(report_file), "-q", *flags))  # fmt: skip
        records[index] = child_record(source, model, dst, code, err, report_file, time.perf_counter() - start)

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
            except KeyboardInterrupt as e:
                interrupted = e
                pool.stop()
                for future in futures:
                    future.cancel()
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
    done = [r for r in records if r is not None and r["status"] != "interrupted"]
    not_finished = [str(m.relative_to(source)) for m, r in zip(models, records)
                    if r is None or r["status"] == "interrupted"]
    if not quiet:
        print(_table(done), file=out, flush=True)
        print(_totals(done, time.perf_counter() - started, len(not_finished)), file=out, flush=True)
    if report_path is not None:
        document: dict[str, Any] = {"models": done}
        if interrupted is not None:
            document.update(interrupted=True, not_finished=not_finished)
        _write_report(report_path, document)
    if interrupted is not None:
        raise interrupted
    failed = [r for r in done if r["exit"] != EXIT_OK]
    for r in failed:
        print(f"optimize: error: {r['model']}: {r['error'] or r['status']}", file=sys.stderr, flush=True)
    return max((r["exit"] for r in done), default=EXIT_OK)
