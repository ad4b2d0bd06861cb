"""The ``optimize`` command: parse arguments, run :func:`passes.pipeline.optimize_file`, report.

Exit codes: 0 success (a check that could not run is reported as NOT CHECKED,
on stderr even with ``-q``); 1 the check found a difference (or the optimised
model fails to run or is invalid, or, with ``--require-check``, the check could
not run); 2 bad usage, bad input, or a model a pass refuses; 128 + the signal
number when interrupted (130 SIGINT, 143 SIGTERM), with no partial output.
Every error is one line starting ``optimize: error:``; ``-v`` adds tracebacks.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import pathlib
import shlex
import signal
import sys
import traceback
import warnings
import zipfile
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from passes import pipeline
from passes.cli.args import PROG, option_values, parser, resolve_output, static_shapes
from passes.cli.progress import TerminalProgress
from passes.errors import (
    EXIT_CHECK, EXIT_ERROR, EXIT_OK, CheckFailedError, InputError, OptimizeError, first_line, interrupt_behind,
)
from passes.lazy import defer_import

if TYPE_CHECKING:
    from passes.report import Report  # numpy and onnx_ir: not at start-up

__all__ = ["main", "run"]


class _Console:
    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.tty = sys.stderr.isatty()
        # The progress line: on a terminal only, never with -q (see passes.cli.progress).
        self.progress = TerminalProgress(sys.stderr, PROG) if self.tty and not quiet else None

    def warn(self, message: str, *, even_quiet: bool = False) -> None:
        if even_quiet or not self.quiet:
            if self.progress is not None:
                self.progress.clear()
            print(f"{PROG}: warning: {message}", file=sys.stderr, flush=True)

    def not_checked(self, message: str) -> None:
        """A check that could not run is never silent, not even with ``-q``."""
        self.warn(message, even_quiet=True)

    def out(self, text: str) -> None:
        if not self.quiet:
            print(text, flush=True)

    @staticmethod
    def show_warning(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> None:
        """Replaces ``warnings.showwarning``: a library's warning is logged, shown with ``-v`` only."""
        text = str(message).strip()
        logging.getLogger("py.warnings").warning("%s: %s", category.__name__, first_line(text) if text else "")


