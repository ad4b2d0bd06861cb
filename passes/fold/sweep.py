"""One run of constant folding: the sweep over every scope, what it counts, and its scopes.

:class:`Sweep` walks the main graph, every subgraph and every model-local function in
topological order, tracking which values are constant; each node meets the op rules first (given
to it by the pass: ``passes.fold.rules.RULES``), then the guards (``policy``), the evaluation
(``evaluate``) and the graph surgery (``surgery``); the folds it makes wait in a batch that
onnxruntime settles (``confirm``) before they stand. :class:`Scope` is where nodes are folded
(its opsets, and whether constants are stored as initializers or Constant nodes), and
:class:`FoldStats` what a run did, which the pass reports as its ``stats``.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

from passes.base import pass_stats
from passes.fold import confirm as _confirm
from passes.fold import carry, decide, evaluate, policy
from passes.fold.pending import Fold
from passes.fold.surgery import Rewriter, subgraphs_of
from passes.ir import checked_inputs, inference
from passes.ir.amplification import Amplified
from passes.ir.prepack import feeds_prepacked, prepacked_amplified
from passes.ir.tensors import attribute_values, make_tensor
from passes.ir.walk import iter_scopes, normalize_domain, opset_of
from passes.phases import node_done

__all__ = ["FoldStats", "Scope", "Sweep"]

logger = logging.getLogger(__name__)

_SHAPE_OPS = frozenset({"Shape", "Size"})
_GRAPH_TYPES = (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
#: The indices of each op's ``axes`` inputs (:data:`passes.ir.checked_inputs.AXES_INPUTS`).
_AXES_AT: dict[str, tuple[int, ...]] = {
    op: tuple(sorted(i for o, i in checked_inputs.AXES_INPUTS if o == op)) for op, _ in checked_inputs.AXES_INPUTS
}


@dataclasses.dataclass
class FoldStats:
    """What one run of the pass did; ``as_dict`` is JSON-serialisable."""

    #: Nodes folded, by op type.
    applied: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    #: Nodes with constant inputs left alone, by reason (see ``passes.fold.policy``).
    declined: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    if_inlined: int = 0
    skipped_too_large: int = 0
    removed_nodes: int = 0
    removed_initializers: int = 0
    unsupported: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    failed: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    kernel_bugs: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    confirmed: int = 0
    #: Folded values that became the weight input of an op onnxruntime prepacks when the weight is
    #: constant (MatMul's B, Conv's W...): its kernel may then sum in another order, so the result
    #: of that op can differ by rounding though the folded value is exact (the check knows it).
    weights_made_constant: int = 0
    #: Confirmed values written with onnxruntime's bits (refimpl's differed by a few ULPs).
    onnxruntime_rounding: int = 0
    disagrees_with_onnxruntime: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    unconfirmed: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    #: Of ``disagrees_with_onnxruntime``, the folds whose onnxruntime kernel approximates with bits that
    #: depend on the cut of the tensor, by op: its value is not taken (see ``passes.fold.kernels``).
    cut_dependent: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    #: Folded values of nodes onnxruntime has no kernel for (a bfloat16 Add), by op: computed by
    #: refimpl as the spec defines them, the only reference there (see ``passes.fold.confirm``).
    by_spec: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    #: Folded values refimpl leaves to the runtime's choice (the sign of a zero whose terms are all
    #: -0...) or its kernel's (``passes.fold.kernels``), by op: computed by onnxruntime from the same
    #: constants (see ``passes.fold.decide``).
    runtime_decided: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)

    @property
    def folded(self) -> int:
        return sum(self.applied.values())

    def as_dict(self) -> dict[str, Any]:
        details = dataclasses.asdict(self)
        del details["applied"], details["declined"]
        for key in ("unsupported", "failed", "kernel_bugs", "disagrees_with_onnxruntime", "unconfirmed", "by_spec",
                    "runtime_decided", "cut_dependent"):
            details[key] = dict(sorted(getattr(self, key).items()))
        return pass_stats(self.applied, self.declined, folded=self.folded, **details)


@dataclasses.dataclass(frozen=True)
class Scope:
    """Where nodes are folded: the opsets that apply and how constants are stored.

    The sweep makes one for the main graph and one per function; a subgraph's is its
    enclosing scope's with ``initializers`` off. The rules (``passes.fold.rules``) read it.
    """

    opset_imports: MutableMapping[str, int]
    initializers: bool  # main graph (IR >= 4): initializers; else Constant nodes

    def opset(self, domain: str) -> int | None:
        return opset_of(self.opset_imports, domain)

    @property
    def can_store(self) -> bool:
        """A Constant node needs the default domain imported where it is inserted."""
        return self.initializers or self.opset("") is not None




class Sweep:
    """One run: a topological sweep that tracks which values are constant.

    ``rules`` (the pass gives ``passes.fold.rules.RULES``, by op type) see each node first; a
    node with constant inputs otherwise goes through the guards (``policy``) and is evaluated
    (``evaluate``); the graph changes are the ``Rewriter``'s (``surgery``). The rules call back
    into the sweep (``constant``, ``replace``, ``refuse``, ``sweep``, ``settle_value``...), which
    is why they are given to it rather than imported by it.
    """

    def __init__(
        self,
        model: ir.Model,
        size_limit: int,
        confirm: bool = True,
        unconfirmed: dict[tuple[ir.Node, tuple[ir.Value | None, ...]], str] | None = None,
        runner: _confirm.Runner | None = None,
        *,
        rules: Mapping[str, Callable[[Sweep, ir.Node, Scope], bool]],
    ) -> None:
        self.model = model
        self.rules = rules
        self.size_limit = size_limit
        self.confirm = confirm
        self.unconfirmed = {} if unconfirmed is None else unconfirmed
        self.runner = _confirm.Runner() if runner is None else runner
        self.pending: list[Fold] = []  # folds not yet confirmed
        self.origin: dict[ir.Value, Fold] = {}  # the fold that made a constant value
        self._replaced: dict[Fold, dict[ir.Value, ir.Value]] = {}
        self.stats = FoldStats()
        self.known: dict[ir.Value, ir.TensorProtocol] = {}
        self.made_values: dict[ir.Value, None] = {}  # the constants written, in order
        self.rewriter = Rewriter(model)
        self._inferred: dict[ir.Value, tuple[int, ...]] = {}
        self._ranks: dict[ir.Value, int] = {}
        self._dims: dict[ir.Value, tuple[int, ...]] = {}
        self.decided = 0  # nodes onnxruntime computed for refimpl (see ``decide``)
        self._amplified: Amplified | None = None  # where rounding changes are amplified (walked on first use)

    def run(self) -> None:
        found = inference.infer_types(self.model, self._unknown())
        self._inferred = {v: tuple(int(d) for d in s) for v, (_, s) in found.items() if inference.is_static(s)}
        self._ranks = {v: len(s) for v, (_, s) in found.items() if s is not None}
        main = Scope(self.model.opset_imports, initializers=self.model.ir_version >= 4)
        self.sweep(list(self.model.graph), main)
        for function in self.model.functions.values():
            self.sweep(list(function), Scope(function.opset_imports, initializers=False))
        self.settle()
        removed_nodes, removed_initializers = self.rewriter.collect_garbage()
        self.stats.removed_nodes += removed_nodes
        self.stats.removed_initializers += removed_initializers
        self.stats.weights_made_constant = sum(feeds_prepacked(value) for value in self.made_values)

    def _unknown(self) -> list[ir.Value]:
        """What inference is asked, in one walk of the graphs (not functions):

        * the inputs of Shape/Size nodes whose static shape neither the model nor a constant gives;
        * the data inputs of nodes with a computed ``axes`` input whose rank the model does not
          declare (a folded ``axes`` out of their range must stay computed: see
          ``policy.fails_downstream``). An ``axes`` that is already a constant (an initializer, a
          graph input) is never a fold's result, so its node's rank is not asked: on a graph of 10k
          Reduce ops whose ``axes`` the upgrade made initializers, inference of 10k values in every
          round for nothing.
        """
        shapes, ranks = [], []
        for scope in iter_scopes(self.model, functions=False):
            for node in scope.body:  # the op type first: most nodes are neither (a walk of 10k nodes a round)
                op_type = node.op_type
                axes_at = _AXES_AT.get(op_type)
                if axes_at is None and op_type not in _SHAPE_OPS:
                    continue
                inputs = node.inputs
                if not inputs or inputs[0] is None or normalize_domain(node.domain) != "":
                    continue
                x = inputs[0]
                if axes_at is None:
                    if not inference.is_static(x.shape) and self.constant(x) is None:
                        shapes.append(x)
                elif x.shape is None:
                    for i in axes_at:
                        if i < len(inputs) and inputs[i] is not None and inputs[i].producer() is not None:
                            ranks.append(x)
                            break
        return shapes + ranks

    # --- traversal ---------------------------------------------------------------------------

    def sweep(self, nodes: Sequence[ir.Node], scope: Scope) -> None:
        removed = self.rewriter.removed
        for node in nodes:
            node_done()
            if node not in removed:
                self._visit(node, scope)

    def _visit(self, node: ir.Node, scope: Scope) -> None:
        domain = normalize_domain(node.domain)
        rule = self.rules.get(node.op_type) if domain == "" else None
        if rule is not None and rule(self, node, scope):
            return
        stored = node.attributes
        for attr in getattr(stored, "data", stored).values():  # no list of subgraphs for a node with none
            if attr.type in _GRAPH_TYPES and (subgraphs := subgraphs_of(node)):
                inner = dataclasses.replace(scope, initializers=False)
                for graph in subgraphs:
                    self.sweep(list(graph), inner)
                return
        tensors: list[ir.TensorProtocol | None] = []
        for value in node.inputs:
            if value is None:
                tensors.append(None)
                continue
            tensor = self.constant(value)
            if tensor is None:
                return
            tensors.append(tensor)
        self._fold(node, domain, tensors, scope)

    def _dims_of(
        self, value: ir.Value | None, tensor: ir.TensorProtocol | None
    ) -> tuple[int, ...] | None:
        """The dims of a constant input, worked out once per value."""
        if value is None or tensor is None:
            return None
        dims = self._dims.get(value)
        if dims is None:
            dims = self._dims[value] = tuple(int(d) for d in tensor.shape.dims)
        return dims

    # --- constness ---------------------------------------------------------------------------

    def constant(self, value: ir.Value) -> ir.TensorProtocol | None:
        """The value's tensor if it is constant: folded or a Constant's, or a non-input initializer."""
        tensor = self.known.get(value)
        if tensor is not None:
            return tensor
        if value.is_initializer() and not value.is_graph_input():
            return value.const_value
        return None

    def rank(self, value: ir.Value | None) -> int | None:
        """The rank of ``value`` if the model declares it or inference found it."""
        if value is None:
            return None
        if value.shape is not None:
            return len(value.shape)
        return self._ranks.get(value)

    def static_dims(self, value: ir.Value) -> tuple[int, ...] | None:
        tensor = self.constant(value)
        if tensor is not None:
            return tuple(int(d) for d in tensor.shape.numpy())
        if inference.is_static(value.shape):
            return tuple(int(d) for d in value.shape)
        return self._inferred.get(value)

    # --- folding -----------------------------------------------------------------------------

    def _fold(
        self, node: ir.Node, domain: str, tensors: list[ir.TensorProtocol | None], scope: Scope
    ) -> None:
        candidate = policy.Candidate(
            node=node,
            domain=domain,
            opset=scope.opset(domain),
            tensors=tensors,
            dims=[self._dims_of(v, t) for v, t in zip(node.inputs, tensors)],
            attrs=attribute_values(node),
            initializers=scope.initializers,
            default_opset=scope.opset(""),
            size_limit=self.size_limit,
            constant=self.constant,
        )
        reason = policy.refusal(candidate) or self.prepacked_amplified(node)
        if reason is None and self.confirm:
            reason = self.unconfirmed.get((node, tuple(node.inputs)))
        if reason is None:
            try:
                outputs = evaluate.evaluate(candidate, runtime=self.confirm)
            except evaluate.EvaluationError as e:
                if e.runtime_choice:
                    decide.decide(self, candidate, scope, str(e))
                    return
                if e.kernel_bug:
                    counter = self.stats.kernel_bugs
                else:
                    counter = self.stats.unsupported if e.unsupported else self.stats.failed
                counter[node.op_type] += 1
                return
            reason = policy.result_too_large(candidate, outputs) or policy.fails_downstream(candidate, outputs, self.rank)
        if reason is not None:
            self.refuse(node, reason)
            return
        self.replace(node, outputs, scope, tensors)

    def prepacked_amplified(self, node: ir.Node) -> str | None:
        """Why folding ``node`` is declined (None: it is not): its output would be a weight onnxruntime
        prepacks, and the op's change of rounding (its blocked sum) is amplified later (a quantizer:
        :func:`passes.ir.prepack.prepacked_amplified`). The node stays, as the original computes it."""
        for value in node.outputs:
            if feeds_prepacked(value):
                self._amplified = self._amplified or Amplified(self.model)
                if (op := prepacked_amplified(value, self._amplified)) is not None:
                    return f"prepacked weight: its op's change of rounding is amplified by {op}"
        return None

    def refuse(self, node: ir.Node, reason: str) -> None:
        """Logs and counts why ``node`` is left alone (see ``policy``)."""
        logger.debug("Not folding %s node %r: %s", node.op_type, node.name, reason)
        key = policy.category(reason)
        self.stats.declined[key] += 1
        counter = policy.COUNTERS.get(key)
        if counter == "unsupported":
            self.stats.unsupported[node.op_type] += 1
        elif counter == "skipped_too_large":
            self.stats.skipped_too_large += 1

    def replace(
        self,
        node: ir.Node,
        arrays: Sequence[np.ndarray | None],
        scope: Scope,
        tensors: Sequence[ir.TensorProtocol | None] | None = None,
        decided: bool = False,
    ) -> None:
        """Replaces the node's outputs by constants with the same names, and drops the node.

        With confirmation on, the fold stays pending until :meth:`settle`, unless onnxruntime
        computed ``arrays`` (``decided``: :mod:`passes.fold.decide`).
        ``tensors`` are the node's constant inputs (read from the sweep if not given).
        """
        inputs, outputs = tuple(node.inputs), tuple(node.outputs)
        if tensors is None:
            tensors = [None if v is None else self.constant(v) for v in inputs]
        made, replaced = self.rewriter.replace_with_constants(
            node, arrays, use_initializers=scope.initializers
        )
        self.known.update(made)
        self.made_values.update(dict.fromkeys(replaced.values()))
        self.stats.applied[node.op_type] += 1
        logger.debug("Folded %s node %r", node.op_type, node.name)
        if not self.confirm or decided:
            return
        fold = Fold(
            node=node,
            domain=normalize_domain(node.domain),
            opsets=dict(scope.opset_imports),
            inputs=inputs,
            tensors=list(tensors),
            outputs=outputs,
            made=[replaced.get(v) for v in outputs],
            arrays=list(arrays),
        )
        self.pending.append(fold)
        self._replaced[fold] = replaced
        for value in replaced.values():
            self.origin[value] = fold
        if not fold.exempt and len(self.pending) == 1:
            self.runner.prestart()

    def settle(self) -> None:
        """Asks onnxruntime about the pending folds (one batch) and undoes those it does not confirm."""
        pending, self.pending = self.pending, []
        replaced = {f: self._replaced.pop(f) for f in pending}
        if all(f.exempt for f in pending):
            return  # nothing to compute: an exempt fold's inputs were all settled before it
        batch = _confirm.settle(self.model, pending, self.origin, self.runner)
        verdicts, reasons = batch.final, batch.reasons
        undone = [f for f in pending if verdicts[f] != _confirm.AGREES]
        for fold in pending:
            if fold.exempt or fold not in batch.judged:
                continue  # an intermediate value, not written
            verdict = verdicts[fold]
            if verdict == _confirm.AGREES and fold in batch.by_spec:
                self.stats.by_spec[fold.op_type] += 1
            elif verdict == _confirm.AGREES:
                self.stats.confirmed += 1
            elif verdict == _confirm.DISAGREES:
                self.stats.disagrees_with_onnxruntime[fold.op_type] += 1
                if fold in batch.cut_dependent:
                    self.stats.cut_dependent[fold.op_type] += 1
            else:
                self.stats.unconfirmed[fold.op_type] += 1
        adopted = {replaced[fold].get(fold.outputs[index]): theirs for (fold, index), theirs in batch.adopted.items()
                   if verdicts[fold] == _confirm.AGREES}  # fmt: skip
        adopted.pop(None, None)
        for value, theirs in adopted.items():
            self._adopt(value, theirs)
        if adopted:  # the exempt folds that read them (most batches adopt nothing: no walk)
            kept = [f for f in pending if verdicts[f] == _confirm.AGREES]
            for value, moved in carry.carried(kept, adopted).items():
                self._adopt(value, moved, counted=False)
        for fold in undone:
            level = logging.INFO if verdicts[fold] == _confirm.DISAGREES else logging.DEBUG
            logger.log(level, "Not folding %s node %r: %s (%s)", fold.op_type, fold.node.name, verdicts[fold],
                       reasons.get(fold, ""))  # fmt: skip
        if not undone:
            return
        self.rewriter.restore([(f.node, f.inputs, replaced[f]) for f in undone])
        for fold in undone:
            self.unconfirmed[(fold.node, tuple(fold.node.inputs))] = (
                f"not confirmed by onnxruntime: {verdicts[fold]} in an earlier run"
            )
            for value in replaced[fold].values():
                self.origin.pop(value, None)
                self.known.pop(value, None)
                self.made_values.pop(value, None)
        for fold in undone:
            self.stats.applied[fold.op_type] -= 1

    def _adopt(self, value: ir.Value | None, array: np.ndarray, counted: bool = True) -> None:
        """Writes onnxruntime's bits for a folded value (they agree with refimpl's within ULPs).

        ``counted``: counted in ``onnxruntime_rounding`` (not a byte-moving fold's value that carries them).
        """
        if value is None:
            return
        tensor = make_tensor(array, value.name)
        if value.const_value is not None:
            value.const_value = tensor
        else:
            producer = value.producer()
            if producer is None or producer.op_type != "Constant":
                return
            producer.attributes["value"] = ir.AttrTensor("value", tensor)
        if value in self.known:
            self.known[value] = tensor
        if counted:
            self.stats.onnxruntime_rounding += 1

    def settle_value(self, value: ir.Value) -> None:
        """Settles the pending folds now if ``value`` is one's result (before a decision rests on it)."""
        fold = self.origin.get(value)
        if fold is not None and any(f is fold for f in self.pending):
            self.settle()
