"""Declared shapes that a graph's own shape inference contradicts.

Exporters declare output and ``value_info`` shapes that the graph does not
compute (an OCR model declares ``[1, seqlen]`` for a ``[T, 1, 8210]`` output).
Load-time validation accepts a model whose only strict-inference failure is
such a declaration; the check compares the original's declarations with the
result's so that what the original declared is not blamed on the passes.
"""

from __future__ import annotations

import dataclasses
import re

import onnx

__all__ = ["SHAPE_CONFLICT", "ShapeConflict", "contradicts", "declared_dims", "declared_shape_conflicts"]


@dataclasses.dataclass(frozen=True)
class ShapeConflict:
    """A declared shape (a graph output's or a ``value_info``'s) that the graph's own inference contradicts."""

    name: str
    is_output: bool
    declared: tuple[int | str | None, ...]
    inferred: tuple[int | str | None, ...]

    def text(self) -> str:
        what = "output" if self.is_output else "value"
        return f"{what} {self.name!r} is declared {list(self.declared)} but its graph makes it {list(self.inferred)}"


SHAPE_CONFLICT = "Inferred shape and existing shape differ"


def declared_dims(type_proto: onnx.TypeProto) -> tuple[int | str | None, ...] | None:
    """A tensor type's declared shape: each dim its size, its name or None (unknown); None: no shape.

    A negative size (onnx-graphsurgeon's and tract's ``-1``) is an unknown dim, as onnxruntime reads
    it and as the load repairs it (:func:`passes.modelio.repair.unknown_negative_dims`): every reader
    of a file that was not loaded (the check's view of the original) reads it so too.
    """
    if not type_proto.HasField("tensor_type") or not type_proto.tensor_type.HasField("shape"):
        return None
    return tuple(
        (d.dim_value if d.dim_value >= 0 else None) if d.HasField("dim_value") else (d.dim_param or None)
        for d in type_proto.tensor_type.shape.dim
    )


def contradicts(declared: tuple[int | str | None, ...], inferred: tuple[int | str | None, ...]) -> bool:
    if len(declared) != len(inferred):
        return True
    return any(isinstance(a, int) and isinstance(b, int) and a != b for a, b in zip(declared, inferred))


def declared_shape_conflicts(proto: onnx.ModelProto, error: Exception) -> list[ShapeConflict]:
    """The main graph's declared shapes that strict inference contradicts, if they are its only failure.

    The declarations' shapes are dropped (their element types kept) and strict
    inference is run again: if that passes, the declarations were the only
    problem and each one that contradicts the inferred shape is returned.

    Raises:
        ``error``: the failure is something else (a type, an attribute, a subgraph...).
    """
    text = str(error)
    others = [line for line in re.split(r"\(op_type:", text)[1:] if SHAPE_CONFLICT not in line]
    if SHAPE_CONFLICT not in text or others:
        raise error
    view = onnx.ModelProto()
    view.CopyFrom(proto)
    constants = {t.name for t in proto.graph.initializer}  # their shapes are the tensors'
    for info in [*view.graph.value_info, *view.graph.output]:
        if info.type.HasField("tensor_type") and info.name not in constants:
            info.type.tensor_type.ClearField("shape")
    try:
        inferred_model = onnx.shape_inference.infer_shapes(view, check_type=True, strict_mode=True)
    except onnx.shape_inference.InferenceError:
        raise error from None
    inferred = {i.name: declared_dims(i.type) for i in [*inferred_model.graph.value_info, *inferred_model.graph.output]}
    outputs = {o.name for o in proto.graph.output}
    conflicts = []
    for info in [*proto.graph.output, *proto.graph.value_info]:
        declared, found = declared_dims(info.type), inferred.get(info.name)
        if declared is not None and found is not None and contradicts(declared, found):
            conflicts.append(ShapeConflict(info.name, info.name in outputs, declared, found))
    if not conflicts:
        raise error
    return conflicts
