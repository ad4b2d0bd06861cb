"""Simplification: the clean-up rewrites users compare first, each exact.

Rewrite rules, in small modules by family, applied to every graph, subgraph
and model-local function until nothing changes (bounded):

* ``constants``: ``Constant`` nodes of the main graph and of its subgraphs
  become main-graph initializers (IR >= 4; subgraphs see outer values;
  functions keep their Constant nodes, they do not); equal ones are shared,
  exactly (``-0.0`` is not ``0.0``), as are equal initializers of one graph
  (dtype, shape and bytes; never a graph input: a caller may override it), so
  that CSE merges their users.
* ``control_flow``: an If whose condition an enclosing branch decides (an If
  on ``c``, ``Not(c)`` or a recomputation of ``c`` inside a branch of
  ``If(c)``), or whose two branches are the same graph, gets a constant
  condition, and fold inlines the branch it takes.
* ``cse``: common subexpressions: two nodes with the same op, inputs and
  attributes (compared exactly: ``-0.0`` is not ``0.0``) compute the same
  thing, unless the op is not deterministic (RandomNormalLike...), holds a
  subgraph, or is of a domain whose schemas we do not know.
* ``noops``: Identity (in a subgraph, also one producing an output, unless
  its input is an outer value or a subgraph input), Cast/CastLike to the
  same type, inference Dropout,
  Expand/Reshape to the same shape, Flatten of a matrix, identity Transpose,
  zero Pad, one-input Concat, all-ones Tile, full-range Slice, empty
  Unsqueeze, integer Where with a constant condition, a +0 initial state of
  a recurrent op (its default). A no-op producing a graph output (not an Identity,
  which stays) goes when its input, computed for it alone, can take the output's name.
* ``chains``: Reshape∘Reshape, Unsqueeze∘Unsqueeze, Squeeze∘Unsqueeze and
  Unsqueeze∘Squeeze on the same axes, Transpose∘Transpose, lossless Cast∘Cast,
  a Reshape and its inverse around elementwise ops of single-element operands,
  Flatten/Reshape around a Softmax that is then one op.
* ``shapes``: partial shapes: the dims of ``Shape(x)`` that inference proves
  static become constants (``Shape``, ``Gather``/``Slice`` of a Shape), and a
  computed Reshape target becomes a constant with ``0`` (copy a dim) and
  ``-1`` where inference proves that the same.
* ``algebra``: ``x*1``, ``x/1``, ``x-(+0)``, ``x+(-0)``, ``And(x, true)``,
  ``Or(x, false)``: only where they are the identity in IEEE arithmetic
  (``x+0`` is not: it turns -0 into +0) and the output has the input's shape
  (no hidden broadcast). Constants are compared exactly.
* ``fusions`` (``--no-fuse`` turns them off): BatchNormalization into a
  preceding Conv/ConvTranspose/Gemm, a per-channel Mul/Add into a Conv, and
  MatMul+Add of proved matrices into a Gemm; the exporters' LayerNorm, GELU,
  RMSNorm, rotate-half rotary embedding and scaled dot-product attention into
  the standard ``LayerNormalization`` (opset 17), ``Gelu`` (20),
  ``RMSNormalization`` (23), ``RotaryEmbedding`` (23) and ``Attention`` (23),
  where onnxruntime has the kernel and computes what the primitive ops do
  (patterns only a higher opset would take are counted as
  ``fusable_at_higher_opset``). These are the only rules that change float
  results (by rounding: docs/exactness.md says how much); the report counts
  them and the check covers them. Each is vetted before it is written
  (:mod:`.fusions.accept`): the fused op's output has the pattern's shape, and
  its result reaches no op that would amplify the change of rounding
  (:mod:`passes.ir.amplification`, one walk per run, on the first fusion found;
  declined as ``"<rule>: rounding amplified by <op>"``).

Shapes come from onnx shape inference run on the model with the shapes it
declares for computed values removed, so a declared shape that the graph
contradicts is never taken as a fact, and from what the main graph's ops
require of the dims inference leaves as fresh symbols (``Range(0, n, 1)`` has
``n`` elements, a broadcast of ``s`` with ``s`` or ``1`` is ``s``, a MatMul's
contracted dims are equal, a Reshape's dims are its target's positive entries,
a Conv's or pool's length is onnxruntime's of its input's: :mod:`passes.simplify.dims`;
an If branch's ops, for that branch's values alone); graph inputs and outputs are never
changed (names, order, types, shapes), nor initializers that are graph inputs
(a caller may override them; ``freeze_initializer_inputs`` opts out of that),
nor an Identity that produces a graph output.

A sweep whose rules changed nothing is followed by another only if what ran after it changed the
graph in a way a rule could see. Sharing equal initializers alone does not (with no CSE merge and
no node removed after it): each node then reads, in place of a weight, an equal weight (same type,
shape and bytes; neither a graph input nor output), which the rules read by its contents, and a
weight with more users only makes a rule that asks for a sole user decline. (A pattern asking for
one value in two places, by identity, asks it of computed values; on two weights it would be all
constant, which fold computes.) That saves a whole sweep, inference included, on most second calls.

Inference runs at most once per sweep, when a rule first asks. A rewrite
replaces values by values equal to them, so what inference said of the values
already there stays true for the rest of the sweep; the values a rewrite
creates (a constant for a proved shape) are known to the next sweep's run.
(Running it again after every shape rewrite cost GPT-2's export 37 runs and
gave no node fewer.)
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable
from typing import Any

import onnx_ir as ir
import onnx_ir.passes.common as common_passes

from passes.base import Pass, pass_stats
from passes.declarations import SIMPLIFY
from passes.ir import inference, known
from passes.ir.amplification import Amplified
from passes.ir.dead import remove_unused_nodes_and_say
from passes.ir.initializer_inputs import freeze_initializer_inputs
from passes.ir.names import Names
from passes.ir.notes import add_model_notes
from passes.ir.prepack import feeds_prepacked
from passes.ir.walk import iter_scopes
from passes.phases import node_done
from passes.simplify import (  # noqa: F401  (register rules)
    algebra, chains, constants, control_flow, cse, declared, fusions, noops, shapes,
)
from passes.simplify.dims import SymbolicDims, derive
from passes.simplify.fusions import accept
from passes.simplify.rules import RULES, Context, Rule

__all__ = ["SimplifyPass"]

logger = logging.getLogger(__name__)

_MAX_ROUNDS = 8

#: The order in which the rule families are tried on a node (the first rule that applies rewrites
#: it); within a family, the order its modules register them. Every rule is exact, so the order
#: decides only which of two rewrites comes first, never what the graph computes.
FAMILY_ORDER = ("algebra", "chains", "constants", "control_flow", "fusions", "noops", "shapes")


def _in_graph(lazy: Callable[[], SymbolicDims], graph: ir.Graph) -> Callable[[], SymbolicDims]:
    """The derived dims that hold where ``graph``'s nodes run (an If branch's own, else the main graph's)."""
    return lambda: lazy().in_graph(graph)


