"""Modules imported on first use, for modules that must stay cheap to import.

``lazy_module("onnx")`` stands for the module everywhere a module-level
``import onnx`` would: an attribute read imports it (once) and reads it from
the real module, so ``onnx.checker.check_model``, ``isinstance(x, ir.Model)``
and ``except onnx.checker.ValidationError`` keep working, and a test that
patches the real module is seen. ``--help`` then never imports onnx.
"""

from __future__ import annotations

import importlib
import types
from typing import Any

__all__ = ["lazy_module"]


class _LazyModule:
    __slots__ = ("_name", "_module")

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_module", None)

    def _load(self) -> types.ModuleType:
        module = self._module
        if module is None:
            module = importlib.import_module(self._name)
            object.__setattr__(self, "_module", module)
        return module

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._load(), attr)

    def __setattr__(self, attr: str, value: Any) -> None:
        setattr(self._load(), attr, value)

    def __delattr__(self, attr: str) -> None:
        delattr(self._load(), attr)

    def __repr__(self) -> str:
        return f"<lazy module {self._name!r}{' (imported)' if self._module is not None else ''}>"


def lazy_module(name: str) -> Any:
    """A stand-in for module ``name`` that imports it on first attribute access."""
    return _LazyModule(name)
