"""Confirming folded values with onnxruntime before they are written.

Every value ``fold`` computes depends on no graph input, so onnxruntime can
compute it from the original's constants. A sweep records each fold
(:class:`~passes.fold.pending.Fold`); :func:`settle` then extracts the constant subgraph of the
pending folds as one model whose outputs are the folded values the model will
keep (initializers and Constant tensors as initializers, the folded nodes in
sweep order, the opsets of their scope), runs it once in onnxruntime
(``ORT_DISABLE_ALL``, so that onnxruntime's own folding hides nothing), and
judges each fold:

* **agrees**: every output has the dtype and shape refimpl gave and equal
  values (:func:`passes.fold.agree.agrees`): integers, booleans and strings bit for bit; floats
  with NaN, infinities and zeros (with their sign) in the same places, and
  other values within a few units in the last place of the dtype (of the
  array's largest magnitude after a sum);
* **disagrees**: onnxruntime computed something else: the fold is undone (the
  node stays) and counted by op in ``disagrees_with_onnxruntime``;
* **unconfirmed**: onnxruntime could not compute it (a session error, a
  crash, the time limit): the fold is undone too and counted by op in
  ``unconfirmed``. Exit 0 means "proved in onnxruntime": a value nothing
  confirmed is not written;
* **by the spec** (:attr:`Batch.by_spec`): onnxruntime has no kernel for the
  node itself (its session says "Could not find an implementation" for that
  node: a bfloat16 Add), and the op is one whose every result the spec
  fixes (:data:`SPEC_FIXED`: one correctly rounded operation per element, a
  comparison, a Cast), so the spec is the only reference and refimpl computes
  what it defines (bfloat16 arithmetic in float32, rounded once to nearest
  even, which for these operations is the correctly rounded result): the fold
  is kept and counted by op in ``by_spec``. A transcendental function, a sum
  of more than two terms or a product of a bfloat16 by a float32 attribute
  rounds as the implementation chooses: it stays unconfirmed. Its
  inputs are still confirmed like any written value (read as initializers,
  as an exempt fold's are), and a fold that reads it reads its value as an
  initializer. onnxruntime cannot load the original either (it resolves every
  node's kernel, in subgraphs too, when it builds the session), so the check
  does not run on it; nothing onnxruntime computes is changed.

Which values flow where. Exempt ops (:data:`passes.fold.pending.EXEMPT`) only move bytes (or read
a static shape): they are not sent to onnxruntime, and their results are
trusted as long as their inputs are, unless they read a value of the batch
that onnxruntime computes and a computing fold of the batch reads their result:
then they are computed like the others, so the ops after them see
onnxruntime's bytes, as in the original (:meth:`Batch._find_exempt_chains`).
In the extracted model, the result of a computed fold of the same
batch is computed by its node (onnxruntime
follows the original's chain of computation); anything else (an
initializer, a Constant, the result of an exempt or earlier confirmed fold)
is an initializer holding the tensor the fold read. A fold is kept only if it
agrees and every value it read as such an initializer is kept; an exempt fold
only if all its inputs are kept. Only the values that stay in the model are
compared (and what they read as initializers): the intermediate values of a
folded chain are computed, not compared, and then dropped. When a fold is
undone, the folds its restored node reads become values that stay: a second
session compares them and everything they are computed from. onnxruntime
runs a chain of float16 ops without float16 kernels in float32, rounding only
at its end, so a computed node keeps the 16-bit folds it reads computed too.

Cost: one onnxruntime session per batch (a sweep's folds, in one model per
set of opset imports; the constant condition of an If is settled on its own
before the branch is inlined), a second one only after a disagreement. A
batch onnxruntime cannot load or run is split in halves to find the folds at
fault (at most :data:`MAX_SESSIONS` sessions, then the rest is unconfirmed).
Constants in files (external data, weights left in the model file) and large
ones in memory are read by the child from a file, and results come back in
one file read in chunks: the parent never holds a second copy of a weight.

Where onnxruntime runs: in a child process (``passes.verify.worker``), so
that a crash (a signal in a kernel), the memory bound or a hang on an odd
subgraph ends that process and makes its folds unconfirmed, never the
command. It is the check's own child when the route started one (the
command and ``optimize()`` start it before the passes: its imports are done
by the time a sweep settles), else one of the pass's own (:class:`Runner`),
started on first use and ended when the pass object goes away.
"""

