"""Decompositions: ops rewritten into primitive ONNX ops, one module per decomposition."""

from __future__ import annotations

from passes.decompose.logsumexp import DecomposeLogSumExpPass

__all__ = ["DecomposeLogSumExpPass"]
