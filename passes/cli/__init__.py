"""The ``optimize`` command: ``args`` builds the parser from the passes' declarations, ``command`` runs it."""

from __future__ import annotations

from passes.cli.command import main

__all__ = ["main"]
