"""Which nodes of a model can compute in the half type, and what each of their slots takes.

:func:`plan_model` reads each scope (the main graph, every subgraph, every
model-local function: :func:`scopes`) and, per node, the inputs and outputs
whose type parameter allows the half type (from the op's schema at the
scope's opset, and for a function call from onnx inference on its body). The
conversion itself is :mod:`passes.precision.convert`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterator, Mapping
from typing import Any

import onnx
import onnx.defs
import onnx_ir as ir

from passes.ir import inference
from passes.ir.names import Names
from passes.ir.schemas import schema_at
from passes.ir.walk import opset_of

__all__ = ["FLOAT", "HALF_TYPES", "Plan", "Scope", "name_nodes", "nothing_converts", "plan_model", "scopes"]

FLOAT = ir.DataType.FLOAT
#: The half types by option value.
HALF_TYPES = {"fp16": ir.DataType.FLOAT16, "bf16": ir.DataType.BFLOAT16}
_TYPE_STRING = {ir.DataType.FLOAT16: "tensor(float16)", ir.DataType.BFLOAT16: "tensor(bfloat16)"}
#: Attributes that name an element type; a node with one set to float32 (other than a Cast's) stays float32.
_TYPE_ATTRIBUTES = ("dtype", "output_dtype", "to")


@dataclasses.dataclass
class Scope:
    """A graph, subgraph or function body, with its key (stable across copies of the model)."""

    key: str
    body: ir.Graph | ir.Function
    opsets: Mapping[str, int]
    owner: ir.Node | None
    function: ir.Function | None


def scopes(model: ir.Model) -> Iterator[Scope]:
    """Every scope, each graph before its subgraphs, keyed by its path of node names."""

    def walk(body: ir.Graph | ir.Function, key: str, opsets: Mapping[str, int], owner: ir.Node | None,
             function: ir.Function | None) -> Iterator[Scope]:  # fmt: skip
        yield Scope(key, body, opsets, owner, function)
        for node in body:
            for attr in node.attributes.values():
                if attr.type == ir.AttributeType.GRAPH:
                    yield from walk(attr.as_graph(), f"{key}/{node.name}.{attr.name}", opsets, node, function)
                elif attr.type == ir.AttributeType.GRAPHS:
                    for i, sub in enumerate(attr.as_graphs()):
                        yield from walk(sub, f"{key}/{node.name}.{attr.name}[{i}]", opsets, node, function)

    yield from walk(model.graph, "", model.opset_imports, None, None)
    for function in model.functions.values():
        yield from walk(function, f"function {function.domain}::{function.name}", function.opset_imports,
                        None, function)  # fmt: skip


def name_nodes(model: ir.Model) -> list[ir.Node]:
    """Gives every unnamed node a unique name (the islands are kept by name); the nodes it named."""
    names = Names(model)
    named = []
    for scope in scopes(model):
        for node in scope.body:
            if not node.name:
                node.name = names.node(node.op_type)
                named.append(node)
    return named


@dataclasses.dataclass
class Plan:
    """What the conversion knows of a model before it changes anything.

    Attributes:
        types: The element type of each value, by scope key and value name (float32 ones matter).
        slots: For each node (by scope key and node name) that may be half: which inputs and
            outputs become half (the others keep their type).
        fixed: Nodes that stay float32 whatever the islands, with the reason.
        widen: For the nodes fixed by their type constraint: which inputs are of a type
            parameter (a weight there may be stored in the half type and widened by a Cast).
    """

    types: dict[str, dict[str, ir.DataType]]
    slots: dict[tuple[str, str], tuple[tuple[bool, ...], tuple[bool, ...]]]
    fixed: dict[tuple[str, str], str]
    widen: dict[tuple[str, str], tuple[bool, ...]] = dataclasses.field(default_factory=dict)


def _formal(params: list[Any], index: int) -> Any | None:
    if index < len(params):
        return params[index]
    if params and params[-1].option == onnx.defs.OpSchema.FormalParameterOption.Variadic:
        return params[-1]
    return None


def _node_slots(node: ir.Node, opset: int | None, types: Mapping[str, ir.DataType],
                half: ir.DataType) -> Any:  # fmt: skip
    """Which inputs and outputs of ``node`` become half, a reason it cannot be half, or None (no float32)."""
    def is_float(value: ir.Value | None) -> bool:
        return value is not None and types.get(value.name) == FLOAT

    floats_in = [is_float(v) for v in node.inputs]
    floats_out = [is_float(v) for v in node.outputs]
    if not any(floats_in) and not any(floats_out):
        return None
    if any(attr.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for attr in node.attributes.values()):
        return "control flow: its subgraphs are converted inside, their boundary stays float32"
    schema = schema_at(node.op_type, opset, node.domain) if opset is not None else None
    if schema is None:
        return "no ONNX schema (a function call or another domain's op): its inputs and outputs stay float32"
    for name in _TYPE_ATTRIBUTES:
        attr = node.attributes.get(name)
        if attr is not None and attr.type == ir.AttributeType.INT and attr.as_int() == FLOAT and node.op_type != "Cast":
            return f"its attribute {name} asks for float32"
    allowed = {c.type_param_str: c.allowed_type_strs for c in schema.type_constraints}
    wanted = _TYPE_STRING[half]
    result = []
    for params, floats in ((schema.inputs, floats_in), (schema.outputs, floats_out)):
        slots = []
        for i, is_f in enumerate(floats):
            formal = _formal(params, i)
            if not is_f or formal is None:
                slots.append(False)
                continue
            if formal.type_str in allowed:
                if wanted not in allowed[formal.type_str]:
                    widen = tuple(is_f and (f := _formal(schema.inputs, i)) is not None and f.type_str in allowed
                                  for i, is_f in enumerate(floats_in))  # fmt: skip
                    return f"its type constraint {formal.type_str} does not allow {wanted}", widen
                slots.append(True)
            else:
                slots.append(False)  # a fixed type (tensor(float)): stays float32
        result.append(tuple(slots))
    if not any(result[0]) and not any(result[1]):
        return None
    return result[0], result[1]


def _function_types(model: ir.Model, function: ir.Function,
                    calls: list[tuple[ir.Node, Mapping[str, ir.DataType]]]) -> dict[str, ir.DataType]:  # fmt: skip
    """The element types of a function's values, by onnx inference on its body with the input
    types of its calls (empty when the calls disagree or inference cannot tell)."""
    input_types: list[ir.DataType | None] = []
    for position in range(len(function.inputs)):
        seen = {types.get(node.inputs[position].name) if position < len(node.inputs) and node.inputs[position]
                is not None else None for node, types in calls}  # fmt: skip
        if len(seen) != 1:
            return {}
        input_types.append(seen.pop())
    proto = ir.serde.serialize_function(function)
    inputs = [onnx.helper.make_tensor_value_info(name, int(t) if t is not None else 0, None)
              for name, t in zip(proto.input, input_types)]  # fmt: skip
    outputs = [onnx.helper.make_empty_tensor_value_info(name) for name in proto.output]
    graph = onnx.helper.make_graph(list(proto.node), "function", inputs, outputs)
    temp = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid(d, v) for d, v in
                                                        function.opset_imports.items()])  # fmt: skip
    temp.ir_version = model.ir_version or 8
    temp.functions.extend(ir.serde.serialize_function(f) for f in model.functions.values())
    try:
        inferred = onnx.shape_inference.infer_shapes(temp, check_type=False, strict_mode=False)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError):
        return {}
    found: dict[str, ir.DataType] = {}
    for info in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        if info.type.HasField("tensor_type") and info.type.tensor_type.elem_type:
            found[info.name] = ir.DataType(info.type.tensor_type.elem_type)
    return found


def plan_model(model: ir.Model, half: ir.DataType) -> Plan:
    """The types and half slots of every node (the model is not changed)."""
    inferred = inference.infer_all(model)
    all_scopes = list(scopes(model))
    types: dict[str, dict[str, ir.DataType]] = {}
    parent_types: dict[int, dict[str, ir.DataType]] = {}
    for scope in all_scopes:
        if scope.function is not None:
            continue
        own: dict[str, ir.DataType] = dict(parent_types.get(id(scope.owner), {})) if scope.owner else {}
        body = scope.body
        for value in [*body.inputs, *(body.initializers.values() if isinstance(body, ir.Graph) else ())]:
            if value.dtype is not None:
                own[value.name] = value.dtype
        for node in body:
            for value in node.outputs:
                dtype = (inferred.get(value) or (None, None))[0] or value.dtype
                if dtype is not None:
                    own[value.name] = dtype
            parent_types[id(node)] = own  # subgraphs see the values defined before their node
        types[scope.key] = own
    # Functions: their values typed from their calls.
    calls: dict[tuple[str, str], list[tuple[ir.Node, Mapping[str, ir.DataType]]]] = {}
    for scope in all_scopes:
        if scope.function is None:
            for node in scope.body:
                calls.setdefault((node.domain, node.op_type), []).append((node, types[scope.key]))
    for scope in all_scopes:
        if scope.function is not None and scope.owner is None:
            function = scope.function
            types[scope.key] = _function_types(model, function, calls.get((function.domain, function.name), []))
        elif scope.function is not None:
            types[scope.key] = dict(types.get(scope.key.rsplit("/", 1)[0], {}))
    slots: dict[tuple[str, str], tuple[tuple[bool, ...], tuple[bool, ...]]] = {}
    fixed: dict[tuple[str, str], str] = {}
    widen: dict[tuple[str, str], tuple[bool, ...]] = {}
    for scope in all_scopes:
        for node in scope.body:
            found = _node_slots(node, opset_of(dict(scope.opsets), node.domain), types[scope.key], half)
            if isinstance(found, str):
                fixed[(scope.key, node.name)] = found
            elif found is not None and isinstance(found[0], str):
                fixed[(scope.key, node.name)] = found[0]
                widen[(scope.key, node.name)] = found[1]
            elif found is not None:
                slots[(scope.key, node.name)] = found
    return Plan(types, slots, fixed, widen)


def nothing_converts(model: ir.Model, plan: Plan, islands: Mapping[tuple[str, str], str], io: bool,
                     exact: Collection[tuple[str, str]] = ()) -> str | None:
    """Why the conversion would change nothing with these islands (then no search can change that:
    it only adds islands), or None when it may change something.

    Something may change where a node that can be half is not an island, where a float32 weight
    would be stored in the half type (a weight of an island, of a node fixed by its type
    constraint at a type parameter, or of a function call, but not of an island in ``exact``:
    :func:`passes.precision.convert.convert`), or with ``io``. Reads no attribute value (a tree
    ensemble's lists stay undecoded).
    """
    if io:
        return None
    functions = {(f.domain, f.name) for f in model.functions.values()}
    ops: dict[tuple[str, str], str] = {}
    candidates: dict[int, ir.Node] = {}
    for scope in scopes(model):
        for node in scope.body:
            key = (scope.key, node.name)
            ops[key] = node.op_type
            if key in plan.slots and key not in islands:
                candidates[id(node)] = node
    # A half node alone between float32 ones stays float32 (convert's "lone"): a candidate is one
    # with a float32 weight, or a candidate neighbour; what is left when none changes is the set.
    changed = True
    while changed and candidates:
        changed = False
        for index, node in list(candidates.items()):
            near = any(v is not None and ((v.const_value is not None and v.const_value.dtype == FLOAT)
                                          or id(v.producer()) in candidates) for v in node.inputs)  # fmt: skip
            near = near or any(id(use.node) in candidates for v in node.outputs for use in v.uses())
            if not near:
                del candidates[index]
                changed = True
    if candidates:
        return None
    for scope in scopes(model):
        for node in scope.body:
            key = (scope.key, node.name)
            if ((key in plan.slots or key in plan.widen or (node.domain, node.op_type) in functions)
                    and key not in exact
                    and any(v is not None and v.const_value is not None and v.dtype == FLOAT for v in node.inputs)):
                return None
    kinds: dict[str, int] = {}
    alone = "alone between float32 nodes (two Casts and a rounding for nothing)"
    reasons_by_node = {**{key: alone for key in plan.slots}, **plan.fixed, **islands}
    for key, why in reasons_by_node.items():
        kind = f"{ops.get(key, key[1])}: {why}"
        kinds[kind] = kinds.get(kind, 0) + 1
    if not kinds:
        return "no float32 value in the model"
    reasons = sorted(kinds.items(), key=lambda kv: -kv[1])
    shown = "; ".join(f"{why} (x{n})" for why, n in reasons[:3])
    return f"no node can take the half type: {shown}" + (f" and {len(reasons) - 3} more" if len(reasons) > 3 else "")
