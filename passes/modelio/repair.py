"""Lossless repairs of forms the ONNX checker refuses and onnxruntime runs (used by the load).

* Nodes out of topological order (main graph and every subgraph) are sorted:
  stably, each node after the producers of its inputs and of the outer-scope
  values its subgraphs read. A graph with a cycle or an undefined input is left
  as it is (the checker then refuses it, naming the node).
* An empty graph name gets one (``main_graph``; a subgraph ``<node>_<attribute>``).
* A main-graph input or output whose tensor type has no ``shape`` field (written by
  onnx-graphsurgeon and ``make_tensor_value_info(name, T, None)``) is an unknown
  shape, as onnxruntime reads it: it is not changed (no shape says "any rank", which
  no shape field can), and the checker is run as if the field were there
  (:func:`shape_fields_present`); strict shape inference sees it unknown.

Each repair returns a one-line note for the report. :func:`locate` names the
value or node a checker failure is about, for the message of a refusal.
"""

from __future__ import annotations

import contextlib
import heapq
from collections.abc import Iterator

import onnx
import onnx.checker

from passes.errors import InputError

__all__ = ["MAIN_GRAPH_NAME", "free_names", "locate", "repair", "shape_fields_present", "shapeless_values"]

MAIN_GRAPH_NAME = "main_graph"
_NAME_LIMIT = 100


def short(name: str, limit: int = _NAME_LIMIT) -> str:
    """``repr(name)``, cut to about ``limit`` characters."""
    shown = repr(name)
    return shown if len(shown) <= limit else shown[: limit - 4] + "...'"


def repair(proto: onnx.ModelProto) -> list[str]:
    """Sorts unsorted graphs and names unnamed ones, in place; a note per repair."""
    notes: list[str] = []
    if not proto.HasField("graph"):
        return notes
    seen: set[str] = set()
    for output in proto.graph.output:
        if output.name in seen:
            raise InputError(f"graph output {short(output.name)} is listed twice: the IR this tool works on "
                             "holds a value once among the outputs (give the second its own Identity)")
        seen.add(output.name)
    if not proto.graph.name:
        proto.graph.name = MAIN_GRAPH_NAME
        notes.append(f"the main graph had an empty name: named {MAIN_GRAPH_NAME!r}")
    _repair_graph(proto.graph, "the main graph", notes)
    for function in proto.functions:
        for node in function.node:
            _repair_subgraphs(node, notes)
    for value in shapeless_values(proto):
        kind = "input" if any(v is value for v in proto.graph.input) else "output"
        notes.append(f"graph {kind} {short(value.name)} declares no shape: read as an unknown shape")
    return notes


def _repair_graph(graph: onnx.GraphProto, label: str, notes: list[str]) -> None:
    for node in graph.node:
        _repair_subgraphs(node, notes)
    if _sort(graph):
        notes.append(f"the nodes of {label} were not in topological order: sorted (stable)")


def _repair_subgraphs(node: onnx.NodeProto, notes: list[str]) -> None:
    for attr in node.attribute:
        for subgraph in [attr.g] if attr.HasField("g") else attr.graphs:
            if not subgraph.name:
                subgraph.name = f"{node.name or node.op_type}_{attr.name}"
                notes.append(f"a subgraph ({attr.name} of {node.op_type} node {short(node.name)}) had an "
                             f"empty name: named {short(subgraph.name)}")  # fmt: skip
            _repair_graph(subgraph, f"subgraph {short(subgraph.name)}", notes)


def free_names(graph: onnx.GraphProto) -> set[str]:
    """The names ``graph`` (nested subgraphs included) reads from enclosing scopes (its outer
    references: what a subgraph needs from outside to be a graph of its own)."""
    defined = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    defined |= {t.name for t in graph.sparse_initializer}
    read: set[str] = set()
    for node in graph.node:
        read.update(node.input)
        read |= _subgraph_reads(node)
        defined.update(node.output)
    read |= {v.name for v in graph.output}
    return read - defined - {""}


def _subgraph_reads(node: onnx.NodeProto) -> set[str]:
    found: set[str] = set()
    for attr in node.attribute:
        for subgraph in [attr.g] if attr.HasField("g") else attr.graphs:
            found |= free_names(subgraph)
    return found


def _sort(graph: onnx.GraphProto) -> bool:
    """Sorts ``graph.node`` topologically, keeping the given order where it is free; whether it moved any.

    A cycle, or a name produced twice, leaves the graph as it is.
    """
    nodes = list(graph.node)
    producer: dict[str, int] = {}
    for index, node in enumerate(nodes):
        for name in node.output:
            if name:
                if name in producer:
                    return False
                producer[name] = index
    needs: list[set[int]] = []
    unsorted = False
    for index, node in enumerate(nodes):
        reads = set(node.input) | _subgraph_reads(node)
        deps = {producer[name] for name in reads if name in producer}
        if index in deps:
            return False
        unsorted |= any(d > index for d in deps)
        needs.append(deps)
    if not unsorted:
        return False
    users: list[list[int]] = [[] for _ in nodes]
    waiting = [len(deps) for deps in needs]
    for index, deps in enumerate(needs):
        for dep in deps:
            users[dep].append(index)
    ready = [i for i, n in enumerate(waiting) if n == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        index = heapq.heappop(ready)
        order.append(index)
        for user in users[index]:
            waiting[user] -= 1
            if waiting[user] == 0:
                heapq.heappush(ready, user)
    if len(order) != len(nodes):
        return False  # a cycle: the checker refuses it
    sorted_nodes = [nodes[i] for i in order]
    del graph.node[:]
    graph.node.extend(sorted_nodes)
    return True


def shapeless_values(proto: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The main graph's inputs and outputs whose tensor type has no ``shape`` field."""
    found = []
    for value in [*proto.graph.input, *proto.graph.output]:
        if value.type.HasField("tensor_type") and not value.type.tensor_type.HasField("shape"):
            found.append(value)
    return found


@contextlib.contextmanager
def shape_fields_present(proto: onnx.ModelProto) -> Iterator[None]:
    """While open, the shapeless inputs and outputs have an empty ``shape`` field (for the checker's
    structural check, which requires the field; shape inference must run outside, where they are unknown)."""
    values = shapeless_values(proto)
    for value in values:
        value.type.tensor_type.shape.SetInParent()
    try:
        yield
    finally:
        for value in values:
            value.type.tensor_type.ClearField("shape")


def locate(proto: onnx.ModelProto, error: Exception) -> str | None:
    """The main-graph value or node the checker's ``error`` is about, as ``"graph output 'y'"``, if it can tell.

    The checker's own messages do not always say (``Field 'shape' of 'type' is required but
    missing``): each value and node is checked alone until one fails.
    """
    ctx = onnx.checker.C.CheckerContext()
    ctx.ir_version = proto.ir_version
    ctx.opset_imports = {o.domain: o.version for o in proto.opset_import}
    lex = onnx.checker.C.LexicalScopeContext()
    for kind, values in (("graph input", proto.graph.input), ("graph output", proto.graph.output)):
        for value in values:
            try:
                onnx.checker.check_value_info(value, ctx)
            except (onnx.checker.ValidationError, RuntimeError):
                return f"{kind} {short(value.name)}"
    for node in proto.graph.node:
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            continue  # checked alone, its subgraphs' reads of outer values look undefined: not blamed
        try:
            onnx.checker.check_node(node, ctx, lex)
        except (onnx.checker.ValidationError, RuntimeError):
            return f"{node.op_type} node {short(node.name)}"
        except TypeError:
            return None  # an onnx without the lexical scope argument
    return None
