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
* A declared dim of ``-1`` (or any negative size: onnx-graphsurgeon and tract
  write ``-1`` for an unknown dim) on a graph input, output or ``value_info``,
  in the main graph, every subgraph and every function, is an unknown dim, as
  onnxruntime reads it: the dim is left unnamed. Not a fresh name: ``-1``
  says nothing of which dims are equal, and the check sizes an unnamed dim of
  an input by its position, as it would a name it does not recognise; a name
  would also become a dim that ``--fix-dim`` and ``--dim`` could address but
  that the model never stated.

Each repair returns a one-line note for the report. :func:`locate` names the
value or node a checker failure is about, for the message of a refusal.
"""

from __future__ import annotations

import contextlib
import heapq
from collections.abc import Iterator

import onnx
import onnx.checker
import onnx_ir as ir

from passes.errors import InputError
from passes.ir import walk

__all__ = [
    "MAIN_GRAPH_NAME", "constant_initializer_inputs", "free_names", "locate", "negative_dims_note", "repair", "shape_fields_present",
    "shapeless_values", "unknown_negative_dims", "unknown_negative_ir_dims",
]

MAIN_GRAPH_NAME = "main_graph"
_NAME_LIMIT = 100


def short(name: str, limit: int = _NAME_LIMIT) -> str:
    """``repr(name)``, cut to about ``limit`` characters."""
    shown = repr(name)
    return shown if len(shown) <= limit else shown[: limit - 4] + "...'"


def repair(proto: onnx.ModelProto, *, plain: bool = False) -> list[str]:
    """Sorts unsorted graphs and names unnamed ones, in place; a note per repair.

    ``plain``: no attribute of ``proto`` holds a graph (known from its survey,
    :mod:`passes.modelio.survey`), so no node's attributes are looked at for subgraphs.
    """
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
    _repair_graph(proto.graph, "the main graph", notes, plain)
    for function in () if plain else proto.functions:
        for node in function.node:
            _repair_subgraphs(node, notes)
    for value in shapeless_values(proto):
        kind = "input" if any(v is value for v in proto.graph.input) else "output"
        notes.append(f"graph {kind} {short(value.name)} declares no shape: read as an unknown shape")
    note = negative_dims_note(unknown_negative_dims(proto, plain=plain))
    if note is not None:
        notes.append(note)
    return notes


def constant_initializer_inputs(proto: onnx.ModelProto) -> list[str]:
    """The proto form of :func:`passes.ir.initializer_inputs.freeze_initializer_inputs`, for the load of an
    IR < 4 model: the main graph's inputs that an initializer backs are removed from its inputs, in
    place (the caller raises the IR version); their names."""
    graph = proto.graph
    initializers = {t.name for t in graph.initializer}
    frozen = [value.name for value in graph.input if value.name in initializers]
    for i in reversed(range(len(graph.input))):
        if graph.input[i].name in initializers:
            del graph.input[i]
    return frozen


def negative_dims_note(changed: list[str]) -> str | None:
    """The note of :func:`unknown_negative_dims` (or :func:`unknown_negative_ir_dims`); None for no change."""
    if not changed:
        return None
    shown = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
    return (f"declared negative dims (onnx-graphsurgeon's and tract's -1 for an unknown dim) read as unknown dims, "
            f"as onnxruntime reads them: {shown}")


def unknown_negative_ir_dims(model: ir.Model) -> list[str]:
    """:func:`unknown_negative_dims` on a model built in memory (``passes.optimize(ir_model)``), in place."""
    changed: list[str] = []
    for scope in walk.iter_scopes(model):
        body = scope.body
        where = ("graph" if scope.owner is None else f"subgraph {short(body.name or '')}") if scope.function is None \
            else f"function {short(scope.function.name)}"
        roles = [("input", v) for v in body.inputs] + [("output", v) for v in body.outputs]
        roles += [("value", v) for node in body for v in node.outputs if v not in body.outputs]
        for role, value in roles:
            if value.shape is not None and any(isinstance(d, int) and d < 0 for d in value.shape):
                before = "[" + ", ".join(str(d) if isinstance(d, int) else (d.value or "?") for d in value.shape) + "]"
                value.shape = ir.Shape([None if isinstance(d, int) and d < 0 else d for d in value.shape])
                changed.append(f"{where} {role} {short(value.name or '')} {before}")
    return changed


def unknown_negative_dims(proto: onnx.ModelProto, *, plain: bool = False) -> list[str]:
    """Makes every negative declared dim of ``proto`` an unknown (unnamed) dim, in place; each value
    changed, as ``"graph input 'x' [-1, 3]"`` (its declared shape before). ``plain``: as for
    :func:`repair` (no node is looked at for subgraphs)."""
    changed: list[str] = []
    stack: list[tuple[str, onnx.GraphProto | onnx.FunctionProto]] = [("graph", proto.graph)]
    stack += [(f"function {short(f.name)}", f) for f in proto.functions]
    while stack:
        where, body = stack.pop()
        roles = [("value", body.value_info)]
        if isinstance(body, onnx.GraphProto):
            roles = [("input", body.input), ("output", body.output), *roles]
        for role, values in roles:
            for value in values:
                before = _negative_shape(value.type)
                if before is not None:
                    changed.append(f"{where} {role} {short(value.name)} {before}")
        for node in () if plain else body.node:
            stack.extend((f"subgraph {short(g.name)}", g) for g in _subgraphs(node))
    return changed


def _negative_shape(type_proto: onnx.TypeProto) -> str | None:
    """Clears the negative dims of ``type_proto`` (and of the types it holds); its shape before, or None."""
    kind = type_proto.WhichOneof("value")
    if kind in ("sequence_type", "optional_type"):
        return _negative_shape(getattr(type_proto, kind).elem_type)
    if kind == "map_type":
        return _negative_shape(type_proto.map_type.value_type)
    if kind not in ("tensor_type", "sparse_tensor_type") or not getattr(type_proto, kind).HasField("shape"):
        return None
    dims = getattr(type_proto, kind).shape.dim
    if not any(d.HasField("dim_value") and d.dim_value < 0 for d in dims):
        return None
    before = "[" + ", ".join(str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in dims) + "]"
    for d in dims:
        if d.HasField("dim_value") and d.dim_value < 0:
            d.ClearField("dim_value")
    return before


def _repair_graph(graph: onnx.GraphProto, label: str, notes: list[str], plain: bool = False) -> None:
    nested = set() if plain else {index for index, node in enumerate(graph.node) if _subgraphs(node)}
    for index in sorted(nested):
        _repair_subgraphs(graph.node[index], notes)
    if _sort(graph, nested):
        notes.append(f"the nodes of {label} were not in topological order: sorted (stable)")


def _subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The subgraphs of ``node``'s attributes."""
    found: list[onnx.GraphProto] = []
    for attr in node.attribute:
        if attr.HasField("g"):
            found.append(attr.g)
        elif attr.graphs:
            found.extend(attr.graphs)
    return found


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


def _sort(graph: onnx.GraphProto, nested: set[int]) -> bool:
    """Sorts ``graph.node`` topologically, keeping the given order where it is free; whether it moved any.

    ``nested``: the indices of the nodes with subgraphs (whose outer reads count as inputs). A cycle,
    or a name produced twice, leaves the graph as it is.
    """
    nodes = list(graph.node)
    producer: dict[str, int] = {}
    for index, node in enumerate(nodes):
        for name in node.output:
            if name:
                if name in producer:
                    return False
                producer[name] = index
    unsorted = False  # the common case first: one look at each input, no set built
    for index, node in enumerate(nodes):
        reads = _subgraph_reads(node) if index in nested else ()
        for name in (*node.input, *reads):
            at = producer.get(name)
            if at is not None and at >= index:
                if at == index:
                    return False
                unsorted = True
    if not unsorted:
        return False
    needs: list[set[int]] = []
    for index, node in enumerate(nodes):
        reads = set(node.input) | (_subgraph_reads(node) if index in nested else set())
        needs.append({producer[name] for name in reads if name in producer})
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
