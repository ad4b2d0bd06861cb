"""Committing the drafts of a scope: new inputs, constants and nodes, named by the model's allocator.

A constant an adapter needs (:class:`passes.upgrade.draft.ConstInput`) becomes
an int64/float initializer of the graph that uses it, shared by value within
that graph and named so that no value of the model is shadowed; in a
model-local function (which cannot hold initializers) it is a ``Constant``
node at the top of the body, and a reference to a function attribute becomes
a ``Constant`` whose ``value_ints``/``value_float``... references it.
Subgraphs (If/Loop/Scan bodies) get their own initializers rather than using
the main graph's, so each graph stays self-contained (a subgraph can be moved,
inlined or folded on its own) and different graphs never share a constant.
Names come from :class:`passes.ir.names.Names`; the nodes are not built with
:class:`passes.ir.build.Builder`, whose ``<prefix>/<tag>`` names would rename
every node the upgrade has always created.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from passes.ir import walk
from passes.ir.names import Names
from passes.ir.schemas import kept_input_count
from passes.upgrade.draft import ConstInput, Draft, Stats

__all__ = ["ScopeRewriter"]


def _const_base(base: str, array: np.ndarray) -> str:
    if array.dtype.kind in "iu" and array.size <= 8:
        values = "_".join(str(int(v)).replace("-", "m") for v in array.reshape(-1))
        return f"{base}_{values}" if values else f"{base}_empty"
    return base


class ScopeRewriter:
    """Commits the drafts of one scope, creating the constants and nodes their adapters need.

    The pass calls :meth:`commit`; the hooks of the drafts (see
    :class:`passes.upgrade.draft.Draft`, through
    :class:`passes.upgrade.draft.Edits`) may call :meth:`const`,
    :meth:`add_node` and :meth:`fresh_value_name`.
    """

    def __init__(self, scope: walk.Scope, names: Names, stats: Stats, opset: int,
                 redirects: dict[ir.Value, ir.Value] | None = None) -> None:  # fmt: skip
        self._scope = scope
        #: Values a hook replaced for their readers (:meth:`redirect`), shared by the rewriters of
        #: every scope of the model: a reader may be in a subgraph or a later scope.
        self._redirects = redirects if redirects is not None else {}
        self._opset = opset  # the default-domain opset the scope's nodes are drafted for
        self._names = names
        self._stats = stats
        self._cache: dict[tuple[object, ...], ir.Value] = {}
        self._made: dict[int, tuple[ConstInput, ir.Value]] = {}  # by id: drafts share equal inputs
        self._front: ir.Node | None = None  # last Constant put at the top of a function scope

    def fresh_value_name(self, base: str) -> str:
        """A value name used nowhere in the model."""
        return self._names.value(base)

    def const(self, array: np.ndarray, base_name: str) -> ir.Value:
        """A shared constant of this scope (initializer in a graph, Constant in a function)."""
        array = np.asarray(array)
        key = ("tensor", array.dtype.str, array.shape, array.tobytes())
        if (value := self._cache.get(key)) is not None:
            return value
        name = self._names.value(_const_base(base_name, array))
        if not array.flags.writeable:  # shared by drafts (passes.upgrade.attributes): the model gets its own
            array = array.copy()
        tensor = ir.tensor(array, name=name)
        if self._scope.in_function:
            value = self._constant_node([ir.AttrTensor("value", tensor)], name)
        else:
            value = ir.val(name, const_value=tensor)
            self._scope.body.register_initializer(value)
            self._stats.initializers_added += 1
        self._cache[key] = value
        return value

    def _ref_const(self, const: ConstInput) -> ir.Value:
        attr = const.ref
        assert attr is not None and attr.ref_attr_name is not None
        key = ("ref", const.ref_kind, attr.ref_attr_name)
        if (value := self._cache.get(key)) is not None:
            return value
        ref = ir.RefAttr(const.ref_kind, attr.ref_attr_name, attr.type)
        value = self._constant_node([ref], self._names.value(f"{const.base_name}_{attr.ref_attr_name}"))
        self._cache[key] = value
        return value

    def _constant_node(self, attributes: list[ir.Attr], name: str) -> ir.Value:
        node = ir.Node("", "Constant", [], attributes, name=self._names.node(name))
        node.outputs[0].name = name
        body = self._scope.body
        if self._front is not None:
            body.insert_after(self._front, node)
        elif len(body):
            body.insert_before(body[0], node)
        else:
            body.append(node)
        self._front = node
        self._stats.constants_added += 1
        return node.outputs[0]

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
        """Creates a default-domain node with fresh names and inserts it ``before`` or ``after`` a node."""
        node = ir.Node("", op_type, inputs, attributes, name=self._names.node(base_name))
        node.outputs[0].name = self._names.value(base_name)
        if before is not None:
            self._scope.body.insert_before(before, node)
        else:
            assert after is not None
            self._scope.body.insert_after(after, node)
        self._stats.nodes_added += 1
        return node

    def redirect(self, old: ir.Value, new: ir.Value) -> None:
        """Makes every reader of ``old`` read ``new`` (uses in every scope, graph outputs, and the
        drafts committed later, which were planned reading ``old``)."""
        old.replace_all_uses_with(new, replace_graph_outputs=True)
        self._redirects[old] = new

    def _materialize(self, value: ir.Value | ConstInput | None, node: ir.Node) -> ir.Value | None:
        if not isinstance(value, ConstInput):
            while value is not None and value in self._redirects:
                value = self._redirects[value]
            return value
        made = self._made.get(id(value))
        if made is not None and made[0] is value:
            return made[1]
        if value.ref is not None:
            result = self._ref_const(value)
        else:
            result = self.const(value.array, value.base_name)
        if value.like is not None:
            base = f"{node.name or node.op_type}_{value.base_name}"
            result = self.add_node("CastLike", [result, value.like], base_name=base, before=node).outputs[0]
        else:
            self._made[id(value)] = (value, result)
        return result

    def commit(self, draft: Draft) -> None:
        """Writes the draft into its node."""
        node = draft.node
        node.op_type = draft.op_type
        attributes, current = node.attributes, node.attributes.data  # writes go through the container
        for name in [name for name in current if name not in draft.attributes]:
            del attributes[name]
        for name, attr in draft.attributes.items():
            if current.get(name) is not attr:
                attributes[name] = attr
        inputs = [self._materialize(value, node) for value in draft.inputs]
        inputs = inputs[: kept_input_count(inputs, draft.op_type, self._opset)]
        if len(inputs) != len(node.inputs):
            node.resize_inputs(len(inputs))
        for index, value in enumerate(inputs):
            if node.inputs[index] is not value:
                node.replace_input_with(index, value)
        node.resize_outputs(draft.num_outputs)
        for hook in draft.hooks:
            hook(node, self)
