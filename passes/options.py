"""Pass options, declared once by each pass.

A pass class lists its options in ``OPTIONS``; from that one declaration come
the ``optimize()`` / ``optimize_file()`` keywords, the CLI flags and their
``--help`` lines, and the values the pass is built with::

    class MyPass(Pass):
        NAME = "mine"
        DESCRIPTION = "what it does, in one line"
        OPTIONS = (Option("my_limit", 10, "largest thing to touch", parse=parse_int, argument="limit"),)

        def __init__(self, limit: int = 10) -> None: ...

A bool option whose default is True becomes ``--no-NAME`` on the command
line, one whose default is False ``--NAME``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

__all__ = ["Option", "parse_int", "parse_nonnegative_int", "parse_size", "parse_tolerance", "short"]

_SUFFIXES = {"": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
             "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30}  # fmt: skip
_ASCII_DIGITS = frozenset("0123456789")
_MAX_DIGITS = 30


def short(text: str, limit: int = 40) -> str:
    """``repr(text)`` for a message, cut to about ``limit`` characters (a value may be 5000 digits long)."""
    shown = repr(text)
    return shown if len(shown) <= limit else shown[: limit - 4] + "...'"


def parse_size(text: str) -> int:
    """``"1048576"``, ``"512K"``, ``"1M"``, ``"1.5g"`` -> bytes.

    Raises:
        ValueError: not such a size (only ASCII digits; at most 30 of them).
    """
    number = text.strip().lower()
    unit = number.lstrip("0123456789.")
    value = number[: len(number) - len(unit)]
    if not value or len(value) > _MAX_DIGITS or unit.strip() not in _SUFFIXES or value.count(".") > 1:
        raise ValueError(f"invalid size {short(text)} (e.g. 1048576, 512K, 1M)")
    return int(float(value) * _SUFFIXES[unit.strip()])


def parse_nonnegative_int(text: str) -> int:
    """A decimal integer >= 0 written with ASCII digits (``str.isdigit`` also takes ``²``).

    Raises:
        ValueError: anything else, or more than 30 digits.
    """
    digits = text.strip()
    if not digits or len(digits) > _MAX_DIGITS or not set(digits) <= _ASCII_DIGITS:
        raise ValueError(f"invalid number {short(text)} (expected a whole number >= 0)")
    return int(digits)


def parse_int(text: str) -> int:
    """A decimal integer, optionally signed, in ASCII digits: what ``int`` should take on a command line.

    ``int`` also takes ``'٤'`` (Arabic-Indic four), ``'1_8'`` and thousands of
    digits; the CLI uses this instead for an option declared with ``parse=int``.

    Raises:
        ValueError: anything else, or more than 30 digits.
    """
    digits = text.strip()
    body = digits[1:] if digits[:1] in ("+", "-") else digits
    if not body or len(body) > _MAX_DIGITS or not set(body) <= _ASCII_DIGITS:
        raise ValueError(f"invalid number {short(text)} (expected a whole number)")
    return int(digits)


def parse_tolerance(text: str) -> float:
    """A tolerance (``--rtol``, ``--atol``): a finite number >= 0.

    Raises:
        ValueError: anything else.
    """
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"invalid tolerance {short(text)} (expected a finite number >= 0)")
    return value


@dataclasses.dataclass(frozen=True)
class Option:
    """One option of a pass.

    Attributes:
        name: The keyword of ``optimize()``; the CLI flag is ``--`` + name with dashes.
        default: The value when not given; its type decides the kind of flag
            (a bool is a switch).
        help: One line for ``--help``.
        parse: Turns the CLI text into the value (raises ValueError with a message).
        check: Says why a value is not acceptable (None when it is), on every route.
        metavar: The placeholder shown in ``--help``.
        argument: The pass constructor's keyword, when it differs from ``name``.
    """

    name: str
    default: Any
    help: str
    parse: Callable[[str], Any] = str
    check: Callable[[Any], str | None] | None = None
    metavar: str = "VALUE"
    argument: str = ""

    @property
    def is_switch(self) -> bool:
        return isinstance(self.default, bool)

    @property
    def flag(self) -> str:
        dashed = self.name.replace("_", "-")
        return f"--no-{dashed}" if self.is_switch and self.default else f"--{dashed}"

    @property
    def keyword(self) -> str:
        return self.argument or self.name
