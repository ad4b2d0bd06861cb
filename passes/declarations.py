"""What each pass is, declared once, readable without importing it.

A :class:`PassSpec` says what the pipeline, the CLI, ``--help`` and the
report need of a pass: its name, one line of description, its options
(:class:`~passes.options.Option`), whether it repeats with its neighbours
(the fold ⇄ simplify ⇄ decompose loop), and how to build it. This module
imports neither onnx, onnx_ir nor numpy, so ``optimize --help`` and an early
error (a missing file, a bad flag) cost no more than Python's start-up; a
pass's module is imported only when a run builds it.

Adding a pass is its module (a :class:`passes.base.Pass` whose class names
its spec) and one line in :data:`PASSES`. A pass declared on its own class
(a test's toy pass, a user's) is registered with ``PASSES[name] = PassSpec.of(Class)``.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from passes.options import Option, parse_int, parse_size

if TYPE_CHECKING:
    import onnx_ir as ir

__all__ = [
    "DEFAULT_FOLD_SIZE_LIMIT",
    "DEFAULT_TARGET_OPSET",
    "PASSES",
    "DeclaredPass",
    "PassSpec",
    "implementation",
]

#: The opset the upgrade converts to by default: the first with Reduce ``axes`` as an input for every Reduce op.
DEFAULT_TARGET_OPSET = 18
#: The largest constant folding adds by default (bytes).
DEFAULT_FOLD_SIZE_LIMIT = 1 << 20


class DeclaredPass(Protocol):
    """A pass class that declares itself: what :meth:`PassSpec.of` and :func:`implementation` read of
    it. :class:`passes.base.Pass` is one (the module below it names it here, never imports it)."""

    NAME: ClassVar[str]
    DESCRIPTION: ClassVar[str]
    OPTIONS: ClassVar[tuple[Option, ...]]
    REPEATS: ClassVar[bool]
    EXACT: ClassVar[bool]

    @classmethod
    def from_options(cls, values: Mapping[str, Any]) -> ir.passes.PassBase:
        """The pass built with the values of its declared options (defaults where absent)."""
        ...


@dataclasses.dataclass(frozen=True)
class PassSpec:
    """A pass the pipeline can run.

    Attributes:
        name: Its name in ``--passes``/``--skip`` and in the report.
        description: One line for ``--help``.
        build: Makes the pass from the values of the declared options (every one present).
        options: Its options; their names are the API keywords and, dashed, the CLI flags.
        repeats: Whether it is repeated with the consecutive passes that also repeat until none
            of them changes the model (a pass that makes work for another, or finds work after it).
        exact: Whether what it does keeps every result bit for bit. A pass that is exact but for
            some named rewrites (simplify's fusions) counts those in its stats as ``fused``.
        opt_in: Whether the default run (no pass list given) includes it only when one of its
            options is set (``--precision``): otherwise it would be a no-op line in every report.
        refuse: Says why the values of its options make no sense together (None when they do):
            ``--precision-io`` without ``--precision``. Asked when the pass runs, on every route.
    """

    name: str
    description: str
    build: Callable[[Mapping[str, Any]], ir.passes.PassBase]
    options: tuple[Option, ...] = ()
    repeats: bool = False
    exact: bool = True
    opt_in: bool = False
    refuse: Callable[[Mapping[str, Any]], str | None] | None = None

    @classmethod
    def of(cls, pass_class: type[DeclaredPass]) -> PassSpec:
        """The spec a pass class (a :class:`passes.base.Pass` subclass) declares on itself."""
        return cls(pass_class.NAME, pass_class.DESCRIPTION, pass_class.from_options, pass_class.OPTIONS,
                   pass_class.REPEATS, pass_class.EXACT)  # fmt: skip


def implementation(locator: str) -> Callable[[Mapping[str, Any]], ir.passes.PassBase]:
    """``build`` for the pass class at ``"module:Class"``, imported when a run first builds it."""
    module, _, name = locator.partition(":")

    def build(values: Mapping[str, Any]) -> ir.passes.PassBase:
        pass_class: type[DeclaredPass] = getattr(importlib.import_module(module), name)
        return pass_class.from_options(values)

    build.__qualname__ = f"implementation({locator!r})"
    return build


def _positive_opset(version: int) -> str | None:
    return None if version >= 1 else "must be a positive opset version"


UPGRADE = PassSpec(
    "upgrade",
    "convert the default-domain opset to --target-opset (Reduce axes become inputs)",
    implementation("passes.upgrade:UpgradeOpsetPass"),
    (
        Option("target_opset", None,
               f"opset the upgrade converts to, from 7 up to the newest onnxruntime runs (default: "
               f"{DEFAULT_TARGET_OPSET}; a model already at or above it is left at its opset; asking for a "
               "lower opset than the model's is an error)",
               parse=parse_int, check=_positive_opset, metavar="N"),
    ),  # fmt: skip
)

FOLD = PassSpec(
    "fold",
    "constant folding: evaluate nodes with constant inputs with refimpl",
    implementation("passes.fold:ConstantFoldingPass"),
    (
        Option("fold_size_limit", DEFAULT_FOLD_SIZE_LIMIT, "largest constant folding may add (default: 1M)",
               parse=parse_size, metavar="BYTES", argument="size_limit"),
        Option("fold_confirm", True, "write folded values without confirming them in onnxruntime "
               "(faster; a value onnxruntime computes differently may then be written)", argument="confirm"),
    ),  # fmt: skip
    repeats=True,
)

SIMPLIFY = PassSpec(
    "simplify",
    "constants as initializers, common subexpressions, no-ops, chains, partial shapes, fusions",
    implementation("passes.simplify:SimplifyPass"),
    (
        Option("fuse", True, "do not fuse: BatchNormalization or per-channel Mul/Add into Conv/Gemm, "
               "MatMul+Add into Gemm, LayerNorm/Gelu/RMSNorm patterns into the standard ops (the only "
               "simplifications that change float results, by rounding)"),
        Option("freeze_initializer_inputs", False, "treat initializers that are also graph inputs "
               "as constants that fold and fuse, and remove them from the inputs: callers can no longer "
               "override them (below IR 4 the load already does, as onnxruntime runs them)"),
    ),  # fmt: skip
    repeats=True,
)

DECOMPOSE = PassSpec(
    "decompose",
    "rewrite ReduceLogSumExp into max-shifted primitive ops (no float64)",
    implementation("passes.decompose:DecomposeLogSumExpPass"),
    repeats=True,
    exact=False,
)


def _parse_precision(text: str) -> str:
    value = text.strip().lower()
    if value not in ("fp16", "bf16"):
        raise ValueError(f"{text!r}: fp16 or bf16")
    return value


def _known_precision(value: str) -> str | None:
    return None if value in ("fp16", "bf16") else "must be fp16 or bf16"


def precision_tolerance(value: Any) -> tuple[float, float | None]:
    """``--precision-tolerance``'s value as (rtol, atol or None: the half type's): from ``"RTOL"``,
    ``"RTOL,ATOL"``, a number or a pair of numbers (the API's forms; ``(rtol, None)`` too).

    Raises:
        ValueError: not such a value, RTOL not a finite number > 0, or ATOL not a finite number >= 0.
    """
    if isinstance(value, str):
        parts: list[Any] = value.split(",")
    elif isinstance(value, (list, tuple)):
        parts = list(value[:1]) if len(value) == 2 and value[1] is None else list(value)
    else:
        parts = [value]
    expected = "expected RTOL or RTOL,ATOL: a finite rtol > 0 and a finite atol >= 0"
    if not 1 <= len(parts) <= 2 or any(isinstance(p, bool) for p in parts):
        raise ValueError(expected)
    try:
        numbers = [float(p.strip()) if isinstance(p, str) else float(p) for p in parts]
    except (TypeError, ValueError):
        raise ValueError(expected) from None
    if not (math.isfinite(numbers[0]) and numbers[0] > 0) or (
            len(numbers) == 2 and not (math.isfinite(numbers[1]) and numbers[1] >= 0)):  # fmt: skip
        raise ValueError(expected)
    return numbers[0], numbers[1] if len(numbers) == 2 else None


def _parse_tolerance(text: str) -> tuple[float, float | None]:
    try:
        return precision_tolerance(text)
    except ValueError as e:
        raise ValueError(f"{text!r} ({e})") from None


def _tolerance_problem(value: Any) -> str | None:
    try:
        precision_tolerance(value)
    except ValueError as e:
        return str(e)
    return None


def _precision_refusal(values: Mapping[str, Any]) -> str | None:
    if values.get("precision") is None:
        for name, flag in (("precision_io", "--precision-io"), ("precision_tolerance", "--precision-tolerance")):
            if values.get(name) not in (None, False):
                return f"{flag} needs --precision fp16|bf16"
    return None


PRECISION = PassSpec(
    "precision",
    "with --precision fp16|bf16: float32 weights and compute in the half type, float32 islands found by "
    "onnxruntime's kernels, the check's value ranges and the check itself (off unless asked)",
    implementation("passes.precision:PrecisionPass"),
    (
        Option("precision", None, "convert float32 weights and computation to float16 (fp16) or bfloat16 "
               "(bf16), graph inputs and outputs kept float32 (but with --precision-io); nodes that need float32 stay "
               "float32 and the check compares with the float32 model at the half type's tolerance (default: off)",
               parse=_parse_precision, check=_known_precision, metavar="fp16|bf16"),
        Option("precision_io", False, "with --precision: the graph's float32 inputs and outputs become the "
               "half type too (no Casts at the boundary); the check feeds the converted model the original's "
               "inputs rounded to it and widens its outputs to float32 to compare them", argument="io"),
        Option("precision_tolerance", None, "with --precision: the tolerance of the half type, for the search "
               "for float32 islands and the check (default: float16 1e-2,1e-3; bfloat16 2e-2,1e-2; ATOL "
               "left out: the type's)",
               parse=_parse_tolerance, check=_tolerance_problem, metavar="RTOL[,ATOL]", argument="tolerance"),
    ),  # fmt: skip
    exact=False,
    opt_in=True,
    refuse=_precision_refusal,
)

#: The passes by name, in their default order. One line per pass.
PASSES: dict[str, PassSpec] = {spec.name: spec for spec in (UPGRADE, FOLD, SIMPLIFY, DECOMPOSE, PRECISION)}
