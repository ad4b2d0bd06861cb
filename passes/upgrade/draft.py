"""What planning an upgrade produces, the types every module of :mod:`passes.upgrade` shares.

A node's upgrade is planned on a :class:`Draft` (its op type, attributes and inputs after the
steps planned so far), whose new inputs may be constants still to be created
(:class:`ConstInput`) and which may queue hooks, small graph edits run once the node is rewritten
through the scope's :class:`Edits` (:class:`passes.upgrade.rewrite.ScopeRewriter` is the one
implementation); :class:`Stats` counts what the upgrade did. This module is the lowest of the
package: the planner (``plan``), the schema checks (``schemas``), the adapters and the rewriter
import it, it imports none of them.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
import onnx_ir as ir

__all__ = ["ConstInput", "Draft", "DraftInput", "Edits", "Hook", "Stats", "dtype_of"]


def dtype_of(value: object) -> ir.DataType | None:
    """The element type of a node's input or output, or None when it is not known.

    ``value`` is an ``ir.Value``, None, or a constant the upgrade will create
    (:class:`ConstInput`, which knows its own ``dtype``).
    """
    if value is None:
        return None
    if isinstance(value, ConstInput):  # a plain class: ir.Value's protocol metaclass makes its isinstance slow
        return value.dtype
    value_type = value.type  # type: ignore[attr-defined]
    return value_type.dtype if type(value_type) is ir.TensorType else None


class Edits(Protocol):
    """The graph edits a draft's hooks make in the node's scope (the rewriter gives them)."""

    def fresh_value_name(self, base: str) -> str:
        """A value name used nowhere in the model."""
        ...

    def const(self, array: np.ndarray, base_name: str) -> ir.Value:
        """A shared constant of the scope (initializer in a graph, Constant in a function)."""
        ...

    def add_node(
        self,
        op_type: str,
        inputs: Sequence[ir.Value | None],
        attributes: Sequence[ir.Attr] = (),
        *,
        base_name: str,
        before: ir.Node | None = None,
        after: ir.Node | None = None,
    ) -> ir.Node:
        """A new default-domain node with fresh names, inserted ``before`` or ``after`` a node."""
        ...

    def redirect(self, old: ir.Value, new: ir.Value) -> None:
        """Makes every reader of ``old`` read ``new``: its uses in every scope, the graph outputs,
        and the drafts committed after this call (they were planned with ``old``)."""
        ...


@functools.cache
def _ir_dtype(dtype: np.dtype) -> ir.DataType:
    return ir.DataType.from_numpy(dtype)


@dataclasses.dataclass(frozen=True)
class ConstInput:
    """An input the upgrade will create: a constant, possibly from a function attribute.

    Attributes:
        array: The value (for a reference, an example of the dtype and rank).
        base_name: Base of the generated value name.
        ref: A reference to a function attribute (``ref_attr_name`` set); the
            constant becomes a ``Constant`` node whose ``ref_kind`` attribute
            (``value_ints``, ``value_int``, ``value_floats``, ``value_float``)
            references it.
        ref_kind: See ``ref``.
        like: When set, the constant is converted to the element type of this
            value with ``CastLike`` (used when that type is not known statically).
    """

    array: np.ndarray
    base_name: str
    ref: ir.Attr | None = None
    ref_kind: str = ""
    like: ir.Value | None = None

    @property
    def dtype(self) -> ir.DataType | None:
        if self.like is not None:
            return dtype_of(self.like)
        return _ir_dtype(self.array.dtype)


DraftInput = ir.Value | ConstInput | None
#: A graph edit a draft queues, run once the node is rewritten, with the scope's :class:`Edits`.
Hook = Callable[[ir.Node, Edits], None]


@dataclasses.dataclass(slots=True)  # one per node of the model, all alive until the rewrite
class Draft:
    """What a node will look like after the upgrade, built without touching the graph.

    Attributes:
        node: The node being upgraded (read only while planning).
        op_type: The op type after the steps planned so far.
        attributes: The attributes after the steps planned so far.
        inputs: The inputs after the steps planned so far.
        num_outputs: How many of the node's outputs are kept (trailing ones are dropped).
        hooks: Graph edits to run after the node has been rewritten.
        notes: Facts an adapter leaves for a later step (e.g. the op was an Upsample).
        applied: Names of the adapters applied, in order.
    """

    node: ir.Node
    op_type: str
    attributes: dict[str, ir.Attr]
    inputs: list[DraftInput]
    num_outputs: int
    hooks: list[Hook] = dataclasses.field(default_factory=list)
    notes: set[str] = dataclasses.field(default_factory=set)
    applied: list[str] = dataclasses.field(default_factory=list)

    @classmethod
    def of(cls, node: ir.Node) -> Draft:
        return cls(node, node.op_type, dict(node.attributes.data), list(node.inputs), len(node.outputs))

    def input(self, index: int) -> DraftInput:
        return self.inputs[index] if index < len(self.inputs) else None

    def set_input(self, index: int, value: DraftInput) -> None:
        if index >= len(self.inputs):
            self.inputs.extend([None] * (index + 1 - len(self.inputs)))
        self.inputs[index] = value

    @property
    def outputs(self) -> Sequence[ir.Value]:
        return self.node.outputs[: self.num_outputs]

    def changed(self) -> bool:
        node = self.node
        return (
            self.op_type != node.op_type
            or self.num_outputs != len(node.outputs)
            or bool(self.hooks)
            or len(self.inputs) != len(node.inputs)
            or any(a is not b for a, b in zip(self.inputs, node.inputs))
            or self.attributes.keys() != node.attributes.keys()
            or any(node.attributes[k] is not v for k, v in self.attributes.items())
        )


@dataclasses.dataclass
class Stats:
    """What the upgrade did: nodes planned and adapted, and what the rewrite added."""

    converted: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    adapters: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    initializers_added: int = 0
    constants_added: int = 0
    nodes_added: int = 0
