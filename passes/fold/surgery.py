"""Graph surgery for the folding pass: the region a node spans, inlining If branches."""

from __future__ import annotations

import onnx_ir as ir

from passes.ir.names import Names

__all__ = ["inline_branch", "region_of", "subgraphs_of"]

_GRAPH_TYPES = (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)


def subgraphs_of(node: ir.Node) -> list[ir.Graph]:
    """The graphs held by the node's attributes (If branches, Loop/Scan bodies...)."""
    graphs: list[ir.Graph] = []
    for attr in node.attributes.values():
        if not isinstance(attr, ir.Attr) or attr.type not in _GRAPH_TYPES or attr.is_ref():
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


def _lift_initializers(
    branch: ir.Graph, parent: ir.Graph, names: Names, use_initializers: bool
) -> tuple[list[ir.Node], dict[ir.Value, ir.Value]]:
    """Moves the branch's initializers to the parent, or turns them into Constant nodes.

    Returns:
        The Constant nodes made, and the values they replace.
    """
    constants: list[ir.Node] = []
    replaced: dict[ir.Value, ir.Value] = {}
    for value in list(branch.initializers.values()):
        branch.initializers.pop(value.name)
        names.dedupe_value(value)
        if use_initializers:
            parent.register_initializer(value)
            continue
        output = ir.Value(name=value.name, type=value.type, shape=value.shape)
        value.replace_all_uses_with(output)
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
    return constants, replaced


def inline_branch(
    if_node: ir.Node, branch: ir.Graph, names: Names, *, use_initializers: bool
) -> list[ir.Node]:
    """Moves ``branch``'s nodes just before ``if_node`` and makes them produce the If's outputs.

    Each If output is replaced by the branch output it stands for, which takes
    the If output's name; a branch output that is not produced by a branch node
    (an outer value, an input) or that two If outputs share is passed through an
    ``Identity`` named after the If output. Other moved values and nodes are
    renamed only if their names clash. The If node itself is left for the
    caller to drop.

    Args:
        if_node: The If node, in its graph.
        branch: The branch it takes (one of its attributes); emptied.
        names: The model's name registry.
        use_initializers: Whether branch initializers become initializers of the
            parent graph (main graph) or Constant nodes (subgraph, function).

    Returns:
        The nodes inserted into the parent graph, in order.
    """
    parent = if_node.graph
    assert parent is not None
    branch_outputs = list(branch.outputs)
    branch.outputs.clear()
    inlined, replaced = _lift_initializers(branch, parent, names, use_initializers)
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
            identities.append(ir.Node("", "Identity", [br_out], outputs=[replacement], name=name))
        if_out.replace_all_uses_with(replacement, replace_graph_outputs=True)
    inlined.extend(identities)
    parent.insert_before(if_node, inlined)
    return inlined
