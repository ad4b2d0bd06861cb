"""The ``optimize`` command's arguments: fixed ones, plus one flag per declared pass option."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from passes import __version__, pipeline
from passes.cli import habits
from passes.errors import EXIT_ERROR, InputError
from passes.options import Option, parse_int, parse_nonnegative_int, parse_size, parse_tolerance, short
from passes.verify.defaults import DEFAULT_TIMEOUT

__all__ = ["PROG", "Parser", "option_values", "parser", "resolve_output", "static_shapes"]

PROG = "optimize"


class Parser(argparse.ArgumentParser):
    """No abbreviations (``--job 2`` is not ``--jobs 2``: a folder's runs pass flags on by name), the
    other tools' flags made ours or refused with a pointer (:mod:`passes.cli.habits`), one-line errors."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(allow_abbrev=False, **kwargs)

    def parse_known_args(self, args: Sequence[str] | None = None,
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        try:
            translated = habits.translate(sys.argv[1:] if args is None else args)
        except habits.Refusal as e:
            self.error(str(e))
        return super().parse_known_args(translated, namespace)

    def error(self, message: str) -> NoReturn:
        """One line, as every other error (argparse's default adds a usage block of ~9 lines)."""
        self.exit(EXIT_ERROR, f"{PROG}: error: {self._suggest(message)}; see {PROG} --help\n")

    def _suggest(self, message: str) -> str:
        """``--target_opset`` (onnxsim's spelling) -> "did you mean --target-opset?" when that flag exists;
        a number after the output (onnxsim's ``IN OUT N``) -> what the check does here."""
        prefix = "unrecognized arguments: "
        if not message.startswith(prefix):
            return message
        words = message[len(prefix):].split()
        for word in words:
            flag = word.split("=", 1)[0]
            if not flag.startswith("--"):
                continue
            if "_" in flag and flag.replace("_", "-") in self._option_string_actions:
                return f"{message} (did you mean {flag.replace('_', '-')}?)"
            longer = sorted(f for f in self._option_string_actions if f.startswith(flag) and f != flag)
            if longer:
                return f"{message} (did you mean {' or '.join(longer[:3])}? flags are not abbreviated)"
        return message + habits.bare_count_hint(words[0]) if words else message

    def groups(self, argv: Sequence[str]) -> list[tuple[str | None, list[str]]]:
        """The tokens of ``argv`` (as :meth:`parse_args` takes it, after the other tools' forms are
        made ours) grouped by argument: ``(dest, tokens)`` for an option with its value, ``(None,
        [token])`` for a positional. A folder's runs get the groups that are theirs."""
        tokens = habits.translate(argv)
        found: list[tuple[str | None, list[str]]] = []
        i = 0
        while i < len(tokens):
            token = tokens[i]
            i += 1
            if token == "--":
                found.extend((None, [t]) for t in tokens[i:])
                break
            if not token.startswith("-") or token == "-" or self._negative_number_matcher.match(token):
                found.append((None, [token]))
                continue
            if token.startswith("--"):
                action = self._option_string_actions.get(token.split("=", 1)[0])
                takes = action is not None and action.nargs != 0 and "=" not in token
                found.append((action.dest if action else None, [token, *tokens[i:i + 1]] if takes else [token]))
                i += 1 if takes else 0
                continue
            for k in range(1, len(token)):  # -q, -vv, -oOUT, -o OUT
                action = self._option_string_actions.get("-" + token[k])
                if action is not None and action.nargs != 0:
                    value = token[k + 1:]
                    found.append((action.dest, ["-" + token[k], value] if value else ["-" + token[k], *tokens[i:i + 1]]))
                    i += 0 if value else 1
                    break
                found.append((action.dest if action else None, ["-" + token[k]]))
        return found


def resolve_output(parser_: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``optimize IN OUT`` (onnxsim's and onnxslim's form) and ``optimize IN -o OUT`` alike.

    Both given and different, or neither: a usage error (exit 2).
    """
    positional = args.output_path
    if positional is not None and args.output is not None and positional != args.output:
        parser_.error(f"two outputs: {short(positional)} and -o {short(args.output)} (give one)")
    args.output = args.output if args.output is not None else positional
    if args.output is None:
        parser_.error("no output: give it as OUTPUT or -o OUTPUT")
    del args.output_path


def _typed(option: Option) -> Any:
    # A pass declaring parse=int would take '٤', '1_8' or 5000 digits: the strict parser instead.
    parser_of_text = parse_int if option.parse is int else option.parse

    def parse(text: str) -> Any:
        try:
            return parser_of_text(text)
        except (ValueError, OverflowError) as e:
            raise argparse.ArgumentTypeError(str(e) or f"invalid value {short(text)}") from None

    parse.__name__ = option.name  # argparse names the type in its messages
    return parse


def _dim(text: str) -> tuple[str, int | tuple[int, ...]]:
    """``NAME=SIZE`` (a size), or ``NAME=A,B,...`` (the sizes the check tries the dim at, in order)."""
    name, sep, sizes = text.partition("=")
    try:
        values = tuple(parse_nonnegative_int(size.strip()) for size in sizes.split(","))
    except ValueError:
        values = ()
    if not sep or not name or not values:
        raise argparse.ArgumentTypeError(f"invalid --dim {short(text)} (expected NAME=SIZE or NAME=A,B,...)")
    return name, values[0] if len(values) == 1 else values


def _size(text: str) -> int | str:
    """A size as an int when it reads as one; else the text, which the pipeline refuses by name."""
    try:
        return parse_int(text)
    except ValueError:
        return text


def _input_shape(text: str) -> tuple[str, list[int | str]]:
    """``NAME:D0,D1,...`` (the name may hold ``:``, as TensorFlow's ``input:0`` does); ``D0,D1,...`` alone
    (onnxsim's form for a model with one input) has the name "", which the pipeline reads as that input."""
    name, sep, sizes = text.rpartition(":")
    bare = not sep and all(s.strip().isascii() and s.strip().isdigit() for s in sizes.split(","))
    if not bare and (not sep or not name or not sizes.strip()):
        raise argparse.ArgumentTypeError(f"invalid --input-shape {short(text)} (expected NAME:D0,D1,..., or "
                                         "D0,D1,... for a model with one input)")
    return name, [_size(s.strip()) for s in sizes.split(",")]


def _fix_dim(text: str) -> tuple[str, int | str]:
    name, sep, size = text.rpartition("=")
    if not sep or not name or not size.strip():
        raise argparse.ArgumentTypeError(f"invalid --fix-dim {short(text)} (expected NAME=SIZE)")
    return name, _size(size.strip())


def _jobs(text: str) -> int:
    try:
        value = parse_int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"invalid --jobs {short(text)} (expected a whole number >= 1)")
    return value


def _seed(text: str) -> int:
    try:
        return parse_nonnegative_int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid --seed {short(text)} (expected a whole number >= 0)") from None


def _tolerance(text: str) -> float:
    try:
        return parse_tolerance(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"invalid --check-timeout {text!r} (expected seconds > 0)")
    return value


def _memory(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"invalid --check-memory {text!r} ({e})") from None


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


def parser() -> Parser:
    """The command's parser; pass options come from the passes' declarations."""
    available = "\n".join(f"  {s.name:<10} {s.description}" for s in pipeline.PASSES.values())
    result = Parser(
        prog=PROG,
        description=(
            "Optimise an ONNX model and prove with onnxruntime that it computes the same thing.\n\n"
            "passes (run in this order by default, then a clean-up of dead nodes,\n"
            "unused initializers and unused opset imports):\n" + (available or "  (none)")
        ),
        epilog=(
            "only regular files and new paths are written: OUTPUT, OUTPUT.data and the\n"
            "report are refused if they are devices, FIFOs, sockets or folders, and the\n"
            "report is committed together with OUTPUT.\n\n"
            "exit codes: 0 success (the report says NOT CHECKED when the onnxruntime check\n"
            "could not run); 1 the check found a difference, the optimised model does not\n"
            "run or is invalid, or (with --require-check) the check could not run; 2 bad\n"
            "usage, bad input, or a model a pass refuses; 130/143 interrupted by\n"
            "SIGINT/SIGTERM (no partial output is left; the message says whether the\n"
            "output had already been written)."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    result.add_argument("input", help="the .onnx model to optimise (never modified), or a folder: every "
                                      ".onnx under it, into the folder OUTPUT (subfolders kept)")
    result.add_argument("output_path", nargs="?", metavar="OUTPUT",
                        help="where to write the optimised model (or -o OUTPUT)")
    result.add_argument("-o", "--output", metavar="OUTPUT", help="where to write the optimised model")
    result.add_argument("--passes", type=_names, default=None, metavar="NAME,...",
                        help="passes to run, in order (default: all)")
    result.add_argument("--skip", type=_names, default=[], metavar="NAME,...", help="passes not to run")
    for option in pipeline.pass_options():
        if option.is_switch:
            result.add_argument(option.flag, dest=option.name, action="store_const",
                                const=not option.default, default=option.default, help=option.help)
        else:
            result.add_argument(option.flag, dest=option.name, type=_typed(option), default=option.default,
                                metavar=option.metavar, help=option.help)
    result.add_argument("--input-shape", "--overwrite-input-shape", dest="input_shape", type=_input_shape,
                        action="append", default=[], metavar="NAME:D0,D1,...",
                        help="declare a graph input with this static shape before the passes (shape "
                             "arithmetic then folds; the check runs at it); repeatable; also onnxsim's "
                             "forms: several after one flag, D0,D1,... alone for a model with one input")
    result.add_argument("--fix-dim", type=_fix_dim, action="append", default=[], metavar="NAME=SIZE",
                        help="set a symbolic dim to SIZE everywhere it appears (inputs, outputs, value "
                             "infos, subgraphs) before the passes; repeatable")
    result.add_argument("--no-check", action="store_true", help="do not compare the models in onnxruntime")
    result.add_argument("--require-check", action="store_true",
                        help="fail (exit 1, output not written unless --force) when the check cannot run")
    result.add_argument("--no-unfused-fallback", action="store_true",
                        help="when the check refuses the fused model, fail (exit 1) instead of checking and "
                             "writing the same passes without simplify's fusions (as --no-fuse would)")
    result.add_argument("--check-timeout", type=_seconds, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                        help=f"time limit of the onnxruntime check (default {DEFAULT_TIMEOUT:g}); "
                             "after a mismatch the locator gets as much again")
    result.add_argument("--check-memory", type=_memory, default=None, metavar="SIZE",
                        help="address-space bound of the check's process, e.g. 8G (default: 3/4 of "
                             "physical memory; 0: none)")
    result.add_argument("--inputs", metavar="FILE.npz",
                        help="the check's inputs: an .npz of arrays by input name (others are generated)")
    result.add_argument("--dim", type=_dim, action="append", default=[], metavar="NAME=SIZE[,SIZE...]",
                        help="size of a named dynamic dimension for generated inputs (default: "
                             "sizes tried until the original model runs, then a larger one); more sizes "
                             "after commas: the check's larger sets; repeatable")
    result.add_argument("--seed", type=_seed, default=0, help="seed of generated inputs (default: 0)")
    result.add_argument("--rtol", type=_tolerance, default=None, help="relative tolerance for float outputs")
    result.add_argument("--atol", type=_tolerance, default=None, help="absolute tolerance for float outputs")
    result.add_argument("--report", metavar="FILE.json", help="also write the report as JSON")
    result.add_argument("--repro", metavar="DIR",
                        help="when the check finds a difference: write the smallest pair of models that still "
                             "differ, their inputs and a README into DIR (a new or empty folder, or a previous "
                             "reproduction, which is replaced)")
    result.add_argument("--jobs", type=_jobs, default=None, metavar="N",
                        help="with a folder as INPUT: optimise its models in N processes at once "
                             "(default: the cores)")
    result.add_argument("--force", action="store_true",
                        help="write the output even if the check fails (the exit code is still 1); "
                             "it does not make any other refusal go away")
    result.add_argument("--replace-data", action="store_true",
                        help="replace OUTPUT.data even if it is not the existing OUTPUT's own data "
                             "file (by default that is refused: it may hold another model's weights)")
    verbosity = result.add_mutually_exclusive_group()
    verbosity.add_argument("-q", "--quiet", action="store_true", help="print only errors")
    verbosity.add_argument("-v", "--verbose", action="count", default=0,
                           help="every counter of every pass, this tool's log (a line or two per pass) "
                                "and tracebacks; -vv adds the lines per node (each rule that did not "
                                "apply) and other libraries' debug lines")
    result.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    return result


def static_shapes(args: argparse.Namespace) -> dict[str, Any]:
    """``input_shapes`` and ``fix_dims`` from parsed arguments (the pipeline validates them).

    Raises:
        InputError: the same input or dim given twice with different sizes.
    """
    found: dict[str, dict[str, Any]] = {"input_shapes": {}, "fix_dims": {}}
    for key, flag, pairs in (("input_shapes", "--input-shape", args.input_shape),
                             ("fix_dims", "--fix-dim", args.fix_dim)):  # fmt: skip
        for name, value in pairs:
            if found[key].setdefault(name, value) != value:
                raise InputError(f"{flag} {short(name)} given twice with different sizes")
    return found


def option_values(args: argparse.Namespace) -> dict[str, Any]:
    """The pass options' values from parsed arguments (the pipeline validates them)."""
    return {option.name: getattr(args, option.name) for option in pipeline.pass_options()}
