"""Shape kernels: ops that create, reshape, slice or rearrange tensors.

Every kernel only moves data (or computes shapes), so results are bit-exact.
Kernels never write into their inputs; outputs may be views of them.

The module also holds the small argument helpers that ``indexing`` and
``misc`` share (axis normalisation, 1-D int inputs, attribute tensors).

Split needs the node's output count when no sizes are given (Split-2..13
without ``split``). Callers pass it as the reserved attribute ``_num_outputs``
(:data:`NUM_OUTPUTS`); kernels ignore it otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import ml_dtypes
import numpy as np
import onnx
from onnx import numpy_helper

from refimpl._registry import Kernel, RefImplError, register

__all__ = [
    "NUM_OUTPUTS",
    "as_array",
    "as_text",
    "int_list",
    "normalize_axes",
    "normalize_axis",
    "scalar_int",
    "to_array",
]

NUM_OUTPUTS = "_num_outputs"
"""Reserved attribute: the number of outputs of the node being evaluated."""

_Inputs = Sequence[Any]
_Attrs = Mapping[str, Any]

# The last schema version of the ops whose newer versions only add types.
_LATEST = 25


# --- shared helpers -----------------------------------------------------------------------


def normalize_axis(op: str, axis: int, rank: int, *, allow_negative: bool = True) -> int:
    """Maps ``axis`` into ``[0, rank)``; negative axes count from the back if allowed.

    Raises:
        RefImplError: the axis is out of range (or negative where the schema
            version only accepts non-negative axes).
    """
    axis = int(axis)
    lo = -rank if allow_negative else 0
    if not lo <= axis < rank:
        raise RefImplError(f"{op}: axis {axis} is out of range [{lo}, {rank - 1}]")
    return axis + rank if axis < 0 else axis


def normalize_axes(
    op: str, axes: Iterable[int], rank: int, *, allow_negative: bool = True
) -> list[int]:
    """Normalises a list of axes and rejects repeated ones."""
    out = [normalize_axis(op, a, rank, allow_negative=allow_negative) for a in axes]
    if len(set(out)) != len(out):
        raise RefImplError(f"{op}: repeated axis in {list(axes)}")
    return out


def int_list(value: Any) -> list[int]:
    """An attribute list or a 0-/1-D integer tensor as a list of Python ints."""
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value]
    return np.asarray(value).reshape(-1).tolist()


def scalar_int(op: str, name: str, value: Any) -> int:
    """A tensor holding exactly one integer (0-D or shape [1]) as a Python int."""
    arr = np.asarray(value)
    if arr.size != 1:
        raise RefImplError(f"{op}: {name} must hold one value, got shape {arr.shape}")
    return int(arr.reshape(()))


def as_text(value: str | bytes) -> str:
    """A string attribute as ``str`` (protobuf attributes may arrive as bytes)."""
    return value.decode("utf-8") if isinstance(value, bytes) else value


def _sparse_to_dense(sparse: onnx.SparseTensorProto) -> np.ndarray:
    values = numpy_helper.to_array(sparse.values)
    indices = numpy_helper.to_array(sparse.indices).astype(np.int64)
    dims = tuple(sparse.dims)
    dense = np.zeros(dims, dtype=values.dtype)
    if values.dtype == object:
        dense[...] = ""
    if indices.ndim == 1:  # linearised (row-major) positions
        dense.reshape(-1)[indices] = values
    elif indices.size:
        dense[tuple(indices.T)] = values
    return dense


def to_array(value: Any) -> np.ndarray:
    """A tensor attribute (array, TensorProto, SparseTensorProto, ir tensor) as a dense array."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, onnx.SparseTensorProto):
        return _sparse_to_dense(value)
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    if hasattr(value, "numpy"):  # onnx_ir tensors
        return np.asarray(value.numpy())
    return np.asarray(value)


def as_array(value: Any) -> np.ndarray:
    """An input as an ndarray (backend test data may hold numpy scalars)."""
    return value if isinstance(value, np.ndarray) else np.asarray(value)


def _strings(values: Iterable[str | bytes]) -> np.ndarray:
    items = [as_text(v) for v in values]
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out


# --- Constant, Identity, Shape, Size ------------------------------------------------------

_CONSTANT_FORMS: dict[str, Callable[[Any], np.ndarray]] = {
    "value": to_array,
    "sparse_value": to_array,
    "value_float": lambda v: np.array(v, dtype=np.float32),
    "value_floats": lambda v: np.array(list(v), dtype=np.float32).reshape(-1),
    "value_int": lambda v: np.array(v, dtype=np.int64),
    "value_ints": lambda v: np.array(list(v), dtype=np.int64).reshape(-1),
    "value_string": lambda v: np.array(as_text(v), dtype=object),
    "value_strings": _strings,
}


