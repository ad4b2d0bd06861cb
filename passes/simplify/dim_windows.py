"""Sliding-window lengths as floor expressions of the input's length: Conv, ConvTranspose and the pools.

Each function gives, per spatial axis, the output length onnxruntime 1.32 computes
for an input length ``n`` (a dim) in every run where the node succeeds, as a
:mod:`dim_exprs` expression, with whether it is then ``>= 1``; or None where
onnxruntime's length is not such an expression of ``n`` alone. ``R`` is the dilated
kernel ``dilation*(k-1) + 1``, ``P`` the sum of the pads of the axis, ``s`` the stride;
what onnxruntime computes was measured, not taken from the schemas
(tests/test_simplify_pool_dims.py runs each case at many lengths):

* ``Conv``, explicit pads or VALID: ``floor((n + P - R) / s) + 1``; onnxruntime
  fails the node where ``n + P < R``, so the length is ``>= 1`` and the span
  ``n + P - R`` is ``>= 0`` (:func:`conv_spans`: an exporter's ``(H - 1) // 4``
  is then floor division, onnxruntime's truncating Div agreeing).
* ``Conv`` and the pools with ``auto_pad`` SAME_UPPER/SAME_LOWER and dilations 1:
  ``ceil(n / s) = floor((n + s - 1) / s)``; onnxruntime fails a Conv of zero length,
  so a Conv's is ``>= 1``. A pool fails a zero length too, but not on an empty
  tensor (batch 0): its length is not marked. (With a dilation, onnxruntime's
  pools size SAME padding by the undilated kernel and its Conv fails: not derived.)
* ``MaxPool``/``AveragePool``/``LpPool``, explicit pads, ``ceil_mode=0``:
  onnxruntime divides ``n + P - R`` truncating toward zero, so the length is the
  floor form only where that is ``>= 0`` or ``s = 1``. On an empty tensor a pool
  runs at ``n = 0``, so it is derived where ``P >= R`` (then ``>= 1``) or ``s = 1``:
  ResNet's ``k=3, s=2, P=2`` gives length 1 at ``n = 0`` where the floor gives 0,
  and ``k=2, s=2`` unpadded gives 1 at ``n = 1``: not derived.
* The pools with ``ceil_mode=1``: onnxruntime takes ``ceil((n + P - R) / s) + 1`` and
  drops the last window when it starts in the end padding (``(out-1)*s >= n + pad_begin``),
  which is ``floor((n + P - R + u - 1) / s) + 1`` with ``u = min(max(R - pad_end, 0), s)``
  (``n + pad_begin - 1`` over ``s``, plus 1, for the usual ``pad_end < R <= pad_end + s``),
  at every length, 0 included; ``>= 1`` where that holds at ``n = 0`` (``P + u > R``).
* ``ConvTranspose``, explicit pads, no ``output_shape``:
  ``s*(n - 1) + output_padding + R - P``.

VALID is explicit pads of 0 (a pool's length then as above, in either mode);
ConvTranspose's SAME and ``output_shape`` are not derived.
"""

from __future__ import annotations

import dataclasses

import onnx_ir as ir

from passes.simplify import dim_exprs

__all__ = ["Lengths", "Window", "conv_lengths", "conv_spans", "conv_transpose_lengths", "pool_lengths", "window"]

Lengths = list[tuple[object, bool]]
"""Per spatial axis, the output length (None where not derived) and whether it is ``>= 1``."""

_SAME = ("SAME_UPPER", "SAME_LOWER")


@dataclasses.dataclass(frozen=True)
class Window:
    """A node's window attributes, per spatial axis (pads as ``begin..., end...``)."""

    auto_pad: str
    kernel: list[int]
    strides: list[int]
    dilations: list[int]
    pads: list[int]

    @property
    def spatial(self) -> int:
        return len(self.kernel)

    def reach(self, i: int) -> int:
        """The dilated kernel ``R`` of axis ``i``."""
        return self.dilations[i] * (self.kernel[i] - 1) + 1

    def padding(self, i: int) -> int:
        """The pads ``P`` of axis ``i``, both ends."""
        return self.pads[i] + self.pads[i + self.spatial]


