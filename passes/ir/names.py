"""Unique names for the values and nodes passes create or move.

One allocator for every pass: it counts the value names and node names used
anywhere in a model (main graph, subgraphs, model-local functions, their
inputs, outputs and initializers), once, and hands out ``base``, ``base_1``,
``base_2``... names that collide with none of them. Value names and node names
are separate namespaces, as in ONNX.
"""

from __future__ import annotations

import collections

import onnx_ir as ir

from passes.ir.walk import iter_scopes

__all__ = ["Names"]


class Names:
    """The names used in a model, and fresh ones that collide with none of them.

    Built in one linear walk over the model. Names that the model uses more
    than once (the same name in both branches of an If, say) are counted, so
    that a value or node moved to another scope can be renamed only when it
    would clash (:meth:`dedupe_value`, :meth:`dedupe_node`).
    """

    def __init__(self, model: ir.Model) -> None:
        self._values: collections.Counter[str] = collections.Counter()
        self._nodes: collections.Counter[str] = collections.Counter()
        self._next: dict[str, int] = {}
        values: list[str] = []
        nodes: list[str] = []
        for scope in iter_scopes(model):
            body = scope.body
            values.extend(v.name for v in body.inputs if v.name)
            if isinstance(body, ir.Graph):
                values.extend(body.initializers.keys())
            for node in body:
                if node.name:
                    nodes.append(node.name)
                for value in node.outputs:
                    if value.name:
                        values.append(value.name)
        self._values.update(values)  # counted once, in C
        self._nodes.update(nodes)
        # Outputs of a function or graph that no node produces are its inputs or outer
        # values, already counted; names that only appear as inputs of nodes are outer
        # values of some scope, counted where they are defined.

    def _fresh(self, counter: collections.Counter[str], base: str) -> str:
        if not counter.get(base):  # (get: a Counter's [] calls __missing__ in Python for a name never used)
            counter[base] = 1
            return base
        key = f"{id(counter)}:{base}"
        k = self._next.get(key, 1)
        while counter.get(f"{base}_{k}"):
            k += 1
        self._next[key] = k + 1
        name = f"{base}_{k}"
        counter[name] += 1
        return name

    def value(self, base: str) -> str:
        """A value name used nowhere in the model (``base`` if free); recorded as used."""
        return self._fresh(self._values, base or "value")

    def node(self, base: str) -> str:
        """A node name used nowhere in the model (``base`` if free); recorded as used."""
        return self._fresh(self._nodes, base or "node")

    def dedupe_value(self, value: ir.Value) -> None:
        """Renames ``value`` if its name also names another value of the model."""
        if value.name and self._values[value.name] > 1:
            self._values[value.name] -= 1
            value.name = self._fresh(self._values, value.name)

    def dedupe_node(self, node: ir.Node) -> None:
        """Renames ``node`` if its name also names another node of the model."""
        if node.name and self._nodes[node.name] > 1:
            self._nodes[node.name] -= 1
            node.name = self._fresh(self._nodes, node.name)

    def release_value(self, name: str | None) -> None:
        """Records that a value called ``name`` was renamed or left the model."""
        if name and self._values[name] > 0:
            self._values[name] -= 1
