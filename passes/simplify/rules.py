"""The rewrite-rule framework of the simplify pass: a registry, and what a rule may ask.

A rule is a function ``rule(node, ctx) -> Rewrite | str``, registered with
:func:`rule` for the default-domain op types it matches. It reads the graph
around ``node`` and returns either why it does not apply (a short reason,
shown at ``-v`` and counted) or a :class:`Rewrite`: a closure that changes the
graph, run by the driver, which then counts the rule by name. Rules never
change the graph while checking, so a reason always describes an untouched
graph.

Every rule keeps the results bit for bit (see :mod:`passes.simplify`), and
keeps what callers see of the graph: graph inputs and outputs (their names,
order, types and shapes) and an ``Identity`` that produces a graph output.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Union

import numpy as np
import onnx_ir as ir

from passes.ir import inference, tensors
from passes.ir.names import Names
from passes.ir.prepack import feeds_prepacked, prepacked_amplified
from passes.ir.walk import Scope, normalize_domain

__all__ = ["RULES", "Context", "Rewrite", "Rule", "rule", "sole_user"]

Rewrite = Callable[[], None]
Outcome = Union[Rewrite, str]


@dataclasses.dataclass(frozen=True)
class Rule:
    """A registered rewrite rule.

    Attributes:
        name: The name counted in the report (``family/what``).
        family: The switch that turns it off (see ``SimplifyPass``), e.g. ``fuse``.
        op_types: The default-domain ops it matches.
        apply: The rule itself: ``apply(node, ctx) -> Rewrite | str``.
    """

    name: str
    family: str
    op_types: tuple[str, ...]
    apply: Callable[[ir.Node, "Context"], Outcome]


RULES: list[Rule] = []


def rule(*op_types: str, family: str = "rewrite", name: str = "") -> Callable[[Callable], Callable]:
    """Registers the decorated function as a rule for ``op_types`` (default domain)."""

    def register(function: Callable[[ir.Node, Context], Outcome]) -> Callable[[ir.Node, Context], Outcome]:
        label = name or function.__name__.strip("_")
        RULES.append(Rule(f"{_module_label(function.__module__)}/{label}", family, op_types, function))
        return function

    return register


def _module_label(module: str) -> str:
    """The first part of a rule's name: its module, or the package it is in, under ``passes.simplify``.

    ``passes.simplify.noops`` -> ``noops``; ``passes.simplify.chains.layout`` -> ``chains``.
    """
    parts = module.split(".")
    return parts[2] if parts[:2] == ["passes", "simplify"] and len(parts) > 2 else parts[-1]


Dim = Union[int, str, None]


@dataclasses.dataclass
class Context:
    """What a rule may ask about the graph, for the scope of the node it looks at.

    Attributes:
        scope: The graph or function body, with its opsets.
        infer: Returns the types and shapes derived by shape inference (no declared
            shape trusted); runs it on first use.
        names: Returns the model's name allocator.
        initializers: New constants of this scope are initializers (the main graph,
            IR >= 4); else Constant nodes.
        constant_limit: Constants larger than this many elements are not read by rules.
        symbolic: Returns the dims derived for main-graph values (``dims.SymbolicDims``,
            see :mod:`passes.simplify.dims`), or None to use inference's alone.
        arrays: The small constants already read, by tensor (read-only arrays, or None for a tensor
            no rule reads at :attr:`constant_limit`); a caller may share one dict between the
            contexts of a run, as simplify does over its rounds (a tensor is never changed in
            place: a rewrite makes a new one).
        amplified: Where a change of rounding is amplified (:class:`passes.ir.amplification.Amplified`,
            walked on first use), or None: :meth:`bypass` then makes a constant a weight
            onnxruntime prepacks wherever it finds one.
    """

    scope: Scope
    infer: Callable[[], Mapping[ir.Value, tuple[ir.DataType | None, ir.Shape | None]]]
    names: Callable[[], Names]
    initializers: bool = False
    constant_limit: int = 1 << 16
    symbolic: Callable[[], Any] | None = None
    arrays: dict[int, tuple[ir.TensorProtocol, np.ndarray | None]] = dataclasses.field(default_factory=dict)
    amplified: Any = None

    @property
    def inferred(self) -> Mapping[ir.Value, tuple[ir.DataType | None, ir.Shape | None]]:
        """Inference's findings, computed on first use (once per sweep)."""
        return self.infer()

    @property
    def opset(self) -> int:
        return self.scope.opset("") or 0

    # --- values ---------------------------------------------------------------------------

    def constant(self, value: ir.Value | None, limit: int | None = None) -> np.ndarray | None:
        """The value of a constant (initializer that is not a graph input, Constant node), if small.

        ``limit`` (elements) replaces :attr:`constant_limit` for a rule that must read
        weights, which are larger than the shape-like constants most rules read.
        """
        if value is None:
            return None
        tensor: ir.TensorProtocol | None = None
        if value.is_initializer():
            if value.is_graph_input():
                return None  # a caller may override it
            tensor = value.const_value
        else:
            producer = value.producer()
            if producer is not None and producer.op_type == "Constant" and producer.domain in ("", "ai.onnx"):
                attr = producer.attributes.get("value")
                if isinstance(attr, ir.Attr) and not attr.is_ref() and attr.type == ir.AttributeType.TENSOR:
                    tensor = attr.value  # as_tensor() checks a runtime Protocol: slow, and the type says it all
                elif len(producer.attributes) == 1:
                    return _scalar_constant(producer)
        if tensor is None:
            return None
        if limit is None or limit == self.constant_limit:  # the shape-like constants rules read again and again
            seen = self.arrays.get(id(tensor))
            if seen is None:
                seen = self.arrays[id(tensor)] = (tensor, self._read(tensor, value, self.constant_limit))
            return seen[1]
        return self._read(tensor, value, limit)

    def _read(self, tensor: ir.TensorProtocol, value: ir.Value, limit: int) -> np.ndarray | None:
        """``tensor``'s elements as a read-only array if it has at most ``limit`` and they are not strings."""
        if tensor.size > limit or tensor.dtype == ir.DataType.STRING:
            return None
        if tensors.is_file_backed(tensor):  # checked reads, as fold's: a shrunk file is an InputError, not a SIGBUS
            array = tensors.read_tensor(tensor, repr(value.name))
        else:
            try:
                array = np.asarray(tensor.numpy())
            except (OSError, ValueError):
                return None
        array = array.view()  # read-only: the array may be the tensor's own, and is shared by later reads
        array.flags.writeable = False
        return array

    def dtype(self, value: ir.Value | None) -> ir.DataType | None:
        """The element type: the model's, else inference's."""
        if value is None:
            return None
        if value.dtype is not None:
            return value.dtype
        return self.inferred.get(value, (None, None))[0]

    def dims(self, value: ir.Value | None) -> tuple[Dim, ...] | None:
        """The shape proved by inference (or declared, for graph inputs and constants).

        Each dim is an int, a symbol (two equal symbols of one inference run are
        equal sizes), a dim derived from what the ops require (``dims.Clamped``, or
        the representative of the dims proved equal to it: :mod:`passes.simplify.dims`)
        or None (unknown). A graph input's declared shape is its contract.
        """
        if value is None:
            return None
        if self.symbolic is not None:
            derived = self.symbolic().shape(value)
            if derived is not None:
                return derived
        shape: ir.Shape | None
        if value.is_graph_input() or value.is_initializer():
            shape = value.shape
        else:
            array = self.constant(value)
            if array is not None:
                return tuple(int(d) for d in array.shape)
            shape = self.inferred.get(value, (None, None))[1]
            if shape is None and value.producer() is None:
                shape = value.shape  # an outer-scope value of a subgraph, or a function input
        return None if shape is None else inference.known_dims(shape)

    def static_dims(self, value: ir.Value | None) -> tuple[int, ...] | None:
        dims = self.dims(value)
        if dims is None or not all(isinstance(d, int) for d in dims):
            return None
        return dims  # type: ignore[return-value]

    def producer(self, value: ir.Value | None, op_type: str) -> ir.Node | None:
        """The default-domain node of type ``op_type`` producing ``value``, if that is what produces it."""
        if value is None:
            return None
        node = value.producer()
        if node is None or node.op_type != op_type or node.domain not in ("", "ai.onnx"):
            return None
        return node

    # --- rewrites -------------------------------------------------------------------------

    def new_constant(self, array: np.ndarray, base: str, before: ir.Node) -> ir.Value:
        """A new constant holding ``array``: an initializer, or a Constant node before ``before``."""
        names = self.names()
        tensor = ir.Tensor(np.array(array, order="C"))  # ascontiguousarray would make a scalar 1-D
        graph = before.graph
        assert graph is not None
        if self.initializers and isinstance(graph, ir.Graph):
            value = ir.Value(name=names.value(base), type=ir.TensorType(tensor.dtype), shape=ir.Shape(array.shape))
            value.const_value = tensor
            graph.register_initializer(value)
            return value
        node = ir.Node("", "Constant", [], [ir.AttrTensor("value", tensor)], name=names.node(base))
        node.outputs[0].name = names.value(base)
        node.outputs[0].type = ir.TensorType(tensor.dtype)
        node.outputs[0].shape = ir.Shape(array.shape)
        graph.insert_before(before, node)
        return node.outputs[0]

    def bypass(self, node: ir.Node, replacement: ir.Value) -> str | Rewrite:
        """A rewrite making the users of ``node``'s only output use ``replacement`` instead.

        When that output is a graph output (its name, type and shape are the
        graph's contract), ``replacement`` takes its place there under its name,
        type and shape (:meth:`take_place`), provided ``replacement`` is
        computed by another node of the same graph for this node alone:
        nothing else then sees the renaming, and the graph keeps its outputs
        exactly. A graph input, an initializer, a value of an enclosing graph,
        another graph output or a value other nodes also use is not renamed
        (the no-op then stays, as the producer of that output).
        """
        output = node.outputs[0]
        if _requantizes(output, replacement):
            return ("it stands between a DequantizeLinear and a QuantizeLinear (without it onnxruntime's "
                    "optimiser drops that requantization, which rounds otherwise)")
        if self.amplified is not None and _constant_to_onnxruntime(replacement) and feeds_prepacked(output) \
                and (op := prepacked_amplified(output, self.amplified)) is not None:
            return f"its constant input would be a weight onnxruntime prepacks, a change of rounding {op} amplifies"
        if not output.is_graph_output():
            return lambda: output.replace_all_uses_with(replacement)
        producer = replacement.producer()
        if producer is None or producer.graph is not node.graph:
            return "its output is a graph output, and its input is not computed in this graph"
        if not sole_user(replacement):
            return "its output is a graph output, and its input has other users or is one too"
        return self.take_place(output, replacement)

    def take_place(self, old: ir.Value, new: ir.Value) -> Rewrite:
        """A rewrite making ``new`` (not a graph output) replace ``old`` for every user.

        If ``old`` is a graph output, ``new`` takes its place there, with its name,
        type and shape: what callers see of the graph does not change.
        """
        if not old.is_graph_output():
            return lambda: old.replace_all_uses_with(new)

        def rewrite() -> None:
            name = old.name
            old.name = self.names().value(f"{name}_replaced")
            new.name = name
            new.type, new.shape, new.doc_string = old.type, old.shape, old.doc_string
            old.replace_all_uses_with(new, replace_graph_outputs=True)

        return rewrite


