"""Generator kernels: ops that create a tensor from attributes, scalars or a shape.

Constant, ConstantOfShape, Range, EyeLike and OneHot. Results are exact except for float
Range, which follows the spec's formula (see ``_range``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import ml_dtypes
import numpy as np

from refimpl._common import (
    Attrs,
    Inputs,
    as_array,
    as_text,
    int_list,
    normalize_axis,
    same_dtype,
    to_array,
)
from refimpl._dtypes import DTypes, checked, dtype_of_code
from refimpl._errors import RefImplError
from refimpl._registry import Kernel, Typed, register

# --- Constant --------------------------------------------------------------------------------


def _strings(values: Iterable[str | bytes]) -> np.ndarray:
    items = [as_text(v) for v in values]
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out


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

    def kernel(inputs: Inputs, attrs: Attrs) -> tuple[np.ndarray]:
        present = [name for name in forms if attrs.get(name) is not None]
        if len(present) != 1:
            raise RefImplError(f"Constant: exactly one of {forms} must be set, got {present}")
        name = present[0]
        return (_CONSTANT_FORMS[name](attrs[name]),)

    return kernel


register("Constant", 1, 9)(_constant(("value",)))
register("Constant", 11, 11)(_constant(("value", "sparse_value")))
register("Constant", 12)(_constant(tuple(_CONSTANT_FORMS)))


# --- Range, ConstantOfShape ---------------------------------------------------------------


def _range(stash: bool) -> Typed:
    """Range: ``output[i] = start + i * delta`` for ``i < max(ceil((limit - start) / delta), 0)``.

    Integers are exact. Floats follow the spec's formula in the input type
    (or the ``stash_type`` for float16/bfloat16 from version 27); onnxruntime
    instead accumulates ``value += delta``, which drifts for long float ranges.
    The element count uses the exact quotient of the given values (in double).
    """

    def make(types: DTypes) -> Kernel:
        allowed = types["T"]

        def kernel(inputs: Inputs, attrs: Attrs) -> tuple[np.ndarray]:
            start, limit, delta = (checked(x, allowed) for x in inputs[:3])
            for name, value in zip(("start", "limit", "delta"), (start, limit, delta)):
                if value.size != 1:
                    raise RefImplError(f"Range: {name} must be a scalar, got shape {value.shape}")
            dtype = same_dtype("Range", (start, limit, delta))
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
                compute = dtype_of_code(attrs.get("stash_type", 1))
            s, lim, d = (np.asarray(v, dtype=compute).reshape(()) for v in (start, limit, delta))
            if float(d) == 0.0:
                raise RefImplError("Range: delta is 0")
            ratio = (float(lim) - float(s)) / float(d)
            if math.isnan(ratio) or math.isinf(ratio):
                raise RefImplError(f"Range: cannot count the elements of [{s}, {lim}) by {d}")
            count = max(math.ceil(ratio), 0)
            return ((s + np.arange(count, dtype=compute) * d).astype(dtype),)

        return kernel

    return Typed(make)


register("Range", 11, 11)(_range(stash=False))
register("Range", 27)(_range(stash=True))


@register("ConstantOfShape", 9)
def _constant_of_shape(inputs: Inputs, attrs: Attrs) -> tuple[np.ndarray]:
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


# --- EyeLike, OneHot ----------------------------------------------------------------------


@register("EyeLike", 9)
def _eye_like(inputs: Inputs, attrs: Attrs) -> tuple[np.ndarray]:
    x = as_array(inputs[0])
    if x.ndim != 2:
        raise RefImplError(f"EyeLike: input must be 2-D, got shape {x.shape}")
    dtype = attrs.get("dtype")
    dtype = dtype_of_code(dtype) if dtype else x.dtype
    return (np.eye(x.shape[0], x.shape[1], k=int(attrs.get("k", 0)), dtype=dtype),)


@register("OneHot", 9)
def _one_hot(inputs: Inputs, attrs: Attrs) -> tuple[np.ndarray]:
    """OneHot; indices and depth truncate to int64; indices outside [-depth, depth-1] stay off."""
    indices, depth, values = (as_array(x) for x in inputs[:3])
    if depth.size != 1 or values.size != 2:
        raise RefImplError(f"OneHot: depth {depth.shape} / values {values.shape} have wrong sizes")
    if indices.dtype.kind == "f" and not np.all(np.isfinite(indices)):
        raise RefImplError("OneHot: non-finite index")
    n = int(depth.reshape(()))  # int() truncates a float depth
    if n < 0:
        raise RefImplError(f"OneHot: negative depth {n}")
    axis = normalize_axis("OneHot", attrs.get("axis", -1), indices.ndim + 1)
    idx = indices.astype(np.int64)
    idx = np.expand_dims(np.where(idx < 0, idx + n, idx), axis)
    classes = np.arange(n, dtype=np.int64).reshape([-1] + [1] * (indices.ndim - axis))
    off, on = values.reshape(-1)
    return (np.where(idx == classes, on, off).astype(values.dtype, copy=False),)
