"""A fold pending its confirmation: the record a sweep makes and onnxruntime judges.

A sweep that replaces a node by constants records a :class:`Fold` (the node, what it read, what
replaced its outputs); :mod:`passes.fold.extract` writes the model onnxruntime computes a batch of
them with and :mod:`passes.fold.confirm` judges them, keeping or undoing each. Ops that only move
bytes (:data:`EXEMPT`) are trusted as long as their inputs are and never sent to onnxruntime. This
module is the lowest of the three: it imports neither.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np
import onnx_ir as ir

__all__ = ["EXEMPT", "Fold", "is_exempt"]

#: Default-domain ops whose kernels only move bytes, or read a static shape: never sent to onnxruntime.
EXEMPT: frozenset[str] = frozenset({
    "Concat", "ConstantOfShape", "Expand", "Flatten", "Gather", "Identity", "Reshape", "Shape", "Size",
    "Slice", "Split", "Squeeze", "Tile", "Transpose", "Unsqueeze",
})  # fmt: skip


def is_exempt(op_type: str, domain: str) -> bool:
    """Whether an op of ``domain`` only moves bytes (:data:`EXEMPT`): never sent to onnxruntime."""
    return domain == "" and op_type in EXEMPT


@dataclasses.dataclass(eq=False)
class Fold:
    """One node replaced by constants during a sweep, until it is settled.

    Attributes:
        node: The node (dropped from its graph, not yet removed).
        domain: Its normalised domain.
        opsets: The opset imports of its scope.
        inputs: Its inputs when it was folded.
        tensors: Their constant tensors (None for an omitted input or, for a
            Shape/Size fold, a non-constant one).
        outputs: Its outputs, replaced by ``made``.
        made: The constant values that replaced them (None where unused).
        arrays: The folded results (None where unused).
    """

    node: ir.Node
    domain: str
    opsets: Mapping[str, int]
    inputs: tuple[ir.Value | None, ...]
    tensors: Sequence[ir.TensorProtocol | None]
    outputs: tuple[ir.Value, ...]
    made: Sequence[ir.Value | None]
    arrays: Sequence[np.ndarray | None]

    @property
    def op_type(self) -> str:
        return self.node.op_type

    @property
    def exempt(self) -> bool:
        return is_exempt(self.node.op_type, self.domain)
