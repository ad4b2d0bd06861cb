"""The ``optimize`` command: parse arguments, load, run the passes, check, save, report.

Exit codes: 0 success; 1 the check found a difference (or the optimised model
fails to run or is invalid); 2 bad usage, bad input, or a model a pass refuses;
128 + the signal number when interrupted (130 SIGINT, 143 SIGTERM), with no
partial output. Every error is one line starting ``optimize: error:``; ``-v``
adds tracebacks.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import pathlib
import signal
import sys
import traceback
import warnings
import zipfile
from collections.abc import Sequence
from typing import Any, NoReturn

import numpy as np
import onnx.checker
import onnx_ir as ir

from passes.verify import check as check_mod
from passes import modelio, pipeline
from passes.ir.walk import default_opset
from passes.errors import CheckFailedError, InputError, OptimizeError
from passes.cli.report import Report, summarize

__all__ = ["main"]

PROG = "optimize"
EXIT_OK, EXIT_CHECK, EXIT_ERROR = 0, 1, 2

_SUFFIXES = {"": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
             "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_ERROR, f"{PROG}: error: {message}\n")


def _size(text: str) -> int:
    number = text.strip().lower()
    unit = number.lstrip("0123456789.")
    value = number[: len(number) - len(unit)]
    try:
        return int(float(value) * _SUFFIXES[unit.strip()])
    except (KeyError, ValueError):
        raise argparse.ArgumentTypeError(f"invalid size {text!r} (e.g. 1048576, 512K, 1M)") from None


def _dim(text: str) -> tuple[str, int]:
    name, sep, size = text.partition("=")
    if not sep or not name or not size.isdigit():
        raise argparse.ArgumentTypeError(f"invalid --dim {text!r} (expected NAME=SIZE)")
    return name, int(size)


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


def _parser() -> argparse.ArgumentParser:
    available = "\n".join(f"  {s.name:<10} {s.description}" for s in pipeline.PASSES.values())
    parser = _Parser(
        prog=PROG,
        description=(
            "Optimise an ONNX model and prove with onnxruntime that it computes the same thing.\n\n"
            "passes (run in this order by default, then a clean-up of dead nodes,\n"
            "unused initializers and unused opset imports):\n" + (available or "  (none)")
        ),
        epilog=(
            "exit codes: 0 success; 1 the check found a difference or the optimised model\n"
            "does not run; 2 bad usage, bad input, or a model a pass refuses; 130/143\n"
            "interrupted by SIGINT/SIGTERM (no partial output is left)."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("input", help="the .onnx model to optimise (never modified)")
    parser.add_argument("-o", "--output", required=True, help="where to write the optimised model")
    parser.add_argument("--passes", type=_names, default=None, metavar="NAME,...",
                        help="passes to run, in order (default: all)")
    parser.add_argument("--skip", type=_names, default=[], metavar="NAME,...", help="passes not to run")
    parser.add_argument("--target-opset", type=int, default=None, metavar="N",
                        help=f"opset the upgrade pass converts to (default: {pipeline.DEFAULT_TARGET_OPSET}; "
                             "a model already at or above it is left at its opset; asking for a "
                             "lower opset than the model's is an error)")
    parser.add_argument("--fold-size-limit", type=_size, default=pipeline.DEFAULT_FOLD_SIZE_LIMIT,
                        metavar="BYTES", help="largest constant folding may add (default: 1M)")
    parser.add_argument("--no-check", action="store_true",
                        help="do not compare the models in onnxruntime")
    parser.add_argument("--inputs", metavar="FILE.npz", help="check inputs by name (others are generated)")
    parser.add_argument("--dim", type=_dim, action="append", default=[], metavar="NAME=SIZE",
                        help=f"size of a named dynamic dimension for generated inputs "
                             f"(default {check_mod.DEFAULT_DIM}); repeatable")
    parser.add_argument("--seed", type=int, default=0, help="seed of generated inputs (default: 0)")
    parser.add_argument("--rtol", type=float, default=None, help="relative tolerance for float outputs")
    parser.add_argument("--atol", type=float, default=None, help="absolute tolerance for float outputs")
    parser.add_argument("--report", metavar="FILE.json", help="also write the report as JSON")
    parser.add_argument("--force", action="store_true",
                        help="write the output even if the check fails (the exit code is still 1)")
    verbosity = parser.add_mutually_exclusive_group()
    verbosity.add_argument("-q", "--quiet", action="store_true", help="print only errors")
    verbosity.add_argument("-v", "--verbose", action="store_true", help="log details and show tracebacks")
    return parser


class _Console:
    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.tty = sys.stderr.isatty()

    def progress(self, message: str) -> None:
        if self.tty and not self.quiet:
            print(f"{PROG}: {message}...", file=sys.stderr, flush=True)

    def warn(self, message: str) -> None:
        if not self.quiet:
            print(f"{PROG}: warning: {message}", file=sys.stderr, flush=True)

    def out(self, text: str) -> None:
        if not self.quiet:
            print(text, flush=True)

    def show_warning(self, message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> None:
        """Replaces ``warnings.showwarning``: a library warning becomes one line."""
        text = str(message).strip()
        self.warn(text.splitlines()[0] if text else category.__name__)


def _load_inputs(path: str) -> dict[str, np.ndarray]:
    try:
        data = np.load(path, allow_pickle=False)
        if not isinstance(data, np.lib.npyio.NpzFile):
            raise ValueError("not an .npz archive of arrays by input name")
        with data:
            return {k: data[k] for k in data.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise InputError(f"{path}: cannot read inputs ({str(e).splitlines()[0] if str(e) else e})") from e


_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived; ``signum`` says which."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _terminate(signum: int, frame: Any) -> NoReturn:
    # Only the first signal interrupts; a second one must not cut the clean-up short.
    for s in _SIGNALS:
        signal.signal(s, signal.SIG_IGN)
    raise _Interrupted(signum)


def _check_destinations(src: pathlib.Path, dst: pathlib.Path, report: str | None, model: ir.Model) -> None:
    """Refuses an OUTPUT (or its ``.data`` file, or the report) that would overwrite part of the
    input other than by replacing the input model as a whole (``-o INPUT``)."""
    source = src.resolve()
    inputs = {source, *modelio.data_files(model)}
    target = dst.resolve()
    written = {target, target.with_name(target.name + ".data")}
    clashes = sorted(written & inputs) if target != source else []
    if clashes:
        raise InputError(f"{dst}: writing it would overwrite the input's file {clashes[0]}; choose another output")
    if report is not None:
        if pathlib.Path(report).resolve() in inputs | written:
            raise InputError(f"--report {report}: that is a model file of this run; choose another name")
        if not pathlib.Path(report).resolve().parent.is_dir():
            raise InputError(f"--report {report}: its folder does not exist")


def _run(args: argparse.Namespace, console: _Console, state: dict[str, bool]) -> int:
    names = pipeline.select_passes(args.passes, args.skip)
    if args.target_opset is not None and args.target_opset < 1:
        raise InputError(f"--target-opset {args.target_opset}: must be a positive opset version")
    if args.fold_size_limit < 0:
        raise InputError("--fold-size-limit must not be negative")
    if args.seed < 0:
        raise InputError(f"--seed {args.seed}: must not be negative")
    for name in ("rtol", "atol"):
        value = getattr(args, name)
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise InputError(f"--{name} {value}: must be a finite number >= 0")
    inputs = _load_inputs(args.inputs) if args.inputs else None
    src = pathlib.Path(args.input)
    dst = pathlib.Path(args.output)

    console.progress(f"loading {src}")
    model = modelio.load_model(src)
    _check_destinations(src, dst, args.report, model)
    opset = default_opset(model.opset_imports)
    if opset is not None and args.target_opset is not None and args.target_opset < opset:
        raise InputError(
            f"--target-opset {args.target_opset} is lower than the model's opset {opset}; "
            "this tool never lowers an opset"
        )
    report = Report(str(src), str(dst), summarize(model))
    target = pipeline.DEFAULT_TARGET_OPSET if args.target_opset is None else args.target_opset
    options = pipeline.Options(target_opset=target, fold_size_limit=args.fold_size_limit)
    report.passes = pipeline.run_pipeline(model, names, options, progress=console.progress)
    report.after = summarize(model)

    with modelio.staged_output(dst) as staged:
        console.progress(f"saving {dst}")
        staged_path = staged.save(model)
        failure: str | None = None
        try:
            onnx.checker.check_model(str(staged_path))
        except (onnx.checker.ValidationError, RuntimeError, ValueError) as e:
            failure = f"the optimised model is invalid: {str(e).strip().splitlines()[0]}"
        if failure is None and not args.no_check:
            console.progress("checking with onnxruntime")
            result = check_mod.check(
                src, staged_path, inputs=inputs, dims=dict(args.dim),
                rtol=args.rtol, atol=args.atol, seed=args.seed,
            )
            report.check = result
            if result.inputs_rejected:
                raise InputError(f"--inputs {args.inputs}: {result.skipped}")
            if result.skipped:
                console.warn(result.summary())
            elif not result.ok:
                failure = result.summary()
        if failure is None or args.force:
            try:
                staged.commit()
            finally:  # an interrupt may arrive as the commit completes
                report.written = state["written"] = staged.committed

    console.out(report.format())
    if args.report:
        _write_report(args.report, report)
    if failure is not None:
        raise CheckFailedError(failure + ("" if report.written else f"; {dst} not written"))
    return EXIT_OK


def _write_report(path: str, report: Report) -> None:
    target = pathlib.Path(path)
    tmp = target.with_name(f".{target.name}.tmp")
    try:
        tmp.write_text(json.dumps(report.to_json(), indent=2, default=str) + "\n", encoding="utf-8")
        os.replace(tmp, target)
    except OSError as e:
        raise InputError(f"{path}: cannot write the report ({e.strerror or e})") from e
    finally:
        tmp.unlink(missing_ok=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``optimize`` command; returns the exit code."""
    # A handler installed outside Python (getsignal() is None) could not be restored: leave it.
    previous = {s: h for s in _SIGNALS if (h := signal.getsignal(s)) is not None}
    try:
        for s in previous:
            signal.signal(s, _terminate)
    except ValueError:  # not in the main thread (embedded use): leave signals alone
        previous = {}
    state = {"written": False}
    verbose = False
    try:
        args = _parser().parse_args(argv)
        verbose = args.verbose
        level = logging.DEBUG if args.verbose else logging.ERROR if args.quiet else logging.WARNING
        logging.basicConfig(level=level, format=f"{PROG}: %(levelname)s: %(name)s: %(message)s")
        console = _Console(args.quiet)
        with warnings.catch_warnings():
            warnings.showwarning = console.show_warning
            return _run(args, console, state)
    except CheckFailedError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return EXIT_CHECK
    except OptimizeError as e:
        if verbose:
            traceback.print_exc()
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt as e:
        done = "the output was already written" if state["written"] else "no output written"
        print(f"{PROG}: error: interrupted; {done}", file=sys.stderr)
        return 128 + (e.signum if isinstance(e, _Interrupted) else signal.SIGINT)
    except MemoryError:
        print(f"{PROG}: error: out of memory", file=sys.stderr)
        return EXIT_ERROR
    except Exception as e:  # noqa: BLE001  the last line of defence: no traceback for users
        if verbose:
            traceback.print_exc()
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        print(
            f"{PROG}: error: internal error ({type(e).__name__}{': ' + first if first else ''}); "
            "rerun with -v for the traceback and please report it",
            file=sys.stderr,
        )
        return EXIT_ERROR
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


if __name__ == "__main__":
    sys.exit(main())
