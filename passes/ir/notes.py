"""Notes a model carries for the report: what the load repaired, what a pass corrected.

Kept in the model's ``meta`` (never written to the file), one line each; the
pipeline adds them to the report's notes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx_ir as ir

__all__ = ["add_model_notes", "model_notes", "set_model_notes"]

_NOTES_KEY = "onnx_optimize.notes"


def model_notes(model: ir.Model) -> list[str]:
    """The notes left on ``model`` for the report: what the load repaired (see :mod:`passes.modelio.repair`),
    what a pass corrected (a declared shape the graph contradicts...), one line each."""
    return list(model.meta.get(_NOTES_KEY, ()))


def add_model_notes(model: ir.Model, notes: list[str]) -> None:
    """Adds ``notes`` to those :func:`model_notes` returns."""
    if notes:
        model.meta[_NOTES_KEY] = [*model.meta.get(_NOTES_KEY, ()), *notes]


def set_model_notes(model: ir.Model, notes: list[str]) -> None:
    """Replaces the notes :func:`model_notes` returns (when there are any)."""
    if notes:
        model.meta[_NOTES_KEY] = list(notes)
