"""Modules imported on first use, for modules that must stay cheap to import.

``lazy_module("onnx")`` stands for the module everywhere a module-level
``import onnx`` would: an attribute read imports it (once) and reads it from
the real module, so ``onnx.checker.check_model``, ``isinstance(x, ir.Model)``
and ``except onnx.checker.ValidationError`` keep working, and a test that
patches the real module is seen. ``--help`` then never imports onnx.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from typing import Any

__all__ = ["defer_import", "lazy_module"]


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


class _DeferredModule(types.ModuleType):
    """In ``sys.modules`` in place of a module not imported yet; the first attribute read imports it.

    ``import NAME`` elsewhere then binds this stand-in without running the module. The
    import system reads only ``__spec__`` (set here, so it does not count as a use); any other
    attribute, ``__path__`` included (a submodule's import), puts the real module in
    ``sys.modules`` and reads from it, so every later ``import NAME`` gets the real one and this
    stand-in forwards to it.
    """

    def __getattr__(self, attr: str) -> Any:
        name = self.__name__
        real = sys.modules.get(name)
        if real is self or real is None:
            sys.modules.pop(name, None)
            try:
                real = importlib.import_module(name)
            except BaseException:
                sys.modules.setdefault(name, self)
                raise
        return getattr(real, attr)


def defer_import(*names: str) -> None:
    """Puts a stand-in for each module of ``names`` in ``sys.modules``, so that a library's
    module-level ``import NAME`` costs nothing until an attribute of it is read.

    For the command's own process only (:mod:`passes.cli.command`): onnx_ir imports sympy
    (0.35-0.4 s, a third of a small model's run) for symbolic-dim arithmetic, through
    ``onnx_ir._core``'s ``import sympy`` and ``onnx_ir._symbolic_shapes``, whose module-level
    table reads ``sympy.Max``; a run reaches either only through a ``SymbolicDim`` expression.
    A module already imported, or (top-level) not installed, is left alone; a dotted name only
    while its parent is not imported yet (the parent's import would import it).
    """
    for name in names:
        parent = name.rpartition(".")[0]
        if name in sys.modules or (parent and parent in sys.modules):
            continue
        if not parent and importlib.util.find_spec(name) is None:
            continue
        module = _DeferredModule(name)
        module.__spec__ = None  # what the import system reads of a module found in sys.modules
        sys.modules[name] = module
