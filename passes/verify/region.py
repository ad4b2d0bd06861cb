"""Parts of a model as models of their own: what a reproduction of a failed check is made of.

* :class:`Index`: one graph's producers and what each node reads
  (its inputs and the outer values its subgraphs refer to).
* :func:`cone`: the nodes that compute some values from others (the *cuts*:
  values fed as graph inputs), with the inputs and initializers they need.
* :func:`region_model`: those nodes as a model: the cuts as graph inputs
  (declared with the shapes they had), only the initializers, functions and
  opset imports the nodes use.
* :func:`branch_model`, :func:`body_model`, :func:`call_model`: an If branch, a
  Loop body (its first iteration) or a model-local function's call as a graph of
  its own, the values it reads from outside as graph inputs.
* :func:`write_model`: a region model saved with its small tensors inline and its
  large ones in ``NAME.data`` (only theirs), read from the source's data files.

Nothing here runs a model; :mod:`passes.verify.reduce` decides which regions to build.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Iterable, Mapping, Sequence

import onnx
import onnx.inliner

from passes.modelio.repair import free_names

__all__ = ["LARGE_TENSOR", "Index", "body_model", "branch_model", "call_model", "cone", "declare_outputs",
           "region_model", "write_model"]

#: Tensors of at least this many bytes are written to the reproduction's data file.
LARGE_TENSOR = 1 << 20

#: (element type, shape) of a value that becomes a graph input.
InputType = tuple[int, Sequence[int]]


def _subgraphs(node: onnx.NodeProto) -> Iterable[onnx.GraphProto]:
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == onnx.AttributeProto.GRAPHS:
            yield from attr.graphs


class Index:
    """One graph's producers and what each node reads, by name."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.graph = graph
        self.nodes = list(graph.node)
        self.initializers = {t.name: t for t in graph.initializer}
        self.inputs = [i.name for i in graph.input if i.name not in self.initializers]
        self.producer: dict[str, int] = {}
        self.reads: list[list[str]] = []
        for position, node in enumerate(self.nodes):
            reads = [n for n in node.input if n]
            for sub in _subgraphs(node):
                reads.extend(sorted(free_names(sub) - set(reads)))
            self.reads.append(reads)
            for name in node.output:
                if name:
                    self.producer[name] = position

    def names(self) -> set[str]:
        """Every value the graph defines (inputs, initializers, node outputs)."""
        return set(self.inputs) | set(self.initializers) | set(self.producer)


def cone(index: Index, targets: Iterable[str], cuts: set[str]) -> tuple[list[int], list[str], list[str], list[str]]:
    """The nodes (in graph order) that compute ``targets`` from ``cuts``, the graph inputs and
    initializers; the values they read that become inputs (cuts and graph inputs), the
    initializers they use, and the names nothing defines (an invalid region unless empty)."""
    nodes: set[int] = set()
    inputs: list[str] = []
    weights: list[str] = []
    missing: list[str] = []
    seen: set[str] = set()
    stack = [t for t in targets][::-1]
    graph_inputs = set(index.inputs)
    while stack:
        name = stack.pop()
        if not name or name in seen:
            continue
        seen.add(name)
        if name in cuts or (name in graph_inputs and name not in index.producer):
            inputs.append(name)
        elif name in index.initializers:
            weights.append(name)
        elif name in index.producer:
            position = index.producer[name]
            if position not in nodes:
                nodes.add(position)
                stack.extend(index.reads[position][::-1])
        else:
            missing.append(name)
    return sorted(nodes), inputs, weights, missing


def _value_info(name: str, elem_type: int, shape: Sequence[int] | None) -> onnx.ValueInfoProto:
    return onnx.helper.make_tensor_value_info(name, elem_type, list(shape) if shape is not None else None)


def _walk_nodes(nodes: Iterable[onnx.NodeProto]) -> Iterable[onnx.NodeProto]:
    for node in nodes:
        yield node
        for sub in _subgraphs(node):
            yield from _walk_nodes(sub.node)