#: The domains whose QuantizeLinear/DequantizeLinear onnxruntime's QDQ optimisers read.
_QDQ_DOMAINS = ("", "com.microsoft")


def _constant_to_onnxruntime(value: ir.Value) -> bool:
    """Whether onnxruntime sees ``value`` as a constant (and prepacks it): an initializer that is no
    graph input, or a Constant node's output."""
    producer = value.producer()
    if producer is not None:
        return producer.op_type == "Constant" and normalize_domain(producer.domain) == ""
    return value.is_initializer() and not value.is_graph_input()


def _requantizes(output: ir.Value, replacement: ir.Value) -> bool:
    """Whether making ``output``'s users read ``replacement`` would put a DequantizeLinear straight
    before a QuantizeLinear.

    Exact in ONNX, but onnxruntime's graph optimiser (``ORT_ENABLE_ALL``, its default) removes
    such a pair where it joins two Q/DQ pairs and keeps one scale for both: the requantization's
    rounding is gone, and a model that was bit for bit the original with its optimisations off
    then differs by whole quantization steps with them on (``Q -> DQ -> Reshape -> Q -> DQ ->
    MatMul``: 37% of the elements, up to two steps). A no-op between the two is kept.
    """
    producer = replacement.producer()
    if producer is None or producer.op_type != "DequantizeLinear":
        return False
    if normalize_domain(producer.domain) not in _QDQ_DOMAINS:
        return False
    return any(use.node.op_type == "QuantizeLinear" and normalize_domain(use.node.domain) in _QDQ_DOMAINS
               for use in output.uses())  # fmt: skip


def _scalar_constant(node: ir.Node) -> np.ndarray | None:
    attr = next(iter(node.attributes.values()))
    if not isinstance(attr, ir.Attr) or attr.is_ref():
        return None
    kinds = {"value_float": np.float32, "value_floats": np.float32, "value_int": np.int64, "value_ints": np.int64}
    dtype = kinds.get(attr.name)
    return None if dtype is None else np.asarray(attr.value, dtype=dtype)


def sole_user(value: ir.Value) -> bool:
    """Whether ``value`` has exactly one use and is not a graph output."""
    return not value.is_graph_output() and len(value.uses()) == 1