def _node_count(model: ir.Model) -> int:
    """The nodes of every graph, subgraph and function."""
    return sum(len(scope.body) for scope in iter_scopes(model))


def _ordered(rules: list[Rule]) -> list[Rule]:
    """``rules`` by :data:`FAMILY_ORDER`, keeping each family's own order."""
    rank = {family: i for i, family in enumerate(FAMILY_ORDER)}
    unknown = sorted({r.name.split("/")[0] for r in rules} - set(rank))
    if unknown:
        raise RuntimeError(f"simplify rule families without a place in FAMILY_ORDER: {unknown}")
    return sorted(rules, key=lambda r: rank[r.name.split("/")[0]])


class SimplifyPass(Pass, spec=SIMPLIFY):
    """Applies the simplification rules (see the module docstring) until nothing changes.

    ``stats`` after a call (:func:`passes.base.pass_stats`): ``applied`` (count per
    rule name), ``declined`` (per rule, how often it matched an op but its check
    said no; the reasons are logged at debug level, ``-v``; a fusion declined because its change of
    rounding would be amplified is counted as ``"<rule>: rounding amplified by <op>"``, once per
    place the last sweep finds), ``rounds``,
    ``fused`` (how many rewrites changed float rounding: the fusions) and, when
    there are any, ``fusable_at_higher_opset`` (fusion patterns only a higher
    opset would take, by ``"Op@opset"``; each call reports the change since this
    pass's previous call, so the pass loop's sum over its runs is the final count).

    Attributes:
        fuse: Apply the fusions (they change float results by rounding).
        freeze_initializer_inputs: Opt-in: take initializers that are main-graph inputs out of
            the inputs, making them constants that fold and fuse; callers can then no longer
            override them. From IR 4 the spec and onnxruntime make them defaults a caller may
            override; below IR 4 onnxruntime treats them as constants and the load already
            makes them so (:mod:`passes.ir.initializer_inputs`, one mechanism for both).
            Counted as ``constants/frozen_input``; the IR version becomes at least 4. Those that
            are now a weight onnxruntime prepacks are also ``weights_made_constant``
            (:mod:`passes.ir.prepack`: the op rounds otherwise, as after fold's).
    """

    def __init__(self, fuse: bool = True, freeze_initializer_inputs: bool = False) -> None:
        super().__init__()
        self.fuse = fuse
        self.freeze_initializer_inputs = freeze_initializer_inputs
        self.stats: dict[str, Any] = {}
        self._inferred: dict[ir.Value, Any] | None = None  # the inference of the current sweep, if it ran
        self._amplified: Amplified | None = None  # where rounding changes are amplified (this call's, lazy)
        self._arrays: dict[int, Any] = {}  # the small constants the rules read, this call's (Context.arrays)
        self._reported_later: collections.Counter[tuple[str, str]] = collections.Counter()
        #: Whether a call on the graph the last call left would change nothing (the pass loop then
        #: skips it, :mod:`passes.loop`): its last round changed nothing, and no fusion was vetted on
        #: the call's walk of the rounding amplifiers after the call changed the graph.
        self.settled = False

    def _rules(self) -> dict[str, list[Rule]]:
        by_op: dict[str, list[Rule]] = collections.defaultdict(list)
        for rule in _ordered(RULES):
            if rule.family == "fuse" and not self.fuse:
                continue
            for op_type in rule.op_types:
                by_op[op_type].append(rule)
        return by_op

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        rules = self._rules()
        applied: collections.Counter[str] = collections.Counter()
        refused: collections.Counter[str] = collections.Counter()
        prepacked = 0  # frozen weights onnxruntime now prepacks: exact, but the op rounds otherwise (ir.prepack)
        if self.freeze_initializer_inputs:
            frozen = freeze_initializer_inputs(model)
            applied["constants/frozen_input"] += len(frozen)
            prepacked = sum(feeds_prepacked(model.graph.initializers[name]) for name in frozen)
        rounds = 0
        self._inferred = None
        amplified = self._amplified = Amplified(model)  # one walk for the whole call, on the first fusion found
        self._arrays = {}
        later: collections.Counter[tuple[str, str]] = collections.Counter()
        digests: dict[int, Any] = {}  # the initializers' digests, read once per call
        cse_due = True  # whether the graph may have changed since a CSE sweep that merged nothing
        self.settled = False
        while rounds < _MAX_ROUNDS:
            rounds += 1
            later = collections.Counter()  # the patterns of the last round, which sees the final graph
            changed, nested = self._round(model, rules, applied, refused, later)
            # Both steps below look into the main graph's subgraphs only (an If's branches, a Loop's
            # body): where the round met none, neither walks every node to find none (16.7k nodes:
            # ~10 ms a walk). Neither makes a subgraph, nor does the lift between them.
            if nested:
                changed |= control_flow.resolve_known_conditions(model, applied)
            changed |= constants.lift_main_graph_constants(model, applied)
            if nested:
                changed |= constants.lift_subgraph_constants(model, applied)
            shared_only = False  # the rules settled, and since then only equal weights became one
            if not changed:  # once the rules settle: a weight shared sooner has several users, and a fusion
                # would not change it
                changed = shared_only = constants.share_equal_initializers(model, applied, digests)
            if changed or cse_due:  # after a sweep that merged nothing, only a change can bring a merge
                cse_due = cse.eliminate(model, applied)
                changed |= cse_due
                shared_only &= not cse_due
            if changed:
                nodes = _node_count(model) if shared_only else 0
                kept_changed = remove_unused_nodes_and_say(model)[1]
                cse_due |= kept_changed  # a node that stays changed: its key too
                shared_only = shared_only and not kept_changed and _node_count(model) == nodes
            if not changed or shared_only:  # a sweep of what only shared weights changed would find nothing
                if not changed and self._inferred is not None:  # of the graph as the call leaves it
                    known.keep_inferred(model, self._inferred)
                self._correct_declared_shapes(model, applied)  # the last sweep's inference holds
                # A fresh call would change nothing, unless a fusion was declined by the walk of the
                # rounding amplifiers, which is this call's (made once) and may predate its changes.
                self.settled = not (applied and amplified.walked)
                break
        self._amplified = None
        self._arrays = {}
        # What the last round found in the final graph, by the stat it is counted in: fusion patterns only
        # a higher opset would take ("fusable_at_higher_opset": {"Gelu@20": n}) and fusions declined as
        # their rounding would be amplified ("declined": {"fusions/layer_norm: rounding amplified by ...": n}).
        # The pass loop sums a pass's stats over its runs, so each run reports the change since this
        # pass's previous run: the sum is what the last run found in the final graph.
        delta = {key: later[key] - self._reported_later[key] for key in {*later, *self._reported_later}}
        self._reported_later = later
        found: dict[str, dict[str, int]] = collections.defaultdict(dict)
        for (stat, key), count in sorted(delta.items()):
            found[stat][key] = count
        refused.update(found.pop("declined", {}))
        self.stats = pass_stats(applied, refused, rounds=rounds,
                                fused=sum(n for name, n in applied.items() if name.startswith("fusions/")))
        self.stats.update((stat, counts) for stat, counts in found.items() if any(counts.values()))
        if prepacked:
            self.stats["weights_made_constant"] = prepacked
        return ir.passes.PassResult(model, modified=bool(applied))

    def _correct_declared_shapes(self, model: ir.Model, applied: collections.Counter[str]) -> None:
        """Declared shapes the graph contradicts, corrected (:mod:`.declared`), from the inference of the
        last sweep if one ran (a shape rule asked: any Reshape does), never from one of its own."""
        if self._inferred is None:
            return
        corrected, notes = declared.correct_declared_shapes(model, self._inferred)
        if corrected:
            applied["declared/shape"] += corrected
            add_model_notes(model, notes)

    def _round(self, model: ir.Model, rules: dict[str, list[Rule]], applied: collections.Counter[str],
               refused: collections.Counter[str], later: collections.Counter[str]) -> tuple[bool, bool]:  # fmt: skip
        """One sweep of the node rules over every scope; whether anything changed, and whether the main
        graph holds a subgraph (each node that holds one at the end was in the graph, or in a branch an
        inlined If held, when the sweep began: the sweep's scopes are those of the graph as it began).

        Inference and the derived dims are computed once, on first use, and hold for the whole
        sweep (see the module docstring).
        """
        inferred: dict[ir.Value, Any] | None = None
        self._inferred = None

        def lazy_inference() -> dict[ir.Value, Any]:
            nonlocal inferred
            if inferred is None:
                inferred = self._inferred = inference.infer_all(model)
            return inferred

        symbolic: SymbolicDims | None = None

        def lazy_symbolic() -> SymbolicDims:
            nonlocal symbolic
            if symbolic is None:
                main = next(iter_scopes(model, functions=False))
                symbolic = derive(model.graph, Context(main, lazy_inference, lazy_names, initializers=False,
                                                     arrays=self._arrays))
            return symbolic

        names: Names | None = None

        def lazy_names() -> Names:
            nonlocal names
            names = names or Names(model)
            return names

        changed = nested = False
        for scope in iter_scopes(model):
            nested |= scope.owner is not None and scope.function is None
            main = scope.body is model.graph and model.ir_version >= 4
            ctx = Context(scope, lazy_inference, lazy_names, initializers=main, arrays=self._arrays,
                          amplified=self._amplified,
                          symbolic=_in_graph(lazy_symbolic, scope.body) if isinstance(scope.body, ir.Graph) else None)
            if ctx.opset == 0:
                continue
            for node in list(scope.body):
                node_done()
                if node.graph is None or node.domain not in ("", "ai.onnx"):
                    continue
                for rule in rules.get(node.op_type, ()):
                    outcome = rule.apply(node, ctx)
                    if callable(outcome) and rule.family == "fuse":  # shapes as the pattern's, rounding not amplified
                        assert self._amplified is not None
                        outcome = accept.vet(rule.name, node, outcome, ctx, self._amplified)
                    if callable(outcome):
                        outcome()
                        applied[rule.name] += 1
                        changed = True
                        break
                    stat = getattr(outcome, "stat", None)  # counted as the last round finds it (see call)
                    if stat:
                        later[(stat, outcome.key)] += 1  # type: ignore[union-attr]
                    if stat != "declined":
                        refused[rule.name] += 1
                    logger.debug("%s does not apply to %s node %r: %s", rule.name, node.op_type, node.name, outcome)
        return changed, nested
