"""Sparse Constants kept as they are, through an IR that cannot hold them.

onnx_ir cannot deserialize a sparse tensor attribute, and densifying
``Constant(sparse_value=S)`` at load, as this module used to, turned a
142-byte model whose constant stands for 1 GiB into a 1 GiB output (three of
them crashed the save after 6 GB). Instead, before the IR is built,
:func:`stash` replaces each such node (main graph, subgraphs, functions) by a
placeholder that no pass can read as a constant: a node of the private domain
:data:`DOMAIN` with no inputs, whose output keeps the dense type and shape
(so shape inference and the passes still know them), and whose only attribute
names the stashed original. The original node proto is kept in
``ir.Model.meta``; :func:`restore` puts it back, byte for byte, on every
serialisation of the model (its output and node name as the passes left
them). The passes never densify a stashed sparse constant: folding through
one is given up.

A small one (:data:`DENSE_LIMIT` bytes or less once dense, e.g. the 4 values
of a toy model) is not stashed but becomes ``Constant(value=dense)`` at load,
the same tensor written densely: it folds like any Constant, and the output
grows by at most that much per constant.
"""

from __future__ import annotations

from collections.abc import Iterator

import onnx
import onnx.numpy_helper
import onnx_ir as ir

__all__ = [
    "DOMAIN", "STASH_KEY", "attach_types", "densify_placeholders", "densify_sparse_constants", "restore", "stash",
]

#: The placeholder's domain and op type (never written: :func:`restore` replaces the node).
DOMAIN = "onnx_optimize.stashed"
_OP_TYPE = "SparseConstant"
_KEY_ATTR = "stash_key"
#: Key of the stashed nodes in ``ir.Model.meta`` (not serialised by onnx_ir).
STASH_KEY = "onnx_optimize.sparse_constants"
#: A sparse Constant of at most this many bytes once dense is made dense at load (and folds).
DENSE_LIMIT = 1 << 16


def _bodies(model: onnx.ModelProto) -> Iterator[onnx.GraphProto | onnx.FunctionProto]:
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


def _is_sparse_constant(node: onnx.NodeProto) -> bool:
    return (
        node.op_type == "Constant" and node.domain in ("", "ai.onnx") and len(node.output) == 1
        and any(a.name == "sparse_value" and a.type == onnx.AttributeProto.SPARSE_TENSOR for a in node.attribute)
    )  # fmt: skip


def stash(model: onnx.ModelProto) -> dict[str, bytes]:
    """Replaces every sparse Constant of ``model`` by a placeholder, in place; returns the originals by key.

    A sparse value stored as external data cannot be stashed (the restored node
    would refer to the input's data file from the output's folder): such a
    model is left as it is, and onnx_ir then refuses it.
    """
    stashed: dict[str, bytes] = {}
    for body in _bodies(model):
        found = False
        for node in body.node:
            if not _is_sparse_constant(node):
                continue
            attr = next(a for a in node.attribute if a.name == "sparse_value")
            if any(t.data_location == onnx.TensorProto.EXTERNAL
                   for t in (attr.sparse_tensor.values, attr.sparse_tensor.indices)):  # fmt: skip
                continue
            if _densify_small(node, attr):
                continue
            key = str(len(stashed))
            stashed[key] = node.SerializeToString()
            sparse = attr.sparse_tensor
            del node.attribute[:]
            node.attribute.append(onnx.helper.make_attribute(_KEY_ATTR, key))
            node.attribute.append(onnx.helper.make_attribute("dtype", sparse.values.data_type))
            node.attribute.append(onnx.helper.make_attribute("dims", list(sparse.dims)))
            node.op_type, node.domain = _OP_TYPE, DOMAIN
            found = True
        if found and isinstance(body, onnx.FunctionProto):
            body.opset_import.add(domain=DOMAIN, version=1)
    if stashed:
        model.opset_import.add(domain=DOMAIN, version=1)
    return stashed