class _OwnRecordsOnly(logging.Filter):
    """Without ``-v``, only this tool's records: libraries (onnx_ir's "cannot be found in
    any scope", "contains invalid UTF-8"...) log about models the tool then refuses in
    its one error line, and their lines would come before it. With ``-v``, the records of
    INFO and above (each pass's time and counters: a line or two per pass); the DEBUG
    lines, one per node (this tool's "rule X does not apply to node Y", "folded node Y",
    onnx_ir's "ValueInfoProto not found"), only with ``-vv``.

    A warning said again with the same text is not printed again (a pass that runs in
    several rounds, the search for the pass that brought a mismatch, would repeat it)."""

    def __init__(self, verbose: int) -> None:
        super().__init__()
        self.verbose = verbose
        self.said: set[tuple[str, str]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            key = (record.name, record.getMessage())
            if key in self.said:
                return False
            self.said.add(key)
        if record.levelno < logging.INFO:
            return self.verbose >= 2
        return self.verbose >= 1 or record.name == "passes" or record.name.startswith("passes.")


@contextlib.contextmanager
def _logging(verbose: int, quiet: bool) -> Iterator[None]:
    """A stderr handler on the root logger for the duration of a run (removed after, for embedded use)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"{PROG}: %(levelname)s: %(name)s: %(message)s"))
    handler.addFilter(_OwnRecordsOnly(verbose))
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose >= 2 else logging.INFO if verbose else logging.ERROR if quiet
                  else logging.WARNING)  # fmt: skip
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def _inputs_file(path: str) -> str:
    """``--inputs FILE``: refused at once if it is not a zip archive (its arrays are read later,
    bounded, against the model's inputs; see ``passes.verify.npz``)."""
    try:
        with zipfile.ZipFile(path):
            pass
    except (OSError, zipfile.BadZipFile) as e:
        raise InputError(f"{path}: cannot read inputs (not an .npz archive of arrays by input name: "
                         f"{first_line(e)})") from e
    return path


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


def _redeliver(unraisable: Any) -> None:
    """``sys.unraisablehook`` of the command's process: an interrupt that landed where Python cannot
    raise it (a weakref callback such as the import system's module-lock clean-up, a ``__del__``)
    is raised again once that callback has returned, and the run ends like any other interrupt.

    Python prints such an exception ("Exception ignored in ...", with a traceback) and goes on;
    :func:`_terminate` had set both signals to be ignored, so the run went on to write its output
    with exit 0. A signal sent again would be handled inside this hook (any Python code here can
    run the handler) and be lost the same way; so a profile function raises it at the first call
    or return after this hook's own, in the code the callback interrupted. Any other unraisable
    exception is printed as usual.
    """
    error = unraisable.exc_value
    if not isinstance(error, _Interrupted):
        sys.__unraisablehook__(unraisable)
        return
    signum, own = error.signum, _redeliver.__code__

    def raise_after_the_hook(frame: Any, event: str, arg: Any) -> None:
        if frame.f_code is own:
            return
        sys.setprofile(None)
        raise _Interrupted(signum)

    sys.setprofile(raise_after_the_hook)


#: The C++ extension modules every run loads (numpy's, onnx's nanobind module, onnx_ir's imports).
_EXTENSIONS = ("numpy", "onnx", "onnx_ir")
#: Imported by onnx_ir and rarely used by a run: imported at their first use (:func:`defer_import`).
_DEFERRED = ("sympy", "onnx_ir._symbolic_shapes")


def _exit_at_once(signum: int, frame: Any) -> NoReturn:
    sys.stderr.write(f"{PROG}: error: interrupted; no output written\n")
    sys.stderr.flush()
    os._exit(128 + signum)


def _import_extensions() -> None:
    """Loads the extension modules while SIGINT/SIGTERM still end the process at once (as in start-up).

    The exception :func:`_terminate` raises, landing inside an extension module's initialisation,
    does not unwind: onnx's nanobind module calls std::terminate (the process dies of SIGABRT or
    SIGSEGV with a C++ message). Nothing is written before the run, so exiting is what the
    exception would have led to. Only for the command as a process (:func:`run`).
    """
    missing = [name for name in _EXTENSIONS if name not in sys.modules]
    if not missing:
        return
    defer_import(*_DEFERRED)
    previous = {s: signal.getsignal(s) for s in _SIGNALS}
    for s in _SIGNALS:
        signal.signal(s, _exit_at_once)
    try:
        for name in missing:
            __import__(name)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _run(args: argparse.Namespace, console: _Console, state: dict[str, bool]) -> int:
    if args.no_check and args.require_check:
        raise InputError("--no-check and --require-check contradict each other")
    if state.get("process") and os.path.isfile(args.input):  # (a missing input fails before any import)
        _import_extensions()
    check = pipeline.CheckOptions(
        enabled=not args.no_check, inputs_file=_inputs_file(args.inputs) if args.inputs else None,
        inputs_source=args.inputs or "", dims=dict(args.dim), seed=args.seed, rtol=args.rtol,
        atol=args.atol, required=args.require_check, timeout=args.check_timeout,
        memory_limit=args.check_memory, repro=args.repro, unfused_fallback=not args.no_unfused_fallback,
        command=shlex.join([PROG, *args.argv]),
    )  # fmt: skip

    def committed(written: bool) -> None:
        state["written"] = written

    try:
        report = pipeline.optimize_file(
            args.input, args.output, passes=args.passes, skip=args.skip, check=check, force=args.force,
            report_path=args.report, progress=console.progress, warn=console.not_checked, on_commit=committed,
            replace_data=args.replace_data, **static_shapes(args), **option_values(args),
        )  # fmt: skip
    except CheckFailedError as e:
        report = getattr(e, "report", None)
        if report is not None:
            console.out(_summary(report, args))
        failed = CheckFailedError(_failure_text(e, report, summary_shown=not console.quiet))
        failed.report = report  # type: ignore[attr-defined]
        raise failed from e
    console.out(_summary(report, args))
    return EXIT_OK


def _summary(report: Report, args: argparse.Namespace) -> str:
    text = report.format(verbose=bool(args.verbose))
    return text + "\n\nnot checked (--no-check)" if args.no_check else text


def _failure_text(error: CheckFailedError, report: Report | None, *, summary_shown: bool) -> str:
    """The error line, the first difference, then a hint that fits the cause.

    When the summary above already gave each output's difference, the error's
    first line names the outputs instead of repeating their sentences.
    """
    first, *rest = str(error).split("\n")
    check = report.check if report is not None else None
    if report is None or check is None:
        return str(error)
    failures = check.failures if check.checked and not check.error else []
    if summary_shown and failures:
        from passes.verify.result import shown_names  # loaded by the run already

        names = shown_names([o.name for o in failures])
        first = (f"check failed: {len(failures)} of {len(check.outputs)} output(s) differ ({names}; see above)"
                 + ("" if report.written else f"; {report.output} not written"))
    from passes.cli.hints import check_hint  # its imports are loaded by the run already

    return "\n".join([first, *rest, *check_hint(report)])


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``optimize`` command; returns the exit code (the signal handlers are restored)."""
    # A handler installed outside Python (getsignal() is None) could not be restored: leave it.
    previous = {s: h for s in _SIGNALS if (h := signal.getsignal(s)) is not None}
    try:
        for s in previous:
            signal.signal(s, _terminate)
    except ValueError:  # not in the main thread (embedded use): leave signals alone
        previous = {}
    try:
        return _main(argv, {"written": False})
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def run(argv: Sequence[str] | None = None) -> NoReturn:
    """The command as a process: :func:`main`, then exit at once with its code.

    After the run, Python's own shutdown (onnxruntime, numpy, module teardown)
    takes a while, and late in it the default signal handlers are back: a
    SIGINT or SIGTERM then killed the process with the raw signal and no
    message although the output was complete. Here the handlers stay until
    the output streams are flushed, a signal in that time is reported like
    any other ("interrupted; the output was already written"), and the
    process ends with ``os._exit`` without that shutdown (every file is
    closed and every temporary file removed by then).
    """
    state = {"written": False, "process": True}
    sys.unraisablehook = _redeliver
    for s in _SIGNALS:
        signal.signal(s, _terminate)
    try:
        code = _main(argv, state)
        sys.stdout.flush()
        sys.stderr.flush()
        # Still inside the try: a signal between ignoring SIGINT and ignoring SIGTERM is
        # reported like the others (outside, it escaped as a traceback).
        for s in _SIGNALS:
            signal.signal(s, signal.SIG_IGN)
    except KeyboardInterrupt as e:  # after main's own handling: while flushing (_terminate ignores both now)
        code = _interrupted(e, state)
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    os._exit(code)


def _interrupted(error: KeyboardInterrupt, state: dict[str, bool]) -> int:
    done = "the output was already written" if state["written"] else "no output written"
    print(f"{PROG}: error: interrupted; {done}", file=sys.stderr, flush=True)
    return 128 + (error.signum if isinstance(error, _Interrupted) else signal.SIGINT)


def _folder(args: argparse.Namespace, groups: Sequence[tuple[str | None, list[str]]]) -> int:
    """``optimize DIR -o OUTDIR``: each model a single run (see :mod:`passes.cli.folder`)."""
    from passes.cli import folder

    if args.repro is not None:
        raise InputError("--repro DIR is for one model: run the model whose check fails again alone with it")
    try:
        return folder.run_folder(pathlib.Path(args.input), pathlib.Path(args.output), folder.child_arguments(groups),
                                 jobs=args.jobs, report_path=args.report, quiet=args.quiet)  # fmt: skip
    except KeyboardInterrupt as e:
        print(f"{PROG}: error: interrupted; the models not finished were not written (no partial output)",
              file=sys.stderr, flush=True)
        return 128 + (e.signum if isinstance(e, _Interrupted) else signal.SIGINT)


def _main(argv: Sequence[str] | None, state: dict[str, bool]) -> int:
    verbose = False
    try:
        parser_ = parser()
        raw = list(sys.argv[1:] if argv is None else argv)
        args = parser_.parse_intermixed_args(raw)  # OUTPUT may follow flags: ``IN --input-shape x:1,3 OUT``
        args.argv = raw
        resolve_output(parser_, args)
        verbose = args.verbose
        if os.path.isdir(args.input) and not args.input.rstrip(os.sep).lower().endswith(".onnx"):
            return _folder(args, parser_.groups(raw))  # (a folder named *.onnx stays "not a regular file")
        if args.jobs is not None:
            raise InputError(f"--jobs is for a folder of models; {args.input} is not a folder")
        console = _Console(args.quiet)
        try:
            with _logging(args.verbose, args.quiet), warnings.catch_warnings():
                warnings.showwarning = console.show_warning
                return _run(args, console, state)
        finally:
            if console.progress is not None:
                console.progress.close()
    except CheckFailedError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return EXIT_CHECK
    except OptimizeError as e:
        if (interrupt := interrupt_behind(e)) is not None:
            return _interrupted(interrupt, state)
        if verbose:
            traceback.print_exc()
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt as e:
        return _interrupted(e, state)
    except MemoryError:
        print(f"{PROG}: error: out of memory", file=sys.stderr)
        return EXIT_ERROR
    except Exception as e:  # noqa: BLE001  the last line of defence: no traceback for users
        if (interrupt := interrupt_behind(e)) is not None:  # one Python wrapped (see passes.errors)
            return _interrupted(interrupt, state)
        if verbose:
            traceback.print_exc()
        first = first_line(e) if str(e).strip() else ""
        print(
            f"{PROG}: error: internal error ({type(e).__name__}{': ' + first if first else ''}); "
            "rerun with -v for the traceback and please report it",
            file=sys.stderr,
        )
        return EXIT_ERROR


if __name__ == "__main__":
    run()
