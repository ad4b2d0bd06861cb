"""What the pipeline does around the check: its options, the requests refused first, the blame.

The gate (:mod:`passes.verify.gate`) compares two models and knows nothing of
passes; the pipeline (:mod:`passes.pipeline`) tells it what it needs from the
run, with these: the check's inputs at the run's static sizes
(:func:`check_at_static_sizes`), the half type the precision pass converted to
(:func:`with_precision`), whether a pass may have changed float rounding
(:func:`rounding_may_change`). It refuses, before anything is written, what the
check could only misread (:func:`refuse_two_tolerances`, and static shapes the
model cannot run at, :func:`refuse_impossible_shapes`; those the model's own
inputs declare once the checker refused the result, :func:`refuse_declared_shapes`). After a mismatch,
:func:`blame` reruns the pipeline with one pass less at a time to name the pass
that brought it. Before that, when simplify's fusions ran, :func:`unfused` tries the
same run without them: a fusion changes float rounding by design, and where that
change is beyond the check's tolerance the run writes the unfused model (exact)
rather than nothing.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from passes import modelio, shapes  # light: onnx and onnx_ir on first use
from passes.declarations import PASSES
from passes.dim_names import refuse_unknown_dims  # light
from passes.errors import InputError, OptimizeError, cut, first_line
from passes.lazy import lazy_module
from passes.runspec import RunSpec

if TYPE_CHECKING:
    import onnx_ir as ir

    from passes.report import PassRun
    from passes.verify.gate import CheckOptions, Gate
_inference = lazy_module("passes.ir.inference")

__all__ = ["blame", "check_at_static_sizes", "refuse_declared_shapes", "refuse_impossible_shapes",
           "refuse_two_tolerances", "rounding_may_change", "unfused", "with_precision"]


def check_at_static_sizes(run: RunSpec, model: ir.Model, check: CheckOptions) -> CheckOptions:
    """``check`` with the check's inputs at the run's declared static sizes (a ``--dim`` name the model
    does not have, or one that contradicts them, refused; see :func:`passes.shapes.check_dims`)."""
    refuse_unknown_dims(model, check.dims)
    if not run.static:
        return check
    from passes.shapes.declare import symbolic_dim_names

    problem = shapes.refusal(model, run.input_shapes, run.fix_dims, symbolic_dim_names(model))
    if problem is not None:
        raise InputError(problem)
    dims = shapes.check_dims(model, run.input_shapes, run.fix_dims, check.dims)
    return dataclasses.replace(check, dims=dims, shapes=dict(run.input_shapes), free_dims=dict(check.dims),
                               static=shapes.requests_text(run.input_shapes, run.fix_dims))  # fmt: skip


#: Stats of an exact pass that count changes after which onnxruntime may round differently:
#: simplify's named fusions, and fold's constants that became a weight onnxruntime prepacks.
_ROUNDING_STATS = ("fused", "weights_made_constant")


def rounding_may_change(runs: Sequence[PassRun]) -> bool:
    """Whether a pass may have changed float rounding: one that is not exact changed the model, or
    an exact one made changes after which onnxruntime rounds differently (:data:`_ROUNDING_STATS`)."""
    return any((r.modified and r.name in PASSES and not PASSES[r.name].exact)
               or any(r.stats.get(key, 0) for key in _ROUNDING_STATS) for r in runs)  # fmt: skip


def with_precision(check: CheckOptions, runs: Sequence[PassRun]) -> CheckOptions:
    """``check`` told the half type the precision pass converted the model to (its tolerance and
    input sets, see :class:`passes.verify.check.Checker`), if it did."""
    for r in runs:
        if r.name == "precision" and r.modified and r.stats.get("precision"):
            tolerance = r.stats.get("tolerance")
            return dataclasses.replace(check, precision=r.stats["precision"],
                                       precision_tolerance=tuple(tolerance) if tolerance else None)  # fmt: skip
    return check


def refuse_two_tolerances(run: RunSpec, check: CheckOptions) -> None:
    """``--precision-tolerance`` with ``--rtol``/``--atol``: both would set the tolerance of the
    precision check (``--rtol``/``--atol`` set every output's, which wins): one is refused."""
    if run.options.get("precision_tolerance") is not None and (check.rtol is not None or check.atol is not None):
        raise InputError("--precision-tolerance and --rtol/--atol both set the tolerance of the --precision "
                         "check: give one (--precision-tolerance: the half type's; --rtol/--atol: every output's)")


def refuse_impossible_shapes(run: RunSpec, model: ir.Model, fresh: Callable[[], ir.Model]) -> None:
    """Refuses static shapes the model cannot run at (exit 2, nothing written).

    Folding makes a contradiction visible that the declared inputs alone do not
    (a 128-long sequence added to a 32-row position table): when onnx shape
    inference refuses the result, and the same passes without the static shapes
    give a result it accepts, the shapes are the cause.
    """
    if not run.static or (error := _inference.inference_error(model)) is None:
        return
    dynamic = dataclasses.replace(run, types=run.types or run.static, input_shapes={}, fix_dims={})
    plain = fresh()
    dynamic.run(plain)
    if _inference.inference_error(plain) is None:
        raise InputError(f"{shapes.requests_text(run.input_shapes, run.fix_dims)}: the model cannot run at these "
                         f"shapes (onnx shape inference: {cut(error)})")


def refuse_declared_shapes(gate: Gate, verdict: Any, run: RunSpec, fresh: Callable[[], ir.Model]) -> None:
    """After the ONNX checker refused the result of a run that asks for no static shapes: refuses
    the static shapes the model's own inputs declare when they are the cause (exit 2, nothing written).

    Folding makes visible what the declared inputs alone do not (``'pixel_values' [batch, 3, 64, 64]``
    on a ViT whose position table holds 32x32 images' patches): the result cannot be valid. When the
    same passes on the model with its inputs' static dims made symbolic give a result the checker
    accepts, the refusal names the declaration, not the passes: such a model runs at no shape at all
    (onnxruntime holds an input to its static dims). Only on this failure path: a run that passes
    pays nothing.
    """
    if not verdict.invalid or run.static:
        return
    from passes.shapes.declare import relax_static_inputs

    relaxed = fresh()
    if not (declared := relax_static_inputs(relaxed)):
        return
    try:
        run.run(relaxed)
    except OptimizeError:
        return
    if gate.accepts(modelio.model_to_proto(relaxed)):
        why = (verdict.failure or "").removeprefix("the optimised model is invalid: ")
        raise InputError(f"the model cannot run at the static shapes its inputs declare ({declared}): {cut(why)}")


def unfused(gate: Gate, verdict: Any, run: RunSpec, runs: Sequence[PassRun], fresh: Callable[[], ir.Model],
            progress: Callable[[str], None] | None = None) -> tuple[ir.Model, list[PassRun], Any] | None:
    """After a difference in a run whose simplify fused: the same run without the fusions (as with
    ``--no-fuse``), from a fresh load, checked by ``gate`` on the same inputs and sets.

    Returns (model, its pass runs, its verdict) when that model passes, its verdict's result keeping
    the first check's inputs and notes and its notes saying what was refused; None when there were
    no fusions to leave out (or a --precision run: its own search decides; or
    ``--no-unfused-fallback``), or the unfused model fails too (the first difference stands, for :func:`blame`).
    """
    fused = sum(r.stats.get("fused", 0) for r in runs if r.name == "simplify")
    if not (verdict.differs and fused and run.options.get("fuse") and "precision" not in run.passes
            and gate.check.unfused_fallback):  # fmt: skip
        return None
    plain = run.without_fusions()
    if progress is not None:
        progress(f"the check refused the fused model: running again without simplify's fusions ({fused})")
    try:
        model = fresh()
        plain_runs = plain.run(model, progress)
        folder = gate.folder / "unfused"
        folder.mkdir()
        modelio.save_model(model, folder / "model.onnx")
    except OptimizeError:
        return None
    again = gate.verify_again(folder / "model.onnx", rounding=rounding_may_change(plain_runs))
    first = verdict.result
    refused = (verdict.failure or first.summary()).split("\n")[0]
    tried = {"fused": fused, "fused_check": refused, "unfused_check": (again.failure or "passed").split("\n")[0]}
    if again.failure is not None:
        first.without_fusions = tried
        return None
    again.result.inputs, again.result.seconds, again.result.without_fusions = first.inputs, first.seconds, tried
    again.result.notes[:0] = first.notes
    shown = refused.removeprefix("check failed: ")
    again.notes[:0] = [*verdict.notes, f"written without simplify's fusions (as with --no-fuse), which the check "
                       f"refused: with the {fused} fusion(s), {shown}"]  # fmt: skip
    return model, plain_runs, again


def blame(gate: Gate, verdict: Any, run: RunSpec, fresh: Callable[[], ir.Model]) -> None:
    """After a mismatch, the pass whose addition brings it: reruns the pipeline from a fresh load
    with one pass less at a time (from the end), then without the clean-up, until the check passes.

    Sets the first difference's ``pass_name`` (or "") and ``pipelines`` (each rerun and its verdict),
    and the verdict's failure to the result's summary, which names the pass. When :func:`unfused`
    found that the run fails without simplify's fusions too, the reruns leave them out as well: the
    pass looked for is the one that brings the difference that remains.
    """
    if not (verdict.differs and verdict.result.first_difference is not None):
        return
    if verdict.result.without_fusions is not None:
        run = run.without_fusions()
    start = time.perf_counter()
    found = verdict.result.first_difference
    pipelines: list[dict[str, Any]] = []
    culprit = ""
    names = run.passes
    candidates = [(run.without(k, True), names[k]) for k in range(len(names) - 1, -1, -1)]
    candidates.append((run.without(0, False), "cleanup"))
    for fewer, suspect in candidates:
        label = [*fewer.passes, "cleanup"] if fewer.cleanup else ["(load and save only)"]
        try:
            model = fresh()
            fewer.run(model)
            folder = gate.folder / f"bisect-{len(pipelines)}"
            folder.mkdir()
            modelio.save_model(model, folder / "model.onnx")
        except OptimizeError as e:
            pipelines.append({"passes": label, "ok": False, "error": first_line(e)})
            break
        ok = gate.recheck(folder / "model.onnx")
        pipelines.append({"passes": label, "ok": bool(ok)})
        if ok is None:
            break
        if ok:
            culprit = suspect
            break
    found.pass_name, found.pipelines = culprit, pipelines
    found.seconds = round(found.seconds + time.perf_counter() - start, 3)
    verdict.result.seconds["locate"] = found.seconds
    verdict.failure = verdict.result.summary()  # now naming the pass
