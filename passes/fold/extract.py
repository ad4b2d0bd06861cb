"""The model onnxruntime computes a batch of folds with (see :mod:`passes.fold.confirm`).

One protobuf, written directly (a sweep may send thousands of nodes: onnx_ir's
objects would cost more than onnxruntime's session): the folds' nodes in sweep
order, named ``n0``, ``n1``... (a session error names the node at fault), the
opsets of their scope; what a fold reads that the model does not compute (an
initializer, a Constant, a fold of an earlier batch or one onnxruntime does not
compute) is an initializer holding the tensor the fold read, or, for a
constant in a file or of :data:`RAW_OVER` bytes or more, an input the child
reads from a file (:func:`_raw`): the parent never holds a second copy and
the protobuf stays small.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from passes.fold.pending import Fold

__all__ = ["INLINE_BYTES", "RAW_OVER", "Written", "write"]


Written = tuple[dict[str, Any], dict[str, tuple[Fold, int]], dict[str, Fold], int]


def write(folds: Sequence[Fold], targets: Sequence[Fold], chained: Callable[[ir.Value | None], Fold | None],
          ir_version: int, folder: str) -> Written:  # fmt: skip
    """Saves the model computing ``folds`` (in sweep order; ``chained(v)`` is the one of them computing
    ``v``, if any) whose outputs are the results of ``targets``, in ``folder``.

    Returns:
        The worker's request, the model's outputs by name with the fold and output index they
        stand for, its nodes by name with their folds, and the bytes of constants it reads.
    """
    model = onnx.ModelProto(ir_version=ir_version, producer_name="onnx-optimize")
    for domain, version in targets[0].opsets.items():
        model.opset_import.add(domain=domain, version=version)
    graph = model.graph
    graph.name = "folded_constants"
    mapped: dict[ir.Value, str] = {}
    nodes: dict[str, Fold] = {}
    raw: dict[str, dict[str, Any]] = {}
    nbytes = inline = 0
    for fold in folds:
        inputs: list[str] = []
        for value, tensor in zip(fold.inputs, fold.tensors):
            if value is None:
                inputs.append("")
                continue
            name = mapped.get(value)
            if name is None:
                assert chained(value) is None and tensor is not None
                name = mapped[value] = f"c{len(mapped)}"
                size = int(tensor.nbytes)
                nbytes += size
                found = _raw(tensor, folder, name, force=inline + size > INLINE_BYTES)
                if isinstance(found, dict):
                    graph.input.append(onnx.helper.make_tensor_value_info(
                        name, int(tensor.dtype), [int(d) for d in tensor.shape.dims]))  # fmt: skip
                    raw[name] = found
                else:
                    proto = ir.serde.serialize_tensor(found)
                    proto.name = name
                    graph.initializer.append(proto)
                    inline += size
            inputs.append(name)
        node = fold.node
        outputs = [f"v{len(mapped) + i}" for i in range(len(fold.outputs))]
        for i, name in enumerate(outputs):
            mapped[fold.outputs[i]] = name
            made = fold.made[i]
            if made is not None:
                mapped[made] = name
        proto_node = graph.node.add(op_type=node.op_type, domain=fold.domain, name=f"n{len(graph.node)}",
                                    input=inputs, output=outputs)  # fmt: skip
        nodes[proto_node.name] = fold
        if node.overload:
            proto_node.overload = node.overload
        for attr in node.attributes.values():
            proto_node.attribute.append(ir.serde.serialize_attribute(attr))
    names: dict[str, tuple[Fold, int]] = {}
    for fold in targets:
        for index, array in enumerate(fold.arrays):
            if array is not None:
                name = mapped[fold.outputs[index]]
                names[name] = (fold, index)
                graph.output.add(name=name)
    path = os.path.join(folder, "constants.onnx")
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    request = {"op": "constants", "model": path, "names": list(names), "folder": folder, "raw": raw}
    return request, names, nodes, nbytes


#: Constants of this many bytes or more are read by the child from a file (see :func:`write`).
RAW_OVER = 1 << 20
#: Inline constants of one model add up to at most this (the rest is read from files too).
INLINE_BYTES = 256 << 20
_NO_RAW = frozenset({ir.DataType.STRING, ir.DataType.UNDEFINED})


def _raw(tensor: ir.TensorProtocol, folder: str, name: str, force: bool = False) -> dict[str, Any] | ir.TensorProtocol:
    """Where the child reads a tensor from (path, offset, dtype, shape), or the tensor to inline.

    A tensor in a file (external data, a weight left in the model file) is read
    by the child from that file; one in memory of :data:`RAW_OVER` bytes or more
    (or any, when ``force``: the inline ones add up to :data:`INLINE_BYTES`) from a file written here; a smaller one is inlined, as is a string or 4-bit
    tensor (read here if it is in a file: the model is saved elsewhere).
    """
    from passes.ir.tensors import contained_path, is_file_backed, read_external

    in_file = is_file_backed(tensor)
    if tensor.dtype in _NO_RAW or tensor.dtype.bitwidth < 8:
        if in_file:
            assert isinstance(tensor, ir.ExternalTensor)
            return ir.tensor(read_external(tensor), dtype=tensor.dtype)
        return tensor
    if not in_file and int(tensor.nbytes) < RAW_OVER and not force:
        return tensor
    description = {"dtype": tensor.dtype.numpy().name, "shape": [int(d) for d in tensor.shape.dims]}
    if in_file:
        assert isinstance(tensor, ir.ExternalTensor)
        return {"path": contained_path(tensor), "offset": int(tensor.offset or 0), **description}
    path = os.path.join(folder, f"{name}.bin")
    np.ascontiguousarray(tensor.numpy()).tofile(path)
    return {"path": path, "offset": 0, **description}
