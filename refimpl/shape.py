"""Shape kernels: ops that reshape or rearrange tensors, and Shape/Size/Identity.

Reshape, Flatten, Squeeze, Unsqueeze, Transpose, Expand and Tile only move data (or compute
shapes), so results are bit-exact. Kernels never write into their inputs; outputs may be views
of them.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from refimpl._common import Attrs, Inputs, as_array, int_list, normalize_axes
from refimpl._errors import RefImplError
from refimpl._registry import Kernel, register

# --- Identity, Shape, Size ----------------------------------------------------------------


@register("Identity", 1)
def _identity(inputs: Inputs, attrs: Attrs) -> tuple[Any]:
    # Tensors, sequences (14+, lists) and optionals (16+, None when empty) pass through.
    x = inputs[0]
    return (x if x is None or isinstance(x, list) else as_array(x),)


def _shape(sliced: bool) -> Kernel:
    """Shape; from version 15 the ``start``/``end`` attributes slice it, clamped to [0, r].

    Python's slice clamping is exactly the spec's: negative bounds count from the back.
    """

    def kernel(inputs: Inputs, attrs: Attrs) -> tuple[np.ndarray]:
        x = inputs[0]
        shape = x.shape if type(x) is np.ndarray else np.shape(x)
        if sliced:
            start, end = attrs.get("start", 0), attrs.get("end")
            shape = shape[int(start) : None if end is None else int(end)]
        return (np.array(shape, dtype=np.int64),)

    return kernel


register("Shape", 1, 13)(_shape(sliced=False))
register("Shape", 15)(_shape(sliced=True))


@register("Size", 1)
def _size(inputs: Inputs, attrs: Attrs) -> tuple[np.ndarray]:
    return (np.array(np.size(inputs[0]), dtype=np.int64),)


# --- Reshape, Flatten, Squeeze, Unsqueeze -------------------------------------------------


def _reshaped_dims(in_shape: tuple[int, ...], shape: list[int], allowzero: bool) -> list[int]:
    """The dims to give ``ndarray.reshape``: a 0 copies the input dim unless ``allowzero``.

    numpy infers the -1 and raises ValueError for two -1s, a -1 next to a zero-sized product
    or a size mismatch (``_reshape`` reports those); it would take any other negative dim as -1,
    so those are refused here.
    """
    if min(shape, default=0) < -1:
        raise RefImplError(f"Reshape: invalid dimension {min(shape)} in shape {shape}")
    if allowzero or 0 not in shape:
        return shape
    if 0 in shape[len(in_shape) :]:
        raise RefImplError(
            f"Reshape: shape {shape} copies dimension {shape.index(0, len(in_shape))} "
            f"of a rank-{len(in_shape)} input"
        )
    return [in_shape[i] if d == 0 else d for i, d in enumerate(shape)]


@register("Reshape", 5)
def _reshape(inputs: Inputs, attrs: Attrs) -> tuple[np.ndarray]:
    """Reshape: 0 copies the input dim (unless ``allowzero``, version 14+), -1 is inferred."""
    data = as_array(inputs[0])
    dims = _reshaped_dims(data.shape, int_list(inputs[1]), bool(attrs.get("allowzero", 0)))
    try:
        return (data.reshape(dims),)
    except ValueError:  # only the dims can be wrong: they are Python ints, at most one -1
        raise RefImplError(f"Reshape: cannot reshape {data.shape} to {dims}") from None


def _flatten(allow_negative: bool) -> Kernel:
    def kernel(inputs: Inputs, attrs: Attrs) -> tuple[np.ndarray]:
        data = as_array(inputs[0])
        rank = data.ndim
        # Flatten accepts [-r, r] (only [0, r] before version 11).
        axis = int(attrs["axis"])
        if allow_negative and axis < 0:
            axis += rank
        if not 0 <= axis <= rank:
            raise RefImplError(f"Flatten: axis {attrs['axis']} is out of range for rank {rank}")
        outer = math.prod(data.shape[:axis])
        return (data.reshape(outer, math.prod(data.shape[axis:])),)

    return kernel


register("Flatten", 1, 9)(_flatten(allow_negative=False))
register("Flatten", 11)(_flatten(allow_negative=True))


def _axes_argument(inputs: Inputs, attrs: Attrs, from_input: bool) -> list[int] | None:
    value = (inputs[1] if len(inputs) > 1 else None) if from_input else attrs.get("axes")
    return None if value is None else int_list(value)


def _squeeze(from_input: bool, allow_negative: bool) -> Kernel:
    """Squeeze; without axes every size-1 dim is removed.

    An *empty* axes input is a given list of no axes and removes nothing, as in
    onnx's shape inference and reference evaluator (onnxruntime 1.32 removes
    every size-1 dim instead).
    """

    def kernel(inputs: Inputs, attrs: Attrs) -> tuple[np.ndarray]:
        data = as_array(inputs[0])
        axes = _axes_argument(inputs, attrs, from_input)
        if axes is None:
            return (data.reshape([d for d in data.shape if d != 1]),)
        axes = normalize_axes("Squeeze", axes, data.ndim, allow_negative=allow_negative)
        for axis in axes:
            if data.shape[axis] != 1:
                raise RefImplError(f"Squeeze: dimension {axis} of shape {data.shape} is not 1")
        return (data.reshape([d for i, d in enumerate(data.shape) if i not in axes]),)

    return kernel


register("Squeeze", 1, 1)(_squeeze(from_input=False, allow_negative=False))
register("Squeeze", 11, 11)(_squeeze(from_input=False, allow_negative=True))
register("Squeeze", 13)(_squeeze(from_input=True, allow_negative=True))


def _unsqueeze(from_input: bool, allow_negative: bool) -> Kernel:
    """Unsqueeze; axes index the *output* shape."""

    def kernel(inputs: Inputs, attrs: Attrs) -> tuple[np.ndarray]:
        data = as_array(inputs[0])
        axes = _axes_argument(inputs, attrs, from_input)
        if axes is None:
            raise RefImplError("Unsqueeze: axes are required")
        out_rank = data.ndim + len(axes)
        axes = normalize_axes("Unsqueeze", axes, out_rank, allow_negative=allow_negative)
        shape = list(data.shape)
        for axis in sorted(axes):  # ascending, so each position is final when inserted
            shape.insert(axis, 1)
        return (data.reshape(shape),)

    return kernel


register("Unsqueeze", 1, 1)(_unsqueeze(from_input=False, allow_negative=False))
register("Unsqueeze", 11, 11)(_unsqueeze(from_input=False, allow_negative=True))
register("Unsqueeze", 13)(_unsqueeze(from_input=True, allow_negative=True))


# --- Transpose, Expand, Tile --------------------------------------------------------------


@register("Transpose", 1)
def _transpose(inputs: Inputs, attrs: Attrs) -> tuple[np.ndarray]:
    data = as_array(inputs[0])
    perm = attrs.get("perm")
    if perm is None:
        return (data.transpose(),)
    perm = int_list(perm)
    if sorted(perm) != list(range(data.ndim)):
        raise RefImplError(f"Transpose: perm {perm} is not a permutation of rank {data.ndim}")
    return (data.transpose(perm),)


@register("Expand", 8)
def _expand(inputs: Inputs, attrs: Attrs) -> tuple[np.ndarray]:
    """Expand: bidirectional broadcast of the input with ``shape``."""
    data = as_array(inputs[0])
    shape = int_list(inputs[1])
    if any(d < 0 for d in shape):
        raise RefImplError(f"Expand: negative dimension in shape {shape}")
    try:
        out_shape = np.broadcast_shapes(data.shape, tuple(shape))
    except ValueError:
        raise RefImplError(f"Expand: shape {shape} does not broadcast with {data.shape}") from None
    return (np.broadcast_to(data, out_shape).copy(),)


@register("Tile", 6)
def _tile(inputs: Inputs, attrs: Attrs) -> tuple[np.ndarray]:
    data = as_array(inputs[0])
    repeats = int_list(inputs[1])
    if len(repeats) != data.ndim or any(r < 0 for r in repeats):
        raise RefImplError(f"Tile: invalid repeats {repeats} for rank {data.ndim}")
    return (np.tile(data, repeats),)
