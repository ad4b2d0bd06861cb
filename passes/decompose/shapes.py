"""The static shapes of the values a decomposition builds, as onnx shape inference gives them.

A decomposition knows its new values' element types (it chose them) and,
when its input's shape is static, their shapes: the few ops it builds are
elementwise, broadcasts, reductions over known axes, a Reshape to a constant
target and an Unsqueeze. :func:`note_types` notes them in the run's table
(:mod:`passes.ir.known`), so that the ``types`` step need not infer the whole
model again for them. An op not listed here, or an input whose shape is not
known, leaves that value (and what is computed from it) unnoted: inference
answers for it, as before.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from passes.ir import known

__all__ = ["note_types"]

Dims = tuple[int, ...]

_SAME = frozenset({"Cast", "Exp", "Log", "Clip", "Identity", "Neg"})
_BROADCAST = frozenset({"Add", "Sub", "Mul", "Div", "Min", "Max"})


def _constant(value: ir.Value | None) -> np.ndarray | None:
    """The value's contents when it is an initializer or a ``Constant`` node's output."""
    if value is None:
        return None
    tensor = value.const_value
    node = value.producer()
    if tensor is None and node is not None and node.op_type == "Constant" and "value" in node.attributes:
        tensor = node.attributes["value"].value  # not as_tensor(): its runtime protocol check costs ~40 us
    return None if tensor is None else tensor.numpy()


def _axes(node: ir.Node) -> list[int] | None:
    """The node's axes (attribute or input), [] when absent; None when not known before run time."""
    if "axes" in node.attributes:
        return list(node.attributes["axes"].as_ints())
    if len(node.inputs) < 2 or node.inputs[1] is None:
        return []
    array = _constant(node.inputs[1])
    return None if array is None else [int(a) for a in array.reshape(-1)]


def _reduce(node: ir.Node, dims: Dims) -> Dims | None:
    axes = _axes(node)
    if axes is None:
        return None
    if not axes:
        if node.attributes.get_int("noop_with_empty_axes", 0):
            return dims
        axes = list(range(len(dims)))
    if any(not -len(dims) <= a < len(dims) for a in axes):
        return None
    reduced = {a % len(dims) for a in axes}
    keep = node.attributes.get_int("keepdims", 1)
    return tuple(1 if i in reduced else d for i, d in enumerate(dims) if keep or i not in reduced)


def _unsqueeze(node: ir.Node, dims: Dims) -> Dims | None:
    axes = _axes(node)
    rank = len(dims) + len(axes or ())
    if not axes or any(not -rank <= a < rank for a in axes):
        return None
    inserted = {a % rank for a in axes}
    rest = iter(dims)
    return tuple(1 if i in inserted else next(rest) for i in range(rank))


def _reshape(node: ir.Node) -> Dims | None:
    target = _constant(node.inputs[1] if len(node.inputs) > 1 else None)
    if target is None or any(int(d) <= 0 for d in target.reshape(-1)):  # 0 and -1 depend on the input
        return None
    return tuple(int(d) for d in target.reshape(-1))


def _broadcast(shapes: Sequence[Dims]) -> Dims | None:
    """Multidirectional broadcasting of static shapes; None when they do not broadcast."""
    rank = max(len(s) for s in shapes)
    result = []
    for i in range(rank):
        dims = {s[i - rank + len(s)] for s in shapes if i - rank + len(s) >= 0} - {1}
        if len(dims) > 1:
            return None
        result.append(dims.pop() if dims else 1)
    return tuple(result)


def _shape(node: ir.Node, inputs: Sequence[Dims | None]) -> Dims | None:
    """The static shape of the node's single output, or None."""
    op = node.op_type
    if op == "Constant":
        tensor = node.attributes["value"].value if "value" in node.attributes else None
        return None if tensor is None else tuple(int(d) for d in tensor.shape)
    if not inputs or inputs[0] is None:
        return None
    if op in _SAME:
        return inputs[0]
    if op in _BROADCAST:
        if None in inputs:
            return None
        return _broadcast(inputs)  # type: ignore[arg-type]
    if op.startswith("Reduce"):
        return _reduce(node, inputs[0])
    if op == "Unsqueeze":
        return _unsqueeze(node, inputs[0])
    if op == "Reshape":
        return _reshape(node)
    return None


def note_types(model: ir.Model, nodes: Sequence[ir.Node]) -> None:
    """Notes the element type and static shape of each output of ``nodes`` (in graph order, default
    domain, one output each) in the run's table, from what it holds of the values they read."""
    shape_of = functools.partial(known.static_shape, model)
    shapes: dict[ir.Value, Dims] = {}
    for node in nodes:
        inputs = [None if v is None else shapes[v] if v in shapes else shape_of(v) for v in node.inputs]
        output = node.outputs[0]
        dims = _shape(node, inputs)
        if dims is not None and output.dtype is not None:
            shapes[output] = dims
            known.note(model, output, output.dtype, dims)
