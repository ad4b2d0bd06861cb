"""Control flow: an ``If`` whose branch is known, or whose branches are the same, takes one branch.

Both rules make the If's condition a constant (``true`` or ``false``, a
Constant node in the If's graph, or an initializer in the main graph), and
the fold pass, which runs with simplify until nothing changes, inlines the
branch a constant condition takes (:mod:`passes.fold`, one mechanism for
every If).

* ``known_condition``: inside the then-branch of ``If(c)`` (at any depth:
  nested branches, Loop and Scan bodies), ``c`` is true; inside its
  else-branch, false. An If there on ``c``, on ``Not(c)`` (any number of
  Nots), or on a recomputation of ``c`` (the same deterministic default-domain
  ops on the same values and on constants equal bit for bit: exporters repeat
  ``Equal(sr, 16000)`` in every branch) takes the branch that value selects.
  The recomputation reads the same values as ``c`` (values are compared by
  identity, never by name, so a shadowing name is another value), which hold
  what they held when ``c`` was computed: the inner If runs within the same
  run of the enclosing branch.
* ``same_branches``: an If whose two branches are the same graph (the same
  ops in the same order, with equal attributes, reading the same outer values
  or each other's corresponding values; constants equal bit for bit, ``-0.0``
  is not ``0.0``; nested subgraphs compared alike) computes the same thing
  either way: it takes the then-branch. Never when a branch holds an op whose
  schema is not deterministic (RandomNormal, Bernoulli...) or an op of
  another domain (its determinism is unknown), and only when the condition is
  proved to hold one element (else the original fails where the rewritten
  model would not).
"""

from __future__ import annotations

import collections
import struct
from collections.abc import Hashable

import numpy as np
import onnx_ir as ir

from passes.ir.names import Names
from passes.ir.schemas import is_deterministic, schema_at
from passes.ir.tensors import constant_tensor
from passes.ir.walk import normalize_domain, opset_of
from passes.simplify.rules import Context, Outcome, rule

__all__ = ["resolve_known_conditions"]

