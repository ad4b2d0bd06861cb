"""Exception types. The CLI maps them to exit codes (see ``passes.cli``)."""

from __future__ import annotations

import onnx_ir as ir

__all__ = ["CheckFailedError", "InputError", "OptimizeError", "UpgradeError"]


class OptimizeError(Exception):
    """Base class of the errors this tool reports to users as one line."""


class InputError(OptimizeError):
    """The input (file, model, option) is unusable: not ONNX, truncated, refused opset..."""


class UpgradeError(ir.passes.PassError, OptimizeError):
    """The opset upgrade cannot convert a node without changing what it computes."""


class CheckFailedError(OptimizeError):
    """The optimised model computes something else than the original (or fails to run)."""
