"""What may be folded: a list of guards, each saying why a node must not be, or nothing.

Every node whose inputs are all constant is a :class:`Candidate`. The guards
in :data:`GUARDS` run in order before anything is evaluated; the first that
returns a reason wins, and the sweep logs it (debug level) and counts it under
the reason's category, the text before the first colon, in
``stats["declined"]``. Some categories also feed the older counters
(:data:`COUNTERS`): ``unsupported`` (by op type) and ``skipped_too_large``.

The size policy: a result larger than ``size_limit`` is kept only as an
initializer of the main graph, and only if folding frees at least as many
bytes of constant inputs (the model does not grow).
Every output is sized before evaluation (``size.estimate_outputs``): an exact
size that breaks the policy is refused there, and whatever the estimate, no
evaluation may produce more than :data:`EVALUATION_BYTES` beyond what the
policy would keep. After evaluation, :func:`result_too_large` applies the
policy to the actual results, and :func:`fails_downstream` keeps a result
that a user would always reject (a Reshape target of -2) as it is computed:
as a constant it would make the model statically invalid, where the
original only fails when it runs.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

from passes.fold import cost, size
from passes.ir import checked_inputs
from passes.ir.schemas import is_deterministic
from passes.ir.tensors import is_file_backed, read_array, tensor_nbytes
from passes.lazy import lazy_module

refimpl = lazy_module("refimpl")  # imported on the first fold (a graph with nothing to fold never needs its kernels)

__all__ = [
    "COUNTERS",
    "EVALUATION_BYTES",
    "GUARDS",
    "Candidate",
    "category",
    "fails_downstream",
    "refusal",
    "result_too_large",
]

logger = logging.getLogger(__name__)

_QUANTIZE_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"})
_QUANTIZE_DOMAINS = frozenset({"", "com.microsoft"})

#: Reason categories that are also counted under an older stats key.
COUNTERS: Mapping[str, str] = {
    "no opset": "unsupported",
    "no kernel": "unsupported",
    "too large": "skipped_too_large",
}

#: Bytes an evaluation may produce beyond what the size policy keeps: outputs the
#: model does not use, and results whose size is only bounded (NonZero, strings).
EVALUATION_BYTES = 64 << 20


@dataclasses.dataclass
class Candidate:
    """A node whose inputs are all constant, with what the guards and the evaluation need.

    Attributes:
        node: The node.
        domain: Its normalised domain (``""`` for ONNX).
        opset: The version its scope imports for that domain (None if none).
        tensors: Its constant inputs (None for omitted optional inputs).
        dims: Their dims.
        attrs: Its attribute values for the kernel, or None when some cannot be given.
        initializers: Whether a result is stored as an initializer (main graph,
            IR >= 4) rather than as a Constant node.
        default_opset: The default-domain version of its scope (a Constant node needs one).
        size_limit: The pass's ``size_limit``.
        constant: The sweep's lookup of constant values.
    """

    node: ir.Node
    domain: str
    opset: int | None
    tensors: Sequence[ir.TensorProtocol | None]
    dims: Sequence[tuple[int, ...] | None]
    attrs: Mapping[str, Any] | None
    initializers: bool
    default_opset: int | None
    size_limit: int
    constant: Callable[[ir.Value], ir.TensorProtocol | None]

    _arrays: dict[int, np.ndarray] = dataclasses.field(default_factory=dict, repr=False)
    _estimate: size.Estimate | None = dataclasses.field(default=None, repr=False)
    _freed: int | None = dataclasses.field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.op_type: str = self.node.op_type

    def array(self, index: int) -> np.ndarray:
        """Input ``index`` as an array, read once (external data is read here).

        Raises:
            InputError: its data cannot be read.
        """
        array = self._arrays.get(index)
        if array is None:
            tensor = self.tensors[index]
            assert tensor is not None
            array = self._arrays[index] = read_array(self.node.inputs[index], tensor, self.node)
        return array

    def owns(self, index: int) -> bool:
        """Whether input ``index``'s array was read for this candidate alone (from a file, into a
        new array that nothing else holds), so that evaluating it may overwrite it."""
        return index in self._arrays and is_file_backed(self.tensors[index])

    def forget_arrays(self) -> None:
        """Drops the arrays read (an evaluation overwrote them); they are read again if asked for."""
        self._arrays.clear()

    @property
    def estimate(self) -> size.Estimate:
        """The outputs' sizes before evaluation (see ``size.estimate_outputs``), made once.

        Raises:
            size.Unbounded: they cannot be bounded.
        """
        if self._estimate is None:
            assert self.opset is not None and self.attrs is not None
            self._estimate = size.estimate_outputs(
                self.node, self.domain, self.opset, self.tensors, self.dims, self.attrs, self.array
            )
        return self._estimate

    def needed(self, index: int) -> bool:
        """Whether output ``index`` is used (by a node or as a graph output)."""
        value = self.node.outputs[index]
        return bool(value.uses()) or value.is_graph_output()

    @property
    def freed_bytes(self) -> int:
        """Bytes of the constant inputs that folding the node leaves unused (and removes)."""
        if self._freed is None:
            node = self.node
            total = 0
            for value in dict.fromkeys(v for v in node.inputs if v is not None):
                if value.is_graph_output() or any(use.node is not node for use in value.uses()):
                    continue
                producer = value.producer()
                if value.is_initializer() or (
                    producer is not None and producer.op_type == "Constant"
                ):
                    tensor = self.constant(value)
                    if tensor is not None:
                        total += tensor_nbytes(tensor)
            self._freed = total
        return self._freed

    def grows_model(self, nbytes: int) -> bool:
        """Whether a result of ``nbytes`` breaks the size policy.

        Above the size limit, a result is kept only as an initializer and only
        if folding frees at least as many bytes. A Constant node's tensor is
        always saved inline (only initializers are written as external data),
        so a large result in a subgraph or function would pull a weight out of
        external data into the proto, whatever it frees.
        """
        if nbytes <= self.size_limit:
            return False
        return not self.initializers or nbytes > self.freed_bytes


def category(reason: str) -> str:
    """The stats key of a reason: its text up to the first colon."""
    return reason.split(":", 1)[0]


# --- the guards, in order -----------------------------------------------------------------------


def no_opset(c: Candidate) -> str | None:
    if c.opset is None:
        return f"no opset: the scope imports no version of domain {c.domain or 'ai.onnx'!r}"
    return None


def nowhere_to_store(c: Candidate) -> str | None:
    if not c.initializers and c.default_opset is None:
        return "no constant storage: no default-domain opset for a Constant node"
    return None


def quantisation(c: Candidate) -> str | None:
    if c.op_type in _QUANTIZE_OPS and c.domain in _QUANTIZE_DOMAINS:
        return "quantisation op: kept as the model's quantisation boundary"
    return None


def nondeterministic(c: Candidate) -> str | None:
    assert c.opset is not None
    if not is_deterministic(c.op_type, c.domain, c.opset):
        return f"not deterministic: {c.op_type}"
    return None


def unusable_attributes(c: Candidate) -> str | None:
    if c.attrs is None:
        return "unusable attributes: a reference, graph, sparse tensor or type"
    if any(o.type is not None and not isinstance(o.type, ir.TensorType) for o in c.node.outputs):
        return "unusable attributes: an output that is not a tensor"
    return None


def no_kernel(c: Candidate) -> str | None:
    assert c.opset is not None
    try:
        refimpl.lookup(c.op_type, c.opset, c.domain)
    except refimpl.UnsupportedOpError as e:
        return f"no kernel: {e}"
    return None


def output_size(c: Candidate) -> str | None:
    """Refuses what the size policy would throw away, and what cannot be sized beforehand."""
    try:
        estimate = c.estimate
    except size.Unbounded as e:
        return f"output size unknown: {e}"
    if estimate.total <= c.size_limit:
        return None
    kept = sum(n for i, n in enumerate(estimate.nbytes) if c.needed(i))
    if estimate.exact and c.grows_model(kept):
        return f"too large: {kept} bytes would grow the model"
    if c.grows_model(estimate.total) and estimate.total > EVALUATION_BYTES:
        return f"too large: evaluating it makes up to {estimate.total} bytes"
    return None


def compute_cost(c: Candidate) -> str | None:
    """Refuses a contraction (MatMul, Gemm, Einsum, Conv) over its multiply-add budget."""
    if c.op_type not in cost.BUDGETS or c.domain != "":
        return None
    assert c.attrs is not None
    shapes = c.estimate.shapes  # sized by output_size, which runs first
    estimated = cost.cost(c.op_type, c.domain, c.tensors, c.attrs, shapes[0] if shapes else None)
    if estimated is None:
        return None
    value, budget = estimated
    if value is None:
        return "cost unknown: the multiply-adds cannot be estimated"
    if value > budget:
        return f"over compute budget: {value} multiply-adds, the budget is {budget}"
    return None


Guard = Callable[[Candidate], "str | None"]

#: The may-this-fold checks, cheapest and most structural first.
GUARDS: tuple[Guard, ...] = (
    no_opset,
    nowhere_to_store,
    quantisation,
    nondeterministic,
    unusable_attributes,
    no_kernel,
    output_size,
    compute_cost,
)


def refusal(candidate: Candidate) -> str | None:
    """The first guard's reason not to evaluate the candidate, or None if it may be."""
    for guard in GUARDS:
        reason = guard(candidate)
        if reason is not None:
            return reason
    return None


def result_too_large(candidate: Candidate, outputs: Sequence[np.ndarray | None]) -> str | None:
    """The size policy on the results the model uses: a reason not to keep them, or None."""
    nbytes = sum(a.nbytes for a in outputs if a is not None)
    if candidate.grows_model(nbytes):
        return f"too large: {nbytes} bytes would grow the model"
    return None



def fails_downstream(candidate: Candidate, outputs: Sequence[np.ndarray | None],
                     rank: Callable[[ir.Value | None], int | None] = lambda value: None) -> str | None:  # fmt: skip
    """Why a result must stay computed: a default-domain user always rejects it, or None.

    ``rank`` gives the rank of a value when known (the data input of a user whose ``axes``
    the result would become).
    """
    for value, array in zip(candidate.node.outputs, outputs):
        if array is None:
            continue
        for use in value.uses():
            if use.node.domain not in ("", "ai.onnx"):
                continue
            data_rank = rank(use.node.inputs[0]) if use.node.inputs else None
            if (why := checked_inputs.rejected(use.node.op_type, use.idx, array, data_rank)) is not None:
                return f"fails downstream: {use.node.op_type} node {use.node.name!r} would always reject {why}"
    return None
