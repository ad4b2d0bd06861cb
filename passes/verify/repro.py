"""``--repro DIR``: after a failed check, the smallest reproduction of the difference, for a bug report.

:func:`reproduce` asks :mod:`passes.verify.reduce` for the smallest pair of
regions that still differ, then writes into DIR:

* ``original.onnx`` and ``optimized.onnx``: the two regions (tensors of 1 MiB
  or more in ``NAME.onnx.data``, only theirs);
* ``inputs.npz``: the values that reach them on the check's failing input set,
  by input name (a float32 value feeds a half-type input of the optimised
  region rounded to it, as the check feeds a ``--precision-io`` model);
* ``README.txt``: the command that failed, the tolerance, what differs and by
  how much, and the command that compares them again:
  ``python -m passes.verify.repro DIR --rtol R --atol A`` (:func:`main`).

Before they are written, both models pass the ONNX checker and the comparison
is run again on the files as written. DIR is written as the output is: into
a temporary folder next to it, renamed into place with SIGINT and SIGTERM held.
It must be a new path, an empty folder, or a folder that holds only a
reproduction's files (replaced as a whole); anything else is refused before
the run (:func:`check_folder`).
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import pathlib
import shlex
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from typing import Any, NoReturn

import google.protobuf.message
import numpy as np
import onnx

from passes import __version__
from passes.errors import InputError, first_line
from passes.modelio import signals_deferred
from passes.modelio.destinations import check_encodable, shown
from passes.options import parse_tolerance
from passes.lazy import lazy_module
from passes.verify import files as _files
from passes.verify.child import WorkerError
from passes.verify.lowest import FLOAT_TYPES
from passes.verify.defaults import TOLERANCES
from passes.verify.result import name_text, shown_names

__all__ = ["FILES", "check_folder", "check_request", "main", "reproduce"]

#: The files a reproduction consists of: a folder holding anything else is not replaced.
FILES = ("README.txt", "inputs.npz", "optimized.onnx", "optimized.onnx.data", "original.onnx", "original.onnx.data")

logger = logging.getLogger(__name__)
# The search and its regions only after a difference: every run asks check_request.
_reduce = lazy_module("passes.verify.reduce")
region = lazy_module("passes.verify.region")

_UTF8 = "onnx and onnxruntime take paths as UTF-8 text"

#: Seconds ``python -m passes.verify.repro`` gives onnxruntime.
RERUN_SECONDS = 600.0


def check_folder(folder: str | os.PathLike[str], reads: Iterable[pathlib.Path] = (),
                 writes: Iterable[pathlib.Path] = ()) -> None:  # fmt: skip
    """Refuses ``--repro DIR`` unless it is a new path in an existing folder, an empty folder, or
    a folder of a reproduction's files only, that holds none of the files the run reads or writes.

    Raises:
        InputError: one line naming DIR and why.
    """
    path = pathlib.Path(folder)
    label = f"--repro {shown(path)}"
    check_encodable(path, label, _UTF8)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        info = None
    except OSError as e:
        raise InputError(f"{label}: cannot use this path ({e.strerror or first_line(e)})") from e
    if info is None:
        if not path.absolute().parent.is_dir():
            raise InputError(f"{label}: its folder {shown(path.absolute().parent)} does not exist")
    elif stat.S_ISLNK(info.st_mode):
        raise InputError(f"{label}: is a symbolic link; give the folder itself")
    elif not stat.S_ISDIR(info.st_mode):
        raise InputError(f"{label}: exists and is not a folder; give a new or empty folder")
    else:
        entries = sorted(os.listdir(path))
        foreign = [e for e in entries if e not in FILES or not os.path.isfile(path / e) or os.path.islink(path / e)]
        if foreign:
            raise InputError(f"{label}: holds files that are not a reproduction's ({shown_names(foreign, 3)}); "
                             "a reproduction replaces the folder: give a new or empty folder")
    resolved = path.resolve()
    for kind, paths in (("reads", reads), ("writes", writes)):
        for file in paths:
            target = pathlib.Path(file).resolve()
            if target == resolved or resolved in target.parents:
                raise InputError(f"{label}: holds {shown(file)}, which this run {kind}; give another folder")


def check_request(check: Any, reads: Iterable[Any] = (), writes: Iterable[Any] = ()) -> tuple[list[pathlib.Path],
                                                                                              list[pathlib.Path]]:
    """``check.repro`` (``--repro DIR``) refused before any work unless the check runs and DIR may
    be written (:func:`check_folder`); the run's files (``reads``, ``writes``), which DIR must not hold.

    Raises:
        InputError: one line naming DIR and why.
    """
    paths = [pathlib.Path(p) for p in reads], [pathlib.Path(p) for p in writes]
    if check.repro is not None:
        if not check.enabled:
            raise InputError("--repro DIR reproduces what the check finds: it needs the check (drop --no-check)")
        check_folder(check.repro, *paths)
    return paths


def reproduce(checker: Any, optimized: Any, result: Any, folder: str | os.PathLike[str], *, command: str = "",
              seconds: float | None = None, capture_bytes: int | None = None,
              reads: Sequence[pathlib.Path] = (), writes: Sequence[pathlib.Path] = (),
              about: str = "") -> dict[str, Any]:  # fmt: skip
    """Writes the smallest reproduction of ``result``'s difference into ``folder``.

    Args:
        checker: The :class:`passes.verify.check.Checker` whose :meth:`check` found the difference
            (its child still holds the inputs).
        optimized: The optimised model it checked (a path, bytes, a ``ModelProto``...).
        result: That check's :class:`passes.verify.result.CheckResult`.
        folder: DIR (see :func:`check_folder`, checked again before the rename).
        command: The command that failed, for the README ("" for the Python API).
        seconds: The time budget (default: the check's timeout).
        capture_bytes: The bytes of values the search may capture to cut at (default
            :data:`passes.verify.reduce.CAPTURE_BYTES`).
        reads, writes: The run's files, which DIR must not hold.
        about: What the reader should know of ``optimized`` (it is an emulation...), for the README.

    Returns:
        What was done, for the report (``check.repro``): ``folder``, ``written``, and the
        reproduction's ``output``, ``where``, node counts, errors, ``tests``, ``seconds``, and
        ``stopped`` (why the search stopped early, or None) or ``message`` (why there is none).
    """
    start = time.perf_counter()
    record: dict[str, Any] = {"folder": os.fspath(folder), "written": False, "about": about or None}
    try:
        _reproduce(record, checker, optimized, result, pathlib.Path(folder), command, seconds, capture_bytes,
                   reads, writes)  # fmt: skip
    except Exception as e:  # noqa: BLE001  a reproduction that cannot be made must not hide the check's verdict
        logger.debug("--repro failed", exc_info=True)
        record["message"] = f"internal error ({type(e).__name__}: {first_line(e)}); -v shows the traceback"
    record["seconds"] = round(time.perf_counter() - start, 3)
    return record


def _reproduce(record: dict[str, Any], checker: Any, optimized: Any, result: Any, folder: pathlib.Path,
               command: str, seconds: float | None, capture_bytes: int | None, reads: Sequence[pathlib.Path],
               writes: Sequence[pathlib.Path]) -> None:  # fmt: skip
    failures = list(result.failures) if result.checked and not result.error else []
    if not failures:
        record["message"] = "the optimised model does not differ from the original here: nothing to reproduce"
        return
    found, search = _search(checker, optimized, result, failures, seconds, capture_bytes)
    record.update(tests=search.tests, stopped=search.budget.stopped or None, notes=list(search.budget.notes))
    if found is None:
        record["message"] = ("no smallest region found before " + search.budget.stopped if search.budget.stopped
                             else "the difference did not show again on the part of the models that computes it")
    else:
        try:
            _write(found, folder, record, result, command, search, reads, writes)
        except InputError as e:  # DIR changed during the search: the check's verdict stands
            record["message"] = str(e)
        except OSError as e:
            record["message"] = f"cannot write it: {e.strerror or first_line(e)}"
        except WorkerError as e:
            record["message"] = f"could not compare it again: {e} ({e.phase})"


def _search(checker: Any, optimized: Any, result: Any, failures: list[Any], seconds: float | None,
            capture_bytes: int | None) -> tuple[_reduce.Found | None, _reduce.Search]:  # fmt: skip
    assert checker.folder is not None and checker.original_path is not None
    work = pathlib.Path(tempfile.mkdtemp(prefix="repro-", dir=checker.folder))
    opt_path = _files.runnable(optimized, work, "optimized")
    original, opt_proto = _files.whole(checker.original_path), _files.whole(opt_path)
    failing = _failing_set(result, failures)
    normwise = checker.precision is not None or (checker.rounding and failing in ("edge", "edge-nonfinite"))
    budget = _reduce.Budget(checker.timeout if seconds is None else seconds, capture_bytes)
    tolerance = (checker.rtol, checker.atol, checker.precision, checker.precision_tolerance)
    search = _reduce.Search(checker.worker, work, tolerance, normwise, budget, checker.timeout)
    search.nodes = (len(original.graph.node), len(opt_proto.graph.node))
    located = result.first_difference.output if result.first_difference is not None else ""
    pair = _reduce.Pair(original, opt_proto, checker.original_path.parent, opt_path.parent,
                        {"set": None if failing == "normal" else failing}, hint=located,
                        values=checker.located_values if located else None)  # fmt: skip
    try:
        checker.ready()
    except Exception as e:  # noqa: BLE001  a child that cannot run the original again: no reproduction
        budget.stopped = f"the check's process could not run the original again ({first_line(e)})"
        return None, search
    return search.run(pair), search


def _failing_set(result: Any, failures: list[Any]) -> str:
    """The set of inputs the locator compared on: the first, in the check's order, where an output differs."""
    order = [s["name"] for s in result.inputs.sets] if result.inputs is not None else []
    return min((f.input_set for f in failures), key=lambda name: order.index(name) if name in order else len(order))


def _ops(model: onnx.ModelProto) -> str:
    counts: dict[str, int] = {}
    for node in model.graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return ", ".join(f"{op}" if n == 1 else f"{op} x{n}" for op, n in counts.items())


def _tolerance_text(found: _reduce.Found) -> str:
    rtol, atol = found.comparison.get("rtol"), found.comparison.get("atol")
    return "exact" if rtol is None else f"rtol {rtol:g} atol {atol:g}"


def _rerun_command(folder: pathlib.Path, found: _reduce.Found, normwise: bool) -> str:
    """The command that compares the written reproduction again."""
    rtol, atol = found.comparison.get("rtol"), found.comparison.get("atol")
    flags = "" if rtol is None else f" --rtol {rtol:g} --atol {atol:g}"
    return f"python -m passes.verify.repro {shlex.quote(os.fspath(folder))}{flags}{' --scale' if normwise else ''}"


def _write(found: _reduce.Found, folder: pathlib.Path, record: dict[str, Any], result: Any, command: str,
           search: _reduce.Search, reads: Sequence[pathlib.Path], writes: Sequence[pathlib.Path]) -> None:  # fmt: skip
    """Writes the reproduction into a temporary folder next to ``folder``, checks it, renames it there."""
    check_folder(folder, reads, writes)
    parent = folder.absolute().parent
    staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".tmp", dir=parent))
    try:
        os.chmod(staging, 0o777 & ~_umask())  # as a folder made by mkdir, not mkdtemp's 0700
        for model in (found.original, found.optimized):
            region.declare_outputs(model, {found.output: found.comparison.get("shape")})
        region.write_model(found.original, found.original_source, staging / "original.onnx")
        region.write_model(found.optimized, found.optimized_source, staging / "optimized.onnx")
        names = dict.fromkeys(i.name for m in (found.original, found.optimized) for i in m.graph.input)
        arrays = {}
        for name in names:
            saved = found.inputs[name]
            arrays[name] = np.load(saved["path"], mmap_mode="r", allow_pickle=False)
        np.savez(staging / "inputs.npz", **arrays)
        refused = [f"{name}: {first_line(e)}" for name in ("original.onnx", "optimized.onnx")
                   if (e := _checker_error(staging / name)) is not None]  # fmt: skip
        again = search.worker.request({"op": "regions", "original": str(staging / "original.onnx"),
                                       "optimized": str(staging / "optimized.onnx"), "npz": str(staging / "inputs.npz"),
                                       "tolerances": {found.output: [found.comparison["rtol"], found.comparison["atol"]]
                                                      if found.comparison.get("rtol") is not None else None},
                                       "normwise": search.normwise}, time.monotonic() + search.timeout)  # fmt: skip
        shown_again = next((o for o in again.get("outputs", []) if o["name"] == found.output), None)
        if not again.get("ok") or shown_again is None or shown_again["ok"]:
            why = again.get("error") or "they agree"
            record["message"] = f"the written reproduction does not show the difference again ({why}): not written"
            return
        record.update(
            output=found.output, where=found.where, original_nodes=len(found.original.graph.node),
            optimized_nodes=len(found.optimized.graph.node), max_abs_error=shown_again["max_abs_error"],
            max_rel_error=shown_again["max_rel_error"], mismatches=shown_again["mismatches"],
            rtol=found.comparison.get("rtol"), atol=found.comparison.get("atol"), checker_refuses=refused or None,
            rerun=_rerun_command(folder, found, search.normwise),
        )  # fmt: skip
        (staging / "README.txt").write_text(_readme(found, shown_again, record, result, command, search))
        check_folder(folder, reads, writes)  # again: it may have changed during the search
        _commit(staging, folder)
        record["written"] = True
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _checker_error(path: pathlib.Path) -> Exception | None:
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except Exception as e:  # noqa: BLE001  the checker's errors share no base class
        return e
    return None


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _readme(found: _reduce.Found, again: dict[str, Any], record: dict[str, Any], result: Any, command: str,
            search: _reduce.Search) -> str:  # fmt: skip
    sets = {s["name"]: s["label"] for s in (result.inputs.sets if result.inputs is not None else [])}
    failures = result.failures
    failing = _failing_set(result, failures)
    inputs = []
    for name, saved in found.inputs.items():
        if any(i.name == name for m in (found.original, found.optimized) for i in m.graph.input):
            inputs.append(f"{name_text(name)} {saved['dtype']}{list(saved['shape'])}")
    original_nodes, optimized_nodes = search.nodes
    stopped = search.budget.stopped
    lines = [
        f"A reproduction of a failed check, written by optimize --repro (onnx-optimize {__version__}).",
        "",
        "The command that failed:",
        f"  {command or '(the Python API: passes.optimize)'}",
        "",
        f"original.onnx    {record['original_nodes']} node(s): {_ops(found.original)}"
        f"  (of the original's {original_nodes})",
        f"optimized.onnx   {record['optimized_nodes']} node(s): {_ops(found.optimized)}"
        f"  (of the optimised model's {optimized_nodes})",
        f"inputs.npz       {'; '.join(inputs)}",
        f"                 the values that reach them on the check's {sets.get(failing, failing)} inputs",
        f"Where:           {found.where}",
        *([f"Note:            {record['about']}"] if record.get("about") else []),
        "",
        f"They differ: output {name_text(found.output)}: {again['message']}",
        f"Tolerance:       {_tolerance_text(found)}" + (" (also within rtol of the output's largest magnitude)"
                                                        if search.normwise else ""),
        "The check failed on: " + "; ".join(f"{name_text(o.name)} (max abs error {o.max_abs_error:.3g}, "
                                             f"max rel error {o.max_rel_error:.3g})" for o in failures[:5]),
    ]
    if result.first_difference is not None and result.first_difference.pass_name:
        lines.append(f"Pass:            {result.first_difference.pass_name} (the pipeline without it matches)")
    if record.get("checker_refuses"):
        lines.append("The ONNX checker refuses: " + "; ".join(record["checker_refuses"]))
    lines += [
        "",
        "Compare them again (onnxruntime, CPU, graph optimisations off, as the check runs them):",
        f"  {record['rerun']}",
        "",
        f"Reduction: {search.tests} pair(s) of regions compared"
        + (f"; stopped early ({stopped}): the smallest reproduction found by then" if stopped else ""),
        *search.budget.notes,
    ]
    return "\n".join(lines) + "\n"


