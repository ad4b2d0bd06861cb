"""The weights onnxruntime's CPU kernels prepack, and the values that become one.

A constant initializer in one of :data:`PREPACKED`'s inputs is re-laid out once when the session
is built and then summed in the kernel's own blocked order; the same tensor fed at run time (a
graph input, a computed value) is summed in another. So a rewrite that makes such an input constant
(fold's value, a weight ``--freeze-initializer-inputs`` takes out of the inputs) is exact in what it
writes, yet the op then rounds differently (``weights_made_constant`` in the report: the check then
reads the edge-value sets as after a fusion, docs/check.md). Where a later op amplifies that change
(a quantizer's rounding: :mod:`passes.ir.amplification`), :func:`prepacked_amplified` names it, and
the rewrite is declined as a fusion there is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from passes.ir.walk import normalize_domain

if TYPE_CHECKING:
    import onnx_ir as ir

    from passes.ir.amplification import Amplified

__all__ = ["PREPACKED", "feeds_prepacked", "prepacked_amplified"]

#: The inputs onnxruntime's CPU kernels prepack when they are constant initializers, by op (default domain).
PREPACKED: dict[str, tuple[int, ...]] = {
    "MatMul": (1,), "Gemm": (1,), "Conv": (1,), "ConvTranspose": (1,), "LSTM": (1, 2), "GRU": (1, 2),
    "RNN": (1, 2), "MatMulInteger": (1,), "ConvInteger": (1,), "QLinearMatMul": (3,), "QLinearConv": (3,),
}  # fmt: skip


def feeds_prepacked(value: ir.Value) -> bool:
    """Whether ``value`` is an input onnxruntime prepacks of one of its users (once it is constant)."""
    return any(use.idx in PREPACKED.get(use.node.op_type, ()) and normalize_domain(use.node.domain) == ""
               for use in value.uses())  # fmt: skip


def prepacked_amplified(value: ir.Value, amplified: Amplified) -> str | None:
    """The op that amplifies the change of rounding of an op prepacking ``value`` once it is constant
    (``"DynamicQuantizeLinear"``: a 1-ulp change of MatMul's sum becomes a quantization step), or None."""
    for use in value.uses():
        node = use.node
        if use.idx in PREPACKED.get(node.op_type, ()) and normalize_domain(node.domain) == "":
            for output in node.outputs:
                if (op := amplified.reason(output)) is not None:
                    return op
    return None
