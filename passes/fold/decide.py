"""Folding a value refimpl leaves to the runtime: onnxruntime computes it (:func:`decide`).

Two kinds of value are onnxruntime's. The value of a node whose onnxruntime kernel approximates
beyond the confirmation's bound, with bits that do not depend on how the tensor is cut
(:mod:`passes.fold.kernels`: float32 Sigmoid, Tanh, Gelu...): refimpl's correctly rounded value
is not what the original computes there, onnxruntime's is. And some float results are defined
only up to a choice the implementation makes
(``refimpl.RuntimeChoiceError``): the sign of a zero whose terms are all -0
(``[-0, -0] @ [1, 1]`` is +0 in onnxruntime's MatMul, whose accumulator starts
at +0, and -0 in IEEE order), a sum that cancels within the rounding of another
order, terms that may overflow or underflow in the runtime's order, the zero a
Max/Min/Where gives on a tie of +0 and -0. refimpl has no value to offer there,
but the promise of the fold is to compute what the original computes in
onnxruntime, and the original computes exactly this node from exactly these
constants. So, with confirmation on, the pending folds are settled first (every
input is then the value the model keeps, onnxruntime's bits where the two
differed), the node alone is run in onnxruntime's child (``ORT_DISABLE_ALL``,
its constant inputs as initializers, as in the extracted models of
:mod:`passes.fold.confirm`), and its outputs are written: counted by op in
``stats["runtime_decided"]``. They are final (not confirmed again), and the
folds that read them read them as constants.

What stays declined, by reason in ``stats["declined"]``:

* ``onnxruntime's choice, not asked``: confirmation is off (``--no-fold-confirm``):
  there is no runtime to decide, and refimpl does not guess (an approximating kernel's node
  then folds with refimpl's correctly rounded value, unconfirmed like every other);
* ``onnxruntime's choice, not computed``: onnxruntime failed on the node (a
  session error, a crash, the time limit), an input it reads was not confirmed
  in the settle, its result does not fit the node, or the run already asked
  :data:`MAX_DECIDED` such nodes (one session each);
* the size policy (``too large``), as for any fold.

The value is the one of this machine's onnxruntime, like every value the
confirmation adopts: a build whose kernels sum in another order would give
the original another sign there.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import tempfile
from typing import TYPE_CHECKING, Any

import numpy as np

from passes.fold import evaluate, extract, policy
from passes.fold.agree import file_chunks
from passes.ir.schemas import expected_dtypes

if TYPE_CHECKING:
    from passes.fold.runner import Runner

__all__ = ["MAX_DECIDED", "NOT_ASKED", "NOT_COMPUTED", "decide", "run_node"]

logger = logging.getLogger(__name__)

#: Nodes one run of the pass asks onnxruntime to decide (each costs a settle and a session).
MAX_DECIDED = 64
#: The ``declined`` categories of :func:`decide`.
NOT_ASKED = "onnxruntime's choice, not asked"
NOT_COMPUTED = "onnxruntime's choice, not computed"


def decide(sweep: Any, candidate: policy.Candidate, scope: Any, message: str) -> None:
    """Folds ``candidate``'s node with the outputs onnxruntime computes, or refuses it with the reason.

    ``sweep`` is the fold's sweep (``passes.fold.sweep.Sweep``): its pending folds are settled first.
    """
    node = candidate.node
    if not sweep.confirm:
        sweep.refuse(node, f"{NOT_ASKED}: {message}")
        return
    if sweep.decided >= MAX_DECIDED:
        sweep.refuse(node, f"{NOT_COMPUTED}: {MAX_DECIDED} nodes already decided in this run ({message})")
        return
    sweep.settle()
    tensors = [None if v is None else sweep.constant(v) for v in node.inputs]
    if any(t is None for v, t in zip(node.inputs, tensors) if v is not None):
        sweep.refuse(node, f"{NOT_COMPUTED}: an input was not confirmed ({message})")
        return
    candidate = dataclasses.replace(candidate, tensors=tensors,
                                    dims=[None if t is None else tuple(int(d) for d in t.shape.dims) for t in tensors])  # fmt: skip
    sweep.decided += 1
    try:
        results = run_node(candidate, scope.opset_imports, sweep.model.ir_version, sweep.runner)
        expected = expected_dtypes(node.op_type, candidate.domain, candidate.opset, tensors, len(node.outputs))
        outputs = evaluate.check_results(node, results, expected)
    except (evaluate.EvaluationError, OSError) as e:
        reason = f"{NOT_COMPUTED}: {e}"
        sweep.unconfirmed[(node, tuple(node.inputs))] = reason
        sweep.refuse(node, reason)
        return
    reason = policy.result_too_large(candidate, outputs)
    if reason is not None:
        sweep.refuse(node, reason)
        return
    logger.debug("%s node %r: onnxruntime's value (%s)", node.op_type, node.name, message)
    sweep.stats.runtime_decided[node.op_type] += 1
    sweep.replace(node, outputs, scope, tensors, decided=True)


def run_node(candidate: policy.Candidate, opsets: Any, ir_version: int, runner: Runner) -> list[np.ndarray | None]:
    """The node's outputs as onnxruntime computes them from its constant inputs (None where unused).

    Raises:
        EvaluationError: onnxruntime could not compute them.
        OSError: the child could not be reached.
    """
    from passes.fold.confirm import RELEASE_OVER
    from passes.fold.pending import Fold
    from passes.verify.child import WorkerError

    node = candidate.node
    wanted = [bool(v.uses()) or v.is_graph_output() for v in node.outputs]
    fold = Fold(node=node, domain=candidate.domain, opsets=dict(opsets), inputs=tuple(node.inputs),
                tensors=list(candidate.tensors), outputs=tuple(node.outputs), made=[None] * len(node.outputs),
                arrays=[np.empty(0) if w else None for w in wanted])  # fmt: skip
    folder = tempfile.mkdtemp(prefix="fold-decide-")
    try:
        request, names, _, nbytes = extract.write([fold], [fold], lambda _: None, max(ir_version, 4), folder)
        try:
            answer = runner.request(request, release=nbytes > RELEASE_OVER)
        except WorkerError as e:
            raise evaluate.EvaluationError(f"onnxruntime failed: {e}") from e
        if not answer.get("ok"):
            raise evaluate.EvaluationError(str(answer.get("error", "onnxruntime failed")))
        results: list[np.ndarray | None] = [None] * len(node.outputs)
        for name, (_, index) in names.items():
            found = answer["values"].get(name, {"error": "no output"})
            if "error" in found:
                raise evaluate.EvaluationError(f"output {index}: {found['error']}")
            dtype, shape, chunks = file_chunks(found)
            parts = list(chunks)
            results[index] = (np.concatenate(parts) if parts else np.zeros(0, dtype)).reshape(shape)
        return results
    finally:
        shutil.rmtree(folder, ignore_errors=True)
