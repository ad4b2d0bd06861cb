"""Expected conformance failures of the reduction and elementwise kernels (case name -> reason).

Cast from a float to a fixed-point type is undefined for out-of-range values (Cast spec:
"Casting from floating point to fixed point: undefined if OOR"). These cases feed -9..15
(4-bit) or -3..3 (2-bit) and expect ml_dtypes' wraparound; refimpl raises UndefinedResultError
for undefined conversions so that constant folding never bakes in a value the runtime may not
produce (onnxruntime, for instance, saturates float -> int32 to INT_MIN).
"""

from __future__ import annotations

_UNDEFINED_CAST = (
    "undefined by the spec: float -> {to} of out-of-range values (the case expects "
    "wraparound); refimpl raises UndefinedResultError instead of guessing"
)

EXPECTED_FAILURES: dict[str, str] = {
    f"test_{op}_{src}_to_{to}": _UNDEFINED_CAST.format(to=to)
    for op in ("cast", "castlike")
    for src in ("FLOAT", "FLOAT16")
    for to in ("UINT4", "INT4", "UINT2", "INT2")
}
