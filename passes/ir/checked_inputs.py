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

__all__ = ["rejected"]


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


def rejected(op_type: str, index: int, array: np.ndarray) -> str | None:
    """Why a default-domain ``op_type`` node always rejects ``array`` as input ``index``, or None."""
    check = _CHECKS.get((op_type, index))
    return None if check is None else check(array)
