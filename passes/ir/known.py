"""What one run knows of its computed values' types: one inference, kept up to date by the passes.

onnx shape inference is whole-graph: each run of it serialises the model
(about 12 us a node) and infers every value, whatever the question. A run of
the default pipeline did it twice on a model whose values are untyped (the
decomposition asks for its inputs' types, the ``types`` step for every
value's): on the 10,000-node chain a quarter of the passes' CPU time.

So within one run of the pass loop (:func:`begin` .. :func:`end`, called by
:func:`passes.loop.run`) the model carries a table: each computed value with
its element type, its static shape, and the signature of the node that
computed it when it was typed. :func:`passes.ir.inference.infer_all` fills it
with what it derives; a pass that builds nodes notes the types of the values
it makes (:func:`note`: the decomposition knows them from its input's). A
later question about every computed value (:func:`lookup`: the ``types``
step's, simplify's) is answered from the table when it holds them all and
every entry is still true, and by inference only when not.

When an entry is true. The signature is the node's op, domain, attribute
objects and the element type and static shape of each of its inputs. If the
node that computes a value still has that signature, it computes a tensor of
the same type and shape (an op's output type is a function of these; where
it also reads an input's values, a Reshape's target, the passes keep every
value's contents, so an input of the same type holds the same values). The
check runs in graph order, so a value whose producer changed (its inputs
rewired to other shapes, an attribute replaced, another node made its
producer: simplify's region rules do this to a value they keep) makes its
own entry and every entry downstream that reads it fail. Only static shapes
are kept (a symbol inference makes up is fresh in each run of it and named
afresh by the ``types`` step), nodes that hold subgraphs are never trusted
(their bodies change under the same attribute), and a value that states
another element type or static shape than its entry fails too (a pass that
retypes a value in place: ``--precision``). The table lives in
``model.meta`` (never written) between :func:`begin` and :func:`end` only,
so a model its caller changed between two runs is never answered from the
last run's table.

Symbolic dims have no place in the table. For them a pass that inferred the
whole model as it leaves it (simplify, whose last round changed nothing) keeps
that inference whole (:func:`keep_inferred`), and the pass loop forgets it
after any pass that reports a change (:func:`forget_inferred`): the ``types``
step takes it (:func:`inferred`) instead of inferring the same graph again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import onnx_ir as ir

from passes.ir import walk

__all__ = ["begin", "end", "forget_inferred", "inferred", "keep_inferred", "lookup", "note", "record", "static_shape"]

_TABLE = "passes.known_types"
_INFERRED = "passes.inferred_types"
_SUBGRAPHS = (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)

#: (element type, dims) of a value whose type is known and shape static.
Key = tuple[ir.DataType, tuple[int, ...]]


class _Entry(NamedTuple):  # (a tuple: one is made per computed value, 17.8k on the 10k chain)
    key: Key
    shape: ir.Shape
    node: ir.Node
    signature: tuple[Any, ...]


def begin(model: ir.Model) -> None:
    """A run starts: an empty table (what an earlier run knew is forgotten)."""
    model.meta[_TABLE] = {}


def end(model: ir.Model) -> None:
    """The run ends: the table is dropped."""
    model.meta.pop(_TABLE, None)
    model.meta.pop(_INFERRED, None)


def keep_inferred(model: ir.Model, found: Mapping[ir.Value, tuple[ir.DataType | None, ir.Shape | None]]) -> None:
    """``found`` is what :func:`passes.ir.inference.infer_all` found for the model as it is now, and as a
    pass leaves it (simplify's last round, which changed nothing): :func:`inferred` answers with it,
    symbolic dims included, until a pass changes the model (the pass loop calls :func:`forget_inferred`).
    Within a run only (:func:`begin` .. :func:`end`)."""
    if model.meta.get(_TABLE) is not None:
        model.meta[_INFERRED] = found


def inferred(model: ir.Model) -> Mapping[ir.Value, tuple[ir.DataType | None, ir.Shape | None]] | None:
    """What :func:`keep_inferred` kept, while no pass changed the model since; else None."""
    return model.meta.get(_INFERRED)


def forget_inferred(model: ir.Model) -> None:
    """A pass changed the model: what :func:`keep_inferred` kept is not of it any more."""
    model.meta.pop(_INFERRED, None)


def _key(dtype: ir.DataType | None, shape: Any) -> Key | None:
    if dtype is None or shape is None:
        return None
    dims = tuple(shape)
    for d in dims:
        if type(d) is not int or d < 0:
            return None
    return dtype, dims


def _input_key(value: ir.Value | None, table: Mapping[ir.Value, _Entry]) -> Key | None | bool:
    """The input's key; False for an absent optional input; None when its type is not known statically."""
    if value is None:
        return False
    entry = table.get(value)
    if entry is not None:
        return entry.key
    tensor = value.const_value
    if tensor is not None:
        return _key(tensor.dtype, tensor.shape)
    if value.producer() is None:  # a graph input (or an outer scope's, read in a subgraph)
        return _key(value.dtype, value.shape)
    return None


def static_shape(model: ir.Model, value: ir.Value) -> tuple[int, ...] | None:
    """The static shape of ``value`` the run knows (a computed value's from the table, an initializer's
    or a graph input's as stated), or None."""
    key = _input_key(value, model.meta.get(_TABLE) or {})
    return key[1] if isinstance(key, tuple) else None


def _signature(node: ir.Node, table: Mapping[ir.Value, _Entry]) -> tuple[Any, ...] | None:
    """What the node's outputs' types are a function of (see the module docstring); None when an input's
    type is not known statically or the node holds subgraphs.

    (op, domain, overload, attributes, inputs, keys): an input the table holds is kept as the value
    (its own entry says its type, and is checked in turn), any other with its key as it is now."""
    stored = node.attributes
    attributes = tuple(getattr(stored, "data", stored).values())  # the attributes' own dict
    for a in attributes:
        if a.type in _SUBGRAPHS:
            return None
    inputs = node.inputs
    keys = []
    for value in inputs:
        if value is not None and value in table:
            keys.append(None)
            continue
        key = _input_key(value, table)
        if key is None:
            return None
        keys.append(key)
    return node.op_type, node.domain, node.overload, attributes, inputs, keys


def _holds(node: ir.Node, signature: tuple[Any, ...], table: Mapping[ir.Value, _Entry]) -> bool:
    """Whether ``node`` still has ``signature``: the same op and attribute objects (an attribute
    replaced is another one), and inputs of the same types (the same values, or others of equal key)."""
    op_type, domain, overload, attributes, inputs, keys = signature
    if node.op_type != op_type or node.domain != domain or node.overload != overload:
        return False
    stored = node.attributes
    now = getattr(stored, "data", stored)
    if len(now) != len(attributes):
        return False
    for a, b in zip(now.values(), attributes):  # a loop: any() over a generator makes a frame a node
        if a is not b:
            return False
    current = node.inputs
    if len(current) != len(inputs):
        return False
    for value, was, key in zip(current, inputs, keys):
        if key is None:  # was a value the table holds
            if value is not was and _input_key(value, table) != table[was].key:
                return False
        elif _input_key(value, table) != key:
            return False
    return True


def note(model: ir.Model, value: ir.Value, dtype: ir.DataType | None, shape: Any) -> None:
    """``value``, made by a pass, has element type ``dtype`` and shape ``shape`` (dims); kept when both
    are known, the shape static and its producer's inputs known (outside a run, nothing is kept).
    Note a pass's new values in graph order (a node's inputs before it)."""
    table = model.meta.get(_TABLE)
    node = value.producer()
    key = _key(dtype, shape)
    if table is None or node is None or key is None:
        return
    signature = _signature(node, table)
    if signature is not None:
        table[value] = _Entry(key, ir.Shape(key[1], frozen=True), node, signature)


def record(model: ir.Model, found: Mapping[ir.Value, tuple[ir.DataType | None, ir.Shape | None]]) -> None:
    """What a derived inference of the whole model found: the table afresh (see the module docstring)."""
    table = model.meta.get(_TABLE)
    if table is None:
        return
    table.clear()
    for graph in walk.graphs(model):
        for node in graph:
            signature = None
            for value in node.outputs:
                dtype, shape = found.get(value, (None, None))
                key = _key(dtype, shape)
                if key is None:
                    continue
                signature = signature or _signature(node, table)
                if signature is None:
                    break
                assert shape is not None
                table[value] = _Entry(key, shape, node, signature)


def lookup(model: ir.Model) -> dict[ir.Value, tuple[ir.DataType, ir.Shape]] | None:
    """The element type and static shape of every named value a node computes (every graph), when the
    table holds them all and every entry is still true; else None (inference must answer)."""
    table = model.meta.get(_TABLE)
    if not table:
        return None
    found: dict[ir.Value, tuple[ir.DataType, ir.Shape]] = {}
    for graph in walk.graphs(model):
        for node in graph:
            signature = None
            for value in node.outputs:
                if not value.name:
                    continue
                entry = table.get(value)
                if entry is None or entry.node is not node:
                    return None
                if entry.signature is not signature and not _holds(node, entry.signature, table):
                    return None
                signature = entry.signature
                dtype, dims = entry.key
                stated_dtype = value.dtype
                if stated_dtype is not None:  # an untyped value states no shape either (see _key)
                    if stated_dtype != dtype:
                        return None
                    stated = _key(stated_dtype, value.shape)
                    if stated is not None and stated[1] != dims:
                        return None
                found[value] = (dtype, entry.shape)
    return found
