"""The reduction a ReduceLogSumExp decomposes into, and its long sums in two levels (see
:mod:`passes.decompose.logsumexp`'s docstring)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import onnx_ir as ir

from passes.ir.build import Builder, axes_are_input

__all__ = ["BLOCK_MIN", "Reduction", "Split"]

#: Reductions of at least this many terms are summed in two levels.
BLOCK_MIN = 64


@dataclasses.dataclass
class Reduction:
    """The reduction of the original node, reproduced on the new reduce ops.

    Attributes:
        axes: The ``axes`` attribute (opset < 18, ints) or input (opset >= 18,
            a value); None when absent.
        keepdims: The node's ``keepdims``.
        noop_with_empty_axes: The node's ``noop_with_empty_axes`` (opset >= 18).
    """

    axes: tuple[int, ...] | ir.Value | None
    keepdims: int
    noop_with_empty_axes: int

    @classmethod
    def of(cls, node: ir.Node, opset: int) -> Reduction:
        keepdims = node.attributes.get_int("keepdims", 1)
        if axes_are_input(node.op_type, opset):
            axes = node.inputs[1] if len(node.inputs) > 1 else None
            return cls(axes, keepdims, node.attributes.get_int("noop_with_empty_axes", 0))
        ints = node.attributes.get_ints("axes", None)
        # An empty axes attribute reduces over all axes, as an absent one does.
        return cls(tuple(ints) if ints else None, keepdims, 0)

    def reduce(
        self, b: Builder, op_type: str, data: ir.Value, dtype: ir.DataType, tag: str, keepdims: int
    ) -> ir.Value:
        """``op_type(data)`` over the node's axes, keeping ``noop_with_empty_axes``."""
        attributes = {"keepdims": keepdims}
        if self.noop_with_empty_axes:
            attributes["noop_with_empty_axes"] = self.noop_with_empty_axes
        return b.with_axes(op_type, data, self.axes, dtype, tag, **attributes)

    def known_axes(self, rank: int) -> tuple[int, ...] | None:
        """The reduced axes, sorted and non-negative, when known before run time.

        None when they are computed at run time, out of range, or none at all
        (``noop_with_empty_axes`` with empty axes).
        """
        if isinstance(self.axes, ir.Value):
            if self.axes.is_graph_input():  # an initializer a caller may override
                return None
            try:
                tensor = ir.convenience.get_const_tensor(self.axes)
            except ValueError:
                return None
            if tensor is None:
                return None
            axes = tuple(int(a) for a in tensor.numpy().reshape(-1))
        else:
            axes = self.axes or ()
        if not axes:
            return None if self.noop_with_empty_axes else tuple(range(rank))
        if any(not -rank <= a < rank for a in axes):
            return None
        return tuple(sorted({a % rank for a in axes}))


@dataclasses.dataclass(frozen=True)
class Split:
    """How a long sum is done in two levels: axis ``axis`` of length outer*inner is split.

    Attributes:
        dims: The data's shape (ints where static, None where not).
        axes: The reduced axes, sorted and non-negative.
        axis: The reduced axis that is split.
        outer: Its outer part p.
        inner: Its inner part q (summed first).
    """

    dims: tuple[int | None, ...]
    axes: tuple[int, ...]
    axis: int
    outer: int
    inner: int

    @classmethod
    def plan(cls, shape: ir.Shape | None, reduction: Reduction, opset: int) -> Split | None:
        """A split for a sum of at least ``BLOCK_MIN`` terms, or None when there is none."""
        if shape is None or opset < 13:
            return None
        dims = tuple(d if isinstance(d, int) else None for d in shape)
        axes = reduction.known_axes(len(dims))
        if axes is None or 0 in dims:
            return None
        # Without static dims the Reshape target comes from Shape, which may hold a
        # run-time 0: that needs allowzero (opset 14).
        if None in dims and opset < 14:
            return None
        known = [(n, a) for a in axes if (n := dims[a]) is not None]
        terms = math.prod(n for n, _ in known)
        if terms < BLOCK_MIN:
            return None
        n, axis = max(known)  # the longest axis; the last of equals
        target = math.sqrt(terms)
        divisors = [q for q in range(2, n) if n % q == 0]
        if not divisors:  # n is prime
            return None
        inner = min(divisors, key=lambda q: abs(math.log(q / target)))
        return cls(dims, axes, axis, n // inner, inner)

    def sum(self, b: Builder, e: ir.Value, dtype: ir.DataType, keepdims: int) -> ir.Value:
        """``ReduceSum(e, axes, keepdims)`` adding ``inner`` terms first, then the rest."""
        a = self.axis
        if None not in self.dims:
            dims = [*self.dims[:a], self.outer, self.inner, *self.dims[a + 1 :]]
            target = b.constant(np.array(dims, dtype=np.int64), "block_shape")
        else:
            parts = [b.constant(np.array([self.outer, self.inner], dtype=np.int64), "block_dims")]
            if a > 0:
                parts.insert(0, self._dims(b, e, 0, a, "shape_head"))
            if a + 1 < len(self.dims):
                parts.append(self._dims(b, e, a + 1, len(self.dims), "shape_tail"))
            target = b.op("Concat", parts, ir.DataType.INT64, "block_shape", axis=0)
        attributes = {"allowzero": 1} if b.opset >= 14 else {}
        blocks = b.op("Reshape", [e, target], dtype, "blocks", **attributes)
        partial = b.with_axes("ReduceSum", blocks, (a + 1,), dtype, "block_sum", keepdims=1)
        rest = {ax + (ax > a) for ax in self.axes} | {a, a + 1}
        total = b.with_axes("ReduceSum", partial, tuple(sorted(rest)), dtype, "sum", keepdims=0)
        if keepdims:
            total = b.with_axes("Unsqueeze", total, self.axes, dtype, "sum_keepdims")
        return total

    @staticmethod
    def _dims(b: Builder, value: ir.Value, start: int, end: int, tag: str) -> ir.Value:
        if b.opset >= 15:
            return b.op("Shape", [value], ir.DataType.INT64, tag, start=start, end=end)
        shape = b.op("Shape", [value], ir.DataType.INT64, f"{tag}_full")
        starts = b.constant(np.array([start], dtype=np.int64), f"{tag}_start")
        ends = b.constant(np.array([end], dtype=np.int64), f"{tag}_end")
        return b.op("Slice", [shape, starts, ends], ir.DataType.INT64, tag)
