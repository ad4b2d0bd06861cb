"""What every fusion shows before it is written: the fused op's output has the shape the pattern's
has, and its change of rounding is not amplified downstream.

A fusion rule returns a :class:`Fusion`: its rewrite, the value whose shape the fused op's output
has (``x`` for LayerNormalization, Gelu, RMSNormalization and RotaryEmbedding; the Conv's or the
MatMul's output for the fusions into weights), and the values the fused op reads (where the
pattern's walk stops). The driver asks :func:`vet` before running the rewrite, for every fusion rule
alike:

* **shapes.** The pattern's output is the broadcast of what its ops read: every value its
  elementwise ops (and the keepdims reductions, unary ops, Slices and Concats of the patterns) read
  from outside the pattern, found by a walk back from the pattern's last node through the nodes
  only the pattern uses, must broadcast into the fused op's output without changing it: a rank no
  higher, and each dim (aligned on the right) 1 or the output's (an equal int or an equal symbol).
  ``x * 0.5 * (1 + Erf(x / sqrt(2)))`` with a ``[1, 1]`` constant 0.5 on a rank-1 ``x`` has a
  ``[1, 8]`` output where Gelu's is ``[8]``: declined. Where the output's rank is not known (a
  function body) only one-element scalars of rank 0 are proved not to broadcast it.
* **amplification.** The pattern's output must not reach an op that turns a rounding-sized
  difference into a large one (:class:`passes.ir.amplification.Amplified`): declined with the reason
  :class:`AmplifiedRounding`, counted under ``declined`` as ``"<rule>: rounding amplified by <op>"``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import onnx_ir as ir

from passes.ir.amplification import Amplified
from passes.simplify.rules import Context, Dim, Outcome, Rewrite

__all__ = ["AmplifiedRounding", "Fusion", "vet"]

#: The ops of the patterns, and which of their inputs the output's shape is the broadcast of (None: all).
#: ReduceMean keeps the rank (``keepdims=1``, checked by the rules); Slice and Concat cut and join
#: ``x``'s last axis back to its width (the rotary rule checks the halves).
_SHAPE_INPUTS: dict[str, int | None] = {
    "Add": None, "Sub": None, "Mul": None, "Div": None, "Pow": None,
    "Sqrt": 1, "Reciprocal": 1, "Erf": 1, "Tanh": 1, "Neg": 1, "Cast": 1,
    "ReduceMean": 1, "Slice": 1, "Concat": None, "BatchNormalization": 1,
}  # fmt: skip


@dataclasses.dataclass
class Fusion:
    """A fusion's rewrite, and what :func:`vet` checks it against.

    Attributes:
        rewrite: Changes the graph (run by the driver once vetted).
        result: A value of the shape of the fused op's output (not part of the pattern).
        reads: The values the fused op reads from the graph: the pattern's walk stops there.
        dims: The dims of ``result`` where the rule knows more than inference (a Conv's rank and
            channels read from its weight, in a function body); None: ``ctx.dims(result)``.
    """

    rewrite: Rewrite
    result: ir.Value
    reads: Sequence[ir.Value | None] = ()
    dims: tuple[Dim, ...] | None = None

    def __call__(self) -> None:
        self.rewrite()


class AmplifiedRounding(str):
    """A fusion declined because its output reaches an op that amplifies rounding differences; the
    simplify pass counts these under ``declined`` as ``key``."""

    key: str
    stat = "declined"

    def __new__(cls, rule: str, amplifier: str) -> AmplifiedRounding:
        reason = super().__new__(cls, f"its output reaches {amplifier}, which would amplify the fused op's "
                                      "change of rounding (docs/exactness.md)")  # fmt: skip
        reason.key = f"{rule}: rounding amplified by {amplifier}"
        return reason


def vet(rule: str, node: ir.Node, outcome: Callable[[], None], ctx: Context, amplified: Amplified) -> Outcome:
    """``outcome`` (a fusion rule's rewrite of ``node``) if its shapes agree and its rounding change is
    not amplified, else why not."""
    if not isinstance(outcome, Fusion):
        return "the rule does not say what its fused op's output is (a Fusion), so its shapes cannot be checked"
    why = shape_refusal(node, outcome, ctx)
    if why is not None:
        return why
    amplifier = amplified.reason(node.outputs[0])
    if amplifier is not None:
        return AmplifiedRounding(rule, amplifier)
    return outcome


def shape_refusal(node: ir.Node, fusion: Fusion, ctx: Context) -> str | None:
    """Why the fused op's output may not have the shape of the pattern's output ``node.outputs[0]``, or None."""
    result = fusion.dims if fusion.dims is not None else ctx.dims(fusion.result)
    for operand in _operands(node, fusion):
        dims = ctx.dims(operand)
        label = f"{operand.name or 'an operand'}"
        if dims is None:
            return f"the shape of {label} is not known: the pattern may broadcast it to another shape than the fused op's"
        if result is None:
            if dims:
                return (f"the rank of the fused op's output is not known, and {label} of shape {list(dims)} may "
                        "raise the pattern's")  # fmt: skip
            continue
        if len(dims) > len(result):
            return (f"{label} of shape {_shown(dims)} broadcasts the pattern's output to rank {len(dims)}; "
                    f"the fused op's is {_shown(result)}")  # fmt: skip
        for mine, theirs in zip(reversed(dims), reversed(result)):
            if mine != 1 and (mine is None or mine != theirs):
                return (f"{label} of shape {_shown(dims)} may broadcast the pattern's output beyond the fused "
                        f"op's {_shown(result)}")  # fmt: skip
    return None


def _operands(node: ir.Node, fusion: Fusion) -> list[ir.Value]:
    """What the pattern ending at ``node`` reads from outside it: a walk back through the nodes of
    :data:`_SHAPE_INPUTS` whose outputs only the pattern uses, stopping at the fused op's reads (which
    are operands too) and at its result's value (which is not)."""
    inside: set[ir.Node] = {node}
    operands: list[ir.Value] = []
    pending = _shape_inputs(node)
    deferred: list[ir.Value] = []
    while pending or deferred:
        if not pending:  # what waited on a user not yet inside: inside now, or read from outside
            waiting, deferred = deferred, []
            pending = [v for v in waiting if all(use.node in inside for use in v.uses())]
            if not pending:
                operands.extend(waiting)
                break
            deferred = [v for v in waiting if v not in pending]
        value = pending.pop()
        producer = value.producer()
        if value is fusion.result or (producer is not None and producer in inside):
            continue
        if (producer is None or any(value is v for v in fusion.reads) or producer.graph is not node.graph
                or producer.op_type not in _SHAPE_INPUTS or producer.domain not in ("", "ai.onnx")
                or value.is_graph_output()):  # fmt: skip
            operands.append(value)
        elif all(use.node in inside for use in value.uses()):
            inside.add(producer)
            pending.extend(_shape_inputs(producer))
        else:
            deferred.append(value)
    unique: dict[ir.Value, None] = dict.fromkeys(v for v in operands if v is not fusion.result)
    return list(unique)


def _shape_inputs(node: ir.Node) -> list[ir.Value]:
    """The inputs of a pattern's node its output's shape is the broadcast of (none for other ops)."""
    if node.op_type not in _SHAPE_INPUTS or node.domain not in ("", "ai.onnx"):
        return []
    count = _SHAPE_INPUTS[node.op_type]
    inputs = list(node.inputs) if count is None else list(node.inputs[:count])
    return [v for v in inputs if v is not None]


def _shown(dims: Sequence[Dim]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"
