"""Output-size estimates, so that no result is computed before its size is known.

Every candidate's outputs are sized before evaluation, from the shapes and
dtypes of its constant inputs and the values of the small ones:

* ``ConstantOfShape``, ``Expand``, ``Tile`` and ``Range`` by the rules below
  (exact; Range counts ``max(ceil((limit - start) / delta), 0)`` like the
  kernel, in Python integers or doubles, so no ratio overflows);
* ``Resize`` by the kernel's own output lengths (``refimpl.resize.output_shape``:
  its float scales are not data that inference is given);
* elementwise and broadcasting ops, ``Concat``, and the ops that only
  rearrange their input (``Reshape``, ``Transpose``...) from the input shapes
  alone, without the ~0.1 ms that inference costs per node;
* every other op by onnx's own shape inference for that one node
  (``onnx.shape_inference.infer_node_outputs``), given the input types and,
  as data, the values of the integer inputs of up to 65,536 elements and of
  every one-element input;
* ``NonZero`` and ``Compress``, whose output length depends on the data, by
  an upper bound (all elements selected).

When none of these bounds an output (an unknown dimension or rank, a failed
inference) the estimate raises :class:`Unbounded` and the node is not
evaluated. String elements count 64 bytes (an upper bound, not exact).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnx.numpy_helper
import onnx.shape_inference
import onnx_ir as ir

from passes.ir.schemas import expected_dtypes, schema_at
from passes.lazy import lazy_module

refimpl = lazy_module("refimpl")  # imported on the first fold (a graph with nothing to fold never needs its kernels)

__all__ = ["Estimate", "Unbounded", "estimate_outputs", "itemsize"]

#: Integer inputs up to this many elements are given to shape inference as data.
MAX_DATA_ELEMENTS = 1 << 16
#: What one string element counts for (a Python str object and its text).
STRING_ELEMENT_BYTES = 64

_DATA_DTYPES = frozenset({ir.DataType.INT64, ir.DataType.INT32})
_SCALAR_DTYPES = frozenset(
    {
        ir.DataType.INT64, ir.DataType.INT32, ir.DataType.INT16, ir.DataType.INT8,
        ir.DataType.UINT64, ir.DataType.UINT32, ir.DataType.UINT16, ir.DataType.UINT8,
        ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16, ir.DataType.BOOL,
    }
)  # fmt: skip

_Inputs = Sequence[ir.TensorProtocol | None]
Reader = Callable[[int], np.ndarray]


_Dims = Sequence["tuple[int, ...] | None"]


class Unbounded(Exception):
    """The outputs' size cannot be bounded before evaluating the node."""


@dataclasses.dataclass(slots=True)
class Estimate:
    """The outputs' shapes (as far as known) and byte counts, before evaluation.

    Attributes:
        shapes: Per output, its dims (an upper bound for a data-dependent
            dimension), or None where only the byte count is estimated.
        nbytes: Per output, the bytes its array takes (or at most takes).
        exact: Whether every size is exact rather than an upper bound.
    """

    shapes: tuple[tuple[int, ...] | None, ...]
    nbytes: tuple[int, ...]
    exact: bool

    @property
    def total(self) -> int:
        return sum(self.nbytes)


@functools.cache
def itemsize(dtype: ir.DataType) -> int:
    """Bytes per element of the numpy array of ``dtype`` (strings: an upper bound)."""
    if dtype == ir.DataType.STRING:
        return STRING_ELEMENT_BYTES
    return np.dtype(dtype.numpy()).itemsize


def _estimate(outputs: Sequence[tuple[Sequence[int], ir.DataType | None]], exact: bool) -> Estimate:
    shapes, nbytes = [], []
    for dims, dtype in outputs:
        size = 8 if dtype is None else itemsize(dtype)
        exact = exact and dtype is not None and dtype != ir.DataType.STRING
        shapes.append(tuple(dims))
        nbytes.append(math.prod(dims) * size)
    return Estimate(tuple(shapes), tuple(nbytes), exact)


#: What invalid inputs make: nothing, the kernel raises.
_REJECTED = Estimate(((0,),), (0,), exact=False)


# --- own rules -------------------------------------------------------------------------------------


