"""Resize with ``mode="nearest"``: every output element is one input element (or the
extrapolation value), so the result is pure indexing and bit-identical to the runtimes'.

Schema versions, each registered alone so that no version's semantics leak into another's:

  * 10: inputs ``(X, scales)``, attribute ``mode`` only. The coordinates are asymmetric
    (``x / scale``); the spec names no rounding, onnxruntime and the opset-10 conformance cases
    take floor when an axis is upsampled (``scale >= 1``) and ceil when it is downsampled
    (``passes.upgrade`` pins the same rule when it rewrites Resize-10 as Resize-11).
  * 11: ``(X, roi, scales, sizes)``; ``scales`` is required but may be empty when ``sizes``
    is given; coordinate_transformation_mode, nearest_mode, extrapolation_value (and
    cubic_coeff_a and exclude_outside, which nearest does not use) appear;
    ``tf_half_pixel_for_nn`` (``x_original = (x_resized + 0.5) / scale``) exists only here.
  * 13: roi and scales become optional; ``tf_half_pixel_for_nn`` is gone.
  * 18: ``axes`` (the subset of axes that roi, scales and sizes refer to; the others keep their
    size and index), ``keep_aspect_ratio_policy`` for ``sizes`` and ``antialias``.
  * 19: coordinate_transformation_mode ``half_pixel_symmetric``.

``mode="linear"`` and ``"cubic"`` are not implemented: they raise UnsupportedOpError, as an op
without a kernel does, so the node is left in place quietly (not a warning, not a kernel bug).

Output size: with ``scales``, ``floor(in * scale)``; with ``sizes``, the sizes, or under
``not_larger``/``not_smaller`` ``round_half_up(s * in)`` with ``s`` the smallest/largest of
``sizes[i] / in[d]``. The scale in the coordinate formulas is the ``scales`` value when scales
are given and ``out / in`` (or the policy's ``s``) with sizes. (The spec's text defines
``scale = length_resized / length_original``; its conformance cases, the onnx reference and
onnxruntime all use the given scale factor, and half_pixel_symmetric, whose purpose is the
difference between the two, only makes sense with it.)

Numerics: the spec's formulas are evaluated exactly, in rational arithmetic (a float32 scale is
a dyadic rational): ``x_original`` is affine in ``x_resized``, so each axis's indices are
integer divisions. onnxruntime evaluates them in float32 (and the onnx reference in float64),
which moves a coordinate that lies on or next to a rounding boundary (an integer for
floor/ceil, a half-integer for the round modes) to the other side now and then. The kernel
therefore also runs onnxruntime's float32 formulas, and where the two pick a different input
element (or output size) it raises RefImplError instead of choosing: a folded constant then
always equals what onnxruntime computes, and what the spec says.

Where the runtimes disagree with each other, the spec decides:

  * pytorch_half_pixel with one output element: the spec and onnxruntime take
    ``x_original = 0``; the onnx reference takes -0.5 only when ``scale * in`` is exactly 1
    and the general formula otherwise (in=3, scale=0.5, nearest_mode=ceil: index 1, not 0).
  * tf_crop_and_resize and align_corners with one output element likewise: the spec (and
    onnxruntime) test ``length_resized > 1``; the onnx reference tests ``scale * in == 1``.
  * keep_aspect_ratio_policy rounds half up (``round_int``); onnxruntime's std::round of a
    positive value agrees.

Where the runtimes agree with each other and not with the spec, the kernel declines:

  * tf_crop_and_resize with ``scales``: the spec sizes the output as
    ``floor(in * (roi_end - roi_start) * scale)``; onnxruntime and the onnx reference ignore
    the roi there. An roi of extent 1 on every resized axis is the only case they agree on.
  * onnxruntime copies the input when the output shape equals it, and maps an axis whose
    float32 scale is exactly 1 to itself (rank >= 2), whatever the coordinate mode:
    tf_crop_and_resize with a non-trivial roi, or tf_half_pixel_for_nn with ceil rounding, then
    differ from the spec (the comparison above catches it, and the kernel declines).
  * antialias=1 and exclude_outside=1 do not change nearest by the spec; onnxruntime rejects
    both with nearest, so no folded value could be checked against it.

Any dtype the schema allows is indexed as is (strings and complex too). The extrapolation value
(a float attribute) is converted to the output type as onnxruntime's static_cast does for floats
and complex; for integers and bools only an exactly representable value is taken.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np

from refimpl._common import Attrs, Inputs, as_array, as_text, int_list, normalize_axes
from refimpl._dtypes import BOOL, FLOATS, STRING, DTypes, checked, int_range
from refimpl._errors import RefImplError, UnsupportedOpError
from refimpl._registry import Kernel, Typed, register
from refimpl._resize_coordinates import Axis, exact_indices, ort_indices

__all__ = ["output_shape"]

_F32 = np.float32

_MODES = {
    10: frozenset({"asymmetric"}),
    11: frozenset(
        {
            "half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric",
            "tf_half_pixel_for_nn", "tf_crop_and_resize",
        }
    ),
    13: frozenset(
        {"half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_crop_and_resize"}
    ),
}  # fmt: skip
_MODES[18] = _MODES[13]
_MODES[19] = _MODES[13] | {"half_pixel_symmetric"}
_NEAREST_MODES = frozenset({"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"})
_POLICIES = frozenset({"stretch", "not_larger", "not_smaller"})


# --- the resize plan: per axis, the input and output length and the scale ------------------------


def _float_values(name: str, value: Any) -> np.ndarray | None:
    """A float input as a flat array; None when absent or empty."""
    if value is None:
        return None
    array = as_array(value).reshape(-1)
    if array.size == 0:
        return None
    if array.dtype.kind != "f":
        raise RefImplError(f"Resize: {name} must be a float tensor, got {array.dtype}")
    return array


def _plan(
    version: int, x_shape: tuple[int, ...], inputs: Inputs, attrs: Attrs, ctm: str
) -> list[Axis]:
    """The per-axis plan of a Resize node (output lengths and scales), checked against the spec."""
    rank = len(x_shape)
    if rank == 0:
        raise RefImplError("Resize: the input must have at least one dimension")
    if version == 10:
        roi, scales, sizes = None, _float_values("scales", inputs[1]), None
        if scales is None:
            raise RefImplError("Resize: scales is empty")
    else:
        get = lambda i: inputs[i] if len(inputs) > i else None
        roi = _float_values("roi", get(1))
        scales = _float_values("scales", get(2))
        sizes_in = get(3)
        sizes = None
        if sizes_in is not None and as_array(sizes_in).size:
            sizes_array = as_array(sizes_in)
            if sizes_array.dtype != np.int64:
                raise RefImplError(f"Resize: sizes must be int64, got {sizes_array.dtype}")
            sizes = int_list(sizes_array)
        if (scales is None) == (sizes is None):
            raise RefImplError("Resize: exactly one of scales and sizes must be given")
    axes_attr = attrs.get("axes") if version >= 18 else None
    axes = list(range(rank)) if axes_attr is None else list(normalize_axes("Resize", axes_attr, rank))
    count = len(axes)
    plan = [Axis(n) for n in x_shape]
    for a in axes:
        plan[a].resized = True

    if ctm == "tf_crop_and_resize":
        if roi is None or roi.size != 2 * count:
            raise RefImplError(f"Resize: tf_crop_and_resize needs an roi of {2 * count} values")
        if not np.all(np.isfinite(roi)):
            raise RefImplError("Resize: roi holds NaN or infinity")
        roi32 = roi.astype(_F32)
        for i, a in enumerate(axes):
            plan[a].roi = (Fraction(float(roi[i])), Fraction(float(roi[count + i])))
            plan[a].roi32 = (roi32[i], roi32[count + i])

    if scales is not None:
        if scales.size != count:
            raise RefImplError(f"Resize: {scales.size} scales for {count} axes")
        scales32 = scales.astype(_F32)
        if not np.all(np.isfinite(scales32)) or not np.all(scales32 > 0):
            raise RefImplError(f"Resize: scales must be positive and finite, got {scales.tolist()}")
        for s, a in zip(scales32, axes):
            axis = plan[a]
            axis.scale, axis.scale32 = Fraction(float(s)), s
            start, end = axis.roi
            if end - start != 1:
                raise RefImplError(
                    "Resize: tf_crop_and_resize with scales: the spec sizes the output by the roi "
                    "(floor(in * (end - start) * scale)), onnxruntime and the onnx reference do not"
                )
            exact = math.floor(axis.length_in * axis.scale)
            ort = int(_F32(axis.length_in) * s)  # static_cast<int64_t>(scale * input_dim)
            if exact != ort:
                raise _disagree(f"the output length of an axis of {axis.length_in} at scale {s}")
            axis.length_out = exact
        return plan

    assert sizes is not None
    if len(sizes) != count:
        raise RefImplError(f"Resize: {len(sizes)} sizes for {count} axes")
    if any(n < 0 for n in sizes):
        raise RefImplError(f"Resize: negative sizes {sizes}")
    policy = as_text(attrs.get("keep_aspect_ratio_policy", "stretch")) if version >= 18 else "stretch"
    if policy not in _POLICIES:
        raise RefImplError(f"Resize: keep_aspect_ratio_policy {policy!r} is not one of the spec's")
    for n, a in zip(sizes, axes):
        axis = plan[a]
        if axis.length_in == 0:
            if n != 0 or policy != "stretch":
                raise RefImplError("Resize: an empty axis cannot be resized to a non-empty one")
            axis.length_out = 0
            continue
        axis.length_out = n
        axis.scale = Fraction(n, axis.length_in)
        axis.scale32 = _F32(n) / _F32(axis.length_in)
    if policy != "stretch":
        pick = min if policy == "not_larger" else max
        scale = pick(plan[a].scale for a in axes)
        scale32 = pick(plan[a].scale32 for a in axes)
        for a in axes:
            axis = plan[a]
            exact = math.floor(scale * axis.length_in + Fraction(1, 2))  # round_int: half up
            ort = int(np.round(scale32 * _F32(axis.length_in)))  # std::round, ties away from 0
            if exact != ort:
                raise _disagree(f"the output length of an axis of {axis.length_in} at scale {scale}")
            axis.length_out, axis.scale, axis.scale32 = exact, scale, scale32
    return plan


def _disagree(what: str) -> RefImplError:
    return RefImplError(
        f"Resize: onnxruntime's float32 arithmetic and the spec's exact one differ on {what}"
    )


def output_shape(version: int, x_shape: tuple[int, ...], inputs: Inputs, attrs: Attrs) -> tuple[int, ...]:
    """The output shape of Resize-``version`` (what constant folding sizes before evaluating).

    ``inputs`` are the node's inputs after X (the scales, roi and sizes), ``attrs`` its
    attributes with the schema defaults.

    Raises:
        RefImplError: the kernel would reject the node.
    """
    ctm, _ = _check_attributes(version, attrs)
    plan = _plan(version, x_shape, [None, *inputs], attrs, ctm)
    return tuple(axis.length_out for axis in plan)


# --- the kernel ----------------------------------------------------------------------------------


def _check_attributes(version: int, attrs: Attrs) -> tuple[str, str]:
    """``(coordinate mode, rounding)`` after checking mode and the attributes nearest ignores."""
    mode = as_text(attrs.get("mode", "nearest"))
    if mode in ("linear", "cubic"):
        raise UnsupportedOpError(f"Resize: mode {mode!r} is not implemented (refimpl has nearest only)")
    if mode != "nearest":
        raise RefImplError(f"Resize: mode {mode!r} is not one of the spec's")
    if version == 10:
        return "asymmetric", "simple"
    ctm = as_text(attrs.get("coordinate_transformation_mode", "half_pixel"))
    if ctm not in _MODES[version]:
        raise RefImplError(
            f"Resize: coordinate_transformation_mode {ctm!r} is not in Resize-{version}"
        )
    rounding = as_text(attrs.get("nearest_mode", "round_prefer_floor"))
    if rounding not in _NEAREST_MODES:
        raise RefImplError(f"Resize: nearest_mode {rounding!r} is not one of the spec's")
    if int(attrs.get("exclude_outside", 0)) != 0:
        raise RefImplError("Resize: exclude_outside=1 with nearest (onnxruntime rejects it)")
    if version >= 18 and int(attrs.get("antialias", 0)) != 0:
        raise RefImplError("Resize: antialias=1 with nearest (onnxruntime rejects it)")
    return ctm, rounding


def _extrapolation(value: float, dtype: np.dtype) -> np.ndarray:
    """The extrapolation value in the output type (float attribute -> T)."""
    v = _F32(value)
    if dtype in FLOATS or dtype.kind == "c":
        return np.asarray(v).astype(dtype)
    if dtype == STRING:
        raise RefImplError("Resize: extrapolation into a string tensor has no value")
    if dtype == BOOL:
        if v not in (0, 1):
            raise RefImplError(f"Resize: extrapolation_value {float(v)} is not a bool")
        return np.asarray(bool(v))
    lo, hi = int_range(dtype)
    if not (np.isfinite(v) and float(v).is_integer() and lo <= float(v) <= hi):
        raise RefImplError(f"Resize: extrapolation_value {float(v)} is not a value of {dtype}")
    return np.asarray(int(v), dtype=dtype)


def _resize(version: int) -> Typed:
    """Resize-``version`` with mode nearest (see the module docstring)."""

    def make(types: DTypes) -> Kernel:
        allowed = types["T" if version == 10 else "T1"]

        def kernel(inputs: Inputs, attrs: Attrs) -> tuple[np.ndarray]:
            x = checked(inputs[0], allowed)
            ctm, rounding = _check_attributes(version, attrs)
            plan = _plan(version, x.shape, inputs, attrs, ctm)
            out_shape = tuple(axis.length_out for axis in plan)
            if math.prod(out_shape) == 0:
                return (np.empty(out_shape, dtype=x.dtype),)
            copy = out_shape == x.shape
            indices = []
            for axis in plan:
                if not axis.resized:
                    indices.append(np.arange(axis.length_in, dtype=np.int64))
                    continue
                exact = exact_indices(ctm, rounding if version > 10 else _simple(axis), axis)
                ort = ort_indices(ctm, rounding, axis, x.ndim, copy)
                if ort is None or not np.array_equal(exact, ort):
                    raise _disagree(
                        f"the input element of some output position (axis of {axis.length_in} "
                        f"-> {axis.length_out}, {ctm}, {rounding})"
                    )
                indices.append(exact)
            outside = [i < 0 for i in indices]
            y = x[np.ix_(*[np.maximum(i, 0) for i in indices])]
            if any(o.any() for o in outside):
                fill = _extrapolation(float(attrs.get("extrapolation_value", 0.0)), x.dtype)
                mask = np.zeros(out_shape, dtype=bool)
                for k, o in enumerate(outside):
                    mask |= o.reshape([-1 if j == k else 1 for j in range(x.ndim)])
                y[mask] = fill
            return (y,)

        return kernel

    return Typed(make)


def _simple(axis: Axis) -> str:
    """Resize-10's rounding of an axis: ceil when it is downsampled, floor otherwise."""
    return "ceil" if axis.scale < 1 else "floor"


register("Resize", 10, 10)(_resize(10))
register("Resize", 11, 11)(_resize(11))
register("Resize", 13, 13)(_resize(13))
register("Resize", 18, 18)(_resize(18))
register("Resize", 19, 19)(_resize(19))
