"""When folding a per-channel scale or shift into weights keeps NaN, infinities and the sign of zero.

A fusion may change rounding, never where NaN or infinities appear nor the sign
of a zero. Folding ``y * s`` into the weights of the op producing ``y`` does
that only when, per channel:

* ``s`` is finite, not zero and not subnormal in the weights' type: ``y * 0``
  is NaN where ``y`` is infinite and keeps the sign of ``y``, which weights
  multiplied by 0 cannot; ``y * inf`` (a scale that overflows, e.g. a
  BatchNormalization with gamma 3e38 and var + epsilon 1e-45) is NaN where
  ``y`` is 0, where weights multiplied by inf give ±inf;
* ``s`` is positive, or a nonzero shift follows it: a sum of products is +0
  when it cancels (round to nearest), so ``y * s`` with ``s < 0`` is -0 where
  the op's output is +0, which the op with negated weights cannot give, unless
  a nonzero shift is added after (then both results are +0 by cancellation);
* every new weight and bias (and every intermediate the original computes:
  ``1 / sqrt(var + epsilon)``, ``mean * s``, ``B - mean * s``) is finite in the
  weights' type, and no nonzero weight becomes 0 (it would drop ``inf * w``).

Each check returns why it refuses (shown at ``-v``, counted in the report), or None.

What stays, by design: the fused op overflows at inputs a factor ``s`` from
where the original does (an input within ``|s|`` of the type's largest value);
that is rounding at the edge of the range, not a rule that can be checked on
the weights.
"""

from __future__ import annotations

import numpy as np

__all__ = ["bias_refusal", "scale_refusal", "shift_refusal", "weight_refusal"]


def _rounded(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.asarray(array, dtype=np.float64).astype(dtype)


def _finite(array: np.ndarray, dtype: np.dtype) -> bool:
    return bool(np.all(np.isfinite(array)) and np.all(np.isfinite(_rounded(array, dtype))))


def scale_refusal(s: np.ndarray, dtype: np.dtype, *, shifted: np.ndarray | None = None) -> str | None:
    """Why the per-channel scale ``s`` (float64) may not be folded into weights of ``dtype``.

    ``shifted`` is, per channel, whether a nonzero shift is added after the scale
    (BatchNormalization's ``B - mean * s``); None when nothing is added (Mul).
    """
    rounded = _rounded(s, dtype)
    if not _finite(s, dtype):
        return f"the scale is not finite in {dtype} (NaN where the original is 0, or the reverse)"
    if np.any(s == 0) or np.any(rounded == 0):
        return "a zero scale (x * 0 keeps the sign of x, and is NaN where x is infinite)"
    if np.any(np.abs(rounded) < np.finfo(dtype).tiny):
        return f"a subnormal scale in {dtype}"
    negative = s < 0
    if shifted is not None:
        negative &= ~shifted
    if np.any(negative):
        return "a negative scale with no nonzero shift after it (it turns +0 into -0, the fused op does not)"
    return None


def weight_refusal(w: np.ndarray, fused: np.ndarray, dtype: np.dtype) -> str | None:
    """Why the fused weights ``fused`` (float64) of the weights ``w`` may not be written in ``dtype``."""
    if not _finite(fused, dtype):
        return f"a fused weight overflows {dtype}"
    if np.any((_rounded(fused, dtype) == 0) & (w != 0)):
        return f"a fused weight underflows to 0 in {dtype}"
    return None


def bias_refusal(values: dict[str, np.ndarray], dtype: np.dtype) -> str | None:
    """Why the bias arithmetic (each named array, float64) is not exact enough to fold in ``dtype``."""
    for label, array in values.items():
        if not _finite(array, dtype):
            return f"{label} is not finite in {dtype}"
    return None


def shift_refusal(s: np.ndarray, mean: np.ndarray, shift: np.ndarray, dtype: np.dtype) -> tuple[np.ndarray, str | None]:
    """Per channel, whether BatchNormalization's ``B - mean * s`` is nonzero, and why it cannot be folded.

    The shift is computed in float64 and in ``dtype`` (as onnxruntime does); a
    channel counts as shifted only where both are nonzero.
    """
    with np.errstate(all="ignore"):
        product = mean * s
        bias = shift - product
        in_type = _rounded(shift, dtype) - _rounded(s, dtype) * _rounded(mean, dtype)
    why = bias_refusal({"mean * scale": product, "B - mean * scale": bias}, dtype)
    return (bias != 0) & (in_type != 0), why
