"""``--dim NAME=SIZE`` against the model: a name the model does not have is refused, not ignored.

The check's size plan (:mod:`passes.verify.plan`) sizes the named dims of the
main graph's inputs (those that are not initializers); a ``--dim`` for any
other name would change nothing, silently. It is refused right after the
model is loaded, before anything is written, with the names the model has.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from passes.errors import InputError
from passes.options import short

if TYPE_CHECKING:
    import onnx_ir as ir

__all__ = ["dim_names", "refuse_unknown_dims"]


def dim_names(model: ir.Model) -> list[str]:
    """The named (symbolic) dims of the main graph's inputs that are not initializers, in order of appearance."""
    graph = model.graph
    names: dict[str, None] = {}
    for value in graph.inputs:
        if value.name in graph.initializers or value.shape is None:
            continue
        for dim in value.shape:
            name = getattr(dim, "value", None)
            if isinstance(name, str) and name:
                names.setdefault(name)
    return list(names)


def refuse_unknown_dims(model: ir.Model, dims: Mapping[str, int | Sequence[int]]) -> None:
    """Raises :class:`InputError` (exit 2) for the first ``dims`` name the model's inputs do not have."""
    if not dims:
        return
    known = dim_names(model)
    for name, size in dims.items():
        size = size if isinstance(size, int) else ",".join(map(str, size))
        if name not in known:
            listed = ", ".join(short(n) for n in known[:20]) + (", ..." if len(known) > 20 else "")
            have = f"its dim names: {listed}" if known else "its inputs have no named dims"
            raise InputError(f"--dim {short(f'{name}={size}')}: the model has no dim named {short(name)} ({have})")