_GRAPH_TYPES = (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
#: How deep a condition's expression is followed, and how large a constant in it is read.
_KEY_DEPTH = 8
_KEY_CONSTANT_LIMIT = 1024


def _subgraphs(node: ir.Node) -> list[tuple[str, ir.Graph]]:
    """The node's subgraphs with the name of the attribute holding each."""
    found: list[tuple[str, ir.Graph]] = []
    stored = node.attributes
    for name, attr in getattr(stored, "data", stored).items():  # the attributes' own dict, without a view
        if not isinstance(attr, ir.Attr) or attr.is_ref() or attr.type not in _GRAPH_TYPES:
            continue
        if attr.type == ir.AttributeType.GRAPH:
            found.append((name, attr.as_graph()))
        else:
            found.extend((name, graph) for graph in attr.as_graphs())
    return found


def _is_default(node: ir.Node) -> bool:
    return normalize_domain(node.domain) == ""


def _constant_tensor(value: ir.Value) -> ir.TensorProtocol | None:
    """The tensor of a constant value: an initializer that is not a graph input, or a Constant node's."""
    if value.is_initializer():
        return None if value.is_graph_input() else value.const_value
    producer = value.producer()
    if producer is not None and producer.op_type == "Constant" and _is_default(producer):
        return constant_tensor(producer, dense_limit=0)
    return None


def _float_bits(value: float) -> bytes:
    return struct.pack("<d", value)


def _tensor_key(tensor: ir.TensorProtocol) -> Hashable:
    """Dtype, shape and bytes (strings: their list); ValueError for a string tensor without that list."""
    if tensor.dtype == ir.DataType.STRING:
        strings = getattr(tensor, "string_data", None)
        if strings is None:
            raise ValueError("a string tensor without string_data()")
        return (tensor.dtype, tuple(tensor.shape), tuple(strings()))
    return (tensor.dtype, tuple(tensor.shape), tensor.tobytes())


def _plain_attribute_key(attr: ir.Attr) -> Hashable | None:
    """An exact key of an attribute without subgraphs (floats by their bits); None if not comparable."""
    if attr.is_ref():
        return ("ref", attr.ref_attr_name, attr.type)
    kind, value = attr.type, attr.value
    if kind == ir.AttributeType.FLOAT:
        return (kind, _float_bits(value))
    if kind == ir.AttributeType.FLOATS:
        return (kind, tuple(_float_bits(v) for v in value))
    if kind in (ir.AttributeType.INT, ir.AttributeType.STRING):
        return (kind, value)
    if kind in (ir.AttributeType.INTS, ir.AttributeType.STRINGS):
        return (kind, tuple(value))
    if kind == ir.AttributeType.TENSOR:
        try:
            return (kind, _tensor_key(value))
        except (OSError, ValueError):
            return None
    return None  # graphs (compared by the caller), sparse tensors, types, lists of tensors


# --- known_condition ---------------------------------------------------------------------------


class _Conditions:
    """Exact keys of boolean expressions: equal keys, equal values (in one run of a scope)."""

    def __init__(self) -> None:
        self._keys: dict[ir.Value, Hashable] = {}

    def literal(self, value: ir.Value, opset: int | None) -> tuple[Hashable, bool]:
        """``value`` as ``(key of a base expression, negated)``: ``Not(Not(Not(b)))`` is ``(key(b), True)``."""
        negated = False
        while True:
            producer = value.producer()
            if producer is None or producer.op_type != "Not" or not _is_default(producer) or not producer.inputs:
                break
            inner = producer.inputs[0]
            if inner is None:
                break
            value, negated = inner, not negated
        return self.key(value, opset, 0), negated

    def key(self, value: ir.Value, opset: int | None, depth: int) -> Hashable:
        known = self._keys.get(value)
        if known is not None:
            return known
        key = self._compute(value, opset, depth)
        self._keys[value] = key
        return key

    def _compute(self, value: ir.Value, opset: int | None, depth: int) -> Hashable:
        own = ("value", id(value))
        tensor = _constant_tensor(value)
        if tensor is not None:
            if tensor.size > _KEY_CONSTANT_LIMIT:
                return own
            try:
                return ("constant", _tensor_key(tensor))
            except (OSError, ValueError):
                return own
        producer = value.producer()
        if (producer is None or depth >= _KEY_DEPTH or not _is_default(producer) or opset is None
                or schema_at(producer.op_type, opset) is None or not is_deterministic(producer.op_type, "", opset)
                or _subgraphs(producer)):  # fmt: skip
            return own
        attributes = []
        for name, attr in sorted(producer.attributes.items()):
            key = _plain_attribute_key(attr) if isinstance(attr, ir.Attr) else None
            if key is None:
                return own
            attributes.append((name, key))
        inputs = tuple(None if v is None else self.key(v, opset, depth + 1) for v in producer.inputs)
        index = next(i for i, output in enumerate(producer.outputs) if output is value)
        return (producer.op_type, producer.overload, len(producer.outputs), index, tuple(attributes), inputs)


def _set_condition(node: ir.Node, value: bool, names: Names, main: ir.Graph | None) -> None:
    """Makes a constant ``value`` the If's condition: an initializer of ``main``, or a Constant node."""
    tensor = ir.tensor(np.array(value))
    base = "true" if value else "false"
    graph = node.graph
    assert graph is not None
    if main is not None and graph is main:
        constant = ir.Value(name=names.value(base), type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([]))
        constant.const_value = tensor
        main.register_initializer(constant)
    else:
        producer = ir.Node("", "Constant", [], [ir.AttrTensor("value", tensor)], name=names.node(base))
        constant = producer.outputs[0]
        constant.name = names.value(base)
        constant.type, constant.shape = ir.TensorType(ir.DataType.BOOL), ir.Shape([])
        graph.insert_before(node, producer)
    node.replace_input_with(0, constant)


def resolve_known_conditions(model: ir.Model, applied: collections.Counter[str]) -> bool:
    """Makes constant the condition of every If whose condition an enclosing branch decides.

    Counted as ``control_flow/known_condition``; see the module docstring.

    Returns:
        Whether any condition was made constant.
    """
    conditions = _Conditions()
    names: list[Names] = []
    main = model.graph if model.ir_version >= 4 else None
    changed = False

    def visit(body: ir.Graph | ir.Function, opset: int | None, known: dict[Hashable, bool]) -> None:
        nonlocal changed
        for node in list(body):
            stored = node.attributes
            for attr in getattr(stored, "data", stored).values():  # most nodes hold no graph: no list for them
                if getattr(attr, "type", None) in _GRAPH_TYPES:
                    break
            else:
                continue
            subgraphs = _subgraphs(node)
            if not subgraphs:
                continue
            branch_facts = {"then_branch": known, "else_branch": known}
            cond = node.inputs[0] if node.op_type == "If" and _is_default(node) and node.inputs else None
            if cond is not None and _constant_tensor(cond) is None:
                key, negated = conditions.literal(cond, opset)
                if key in known:
                    if not names:
                        names.append(Names(model))
                    _set_condition(node, known[key] != negated, names[0], main)
                    applied["control_flow/known_condition"] += 1
                    changed = True
                else:
                    branch_facts = {"then_branch": {**known, key: not negated}, "else_branch": {**known, key: negated}}
            for name, graph in subgraphs:
                visit(graph, opset, branch_facts.get(name, known))

    visit(model.graph, opset_of(model.opset_imports, ""), {})
    for function in model.functions.values():
        visit(function, opset_of(function.opset_imports, ""), {})
    return changed


# --- same_branches -----------------------------------------------------------------------------


class _Matcher:
    """Compares two graphs structurally, pairing the values each computes."""

    def __init__(self, opset: int) -> None:
        self.opset = opset
        self.pairs: dict[ir.Value, ir.Value] = {}

    def same_value(self, a: ir.Value | None, b: ir.Value | None) -> bool:
        if a is None or b is None:
            return a is b
        paired = self.pairs.get(a)
        return paired is b if paired is not None else a is b  # else an outer value: the very same one

    def graphs(self, a: ir.Graph, b: ir.Graph) -> str | None:
        """Why ``a`` and ``b`` may compute different things, or None when they are the same graph."""
        if len(a.inputs) != len(b.inputs) or len(a.outputs) != len(b.outputs):
            return "the branches have different inputs or outputs"
        if a.initializers or b.initializers:
            return "a branch holds initializers"
        for x, y in zip(a.inputs, b.inputs):
            self.pairs[x] = y
        nodes_a, nodes_b = list(a), list(b)
        if len(nodes_a) != len(nodes_b):
            return "the branches have different numbers of nodes"
        for x, y in zip(nodes_a, nodes_b):
            reason = self.nodes(x, y)
            if reason is not None:
                return reason
        if not all(self.same_value(x, y) for x, y in zip(a.outputs, b.outputs)):
            return "the branches' outputs differ"
        return None

    def nodes(self, a: ir.Node, b: ir.Node) -> str | None:
        if (normalize_domain(a.domain), a.op_type, a.overload) != (normalize_domain(b.domain), b.op_type, b.overload):
            return f"different ops ({a.op_type}, {b.op_type})"
        if not _is_default(a) or schema_at(a.op_type, self.opset) is None:
            return f"{a.op_type} is not a known default-domain op (its determinism is unknown)"
        if not is_deterministic(a.op_type, "", self.opset):
            return f"{a.op_type} is not deterministic"
        if len(a.inputs) != len(b.inputs) or len(a.outputs) != len(b.outputs):
            return f"{a.op_type} nodes with different numbers of inputs or outputs"
        if not all(self.same_value(x, y) for x, y in zip(a.inputs, b.inputs)):
            return f"{a.op_type} nodes on different inputs"
        if set(a.attributes) != set(b.attributes):
            return f"{a.op_type} nodes with different attributes"
        for name, x in a.attributes.items():
            reason = self.attributes(x, b.attributes[name])
            if reason is not None:
                return f"{a.op_type}.{name}: {reason}"
        for x, y in zip(a.outputs, b.outputs):
            self.pairs[x] = y
        return None

    def attributes(self, a: ir.Attr, b: ir.Attr) -> str | None:
        if not isinstance(a, ir.Attr) or not isinstance(b, ir.Attr) or a.type != b.type:
            return "different kinds"
        if a.is_ref() or b.is_ref():
            return None if a.is_ref() and b.is_ref() and a.ref_attr_name == b.ref_attr_name else "different references"
        if a.type == ir.AttributeType.GRAPH:
            return self.graphs(a.as_graph(), b.as_graph())
        if a.type == ir.AttributeType.GRAPHS:
            graphs_a, graphs_b = a.as_graphs(), b.as_graphs()
            if len(graphs_a) != len(graphs_b):
                return "different numbers of graphs"
            for x, y in zip(graphs_a, graphs_b):
                reason = self.graphs(x, y)
                if reason is not None:
                    return reason
            return None
        key_a, key_b = _plain_attribute_key(a), _plain_attribute_key(b)
        if key_a is None or key_a != key_b:
            return "different values (or values not compared)"
        return None


@rule("If", family="control_flow")
def same_branches(node: ir.Node, ctx: Context) -> Outcome:
    cond = node.inputs[0] if node.inputs else None
    if cond is None or _constant_tensor(cond) is not None:
        return "the condition is missing or already constant (fold takes the branch)"
    then_attr, else_attr = node.attributes.get("then_branch"), node.attributes.get("else_branch")
    if not all(isinstance(a, ir.Attr) and a.type == ir.AttributeType.GRAPH and not a.is_ref()
               for a in (then_attr, else_attr)):  # fmt: skip
        return "a branch is not a graph"
    then_branch, else_branch = then_attr.as_graph(), else_attr.as_graph()  # type: ignore[union-attr]
    if len(then_branch.outputs) != len(node.outputs):
        return "the branches do not give the If's outputs"
    reason = _Matcher(ctx.opset).graphs(then_branch, else_branch)
    if reason is not None:
        return reason
    dims = ctx.dims(cond)  # after the comparison: it may run shape inference
    if ctx.dtype(cond) != ir.DataType.BOOL or dims is None or not all(d == 1 for d in dims):
        return "the condition is not proved to be one boolean"

    def rewrite() -> None:
        constant = ctx.new_constant(np.array(True), "true", before=node)
        node.replace_input_with(0, constant)

    return rewrite
