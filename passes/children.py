"""How the package starts Python child processes (the check's worker, a folder's runs).

``python -m MODULE`` puts the current folder first on ``sys.path``: a file there
named like a module the child imports (a user's ``numpy.py`` or ``onnx.py`` beside
their models) would be imported instead. :func:`module_command` runs the module
with that entry taken off, and :func:`child_env` makes this copy of the package
the one the child imports (it may be importable only from the folder the parent
started in). Nothing here imports more than the standard library.
"""

from __future__ import annotations

import os
import pathlib
import sys

__all__ = ["PACKAGE_ROOT", "child_env", "module_command"]

#: The folder that holds this ``passes`` package: the child imports this copy.
PACKAGE_ROOT = str(pathlib.Path(__file__).resolve().parent.parent)


def module_command(module: str, *args: str) -> list[str]:
    """The command that runs ``module`` as ``python -m module args`` does, without the current folder on
    ``sys.path`` (``sys.argv`` is the module's file, then ``args``; ``-c`` puts ``""`` first, taken off)."""
    code = f"import runpy, sys; del sys.path[0]; runpy.run_module({module!r}, run_name='__main__', alter_sys=True)"
    return [sys.executable, "-c", code, *args]


def child_env() -> dict[str, str]:
    """This process's environment with :data:`PACKAGE_ROOT` first on ``PYTHONPATH``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_ROOT, env.get("PYTHONPATH", "")) if p)
    return env
