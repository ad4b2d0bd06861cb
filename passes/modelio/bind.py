"""Binding a loaded model's external tensors to its folder (:func:`bind_external_tensors`).

After validation, the load hands the IR model here: initializers stay memory-mapped over their
data files (the save copies them with the kernel), a large external ``Constant`` becomes an
initializer of its graph over the same tensor, and every other tensor a node attribute holds
(in any graph or function) is read into memory, since onnx_ir writes only initializers as
external data. Split from :mod:`passes.modelio.load`, which calls it once per file it loads.
"""

from __future__ import annotations

import pathlib
from typing import TYPE_CHECKING

from passes.lazy import lazy_module

if TYPE_CHECKING:
    import onnx_ir as ir
else:
    ir = lazy_module("onnx_ir")
weights = lazy_module("passes.modelio.weights")
views = lazy_module("passes.modelio.views")

__all__ = ["bind_external_tensors"]


def bind_external_tensors(model: ir.Model, base_dir: pathlib.Path) -> None:
    """Resolves every external tensor against the model's folder.

    Initializers stay memory-mapped (saving keeps them external), and so does
    the value of a large ``Constant`` of the main graph or its subgraphs, which
    becomes an initializer of its graph (:func:`_constant_to_initializer`). Any
    other tensor held by a node attribute (in any graph or function) is read
    into memory now: onnx_ir only writes initializers to external data, and
    would otherwise save a reference to the input's data file, or resolve a
    function's tensor against the working directory.
    """
    ir.external_data.set_base_dir(model.graph, str(base_dir))
    for root in (model.graph, *model.functions.values()):
        for node in list(ir.traversal.RecursiveGraphIterator(root)):
            if root is model.graph and model.ir_version >= 4 and _large_external_constant(node):
                _constant_to_initializer(node, base_dir)
                continue
            for attr in node.attributes.values():
                if attr.is_ref():
                    continue
                if attr.type == ir.AttributeType.TENSOR and isinstance(attr.value, ir.ExternalTensor):
                    node.attributes[attr.name] = ir.AttrTensor(attr.name, weights.in_memory(attr.value, base_dir))
                elif attr.type == ir.AttributeType.TENSORS and any(
                    isinstance(t, ir.ExternalTensor) for t in attr.value
                ):
                    tensors = [weights.in_memory(t, base_dir) for t in attr.value]
                    node.attributes[attr.name] = ir.AttrTensors(attr.name, tensors)
                elif attr.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) and (
                    root is not model.graph  # functions' subgraphs are not saved as external data
                ):
                    for graph in attr.value if attr.type == ir.AttributeType.GRAPHS else [attr.value]:
                        for value in graph.initializers.values():
                            value.const_value = weights.in_memory(value.const_value, base_dir)


def _large_external_constant(node: ir.Node) -> bool:
    """Whether ``node`` is a ``Constant`` whose ``value`` is an external tensor over ``views.LARGE`` bytes."""
    if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or node.graph is None:
        return False
    attr = node.attributes.get("value")
    return (len(node.attributes) == 1 and isinstance(attr, ir.Attr) and not attr.is_ref()
            and attr.type == ir.AttributeType.TENSOR and isinstance(attr.value, ir.ExternalTensor)
            and attr.value.nbytes > views.LARGE and attr.value.dtype != ir.DataType.STRING)  # fmt: skip


def _constant_to_initializer(node: ir.Node, base_dir: pathlib.Path) -> None:
    """Replaces a large external ``Constant`` by an initializer of its graph over the same external tensor.

    Read into memory, a 256 MiB Constant in an If branch was written inline and
    serialised three times over (1.4 GB peak RSS); an initializer stays
    memory-mapped and is saved as external data, copied by the kernel, like
    every external weight. The value computed is the same.
    """
    graph = node.graph
    tensor = node.attributes["value"].value
    tensor.base_dir = str(base_dir)
    (output,) = node.outputs
    weight = ir.Value(name=output.name, shape=output.shape, type=output.type, const_value=tensor)
    if weight.shape is None:
        weight.shape = ir.Shape(tensor.shape)
    if weight.type is None:
        weight.type = ir.TensorType(tensor.dtype)
    output.replace_all_uses_with(weight, replace_graph_outputs=True)
    graph.remove(node, safe=True)
    graph.register_initializer(weight)
