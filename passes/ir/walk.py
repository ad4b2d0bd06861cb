"""Walking a model: every graph, subgraph and model-local function, with its opsets.

Passes match nodes on (domain, op_type) *and* the opset version that applies
to them. Nodes of the main graph and of its subgraphs use the model's opset
imports; nodes of a model-local function (and of its subgraphs) use the
function's own opset imports.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, MutableMapping

import onnx_ir as ir

__all__ = [
    "Scope",
    "default_opset",
    "graphs",
    "iter_nodes",
    "iter_scopes",
    "normalize_domain",
    "opset_of",
    "set_opset",
]

DEFAULT_DOMAINS = ("", "ai.onnx")


def normalize_domain(domain: str) -> str:
    """``"ai.onnx"`` is another spelling of the default domain ``""``."""
    return "" if domain in DEFAULT_DOMAINS else domain


def opset_of(opset_imports: MutableMapping[str, int], domain: str) -> int | None:
    """The version imported for ``domain``, accepting either spelling of the default domain."""
    domain = normalize_domain(domain)
    if domain == "":
        for key in DEFAULT_DOMAINS:
            if key in opset_imports:
                return opset_imports[key]
        return None
    return opset_imports.get(domain)


def default_opset(opset_imports: MutableMapping[str, int]) -> int | None:
    """The version imported for the default ONNX domain, or None if it is not imported."""
    return opset_of(opset_imports, "")


def set_opset(opset_imports: MutableMapping[str, int], domain: str, version: int) -> None:
    """Sets the version of ``domain``, keeping the spelling the model already uses."""
    domain = normalize_domain(domain)
    if domain == "" and "ai.onnx" in opset_imports and "" not in opset_imports:
        opset_imports["ai.onnx"] = version
    else:
        opset_imports[domain] = version


@dataclasses.dataclass(frozen=True)
class Scope:
    """A graph (main graph or subgraph) or a function body, and the opsets its nodes use.

    Attributes:
        body: The graph or function whose nodes are listed directly in it.
        opset_imports: The opset imports that apply (the model's, or the function's).
        function: The model-local function this scope belongs to, if any.
        owner: The node whose attribute holds this subgraph; None for the main
            graph and for function bodies.
    """

    body: ir.Graph | ir.Function
    opset_imports: MutableMapping[str, int]
    function: ir.Function | None = None
    owner: ir.Node | None = None

    @property
    def in_function(self) -> bool:
        return self.function is not None

    def opset(self, domain: str = "") -> int | None:
        return opset_of(self.opset_imports, domain)


_GRAPH_TYPES = (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)


def _subgraphs(node: ir.Node) -> Iterator[ir.Graph]:
    # The attributes' own dict: iterating the mapping's values() view costs a lookup per item.
    attributes = node.attributes
    for attr in getattr(attributes, "data", attributes).values():
        kind = getattr(attr, "type", None)
        if kind == ir.AttributeType.GRAPH and isinstance(attr, ir.Attr):
            yield attr.as_graph()
        elif kind == ir.AttributeType.GRAPHS and isinstance(attr, ir.Attr):
            yield from attr.as_graphs()


def graphs(model: ir.Model) -> list[ir.Graph]:
    """The main graph and its subgraphs at every depth, in the order ``ir.Model.graphs()`` gives.

    onnx_ir's walks every node through a stack of generators (half a second
    for 50k nodes, and the save asks several times); this reads each node's
    attributes once.
    """
    found: dict[ir.Graph, None] = {}

    def visit(graph: ir.Graph) -> None:
        found[graph] = None
        for node in graph:
            attributes = node.attributes
            for attr in getattr(attributes, "data", attributes).values():
                if getattr(attr, "type", None) in _GRAPH_TYPES:  # then the subgraphs, without a generator
                    for sub in _subgraphs(node):
                        if sub not in found:
                            visit(sub)
                    break

    visit(model.graph)
    return list(found)


def _graph_scopes(
    body: ir.Graph | ir.Function,
    opset_imports: MutableMapping[str, int],
    function: ir.Function | None,
    owner: ir.Node | None = None,
) -> Iterator[Scope]:
    yield Scope(body, opset_imports, function, owner)
    for node in list(body):
        attributes = node.attributes
        for attr in getattr(attributes, "data", attributes).values():
            if getattr(attr, "type", None) in _GRAPH_TYPES:  # no generator for the nodes without subgraphs
                for sub in _subgraphs(node):
                    yield from _graph_scopes(sub, opset_imports, function, node)
                break


def iter_scopes(model: ir.Model, *, functions: bool = True) -> Iterator[Scope]:
    """Yields the main graph, every subgraph (If/Loop/Scan, nested) and every function body.

    Each graph is yielded before its subgraphs. The node lists of a scope may be
    changed while iterating as long as subgraphs are not added or removed.
    """
    yield from _graph_scopes(model.graph, model.opset_imports, None)
    if functions:
        for function in list(model.functions.values()):
            yield from _graph_scopes(function, function.opset_imports, function)


def iter_nodes(model: ir.Model, *, functions: bool = True) -> Iterator[tuple[ir.Node, Scope]]:
    """Yields every node of the model with the scope it belongs to."""
    for scope in iter_scopes(model, functions=functions):
        for node in list(scope.body):
            yield node, scope
