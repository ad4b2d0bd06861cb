"""The check's edge-value inputs: values of each input's type that seeded standard-normal inputs never reach.

Imported by the check's child process (numpy only; ml_dtypes' types arrive as
dtypes). Two sets are made from the inputs that ran the original (same names,
shapes and types), deterministically from the seed:

* ``edge``: finite values only: ±0, ±1, ±0.5, ±2, the thresholds ±100 and
  ±1000 and values just either side of 0.5, 1, 100 and 1000, the type's
  smallest and largest subnormals and smallest normal, and large magnitudes
  (±1e4, ±1e30, float16's ±6e4) where the type holds them; for integers 0, ±1,
  ±2, 100, 1000, 127/128/255/256, 2**24 + 1 (the first integer float32 rounds),
  and the type's extremes (min, min + 1, max - 1, max); strings the empty one,
  a blank, case and non-ASCII letters and number-like text.
* ``nonfinite``: the same mixed with NaN, +inf and -inf (floats only), so that
  the first set stays finite.

The values are interleaved by kind (floats: NaN, then +inf or -inf, in the second set, then
-0, large positive, +0, large negative, thresholds, units, subnormals;
integers: near the maximum, near the minimum, small, thresholds), so any seven
(nine) neighbouring elements hold one of each kind; each input starts at a
seeded row of the pool, so that even its first few elements hold the first
kinds. Inputs named in ``keep`` (indices, shapes,
sizes: see :mod:`passes.verify.plan`) and booleans keep the values that ran.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import numpy as np

__all__ = ["edge_array", "edge_feeds", "edge_pool"]

_STRINGS = ("", " ", "a", "A b", "0", "-1.5", "NaN", "\u00e9", "\u00df", "x" * 64)


def _interleave(groups: list[list[Any]]) -> list[Any]:
    """One of each group in turn (the shorter ones again from their start) until the longest is used:
    any ``len(groups)`` neighbours hold one value of each group."""
    rows = max((len(g) for g in groups), default=0)
    return [g[i % len(g)] for i in range(rows) for g in groups]


def _float_groups(dtype: np.dtype, nonfinite: bool) -> list[np.ndarray]:
    try:
        info = np.finfo(dtype)
    except (ValueError, TypeError):  # ml_dtypes' types: their own finfo
        import ml_dtypes

        info = ml_dtypes.finfo(dtype)
    largest, normal, subnormal = float(info.max), float(info.smallest_normal), float(info.smallest_subnormal)
    near = [t * f for t in (0.5, 1.0, 100.0, 1000.0) for f in (1 - 2**-6, 1 + 2**-6)]
    large = [m for m in (1e4, 6e4 if dtype == np.float16 else None, 1e30) if m is not None and m <= largest]
    groups = [
        [-0.0],
        list(large),
        [0.0],
        [-m for m in large],
        [s * t for t in (100.0, 1000.0, *near) for s in (1, -1)],
        [s * u for u in (1.0, 0.5, 2.0) for s in (1, -1)],
        [subnormal, -subnormal, normal - subnormal, -(normal - subnormal), normal, -normal] if subnormal < normal
        else [normal, -normal],
    ]
    if nonfinite:
        groups[:0] = [[np.nan], [np.inf, -np.inf]]
    result = []
    for group in groups:
        wide = np.array(group, np.float64)
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            cast = wide.astype(dtype)
        back = cast.astype(np.float64)
        fits = np.where(np.isfinite(wide), np.isfinite(back) & ((wide == 0) | (back != 0)), True)
        if fits.any():
            result.append(cast[fits])
    return result


def _int_groups(dtype: np.dtype) -> list[np.ndarray]:
    info = np.iinfo(dtype)
    values = [
        [info.max, info.max - 1],
        [info.min, info.min + 1],
        [0, 1, -1, 2, -2],
        [100, -100, 1000, -1000, 127, -128, 128, -129, 255, 256, 2**24 + 1, -(2**24 + 1)],
    ]
    return [np.array([v for v in group if info.min <= v <= info.max], dtype) for group in values]


def _groups(dtype: np.dtype, nonfinite: bool) -> list[np.ndarray] | None:
    if dtype.kind in "iu":
        return _int_groups(dtype)
    if dtype.kind in "OUS":
        return [np.array(_STRINGS, dtype=object)]
    if dtype.kind == "f" or dtype.name == "bfloat16" or dtype.name.startswith("float8"):
        return _float_groups(dtype, nonfinite)
    return None


def edge_pool(dtype: Any, *, nonfinite: bool = False) -> np.ndarray | None:
    """The edge values of a numpy dtype, in their interleaved order (None: bool or another type: none)."""
    groups = _groups(np.dtype(dtype), nonfinite)
    if groups is None:
        return None
    return np.array(_interleave([list(g) for g in groups]), dtype=groups[0].dtype)


def edge_array(like: np.ndarray, rng: np.random.Generator, *, nonfinite: bool = False) -> np.ndarray:
    """An array of ``like``'s shape and type filled with edge values from a seeded row of the pool
    (``like`` itself when its type has none): its first elements hold the first kinds."""
    groups = _groups(like.dtype, nonfinite)
    if groups is None or like.size == 0:
        return like
    pool = np.array(_interleave([list(g) for g in groups]), dtype=groups[0].dtype)
    start = len(groups) * int(rng.integers(0, pool.size // len(groups)))
    positions = (np.arange(like.size) + start) % pool.size
    values = pool[positions].reshape(like.shape)
    return values if pool.dtype == object else values.astype(like.dtype, copy=False)


def edge_feeds(
    feeds: Mapping[str, Any], keep: Collection[str], seed: int, *, nonfinite: bool = False
) -> dict[str, Any]:
    """``feeds`` with every input not in ``keep`` (and not a bool) replaced by edge values."""
    rng = np.random.default_rng([seed, 2 if nonfinite else 1])
    result = {}
    for name in sorted(feeds):
        value = feeds[name]
        if name in keep or not isinstance(value, np.ndarray) or value.dtype == np.bool_:
            result[name] = value
        else:
            result[name] = edge_array(value, rng, nonfinite=nonfinite)
    return {name: result[name] for name in feeds}