def _small_ints(tensor: ir.TensorProtocol | None, read: Reader, index: int) -> list[int] | None:
    if tensor is None or tensor.size > MAX_DATA_ELEMENTS or tensor.dtype not in _DATA_DTYPES:
        return None
    return [int(v) for v in read(index).reshape(-1)]


def _constant_of_shape(
    op: str, opset: int, inputs: _Inputs, dims: _Dims, attrs: Mapping[str, Any], read: Reader
) -> Estimate | None:
    shape = _small_ints(inputs[0] if inputs else None, read, 0)
    if shape is None:
        return None
    if any(d < 0 for d in shape):
        return _REJECTED
    value = attrs.get("value")
    dtype = ir.DataType.FLOAT if value is None else ir.DataType.from_numpy(np.asarray(value).dtype)
    return _estimate([(shape, dtype)], exact=True)


def _expand(
    op: str, opset: int, inputs: _Inputs, dims: _Dims, attrs: Mapping[str, Any], read: Reader
) -> Estimate | None:
    if len(inputs) < 2 or inputs[0] is None:
        return None
    shape = _small_ints(inputs[1], read, 1)
    if shape is None:
        return None
    out = _broadcast([dims[0], tuple(shape)])
    if out is None:
        return _REJECTED
    return _estimate([(out, inputs[0].dtype)], exact=True)


def _tile(
    op: str, opset: int, inputs: _Inputs, dims: _Dims, attrs: Mapping[str, Any], read: Reader
) -> Estimate | None:
    if len(inputs) < 2 or inputs[0] is None:
        return None
    repeats = _small_ints(inputs[1], read, 1)
    x = dims[0]
    if repeats is None or x is None:
        return None
    if len(repeats) != len(x) or any(r < 0 for r in repeats):
        return _REJECTED
    return _estimate([([d * r for d, r in zip(x, repeats)], inputs[0].dtype)], exact=True)