def _constant(forms: tuple[str, ...]) -> Kernel:
    """Constant: exactly one of ``forms`` (the attributes of this version) is set."""

    def kernel(inputs: _Inputs, attrs: _Attrs) -> tuple[np.ndarray]:
        present = [name for name in forms if attrs.get(name) is not None]
        if len(present) != 1:
            raise RefImplError(f"Constant: exactly one of {forms} must be set, got {present}")
        name = present[0]
        return (_CONSTANT_FORMS[name](attrs[name]),)

    return kernel


register("Constant", 1, 9)(_constant(("value",)))
register("Constant", 11)(_constant(("value", "sparse_value")))
register("Constant", 12, _LATEST)(_constant(tuple(_CONSTANT_FORMS)))


@register("Identity", 1, _LATEST)
def _identity(inputs: _Inputs, attrs: _Attrs) -> tuple[Any]:
    # Tensors, sequences (14+, lists) and optionals (16+, None when empty) pass through.
    x = inputs[0]
    return (x if x is None or isinstance(x, list) else as_array(x),)


def _shape(sliced: bool) -> Kernel:
    """Shape; from version 15 the ``start``/``end`` attributes slice it, clamped to [0, r]."""

    def kernel(inputs: _Inputs, attrs: _Attrs) -> tuple[np.ndarray]:
        shape = np.shape(inputs[0])
        if not sliced:
            return (np.array(shape, dtype=np.int64),)
        rank = len(shape)
        bounds = []
        for value in (attrs.get("start", 0), attrs.get("end")):
            if value is None:
                bounds.append(rank)
                continue
            value = int(value)
            bounds.append(min(max(value + rank if value < 0 else value, 0), rank))
        return (np.array(shape[bounds[0] : bounds[1]], dtype=np.int64),)

    return kernel


register("Shape", 1, 13)(_shape(sliced=False))
register("Shape", 15, _LATEST)(_shape(sliced=True))


@register("Size", 1, _LATEST)
def _size(inputs: _Inputs, attrs: _Attrs) -> tuple[np.ndarray]:
    return (np.array(np.size(inputs[0]), dtype=np.int64),)


# --- Reshape, Flatten, Squeeze, Unsqueeze -------------------------------------------------


def _reshaped_dims(in_shape: tuple[int, ...], shape: list[int], allowzero: bool) -> list[int]:
    dims = list(shape)
    infer = None
    for i, d in enumerate(dims):
        if d == -1:
            if infer is not None:
                raise RefImplError(f"Reshape: more than one -1 in shape {shape}")
            infer = i
        elif d == 0 and not allowzero:
            if i >= len(in_shape):
                raise RefImplError(
                    f"Reshape: shape {shape} copies dimension {i} of a rank-{len(in_shape)} input"
                )
            dims[i] = in_shape[i]
        elif d < 0:
            raise RefImplError(f"Reshape: invalid dimension {d} in shape {shape}")
    size = math.prod(in_shape)
    if infer is None:
        if math.prod(dims) != size:
            raise RefImplError(f"Reshape: cannot reshape {in_shape} to {shape}")
        return dims
    if allowzero and 0 in shape:
        raise RefImplError(f"Reshape: shape {shape} has both 0 and -1 with allowzero=1")
    known = math.prod(d for i, d in enumerate(dims) if i != infer)
    if known == 0 or size % known:
        raise RefImplError(f"Reshape: cannot infer -1 when reshaping {in_shape} to {shape}")
    dims[infer] = size // known
    return dims


@register("Reshape", 5, _LATEST)
def _reshape(inputs: _Inputs, attrs: _Attrs) -> tuple[np.ndarray]:
    """Reshape: 0 copies the input dim (unless ``allowzero``, version 14+), -1 is inferred."""
    data = as_array(inputs[0])
    dims = _reshaped_dims(data.shape, int_list(inputs[1]), bool(attrs.get("allowzero", 0)))
    return (data.reshape(dims),)


def _flatten(allow_negative: bool) -> Kernel:
    def kernel(inputs: _Inputs, attrs: _Attrs) -> tuple[np.ndarray]:
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
register("Flatten", 11, _LATEST)(_flatten(allow_negative=True))


def _axes_argument(inputs: _Inputs, attrs: _Attrs, from_input: bool) -> list[int] | None:
    value = (inputs[1] if len(inputs) > 1 else None) if from_input else attrs.get("axes")
    return None if value is None else int_list(value)