def _finish(model: onnx.ModelProto, source: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` (its graph set) given ``source``'s IR version, and only the functions and opset
    imports its nodes use (through the functions they call too; the default domain's always)."""
    model.ir_version = source.ir_version
    model.producer_name = "onnx-optimize --repro"
    functions = {(f.domain, f.name, getattr(f, "overload", "")): f for f in source.functions}
    used: dict[tuple[str, str, str], onnx.FunctionProto] = {}
    domains = {""}  # the default domain's import even without a node: a model must import some opset
    pending = list(_walk_nodes(model.graph.node))
    while pending:
        node = pending.pop()
        domains.add(node.domain)
        key = (node.domain, node.op_type, getattr(node, "overload", ""))
        if key in functions and key not in used:
            used[key] = functions[key]
            pending.extend(_walk_nodes(functions[key].node))
    model.functions.extend(f for f in source.functions if (f.domain, f.name, getattr(f, "overload", "")) in used)
    aliases = {"ai.onnx": ""}
    for opset in source.opset_import:
        if aliases.get(opset.domain, opset.domain) in {aliases.get(d, d) for d in domains}:
            model.opset_import.append(opset)
    return model


def region_model(model: onnx.ModelProto, index: Index, nodes: Sequence[int], inputs: Mapping[str, InputType],
                 weights: Iterable[str], outputs: Mapping[str, int], name: str) -> onnx.ModelProto:  # fmt: skip
    """``nodes`` of ``index``'s graph as a model: ``inputs`` (name: element type and shape) as
    graph inputs, ``weights`` as initializers, ``outputs`` (name: element type) as outputs."""
    graph = onnx.GraphProto(name=name)
    graph.node.extend(index.nodes[i] for i in nodes)
    graph.input.extend(_value_info(n, t, s) for n, (t, s) in inputs.items())
    graph.initializer.extend(index.initializers[w] for w in weights)
    graph.output.extend(_value_info(n, t, None) for n, t in outputs.items())
    return _finish(onnx.ModelProto(graph=graph), model)


def _rename(graph: onnx.GraphProto, mapping: Mapping[str, str]) -> None:
    """Renames values throughout ``graph`` and its subgraphs."""
    for info in [*graph.input, *graph.output]:
        info.name = mapping.get(info.name, info.name)
    for node in graph.node:
        node.input[:] = [mapping.get(n, n) for n in node.input]
        node.output[:] = [mapping.get(n, n) for n in node.output]
        for sub in _subgraphs(node):
            _rename(sub, mapping)


def _outputs_named(graph: onnx.GraphProto, names: Sequence[str]) -> None:
    """The graph's outputs renamed to ``names`` (positionally): the value renamed where the graph
    makes it and the new name is free, else an Identity."""
    defined = {n for node in graph.node for n in node.output} | {i.name for i in graph.input}
    used = defined | free_names(graph) | {t.name for t in graph.initializer}
    for info, new in zip(list(graph.output), names):
        old = info.name
        if old == new:
            continue
        produced = any(old in node.output for node in graph.node)
        if produced and new not in used and sum(o.name == old for o in graph.output) == 1:
            _rename(graph, {old: new})
        else:
            graph.node.append(onnx.helper.make_node("Identity", [old], [new], name=f"{new}__repro"))
            info.name = new
        used.add(new)


def _standalone(model: onnx.ModelProto, index: Index, graph: onnx.GraphProto,
                types: Mapping[str, InputType], name: str) -> onnx.ModelProto:  # fmt: skip
    """``graph`` (a subgraph of ``index``'s graph, copied) as a model: the outer values it reads
    as inputs (``types``), or as initializers where they are ``index``'s initializers."""
    graph.name = name
    for outer in sorted(free_names(graph)):
        if outer in index.initializers:
            graph.initializer.append(index.initializers[outer])
        else:
            elem_type, shape = types[outer]
            graph.input.append(_value_info(outer, elem_type, shape))
    return _finish(onnx.ModelProto(graph=graph), model)


def _attribute_graph(node: onnx.NodeProto, name: str) -> onnx.GraphProto:
    (attr,) = [a for a in node.attribute if a.name == name]
    copy = onnx.GraphProto()
    copy.CopyFrom(attr.g)
    return copy


def branch_model(model: onnx.ModelProto, index: Index, position: int, then: bool,
                 types: Mapping[str, InputType], outputs: Sequence[str] | None = None) -> onnx.ModelProto:  # fmt: skip
    """The If node's branch that ``then`` names as a model of its own: its outputs named as the
    If's (or ``outputs``: another model's If's), the outer values it reads as inputs (``types``:
    element type and shape by name)."""
    node = index.nodes[position]
    graph = _attribute_graph(node, "then_branch" if then else "else_branch")
    _outputs_named(graph, list(outputs if outputs is not None else node.output))
    return _standalone(model, index, graph, types, f"{node.name or 'If'}_{'then' if then else 'else'}_branch")


def body_model(model: onnx.ModelProto, index: Index, position: int, types: Mapping[str, InputType],
               formal: Sequence[str] | None = None, outputs: Sequence[str] | None = None,
               ) -> onnx.ModelProto:  # fmt: skip
    """The Loop node's body as a model of its own (fed one iteration's inputs): its formal inputs
    and outputs renamed to ``formal`` and ``outputs`` (positionally: another model's body names),
    the outer values it reads as inputs (``types``)."""
    node = index.nodes[position]
    graph = _attribute_graph(node, "body")
    if formal is not None:
        mapping = {i.name: new for i, new in zip(graph.input, formal) if i.name != new}
        _rename(graph, mapping)
    if outputs is not None:
        _outputs_named(graph, outputs)
    for info in graph.input:  # one iteration's values: their shapes as fed
        if info.name in types:
            info.CopyFrom(_value_info(info.name, *types[info.name]))
    return _standalone(model, index, graph, types, f"{node.name or 'Loop'}_body")


def call_model(model: onnx.ModelProto, index: Index, position: int,
               types: Mapping[str, tuple[int, Sequence[int] | None]]) -> onnx.ModelProto:  # fmt: skip
    """A call of a model-local function as a model of its own, the call inlined (its body's
    values named as onnx's inliner names them, alike in both models); ``types``: the element
    type and shape of its inputs, the element type of its outputs."""
    node = index.nodes[position]
    graph = onnx.GraphProto(name=f"{node.name or node.op_type}_body", node=[node])
    for name in dict.fromkeys(n for n in node.input if n):
        if name in index.initializers:
            graph.initializer.append(index.initializers[name])
        else:
            graph.input.append(_value_info(name, *types[name]))
    graph.output.extend(_value_info(n, types[n][0], None) for n in node.output if n)
    call = _finish(onnx.ModelProto(graph=graph), model)
    inlined = onnx.inliner.inline_local_functions(call)
    del inlined.functions[:]
    del inlined.opset_import[:]
    return _finish(inlined, call)


def declare_outputs(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]]) -> None:
    """The graph's outputs declared with a shape, which the ONNX checker wants: the one inference
    finds (the inputs are static), else the one onnxruntime computed (``shapes``, by name)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False).graph.output
    except Exception:  # noqa: BLE001  inference is a help here
        inferred = model.graph.output
    for declared, found in zip(model.graph.output, inferred):
        if found.type.tensor_type.HasField("shape"):
            declared.type.CopyFrom(found.type)
        elif shapes.get(declared.name) is not None:
            elem_type = declared.type.tensor_type.elem_type
            declared.type.CopyFrom(onnx.helper.make_tensor_type_proto(elem_type, list(shapes[declared.name])))


def _tensors(model: onnx.ModelProto) -> Iterable[onnx.TensorProto]:
    def graph_tensors(graph: onnx.GraphProto) -> Iterable[onnx.TensorProto]:
        yield from graph.initializer
        for node in graph.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.TENSOR:
                    yield attr.t
                elif attr.type == onnx.AttributeProto.TENSORS:
                    yield from attr.tensors
            for sub in _subgraphs(node):
                yield from graph_tensors(sub)

    yield from graph_tensors(model.graph)
    for function in model.functions:
        for node in function.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.TENSOR:
                    yield attr.t


def _external(tensor: onnx.TensorProto) -> dict[str, str]:
    return {e.key: e.value for e in tensor.external_data} if tensor.data_location == onnx.TensorProto.EXTERNAL else {}


def _read_external(entries: Mapping[str, str], source: pathlib.Path) -> bytes:
    with open(source / entries["location"], "rb") as f:
        f.seek(int(entries.get("offset", 0)))
        return f.read(int(entries["length"])) if "length" in entries else f.read()


def write_model(model: onnx.ModelProto, source: pathlib.Path, path: pathlib.Path) -> int:
    """Saves ``model`` (a region, whose external tensors are relative to the folder ``source``)
    at ``path``: tensors under :data:`LARGE_TENSOR` inline, larger ones one after the other in
    ``path.name + ".data"`` (written only if there is one); returns the bytes of that file."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    data_name = path.name + ".data"
    offset = 0
    data = None
    try:
        for tensor in _tensors(copy):
            entries = _external(tensor)
            if not entries and (not tensor.HasField("raw_data") or len(tensor.raw_data) < LARGE_TENSOR):
                continue
            raw = _read_external(entries, source) if entries else tensor.raw_data
            del tensor.external_data[:]
            tensor.data_location = onnx.TensorProto.DEFAULT
            if len(raw) < LARGE_TENSOR:
                tensor.raw_data = raw
                continue
            if data is None:
                data = open(path.with_name(data_name), "wb")  # noqa: SIM115  closed below
            offset = -(-offset // 4096) * 4096  # aligned, as onnx's writer does for memory maps
            data.seek(offset)
            data.write(raw)
            tensor.ClearField("raw_data")
            tensor.data_location = onnx.TensorProto.EXTERNAL
            for key, value in (("location", data_name), ("offset", str(offset)), ("length", str(len(raw)))):
                tensor.external_data.add(key=key, value=value)
            offset += len(raw)
    finally:
        if data is not None:
            data.close()
    path.write_bytes(copy.SerializeToString())
    return os.path.getsize(path.with_name(data_name)) if data is not None else 0