def _range(
    op: str, opset: int, inputs: _Inputs, dims: _Dims, attrs: Mapping[str, Any], read: Reader
) -> Estimate | None:
    if len(inputs) < 3 or any(t is None or t.size != 1 for t in inputs[:3]):
        return _REJECTED
    values = [read(i).reshape(-1)[0] for i in range(3)]
    dtype = inputs[0].dtype
    if np.asarray(values[0]).dtype.kind in "iu":
        start, limit, delta = (int(v) for v in values)
        if delta == 0:
            return _REJECTED
        count = max(-((start - limit) // delta), 0)
    else:
        start, limit, delta = (float(v) for v in values)
        if delta == 0:
            return _REJECTED
        ratio = (limit - start) / delta
        if not math.isfinite(ratio):  # a NaN input, or finite inputs whose quotient overflows
            raise Unbounded(f"Range from {start} to {limit} by {delta} has no finite length")
        count = max(math.ceil(ratio), 0)
    return _estimate([([count], dtype)], exact=True)


def _resize(
    op: str, opset: int, inputs: _Inputs, dims: _Dims, attrs: Mapping[str, Any], read: Reader
) -> Estimate | None:
    """Resize: the kernel's own output lengths (scales are floats, which inference is not given)."""
    schema = schema_at(op, opset, "")
    x = inputs[0] if inputs else None
    if schema is None or x is None or dims[0] is None:
        return None
    if any(t is not None and t.size > MAX_DATA_ELEMENTS for t in inputs[1:]):
        return None
    others = [None if t is None else read(k) for k, t in enumerate(inputs) if k > 0]
    try:
        shape = refimpl.resize.output_shape(schema.since_version, dims[0], others, attrs)
    except (refimpl.RefImplError, refimpl.UnsupportedOpError):  # not evaluable: say so once, quietly
        return _REJECTED
    return _estimate([(shape, x.dtype)], exact=True)


def _elementwise(
    op: str, opset: int, inputs: _Inputs, dims: _Dims, attrs: Mapping[str, Any], read: Reader
) -> Estimate | None:
    """Ops whose one output has the broadcast shape of their inputs, in the schema's dtype."""
    if not inputs or any(t is None for t in inputs):
        return None  # an omitted optional input: leave it to shape inference
    # CastLike's second input gives only its type (often an empty tensor): the shape is the first's.
    out = tuple(dims[0]) if op == "CastLike" else _broadcast(dims)  # type: ignore[arg-type]  # none omitted
    if out is None:
        return _REJECTED
    if op == "Cast":
        dtype: ir.DataType | None = ir.DataType(int(attrs["to"])) if "to" in attrs else None
    elif op == "CastLike":
        dtype = inputs[1].dtype if len(inputs) > 1 else None
    else:
        dtype = expected_dtypes(op, "", opset, inputs, 1)[0]
    if dtype is None:
        return None
    return _estimate([(out, dtype)], exact=True)


def _same_elements(
    op: str, opset: int, inputs: _Inputs, dims: _Dims, attrs: Mapping[str, Any], read: Reader
) -> Estimate | None:
    """Ops that rearrange input 0's elements: as many bytes, shape left to the kernel's check."""
    x = inputs[0] if inputs else None
    if x is None or x.dtype == ir.DataType.STRING:
        return None
    count = math.prod(dims[0])
    return Estimate((None,), (count * itemsize(x.dtype),), exact=True)


def _concat(
    op: str, opset: int, inputs: _Inputs, dims: _Dims, attrs: Mapping[str, Any], read: Reader
) -> Estimate | None:
    if not inputs or any(t is None or t.dtype != inputs[0].dtype for t in inputs):
        return _REJECTED
    if inputs[0].dtype == ir.DataType.STRING:
        return None
    count = sum(math.prod(d) for d in dims)
    return Estimate((None,), (count * itemsize(inputs[0].dtype),), exact=True)


_UNARY = (
    "Abs Acos Acosh Asin Asinh Atan Atanh BitwiseNot Ceil Celu Cos Cosh Elu Erf Exp Floor Gelu "
    "HardSigmoid HardSwish IsInf IsNaN LeakyRelu Log Mish Neg Not Reciprocal Relu Round Selu "
    "Sigmoid Sign Sin Sinh Softplus Softsign Sqrt Tan Tanh ThresholdedRelu Cast CastLike"
)
_BROADCASTING = (
    "Add Sub Mul Div Pow Mod And Or Xor Equal Less LessOrEqual Greater GreaterOrEqual BitShift "
    "BitwiseAnd BitwiseOr BitwiseXor Where Max Min Sum Mean PRelu"
)
#: Ops each of whose output elements is a function of the inputs' elements at its index (broadcast).
ELEMENTWISE = frozenset((_UNARY + " " + _BROADCASTING).split())

_RULES: dict[
    str, Callable[[str, int, _Inputs, _Dims, Mapping[str, Any], Reader], Estimate | None]
] = {
    "ConstantOfShape": _constant_of_shape,
    "Expand": _expand,
    "Tile": _tile,
    "Range": _range,
    "Resize": _resize,
    "Concat": _concat,
    **{op: _elementwise for op in (*ELEMENTWISE, "Softmax", "LogSoftmax")},  # (the same shape)
    **{
        op: _same_elements
        for op in ("Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose")
    },
}


def _broadcast(shapes: Sequence[tuple[int, ...]]) -> tuple[int, ...] | None:
    """Numpy broadcasting of ``shapes`` in Python integers (no size limit), None if they clash."""
    first = shapes[0]
    for other in shapes:
        if other != first:
            break
    else:  # all equal: the common case, without the general loop
        return first if not first or min(first) >= 0 else None
    rank = max((len(s) for s in shapes), default=0)
    dims = []
    for axis in range(rank):
        sizes = {s[axis - rank + len(s)] for s in shapes if axis - rank + len(s) >= 0}
        sizes.discard(1)
        if len(sizes) > 1 or any(d < 0 for d in sizes):
            return None
        dims.append(sizes.pop() if sizes else 1)
    return tuple(dims)


# --- onnx shape inference of one node -----------------------------------------------------------


def _node_proto(node: ir.Node, n_inputs: int) -> onnx.NodeProto:
    proto = onnx.NodeProto(op_type=node.op_type, domain=node.domain)
    proto.input.extend(f"i{k}" if node.inputs[k] is not None else "" for k in range(n_inputs))
    proto.output.extend(f"o{k}" for k in range(len(node.outputs)))
    proto.attribute.extend(ir.serde.serialize_attribute(a) for a in node.attributes.values())
    return proto


def _data(tensor: ir.TensorProtocol, read: Reader, index: int) -> onnx.TensorProto | None:
    """The input as data for shape inference, if it is small and shape-like."""
    small_ints = tensor.dtype in _DATA_DTYPES and tensor.size <= MAX_DATA_ELEMENTS
    if not (small_ints or (tensor.size == 1 and tensor.dtype in _SCALAR_DTYPES)):
        return None
    return onnx.numpy_helper.from_array(np.ascontiguousarray(read(index)), f"i{index}")


def _inferred(
    node: ir.Node, domain: str, opset: int, inputs: _Inputs, dims: _Dims, read: Reader
) -> list[tuple[list[int] | None, ir.DataType | None]]:
    """What onnx infers for each output: dims (None if not all known) and dtype."""
    schema = schema_at(node.op_type, opset, domain)
    if schema is None:
        raise Unbounded(f"no schema for {node.op_type} at opset {opset}")
    types: dict[str, onnx.TypeProto] = {}
    data: dict[str, onnx.TensorProto] = {}
    for k, tensor in enumerate(inputs):
        if tensor is None:
            continue
        types[f"i{k}"] = onnx.helper.make_tensor_type_proto(int(tensor.dtype), dims[k])
        if (proto := _data(tensor, read, k)) is not None:
            data[f"i{k}"] = proto
    try:
        found = onnx.shape_inference.infer_node_outputs(
            schema,
            _node_proto(node, len(inputs)),
            types,
            data,
            opset_imports=[onnx.helper.make_opsetid(domain, opset)],
        )
    except (onnx.shape_inference.InferenceError, RuntimeError, ValueError, TypeError) as e:
        raise Unbounded(f"shape inference failed: {str(e).strip().splitlines()[0][:200]}") from e
    results: list[tuple[list[int] | None, ir.DataType | None]] = []
    for k in range(len(node.outputs)):
        type_proto = found.get(f"o{k}")
        if type_proto is None or not type_proto.HasField("tensor_type"):
            results.append((None, None))
            continue
        tensor_type = type_proto.tensor_type
        dtype = ir.DataType(tensor_type.elem_type) if tensor_type.elem_type else None
        out: list[int] | None = None
        if tensor_type.HasField("shape"):
            out = []
            for dim in tensor_type.shape.dim:
                if not dim.HasField("dim_value") or dim.dim_value < 0:
                    out = None
                    break
                out.append(int(dim.dim_value))
        results.append((out, dtype))
    return results


def _data_dependent_bound(op: str, dims: _Dims, k: int) -> list[int] | None:
    """An upper bound of output ``k``'s dims for ops whose length depends on the data."""
    x = dims[0] if dims else None
    if x is None or k != 0:
        return None
    if op == "NonZero":
        return [len(x), math.prod(x)]
    if op == "Compress":
        return [math.prod(x)]  # at most every element, whatever the axis
    return None


def estimate_outputs(
    node: ir.Node,
    domain: str,
    opset: int,
    inputs: _Inputs,
    dims: _Dims,
    attrs: Mapping[str, Any],
    read: Reader,
) -> Estimate:
    """The sizes the node's outputs will have, known before evaluating it.

    Args:
        node: The node (its op type, attributes and outputs are read).
        domain: Its normalised domain (``""`` for ONNX).
        opset: The version of that domain in the node's scope.
        inputs: The constant input tensors (None for omitted optional inputs).
        dims: Their dims (a ``TensorProto``-backed tensor recomputes its shape
            on every access, so the sweep passes them once).
        attrs: The attribute values as given to the kernel.
        read: Reads input ``i`` as an array (only small inputs are read).

    Raises:
        Unbounded: no rule and no inference bounds some output.
    """
    op = node.op_type
    rule = _RULES.get(op) if domain == "" else None
    if rule is not None and (estimate := rule(op, opset, inputs, dims, attrs, read)) is not None:
        return estimate
    inferred = _inferred(node, domain, opset, inputs, dims, read)
    schema_dtypes = expected_dtypes(op, domain, opset, inputs, len(node.outputs))
    outputs: list[tuple[Sequence[int], ir.DataType | None]] = []
    exact = True
    for k, (out, dtype) in enumerate(inferred):
        if out is None:
            out = _data_dependent_bound(op, dims, k) if domain == "" else None
            if out is None:
                raise Unbounded(f"shape inference leaves the shape of output {k} open")
            exact = False
        outputs.append((out, dtype or schema_dtypes[k] or node.outputs[k].dtype))
    return _estimate(outputs, exact)