def _densify_small(node: onnx.NodeProto, attr: onnx.AttributeProto) -> bool:
    """Rewrites ``node`` as ``Constant(value=dense)`` if its sparse value is at most :data:`DENSE_LIMIT`
    bytes dense and well formed; whether it did."""
    from passes.ir.tensors import sparse_to_dense

    sparse = attr.sparse_tensor
    try:
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(sparse.values.data_type).itemsize
    except (KeyError, TypeError, ValueError):
        return False
    count = 1
    for d in sparse.dims:
        count *= max(int(d), 0)
    if count * itemsize > DENSE_LIMIT or any(int(d) < 0 for d in sparse.dims):
        return False
    try:
        indices = onnx.numpy_helper.to_array(sparse.indices)
        if indices.size and int(indices.min()) < 0:
            return False  # malformed (numpy would count from the end)
        value = onnx.numpy_helper.from_array(sparse_to_dense(sparse))
    except (ValueError, IndexError, TypeError):
        return False  # malformed, or a type numpy cannot hold: stashed as it is
    del node.attribute[:]
    node.attribute.append(onnx.helper.make_attribute("value", value))
    return True


def _placeholders(model: ir.Model) -> Iterator[ir.Node]:
    for root in (model.graph, *model.functions.values()):
        for node in ir.traversal.RecursiveGraphIterator(root):
            if node.domain == DOMAIN and node.op_type == _OP_TYPE:
                yield node


def attach_types(model: ir.Model) -> None:
    """Gives each placeholder's output the dense type and shape of the constant it stands for."""
    for node in _placeholders(model):
        dtype = ir.DataType(node.attributes["dtype"].value)
        output = node.outputs[0]
        output.type = ir.TensorType(dtype)
        output.shape = ir.Shape(list(node.attributes["dims"].value))


def restore(proto: onnx.ModelProto, stashed: dict[str, bytes]) -> None:
    """Puts the stashed sparse Constants back in place of their placeholders in ``proto``."""
    if not stashed:
        return
    for body in _bodies(proto):
        for node in body.node:
            if node.domain != DOMAIN or node.op_type != _OP_TYPE:
                continue
            key = next((a.s.decode() for a in node.attribute if a.name == _KEY_ATTR), None)
            original = onnx.NodeProto.FromString(stashed[key])
            original.output[0] = node.output[0]
            original.name = node.name
            node.CopyFrom(original)
        if isinstance(body, onnx.FunctionProto):
            _drop_domain(body.opset_import)
    _drop_domain(proto.opset_import)


def _drop_domain(imports) -> None:  # noqa: ANN001  a repeated OperatorSetIdProto field
    for entry in [e for e in imports if e.domain == DOMAIN]:
        imports.remove(entry)


def densify_placeholders(model: ir.Model) -> int:
    """Turns the placeholders of ``model`` into dense ``Constant(value=...)`` nodes; returns how many.

    For an ``ir.Model`` handed to a caller, who would serialise it without
    :func:`restore`: onnx_ir cannot hold the sparse form, so the dense one is
    the only valid one there.
    """
    from passes.ir.tensors import sparse_to_dense

    stashed = model.meta.get(STASH_KEY, {})
    count = 0
    for node in list(_placeholders(model)):
        original = onnx.NodeProto.FromString(stashed[node.attributes[_KEY_ATTR].value])
        sparse = next(a for a in original.attribute if a.name == "sparse_value").sparse_tensor
        dense = ir.Tensor(sparse_to_dense(sparse), name=node.outputs[0].name)
        for name in [_KEY_ATTR, "dtype", "dims"]:
            node.attributes.pop(name, None)
        node.attributes["value"] = ir.AttrTensor("value", dense)
        node.op_type, node.domain = "Constant", ""
        count += 1
    if count:
        model.opset_imports.pop(DOMAIN, None)
        for function in model.functions.values():
            function.opset_imports.pop(DOMAIN, None)
    return count


def densify_sparse_constants(model: onnx.ModelProto) -> int:
    """Rewrites every ``Constant(sparse_value=S)`` as ``Constant(value=dense(S))`` in place.

    Not used by the loader any more (see the module docstring); kept for callers
    that want the dense form of a small model. Covers the main graph, subgraphs
    and model-local functions.

    Returns:
        The number of Constant nodes rewritten.

    Raises:
        ValueError: a sparse tensor's indices do not fit its dims, or it is too large to densify.
    """
    from passes.ir.tensors import sparse_to_dense

    count = 0
    for body in _bodies(model):
        for node in body.node:
            if node.op_type != "Constant" or node.domain not in ("", "ai.onnx"):
                continue
            for i, attr in enumerate(node.attribute):
                if attr.name == "sparse_value" and attr.type == onnx.AttributeProto.SPARSE_TENSOR:
                    dense = onnx.numpy_helper.from_array(sparse_to_dense(attr.sparse_tensor))
                    node.attribute[i].CopyFrom(onnx.helper.make_attribute("value", dense))
                    count += 1
    return count
