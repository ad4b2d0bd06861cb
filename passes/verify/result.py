"""What the check found, and its defaults: plain data, no onnxruntime import."""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["DEFAULT_DIM", "MAX_GENERATED_BYTES", "TOLERANCES", "CheckResult", "OutputComparison"]

#: Size given to a dynamic dimension that ``dims`` does not name.
DEFAULT_DIM = 2

#: Generated inputs larger than this in total are not generated (the check is skipped).
MAX_GENERATED_BYTES = 1 << 30

#: Default (rtol, atol) per float type: |optimised - original| <= atol + rtol * |original|.
TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-10),
    "float32": (1e-4, 1e-5),
    "float16": (1e-2, 1e-3),
    "bfloat16": (2e-2, 1e-2),
}


@dataclasses.dataclass
class OutputComparison:
    """How one output of the optimised model compares with the original's."""

    name: str
    ok: bool
    dtype: str = ""
    shape: tuple[int, ...] | None = None
    max_abs_error: float = 0.0
    max_rel_error: float = 0.0
    mismatches: int = 0
    message: str = ""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class CheckResult:
    """The outcome of :func:`check`.

    Attributes:
        ok: True when every output matched (or the check was skipped).
        skipped: Why the check could not run (the original model does not run in
            onnxruntime, or inputs cannot be generated); None when it ran.
        inputs_rejected: The check was skipped because the original model does not
            run on the inputs the caller gave (wrong names, dtypes or shapes).
        error: Why the optimised model failed to run where the original ran.
        outputs: One comparison per output of the original model.
    """

    ok: bool
    skipped: str | None = None
    error: str | None = None
    inputs_rejected: bool = False
    outputs: list[OutputComparison] = dataclasses.field(default_factory=list)

    @property
    def failures(self) -> list[OutputComparison]:
        return [o for o in self.outputs if not o.ok]

    def summary(self) -> str:
        if self.skipped:
            return f"check skipped: {self.skipped}"
        if self.error:
            return f"check failed: the optimised model does not run: {self.error}"
        if self.ok:
            return f"check passed: {len(self.outputs)} output(s) match"
        bad = self.failures
        return "check failed: " + "; ".join(f"output {o.name!r}: {o.message}" for o in bad)

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "skipped": self.skipped,
            "error": self.error,
            "outputs": [o.to_json() for o in self.outputs],
        }
