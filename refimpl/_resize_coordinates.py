"""Resize's coordinates: which input element each output position takes, twice over.

An :class:`Axis` is one axis of a Resize plan (its lengths, the exact scale and
onnxruntime's float32 one, the roi). For it, :func:`exact_indices` evaluates the
spec's coordinate formula in rational arithmetic (``x_original`` is affine in
``x_resized``, so the indices are integer divisions), and :func:`ort_indices`
runs onnxruntime's float32 formulas operation by operation (upsamplebase.h),
with its copy of an axis it does not resize. :mod:`refimpl.resize` plans the
axes, compares the two and declines where they pick different elements.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

__all__ = ["Axis", "exact_indices", "ort_indices"]

_F32 = np.float32
_HALF = _F32(0.5)
_ONE = _F32(1.0)
_INT64_SAFE = 1 << 60


class Axis:
    """One axis: lengths, the exact scale and onnxruntime's float32 one, the roi (if used)."""

    __slots__ = ("length_in", "length_out", "resized", "roi", "roi32", "scale", "scale32")

    def __init__(self, length_in: int) -> None:
        self.length_in = self.length_out = length_in
        self.scale, self.scale32 = Fraction(1), _ONE
        self.roi: tuple[Fraction, Fraction] = (Fraction(0), Fraction(1))
        self.roi32 = (_F32(0), _ONE)
        self.resized = False


def _affine(ctm: str, axis: Axis) -> tuple[Fraction, Fraction]:
    """``(A, B)`` with ``x_original = A * x_resized + B``, exactly as the spec's formula."""
    s, n_in, n_out = axis.scale, axis.length_in, axis.length_out
    if ctm == "asymmetric":
        return 1 / s, Fraction(0)
    if ctm == "half_pixel":
        return 1 / s, 1 / (2 * s) - Fraction(1, 2)
    if ctm == "pytorch_half_pixel":
        return (1 / s, 1 / (2 * s) - Fraction(1, 2)) if n_out > 1 else (Fraction(0), Fraction(0))
    if ctm == "tf_half_pixel_for_nn":
        return 1 / s, 1 / (2 * s)
    if ctm == "align_corners":
        return (Fraction(n_in - 1, n_out - 1), Fraction(0)) if n_out > 1 else (Fraction(0), Fraction(0))
    if ctm == "tf_crop_and_resize":
        start, end = axis.roi
        if n_out > 1:
            return (end - start) * (n_in - 1) / (n_out - 1), start * (n_in - 1)
        return Fraction(0), (start + end) * (n_in - 1) / 2
    assert ctm == "half_pixel_symmetric"
    adjustment = n_out / (s * n_in)
    offset = Fraction(n_in, 2) * (1 - adjustment)
    return 1 / s, offset + 1 / (2 * s) - Fraction(1, 2)


def exact_indices(ctm: str, rounding: str, axis: Axis) -> np.ndarray:
    """The spec's input index of each output position (-1: the extrapolation value)."""
    A, B = _affine(ctm, axis)
    c = A.denominator * B.denominator // math.gcd(A.denominator, B.denominator)
    a, b = int(A * c), int(B * c)
    n_out = axis.length_out
    bound = 4 * (abs(a) * n_out + abs(b) + c)
    x = np.arange(n_out, dtype=np.int64 if bound < _INT64_SAFE else object)
    if x.dtype == object:
        x = np.array([int(v) for v in x], dtype=object)
    num = a * x + b  # x_original = num / c
    if rounding == "floor":
        index = num // c
    elif rounding == "ceil":
        index = -((-num) // c)
    elif rounding == "round_prefer_floor":  # ceil(v - 1/2)
        index = -((c - 2 * num) // (2 * c))
    else:  # round_prefer_ceil: floor(v + 1/2)
        index = (2 * num + c) // (2 * c)
    index = np.clip(index, 0, axis.length_in - 1).astype(np.int64)
    if ctm == "tf_crop_and_resize":
        outside = (num < 0) | (num > (axis.length_in - 1) * c)
        index = np.where(outside.astype(bool), -1, index)
    return index


def _ort_coordinates(ctm: str, axis: Axis) -> np.ndarray:
    """onnxruntime's float32 ``x_original`` (upsamplebase.h), operation by operation."""
    x = np.arange(axis.length_out, dtype=_F32)
    s = axis.scale32
    n_out, n_in = _F32(axis.length_out), _F32(axis.length_in)
    with np.errstate(all="ignore"):
        if ctm == "asymmetric":
            return x / s
        if ctm == "half_pixel":
            return (x + _HALF) / s - _HALF
        if ctm == "pytorch_half_pixel":
            return (x + _HALF) / s - _HALF if n_out > 1 else np.zeros_like(x)
        if ctm == "tf_half_pixel_for_nn":
            return (x + _HALF) / s
        if ctm == "align_corners":
            return x * (n_in - _ONE) / (n_out - _ONE) if n_out != 1 else np.zeros_like(x)
        if ctm == "tf_crop_and_resize":
            start, end = axis.roi32
            if n_out > 1:
                return start * (n_in - _ONE) + (x * (end - start) * (n_in - _ONE)) / (n_out - _ONE)
            middle = 0.5 * np.float64(start + end) * np.float64(n_in - _ONE)  # in double
            return np.full_like(x, _F32(middle))
        assert ctm == "half_pixel_symmetric"
        output_width = s * n_in
        adjustment = n_out / output_width
        center = n_in / _F32(2)
        offset = center * (_ONE - adjustment)
        # (x_resized + 0.5) is a double there: the sum runs in double, then rounds to float.
        return (np.float64(offset) + (x.astype(np.float64) + 0.5) / np.float64(s) - 0.5).astype(_F32)


def ort_indices(ctm: str, rounding: str, axis: Axis, rank: int, copy: bool) -> np.ndarray | None:
    """onnxruntime's input index of each output position (-1: extrapolation); None if undefined.

    ``copy``: the output shape is the input's, which onnxruntime copies whatever the mode.
    """
    if copy or (rank > 1 and axis.scale32 == _ONE):  # onnxruntime: "no resizing" on this axis
        return np.arange(axis.length_out, dtype=np.int64)
    original = _ort_coordinates(ctm, axis)
    if original.size and not (np.all(np.isfinite(original)) and np.abs(original).max() < 2.0**62):
        return None  # the int64 conversion is undefined there
    if rounding == "simple":  # Resize-10: ceil when downsampling, truncation otherwise
        index = np.ceil(original) if axis.scale32 < _ONE else np.trunc(original)
    elif rounding == "floor":
        index = np.floor(original)
    elif rounding == "ceil":
        index = np.ceil(original)
    else:
        magnitude = np.abs(original)
        whole = np.floor(magnitude)
        # std::round: half away from zero (magnitude - whole is exact in float32).
        away = np.copysign(np.where(magnitude - whole >= _HALF, whole + _ONE, whole), original)
        index = away  # round_prefer_ceil (a negative tie goes down, then clamps to 0 anyway)
        if rounding == "round_prefer_floor":
            # original == (float)(int64_t)original + 0.5f takes floor: the positive ties.
            index = np.where(original == np.trunc(original) + _HALF, np.floor(original), away)
    index = np.clip(index.astype(np.int64), 0, axis.length_in - 1)
    if ctm == "tf_crop_and_resize":
        index = np.where((original < 0) | (original > _F32(axis.length_in - 1)), -1, index)
    return index
