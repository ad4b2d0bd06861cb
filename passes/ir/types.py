"""Element types: one table between ``ir.DataType`` and ONNX's ``tensor(...)`` type strings."""

from __future__ import annotations

import onnx
import onnx_ir as ir

__all__ = ["TYPE_STRINGS", "dtype_of_type_string", "type_string"]

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
