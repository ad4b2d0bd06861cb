"""Graph surgery for the folding pass, every rewrite linear in what it touches.

:class:`Rewriter` replaces node outputs by constants, redirects uses, drops
nodes (with everything nested in their subgraphs), inlines the branch a
constant ``If`` takes, and finally removes what the rewrites left unused.

Linear, including for nodes with thousands of inputs or outputs: onnx_ir's
``Node.replace_input_with`` rebuilds the node's input tuple on every call, so
replacing the k inputs of one node one at a time costs k x (number of inputs),
and ``Value.replace_all_uses_with`` with ``replace_graph_outputs`` scans all
the graph outputs per value. A Split into 20,000 parts feeding one Concat took
54 s that way. Here every rewrite collects its replacements first and applies
them per user node in one step (:func:`set_inputs`), and graph outputs are
found through a per-graph index.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx_ir as ir

from passes.ir.names import Names
from passes.ir.tensors import make_tensor

__all__ = ["Rewriter", "region_of", "set_inputs", "subgraphs_of"]

_GRAPH_TYPES = (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
# Up to this many input-tuple element copies, replace inputs one by one through the public API.
_CHEAP_REPLACEMENTS = 1024


def subgraphs_of(node: ir.Node) -> list[ir.Graph]:
    """The graphs held by the node's attributes (If branches, Loop/Scan bodies...)."""
    graphs: list[ir.Graph] = []
    stored = node.attributes
    for attr in getattr(stored, "data", stored).values():  # the attributes' own dict: a sweep asks of every node
        if attr.type not in _GRAPH_TYPES or not isinstance(attr, ir.Attr) or attr.is_ref():
            continue
        if attr.type == ir.AttributeType.GRAPH:
            graphs.append(attr.as_graph())
        else:
            graphs.extend(attr.as_graphs())
    return graphs


def region_of(node: ir.Node) -> tuple[list[ir.Node], set[ir.Graph]]:
    """The node with every node nested in its subgraphs, and those subgraphs."""
    nodes = [node]
    graphs: set[ir.Graph] = set()
    stack = subgraphs_of(node)
    while stack:
        graph = stack.pop()
        graphs.add(graph)
        for inner in graph:
            nodes.append(inner)
            stack.extend(subgraphs_of(inner))
    return nodes, graphs


def _can_set_inputs_directly(node: ir.Node) -> bool:
    """Whether onnx_ir still stores a node's inputs and a value's uses the way set_inputs assumes."""
    return (
        getattr(node, "_inputs", None) is node.inputs
        and hasattr(ir.Value, "_add_usage")
        and hasattr(ir.Value, "_remove_usage")
    )


def set_inputs(node: ir.Node, changes: Mapping[int, ir.Value | None]) -> None:
    """Sets several inputs of ``node`` at once, in O(number of inputs + changes).

    Equivalent to ``node.replace_input_with(i, v)`` for each item, which costs
    O(number of inputs) per call. When that would copy more than a thousand
    tuple elements, the input tuple is built once and the uses are updated
    through onnx_ir's own (private) bookkeeping methods, the ones
    ``replace_input_with`` calls; if onnx_ir ever stores them differently, the
    public, slower path is taken instead.
    """
    if not changes:
        return
    if len(changes) * len(node.inputs) <= _CHEAP_REPLACEMENTS or not _can_set_inputs_directly(node):
        for index, value in changes.items():
            node.replace_input_with(index, value)
        return
    old_inputs = node.inputs
    new_inputs = list(old_inputs)
    for index, value in changes.items():
        if not 0 <= index < len(new_inputs):
            raise ValueError(f"Index out of range: {index}")
        new_inputs[index] = value
    node._inputs = tuple(new_inputs)  # private: see the docstring
    dropped: dict[ir.Value, None] = {}
    for index, value in changes.items():
        old = old_inputs[index]
        if old is value:
            continue
        if old is not None:
            old._remove_usage(node, index)
            dropped[old] = None
        if value is not None:
            value._add_usage(node, index)
    drop_sharding = getattr(node, "_drop_sharding_for_value", None)
    if drop_sharding is not None:
        still_used = set(new_inputs)
        for old in dropped:
            if old not in still_used:
                drop_sharding(old)


