"""The float32 -> half conversion of one model, given the nodes that stay float32 (the islands).

Deterministic: the same model and the same islands give the same result, so
the pass converts copies while it looks for the islands and the model itself
once they are known.

* Every node is *half* or *float32*. A half node computes in the half type:
  each of its inputs and outputs that is float32 and whose type parameter
  (``T``) allows the half type becomes the half type; an input or output of a
  fixed type (``tensor(float)``: Resize's scales) keeps float32. A float32
  node computes as before.
* A value whose type differs from what a consumer takes gets one Cast per
  value, type and scope (never a Cast pair that cancels).
* Float32 initializers become half when a half node takes them and their
  values fit the half type; the others stay float32.
* Graph inputs and outputs keep float32 (Casts at the boundary; with ``io``,
  ``--precision-io``, the main graph's become half instead), and so do
  the inputs and outputs of subgraphs (If/Loop/Scan bodies) and of
  model-local functions: each body is converted inside, consistently, and
  what crosses its boundary is float32.
* A converted weight stored externally is converted when it is written, a
  chunk at a time (:mod:`passes.precision.lazy`).
* Integers, booleans, strings and float64 are left as they are.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir

from passes.ir.names import Names
from passes.precision import lazy as _lazy
from passes.precision.plan import FLOAT, Plan, Scope, scopes

__all__ = ["convert"]


def _half_array(array: np.ndarray, half: ir.DataType) -> np.ndarray:
    return array.astype(half.numpy())


def convert(model: ir.Model, plan: Plan, half: ir.DataType, islands: set[tuple[str, str]],
            exact: set[tuple[str, str]] = frozenset(), float_functions: set[str] = frozenset(), *,
            emulate: bool = False, io: bool = False) -> dict[str, int]:  # fmt: skip
    """Converts ``model`` in place; the nodes in ``islands`` (scope key, node name) stay float32.

    With ``io`` (``--precision-io``) the main graph's float32 inputs and outputs become the half
    type too (see :func:`_half_io`); the emulation rounds them to it.

    The weights of an island are stored in the half type too (a Cast widens them, exactly)
    unless the island is in ``exact`` (an island the check asked for: its weights' rounding
    may be what the check saw). A function in ``float_functions`` (its scope key) and the
    subgraphs of an island are left whole in float32. Returns counts: half nodes, Casts added,
    initializers converted, graph inputs and outputs converted (``io``), nodes left float32
    between float32 nodes (``lone``).

    With ``emulate``, the same decisions are written as float32 arithmetic rounded to the half
    type: a half weight holds its rounded values in float32, and each value a half node makes
    (or a half input it takes) goes through ``Cast(to=half)`` then ``Cast(to=float)`` under its
    own name. onnxruntime's CPU provider runs most float16 nodes by Casts it inserts around a
    float32 kernel, and drops a Cast pair between two such nodes: the converted model itself
    shows it little of the half type's rounding; the emulation shows it each node's, as a
    device computing in the half type rounds, and the locator compares it value by value.
    """
    names = Names(model)
    counts = {"half_nodes": 0, "casts": 0, "initializers": 0}
    frozen: set[str] = set()  # scope keys left whole in float32
    every = list(scopes(model))
    for scope in every:
        whole = scope.key in float_functions or any(scope.key.startswith(k + "/") for k in frozen)
        if scope.owner is not None and (scope.key.rsplit("/", 1)[0], scope.owner.name) in islands:
            whole = True
        if whole:  # every node float32; outer values it takes that became half are cast back
            frozen.add(scope.key)
    keys = {id(scope.body.graph if isinstance(scope.body, ir.Function) else scope.body): scope.key
            for scope in every}  # fmt: skip

    lone: set[tuple[str, str]] = set()  # half nodes between float32 ones: computed in float32 (nothing to gain)

    def half_slots(node: ir.Node) -> tuple[tuple[bool, ...], tuple[bool, ...]] | None:
        key = keys.get(id(node.graph))
        if key is None or key in frozen or (key, node.name) in islands or (key, node.name) in plan.fixed:
            return None
        if (key, node.name) in lone:
            return None
        return plan.slots.get((key, node.name))

    boundary = _io_values(model) if io else ([], [])
    half_inputs, half_outputs = {id(v) for v in boundary[0]}, {id(v) for v in boundary[1]}

    def half_source(value: ir.Value) -> bool:
        producer = value.producer()
        if producer is None:  # a weight; a graph input stays float32 unless io
            return value.const_value is not None or id(value) in half_inputs
        return half_slots(producer) is not None

    def half_sink(value: ir.Value) -> bool:
        if id(value) in half_outputs:
            return True
        for usage in value.uses():
            slots = half_slots(usage.node)
            if slots is not None and usage.idx < len(slots[0]) and slots[0][usage.idx]:
                return True
        return False

    changed = True
    while changed:  # a node left alone by its neighbours' islands is not worth two Casts and a rounding
        changed = False
        for scope in every:
            for node in scope.body:
                slots = half_slots(node)
                if slots is None:
                    continue
                ins = [v for i, v in enumerate(node.inputs) if v is not None and i < len(slots[0]) and slots[0][i]]
                outs = [v for i, v in enumerate(node.outputs) if i < len(slots[1]) and slots[1][i]]
                if not any(half_source(v) for v in ins) and not any(half_sink(v) for v in outs):
                    lone.add((keys[id(node.graph)], node.name))
                    changed = True
    counts["lone"] = len(lone)

    functions = {(f.domain, f.name) for f in model.functions.values()}

    def weight_use(node: ir.Node, index: int) -> str:
        """What a weight taken by ``node`` at ``index`` may be: "half" (a half node computes with it),
        "widen" (stored half, widened for a float32 node of type parameter T or a function call),
        or "keep" (float32: a fixed float32 input, an exact island, a whole-float32 scope)."""
        slots = half_slots(node)
        if slots is not None:
            return "half" if index < len(slots[0]) and slots[0][index] else "keep"
        key = keys.get(id(node.graph))
        if key is None or key in frozen or (key, node.name) in exact:
            return "keep"
        if (node.domain, node.op_type) in functions:
            return "widen"
        found = plan.slots.get((key, node.name))
        taken = found[0] if found is not None else plan.widen.get((key, node.name), ())
        return "widen" if index < len(taken) and taken[index] else "keep"

    counts["io"] = len(boundary[0]) + len(boundary[1])  # each of them ends up of the half type
    if io:
        _half_io(model, boundary, half, names, counts, emulate)
    for scope in every:
        _convert_scope(scope, plan, half, half_slots, weight_use, names, counts, emulate, io)
    return counts


def _io_values(model: ir.Model) -> tuple[list[ir.Value], list[ir.Value]]:
    """The main graph's float32 inputs (not initializers: an input with a default value stays
    float32) and float32 outputs (``--precision-io``)."""
    graph = model.graph
    inputs = [v for v in graph.inputs if v.dtype == FLOAT and v.name not in graph.initializers]
    outputs = [v for v in graph.outputs if v.dtype == FLOAT]
    return inputs, outputs


def _half_io(model: ir.Model, boundary: tuple[list[ir.Value], list[ir.Value]], half: ir.DataType,
             names: Names, counts: dict[str, int], emulate: bool) -> None:  # fmt: skip
    """``--precision-io``: the main graph's float32 inputs become the half type (a float32 node that
    takes one gets a Cast, as for any half value: :func:`_convert_scope`). In the emulation they
    stay float32 and a Cast pair rounds each to the half type for every node that takes it."""
    graph = model.graph
    for value in boundary[0]:
        if not emulate:
            value.type = ir.TensorType(half)
            continue
        there = _cast_node(value, half, names)
        back = _cast_node(there.outputs[0], FLOAT, names)
        rounded = back.outputs[0]
        value.replace_all_uses_with(rounded, replace_graph_outputs=False)
        there.replace_input_with(0, value)
        rounded.meta[_ROUNDED] = True
        if len(graph):
            graph.insert_before(graph.node(0), [there, back])
        else:
            graph.extend([there, back])
        counts["casts"] += 1


_ROUNDED = "passes.precision.rounded"  # Value.meta key: (emulation) holds values rounded to the half type


def _suffix(dtype: ir.DataType) -> str:
    return "fp16" if dtype == ir.DataType.FLOAT16 else "bf16" if dtype == ir.DataType.BFLOAT16 else "fp32"


def _cast_node(value: ir.Value, to: ir.DataType, names: Names, name: str | None = None,
               node_name: str | None = None) -> ir.Node:  # fmt: skip
    suffix = _suffix(to)
    out = ir.Value(name=name or names.value(f"{value.name}_{suffix}"), type=ir.TensorType(to), shape=value.shape)
    return ir.Node("", "Cast", [value], attributes=[ir.AttrInt64("to", int(to))], outputs=[out],
                   name=names.node(node_name or f"{value.name}_cast_{suffix}"))  # fmt: skip


def _convert_scope(scope: Scope, plan: Plan, half: ir.DataType, half_node: Any, weight_use: Any, names: Names,
                   counts: dict[str, int], emulate: bool = False, io: bool = False) -> None:  # fmt: skip
    body = scope.body
    key = scope.key
    casts: dict[tuple[int, ir.DataType], ir.Value] = {}

    def kind(value: ir.Value) -> ir.DataType:
        if emulate:
            return half if value.meta.get(_ROUNDED) else FLOAT
        return value.dtype or FLOAT

    def cast(value: ir.Value, to: ir.DataType, before: ir.Node) -> ir.Value:
        found = casts.get((id(value), to))
        if found is not None:
            return found
        if emulate and to == FLOAT:
            return value  # a rounded value is its own exact widening
        node = _cast_node(value, to, names)
        body.insert_before(before, node)
        out = node.outputs[0]
        counts["casts"] += 1
        if emulate:  # ... and back: float32 holding the half type's values
            back = _cast_node(out, FLOAT, names)
            body.insert_before(before, back)
            out = back.outputs[0]
            out.meta[_ROUNDED] = True
        casts[(id(value), to)] = out
        return out

    def round_outputs(node: ir.Node, converted: list[ir.Value]) -> None:
        """(emulation) Each converted output rounded to the half type under its own name."""
        after = node
        for value in converted:
            name = value.name
            value.name = names.value(f"{name}_exact")
            there = _cast_node(value, half, names)
            back = _cast_node(there.outputs[0], FLOAT, names, name)
            rounded = back.outputs[0]
            value.replace_all_uses_with(rounded, replace_graph_outputs=True)
            there.replace_input_with(0, value)
            rounded.meta[_ROUNDED] = True
            body.insert_after(after, [there, back])
            after = back

    # Initializers a half node takes become half (when their values fit).
    if isinstance(body, ir.Graph):
        graph_inputs = {id(v) for v in body.inputs}
        for value in list(body.initializers.values()):
            if value.dtype != FLOAT or id(value) in graph_inputs or value.const_value is None:
                continue
            uses = {weight_use(usage.node, usage.idx) for usage in value.uses()}
            if not uses or "keep" in uses:
                continue
            if _lazy.largest(value.const_value) > float(half.max):
                continue  # a finite value beyond the half type's range
            counts["initializers"] += 1
            # External data stays in its file until the save writes the converted bytes (see lazy).
            value.const_value = _lazy.converted(value.const_value, half, widen=emulate, name=value.name)
            if emulate:
                value.meta[_ROUNDED] = True
                continue
            value.type = ir.TensorType(half)

    for node in list(body):
        slots = half_node(node)
        for i, value in enumerate(node.inputs):
            if value is None or plan.types.get(key, {}).get(value.name) != FLOAT:
                continue
            want = half if slots is not None and i < len(slots[0]) and slots[0][i] else FLOAT
            if kind(value) != want:
                node.replace_input_with(i, cast(value, want, node))
        if slots is None:
            continue
        counts["half_nodes"] += 1
        converted = [value for i, value in enumerate(node.outputs) if i < len(slots[1]) and slots[1][i]]
        if emulate:
            round_outputs(node, converted)
            continue
        for value in converted:
            value.type = ir.TensorType(half)
        if node.op_type == "Cast" and node.domain in ("", "ai.onnx"):
            to = node.attributes.get("to")
            if to is not None and to.as_int() == FLOAT:
                node.attributes["to"] = ir.AttrInt64("to", int(half))
        for name in ("value",):  # ConstantOfShape, Constant
            attr = node.attributes.get(name)
            if attr is not None and attr.type == ir.AttributeType.TENSOR and attr.as_tensor().dtype == FLOAT:
                tensor = attr.as_tensor()
                node.attributes[name] = ir.AttrTensor(name, ir.Tensor(_half_array(tensor.numpy(), half),
                                                                      name=tensor.name))  # fmt: skip
        if node.op_type == "Constant":
            for name in ("value_float", "value_floats"):
                attr = node.attributes.get(name)
                if attr is not None:
                    array = np.asarray(attr.value, dtype=np.float32)
                    del node.attributes[name]
                    node.attributes["value"] = ir.AttrTensor("value", ir.Tensor(_half_array(array, half)))

    # Outputs keep float32: a Cast takes the output's name. With io, the main graph's float32
    # outputs are of the half type: a Cast to it takes the name of one a float32 node makes.
    main = io and key == "" and scope.function is None
    for i, value in enumerate(list(body.outputs)):
        if main and value.dtype == FLOAT and kind(value) == FLOAT:
            _rename_output(body, i, value, half, names, counts, emulate, half)
            continue
        if main or emulate or value.dtype != half:
            continue
        _rename_output(body, i, value, FLOAT, names, counts)


def _rename_output(body: ir.Graph | ir.Function, i: int, value: ir.Value, to: ir.DataType, names: Names,
                   counts: dict[str, int], emulate: bool = False, half: ir.DataType = FLOAT) -> None:  # fmt: skip
    """Output ``i`` of ``body`` (``value``) becomes a Cast of it to ``to`` under its name (in the
    emulation, a Cast pair to ``to`` and back: float32 holding its values)."""
    name = value.name
    value.name = names.value(f"{name}_{_suffix(half if emulate else value.dtype or FLOAT)}")
    there = _cast_node(value, to, names, None if emulate else name, node_name=f"{name}_cast_{_suffix(to)}")
    body.append(there)
    out = there.outputs[0]
    if emulate:
        back = _cast_node(out, FLOAT, names, name, node_name=f"{name}_cast_fp32")
        body.append(back)
        out = back.outputs[0]
        out.meta[_ROUNDED] = True
    body.outputs[i] = out
    counts["casts"] += 1
