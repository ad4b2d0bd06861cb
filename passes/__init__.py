"""onnx-optimize: ONNX graph passes with an onnxruntime before/after check.

Python API:
    ``passes.optimize(model, passes=None, target_opset=18, ...)`` runs the passes;
    ``passes.check(original, optimized, ...)`` compares two models in onnxruntime.
Each pass is an ``onnx_ir.passes`` pass class usable on its own (see ``passes.PASSES``).

The names below are imported on first use, so that ``import passes`` (and the
``optimize`` command's start-up, before it installs its signal handlers) stays
cheap: onnxruntime and the passes load only when needed.
"""

from __future__ import annotations

import importlib  # already loaded by the interpreter (runpy uses it): costs nothing

# `python -m passes` runs this module before passes/__main__.py installs its signal handlers, so it
# imports nothing that takes time (typing takes 5 ms): a SIGINT then still lands in Python's start-up.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "PASSES": "passes.pipeline",
    "PassSpec": "passes.declarations",
    "RunSpec": "passes.pipeline",
    "CheckOptions": "passes.pipeline",
    "Option": "passes.options",
    "Pass": "passes.base",
    "build_pass_manager": "passes.pipeline",
    "optimize": "passes.pipeline",
    "optimize_file": "passes.pipeline",
    "pass_options": "passes.pipeline",
    "CheckResult": "passes.verify.result",
    "check": "passes.verify.check",
    "CleanupPass": "passes.cleanup",
    "CheckFailedError": "passes.errors",
    "InputError": "passes.errors",
    "OptimizeError": "passes.errors",
    "UpgradeError": "passes.errors",
    "UpgradeOpsetPass": "passes.upgrade",
    "ConstantFoldingPass": "passes.fold",
    "DecomposeLogSumExpPass": "passes.decompose",
    "SimplifyPass": "passes.simplify",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'passes' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
