"""Initializers listed as main-graph inputs, made constants.

The IR spec makes an initializer that is also a graph input a default a caller
may override. Below IR 4 every initializer had to be listed as an input, and
onnxruntime treats them as constants there (it lets no caller feed them); from
IR 4 on it follows the spec. The load makes those of an IR < 4 model constants
(:func:`passes.modelio.validate_proto`, :func:`passes.modelio.repair_in_memory`), as the
runtime does, so that the upgrade to a later IR does not make them overridable;
``simplify``'s opt-in ``freeze_initializer_inputs`` does the same for an IR >= 4 model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the load imports this module before the command defers sympy
    import onnx_ir as ir

__all__ = ["constant_inputs_note", "freeze_initializer_inputs"]

#: The first IR version whose runtime lets a caller override an initializer listed as an input.
OVERRIDABLE_SINCE = 4


def freeze_initializer_inputs(model: ir.Model) -> list[str]:
    """Takes the main graph's initializer-backed inputs out of its inputs, in place; their names.

    They stay initializers (constants that fold and fuse like any weight); the IR version
    becomes at least 4, below which every initializer must be an input.
    """
    graph = model.graph
    frozen = [value for value in graph.inputs if value.is_initializer()]
    for value in frozen:
        graph.inputs.remove(value)
    if frozen:
        model.ir_version = max(model.ir_version, OVERRIDABLE_SINCE)
    return [value.name or "" for value in frozen]


def constant_inputs_note(names: list[str], ir_version: int) -> str | None:
    """The report's note for the inputs :func:`freeze_initializer_inputs` (or the load's proto form)
    took out of a model of ``ir_version`` (below 4); None for none."""
    if not names:
        return None
    shown = ", ".join(repr(n) for n in names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return (f"ir_version {ir_version}: the {len(names)} initializers also listed as graph inputs are constants, "
            f"as onnxruntime runs them below IR 4 (no caller can feed them), so they are no longer inputs: {shown}")
