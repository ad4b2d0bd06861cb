"""The base class of this project's passes: a name, a description, options and statistics.

Every pass is an ``onnx_ir.passes.InPlacePass``. On top of that a :class:`Pass`
carries what the pipeline, the CLI and the report need, from its
:class:`~passes.declarations.PassSpec` (``class FoldPass(Pass, spec=FOLD)``) or,
for a pass declared on its own class, from class attributes:

* ``NAME``: the name used by ``--passes``/``--skip`` and in the report;
* ``DESCRIPTION``: one line for ``--help``;
* ``OPTIONS``: its :class:`~passes.options.Option` declarations;
* ``REPEATS``: whether it repeats with its neighbours until none changes the model;
* ``EXACT``: whether its rewrites keep every result bit for bit (see ``PassSpec.exact``);

and after each call it holds ``stats``, a JSON-serialisable dict in one shape
for every pass (:func:`pass_stats`): ``applied`` (what it did, by rule or op),
``declined`` (what it looked at and left, by reason), then its own details.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import onnx_ir as ir

from passes.declarations import PassSpec
from passes.options import Option

__all__ = ["Pass", "pass_stats"]


class Pass(ir.passes.InPlacePass):
    """A pass of this project (see the module docstring)."""

    NAME: ClassVar[str] = ""
    DESCRIPTION: ClassVar[str] = ""
    OPTIONS: ClassVar[tuple[Option, ...]] = ()
    REPEATS: ClassVar[bool] = False
    EXACT: ClassVar[bool] = True

    stats: dict[str, Any]

    def __init_subclass__(cls, spec: PassSpec | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if spec is not None:
            cls.NAME, cls.DESCRIPTION, cls.OPTIONS = spec.name, spec.description, spec.options
            cls.REPEATS, cls.EXACT = spec.repeats, spec.exact

    def close(self) -> None:
        """Releases what the pass holds between its runs (fold: its onnxruntime child process).

        The pipeline calls it when its run ends; a pass used on its own releases it when it is
        garbage-collected."""

    @classmethod
    def from_options(cls, values: Mapping[str, Any]) -> Pass:
        """The pass built with the values of its declared options (defaults where absent)."""
        return cls(**{o.keyword: values.get(o.name, o.default) for o in cls.OPTIONS})


def pass_stats(applied: Mapping[str, int], declined: Mapping[str, int], **details: Any) -> dict[str, Any]:
    """The one shape of a pass's ``stats``: ``applied`` by rule (or op), ``declined`` by reason
    (zero counts left out, keys sorted), then the pass's own details."""
    return {
        "applied": {k: v for k, v in sorted(applied.items()) if v},
        "declined": {k: v for k, v in sorted(declined.items()) if v},
        **details,
    }
