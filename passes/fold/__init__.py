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
  so that tied weights are not duplicated, or when ``c`` is an initializer read
  from a subgraph or function; otherwise Identity folds like any op.
* ``If(c, then, else) -> the branch c selects``, inlined into the enclosing graph.

Never folded: initializers that are graph inputs, ops whose schema is not
deterministic (RandomNormal, Bernoulli, Dropout...), (Dynamic)QuantizeLinear
and DequantizeLinear, control flow other than a constant If, ops without a
kernel (counted in ``stats["unsupported"]``), and results larger than
``size_limit`` bytes that would make the model grow (``skipped_too_large``).
Nodes and initializers left unused by these rewrites are removed.

Bounded cost. Folding a hostile model must neither exhaust memory nor run for
minutes, while real models fold as before:

* Size. Every node's outputs are sized before it is evaluated (``size``: own
  rules for the blow-up, elementwise and rearranging ops, onnx's shape
  inference of the one node for the rest, an upper bound for NonZero and
  Compress). A node whose output size cannot be bounded is not evaluated
  (``declined["output size unknown"]``). A result above ``size_limit`` is kept
  only as a main-graph initializer that frees at least as many bytes of
  inputs (a weight transform: Transpose, Mul, Cast of a weight used once),
  so it is refused before evaluation when its size is known, and no
  evaluation produces more than ``policy.EVALUATION_BYTES`` (64 MiB) beyond
  what would be kept. In subgraphs and functions, where a result is an inline
  Constant node, nothing above ``size_limit`` is created, so weights read
  there stay initializers of the main graph and stay external.
* Compute. MatMul, Gemm, Einsum and Conv get a multiply-add budget of about
  a second each (``cost``): 2^33 for MatMul/Gemm on floats (BLAS), 2^27 on
  integers (numpy's own loop), 2^30 for Einsum (numpy without ``optimize``)
  and Conv (``declined["over compute budget"]``). Transposing a transformer's
  weights costs no multiply-adds; a float MatMul of two 2048x2048 constants
  is within budget.
* Rewrites are linear in the inputs and outputs they touch (``surgery``): a
  Split into 20,000 parts feeding one Concat folds in about a second.
* External data is read with checked reads, not memory maps: a data file
  truncated while the pass runs is an ``InputError``, not a SIGBUS.

Confirmed by onnxruntime. Every value folded by a non-exempt op (see
``pending.EXEMPT``: ops that only move bytes) is computed again by
onnxruntime from the original's constants, in one session per sweep, before
it is written; one that onnxruntime computes differently, or cannot compute,
is not folded: the node stays (``stats["disagrees_with_onnxruntime"]`` and
``stats["unconfirmed"]``, by op; ``stats["confirmed"]`` counts the folds
onnxruntime agreed with). Where onnxruntime has no kernel for the node
itself (a bfloat16 Add), the spec is the only reference: refimpl's value is
kept and counted by op in ``stats["by_spec"]``. Where the two agree within a few ULPs but not bit
for bit (a sum in another order, another exp), onnxruntime's bits are written
(``stats["onnxruntime_rounding"]``): the folded model computes what the
original computes in onnxruntime. Where refimpl's value cannot be
onnxruntime's (the sign of a zero the runtime's order chooses, or a kernel
that approximates beyond those ULPs with bits that do not depend on how the
tensor is cut: float32 Sigmoid, Tanh, Gelu...), onnxruntime computes the node
alone from the kept constants and its value is written
(``stats["runtime_decided"]``; ``decide``, ``kernels``). See ``confirm`` for
the comparison and the policy.

