"""Constant folding, evaluated with the numpy reference kernels of ``refimpl``.

Rewrite rules, applied in one topological sweep over the main graph, every
subgraph and every model-local function:

* ``op(c1, ..., cn) -> c`` when every input is a constant (an initializer that
  is not a graph input, a ``Constant`` node, or a value folded earlier in the
  sweep) and ``refimpl`` evaluates ``op`` at the opset of its scope. ``c`` keeps
  the name of the node's output; it becomes an initializer in the main graph
  (IR >= 4) and a ``Constant`` node in subgraphs and functions.
* ``Shape(x) -> c`` and ``Size(x) -> c`` when the shape of ``x`` is static
  (from the model or from onnx shape inference run once before the sweep),
  including the ``start``/``end`` slice of Shape-15.
* ``Identity(c) -> c`` (uses redirected, no copy) when ``c`` has other users,
  so that tied weights are not duplicated; otherwise Identity folds like any op.
* ``If(c, then, else) -> the branch c selects``, inlined into the enclosing graph.

Never folded: initializers that are graph inputs, ops whose schema is not
deterministic (RandomNormal, Bernoulli, Dropout...), (Dynamic)QuantizeLinear
and DequantizeLinear, control flow other than a constant If, ops without a
kernel (counted in ``stats["unsupported"]``), and results larger than
``size_limit`` bytes that would make the model grow (``skipped_too_large``).
Nodes and initializers left unused by these rewrites are removed.

Why Constant nodes rather than initializers in subgraphs: a function cannot
hold initializers at all, and a subgraph initializer is legal but handled
unevenly by consumers (IR < 4 requires every initializer to be a graph input,
which for a subgraph would change its signature; some runtimes and converters
reject or mishandle initializers of If/Loop bodies). A Constant node stays in
the body's node order next to its users, so one representation serves both.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
from collections.abc import MutableMapping, Sequence
from typing import Any

import numpy as np
import onnx.defs
import onnx_ir as ir

import refimpl
from passes.base import Pass
from passes.ir import inference as _inference
from passes.fold.surgery import inline_branch, region_of, subgraphs_of
from passes.fold.size import estimate_output_bytes
from passes.ir.tensors import (
    attribute_values,
    constant_tensor,
    make_tensor,
    read_array,
    tensor_nbytes,
)
from passes.ir.names import Names
from passes.ir.schemas import expected_dtypes, is_deterministic
from passes.ir.walk import iter_nodes, normalize_domain, opset_of
from passes.options import Option, parse_size

__all__ = ["DEFAULT_SIZE_LIMIT", "ConstantFoldingPass"]

DEFAULT_SIZE_LIMIT = 1 << 20

logger = logging.getLogger(__name__)

_QUANTIZE_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"})
_QUANTIZE_DOMAINS = frozenset({"", "com.microsoft"})
_SHAPE_OPS = frozenset({"Shape", "Size"})


@dataclasses.dataclass
class FoldStats:
    """What one run of the pass did; ``as_dict`` is JSON-serialisable."""

    folded: int = 0
    if_inlined: int = 0
    skipped_too_large: int = 0
    removed_nodes: int = 0
    removed_initializers: int = 0
    unsupported: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    failed: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)

    def as_dict(self) -> dict[str, Any]:
        result = dataclasses.asdict(self)
        result["unsupported"] = dict(sorted(self.unsupported.items()))
        result["failed"] = dict(sorted(self.failed.items()))
        return result


@dataclasses.dataclass(frozen=True)
class _Scope:
    """Where nodes are folded: the opsets that apply and how constants are stored."""

    opset_imports: MutableMapping[str, int]
    initializers: bool  # main graph (IR >= 4): initializers; else Constant nodes

    def opset(self, domain: str) -> int | None:
        return opset_of(self.opset_imports, domain)


class ConstantFoldingPass(Pass):
    """Folds constant subexpressions, static shapes and constant-condition Ifs.

    See the module docstring for the rewrite rules. ``stats`` describes the
    last run: ``folded``, ``if_inlined``, ``skipped_too_large``,
    ``removed_nodes``, ``removed_initializers``, and ``unsupported`` / ``failed``
    counts by op type (a kernel that rejects its inputs counts as failed and
    the node stays).

    Attributes:
        size_limit: A folded result larger than this many bytes is kept only
            if the constants it replaces are at least as large (the model
            does not grow).
    """

    NAME = "fold"
    DESCRIPTION = "constant folding: evaluate nodes with constant inputs with refimpl"
    OPTIONS = (
        Option("fold_size_limit", DEFAULT_SIZE_LIMIT, "largest constant folding may add (default: 1M)",
               parse=parse_size, metavar="BYTES", argument="size_limit"),
    )

    def __init__(self, size_limit: int = DEFAULT_SIZE_LIMIT) -> None:
        super().__init__()
        if size_limit < 0:
            raise ValueError(f"size_limit must be >= 0, got {size_limit}")
        self.size_limit = size_limit
        self.stats: dict[str, Any] = FoldStats().as_dict()

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        sweep = _Sweep(model, self.size_limit)
        sweep.run()
        self.stats = sweep.stats.as_dict()
        stats = sweep.stats
        modified = bool(
            stats.folded or stats.if_inlined or stats.removed_nodes or stats.removed_initializers
        )
        logger.info("constant folding: %s", self.stats)
        return ir.passes.PassResult(model, modified=modified)


class _Sweep:
    """The state of one run: known constants, nodes to remove, statistics."""

    def __init__(self, model: ir.Model, size_limit: int) -> None:
        self.model = model
        self.size_limit = size_limit
        self.stats = FoldStats()
        self._known: dict[ir.Value, ir.TensorProtocol] = {}
        self._removed: set[ir.Node] = set()
        self._pending: dict[ir.Graph, list[ir.Node]] = {}
        self._released: dict[ir.Value, None] = {}
        self._inferred: dict[ir.Value, tuple[int, ...]] = {}
        self._names: Names | None = None

    # --- driver ------------------------------------------------------------------------------

    def run(self) -> None:
        self._inferred = _inference.infer_static_shapes(self.model, self._unknown_shapes())
        main = _Scope(self.model.opset_imports, initializers=self.model.ir_version >= 4)
        self._sweep(list(self.model.graph), main)
        for function in self.model.functions.values():
            self._sweep(list(function), _Scope(function.opset_imports, initializers=False))
        self._collect_garbage()

    def _unknown_shapes(self) -> list[ir.Value]:
        """Inputs of Shape/Size nodes whose static shape neither the model nor a constant gives."""
        values = []
        for node, _ in iter_nodes(self.model, functions=False):
            if node.op_type in _SHAPE_OPS and normalize_domain(node.domain) == "" and node.inputs:
                x = node.inputs[0]
                if x is not None and not _inference.is_static(x.shape) and self._constant(x) is None:
                    values.append(x)
        return values

    def _sweep(self, nodes: Sequence[ir.Node], scope: _Scope) -> None:
        for node in nodes:
            if node not in self._removed:
                self._visit(node, scope)

    def _visit(self, node: ir.Node, scope: _Scope) -> None:
        domain = normalize_domain(node.domain)
        if domain == "" and node.op_type == "Constant":
            tensor = constant_tensor(node, self.size_limit)
            if tensor is not None:
                self._known[node.outputs[0]] = tensor
            return
        subgraphs = subgraphs_of(node)
        if subgraphs:
            if domain == "" and node.op_type == "If" and self._inline_if(node, scope):
                return
            inner = dataclasses.replace(scope, initializers=False)
            for graph in subgraphs:
                self._sweep(list(graph), inner)
            return
        if domain == "" and node.op_type in _SHAPE_OPS:
            self._fold_shape(node, scope)
            return
        tensors: list[ir.TensorProtocol | None] = []
        for value in node.inputs:
            if value is None:
                tensors.append(None)
                continue
            tensor = self._constant(value)
            if tensor is None:
                return
            tensors.append(tensor)
        self._fold(node, domain, tensors, scope)

    # --- constants ---------------------------------------------------------------------------

    def _constant(self, value: ir.Value) -> ir.TensorProtocol | None:
        tensor = self._known.get(value)
        if tensor is not None:
            return tensor
        if value.is_initializer() and not value.is_graph_input():
            return value.const_value
        return None

    def _static_dims(self, value: ir.Value) -> tuple[int, ...] | None:
        tensor = self._constant(value)
        if tensor is not None:
            return tuple(int(d) for d in tensor.shape.numpy())
        if _inference.is_static(value.shape):
            return tuple(int(d) for d in value.shape)
        return self._inferred.get(value)

    # --- rewrite rules -----------------------------------------------------------------------

    def _fold(
        self, node: ir.Node, domain: str, tensors: list[ir.TensorProtocol | None], scope: _Scope
    ) -> None:
        op = node.op_type
        opset = scope.opset(domain)
        if opset is None:
            self.stats.unsupported[op] += 1
            return
        if not self._can_store(scope):
            logger.debug("Not folding %s: no default-domain opset for a Constant node", node.name)
            return
        if op in _QUANTIZE_OPS and domain in _QUANTIZE_DOMAINS:
            logger.debug("Not folding %s: quantisation ops are kept", node.name)
            return
        if not is_deterministic(op, domain, opset):
            logger.debug("Not folding %s: %s is not deterministic", node.name, op)
            return
        attrs = attribute_values(node)
        if attrs is None or any(
            o.type is not None and not isinstance(o.type, ir.TensorType) for o in node.outputs
        ):
            logger.debug("Not folding %s: attributes or outputs a kernel cannot handle", node.name)
            return
        if domain == "" and op == "Identity" and self._alias_identity(node):
            return
        try:
            refimpl.lookup(op, opset, domain)
        except refimpl.UnsupportedOpError:
            self.stats.unsupported[op] += 1
            return
        estimate = estimate_output_bytes(op, domain, tensors, attrs)
        if estimate is not None and self._too_large(node, estimate):
            return
        arrays = [None if t is None else read_array(v, t, node) for v, t in zip(node.inputs, tensors)]
        try:
            results = refimpl.run(op, arrays, attrs, opset=opset, domain=domain, num_outputs=len(node.outputs))
        except refimpl.UnsupportedOpError as e:
            logger.debug("Not folding %s: %s", node.name, e)
            self.stats.unsupported[op] += 1
            return
        except refimpl.RefImplError as e:
            logger.warning("Not folding %s node %r: %s", op, node.name, e)
            self.stats.failed[op] += 1
            return
        expected = expected_dtypes(op, domain, opset, tensors, len(node.outputs))
        outputs = self._check_results(node, results, expected)
        if outputs is None:
            self.stats.failed[op] += 1
            return
        if self._too_large(node, sum(a.nbytes for a in outputs if a is not None)):
            return
        self._replace(node, outputs, scope)

    def _alias_identity(self, node: ir.Node) -> bool:
        """``Identity(c) -> c`` when ``c`` stays in use: a copy would duplicate its bytes.

        (Tied weights in torch exports reach their users through such Identity
        nodes.) An Identity producing a graph output keeps its name by folding.
        """
        x, y = node.inputs[0], node.outputs[0]
        if x is None or y.is_graph_output():
            return False
        if not x.is_graph_output() and all(use.node is node for use in x.uses()):
            return False  # folding moves the bytes under y's name without growth
        y.replace_all_uses_with(x)
        self._drop(node)
        self.stats.folded += 1
        logger.debug("Folded Identity node %r into its constant input %r", node.name, x.name)
        return True

    def _fold_shape(self, node: ir.Node, scope: _Scope) -> None:
        x = node.inputs[0] if node.inputs else None
        if x is None or not self._can_store(scope):
            return
        dims = self._static_dims(x)
        if dims is None:
            return
        if node.op_type == "Size":
            result = np.array(math.prod(dims), dtype=np.int64)
        else:
            result = _inference.shape_slice(
                dims, node.attributes.get_int("start", 0), node.attributes.get_int("end", None)
            )
        self._replace(node, [result], scope)

    def _inline_if(self, node: ir.Node, scope: _Scope) -> bool:
        cond = node.inputs[0] if node.inputs else None
        tensor = None if cond is None else self._constant(cond)
        if tensor is None or tensor.dtype != ir.DataType.BOOL or tensor.size != 1:
            return False
        taken = "then_branch" if bool(read_array(cond, tensor, node).reshape(-1)[0]) else "else_branch"
        attr = node.attributes.get(taken)
        if not isinstance(attr, ir.Attr) or attr.type != ir.AttributeType.GRAPH or attr.is_ref():
            return False
        branch = attr.as_graph()
        if len(branch.outputs) != len(node.outputs):
            return False
        if self._names is None:
            self._names = Names(self.model)
        inlined = inline_branch(node, branch, self._names, use_initializers=scope.initializers)
        self._drop(node)
        self.stats.if_inlined += 1
        logger.debug("Inlined %s of If %r (%d nodes)", taken, node.name, len(inlined))
        self._sweep(inlined, scope)
        return True

    # --- checks ------------------------------------------------------------------------------

    def _can_store(self, scope: _Scope) -> bool:
        """A Constant node needs the default domain imported where it is inserted."""
        return scope.initializers or scope.opset("") is not None

    def _check_results(
        self, node: ir.Node, results: Sequence[Any], expected: Sequence[ir.DataType | None]
    ) -> list[np.ndarray | None] | None:
        """The kernel's outputs by node output, or None if they do not fit the node.

        Each must be an array whose dtype is the one the schema implies
        (``expected``) and the one the model declares, and whose shape fits
        the declared shape.
        """
        outputs: list[np.ndarray | None] = []
        for i, value in enumerate(node.outputs):
            needed = bool(value.uses()) or value.is_graph_output()
            if i >= len(results):
                if needed:
                    logger.warning("Not folding %r: kernel returned no output %d", node.name, i)
                    return None
                outputs.append(None)
                continue
            array = results[i]
            if not isinstance(array, (np.ndarray, np.generic)):
                logger.warning("Not folding %r: output %d is a %s", node.name, i, type(array).__name__)
                return None
            array = np.asarray(array)
            dtype = (
                ir.DataType.STRING if array.dtype.kind in "OSU" else ir.DataType.from_numpy(array.dtype)
            )
            for want in (expected[i], value.dtype):
                if want is not None and want != dtype:
                    logger.warning(
                        "Not folding %r: kernel gave %s for %s output %s",
                        node.name,
                        dtype,
                        want,
                        value.name,
                    )
                    return None
            if value.shape is not None and not _shape_fits(value.shape, array.shape):
                logger.warning(
                    "Not folding %r: kernel gave shape %s for %s", node.name, array.shape, value.shape
                )
                return None
            outputs.append(array if needed else None)
        return outputs

    def _too_large(self, node: ir.Node, nbytes: int) -> bool:
        if nbytes <= self.size_limit or nbytes <= self._freed_bytes(node):
            return False
        logger.info(
            "Not folding %s node %r: %d bytes would grow the model", node.op_type, node.name, nbytes
        )
        self.stats.skipped_too_large += 1
        return True

    def _freed_bytes(self, node: ir.Node) -> int:
        """Bytes of the constant inputs that folding the node leaves unused (and removes)."""
        total = 0
        for value in dict.fromkeys(v for v in node.inputs if v is not None):
            if value.is_graph_output() or any(use.node is not node for use in value.uses()):
                continue
            producer = value.producer()
            if value.is_initializer() or (producer is not None and producer.op_type == "Constant"):
                tensor = self._constant(value)
                if tensor is not None:
                    total += tensor_nbytes(tensor)
        return total

    # --- graph changes -----------------------------------------------------------------------

    def _replace(self, node: ir.Node, arrays: Sequence[np.ndarray | None], scope: _Scope) -> None:
        """Replaces the node's outputs by constants with the same names, and drops the node."""
        graph = node.graph
        assert graph is not None
        for i, (value, array) in enumerate(zip(node.outputs, arrays)):
            if array is None:
                continue
            tensor = make_tensor(array, value.name)
            new = ir.Value(
                name=value.name,
                type=ir.TensorType(tensor.dtype),
                shape=ir.Shape(array.shape),
                doc_string=value.doc_string,
                metadata_props=dict(value.metadata_props) or None,
            )
            if scope.initializers:
                new.const_value = tensor
                value.replace_all_uses_with(new, replace_graph_outputs=True)
                graph.register_initializer(new)
            else:
                name = node.name if i == 0 or not node.name else f"{node.name}_{i}"
                constant = ir.Node(
                    "", "Constant", [], [ir.AttrTensor("value", tensor)], outputs=[new], name=name
                )
                graph.insert_before(node, constant)
                value.replace_all_uses_with(new, replace_graph_outputs=True)
                self._known[new] = tensor
        self._drop(node)
        self.stats.folded += 1
        logger.debug("Folded %s node %r", node.op_type, node.name)

    def _drop(self, node: ir.Node) -> None:
        """Disconnects the node (and what its subgraphs use) and schedules its removal."""
        region, graphs = region_of(node)
        for member in region:
            for i, value in enumerate(member.inputs):
                if value is None:
                    continue
                member.replace_input_with(i, None)
                if value.graph not in graphs:
                    self._released[value] = None
        self._removed.add(node)
        graph = node.graph
        assert graph is not None
        self._pending.setdefault(graph, []).append(node)

    def _collect_garbage(self) -> None:
        """Removes what the rewrites left unused: initializers, Constant and other dead nodes."""
        while self._released:
            value, _ = self._released.popitem()
            if value.is_graph_output() or value.uses():
                continue
            if value.is_initializer():
                if not value.is_graph_input() and value.graph is not None:
                    value.graph.initializers.pop(value.name)
                    self.stats.removed_initializers += 1
                continue
            producer = value.producer()
            if producer is None or producer in self._removed or producer.graph is None:
                continue
            if any(o.is_graph_output() or o.uses() for o in producer.outputs):
                continue
            self._drop(producer)
            self.stats.removed_nodes += 1
        for graph, nodes in self._pending.items():
            graph.remove(nodes)


def _shape_fits(declared: ir.Shape, actual: tuple[int, ...]) -> bool:
    if len(declared) != len(actual):
        return False
    return all(not isinstance(d, int) or d == a for d, a in zip(declared, actual))
