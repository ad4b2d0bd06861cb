"""What the check does when nothing is said: sizes, tries, limits and tolerances.

The size of a dynamic dimension nothing names (:data:`DEFAULT_DIM`), how many sets of generated
sizes are tried (:data:`MAX_TRIES`), how many bytes of inputs may be generated
(:data:`MAX_GENERATED_BYTES`), the time onnxruntime may take (:data:`DEFAULT_TIMEOUT`) and the
(rtol, atol) of each float type (:data:`TOLERANCES`, :func:`default_tolerance`): the check, the
planner of its inputs, the locator and the command's flags and hints read them here. Plain
constants, no import: the check's child and ``optimize --help`` import it at no cost.
"""

from __future__ import annotations

__all__ = [
    "DEFAULT_DIM",
    "DEFAULT_TIMEOUT",
    "MAX_GENERATED_BYTES",
    "MAX_TRIES",
    "PRECISION_ORDER",
    "TOLERANCES",
    "default_tolerance",
]

#: Size of a dynamic dimension when no hint applies and ``dims`` does not name it
#: (the first of the sizes tried for it; see ``passes.verify.plan``).
DEFAULT_DIM = 4

#: How many sets of generated sizes are tried before the check gives up on the original.
MAX_TRIES = 4

#: Generated inputs larger than this in total are not generated (the check does not run).
MAX_GENERATED_BYTES = 1 << 30

#: Seconds the onnxruntime part of the check may take (``--check-timeout``).
DEFAULT_TIMEOUT = 300.0

#: Default (rtol, atol) per float type: |optimised - original| <= atol + rtol * |original|.
#: The type is the lowest-precision float type the output depends on, not the output's own.
TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-10),
    "float32": (1e-4, 1e-5),
    "float16": (1e-2, 1e-3),
    "bfloat16": (2e-2, 1e-2),
    "float8e4m3fn": (1.25e-1, 1e-1),
    "float8e4m3fnuz": (1.25e-1, 1e-1),
    "float8e5m2": (2.5e-1, 1e-1),
    "float8e5m2fnuz": (2.5e-1, 1e-1),
}

#: Float types from the most precise to the least (the tolerance follows the last one present).
PRECISION_ORDER: tuple[str, ...] = tuple(TOLERANCES)


def default_tolerance(dtype: str, precision: str | None = None,
                      override: tuple[float, float | None] | None = None) -> tuple[float, float]:  # fmt: skip
    """The (rtol, atol) of a value whose lowest-precision float type is ``dtype``: :data:`TOLERANCES`,
    or ``override`` (``--precision-tolerance``: rtol, and atol or None for the type's) when ``dtype``
    is ``precision``, the half type the optimised model computes in."""
    rtol, atol = TOLERANCES[dtype]
    if override is not None and precision is not None and dtype == precision:
        return float(override[0]), atol if override[1] is None else float(override[1])
    return rtol, atol
