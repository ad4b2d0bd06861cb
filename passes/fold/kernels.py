"""onnxruntime's CPU kernels that approximate: the ops whose folded value is onnxruntime's (:func:`runtime_valued`).

refimpl computes a transcendental function in float64 and rounds once (the correctly rounded
value, double rounding aside), and the confirmation keeps a fold when onnxruntime's value is
within ``agree.ULPS`` of it. Some of onnxruntime's CPU kernels are further away than that:
MLAS's Sigmoid clamps its input and evaluates a rational approximation, 72 million ULPs off at
x = -17.69 (1.49e-7 where the value is 2.08e-8) and 0 from about x = -20 on, where the value is
a tiny normal number (2.06e-9 at -20, 6.05e-39 at -88); Tanh is 103 ULPs off near
the smallest normal; Gelu (both forms), HardSigmoid and HardSwish lose their small results to
cancellation. Their folds were declined as ``disagrees_with_onnxruntime``, and a Swin-v2's
continuous-position-bias MLP (MatMul, Relu, MatMul, Sigmoid over a constant table) stayed
computed. The promise of the fold is to compute what the original computes in onnxruntime, and
the original computes exactly this node from exactly these constants: so for these (op, dtype)
fold takes onnxruntime's value, through the mechanism of :mod:`passes.fold.decide` (the node
alone, computed in onnxruntime's child from its settled inputs; ``stats["runtime_decided"]``).

That is sound only where the kernel's bits do not depend on how the work is cut: the folded
value was computed on the whole tensor in one call, the original's runs cut it in blocks by the
thread pool (MLAS vectorises by 4, 8 or 16 elements and may take a scalar path on a tail).
``benchmarks/bench_kernel_ulps.py`` measured both (onnxruntime 1.32, x86-64, every 2**12-th
bit pattern of the line, a dense grid of [-32, 32], ±0, ±inf, NaN, subnormals; parts of sizes
1 to 65537 at offsets 0 to 4099 and one element at a time, intra_op_num_threads 1, 2 and 4; NaN
payloads aside), and ``tests/test_fold_runtime_kernels.py`` checks them again on this machine's
onnxruntime:

* taken (:data:`RUNTIME_VALUED`): float32 Sigmoid, Tanh, Gelu, HardSigmoid, HardSwish and
  float64 HardSwish: outside the bound somewhere, the same bits however cut;
* not taken (:data:`CUT_DEPENDENT`): float32 Elu, Selu, Celu, Mish and float64 Sigmoid, Mish
  and Gelu's tanh form: outside the bound and the bits depend on the cut (a lone element takes
  a scalar path, Eigen's packet path gives other bits). Their folds stay confirmed against
  refimpl's value: a disagreement declines them, as before, counted by op in
  ``stats["cut_dependent"]`` (and in ``disagrees_with_onnxruntime``), and the log names the reason.

float16 is not taken (onnxruntime computes it in float32 between inserted Casts, which it drops
between two such ops: what a node computes there depends on its neighbours; see
``confirm.Batch._keep_16_bit_chains``), nor is bfloat16 (no kernels). Every other op stays with
refimpl's value, confirmed within ``agree.ULPS`` (onnxruntime's bits written where they differ).
"""

from __future__ import annotations

import functools
import importlib.metadata
from collections.abc import Mapping

from passes.fold.agree import ULPS

__all__ = ["CUT_DEPENDENT", "MEASURED_ON", "RUNTIME_VALUED", "cut_dependent", "measured_release", "runtime_valued"]

#: The onnxruntime release (major.minor) the tables were measured on. Under another release the
#: kernels may have changed: :func:`runtime_valued` takes nothing there (the folds are confirmed
#: against refimpl's value, as before), and tests/test_fold_runtime_kernels.py fails until the
#: tables are measured again (``benchmarks/bench_kernel_ulps.py``).
MEASURED_ON = "1.32"

#: Default-domain (op, element types) whose onnxruntime kernel approximates beyond agree's bound
#: and gives the same bits however the tensor is cut: fold takes onnxruntime's value.
RUNTIME_VALUED: Mapping[str, frozenset[str]] = {
    "Sigmoid": frozenset({"float32"}),
    "Tanh": frozenset({"float32"}),
    "Gelu": frozenset({"float32"}),
    "HardSigmoid": frozenset({"float32"}),
    "HardSwish": frozenset({"float32", "float64"}),
}
#: Default-domain (op, element types) whose onnxruntime kernel approximates beyond agree's bound
#: with bits that depend on the cut of the tensor: onnxruntime's value is not taken.
CUT_DEPENDENT: Mapping[str, frozenset[str]] = {
    "Elu": frozenset({"float32"}),
    "Selu": frozenset({"float32"}),
    "Celu": frozenset({"float32"}),
    "Mish": frozenset({"float32", "float64"}),
    "Gelu": frozenset({"float64"}),
    "Sigmoid": frozenset({"float64"}),
}


def _lookup(table: Mapping[str, frozenset[str]], domain: str, op_type: str, dtype: str | None) -> bool:
    return domain == "" and dtype is not None and dtype in table.get(op_type, ())


@functools.cache
def measured_release() -> bool:
    """Whether the installed onnxruntime is the release the tables were measured on."""
    try:
        version = importlib.metadata.version("onnxruntime")
    except importlib.metadata.PackageNotFoundError:
        return False
    return version == MEASURED_ON or version.startswith(MEASURED_ON + ".")


def runtime_valued(domain: str, op_type: str, dtype: str | None) -> str | None:
    """Why fold takes onnxruntime's value for this node (``dtype``: its input's numpy name), or None
    (also under an onnxruntime release other than :data:`MEASURED_ON`)."""
    if not _lookup(RUNTIME_VALUED, domain, op_type, dtype) or not measured_release():
        return None
    return f"onnxruntime's {dtype} {op_type} kernel approximates beyond {ULPS} ULPs: its value"


def cut_dependent(domain: str, op_type: str, dtype: str | None) -> str | None:
    """Why onnxruntime's value is not taken where it disagrees with refimpl's, or None."""
    if not _lookup(CUT_DEPENDENT, domain, op_type, dtype):
        return None
    return f"onnxruntime's {dtype} {op_type} kernel approximates and its bits depend on how the tensor is cut"

