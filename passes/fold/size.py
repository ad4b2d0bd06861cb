"""Output-size estimates, so that a huge result is refused before it is computed.

Only ops whose output can be far larger than their inputs are estimated, from
the shapes of their inputs and the values of their small shape-like inputs:
``ConstantOfShape``, ``Expand``, ``Tile``, ``Range``. The estimate of any other
op is None (unknown); its real size is checked after evaluation.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

__all__ = ["estimate_output_bytes"]

# Shape-like inputs larger than this are not read for an estimate.
_MAX_SHAPE_ELEMENTS = 64

_Inputs = Sequence[ir.TensorProtocol | None]
_Estimator = Callable[[_Inputs, Mapping[str, Any]], int | None]


def _small_values(tensor: ir.TensorProtocol | None) -> np.ndarray | None:
    if tensor is None or tensor.size > _MAX_SHAPE_ELEMENTS:
        return None
    if tensor.dtype not in (ir.DataType.INT64, ir.DataType.INT32):
        return None
    return np.asarray(tensor.numpy(), dtype=np.int64).reshape(-1)


def _bytes(dims: Sequence[int], dtype: ir.DataType) -> int | None:
    if any(d < 0 for d in dims):
        return None  # invalid; evaluation will report it
    return math.ceil(math.prod(int(d) for d in dims) * dtype.itemsize)


def _constant_of_shape(inputs: _Inputs, attrs: Mapping[str, Any]) -> int | None:
    dims = _small_values(inputs[0] if inputs else None)
    if dims is None:
        return None
    value = attrs.get("value")
    dtype = ir.DataType.FLOAT
    if value is not None:
        dtype = ir.DataType.from_numpy(np.asarray(value).dtype)
    return _bytes(dims.tolist(), dtype)


def _expand(inputs: _Inputs, attrs: Mapping[str, Any]) -> int | None:
    if len(inputs) < 2 or inputs[0] is None:
        return None
    shape = _small_values(inputs[1])
    if shape is None:
        return None
    try:
        dims = np.broadcast_shapes(tuple(inputs[0].shape.numpy()), tuple(shape.tolist()))
    except ValueError:
        return None
    return _bytes(dims, inputs[0].dtype)


def _tile(inputs: _Inputs, attrs: Mapping[str, Any]) -> int | None:
    if len(inputs) < 2 or inputs[0] is None:
        return None
    repeats = _small_values(inputs[1])
    dims = inputs[0].shape.numpy()
    if repeats is None or len(repeats) != len(dims):
        return None
    return _bytes([d * r for d, r in zip(dims, repeats.tolist())], inputs[0].dtype)


def _range(inputs: _Inputs, attrs: Mapping[str, Any]) -> int | None:
    if len(inputs) != 3 or any(t is None or t.size != 1 for t in inputs):
        return None
    start, limit, delta = (float(np.asarray(t.numpy()).reshape(-1)[0]) for t in inputs)
    if delta == 0 or not all(math.isfinite(v) for v in (start, limit, delta)):
        return None
    count = max(math.ceil((limit - start) / delta), 0)
    return _bytes([count], inputs[0].dtype)


_ESTIMATORS: dict[str, _Estimator] = {
    "ConstantOfShape": _constant_of_shape,
    "Expand": _expand,
    "Tile": _tile,
    "Range": _range,
}


def estimate_output_bytes(
    op_type: str, domain: str, inputs: _Inputs, attrs: Mapping[str, Any]
) -> int | None:
    """The number of bytes the node's outputs will take, or None if not estimated cheaply.

    Args:
        op_type: The node's operator.
        domain: Its normalised domain (``""`` for ONNX).
        inputs: The constant input tensors (None for omitted optional inputs).
        attrs: The attribute values as given to the kernel.
    """
    if domain != "":
        return None
    estimator = _ESTIMATORS.get(op_type)
    if estimator is None:
        return None
    return estimator(inputs, attrs)
