"""The error taxonomy, the exit code each error maps to, and how an error reads in one line."""

from __future__ import annotations

from typing import Any

__all__ = [
    "EXIT_CHECK",
    "EXIT_ERROR",
    "EXIT_OK",
    "CheckFailedError",
    "InputError",
    "OptimizeError",
    "UpgradeError",
    "cut",
    "exit_code",
    "first_line",
    "interrupt_behind",
    "raise_interrupt_behind",
]

EXIT_OK, EXIT_CHECK, EXIT_ERROR = 0, 1, 2


class OptimizeError(Exception):
    """Base class of the errors this tool reports to users as one line."""


class InputError(OptimizeError):
    """The input (file, model, option) is unusable: not ONNX, truncated, refused opset..."""


def __getattr__(name: str) -> Any:
    # UpgradeError is an onnx_ir PassError: defined on first use, so that this module (which
    # the command needs before anything else) does not import onnx_ir.
    if name == "UpgradeError":
        import onnx_ir as ir

        class UpgradeError(ir.passes.PassError, OptimizeError):
            """The opset upgrade cannot convert a node without changing what it computes."""

        UpgradeError.__module__, UpgradeError.__qualname__ = __name__, name
        globals()[name] = UpgradeError
        return UpgradeError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class CheckFailedError(OptimizeError):
    """The optimised model computes something else than the original (or fails to run)."""


def exit_code(error: OptimizeError) -> int:
    """The command's exit code for ``error``: 1 for a failed check, 2 for everything else."""
    return EXIT_CHECK if isinstance(error, CheckFailedError) else EXIT_ERROR


def cut(text: str, limit: int = 200) -> str:
    """``text`` for a message, at most ``limit`` characters (the end given as "...")."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def first_line(error: BaseException | str, limit: int = 500) -> str:
    """The first non-empty line of an error's message (its type name if it has none)."""
    text = str(error).strip()
    if not text:
        return type(error).__name__ if isinstance(error, BaseException) else ""
    return text.splitlines()[0][:limit]


def interrupt_behind(error: BaseException) -> KeyboardInterrupt | None:
    """The interrupt (SIGINT/SIGTERM as ``KeyboardInterrupt``) that ``error`` wraps, if any.

    Python turns an exception raised while a class is created (a dataclass field's
    ``__set_name__`` during an import) into ``RuntimeError("Error calling __set_name__ ...")``
    with the original as its cause; a signal landing there reached the load's handler as an
    unreadable model (exit 2, "not a valid ONNX model"). The causes and contexts are followed.
    """
    seen: set[int] = set()
    pending: list[BaseException | None] = [error]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, KeyboardInterrupt):
            return current
        pending.extend((current.__cause__, current.__context__))
    return None


def raise_interrupt_behind(error: BaseException) -> None:
    """Raises the interrupt ``error`` wraps (see :func:`interrupt_behind`); returns if there is none."""
    interrupt = interrupt_behind(error)
    if interrupt is not None:
        raise interrupt from None
