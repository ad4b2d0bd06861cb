"""What the check found, and its defaults: plain data, no onnxruntime import."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

__all__ = ["DEFAULT_DIM", "MAX_GENERATED_BYTES", "TOLERANCES", "CheckResult", "OutputComparison", "json_safe"]

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


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float as a string (``"inf"``, ``"-inf"``, ``"nan"``): strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


@dataclasses.dataclass
class OutputComparison:
    """How one output of the optimised model compares with the original's.

    ``rtol`` and ``atol`` are the tolerance applied (None: compared exactly).
    """

    name: str
    ok: bool
    dtype: str = ""
    shape: tuple[int, ...] | None = None
    max_abs_error: float = 0.0
    max_rel_error: float = 0.0
    mismatches: int = 0
    message: str = ""
    rtol: float | None = None
    atol: float | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> OutputComparison:
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in fields}
        if values.get("shape") is not None:
            values["shape"] = tuple(values["shape"])
        return cls(**values)


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
        return json_safe({
            "ok": self.ok,
            "skipped": self.skipped,
            "error": self.error,
            "outputs": [o.to_json() for o in self.outputs],
        })
