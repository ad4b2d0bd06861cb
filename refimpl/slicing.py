"""Slicing kernels: ops that cut, join, pad or mask tensors.

Concat, Split, Slice, Pad and Trilu only move data, so results are bit-exact. Kernels never
write into their inputs; outputs may be views of them.

Split needs the node's output count when no sizes are given (Split-2..13
without ``split``): callers pass ``num_outputs`` to ``refimpl.run``, and the Split
kernels, registered with ``needs_num_outputs=True``, receive it as their third argument.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from refimpl._common import (
    Attrs,
    Inputs,
    as_array,
    as_text,
    int_list,
    normalize_axes,
    normalize_axis,
    same_dtype,
    scalar_int,
)
from refimpl._errors import RefImplError
from refimpl._registry import CountedKernel, Kernel, register

# --- Concat, Split, Slice -----------------------------------------------------------------


def _concat(allow_negative: bool) -> Kernel:
    def kernel(inputs: Inputs, attrs: Attrs) -> tuple[np.ndarray]:
        arrays = [as_array(x) for x in inputs if x is not None]
        if not arrays:
            raise RefImplError("Concat: needs at least one input")
        same_dtype("Concat", arrays)
        rank = arrays[0].ndim
        for a in arrays:
            if a.ndim != rank:
                raise RefImplError("Concat: inputs have different ranks")
        axis = normalize_axis("Concat", attrs["axis"], rank, allow_negative=allow_negative)
        try:
            return (np.concatenate(arrays, axis),)
        except ValueError:  # ranks, dtypes and the axis are checked: only the dims can differ
            shapes = [a.shape for a in arrays]
            raise RefImplError(f"Concat: shapes {shapes} differ off axis {axis}") from None

    return kernel


register("Concat", 4, 4)(_concat(allow_negative=False))
register("Concat", 11)(_concat(allow_negative=True))


def _split_sizes(
    dim: int, split: list[int] | None, attrs: Attrs, count: int | None
) -> list[int]:
    """The sizes of the parts; ``count`` is the node's output count, if the caller gave it."""
    if split is not None:
        if any(s < 0 for s in split) or sum(split) != dim:
            raise RefImplError(f"Split: sizes {split} do not split a dimension of {dim}")
        if count is not None and int(count) != len(split):
            raise RefImplError(f"Split: {len(split)} sizes for {count} outputs")
        return split
    num_outputs = attrs.get("num_outputs")
    if num_outputs is not None:  # Split-18: ceil-sized chunks, the last one smaller
        n = int(num_outputs)
        if n < 1 or (count is not None and int(count) != n):
            raise RefImplError(f"Split: invalid num_outputs {n}")
        chunk = -(-dim // n)
        last = dim - chunk * (n - 1)
        if last < 0:
            raise RefImplError(f"Split: {dim} cannot be split into {n} outputs")
        return [chunk] * (n - 1) + [last]
    if count is None:
        raise RefImplError("Split: without sizes the output count is needed (run's num_outputs)")
    n = int(count)
    if n < 1 or dim % n:
        raise RefImplError(f"Split: dimension {dim} is not evenly splittable into {n} outputs")
    return [dim // n] * n


def _split(from_input: bool, allow_negative: bool, num_outputs: bool = False) -> CountedKernel:
    """Split; sizes come from the attribute (2, 11) or the input (13+), or num_outputs (18+)."""

    def kernel(inputs: Inputs, attrs: Attrs, count: int | None) -> tuple[np.ndarray, ...]:
        data = as_array(inputs[0])
        axis = normalize_axis(
            "Split", attrs.get("axis", 0), data.ndim, allow_negative=allow_negative
        )
        if from_input:
            split = int_list(inputs[1]) if len(inputs) > 1 and inputs[1] is not None else None
        else:
            split = int_list(attrs["split"]) if attrs.get("split") is not None else None
        if num_outputs and split is not None and attrs.get("num_outputs") is not None:
            raise RefImplError("Split: both the split input and num_outputs are given")
        sizes = _split_sizes(data.shape[axis], split, attrs, count)
        index: list[slice] = [slice(None)] * data.ndim
        outputs = []
        start = 0
        for size in sizes:
            index[axis] = slice(start, start + size)
            outputs.append(data[tuple(index)])
            start += size
        return tuple(outputs)

    return kernel


for _since, _until, _kernel in (
    (2, 2, _split(from_input=False, allow_negative=False)),
    (11, 11, _split(from_input=False, allow_negative=True)),
    (13, 13, _split(from_input=True, allow_negative=True)),
    (18, None, _split(from_input=True, allow_negative=True, num_outputs=True)),
):
    register("Split", _since, _until, needs_num_outputs=True)(_kernel)


def _slice_index(
    shape: tuple[int, ...],
    starts: list[int],
    ends: list[int],
    axes: list[int] | None,
    steps: list[int] | None,
    allow_negative_axes: bool,
) -> tuple[slice, ...]:
    """The numpy index of an ONNX Slice, with the clamping rules of Slice-13."""
    rank = len(shape)
    if axes is None:
        axes = list(range(len(starts)))
    if steps is None:
        steps = [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise RefImplError("Slice: starts, ends, axes and steps differ in length")
    axes = normalize_axes("Slice", axes, rank, allow_negative=allow_negative_axes)
    index = [slice(None)] * rank
    for start, end, axis, step in zip(starts, ends, axes, steps):
        dim = shape[axis]
        if step == 0:
            raise RefImplError("Slice: step cannot be 0")
        start = start + dim if start < 0 else start
        end = end + dim if end < 0 else end
        if step > 0:
            index[axis] = slice(min(max(start, 0), dim), min(max(end, 0), dim), step)
        elif dim == 0:
            index[axis] = slice(0, 0)
        else:
            start = min(max(start, 0), dim - 1)
            end = min(max(end, -1), dim - 1)
            index[axis] = slice(start, None if end < 0 else end, step)
    return tuple(index)


def _slice(from_inputs: bool, allow_negative_axes: bool) -> Kernel:
    """Slice; attributes before version 10, inputs (with steps) from 10."""

    def kernel(inputs: Inputs, attrs: Attrs) -> tuple[np.ndarray]:
        data = as_array(inputs[0])
        if from_inputs:
            args = [int_list(x) if x is not None else None for x in inputs[1:5]]
            args += [None] * (4 - len(args))
            starts, ends, axes, steps = args
        else:
            starts, ends, steps = int_list(attrs["starts"]), int_list(attrs["ends"]), None
            axes = int_list(attrs["axes"]) if attrs.get("axes") is not None else None
        if starts is None or ends is None:
            raise RefImplError("Slice: starts and ends are required")
        index = _slice_index(data.shape, starts, ends, axes, steps, allow_negative_axes)
        return (data[index],)

    return kernel


register("Slice", 1, 1)(_slice(from_inputs=False, allow_negative_axes=False))
register("Slice", 10, 10)(_slice(from_inputs=True, allow_negative_axes=False))
register("Slice", 11)(_slice(from_inputs=True, allow_negative_axes=True))


# --- Trilu ----------------------------------------------------------------------------------


def _zero(dtype: np.dtype) -> Any:
    """The "zero" of a type: 0, False, or the empty string."""
    return "" if dtype.kind == "O" else np.zeros((), dtype=dtype)


@register("Trilu", 14)
def _trilu(inputs: Inputs, attrs: Attrs) -> tuple[np.ndarray]:
    data = as_array(inputs[0])
    if data.ndim < 2:
        raise RefImplError(f"Trilu: input rank {data.ndim} < 2")
    k = scalar_int("Trilu", "k", inputs[1]) if len(inputs) > 1 and inputs[1] is not None else 0
    rows, cols = data.shape[-2:]
    offset = np.arange(cols, dtype=np.int64)[None, :] - np.arange(rows, dtype=np.int64)[:, None]
    keep = offset >= k if attrs.get("upper", 1) else offset <= k
    return (np.where(keep, data, _zero(data.dtype)).astype(data.dtype, copy=False),)


# --- Pad ------------------------------------------------------------------------------------


def _pad_edges(data: np.ndarray, widths: list[tuple[int, int]], mode: str) -> np.ndarray:
    """Pads with non-negative widths in a non-constant mode, validating like the spec."""
    for axis, (before, after) in enumerate(widths):
        dim = data.shape[axis]
        if (before or after) and dim == 0:
            raise RefImplError(f"Pad: cannot {mode}-pad the empty axis {axis}")
        if mode == "reflect" and (before or after) and max(before, after) > dim - 1:
            # numpy reflects repeatedly; the reflection the spec describes only
            # reaches dim - 1 elements (onnxruntime rejects this too).
            raise RefImplError(f"Pad: reflect pads {before, after} exceed {dim - 1} on axis {axis}")
    return np.pad(data, widths, mode=mode)


def _pad(pads_from_input: bool, axes_input: bool, modes: tuple[str, ...]) -> Kernel:
    """Pad; negative pads crop (first), then the mode fills the positive pads."""

    def kernel(inputs: Inputs, attrs: Attrs) -> tuple[np.ndarray]:
        data = as_array(inputs[0])
        mode = as_text(attrs.get("mode", "constant"))
        if mode not in modes:
            raise RefImplError(f"Pad: unsupported mode {mode!r} (this version has {modes})")
        rank = data.ndim
        if pads_from_input:
            pads = int_list(inputs[1])
            value = inputs[2] if len(inputs) > 2 else None
        else:
            pads = int_list(attrs["pads"])
            value = attrs.get("value", 0.0)
        axes = list(range(rank))
        if axes_input and len(inputs) > 3 and inputs[3] is not None:
            axes = normalize_axes("Pad", int_list(inputs[3]), rank)
        if len(pads) != 2 * len(axes):
            raise RefImplError(f"Pad: {len(pads)} pads for {len(axes)} axes")
        crop: list[slice] = [slice(None)] * rank
        widths = [(0, 0)] * rank
        for i, axis in enumerate(axes):
            before, after = pads[i], pads[i + len(axes)]
            dim = data.shape[axis]
            stop = dim + min(after, 0)
            if stop < -min(before, 0):
                raise RefImplError(
                    f"Pad: pads {before, after} remove more than the {dim} of axis {axis}"
                )
            crop[axis] = slice(-min(before, 0), stop)
            widths[axis] = (max(before, 0), max(after, 0))
        data = data[tuple(crop)]
        if mode != "constant":
            return (_pad_edges(data, widths, mode),)
        if value is None:
            fill = _zero(data.dtype)
        else:
            fill = np.asarray(value)
            if fill.size != 1:
                raise RefImplError(f"Pad: constant_value must be a scalar, got {fill.shape}")
            fill = fill.reshape(()).astype(data.dtype)
        out = np.full([d + b + a for d, (b, a) in zip(data.shape, widths)], fill, dtype=data.dtype)
        out[tuple(slice(b, b + d) for d, (b, _) in zip(data.shape, widths))] = data
        return (out,)

    return kernel


_PAD_MODES = ("constant", "reflect", "edge")
for _since, _until, _from_input, _axes, _modes in (
    (2, 2, False, False, _PAD_MODES),
    (11, 13, True, False, _PAD_MODES),
    (18, 18, True, True, _PAD_MODES),
    (19, None, True, True, (*_PAD_MODES, "wrap")),
):
    register("Pad", _since, _until)(_pad(_from_input, _axes, _modes))
