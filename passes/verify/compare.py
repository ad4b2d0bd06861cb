"""Comparing one output of the two models, in bounded memory (numpy only: the check's child imports it).

Exact types (integers, booleans, strings) are compared in their own dtype, bit
for bit. Floats must have NaN in the same places, the same infinities (with
their sign) and, where both values are zero, the same sign of zero (behind a
Reciprocal, -0 and +0 are -inf and +inf); the other values must be within the
tolerance. They are compared chunk by chunk: a chunk that is equal in the
output's own dtype (NaN in the same places, zeros of the same sign) is skipped,
and only the other chunks are widened to float64 for the tolerance test, so the
extra memory is a few chunks, not several float64 copies of the whole output.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from passes.verify.result import OutputComparison

__all__ = ["CHUNK", "compare"]

#: Elements compared at a time.
CHUNK = 1 << 20


def _is_float(dtype: np.dtype) -> bool:
    return dtype.kind == "f" or dtype.name in ("bfloat16",) or dtype.name.startswith("float8")


def compare(
    name: str,
    expected: Any,
    actual: Any,
    rtol: float | None,
    atol: float | None,
    *,
    normwise: bool = False,
    widen: bool = False,
) -> OutputComparison:
    """Compares ``actual`` (optimised) with ``expected`` (original).

    Args:
        name: The output's name, for the result.
        expected: The original's value: an array, or a sequence/map of them.
        actual: The optimised model's value.
        rtol: Relative tolerance for floats (None: compare exactly).
        atol: Absolute tolerance for floats (None: compare exactly).
        normwise: A finite value may also be within ``rtol`` of the output's largest finite
            magnitude (the edge-value sets: a sum of terms of 1e30 rounds by as much wherever
            it cancels); NaN, infinities and the sign of zero stay exact.
        widen: A float16 or bfloat16 ``actual`` where ``expected`` is float32 (``--precision-io``:
            the converted model's outputs are of the half type) is widened to float32 (exactly)
            and compared as float32; without it, a dtype that differs is a difference.
    """
    if not isinstance(expected, np.ndarray) or not isinstance(actual, np.ndarray):
        # Sequences and maps (e.g. ZipMap's list of dicts): same structure, then the
        # leaves compared as one array (Python floats come from float32 tensors).
        e_leaves, e_shape = _flatten(expected)
        a_leaves, a_shape = _flatten(actual)
        if e_shape != a_shape:
            return OutputComparison(name, False, message="sequence/map structure differs")
        e_arr, a_arr = np.asarray(e_leaves), np.asarray(a_leaves)
        if e_arr.dtype == np.float64 and all(isinstance(v, float) for v in e_leaves):
            e_arr, a_arr = e_arr.astype(np.float32), a_arr.astype(np.float32)
        result = compare(name, e_arr, a_arr, rtol, atol, normwise=normwise, widen=widen)
        result.shape = None
        return result
    result = OutputComparison(name, True, str(expected.dtype), tuple(expected.shape), rtol=rtol, atol=atol)
    if widen and expected.dtype == np.float32 and actual.dtype.name in ("float16", "bfloat16"):
        actual = actual.astype(np.float32)
    if expected.dtype != actual.dtype:
        result.ok = False
        result.message = f"dtype {actual.dtype} instead of {expected.dtype}"
        return result
    if expected.shape != actual.shape:
        result.ok = False
        result.message = f"shape {actual.shape} instead of {expected.shape}"
        return result
    e_flat, a_flat = expected.reshape(-1), actual.reshape(-1)
    if not _is_float(expected.dtype) or rtol is None or atol is None:
        result.rtol = result.atol = None
        _compare_exact(result, e_flat, a_flat)
    else:
        _compare_close(result, e_flat, a_flat, rtol, atol, _largest(e_flat) if normwise else 0.0)
    return result


def _largest(flat: np.ndarray) -> float:
    """The largest finite magnitude of ``flat`` (0.0 if none), chunk by chunk."""
    largest = 0.0
    for start in range(0, flat.size, CHUNK):
        chunk = np.abs(flat[start : start + CHUNK].astype(np.float64))
        chunk = chunk[np.isfinite(chunk)]
        if chunk.size:
            largest = max(largest, float(chunk.max()))
    return largest


def _zero_sign_differs(e: np.ndarray, a: np.ndarray) -> np.ndarray:
    """Where both values are zero but of different signs (-0 against +0)."""
    both = (e == 0) & (a == 0)
    if not both.any():
        return both
    both[both] = np.signbit(e[both]) != np.signbit(a[both])
    return both


def _compare_exact(result: OutputComparison, e_flat: np.ndarray, a_flat: np.ndarray) -> None:
    numeric = e_flat.dtype.kind in "iub"
    floats = _is_float(e_flat.dtype)
    signs = 0
    for start in range(0, e_flat.size, CHUNK):
        e, a = e_flat[start : start + CHUNK], a_flat[start : start + CHUNK]
        if e.dtype == object or e.dtype.kind in "USO":
            diff = np.asarray(e != a, dtype=bool)
        elif floats:
            zeros = _zero_sign_differs(e, a)
            signs += int(np.count_nonzero(zeros))
            diff = ~((e == a) | (np.isnan(e) & np.isnan(a))) | zeros
        else:
            diff = e != a
        count = int(np.count_nonzero(diff))
        if not count:
            continue
        result.mismatches += count
        if numeric:
            delta = np.abs(e[diff].astype(np.float64) - a[diff].astype(np.float64))
            result.max_abs_error = max(result.max_abs_error, float(delta.max()))
    if result.mismatches:
        result.ok = False
        result.message = f"{result.mismatches} element(s) differ (exact comparison{_signs_text(signs)})"


def _signs_text(signs: int) -> str:
    return f"; {signs} only in the sign of zero" if signs else ""


def _compare_close(result: OutputComparison, e_flat: np.ndarray, a_flat: np.ndarray, rtol: float,
                   atol: float, scale: float = 0.0) -> None:  # fmt: skip
    tiny = np.finfo(np.float64).tiny
    signs = placement = 0
    for start in range(0, e_flat.size, CHUNK):
        e_own, a_own = e_flat[start : start + CHUNK], a_flat[start : start + CHUNK]
        zeros = _zero_sign_differs(e_own, a_own)
        if np.array_equal(e_own, a_own, equal_nan=True) and not zeros.any():
            continue  # exact in the output's own dtype: nothing to widen
        signs += int(np.count_nonzero(zeros))
        e, a = e_own.astype(np.float64), a_own.astype(np.float64)
        e_nan, a_nan = np.isnan(e), np.isnan(a)
        finite = np.isfinite(e) & np.isfinite(a)
        placed = (e_nan != a_nan) | (~finite & ~e_nan & ~a_nan & (e != a))
        placement += int(np.count_nonzero(placed))
        bad = placed | zeros
        with np.errstate(invalid="ignore", over="ignore"):  # inf - inf, x / tiny: masked or meant
            delta = np.where(finite, np.abs(e - a), 0.0)
            rel = np.where(finite, delta / np.maximum(np.abs(e), tiny), 0.0)
        beyond = finite & (delta > atol + rtol * np.abs(e))
        if scale:
            within_scale = beyond & (delta <= atol + rtol * scale)
            result.within_scale += int(np.count_nonzero(within_scale))
            beyond &= ~within_scale
        bad |= beyond
        if delta.size:
            result.max_abs_error = max(result.max_abs_error, float(delta.max()))
            result.max_rel_error = max(result.max_rel_error, float(rel.max()))
        result.mismatches += int(np.count_nonzero(bad))
    if result.mismatches:
        result.ok = False
        result.message = (
            f"{result.mismatches} of {e_flat.size} element(s) differ beyond rtol={rtol:g}, atol={atol:g} "
            f"(max abs error {result.max_abs_error:.3g}, max rel error {result.max_rel_error:.3g}; "
            f"NaN/inf placement and the sign of zero must match{_placement_text(placement)}{_signs_text(signs)})"
        )


def _placement_text(placement: int) -> str:
    return f"; {placement} in NaN/inf placement" if placement else ""


def _flatten(value: Any) -> tuple[list[Any], Any]:
    """The leaves of a nested sequence/map output and a hashable description of its structure."""
    if isinstance(value, np.ndarray):
        return list(value.reshape(-1)), ("tensor", str(value.dtype), value.shape)
    if isinstance(value, (list, tuple)):
        leaves, shapes = [], []
        for item in value:
            item_leaves, item_shape = _flatten(item)
            leaves.extend(item_leaves)
            shapes.append(item_shape)
        return leaves, ("seq", tuple(shapes))
    if isinstance(value, dict):
        keys = sorted(value, key=repr)
        leaves, shapes = [], []
        for key in keys:
            item_leaves, item_shape = _flatten(value[key])
            leaves.extend(item_leaves)
            shapes.append((repr(key), item_shape))
        return leaves, ("map", tuple(shapes))
    return [value], ("scalar", type(value).__name__)