from __future__ import annotations

import collections
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

from passes.fold import extract, kernels
from passes.fold.agree import ACCUMULATING, agrees_in_chunks, differing_bits, file_chunks, is_float
from passes.fold.pending import Fold
from passes.fold.runner import TIMEOUT, Runner, close_idle  # noqa: F401  (the child's side, named here too)

__all__ = ["MAX_SESSIONS", "SPEC_FIXED", "TIMEOUT", "ZERO_TIES", "Batch", "Runner", "settle"]

logger = logging.getLogger(__name__)

#: Default-domain ops whose every result the spec fixes bit for bit, kept by the spec where onnxruntime
#: has no kernel: at most one correctly rounded IEEE operation per element (in float32, which holds
#: bfloat16's and float8's results exactly before their one rounding), comparisons, logic and Cast.
#: Max, Min, Clip and Relu on integers only (:data:`ZERO_TIES`).
SPEC_FIXED: frozenset[str] = frozenset({
    "Add", "Sub", "Mul", "Div", "Sqrt", "Reciprocal", "Neg", "Abs", "Floor", "Ceil", "Round", "Sign",
    "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or", "Xor", "Not", "IsNaN", "IsInf",
    "Where", "Cast", "CastLike", "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot",
})  # fmt: skip
#: Ops the spec fixes on integers, not on floats: the zero they give on a tie of +0 and -0 is
#: onnxruntime's choice (``max(-0, 0)``), which a bfloat16 model has no kernel to make.
ZERO_TIES: frozenset[str] = frozenset({"Max", "Min", "Clip", "Relu"})

#: Sessions one batch may use while looking for the folds onnxruntime cannot compute.
MAX_SESSIONS = 16
#: After a batch whose model held more bytes than this, the child is ended (it gives memory back).
RELEASE_OVER = 64 << 20

AGREES, DISAGREES, UNCONFIRMED = "agrees", "disagrees", "unconfirmed"


# --- the batch -----------------------------------------------------------------------------------


