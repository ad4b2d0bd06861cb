"""The one optimisation pipeline every route goes through.

Data flows one way: the command or the API describes the run once
(:class:`RunSpec`: the passes, their options, validated), this module runs
the passes (:mod:`passes.loop`), saves, and asks the gate
(:mod:`passes.verify.gate`) for a verdict; on a mismatch it looks for the pass
that brought it by rerunning the pipeline with fewer passes
(:mod:`passes.pipeline_check`: that search, and what the run tells the check or
refuses before it). Nothing below calls back up.

* :data:`PASSES`: the passes by CLI name, in their default order (their
  declarations, :mod:`passes.declarations`).
* :func:`optimize_model`: runs the passes (then the clean-up) on an IR model.
* :func:`build_pass_manager`: the same loop as an ``onnx_ir`` pass manager.
* :func:`optimize_file`: load (validated), optimise, save atomically, check
  with the ONNX checker and onnxruntime, report. The ``optimize`` command and
  ``passes.optimize(path, output=...)`` both call it.
* :func:`optimize`: the Python API for a path, a ``ModelProto`` or an
  ``onnx_ir.Model``, with the same validation and the same check.

Every route refuses the same requests with the same message: an unknown pass
or option, a value an option's declaration refuses, an option of a pass that
does not run, options a pass refuses together (``--precision-io`` without
``--precision``), ``--precision-tolerance`` with ``--rtol``/``--atol``, a target
opset below the model's (the upgrade pass refuses it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import pathlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

# Only light modules at the top: ``--help`` and early errors need no more.
# onnx, onnx_ir, the passes and the report are imported where they are used.
from passes import modelio  # light: it imports onnx and onnx_ir on first use
from passes.declarations import DEFAULT_FOLD_SIZE_LIMIT, DEFAULT_TARGET_OPSET, PASSES, PassSpec
from passes import shapes  # light: --input-shape / --fix-dim validated once
from passes.errors import CheckFailedError, InputError, OptimizeError, first_line
from passes.lazy import lazy_module
from passes import heap
from passes import pipeline_check as _check
from passes.runspec import RunSpec, pass_options, select_passes
from passes.phases import Phases
from passes.verify.gate import CheckOptions  # light: onnx on first use, onnxruntime in a child

if TYPE_CHECKING:
    import onnx
    import onnx_ir as ir

    from passes.report import PassRun, Report
else:
    onnx = lazy_module("onnx")
    ir = lazy_module("onnx_ir")
_report = lazy_module("passes.report")
_walk = lazy_module("passes.ir.walk")
_destinations = lazy_module("passes.modelio.destinations")
_gate = lazy_module("passes.verify.gate")
_handoff = lazy_module("passes.verify.handoff")
_repro = lazy_module("passes.verify.repro")

__all__ = [
    "DEFAULT_FOLD_SIZE_LIMIT",
    "DEFAULT_TARGET_OPSET",
    "PASSES",
    "CheckOptions",
    "PassSpec",
    "RunSpec",
    "build_pass_manager",
    "optimize",
    "optimize_file",
    "optimize_model",
    "pass_options",
    "select_passes",
]

logger = logging.getLogger(__name__)


def build_pass_manager(
    passes: Iterable[str] | None = None, *, cleanup: bool = True, **options: Any
) -> ir.passes.PassManager:
    """An ``onnx_ir`` pass manager running the named passes in the one pass loop, for composing
    with other passes; it refuses what the command refuses."""
    return RunSpec.build(passes, cleanup=cleanup, **options).manager()


def optimize_model(
    model: ir.Model,
    passes: Sequence[str] | None = None,
    *,
    cleanup: bool = True,
    progress: Callable[[str], None] | None = None,
    **options: Any,
) -> list[PassRun]:
    """Runs the named passes in order (then the clean-up) on ``model`` in place.

    Args:
        model: The model, changed in place.
        passes: Pass names (see :data:`PASSES`); None runs all of them.
        cleanup: Run the clean-up after the passes.
        progress: Called with a short message before each pass.
        **options: Values of the passes' declared options (see :func:`pass_options`).

    Returns:
        What each pass did, in order.

    Raises:
        InputError: an unknown pass or option, or an option of a pass that does not run.
        OptimizeError: a pass refused the model (a target opset below the model's, an upgrade
            without an adapter...).
    """
    return RunSpec.build(passes, cleanup=cleanup, **options).run(model, progress)


def optimize_file(
    source: str | os.PathLike[str],
    output: str | os.PathLike[str],
    *,
    passes: Iterable[str] | None = None,
    skip: Iterable[str] = (),
    check: CheckOptions | None = None,
    force: bool = False,
    report_path: str | os.PathLike[str] | None = None,
    progress: Callable[[str], None] | None = None,
    warn: Callable[[str], None] = logger.warning,
    on_commit: Callable[[bool], None] | None = None,
    replace_data: bool = False,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    fix_dims: Mapping[str, int] | None = None,
    **options: Any,
) -> Report:
    """Loads ``source``, optimises it, checks the result and writes it to ``output`` atomically.

    The output is written only if it passes the ONNX checker and (unless
    ``check.enabled`` is False) computes the same outputs as the source in
    onnxruntime, or if ``force`` is set; the input is never changed.

    Args:
        source: The ``.onnx`` file.
        output: Where to write the result (may be ``source`` itself).
        passes: Pass names to run, in order; None runs all of them.
        skip: Pass names not to run.
        check: How to check (default: :class:`CheckOptions`).
        force: Write the output even when the check fails (the error is still raised).
        report_path: Also write the report there as JSON (committed with the output).
        progress: Called with a short message before each phase and pass; a
            :class:`passes.phases.Listener` is also told the bytes written and when each phase ends.
        warn: Called with a warning (a check that could not run).
        on_commit: Called with True once the output is in place (False if it was not written).
        replace_data: Replace an existing ``OUTPUT.data`` even when it is not the
            existing OUTPUT's own data file (it may be another model's weights).
        input_shapes: Static shapes of graph inputs by name (``--input-shape``; the name ``""``: the
            model's only input, refused for a model with several).
        fix_dims: Sizes of symbolic dims by name (``--fix-dim``).
        **options: Values of the passes' declared options.

    Returns:
        The report of the run.

    Raises:
        InputError: bad input or options.
        OptimizeError: a pass refused the model.
        CheckFailedError: the result is invalid or differs (``error.report`` holds the report).
    """
    run, given = _build(passes, skip, input_shapes, fix_dims, options)
    check = check or CheckOptions()
    _check.refuse_two_tolerances(run, check)
    worker = _gate.start_worker(check)  # its imports overlap with the passes
    early = contextlib.ExitStack()  # the original's side of the check, if started, stopped at the end
    try:
        return _optimize_file(pathlib.Path(source), pathlib.Path(output), run, check, force, report_path,
                              progress, warn, on_commit, replace_data, (worker, early), given)  # fmt: skip
    finally:
        heap.thaw()
        early.close()
        if worker is not None:
            worker.close()


def _optimize_file(src: pathlib.Path, dst: pathlib.Path, run: RunSpec, check: CheckOptions, force: bool,
                   report_path: str | os.PathLike[str] | None, progress: Callable[[str], None] | None,
                   warn: Callable[[str], None], on_commit: Callable[[bool], None] | None, replace_data: bool,
                   child: tuple[Any, contextlib.ExitStack], input_shapes: Mapping[str, Sequence[int]]) -> Report:
    phases = Phases(progress)
    worker, early = child[0], None
    with phases.phase("load", f"loading {src}"), heap.loading():  # the loaded model out of the collector's scans
        model = modelio.load_model(src)
    reads = [check.inputs_file] if check.inputs_file is not None else []
    _destinations.check_report(report_path, src, dst, model, reads)  # what may not be written: refused untouched
    _destinations.check_destinations(src, dst, report_path, model, replace_data, reads)
    repro_files = _repro.check_request(check, [src, *modelio.data_files(model)],
                                       [dst, dst.with_name(dst.name + ".data"), *([report_path] if report_path else [])])
    report = _report.Report(str(src), str(dst), _report.summarize(model))
    report.before.file_bytes = _report.disk_bytes([src, *modelio.source_files(model)])
    report.phases = phases.seconds
    if not check.enabled:
        report.unchecked = "--no-check"
    staged_report = False
    try:
        run = _name_sole_input(run, model, input_shapes)
        check = _check.check_at_static_sizes(run, model, check)
        if "precision" not in run.passes:  # (its result sets the check's tolerance and sets)
            early = _gate.start_early(src, check, worker, report.before.file_bytes)
            if early is not None:
                child[1].callback(early.close)
        with phases.phase("passes", None):
            handoff = _handoff.Handoff(src, worker)  # the precision search's measurements, for the final check
            child[1].callback(handoff.close)
            with _handoff.passes_checked(check, handoff):  # a pass that checks its candidates: the same inputs, child
                run.run(model, progress, report.passes)
            _check.refuse_impossible_shapes(run, model, lambda: modelio.load_model(src))
        report.notes.extend(modelio.model_notes(model))  # the load's lossless repairs, the passes' corrections
        report.after = _report.summarize(model)

        with modelio.staged_output(dst, replace_data=replace_data) as staged:
            with phases.phase("save", f"saving {dst}", modelio.weights_nbytes(model) or None, "B") as advance:
                staged_path = staged.save(model, progress=advance)
            report.after.file_bytes = _report.disk_bytes(staged.files)
            _release(model)
            del model
            heap.thaw()  # the model's nodes and values refer to each other: the collector frees them
            check = _check.with_precision(check, report.passes)
            with phases.phase("check", "checking with onnxruntime" if check.enabled else "checking"):
                with _gate.Gate(src, check, warn, worker, rounding=_check.rounding_may_change(report.passes),
                                early=early, handoff=handoff) as gate:
                    verdict = gate.verify(staged_path)
                    fresh = lambda: modelio.load_model(src)  # noqa: E731  (also for blame)
                    _check.refuse_declared_shapes(gate, verdict, run, fresh)
                    fallback = _check.unfused(gate, verdict, run, report.passes, fresh, progress)
                    if fallback is not None:  # the unfused model passed: it is the output
                        model, report.passes, verdict = fallback
                        report.after, staged_path = _report.summarize(model), staged.save(model)
                        report.after.file_bytes = _report.disk_bytes(staged.files)
                    _check.blame(gate, verdict, run, fresh)
                    gate.reproduce(staged_path, verdict, *repro_files)
            report.notes.extend(verdict.notes)
            report.check = verdict.result
            failure, error = verdict.failure, None
            commit = failure is None or force
            if failure is not None:
                first, *rest = failure.split("\n")  # the located difference follows the error's one line
                error = CheckFailedError("\n".join([first + ("" if commit else f"; {dst} not written"), *rest]))
                if report.check is None:
                    report.unchecked = first
            report.conclude(error)
            if report_path is not None:
                # Staged with the output and renamed in the same commit, so that a report that
                # cannot be written leaves the output as it was; it says what the commit will do.
                report.written = commit
                staged_report = True  # from here the report goes with the output, or not at all
                staged.stage_file(report_path, report.write_json, f"--report {_destinations.shown(report_path)}")
            try:
                staged.commit(model=commit)
            finally:  # an interrupt may arrive as the commit completes
                report.written = staged.committed
                if on_commit and commit:
                    on_commit(staged.committed)
    except OptimizeError as e:
        if staged_report:
            raise
        # A refusal after the load (the static shapes, a pass, the --inputs, the --precision search):
        # the report still says what ran, with the error (the output is not written).
        report.conclude(e)
        report.written = False
        if report_path is not None:
            report.write_json(report_path)
        e.report = report  # type: ignore[attr-defined]
        raise
    if error is not None:
        error.report = report  # type: ignore[attr-defined]
        raise error
    return report


def _build(passes: Iterable[str] | None, skip: Iterable[str], input_shapes: Mapping[str, Sequence[int]] | None,
           fix_dims: Mapping[str, int] | None, options: Mapping[str, Any]) -> tuple[RunSpec, dict[str, Any]]:
    """The validated run, and the static shapes as given: a shape without a name (the key
    :data:`passes.shapes.SOLE_INPUT`) is named once the model is loaded (:func:`_name_sole_input`)."""
    given = dict(input_shapes or {})
    named = {k: v for k, v in given.items() if k != shapes.SOLE_INPUT}
    return RunSpec.build(passes, skip, input_shapes=named, fix_dims=fix_dims, **options), given


def _name_sole_input(run: RunSpec, model: ir.Model, input_shapes: Mapping[str, Sequence[int]]) -> RunSpec:
    """``run`` with a shape given without a name (onnxsim's ``--input-shape 1,32``: the key
    :data:`passes.shapes.SOLE_INPUT`) given to the model's only input."""
    if shapes.SOLE_INPUT not in input_shapes:
        return run
    return dataclasses.replace(run, input_shapes=shapes.name_sole_input(model, {**run.input_shapes, **input_shapes}))


def _release(model: ir.Model) -> None:
    """Frees the model's tensors once it is written: the check reads the written file.

    The checker (and onnxruntime's comparison) read the output back; holding a
    model's folded weights meanwhile would add their size to the peak. The IR's
    nodes and values refer to each other, so only the garbage collector would
    free them: the tensors are dropped here instead.
    """
    for graph in _walk.graphs(model):
        for value in graph.initializers.values():
            value.const_value = None


def _check_options(check: bool | CheckOptions) -> CheckOptions:
    if isinstance(check, CheckOptions):
        return check
    return CheckOptions(enabled=bool(check))


def optimize(
    model: Any,
    *,
    passes: Iterable[str] | None = None,
    skip: Iterable[str] = (),
    output: str | os.PathLike[str] | None = None,
    check: bool | CheckOptions = True,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    fix_dims: Mapping[str, int] | None = None,
    **options: Any,
) -> Any:
    """Optimises a model with the named passes (default: all) and the clean-up.

    Every route validates the model as the ``optimize`` command does (the
    ONNX checker with type inference, tensors against their types, external
    data confined to the model's folder), refuses a target opset below the
    model's, and checks the result: the ONNX checker, and onnxruntime on both
    models unless ``check=False``.

    Args:
        model: A path to an ``.onnx`` file, its bytes, an ``onnx.ModelProto`` or an ``onnx_ir.Model``.
            An ``onnx_ir.Model`` is changed in place; the other forms are not changed.
        passes: Pass names to run, in order (see :data:`PASSES`). None runs all of them.
        skip: Pass names not to run.
        output: With a path input, write the result there atomically and return its path.
        check: False to skip the onnxruntime comparison, or :class:`CheckOptions`.
        input_shapes: Static shapes of graph inputs by name, e.g. ``{"x": (1, 3, 224, 224)}``
            (``--input-shape``): declared before the passes, and the check runs at those sizes. The
            name ``""`` is the model's only input (``--input-shape 1,3,224,224``).
        fix_dims: Sizes of symbolic dims by name, e.g. ``{"batch": 1}`` (``--fix-dim``), set
            everywhere they appear.
        **options: Values of the passes' declared options, e.g. ``target_opset=18``,
            ``fold_size_limit=1 << 20`` (see :func:`pass_options`).

    Returns:
        The same kind of object as ``model``: an ``onnx_ir.Model`` for an
        ``onnx_ir.Model``, an ``onnx.ModelProto`` for a ``ModelProto``, bytes for bytes; for a path,
        the output path if ``output`` is given, else the optimised ``onnx_ir.Model``.

    Raises:
        InputError: bad input or options.
        OptimizeError: a pass refused the model.
        CheckFailedError: the optimised model is invalid or computes something else.
    """
    passes, skip = (list(passes) if passes is not None else None), list(skip)  # read twice: by _build, by optimize_file
    run, given = _build(passes, skip, input_shapes, fix_dims, options)
    checking = _check_options(check)
    _check.refuse_two_tolerances(run, checking)
    if isinstance(model, (str, os.PathLike)):
        if output is not None:
            optimize_file(model, output, passes=passes, skip=skip, check=checking, input_shapes=given,
                          fix_dims=run.fix_dims, **options)  # fmt: skip (the user's request: the same run)
            return pathlib.Path(output)
        ir_model = modelio.load_model(model)
        original: Any = pathlib.Path(model)
    elif isinstance(model, (bytes, onnx.ModelProto)):
        original = model
        if isinstance(model, bytes):
            model = modelio.proto_from_bytes(model)
        copy = onnx.ModelProto()
        copy.CopyFrom(model)  # model_from_proto edits the proto it is given
        ir_model = modelio.model_from_proto(copy, validate=True)
    elif isinstance(model, ir.Model):
        original = modelio.model_to_proto(model)
        modelio.validate_proto(original)  # (its repairs are the copy's: those the IR needs are made again)
        ir_model = model
        modelio.repair_in_memory(ir_model)
    else:
        raise TypeError(
            f"optimize() takes a path, bytes, an onnx.ModelProto or an onnx_ir.Model, not {type(model).__name__}"
        )
    if output is not None:
        raise TypeError("optimize(): output= is only for a path input")
    run = _name_sole_input(run, ir_model, given)
    checking = _check.check_at_static_sizes(run, ir_model, checking)
    _repro.check_request(checking, [original] if isinstance(original, pathlib.Path) else [])
    worker = _gate.start_worker(checking)  # its imports overlap with the passes
    try:
        return _optimize_in_memory(model, original, ir_model, run, checking, worker)
    finally:
        if worker is not None:
            worker.close()


def _fresh(original: Any) -> ir.Model:
    """A new IR model of ``original`` (a path, bytes or a ``ModelProto``), as first loaded."""
    if isinstance(original, pathlib.Path):
        return modelio.load_model(original)
    source = modelio.proto_from_bytes(original) if isinstance(original, bytes) else original
    copy = onnx.ModelProto()
    copy.CopyFrom(source)
    return modelio.model_from_proto(copy)


def _optimize_in_memory(model: Any, original: Any, ir_model: ir.Model, run: RunSpec, checking: CheckOptions,
                        worker: Any) -> Any:  # fmt: skip
    with contextlib.ExitStack() as stack:
        handoff = stack.enter_context(contextlib.closing(_handoff.Handoff(original, worker)))  # (see _optimize_file)
        with _handoff.passes_checked(checking, handoff):  # a pass that checks its candidates: the same inputs, child
            runs = run.run(ir_model)
        checking = _check.with_precision(checking, runs)
        _check.refuse_impossible_shapes(run, ir_model, lambda: _fresh(original))
        proto = modelio.model_to_proto(ir_model)
        with _gate.Gate(original, checking, logger.warning, worker, rounding=_check.rounding_may_change(runs),
                        handoff=handoff) as gate:  # fmt: skip
            verdict = gate.verify(proto)
            _check.refuse_declared_shapes(gate, verdict, run, lambda: _fresh(original))
            in_place = isinstance(model, ir.Model)  # (the unfused model would be another object: not for it)
            fallback = None if in_place else _check.unfused(gate, verdict, run, runs, lambda: _fresh(original))
            if fallback is not None:  # the unfused model passed: it is the result
                (ir_model, runs, verdict), proto = fallback, modelio.model_to_proto(fallback[0])
            _check.blame(gate, verdict, run, lambda: _fresh(original))
            gate.reproduce(proto, verdict, [original] if isinstance(original, pathlib.Path) else [])
    notes = [*modelio.model_notes(ir_model), *verdict.notes]  # the load's repairs, the passes' corrections
    for note in [*notes, *(verdict.result.notes if verdict.result else [])]:
        logger.warning("%s", note)
    if verdict.failure is not None:
        raise CheckFailedError(verdict.failure)
    if isinstance(original, bytes):
        return proto.SerializeToString()
    if isinstance(model, onnx.ModelProto):
        return proto
    # Weights left in the input file become arrays: onnx_ir would save them as references to it.
    modelio.read_weights_in_file(ir_model)
    # An onnx_ir.Model cannot hold a sparse Constant: the caller gets the dense one.
    try:
        modelio.sparse.densify_placeholders(ir_model)
    except ValueError as e:
        raise InputError(f"cannot return the model as an onnx_ir.Model: {first_line(e)}; give output= instead") from e
    return ir_model
