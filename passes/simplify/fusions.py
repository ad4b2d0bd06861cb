"""Fusions: BatchNormalization and per-channel Mul/Add into a preceding Conv/ConvTranspose/Gemm.

Not written yet: this module registers no rule.
"""

from __future__ import annotations

__all__: list[str] = []