def _squeeze(from_input: bool, allow_negative: bool) -> Kernel:
    """Squeeze; without axes every size-1 dim is removed.

    An *empty* axes input is a given list of no axes and removes nothing, as in
    onnx's shape inference and reference evaluator (onnxruntime 1.32 removes
    every size-1 dim instead).
    """

    def kernel(inputs: _Inputs, attrs: _Attrs) -> tuple[np.ndarray]:
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


register("Squeeze", 1)(_squeeze(from_input=False, allow_negative=False))
register("Squeeze", 11)(_squeeze(from_input=False, allow_negative=True))
register("Squeeze", 13, _LATEST)(_squeeze(from_input=True, allow_negative=True))


def _unsqueeze(from_input: bool, allow_negative: bool) -> Kernel:
    """Unsqueeze; axes index the *output* shape."""

    def kernel(inputs: _Inputs, attrs: _Attrs) -> tuple[np.ndarray]:
        data = as_array(inputs[0])
        axes = _axes_argument(inputs, attrs, from_input)
        if axes is None:
            raise RefImplError("Unsqueeze: axes are required")
        out_rank = data.ndim + len(axes)
        axes = normalize_axes("Unsqueeze", axes, out_rank, allow_negative=allow_negative)
        dims = iter(data.shape)
        return (data.reshape([1 if i in axes else next(dims) for i in range(out_rank)]),)

    return kernel


register("Unsqueeze", 1)(_unsqueeze(from_input=False, allow_negative=False))
register("Unsqueeze", 11)(_unsqueeze(from_input=False, allow_negative=True))
register("Unsqueeze", 13, _LATEST)(_unsqueeze(from_input=True, allow_negative=True))


# --- Concat, Split, Slice -----------------------------------------------------------------


def _concat(allow_negative: bool) -> Kernel:
    def kernel(inputs: _Inputs, attrs: _Attrs) -> tuple[np.ndarray]:
        arrays = [as_array(x) for x in inputs if x is not None]
        if not arrays:
            raise RefImplError("Concat: needs at least one input")
        first = arrays[0]
        if any(a.dtype != first.dtype for a in arrays):
            raise RefImplError(
                f"Concat: mixed input types {sorted({str(a.dtype) for a in arrays})}"
            )
        if any(a.ndim != first.ndim for a in arrays):
            raise RefImplError("Concat: inputs have different ranks")
        axis = normalize_axis("Concat", attrs["axis"], first.ndim, allow_negative=allow_negative)
        return (np.concatenate(arrays, axis=axis),)

    return kernel


register("Concat", 4)(_concat(allow_negative=False))
register("Concat", 11, 13)(_concat(allow_negative=True))