The pieces: ``sweep`` (the run: the topological sweep over every scope, its
stats), ``rules`` (Constant, Shape, Size, Identity, If), ``policy`` (the
guards a node with constant inputs must pass, each giving a reason that is
logged and counted in ``stats["declined"]``), ``size`` and ``cost`` (the
estimates), ``evaluate`` (inputs, kernel, result checks), ``surgery`` (graph
changes and garbage collection), ``confirm`` (onnxruntime's verdict), ``extract``
(the model onnxruntime computes a batch of folds with), ``carry`` (onnxruntime's
adopted bits carried through the byte-moving folds that read them).

Why Constant nodes rather than initializers in subgraphs: a function cannot
hold initializers at all, and a subgraph initializer is legal but handled
unevenly by consumers (IR < 4 requires every initializer to be a graph input,
which for a subgraph would change its signature; some runtimes and converters
reject or mishandle initializers of If/Loop bodies). A Constant node stays in
the body's node order next to its users, so one representation serves both.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

import onnx_ir as ir

from passes.base import Pass
from passes.declarations import DEFAULT_FOLD_SIZE_LIMIT, FOLD
from passes.fold import confirm as _confirm
from passes.fold.rules import RULES
from passes.fold.sweep import FoldStats, Sweep

__all__ = ["DEFAULT_SIZE_LIMIT", "ConstantFoldingPass"]

DEFAULT_SIZE_LIMIT = DEFAULT_FOLD_SIZE_LIMIT

logger = logging.getLogger(__name__)


class ConstantFoldingPass(Pass, spec=FOLD):
    """Folds constant subexpressions, static shapes and constant-condition Ifs.

    See the module docstring for the rewrite rules. ``stats`` describes the
    last run (:func:`passes.base.pass_stats`): ``applied`` (nodes folded, by op
    type), ``declined`` (the nodes with constant inputs left alone, by reason:
    see ``passes.fold.policy``), then ``folded`` (their total), ``if_inlined``,
    ``skipped_too_large``, ``removed_nodes``, ``removed_initializers``, and
    ``unsupported`` / ``failed`` counts by op type (a kernel that rejects its
    inputs counts as failed and the node stays);
    ``confirmed``, and by op ``disagrees_with_onnxruntime`` (of which ``cut_dependent``),
    ``unconfirmed``, ``by_spec`` (see ``passes.fold.confirm``) and ``runtime_decided``
    (see ``passes.fold.decide``).

    Attributes:
        size_limit: A folded result larger than this many bytes is kept only
            as a main-graph initializer, and only if the constants it replaces
            are at least as large (the model does not grow). The evaluation
            and compute bounds are described in the module docstring.
        confirm: Confirm each folded value with onnxruntime before writing it
            (ops that only move bytes excepted); False folds what refimpl computes.
    """

    def __init__(self, size_limit: int = DEFAULT_SIZE_LIMIT, confirm: bool = True) -> None:
        super().__init__()
        if size_limit < 0:
            raise ValueError(f"size_limit must be >= 0, got {size_limit}")
        self.size_limit = size_limit
        self.confirm = confirm
        self.stats: dict[str, Any] = FoldStats().as_dict()
        # Folds onnxruntime did not confirm, by node and inputs: not evaluated again in later runs
        # (the fixpoint loop runs the pass several times on the same model).
        self._unconfirmed: dict[tuple[ir.Node, tuple[ir.Value | None, ...]], str] = {}
        # onnxruntime's process for the confirmation, kept across the fixpoint loop's runs
        self._runner = _confirm.Runner()
        weakref.finalize(self, self._runner.close)

    def close(self) -> None:
        """Ends onnxruntime's child process if the pass started its own (a borrowed one is the check's)."""
        self._runner.close()

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        sweep = Sweep(model, self.size_limit, self.confirm, self._unconfirmed, self._runner, rules=RULES)
        sweep.run()
        self.stats = sweep.stats.as_dict()
        stats = sweep.stats
        modified = bool(
            stats.folded or stats.if_inlined or stats.removed_nodes or stats.removed_initializers
        )
        logger.info("constant folding: %s", {k: v for k, v in self.stats.items() if v} or "nothing folded")
        return ir.passes.PassResult(model, modified=modified)