class Batch:
    """The pending folds of a sweep, settled together.

    Args:
        model: The model (for its IR version).
        folds: The folds in sweep order.
        origin: The fold that made each constant value (across batches).
        runner: Where the sessions run.
    """

    def __init__(self, model: ir.Model, folds: Sequence[Fold], origin: Mapping[ir.Value, Fold],
                 runner: Runner) -> None:  # fmt: skip
        self.model = model
        self.runner = runner
        self.folds = list(folds)
        self.members = set(self.folds)
        self.origin = origin
        self.results: dict[Fold, str] = {}
        self.reasons: dict[Fold, str] = {}
        self.sessions = 0
        self.judged: set[Fold] = set()
        self.final: dict[Fold, str] = {}
        self.accumulated: dict[Fold, bool] = {}
        #: onnxruntime's result where it agrees with refimpl's within ULPs but not bit for bit:
        #: written instead of refimpl's, so the folded model computes what the original does.
        self.adopted: dict[tuple[Fold, int], np.ndarray] = {}
        #: Folds whose node onnxruntime has no kernel for: kept by the spec (see the module docstring).
        self.by_spec: set[Fold] = set()
        #: Folds onnxruntime disagrees with whose kernel's bits depend on the cut (``kernels.CUT_DEPENDENT``).
        self.cut_dependent: set[Fold] = set()
        #: Exempt folds computed in the extracted model all the same (see :meth:`_find_exempt_chains`).
        self.computed_exempt: set[Fold] = set()
        self._find_exempt_chains()
        for fold in self.folds:  # sweep order: a fold's chained inputs come first
            self.accumulated[fold] = (fold.domain == "" and fold.op_type in ACCUMULATING) or any(
                self.accumulated.get(f, False) for f in self._chained_inputs(fold)
            )

    def _chained(self, value: ir.Value | None) -> Fold | None:
        """The fold of this batch that computes ``value`` in the extracted model, if any."""
        fold = None if value is None else self.origin.get(value)
        computed = fold is not None and fold in self.members and fold not in self.by_spec and (
            not fold.exempt or fold in self.computed_exempt)
        return fold if computed else None

    def _find_exempt_chains(self) -> None:
        """The exempt folds that read a value the extracted model computes (and only constants) and
        are read by a computing fold of the batch, directly or through other exempt folds.

        They are computed there too, by their node: fed refimpl's bytes as an initializer, the
        ops after them would be confirmed against refimpl's chain, not the one the original
        computes (a rotary Cos, its Unsqueeze, then a Mul: onnxruntime's Cos differs by an ULP).
        One whose result is only written is not (a 64 MiB weight's Transpose would be computed
        and compared twice): the sweep carries the bits adopted for what it reads (``carry``).
        """
        read: set[Fold] = set()  # exempt folds a computing fold of the batch reads, through others too
        for fold in reversed(self.folds):
            if not fold.exempt or fold in read:
                read.update(o for o in map(self.origin.get, fold.inputs) if o in self.members and o.exempt)
        self.computed_exempt = set()
        for fold in self.folds:  # sweep order: what a fold reads comes first
            if fold in read and all(t is not None for v, t in zip(fold.inputs, fold.tensors) if v is not None) \
                    and any(self._chained(v) is not None for v in fold.inputs):  # fmt: skip
                self.computed_exempt.add(fold)

    def _exempt(self, fold: Fold) -> bool:
        """Whether ``fold`` is exempt and not computed in the extracted model."""
        return fold.exempt and fold not in self.computed_exempt

    def _chained_inputs(self, fold: Fold) -> list[Fold]:
        return [f for f in (self._chained(v) for v in fold.inputs) if f is not None]

    def _fed(self, fold: Fold) -> list[Fold]:
        """The folds whose results ``fold`` trusts: read as initializers (an exempt fold or one by
        the spec: all of them, including the input whose static shape a Shape or Size fold read)."""
        fed = []
        for value in fold.inputs:
            origin = None if value is None else self.origin.get(value)
            if origin is not None and (self._exempt(fold) or fold in self.by_spec or self._chained(value) is None):
                fed.append(origin)
        return fed

    def _closure(self, seeds: Iterable[Fold], chained: bool) -> set[Fold]:
        """``seeds`` with the batch's folds they read as initializers, and (``chained``) those
        they are computed from in the extracted model, recursively."""
        found: set[Fold] = set()
        stack = [f for f in seeds if f in self.members]
        while stack:
            fold = stack.pop()
            if fold in found:
                continue
            found.add(fold)
            stack.extend(f for f in self._fed(fold) if f in self.members and f not in found)
            if chained:
                stack.extend(f for f in self._chained_inputs(fold) if f not in found)
        return found

    def verdicts(self) -> dict[Fold, str]:
        """Runs onnxruntime on the folds whose results are written and judges the batch's folds.

        The values compared are those the model keeps (a result still read by a
        node or a graph output), and those they read as initializers; an
        intermediate value of a chain is computed in the extracted model, not
        compared, and left to garbage collection. If a fold is undone, the
        folds its node reads are written after all: a second session compares
        them and everything they are computed from.

        Returns:
            ``AGREES`` (kept), ``DISAGREES`` or ``UNCONFIRMED`` (undone) by fold; an exempt
            fold is AGREES when all its inputs are kept, else it takes their verdict; a fold
            not compared (``judged``) is AGREES: its result is not written.
        """
        written = [f for f in self.folds if any(_written(v) for v in f.made if v is not None)]
        todo = self._closure(written, chained=False)
        while todo:  # a fold found to be by the spec reads its inputs as initializers: they are compared
            self.judged |= todo
            self._compute_all(todo)
            todo = self._closure(self.by_spec, chained=False) - self.judged
        verdicts = self._propagate()
        undone = [f for f in self.judged if verdicts[f] != AGREES]
        reread = {f for u in undone for f in self._chained_inputs(u)} - self.judged
        if reread:
            more = self._closure(reread, chained=True) - self.judged
            self.judged |= more
            self._compute_all(more)
            verdicts = self._propagate()
        self.final = verdicts
        return verdicts

    def _compute_all(self, folds: set[Fold]) -> None:
        """One session per set of opset imports over the non-exempt ``folds``."""
        groups: dict[tuple[tuple[str, int], ...], list[Fold]] = collections.defaultdict(list)
        for fold in self.folds:
            if fold in folds and not self._exempt(fold) and fold not in self.by_spec:
                groups[tuple(sorted(fold.opsets.items()))].append(fold)
        for group in groups.values():
            self._compute(group)

    def _propagate(self) -> dict[Fold, str]:
        self._keep_16_bit_chains()
        verdicts: dict[Fold, str] = {}
        for fold in self.folds:
            if self._exempt(fold) or fold not in self.judged:
                verdict = AGREES
            else:
                verdict = self.results.get(fold, UNCONFIRMED)
            if verdict == AGREES:
                for before in self._fed(fold):
                    inherited = verdicts.get(before, AGREES)  # an earlier batch's fold was kept
                    if inherited != AGREES:
                        verdict = inherited
                        self.reasons[fold] = f"reads the result of {before.op_type} node {before.node.name!r}"
                        break
            verdicts[fold] = verdict
        return verdicts

    def _keep_16_bit_chains(self) -> None:
        """A computed node keeps the float16/bfloat16 nodes it is computed from computed too.

        onnxruntime runs an op that has no kernel for a 16-bit float in float32
        between inserted Casts, and drops the Casts between two such ops, so a
        chain of them is rounded only at its end: a folded (rounded) value read by
        a node that stays computed would change that node's result.
        """
        for fold in reversed(self.folds):
            if fold.exempt or fold not in self.judged or self.results.get(fold, UNCONFIRMED) == AGREES:
                continue
            for before in self._chained_inputs(fold):
                if self.results.get(before) == AGREES and any(
                    a is not None and a.dtype.name in ("float16", "bfloat16") for a in before.arrays
                ):
                    self.results[before] = UNCONFIRMED
                    self.reasons[before] = f"16-bit float chain into {fold.op_type} node {fold.node.name!r}"

    # --- running onnxruntime --------------------------------------------------------------------

    def _compute(self, targets: list[Fold]) -> None:
        """Sets ``results`` for ``targets``, halving the set while onnxruntime fails on it."""
        from passes.verify.child import WorkerError, WorkerTimeout

        targets = [t for t in targets if t not in self.by_spec]
        if not targets:
            return
        if self.sessions >= MAX_SESSIONS:
            self._unconfirmed(targets, "too many sessions failed")
            return
        self.sessions += 1
        folder = tempfile.mkdtemp(prefix="fold-confirm-")
        try:
            try:
                request, names, nodes, nbytes = self._write(targets, folder)
            except Exception as e:  # noqa: BLE001  onnx_ir's serialisation raises several kinds
                logger.warning("cannot write the folded constants' model: %s", e)
                self._split_or_fail(targets, f"not serialisable: {e}")
                return
            try:
                answer = self.runner.request(request, release=nbytes > RELEASE_OVER)
            except WorkerTimeout as e:
                self._unconfirmed(targets, f"onnxruntime timed out ({e.phase})")
                return
            except (WorkerError, OSError) as e:
                self._split_or_fail(targets, f"onnxruntime failed: {e}")
                return
            if not answer.get("ok"):
                error = str(answer.get("error", "onnxruntime failed"))
                if self._no_kernel(error, nodes):
                    self._compute(targets)  # again, with the folds by the spec read as initializers
                else:
                    self._split_or_fail(targets, error)
                return
            self._judge(names, answer["values"])
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def _no_kernel(self, error: str, nodes: Mapping[str, Fold]) -> bool:
        """Whether ``error`` says onnxruntime has no kernel for a node of the extracted model (named
        as in ``nodes``); that fold, and the batch's folds of its op, domain, opset and element
        types (the same kernel lookup), are then by the spec. A node onnxruntime expands into its
        schema's function (an int16 Relu is a Max) names an inner node: it is the fold at fault
        when it is the model's only node."""
        found = _NO_KERNEL.search(error)
        only = next(iter(nodes.values())) if len(nodes) == 1 else None
        fold = None if found is None else nodes.get(found["name"], only)
        if fold is None or fold in self.by_spec or not _spec_fixed(fold):
            return False
        signature = _signature(fold)
        for other in self.folds:
            if not other.exempt and _signature(other) == signature:
                self.by_spec.add(other)
                self.results[other] = AGREES
                self.reasons[other] = f"onnxruntime has no kernel ({found[0]}): kept by the spec"
        self._find_exempt_chains()  # what reads them reads initializers now
        return True

    def _split_or_fail(self, targets: list[Fold], reason: str) -> None:
        if len(targets) == 1:
            self._unconfirmed(targets, reason)
            return
        half = len(targets) // 2
        self._compute(targets[:half])
        self._compute(targets[half:])

    def _unconfirmed(self, targets: Iterable[Fold], reason: str) -> None:
        for fold in targets:
            self.results[fold] = UNCONFIRMED
            self.reasons[fold] = reason

    def _judge(self, names: Mapping[str, tuple[Fold, int]], values: Mapping[str, Any]) -> None:
        for name, (fold, index) in names.items():
            if self.results.get(fold, AGREES) != AGREES:
                continue
            found = values.get(name, {"error": "no output"})
            if "error" in found:
                self._unconfirmed([fold], found["error"])
                continue
            expected = fold.arrays[index]
            assert expected is not None
            dtype, shape, chunks = file_chunks(found)
            if agrees_in_chunks(np.asarray(expected), dtype, shape, chunks, self.accumulated[fold]):
                self.results[fold] = AGREES
                if is_float(dtype):
                    theirs = differing_bits(np.asarray(expected), found)
                    if theirs is not None:
                        self.adopted[fold, index] = theirs
            else:
                self.results[fold] = DISAGREES
                cut = kernels.cut_dependent(fold.domain, fold.op_type, dtype.name)
                self.reasons[fold] = f"output {index}: onnxruntime computes another value" + (
                    f" ({cut}: not taken)" if cut else "")  # fmt: skip
                if cut:
                    self.cut_dependent.add(fold)

    def _write(self, targets: list[Fold], folder: str) -> extract.Written:
        """Saves the model computing ``targets`` (with the folds of the batch they are computed from) in
        ``folder`` (see :func:`passes.fold.extract.write`, which says what it returns)."""
        wanted: dict[Fold, None] = {}
        stack = list(reversed(targets))
        while stack:  # the batch's non-exempt folds the targets are computed from
            fold = stack.pop()
            if fold not in wanted:
                wanted[fold] = None
                stack.extend(f for f in self._chained_inputs(fold) if f not in wanted)
        return extract.write([f for f in self.folds if f in wanted], targets, self._chained,
                             max(self.model.ir_version, 4), folder)  # fmt: skip