def window(node: ir.Node, kernel: list[object] | None) -> Window | None:
    """``node``'s window attributes (``kernel`` from the weight where the node has no ``kernel_shape``),
    or None where they are not all ints of one rank, strides and dilations ``>= 1`` and pads ``>= 0``."""
    declared = node.attributes.get_ints("kernel_shape", None)
    kernel = list(declared) if declared is not None else kernel
    if kernel is None or not all(isinstance(k, int) and k >= 1 for k in kernel):
        return None
    spatial = len(kernel)
    auto_pad = node.attributes.get_string("auto_pad", "NOTSET")
    pads = list(node.attributes.get_ints("pads", [0] * 2 * spatial))
    strides = list(node.attributes.get_ints("strides", [1] * spatial))
    dilations = list(node.attributes.get_ints("dilations", [1] * spatial))
    if auto_pad == "VALID":
        pads = [0] * 2 * spatial
    if auto_pad not in ("NOTSET", "VALID", *_SAME) or not len(strides) == len(dilations) == len(pads) // 2 == spatial:
        return None
    if min(strides + dilations, default=1) < 1 or min(pads, default=0) < 0 or len(pads) != 2 * spatial:
        return None
    return Window(auto_pad, kernel, strides, dilations, pads)  # type: ignore[arg-type]


def _floor_plus_one(n: object, numerator: int, stride: int) -> object:
    """``floor((n + numerator) / stride) + 1``."""
    return dim_exprs.add(dim_exprs.floordiv(dim_exprs.add(n, numerator), stride), 1)


def _same(n: object, w: Window, i: int, positive: bool) -> tuple[object, bool]:
    """SAME padding's ``ceil(n / s)`` (dilations 1 only: see the module docstring)."""
    if any(d != 1 for d in w.dilations):
        return None, False
    return dim_exprs.floordiv(dim_exprs.add(n, w.strides[i] - 1), w.strides[i]), positive


def conv_lengths(w: Window, spatial: list[object]) -> Lengths:
    """A Conv's output lengths for input lengths ``spatial`` (see the module docstring)."""
    out: Lengths = []
    for i, n in enumerate(spatial):
        if n is None:
            out.append((None, False))
        elif w.auto_pad in _SAME:
            out.append(_same(n, w, i, positive=True))
        else:
            out.append((_floor_plus_one(n, w.padding(i) - w.reach(i), w.strides[i]), True))
    return out


def conv_spans(w: Window, spatial: list[object]) -> list[object]:
    """A Conv's ``n + P - R`` per axis, ``>= 0`` where it succeeds (None for SAME padding or an unknown ``n``)."""
    if w.auto_pad in _SAME:
        return [None] * len(spatial)
    return [None if n is None else dim_exprs.add(n, w.padding(i) - w.reach(i)) for i, n in enumerate(spatial)]


def pool_lengths(w: Window, spatial: list[object], ceil_mode: bool) -> Lengths:
    """A MaxPool's, AveragePool's or LpPool's output lengths (see the module docstring)."""
    out: Lengths = []
    for i, n in enumerate(spatial):
        reach, padding, stride = w.reach(i), w.padding(i), w.strides[i]
        if n is None:
            out.append((None, False))
        elif w.auto_pad in _SAME:
            out.append(_same(n, w, i, positive=False))
        elif ceil_mode:
            u = min(max(reach - w.pads[i + w.spatial], 0), stride)
            out.append((_floor_plus_one(n, padding - reach + u - 1, stride), padding + u > reach))
        elif padding >= reach or stride == 1:
            out.append((_floor_plus_one(n, padding - reach, stride), padding >= reach))
        else:
            out.append((None, False))  # onnxruntime truncates a negative numerator
    return out


def conv_transpose_lengths(w: Window, spatial: list[object], output_padding: list[int]) -> Lengths:
    """A ConvTranspose's output lengths (explicit pads, no ``output_shape``; see the module docstring)."""
    if w.auto_pad != "NOTSET" or len(output_padding) != w.spatial:
        return [(None, False)] * len(spatial)
    out: Lengths = []
    for i, n in enumerate(spatial):
        if n is None:
            out.append((None, False))
            continue
        const = output_padding[i] + w.reach(i) - w.padding(i) - w.strides[i]
        out.append((dim_exprs.add(dim_exprs.scale(n, w.strides[i]), const), False))
    return out
