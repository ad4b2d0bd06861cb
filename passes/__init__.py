"""onnx-optimize: ONNX graph passes with an onnxruntime before/after check.

Python API:
    ``passes.optimize(model, passes=None, target_opset=18, ...)`` runs the passes;
    ``passes.check(original, optimized, ...)`` compares two models in onnxruntime.
Each pass is an ``onnx_ir.passes`` pass class usable on its own (see ``passes.PASSES``).
"""

from __future__ import annotations

from passes.ort_check import CheckResult, check
from passes.cleanup import CleanupPass
from passes.errors import CheckFailedError, InputError, OptimizeError, UpgradeError
from passes.pipeline import PASSES, Options, build_pass_manager, optimize

__all__ = [
    "PASSES",
    "CheckFailedError",
    "CheckResult",
    "CleanupPass",
    "InputError",
    "OptimizeError",
    "Options",
    "UpgradeError",
    "build_pass_manager",
    "check",
    "optimize",
]

__version__ = "0.1.0"
