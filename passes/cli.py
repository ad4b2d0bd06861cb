"""The ``optimize`` command: parse arguments, load, run the passes, check, save, report.

Exit codes: 0 success; 1 the check found a difference (or the optimised model
fails to run or is invalid); 2 bad usage, bad input, or a model a pass refuses.
Every error is one line starting ``optimize: error:``; ``-v`` adds tracebacks.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pathlib
import signal
import sys
import traceback
from collections.abc import Sequence
from typing import Any, NoReturn

import numpy as np
import onnx.checker

from passes import ort_check as check_mod
from passes import modelio, pipeline
from passes.errors import CheckFailedError, InputError, OptimizeError
from passes.report import Report, summarize

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
    if unit.strip() not in _SUFFIXES or not value:
        raise argparse.ArgumentTypeError(f"invalid size {text!r} (e.g. 1048576, 512K, 1M)")
    return int(float(value) * _SUFFIXES[unit.strip()])


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
            "does not run; 2 bad usage, bad input, or a model a pass refuses."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("input", help="the .onnx model to optimise (never modified)")
    parser.add_argument("-o", "--output", required=True, help="where to write the optimised model")
    parser.add_argument("--passes", type=_names, default=None, metavar="NAME,...",
                        help="passes to run, in order (default: all)")
    parser.add_argument("--skip", type=_names, default=[], metavar="NAME,...", help="passes not to run")
    parser.add_argument("--target-opset", type=int, default=pipeline.DEFAULT_TARGET_OPSET, metavar="N",
                        help="opset the upgrade pass converts to (default: %(default)s; never lowers)")
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


def _load_inputs(path: str) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: cannot read inputs ({str(e).splitlines()[0] if str(e) else e})") from e


def _terminate(signum: int, frame: Any) -> NoReturn:
    raise KeyboardInterrupt


def _run(args: argparse.Namespace, console: _Console, state: dict[str, bool]) -> int:
    names = pipeline.select_passes(args.passes, args.skip)
    if args.target_opset < 1:
        raise InputError(f"--target-opset {args.target_opset}: must be a positive opset version")
    if args.fold_size_limit < 0:
        raise InputError("--fold-size-limit must not be negative")
    inputs = _load_inputs(args.inputs) if args.inputs else None
    src = pathlib.Path(args.input)
    dst = pathlib.Path(args.output)

    console.progress(f"loading {src}")
    model = modelio.load_model(src)
    opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx"))
    if opset is not None and args.target_opset < opset:
        raise InputError(
            f"--target-opset {args.target_opset} is lower than the model's opset {opset}; "
            "this tool never lowers an opset"
        )
    report = Report(str(src), str(dst), summarize(model))
    options = pipeline.Options(target_opset=args.target_opset, fold_size_limit=args.fold_size_limit)
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
            if result.skipped:
                console.warn(result.summary())
            elif not result.ok:
                failure = result.summary()
        if failure is None or args.force:
            staged.commit()
            report.written = state["written"] = True

    console.out(report.format())
    if args.report:
        _write_report(args.report, report)
    if failure is not None:
        raise CheckFailedError(failure + ("" if report.written else f"; {dst} not written"))
    return EXIT_OK


def _write_report(path: str, report: Report) -> None:
    target = pathlib.Path(path)
    try:
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_text(json.dumps(report.to_json(), indent=2, default=str) + "\n", encoding="utf-8")
        os.replace(tmp, target)
    except OSError as e:
        raise InputError(f"{path}: cannot write the report ({e.strerror or e})") from e


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``optimize`` command; returns the exit code."""
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format=f"{PROG}: %(levelname)s: %(name)s: %(message)s",
    )
    console = _Console(args.quiet)
    previous = signal.getsignal(signal.SIGTERM)
    try:
        signal.signal(signal.SIGTERM, _terminate)
    except ValueError:  # not in the main thread (embedded use): leave signals alone
        previous = None
    state = {"written": False}
    try:
        return _run(args, console, state)
    except CheckFailedError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return EXIT_CHECK
    except OptimizeError as e:
        if args.verbose:
            traceback.print_exc()
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        done = "the output was already written" if state["written"] else "no output written"
        print(f"{PROG}: error: interrupted; {done}", file=sys.stderr)
        return 130
    except MemoryError:
        print(f"{PROG}: error: out of memory", file=sys.stderr)
        return EXIT_ERROR
    except Exception as e:  # noqa: BLE001  the last line of defence: no traceback for users
        if args.verbose:
            traceback.print_exc()
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        print(
            f"{PROG}: error: internal error ({type(e).__name__}{': ' + first if first else ''}); "
            "rerun with -v for the traceback and please report it",
            file=sys.stderr,
        )
        return EXIT_ERROR
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