def _split_sizes(dim: int, split: list[int] | None, attrs: _Attrs) -> list[int]:
    count = attrs.get(NUM_OUTPUTS)
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
        raise RefImplError(
            f"Split: without sizes the output count is needed (attribute {NUM_OUTPUTS!r})"
        )
    n = int(count)
    if n < 1 or dim % n:
        raise RefImplError(f"Split: dimension {dim} is not evenly splittable into {n} outputs")
    return [dim // n] * n


def _split(from_input: bool, allow_negative: bool, num_outputs: bool = False) -> Kernel:
    """Split; sizes come from the attribute (2, 11) or the input (13+), or num_outputs (18+)."""

    def kernel(inputs: _Inputs, attrs: _Attrs) -> tuple[np.ndarray, ...]:
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
        sizes = _split_sizes(data.shape[axis], split, attrs)
        index: list[slice] = [slice(None)] * data.ndim
        outputs = []
        start = 0
        for size in sizes:
            index[axis] = slice(start, start + size)
            outputs.append(data[tuple(index)])
            start += size
        return tuple(outputs)

    return kernel


register("Split", 2)(_split(from_input=False, allow_negative=False))
register("Split", 11)(_split(from_input=False, allow_negative=True))
register("Split", 13)(_split(from_input=True, allow_negative=True))
register("Split", 18)(_split(from_input=True, allow_negative=True, num_outputs=True))


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

    def kernel(inputs: _Inputs, attrs: _Attrs) -> tuple[np.ndarray]:
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


register("Slice", 1)(_slice(from_inputs=False, allow_negative_axes=False))
register("Slice", 10)(_slice(from_inputs=True, allow_negative_axes=False))
register("Slice", 11, 13)(_slice(from_inputs=True, allow_negative_axes=True))


# --- Transpose, Expand, Tile --------------------------------------------------------------


@register("Transpose", 1, _LATEST)
def _transpose(inputs: _Inputs, attrs: _Attrs) -> tuple[np.ndarray]:
    data = as_array(inputs[0])
    perm = attrs.get("perm")
    if perm is None:
        return (data.transpose(),)
    perm = int_list(perm)
    if sorted(perm) != list(range(data.ndim)):
        raise RefImplError(f"Transpose: perm {perm} is not a permutation of rank {data.ndim}")
    return (data.transpose(perm),)


@register("Expand", 8, 13)
def _expand(inputs: _Inputs, attrs: _Attrs) -> tuple[np.ndarray]:
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


@register("Tile", 6, 13)
def _tile(inputs: _Inputs, attrs: _Attrs) -> tuple[np.ndarray]:
    data = as_array(inputs[0])
    repeats = int_list(inputs[1])
    if len(repeats) != data.ndim or any(r < 0 for r in repeats):
        raise RefImplError(f"Tile: invalid repeats {repeats} for rank {data.ndim}")
    return (np.tile(data, repeats),)


# --- Range, ConstantOfShape, Trilu --------------------------------------------------------


def _range(stash: bool) -> Kernel:
    """Range: ``output[i] = start + i * delta`` for ``i < max(ceil((limit - start) / delta), 0)``.

    Integers are exact. Floats follow the spec's formula in the input type
    (or the ``stash_type`` for float16/bfloat16 from version 27); onnxruntime
    instead accumulates ``value += delta``, which drifts for long float ranges.
    The element count uses the exact quotient of the given values (in double).
    """

    def kernel(inputs: _Inputs, attrs: _Attrs) -> tuple[np.ndarray]:
        start, limit, delta = (as_array(x) for x in inputs[:3])
        for name, value in zip(("start", "limit", "delta"), (start, limit, delta)):
            if value.size != 1:
                raise RefImplError(f"Range: {name} must be a scalar, got shape {value.shape}")
        dtype = start.dtype
        if np.issubdtype(dtype, np.integer):
            s, lim, d = int(start.reshape(())), int(limit.reshape(())), int(delta.reshape(()))
            if d == 0:
                raise RefImplError("Range: delta is 0")
            count = max(-((s - lim) // d), 0)
            # int64 arithmetic wraps, but every true value lies in [start, limit).
            values = np.arange(count, dtype=np.int64) * np.int64(d) + np.int64(s)
            return (values.astype(dtype),)
        compute = dtype
        if stash and dtype in (np.float16, ml_dtypes.bfloat16):
            compute = onnx.helper.tensor_dtype_to_np_dtype(int(attrs.get("stash_type", 1)))
        s, lim, d = (np.asarray(v, dtype=compute).reshape(()) for v in (start, limit, delta))
        if float(d) == 0.0:
            raise RefImplError("Range: delta is 0")
        ratio = (float(lim) - float(s)) / float(d)
        if math.isnan(ratio) or math.isinf(ratio):
            raise RefImplError(f"Range: cannot count the elements of [{s}, {lim}) by {d}")
        count = max(math.ceil(ratio), 0)
        return ((s + np.arange(count, dtype=compute) * d).astype(dtype),)

    return kernel


register("Range", 11)(_range(stash=False))
register("Range", 27)(_range(stash=True))


@register("ConstantOfShape", 9, _LATEST)
def _constant_of_shape(inputs: _Inputs, attrs: _Attrs) -> tuple[np.ndarray]:
    shape = int_list(inputs[0])
    if any(d < 0 for d in shape):
        raise RefImplError(f"ConstantOfShape: negative dimension in {shape}")
    value = attrs.get("value")
    if value is None:
        return (np.zeros(shape, dtype=np.float32),)
    value = to_array(value)
    if value.size != 1:
        raise RefImplError(f"ConstantOfShape: value must have one element, got {value.shape}")
    return (np.full(shape, value.reshape(()), dtype=value.dtype),)


def _zero(dtype: np.dtype) -> Any:
    """The "zero" of a type: 0, False, or the empty string."""
    return "" if dtype.kind == "O" else np.zeros((), dtype=dtype)


@register("Trilu", 14)
def _trilu(inputs: _Inputs, attrs: _Attrs) -> tuple[np.ndarray]:
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

    def kernel(inputs: _Inputs, attrs: _Attrs) -> tuple[np.ndarray]:
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
register("Pad", 2)(_pad(pads_from_input=False, axes_input=False, modes=_PAD_MODES))
register("Pad", 11, 13)(_pad(pads_from_input=True, axes_input=False, modes=_PAD_MODES))
register("Pad", 18)(_pad(pads_from_input=True, axes_input=True, modes=_PAD_MODES))
register("Pad", 19, _LATEST)(
    _pad(pads_from_input=True, axes_input=True, modes=(*_PAD_MODES, "wrap"))
)
