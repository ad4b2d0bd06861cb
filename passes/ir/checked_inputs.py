"""Input values an op rejects whenever it runs: a constant must never be made of one.

onnx's shape inference checks these values once they are constant (a Reshape
target of ``[-2, 8]`` makes the model invalid), while a model that computes
them only fails when it runs. A pass that would turn such a computed value
into a constant (folding it, or a simplification that writes a target) leaves
it computed instead, so the output is as valid as the input was.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

__all__ = ["AXES_INPUTS", "rejected"]


def _reshape_target(target: np.ndarray) -> str | None:
    flat = target.reshape(-1)
    if target.ndim != 1 or target.dtype.kind not in "iu":
        return f"a Reshape target of shape {list(target.shape)} and type {target.dtype}"
    if np.any(flat < -1) or np.count_nonzero(flat == -1) > 1:
        return f"the Reshape target {flat.tolist()[:8]}"
    return None


#: By (default-domain op type, input index): why a value is rejected, or None.
_CHECKS: Mapping[tuple[str, int], Callable[[np.ndarray], str | None]] = {
    ("Reshape", 1): _reshape_target,
}

_REDUCE_OPS = ("ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean", "ReduceMin",
               "ReduceProd", "ReduceSum", "ReduceSumSquare")  # fmt: skip
#: By (default-domain op type, input index) of an ``axes`` input: how much the output's rank adds
#: to the data's (Unsqueeze's axes index the output, whose rank is the data's plus len(axes)).
AXES_INPUTS: Mapping[tuple[str, int], bool] = {
    **{(op, 1): False for op in _REDUCE_OPS},
    ("Squeeze", 1): False,
    ("Unsqueeze", 1): True,
    ("Slice", 3): False,
}


def _axes(array: np.ndarray, rank: int, adds_rank: bool) -> str | None:
    """Axes out of ``[-r, r-1]`` (``r`` the rank they index) or repeated: shape inference rejects them."""
    flat = array.reshape(-1)
    if array.ndim > 1 or array.dtype.kind not in "iu":
        return f"axes of shape {list(array.shape)} and type {array.dtype}"
    r = rank + (flat.size if adds_rank else 0)
    if np.any(flat < -r) or np.any(flat >= r):
        return f"the axes {flat.tolist()[:8]} for rank {r}"
    if len(set((flat % max(r, 1)).tolist())) != flat.size:
        return f"the repeated axes {flat.tolist()[:8]}"
    return None


def rejected(op_type: str, index: int, array: np.ndarray, data_rank: int | None = None) -> str | None:
    """Why a default-domain ``op_type`` node always rejects ``array`` as input ``index``, or None.

    ``data_rank``: the rank of the node's first input, when known, against which ``axes``
    inputs are checked.
    """
    check = _CHECKS.get((op_type, index))
    if check is not None:
        return check(array)
    adds_rank = AXES_INPUTS.get((op_type, index))
    if adds_rank is not None and data_rank is not None:
        return _axes(array, data_rank, adds_rank)
    return None
