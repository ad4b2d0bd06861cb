"""Constant values for the folding pass: reading ``Constant`` nodes, making tensors.

The folding pass works on ``ir.TensorProtocol`` objects until it evaluates a
node; only then are the inputs turned into numpy arrays (``read_array``), which
is when external data is first read.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnx.numpy_helper
import onnx_ir as ir

from passes.errors import InputError

__all__ = [
    "attribute_values",
    "constant_tensor",
    "make_tensor",
    "read_array",
    "sparse_to_dense",
    "tensor_nbytes",
]

logger = logging.getLogger(__name__)

_SCALAR_LIST_ATTRS = {
    # Constant attribute -> (numpy dtype, is a list)
    "value_float": (np.float32, False),
    "value_floats": (np.float32, True),
    "value_int": (np.int64, False),
    "value_ints": (np.int64, True),
}


def _string_tensor(values: Any, name: str | None) -> ir.StringTensor:
    array = np.asarray(values, dtype=object)
    encoded = np.array(
        [v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in array.reshape(-1)],
        dtype=object,
    ).reshape(array.shape)
    return ir.StringTensor(encoded, name=name)


def constant_tensor(node: ir.Node, dense_limit: int) -> ir.TensorProtocol | None:
    """The tensor a ``Constant`` node produces, in the dtype its attribute implies.

    ``value_float(s)`` give float32 and ``value_int(s)`` int64 (as the ONNX
    schema says), never numpy's float64 default. ``sparse_value`` is densified
    when the dense tensor is at most ``dense_limit`` bytes.

    Returns:
        The tensor, or None when the node is not a usable constant (an attribute
        reference inside a function, a malformed node, a sparse value too large
        to densify).
    """
    if len(node.attributes) != 1 or len(node.outputs) != 1:
        return None
    attr_name, attr = next(iter(node.attributes.items()))
    if not isinstance(attr, ir.Attr) or attr.is_ref() or attr.value is None:
        return None
    name = node.outputs[0].name
    if attr_name == "value":
        return attr.as_tensor()
    if attr_name in _SCALAR_LIST_ATTRS:
        dtype, _ = _SCALAR_LIST_ATTRS[attr_name]
        return ir.Tensor(np.array(attr.value, dtype=dtype), name=name)
    if attr_name in ("value_string", "value_strings"):
        return _string_tensor(attr.value, name)
    if attr_name == "sparse_value" and isinstance(attr.value, onnx.SparseTensorProto):
        dims = tuple(attr.value.dims)
        itemsize = ir.DataType(attr.value.values.data_type).itemsize
        if int(np.prod(dims, dtype=np.int64)) * itemsize > dense_limit:
            logger.debug("Constant %s: sparse value too large to densify", node.name)
            return None
        return make_tensor(sparse_to_dense(attr.value), name)
    return None


def make_tensor(array: np.ndarray, name: str | None) -> ir.TensorProtocol:
    """Wraps a kernel's output array as an IR tensor named ``name``.

    A non-contiguous array (a Transpose result) is kept as it is: serialising
    writes it in C order, and not copying it here saves a full copy of a large
    folded weight.
    """
    if array.dtype.kind in "OSU":
        return _string_tensor(array, name)
    return ir.Tensor(array, name=name)


def read_array(value: ir.Value, tensor: ir.TensorProtocol, node: ir.Node) -> np.ndarray:
    """The numpy array of a constant input; this is where external data gets read.

    Raises:
        InputError: the tensor's data cannot be read (a missing or short
            external-data file, raw data of the wrong length).
    """
    try:
        array = tensor.numpy()
    except (OSError, ValueError) as e:
        raise InputError(
            f"cannot read the data of {value.name!r}, input of {node.op_type} node {node.name!r}: {e}"
        ) from e
    if tensor.dtype == ir.DataType.STRING:
        return np.asarray(array, dtype=object)
    return np.asarray(array)


def tensor_nbytes(tensor: ir.TensorProtocol) -> int:
    """The size of a tensor in bytes, without reading external data."""
    if tensor.dtype == ir.DataType.STRING:
        return int(tensor.nbytes)
    return int(np.ceil(tensor.dtype.itemsize * int(np.prod(tensor.shape.numpy(), dtype=np.int64))))


def attribute_values(node: ir.Node) -> Mapping[str, Any] | None:
    """The node's attributes as plain Python values for ``refimpl.run``.

    Returns:
        A dict of attribute values, or None when an attribute cannot be given to
        a kernel (an unresolved reference inside a function, a graph, a sparse
        tensor or a type).
    """
    values: dict[str, Any] = {}
    for name, attr in node.attributes.items():
        if not isinstance(attr, ir.Attr) or attr.is_ref():
            return None
        kind = attr.type
        if kind in (ir.AttributeType.INT, ir.AttributeType.FLOAT, ir.AttributeType.STRING):
            values[name] = attr.value
        elif kind in (ir.AttributeType.INTS, ir.AttributeType.FLOATS, ir.AttributeType.STRINGS):
            values[name] = list(attr.value)
        elif kind == ir.AttributeType.TENSOR:
            values[name] = _attr_array(attr.as_tensor())
        elif kind == ir.AttributeType.TENSORS:
            values[name] = [_attr_array(t) for t in attr.as_tensors()]
        else:
            return None
    return values


def _attr_array(tensor: ir.TensorProtocol) -> np.ndarray:
    array = tensor.numpy()
    if tensor.dtype == ir.DataType.STRING:
        return np.asarray(array, dtype=object)
    return np.asarray(array)


# A dense copy must stay well below protobuf's 2 GB limit.
_MAX_DENSE_BYTES = 1 << 30


def sparse_to_dense(sparse: onnx.SparseTensorProto) -> np.ndarray:
    """The dense array of a sparse tensor (zeros where no value is given).

    Raises:
        ValueError: the indices do not fit the dims (malformed tensor).
    """
    dims = tuple(int(d) for d in sparse.dims)
    values = onnx.numpy_helper.to_array(sparse.values)
    if any(d < 0 for d in dims) or math.prod(dims) * values.dtype.itemsize > _MAX_DENSE_BYTES:
        raise ValueError(f"sparse tensor of dims {dims} is too large to densify")
    dense = np.zeros(dims, dtype=values.dtype)
    if values.size == 0:
        return dense
    indices = onnx.numpy_helper.to_array(sparse.indices).astype(np.int64)
    flat = dense.reshape(-1)
    if indices.ndim == 1:
        flat[indices] = values.reshape(-1)
    elif indices.ndim == 2 and indices.shape[1] == len(dims):
        flat[np.ravel_multi_index(tuple(indices.T), dims)] = values.reshape(-1)
    else:
        raise ValueError(f"sparse indices of shape {indices.shape} do not fit dims {dims}")
    return dense
