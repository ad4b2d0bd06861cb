"""onnxruntime's bits, adopted for a folded value, carried through the byte-moving folds that read it.

When the confirmation writes onnxruntime's bits for a fold (they agree with refimpl's within
ULPs but differ: another Cos, a sum in another order), the exempt folds of the same batch
(:data:`passes.fold.pending.EXEMPT`: ops that only move bytes) that read that value were
computed during the sweep from refimpl's bits, and onnxruntime never saw them. A rotary table
(Cos of the positions, then Unsqueeze) was written with refimpl's Cos moved, one ULP from
what the original computes in onnxruntime. :func:`carried` computes those exempt folds again,
in sweep order, from the adopted arrays, so a chain of them carries onnxruntime's bits to the
value that is written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx_ir as ir

from passes.fold.pending import Fold
from passes.ir.tensors import attribute_values
from passes.lazy import lazy_module

refimpl = lazy_module("refimpl")  # imported on the first fold (a graph with nothing to fold never needs its kernels)

__all__ = ["carried"]


def carried(folds: Sequence[Fold], adopted: Mapping[ir.Value, np.ndarray]) -> dict[ir.Value, np.ndarray]:
    """The new results of the exempt ``folds`` that read an ``adopted`` value, directly or through each other.

    ``folds`` are a batch's kept folds in sweep order (a fold comes after those it reads);
    ``adopted`` maps a folded value to onnxruntime's array for it. Returns each made value of
    an exempt fold that changes, with its array computed again by refimpl (a byte-moving kernel:
    the same bytes moved, now onnxruntime's).
    """
    changed: dict[ir.Value, np.ndarray] = dict(adopted)
    result: dict[ir.Value, np.ndarray] = {}
    for fold in folds:
        if not fold.exempt or not any(v in changed for v in fold.inputs if v is not None):
            continue
        arrays = [changed[v] if v is not None and v in changed else None if t is None else t.numpy()
                  for v, t in zip(fold.inputs, fold.tensors)]  # fmt: skip
        attrs, opset = attribute_values(fold.node), fold.opsets.get("")
        assert attrs is not None and opset is not None  # it was folded with them
        outputs = refimpl.run(fold.op_type, arrays, attrs, opset=opset, num_outputs=len(fold.outputs))
        for made, array in zip(fold.made, outputs):
            if made is not None and array is not None:
                changed[made] = result[made] = np.asarray(array)
    return result