_RENAME_EXCHANGE = 2


def _exchange(a: pathlib.Path, b: pathlib.Path) -> bool:
    """Swaps two paths in one step (Linux ``renameat2``); False where it is not available."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    done = renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE)
    return done == 0


def _commit(staging: pathlib.Path, folder: pathlib.Path) -> None:
    """``staging`` becomes ``folder``: renamed onto a new path or an empty folder; swapped with an
    existing reproduction (then removed) in one step where the system can, else in two renames."""
    with signals_deferred():
        try:
            os.rename(staging, folder)
            return
        except OSError:
            if not folder.is_dir():
                raise
        if _exchange(staging, folder):
            shutil.rmtree(staging, ignore_errors=True)
            return
        old = pathlib.Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".old", dir=folder.absolute().parent))
        os.rename(folder, old / "previous")
        os.rename(staging, folder)
        shutil.rmtree(old, ignore_errors=True)


# --- python -m passes.verify.repro DIR -----------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """One line, as every error of the command (no usage block)."""
        self.exit(2, f"repro: error: {message}; see --help\n")


def _tolerance(text: str) -> float:
    try:
        return parse_tolerance(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def main(argv: Sequence[str] | None = None) -> int:
    """Compares a reproduction's two models on its inputs again: 1 if they differ, 0 if not, 2 on an error."""
    parser = _Parser(prog="python -m passes.verify.repro",
                     description="Run a reproduction written by optimize --repro DIR again.")
    parser.add_argument("folder", metavar="DIR")
    parser.add_argument("--rtol", type=_tolerance, default=None, help="relative tolerance (default: per dtype)")
    parser.add_argument("--atol", type=_tolerance, default=None, help="absolute tolerance (default: per dtype)")
    parser.add_argument("--scale", action="store_true",
                        help="a value may also be within rtol of the output's largest magnitude")
    args = parser.parse_args(argv)
    folder = pathlib.Path(args.folder)
    from passes.verify.child import Worker, default_memory_limit

    try:
        paths = [folder / name for name in ("original.onnx", "optimized.onnx", "inputs.npz")]
        missing = [p.name for p in paths if not p.is_file()]
        if missing:
            raise InputError(f"{shown(folder)}: no {', '.join(missing)} (not a reproduction folder)")
        outputs = onnx.load(str(paths[0]), load_external_data=False).graph.output
        tolerances = {}
        for output in outputs:
            dtype = FLOAT_TYPES.get(output.type.tensor_type.elem_type)
            default = TOLERANCES.get(dtype or "", (None, None))
            pair = (default[0] if args.rtol is None else args.rtol, default[1] if args.atol is None else args.atol)
            tolerances[output.name] = None if None in pair else list(pair)
        worker = Worker(default_memory_limit()).start()
        try:
            request = {"op": "regions", "original": str(paths[0].absolute()), "optimized": str(paths[1].absolute()),
                       "npz": str(paths[2].absolute()), "tolerances": tolerances, "normwise": args.scale}
            answer = worker.request(request, time.monotonic() + RERUN_SECONDS)
        finally:
            worker.close()
        if not answer.get("ok"):
            raise InputError(f"{shown(folder)}: onnxruntime: {answer.get('error', '')}")
    except (InputError, WorkerError, OSError, ValueError, google.protobuf.message.DecodeError) as e:
        print(f"repro: error: {first_line(e)}", file=sys.stderr)
        return 2
    for o in answer["outputs"]:
        within = "exact" if o.get("rtol") is None else f"rtol {o['rtol']:g} atol {o['atol']:g}"
        said = o["message"] or f"max abs error {o['max_abs_error']:.3g}, within the tolerance ({within})"
        print(f"{name_text(o['name'])}: {'same' if o['ok'] else 'DIFFERS'}: {said}")
    return 1 if answer["differs"] else 0


if __name__ == "__main__":
    sys.exit(main())
