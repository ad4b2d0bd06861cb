"""Sparse tensors as the dense tensors they stand for, at the protobuf edge.

onnx_ir cannot deserialize sparse tensors, so ``modelio.load_model`` densifies
them before building the IR (``densify_sparse_constants``): a
``Constant(sparse_value=S)`` becomes ``Constant(value=dense(S))``: a Constant's
output is always dense, so this does not change what the model computes.
(Sparse initializers are values of sparse type and stay what they are.)
"""

from __future__ import annotations

from collections.abc import Iterator

import onnx
import onnx.numpy_helper

from passes.ir.tensors import sparse_to_dense

__all__ = ["densify_sparse_constants"]

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
