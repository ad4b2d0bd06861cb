"""The way out of a failed check, fitted to its cause: the hint lines after the error."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from passes.verify.defaults import TOLERANCES

if TYPE_CHECKING:
    from passes.report import Report

__all__ = ["check_hint"]


def _near_tolerance(out: Any) -> bool:
    """A float difference of rounding size: within 10x the default tolerance of its dtype, and not zero, between
    values of the same shape (an output whose shape, dtype or structure differs has no differing elements to
    measure, and a difference of NaN placement or of the sign of a zero alone is no rounding)."""
    default = TOLERANCES.get(out.tolerance_dtype or out.dtype)
    if default is None or not out.mismatches or not (out.max_abs_error or out.max_rel_error):
        return False
    if not (math.isfinite(out.max_abs_error) and math.isfinite(out.max_rel_error)):
        return False
    rtol, atol = default
    return out.max_abs_error <= 10 * atol or out.max_rel_error <= 10 * rtol


#: Half types onnxruntime's CPU provider computes some nodes of in float32, by where they sit.
_HALF = ("float16", "bfloat16")
_HALF_HINT = ("the differing outputs depend on {dtype} values: onnxruntime's CPU kernels compute some {dtype} "
              "nodes in float32 (with Casts it inserts), and which ones depends on their neighbours, so even an "
              "exact rewrite can move a {dtype} result by a rounding (docs/check.md); if it is more than that, "
              "please report it with the model")


def check_hint(report: Report) -> list[str]:
    """The way out of a failed check, fitted to its cause (one line each; empty if none fits).

    * the pass blamed is ``simplify`` and it fused nodes: ``--no-fuse`` (unless the run without the
      fusions was tried and failed too: then it is simplify's exact rewrites, a bug);
    * every differing output is off by a rounding-size amount: ``--rtol/--atol``;
    * the pass blamed is ``precision`` (a half type changes results by design):
      ``--precision-tolerance``, or the run without ``--precision``;
    * another pass blamed: ``--skip PASS``, and how to report it; where the differing outputs are of a
      half type the original computes in, also why an exact rewrite may move them (below).
    """
    check = report.check
    if check is None or not check.checked or check.ok:
        return []
    found = check.first_difference
    blamed = found.pass_name if found is not None else ""
    runs = {run.name: run for run in report.passes}
    fused = runs["simplify"].stats.get("fused", 0) if "simplify" in runs else 0
    failures = check.failures if not check.error else []
    hints = []
    if check.without_fusions is not None:  # the run without them failed too: they are not the cause
        fused = 0
        hints.append(f"hint: without simplify's fusions the check fails too ({check.without_fusions['unfused_check']})")
    if blamed == "simplify" and fused:
        hints.append(f"hint: simplify's fusions (fused={fused}) change float rounding; "
                     "--no-fuse keeps those ops as they are")
    if failures and all(_near_tolerance(o) for o in failures):
        worst_abs = max(o.max_abs_error for o in failures)
        worst_rel = max(o.max_rel_error for o in failures)
        dtype = failures[0].tolerance_dtype or failures[0].dtype
        rtol, atol = TOLERANCES[dtype]
        hints.append(f"hint: the differences are rounding-sized (max abs {worst_abs:.3g}, max rel {worst_rel:.3g}); "
                     f"if your outputs allow that, set --rtol/--atol (default for {dtype}: "
                     f"--rtol {rtol:g} --atol {atol:g})")
    if blamed == "precision":
        kind = runs["precision"].stats.get("precision", "the half type") if "precision" in runs else "the half type"
        hints.append(f"hint: --precision computes in {kind}, which changes results by design; "
                     "--precision-tolerance RTOL[,ATOL] accepts larger differences, or run without --precision")
    elif blamed and blamed != "cleanup" and not (blamed == "simplify" and fused):
        half = "/".join(sorted({o.tolerance_dtype for o in failures} & set(_HALF)))
        hints.append(f"hint: --skip {blamed} optimises without that pass; " + (_HALF_HINT.format(dtype=half) if half
                     else "a pass that changes a result is a bug: please report it with the model (or its --report "
                     "FILE.json)"))
    elif not hints:
        hints.append("hint: " + ("" if report.written else "--force writes the output anyway; ")
                     + "please report it with the model (or its --report FILE.json)")
    if failures and check.repro is None:
        hints.append("hint: --repro DIR writes the smallest pair of models that still differ, with their inputs, "
                     "to attach to a report")
    return hints