class Rewriter:
    """The graph changes of one folding run, and the bookkeeping they need.

    Dropped nodes are disconnected at once (so that ``uses()`` stays exact for
    the size policy) and removed from their graphs in one batch by
    :meth:`collect_garbage`, which also removes what became unused.
    """

    def __init__(self, model: ir.Model) -> None:
        self.model = model
        self.removed: set[ir.Node] = set()
        self._pending: dict[ir.Graph, list[ir.Node]] = {}
        self._released: dict[ir.Value, None] = {}
        self._names: Names | None = None
        self._output_index: dict[ir.Graph, dict[ir.Value, list[int]]] = {}

    # --- redirecting uses ------------------------------------------------------------------------

    def _output_positions(self, graph: ir.Graph, value: ir.Value) -> list[int]:
        """Where ``value`` is among ``graph.outputs``, from an index rebuilt only when stale."""
        index = self._output_index.get(graph)
        positions = None if index is None else index.get(value)
        outputs = graph.outputs
        if positions is None or any(
            i >= len(outputs) or outputs[i] is not value for i in positions
        ):
            index = {}
            for i, output in enumerate(outputs):
                index.setdefault(output, []).append(i)
            self._output_index[graph] = index
            positions = index.get(value, [])
        return positions

    def redirect(self, replacements: Mapping[ir.Value, ir.Value]) -> None:
        """Makes every user (and graph output) of each key use its replacement instead."""
        changes: dict[ir.Node, dict[int, ir.Value | None]] = {}
        for old, new in replacements.items():
            if old.is_graph_output():
                graph = old.graph
                assert graph is not None
                positions = self._output_positions(graph, old)
                for i in positions:
                    graph.outputs[i] = new
                index = self._output_index[graph]
                index.pop(old, None)
                index.setdefault(new, []).extend(positions)
            for use in old.uses():
                changes.setdefault(use.node, {})[use.idx] = new
        for node, node_changes in changes.items():
            set_inputs(node, node_changes)

    # --- replacing outputs by constants, dropping nodes ------------------------------------------

    def replace_with_constants(
        self, node: ir.Node, arrays: Sequence[np.ndarray | None], *, use_initializers: bool
    ) -> tuple[list[tuple[ir.Value, ir.TensorProtocol]], dict[ir.Value, ir.Value]]:
        """Replaces the node's outputs by constants with the same names, and drops the node.

        Each array becomes an initializer (``use_initializers``, main graph) or
        a ``Constant`` node inserted before ``node``; a None array leaves that
        (unused) output alone.

        Returns:
            The values of the Constant nodes made, with their tensors; and the
            new value of each replaced output.
        """
        graph = node.graph
        assert graph is not None
        replacements: dict[ir.Value, ir.Value] = {}
        constants: list[ir.Node] = []
        made: list[tuple[ir.Value, ir.TensorProtocol]] = []
        for i, (value, array) in enumerate(zip(node.outputs, arrays)):
            if array is None:
                continue
            tensor = make_tensor(array, value.name)
            new = ir.Value(
                name=value.name,
                type=ir.TensorType(tensor.dtype),
                shape=ir.Shape(array.shape),
                doc_string=value.doc_string,
                metadata_props=dict(value.metadata_props) or None,
            )
            replacements[value] = new
            if use_initializers:
                new.const_value = tensor
            else:
                name = node.name if i == 0 or not node.name else f"{node.name}_{i}"
                constants.append(
                    ir.Node(
                        "",
                        "Constant",
                        [],
                        [ir.AttrTensor("value", tensor)],
                        outputs=[new],
                        name=name,
                    )
                )
                made.append((new, tensor))
        if constants:
            graph.insert_before(node, constants)
        self.redirect(replacements)
        if use_initializers:
            for new in replacements.values():
                graph.register_initializer(new)
        self.drop(node)
        return made, replacements

    def drop(self, node: ir.Node) -> None:
        """Disconnects the node (and what its subgraphs use) and schedules its removal."""
        region, graphs = region_of(node)
        for member in region:
            changes = {i: None for i, value in enumerate(member.inputs) if value is not None}
            for value in member.inputs:
                if value is not None and value.graph not in graphs:
                    self._released[value] = None
            set_inputs(member, changes)
        self.removed.add(node)
        graph = node.graph
        assert graph is not None
        self._pending.setdefault(graph, []).append(node)

    def restore(self, folded: Sequence[tuple[ir.Node, Sequence[ir.Value | None], Mapping[ir.Value, ir.Value]]]) -> None:
        """Undoes ``replace_with_constants`` for some nodes, before garbage collection.

        Each node gets its inputs back; the uses of the constants made for it (by
        its users left in place, and graph outputs) go back to its outputs; those
        constants are removed. All inputs are restored before any use is moved,
        so that a node reading another restored node's constant ends up reading
        that node's output.

        Args:
            folded: (node, its inputs when it was folded, {output: the constant that replaced it}).
        """
        back: dict[ir.Value, ir.Value] = {}
        for node, inputs, replacements in folded:
            set_inputs(node, {i: v for i, v in enumerate(inputs) if v is not None})
            self.removed.discard(node)
            back.update({new: old for old, new in replacements.items()})
        self.redirect(back)
        restored = {node for node, _, _ in folded}
        for graph, nodes in self._pending.items():
            self._pending[graph] = [n for n in nodes if n not in restored]
        for new in back:
            if new.is_initializer():
                assert new.graph is not None
                new.graph.initializers.pop(new.name)
                continue
            producer = new.producer()
            if producer is not None and producer.graph is not None:
                producer.graph.remove(producer)

    def collect_garbage(self) -> tuple[int, int]:
        """Removes what the rewrites left unused: initializers, Constant and other dead nodes.

        Returns:
            How many nodes and initializers were removed (besides the dropped nodes).
        """
        removed_nodes = removed_initializers = 0
        while self._released:
            value, _ = self._released.popitem()
            if value.is_graph_output() or value.uses():
                continue
            if value.is_initializer():
                if not value.is_graph_input() and value.graph is not None:
                    value.graph.initializers.pop(value.name)
                    removed_initializers += 1
                continue
            producer = value.producer()
            if producer is None or producer in self.removed or producer.graph is None:
                continue
            if any(o.is_graph_output() or o.uses() for o in producer.outputs):
                continue
            self.drop(producer)
            removed_nodes += 1
        for graph, nodes in self._pending.items():
            graph.remove(nodes)
        self._pending.clear()
        return removed_nodes, removed_initializers

    # --- inlining the branch of a constant If ----------------------------------------------------

    def _names_of_model(self) -> Names:
        if self._names is None:
            self._names = Names(self.model)
        return self._names

    def _lift_initializers(
        self, branch: ir.Graph, parent: ir.Graph, use_initializers: bool
    ) -> tuple[list[ir.Node], dict[ir.Value, ir.Value]]:
        """Moves the branch's initializers to the parent, or turns them into Constant nodes.

        Returns:
            The Constant nodes made, and the values they replace.
        """
        names = self._names_of_model()
        constants: list[ir.Node] = []
        replaced: dict[ir.Value, ir.Value] = {}
        for value in list(branch.initializers.values()):
            branch.initializers.pop(value.name)
            names.dedupe_value(value)
            if use_initializers:
                parent.register_initializer(value)
                continue
            output = ir.Value(name=value.name, type=value.type, shape=value.shape)
            replaced[value] = output
            constants.append(
                ir.Node(
                    "",
                    "Constant",
                    [],
                    [ir.AttrTensor("value", value.const_value)],
                    outputs=[output],
                    name=value.name,
                )
            )
        self.redirect(replaced)
        return constants, replaced

    def inline_branch(
        self, if_node: ir.Node, branch: ir.Graph, *, use_initializers: bool
    ) -> list[ir.Node]:
        """Moves ``branch``'s nodes just before ``if_node`` and makes them produce the If's outputs.

        Each If output is replaced by the branch output it stands for, which takes
        the If output's name; a branch output that is not produced by a branch node
        (an outer value, an input) or that two If outputs share is passed through an
        ``Identity`` named after the If output. Other moved values and nodes are
        renamed only if their names clash. The If node is then dropped.

        Args:
            if_node: The If node, in its graph.
            branch: The branch it takes (one of its attributes); emptied.
            use_initializers: Whether branch initializers become initializers of the
                parent graph (main graph) or Constant nodes (subgraph, function).

        Returns:
            The nodes inserted into the parent graph, in order.
        """
        parent = if_node.graph
        assert parent is not None
        names = self._names_of_model()
        branch_outputs = list(branch.outputs)
        branch.outputs.clear()
        inlined, replaced = self._lift_initializers(branch, parent, use_initializers)
        branch_outputs = [replaced.get(v, v) for v in branch_outputs]
        moved = list(branch)
        branch.remove(moved)
        inlined.extend(moved)

        producers = set(inlined)
        claimed: dict[ir.Value, ir.Value] = {}
        for if_out, br_out in zip(if_node.outputs, branch_outputs):
            if br_out.producer() in producers and br_out not in claimed:
                claimed[br_out] = if_out
        for node in inlined:
            names.dedupe_node(node)
            for value in node.outputs:
                if value not in claimed:
                    names.dedupe_value(value)

        identities: list[ir.Node] = []
        replacements: dict[ir.Value, ir.Value] = {}
        for if_out, br_out in zip(if_node.outputs, branch_outputs):
            if claimed.get(br_out) is if_out:
                names.release_value(br_out.name)
                br_out.name = if_out.name
                if br_out.type is None:
                    br_out.type = if_out.type
                if br_out.shape is None:
                    br_out.shape = if_out.shape
                replacement = br_out
            else:
                replacement = ir.Value(name=if_out.name, type=if_out.type, shape=if_out.shape)
                name = names.node(f"{if_node.name or 'If'}_{if_out.name}")
                identities.append(
                    ir.Node("", "Identity", [br_out], outputs=[replacement], name=name)
                )
            replacements[if_out] = replacement
        self.redirect(replacements)
        inlined.extend(identities)
        parent.insert_before(if_node, inlined)
        self.drop(if_node)
        return inlined
