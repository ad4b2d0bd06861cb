"""Chains around Transposes that move only size-1 axes, and Slices of Slices on other axes."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from passes.simplify.chains._common import inner_node, rewire
from passes.simplify.rules import Context, Outcome, rule, sole_user

__all__: list[str] = []


def _moves_only_ones(node: ir.Node, ctx: Context) -> str | None:
    """Why the Transpose ``node`` may move an axis of size other than 1 (None: it moves only size-1 axes)."""
    dims = ctx.dims(node.inputs[0])
    if dims is None:
        return "the Transpose's input rank is unknown"
    perm = node.attributes.get_ints("perm", None)
    perm = list(range(len(dims)))[::-1] if perm is None else list(perm)
    if sorted(perm) != list(range(len(dims))):
        return "the Transpose's perm is not a permutation of its input's axes"
    kept = [axis for axis in perm if dims[axis] != 1]  # unknown dims count as not 1
    if kept != sorted(kept):
        return "the Transpose moves an axis whose size is not proved to be 1"
    return None


def _reshape_target_beside(transpose: ir.Node, reshape: ir.Node, ctx: Context) -> np.ndarray | str:
    """The Reshape's constant target, if the Transpose next to it moves only size-1 axes and the
    target copies no dim of the Reshape's input (no ``0``, or ``allowzero``)."""
    if reason := _moves_only_ones(transpose, ctx):
        return reason
    target = ctx.constant(reshape.inputs[1]) if len(reshape.inputs) > 1 else None
    if target is None:
        return "the Reshape's target is not a constant"
    if not reshape.attributes.get_int("allowzero", 0) and np.any(target == 0):
        return "the Reshape's target copies a dim of its input"
    return target.reshape(-1)


@rule("Transpose", family="chains")
def reshape_like_transpose_of_reshape(node: ir.Node, ctx: Context) -> Outcome:
    """``Transpose(Reshape(x, s), p) -> Reshape(x, s[p])`` for a Transpose that moves only size-1 axes."""
    inner = inner_node(node, ctx, "Reshape")
    if isinstance(inner, str):
        return inner
    target = _reshape_target_beside(node, inner, ctx)
    if isinstance(target, str):
        return target
    perm = node.attributes.get_ints("perm", None)
    perm = list(range(len(target)))[::-1] if perm is None else list(perm)
    if len(perm) != len(target):
        return "the Reshape's target and the perm differ in rank"
    permuted = np.array([target[axis] for axis in perm], dtype=np.int64)
    source, allowzero = inner.inputs[0], inner.attributes.get_int("allowzero", 0)

    def rewrite() -> None:
        # A new Reshape makes the Transpose's result; the old one is left to die. Changing the old
        # one's target would change its output's shape, which inference gave for this sweep.
        names, old = ctx.names(), node.outputs[0]
        shape = ctx.new_constant(permuted, f"{inner.name or 'reshape'}_target", before=node)
        reshape = ir.Node("", "Reshape", [source, shape], [ir.AttrInt64("allowzero", 1)] if allowzero else [],
                          name=names.node(f"{node.name or 'Transpose'}_reshape"))
        new = reshape.outputs[0]
        new.name, new.type, new.shape = names.value(f"{old.name or 'transposed'}_reshaped"), old.type, old.shape
        assert node.graph is not None
        node.graph.insert_before(node, reshape)
        ctx.take_place(old, new)()

    return rewrite


@rule("Reshape", family="chains")
def reshape_of_reshape_like_transpose(node: ir.Node, ctx: Context) -> Outcome:
    """``Reshape(Transpose(x, p), s) -> Reshape(x, s)`` for a Transpose that moves only size-1 axes."""
    inner = inner_node(node, ctx, "Transpose")
    if isinstance(inner, str):
        return inner
    reason = _reshape_target_beside(inner, node, ctx)
    if isinstance(reason, str):
        return reason
    source = inner.inputs[0]
    return lambda: rewire(node, source)


