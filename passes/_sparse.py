"""Sparse tensors as the dense tensors they stand for, at the protobuf edge.

onnx_ir cannot deserialize sparse tensors, so ``modelio.load_model`` densifies
them before building the IR (``densify_sparse_constants``): a
``Constant(sparse_value=S)`` becomes ``Constant(value=dense(S))``: a Constant's
output is always dense, so this does not change what the model computes.
(Sparse initializers are values of sparse type and stay what they are.)
"""

from __future__ import annotations

from collections.abc import Iterator

import math

import numpy as np
import onnx
import onnx.numpy_helper

__all__ = ["densify_sparse_constants", "sparse_to_dense"]

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


def _graphs(model: onnx.ModelProto) -> Iterator[onnx.GraphProto | onnx.FunctionProto]:
    stack: list[onnx.GraphProto | onnx.FunctionProto] = [model.graph, *model.functions]
    while stack:
        body = stack.pop()
        yield body
        for node in body.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    stack.append(attr.g)
                elif attr.type == onnx.AttributeProto.GRAPHS:
                    stack.extend(attr.graphs)


def densify_sparse_constants(model: onnx.ModelProto) -> int:
    """Rewrites every ``Constant(sparse_value=S)`` as ``Constant(value=dense(S))`` in place.

    Covers the main graph, all subgraphs and model-local functions. Meant to run
    on the protobuf before ``ir.serde.deserialize_model``.

    Returns:
        The number of Constant nodes rewritten.

    Raises:
        ValueError: a sparse tensor's indices do not fit its dims.
    """
    count = 0
    for body in _graphs(model):
        for node in body.node:
            if node.op_type != "Constant" or node.domain not in ("", "ai.onnx"):
                continue
            for i, attr in enumerate(node.attribute):
                if attr.name == "sparse_value" and attr.type == onnx.AttributeProto.SPARSE_TENSOR:
                    dense = onnx.numpy_helper.from_array(sparse_to_dense(attr.sparse_tensor))
                    node.attribute[i].CopyFrom(onnx.helper.make_attribute("value", dense))
                    count += 1
    return count
