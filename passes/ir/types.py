"""Element types: one table between ``ir.DataType`` and ONNX's ``tensor(...)`` type strings; the
initializers' types left to their tensors."""

from __future__ import annotations

import onnx
import onnx_ir as ir

from passes.ir import walk

__all__ = ["TYPE_STRINGS", "dtype_of_type_string", "type_string", "untype_initializers"]

#: ``ir.DataType`` -> ``"tensor(float)"``..., for every type the installed onnx knows.
TYPE_STRINGS: dict[ir.DataType, str] = {
    ir.DataType(value): f"tensor({name.lower()})"
    for name, value in onnx.TensorProto.DataType.items()
    if value != onnx.TensorProto.UNDEFINED and value in ir.DataType._value2member_map_
}
_BY_STRING = {text: dtype for dtype, text in TYPE_STRINGS.items()}


def type_string(dtype: ir.DataType) -> str | None:
    """``"tensor(float)"`` for FLOAT; None for a type onnx does not know."""
    return TYPE_STRINGS.get(dtype)


def dtype_of_type_string(text: str) -> ir.DataType | None:
    """FLOAT for ``"tensor(float)"``; None for a type parameter or a non-tensor type."""
    return _BY_STRING.get(text)


def untype_initializers(model: ir.Model) -> int:
    """Leaves the type and shape of each constant initializer to its tensor, in every graph; returns
    how many it untyped.

    onnx_ir types every initializer from its tensor as it loads, and writes a
    ``value_info`` for every typed value: without this, each weight would be
    stated twice in the output (its tensor and a value_info). An initializer
    that is a graph input or output keeps its type there. The last step of a
    run calls this (the clean-up, or the ``types`` step, whose prover reads the
    initializers' shapes).
    """
    untyped = 0
    for graph in walk.graphs(model):
        for value in graph.initializers.values():
            if (not value.is_graph_input() and not value.is_graph_output() and value.const_value is not None
                    and (value.type or value.shape)):
                value.type, value.shape = None, None
                untyped += 1
    return untyped