@rule("Reshape", family="chains")
def transpose_between_reshapes(node: ir.Node, ctx: Context) -> Outcome:
    """``Reshape(Transpose(Reshape(x, s1), p), s2) -> Transpose(x, q)`` when the Reshapes only move 1s.

    Without a first Reshape (or with one that has other users), ``Reshape(Transpose(x, p), s2)``.
    """
    transpose = inner_node(node, ctx, "Transpose")
    if isinstance(transpose, str):
        return transpose
    first = ctx.producer(transpose.inputs[0], "Reshape")
    if first is not None and not sole_user(first.outputs[0]):
        first = None  # it stays: the chain starts at its output
    x = transpose.inputs[0] if first is None else first.inputs[0]
    d0, d1, d3 = (ctx.static_dims(v) for v in (x, transpose.inputs[0], node.outputs[0]))
    if d0 is None or d1 is None or d3 is None:
        return "a shape in the chain is not static"
    if len(d0) != len(d3):
        return "the chain changes the rank"
    perm = transpose.attributes.get_ints("perm", None)
    perm = list(range(len(d1)))[::-1] if perm is None else list(perm)
    if sorted(perm) != list(range(len(d1))):
        return "the Transpose's perm is not a permutation of its input's axes"
    d2 = [d1[a] for a in perm]

    def others(dims: Sequence[int]) -> list[int]:
        return [i for i, d in enumerate(dims) if d != 1]

    a0, a1, a2, a3 = others(d0), others(d1), others(d2), others(d3)
    if [d0[i] for i in a0] != [d1[i] for i in a1] or [d2[i] for i in a2] != [d3[i] for i in a3]:
        return "a Reshape does more than add or remove dims of size 1"
    position = {axis: k for k, axis in enumerate(a1)}
    q = [-1] * len(d3)
    for k, at in enumerate(a3):  # the k-th other axis of the result is this one of x
        q[at] = a0[position[perm[a2[k]]]]
    for at, axis in zip((i for i in range(len(d3)) if d3[i] == 1), (i for i in range(len(d0)) if d0[i] == 1)):
        q[at] = axis
    if q == list(range(len(q))):
        return ctx.bypass(node, x)

    def rewrite() -> None:
        node.op_type = "Transpose"
        for name in ("allowzero", "shape"):
            node.attributes.pop(name, None)
        node.attributes["perm"] = ir.AttrInt64s("perm", q)
        node.resize_inputs(1)
        node.replace_input_with(0, x)

    return rewrite


def _slice_parameters(node: ir.Node, ctx: Context, rank: int | None) -> list[list[int]] | str:
    """A Slice's constant ``[starts, ends, axes, steps]`` (axes made non-negative), or why there are none."""
    if ctx.opset < 10:
        return "a Slice before opset 10 (attributes, no steps)"
    inputs = [*node.inputs, None, None, None][:5]
    values = [ctx.constant(v) if v is not None else None for v in inputs[1:]]
    if values[0] is None or values[1] is None:
        return "a Slice's starts or ends are not constants"
    count = values[0].size
    starts, ends = [int(v) for v in values[0].reshape(-1)], [int(v) for v in values[1].reshape(-1)]
    defaults = (list(range(count)), [1] * count)
    rest = []
    for value, given, default in zip(inputs[3:], values[2:], defaults):
        if value is not None and given is None:
            return "a Slice's axes or steps are not constants"
        rest.append(default if value is None else [int(v) for v in given.reshape(-1)])
    axes, steps = rest
    if any(a < 0 for a in axes):
        if rank is None:
            return "a Slice's axis is negative and the rank is unknown"
        axes = [a + rank if a < 0 else a for a in axes]
    if not len(starts) == len(ends) == len(axes) == len(steps):
        return "a Slice's starts, ends, axes and steps differ in length"
    return [starts, ends, axes, steps]


@rule("Slice", family="chains")
def slice_of_slice(node: ir.Node, ctx: Context) -> Outcome:
    """``Slice(Slice(x, ...), ...) -> Slice(x, ...)`` for slices of different axes."""
    inner = inner_node(node, ctx, "Slice", shared=True)
    if isinstance(inner, str):
        return inner
    source = inner.inputs[0]
    dims = ctx.dims(source)
    rank = None if dims is None else len(dims)
    first, second = _slice_parameters(inner, ctx, rank), _slice_parameters(node, ctx, rank)
    if isinstance(first, str):
        return first
    if isinstance(second, str):
        return second
    if set(first[2]) & set(second[2]):
        return "the two Slices slice a same axis"
    merged = [a + b for a, b in zip(first, second)]

    def rewrite() -> None:
        base = node.name or "slice"
        values = [ctx.new_constant(np.array(v, np.int64), f"{base}_{label}", before=node)
                  for v, label in zip(merged, ("starts", "ends", "axes", "steps"))]  # fmt: skip
        node.resize_inputs(5)
        node.replace_input_with(0, source)
        for index, value in enumerate(values, start=1):
            node.replace_input_with(index, value)

    return rewrite