#: onnxruntime's session error for a node without a kernel for its op, version and element types.
_NO_KERNEL = re.compile(r"Could not find an implementation for [\w.]+\(\d+\) node with name '(?P<name>[^']*)'")


def _spec_fixed(fold: Fold) -> bool:
    """Whether the spec fixes every bit of ``fold``'s results (see :data:`SPEC_FIXED`)."""
    if fold.domain != "":
        return False
    if fold.op_type in ZERO_TIES:
        return all(a is None or a.dtype.kind in "iub" for a in fold.arrays)
    return fold.op_type in SPEC_FIXED


def _signature(fold: Fold) -> tuple[Any, ...]:
    """What onnxruntime looks a kernel up by: the op, its domain's opset and the element types."""
    types = tuple(None if t is None else t.dtype for t in fold.tensors)
    return (fold.domain, fold.op_type, fold.opsets.get(fold.domain), types,
            tuple(None if a is None else a.dtype for a in fold.arrays))  # fmt: skip


def _written(value: ir.Value) -> bool:
    """Whether a folded value stays in the model: still read, or a graph output."""
    return bool(value.uses()) or value.is_graph_output()


def settle(model: ir.Model, folds: Sequence[Fold], origin: Mapping[ir.Value, Fold], runner: Runner) -> Batch:
    """Judges the folds (see :meth:`Batch.verdicts`); the batch holds the verdicts, the folds compared
    (``judged``) and the reasons for those undone."""
    batch = Batch(model, folds, origin, runner)
    batch.verdicts()
    return batch
