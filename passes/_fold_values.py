"""Constant values for the folding pass: reading ``Constant`` nodes, making tensors.

The folding pass works on ``ir.TensorProtocol`` objects until it evaluates a
node; only then are the inputs turned into numpy arrays (``read_array``), which
is when external data is first read.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnx.defs
import onnx_ir as ir

from passes._sparse import sparse_to_dense
from passes.errors import InputError

__all__ = [
    "attribute_values",
    "constant_tensor",
    "expected_dtypes",
    "make_tensor",
    "read_array",
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


_TYPE_STRINGS = {
    f"tensor({name.lower()})": ir.DataType(value)
    for name, value in onnx.TensorProto.DataType.items()
    if value != onnx.TensorProto.UNDEFINED
}


@functools.lru_cache(maxsize=4096)
def _output_type_rules(
    op_type: str, domain: str, opset: int
) -> tuple[int | ir.DataType | None, ...] | None:
    """Per schema output: the input index whose dtype it shares, a fixed dtype, or None.

    Returns None when the op has no schema. The last formal parameter of a
    variadic list stands for all the remaining actual ones.
    """
    try:
        schema = onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return None
    first_input: dict[str, int] = {}
    for i, formal in enumerate(schema.inputs):
        first_input.setdefault(formal.type_str, i)
    single = {
        c.type_param_str: _TYPE_STRINGS.get(c.allowed_type_strs[0])
        for c in schema.type_constraints
        if len(c.allowed_type_strs) == 1
    }
    rules: list[int | ir.DataType | None] = []
    for formal in schema.outputs:
        if formal.type_str in _TYPE_STRINGS:
            rules.append(_TYPE_STRINGS[formal.type_str])
        elif single.get(formal.type_str) is not None:
            rules.append(single[formal.type_str])
        else:
            rules.append(first_input.get(formal.type_str))
    if schema.outputs and schema.outputs[-1].option != onnx.defs.OpSchema.FormalParameterOption.Variadic:
        rules.append(None)  # stands for any output past the schema's (none in a valid node)
    return tuple(rules)


def expected_dtypes(
    op_type: str, domain: str, opset: int, inputs: Sequence[ir.TensorProtocol | None], n_outputs: int
) -> list[ir.DataType | None]:
    """The dtype the schema gives each output, where the input dtypes determine it.

    An output typed ``T`` like an input has that input's dtype; one typed
    ``tensor(int64)`` is int64; one whose type depends on an attribute
    (Cast's ``to``) is None (unknown).
    """
    rules = _output_type_rules(op_type, domain, opset)
    if not rules:
        return [None] * n_outputs
    result: list[ir.DataType | None] = []
    for i in range(n_outputs):
        rule = rules[min(i, len(rules) - 1)]
        if isinstance(rule, int) and not isinstance(rule, ir.DataType):  # an input index
            tensor = inputs[rule] if rule < len(inputs) else None
            result.append(tensor.dtype if tensor is not None else None)
        else:
            result.append(rule)
    return result
