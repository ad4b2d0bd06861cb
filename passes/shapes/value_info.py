"""The last step of a run: every value a node computes carries its element type and shape.

Like onnxsim's and onnxslim's outputs, the result states a ``value_info``
(type and shape) for every intermediate value of the main graph and of its
subgraphs that onnx shape inference can type, so that viewers show a shape on
every edge. Inference runs once, on the weight-free view
(:func:`passes.ir.inference.infer_all`), so a model over 2 GB is no obstacle.
Symbolic dims are kept (inference carries the inputs' dim names through the
ops), and the fresh symbols inference makes up (``unk__N``) are named by what
the main graph proves: the int or the input's dim they equal, and never a
name the model already uses for another dim (:mod:`passes.shapes.symbols`).
A shape already stated is never replaced, only completed: a dim
inference proves static where the statement has a name or nothing becomes
that size (so a graph output declared ``[batch, ?]`` becomes ``[1, 256]`` once
the inputs are static), and a statement inference contradicts is left for the
ONNX checker to refuse (it would be a pass's bug, not to be hidden here). Initializers
and graph inputs state no value_info (an initializer's tensor carries its own
type; an initializer that is a graph input keeps its type there).

It runs after the clean-up, as a step of the pass loop rather than in the
save: every route (the command, ``passes.optimize`` in memory, the reruns that
look for the pass that brought a mismatch) then returns the same typed model,
and the save stays a writer that knows nothing of inference. The list
attributes of ops outside the ONNX domain (ai.onnx.ml's trees) are never
decoded for this: inference sees them empty, and the values computed from
such a node keep what the model states, typed or not.
"""

from __future__ import annotations

from typing import Any

import onnx_ir as ir

from passes.ir import known, types, walk
from passes.ir.inference import infer_all
from passes.shapes import symbols

__all__ = ["TypeValuesPass"]


def _tighter(declared: ir.Shape | None, inferred: ir.Shape | None) -> ir.Shape | None:
    """``declared`` with the dims inference proves static; None if that changes nothing."""
    if inferred is None:
        return None
    if declared is None:
        return inferred
    if len(declared) != len(inferred):
        return None
    dims = [i if not isinstance(d, int) and isinstance(i, int) else d for d, i in zip(declared, inferred)]
    new = ir.Shape(dims)
    return new if new != declared else None


_LISTS = (ir.AttributeType.INTS, ir.AttributeType.FLOATS, ir.AttributeType.STRINGS)


def _list_ops(model: ir.Model) -> list[ir.Node]:
    """Nodes outside the ONNX domain with list attributes (ai.onnx.ml's trees, classifiers...).

    Their lists may be large and left in the file undecoded (:mod:`passes.modelio.detach`);
    inference reads some of their lengths (a classifier's width), so what it finds
    downstream of them is not taken (see :func:`_tainted`).
    """
    found = []
    for scope in walk.iter_scopes(model, functions=False):
        for node in scope.body:
            if node.domain in walk.DEFAULT_DOMAINS:  # the domain first: ONNX ops are never asked about
                continue
            if any(a.type in _LISTS for a in node.attributes.values() if not a.is_ref()):
                found.append(node)
    return found


def _tainted(model: ir.Model, sources: list[ir.Node]) -> set[ir.Value]:
    """Values computed by ``sources`` or by a node that reads one of them (directly or in a subgraph)."""
    tainted = {v for node in sources for v in node.outputs}
    nodes = [node for node, _ in walk.iter_nodes(model, functions=False)]
    changed = True
    while changed:
        changed = False
        for node in nodes:
            if all(v in tainted for v in node.outputs):
                continue
            reads = set(node.inputs)
            for attr in node.attributes.values():
                if not attr.is_ref() and attr.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS):
                    for graph in attr.value if attr.type == ir.AttributeType.GRAPHS else [attr.value]:
                        reads.update(v for inner in ir.traversal.RecursiveGraphIterator(graph) for v in inner.inputs)
            if reads & tainted:
                tainted.update(node.outputs)
                changed = True
    return tainted


def _infer_without_lists(model: ir.Model, nodes: list[ir.Node]) -> dict[ir.Value, Any]:
    """:func:`infer_all` with the list attributes of ``nodes`` empty (never decoded), then restored."""
    saved = []
    for node in nodes:
        for name, attr in list(node.attributes.items()):
            if not attr.is_ref() and attr.type in _LISTS:
                saved.append((node, name, attr))
                node.attributes[name] = ir.Attr(name, attr.type, [])
    try:
        return infer_all(model, remember=False)  # what it finds downstream of them is not all true
    finally:
        for node, name, attr in saved:
            node.attributes[name] = attr


class TypeValuesPass(ir.passes.InPlacePass):
    """Sets the type and shape inference finds on every computed value (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.stats: dict[str, Any] = {}

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        lists = _list_ops(model)
        # What the run's passes kept up to date, when it covers every value; else one inference.
        inferred: dict[ir.Value, Any] | None = None if lists else known.lookup(model)
        if inferred is None and not lists and (kept := known.inferred(model)) is not None:
            inferred = dict(kept)  # the last pass's inference of the model as it still is (simplify's)
        self.stats = {"inferred": inferred is None}
        if inferred is None:
            inferred = _infer_without_lists(model, lists) if lists else infer_all(model)
        for value in _tainted(model, lists) if lists else ():
            inferred.pop(value, None)
        renaming = symbols.plan(model, inferred)
        typed = outputs = 0
        for graph in walk.graphs(model):
            graph_outputs = set(graph.outputs)
            in_main = graph is model.graph
            initializers = graph.initializers
            for node in graph:
                for value in node.outputs:
                    found = inferred.get(value)
                    if found is None or value.name in initializers:
                        continue
                    dtype, shape = found
                    if value in graph_outputs and not in_main:
                        continue
                    shape = renaming.shape(shape, in_main=in_main)
                    new = _tighter(value.shape, shape)
                    if value in graph_outputs:
                        if new is not None:
                            value.shape = new
                            outputs += 1
                        continue
                    changed = False
                    if dtype is not None and value.type is None:
                        value.type = ir.TensorType(dtype)
                        changed = True
                    if new is not None and value.type is not None:  # a value_info needs its type
                        value.shape = new
                        changed = True
                    typed += changed
        types.untype_initializers(model)  # after the prover, which reads their shapes
        self.stats = {**self.stats, "typed": typed, "outputs_tightened": outputs, "symbols_named": renaming.proved,
                      "symbols_renamed_apart": renaming.apart}
        return ir.passes.PassResult(model, modified=bool(typed or outputs))
