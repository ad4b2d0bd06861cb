"""The pass registry and the one optimisation pipeline every route goes through.

* :data:`PASSES`: the CLI names of the passes, in their default order, built
  from each pass class's own declarations (``NAME``, ``DESCRIPTION``,
  ``OPTIONS``; see :mod:`passes.base`). Adding a pass is one line in
  :data:`_PASS_CLASSES`.
* :func:`optimize_model`: runs the passes (then the clean-up) on an IR model,
  with the rules every route shares (the opset is never lowered).
* :func:`optimize_file`: load (validated), optimise, save atomically, check
  with the ONNX checker and onnxruntime, report. The ``optimize`` command and
  ``passes.optimize(path, output=...)`` both call it.
* :func:`optimize`: the Python API for a path, a ``ModelProto`` or an
  ``onnx_ir.Model``, with the same validation and the same check.
"""

from __future__ import annotations

import logging
import os
import pathlib
from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any

# Only light modules at the top: ``--help`` and early errors need no more (see passes.registry).
# onnx, onnx_ir, the passes and the report are imported where they are used.
from passes import modelio  # light: it imports onnx and onnx_ir on first use
from passes.errors import CheckFailedError, InputError, first_line
from passes.lazy import lazy_module
from passes.options import Option
from passes.phases import Phases
from passes.registry import PassSpec, Registry
from passes.verify.gate import CheckOptions  # light: onnx on first use, onnxruntime in a child

if TYPE_CHECKING:
    import onnx
    import onnx_ir as ir

    from passes.modelio import validate as _validate
    from passes.report import PassRun, Report
else:
    onnx = lazy_module("onnx")
    ir = lazy_module("onnx_ir")
    _validate = lazy_module("passes.modelio.validate")
_report = lazy_module("passes.report")
_walk = lazy_module("passes.ir.walk")
_destinations = lazy_module("passes.modelio.destinations")
_gate = lazy_module("passes.verify.gate")
_fixpoint = lazy_module("passes.fixpoint")

__all__ = [
    "DEFAULT_FOLD_SIZE_LIMIT",
    "DEFAULT_TARGET_OPSET",
    "PASSES",
    "CheckOptions",
    "PassRun",
    "PassSpec",
    "build_pass_manager",
    "optimize",
    "optimize_file",
    "optimize_model",
    "pass_options",
    "select_passes",
]

logger = logging.getLogger(__name__)

# The passes in their default order, as "module:Class". One line per pass.
_PASS_CLASSES: tuple[str, ...] = (
    "passes.upgrade:UpgradeOpsetPass",
    "passes.fold:ConstantFoldingPass",
    "passes.simplify:SimplifyPass",
    "passes.decompose:DecomposeLogSumExpPass",
)

PASSES: MutableMapping[str, PassSpec] = Registry(_PASS_CLASSES)


def __getattr__(name: str) -> Any:
    """The constants and names that come from the passes, imported on first use."""
    if name == "DEFAULT_TARGET_OPSET":
        from passes.upgrade import MIN_TARGET_OPSET

        return MIN_TARGET_OPSET
    if name == "DEFAULT_FOLD_SIZE_LIMIT":
        from passes.fold import DEFAULT_SIZE_LIMIT

        return DEFAULT_SIZE_LIMIT
    if name == "PassRun":
        from passes.report import PassRun

        return PassRun
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def pass_options() -> list[Option]:
    """Every option the registered passes declare, once each, in pass order."""
    seen: dict[str, Option] = {}
    for spec in PASSES.values():
        for option in spec.options:
            seen.setdefault(option.name, option)
    return list(seen.values())


def _option_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """The declared options with ``values`` applied, validated.

    Raises:
        InputError: an unknown option or a value its declaration refuses.
    """
    declared = {o.name: o for o in pass_options()}
    unknown = sorted(set(values) - set(declared))
    if unknown:
        raise InputError(f"unknown option {unknown[0]!r} (options: {', '.join(declared) or 'none'})")
    result = {name: option.default for name, option in declared.items()}
    for name, value in values.items():
        option = declared[name]
        reason = option.check(value) if option.check is not None and value is not None else None
        if reason:
            raise InputError(f"{option.flag} {value}: {reason}")
        result[name] = value
    return result


def select_passes(passes: Iterable[str] | None = None, skip: Iterable[str] = ()) -> list[str]:
    """Validates pass names; returns the ones to run in the order given (default: all).

    Raises:
        InputError: an unknown pass name.
    """
    names = list(PASSES) if passes is None else [p for p in passes if p]
    skip = [s for s in skip if s]
    for name in [*names, *skip]:
        if name not in PASSES:
            known = ", ".join(PASSES) or "none"
            raise InputError(f"unknown pass {name!r} (available: {known})")
    return [n for n in names if n not in skip]


def _build(names: Sequence[str], values: Mapping[str, Any], cleanup: bool) -> list[tuple[str, ir.passes.PassBase]]:
    steps = [(name, PASSES[name].build(values)) for name in names]
    if cleanup:
        from passes.cleanup import CleanupPass

        steps.append(("cleanup", CleanupPass()))
    return steps


def build_pass_manager(
    passes: Iterable[str] | None = None, *, cleanup: bool = True, **options: Any
) -> ir.passes.PassManager:
    """An ``onnx_ir`` pass manager running the named passes, for composing with other passes."""
    steps = _build(select_passes(passes), _option_values(options), cleanup)
    return ir.passes.PassManager([p for _, p in steps], steps=1)


def _refuse_lower_target(model: ir.Model, names: Sequence[str], values: Mapping[str, Any]) -> None:
    target = values.get("target_opset")
    opset = _walk.default_opset(model.opset_imports)
    if "upgrade" in names and target is not None and opset is not None and target < opset:
        raise InputError(
            f"--target-opset {target} is lower than the model's opset {opset}; this tool never lowers an opset"
        )


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
        InputError: an unknown pass or option, or a target opset below the model's.
        OptimizeError: a pass refused the model (for example an upgrade without an adapter).
    """
    names = select_passes(passes)
    values = _option_values(options)
    _refuse_lower_target(model, names, values)
    return _fixpoint.run(_build(names, values, cleanup), model, progress)


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
        **options: Values of the passes' declared options.

    Returns:
        The report of the run.

    Raises:
        InputError: bad input or options.
        OptimizeError: a pass refused the model.
        CheckFailedError: the result is invalid or differs (``error.report`` holds the report).
    """
    check = check or CheckOptions()
    names = select_passes(passes, skip)
    values = _option_values(options)
    worker = _gate.start_worker(check)  # its imports overlap with the passes
    try:
        return _optimize_file(source, output, names, values, check, force, report_path, progress, warn,
                              on_commit, replace_data, worker)  # fmt: skip
    finally:
        if worker is not None:
            worker.close()


def _optimize_file(source: str | os.PathLike[str], output: str | os.PathLike[str], names: list[str],
                   values: dict[str, Any], check: CheckOptions, force: bool,
                   report_path: str | os.PathLike[str] | None, progress: Callable[[str], None] | None,
                   warn: Callable[[str], None], on_commit: Callable[[bool], None] | None,
                   replace_data: bool, worker: Any) -> Report:  # fmt: skip
    src, dst = pathlib.Path(source), pathlib.Path(output)
    phases = Phases(progress)
    with phases.phase("load", f"loading {src}"):
        model = modelio.load_model(src)
    _destinations.check_destinations(src, dst, report_path, model, replace_data)
    report = _report.Report(str(src), str(dst), _report.summarize(model))
    report.phases = phases.seconds
    with phases.phase("passes", None):
        report.passes = optimize_model(model, names, progress=progress, **values)
    report.notes.extend(modelio.model_notes(model))  # the load's lossless repairs, the passes' corrections
    report.after = _report.summarize(model)

    def rebuild(kept: Sequence[str], cleanup: bool) -> ir.Model:
        fresh = modelio.load_model(src)
        optimize_model(fresh, kept, cleanup=cleanup, **values)
        return fresh

    with modelio.staged_output(dst, replace_data=replace_data) as staged:
        with phases.phase("save", f"saving {dst}", modelio.weights_nbytes(model) or None, "B") as advance:
            staged_path = staged.save(model, progress=advance)
        _release(model)
        del model
        with phases.phase("check", "checking with onnxruntime" if check.enabled else "checking"):
            failure = _gate.verify(src, staged_path, check, report, warn, rebuild=rebuild, names=names, worker=worker)
        commit = failure is None or force
        if report_path is not None:
            # Staged with the output and renamed in the same commit, so that a report that
            # cannot be written leaves the output as it was; it says what the commit will do.
            report.written = commit
            staged.stage_file(report_path, report.write_json, f"--report {_destinations.shown(report_path)}")
        try:
            staged.commit(model=commit)
        finally:  # an interrupt may arrive as the commit completes
            report.written = staged.committed
            if on_commit and commit:
                on_commit(staged.committed)
    if failure is not None:
        first, *rest = failure.split("\n")  # the located difference follows the error's one line
        error = CheckFailedError("\n".join([first + ("" if report.written else f"; {dst} not written"), *rest]))
        error.report = report  # type: ignore[attr-defined]
        raise error
    return report


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
    names = select_passes(passes, skip)
    values = _option_values(options)
    checking = _check_options(check)
    if isinstance(model, (str, os.PathLike)):
        if output is not None:
            optimize_file(model, output, passes=names, check=checking, **values)
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
        modelio.validate_proto(original)
        ir_model = model
    else:
        raise TypeError(
            f"optimize() takes a path, bytes, an onnx.ModelProto or an onnx_ir.Model, not {type(model).__name__}"
        )
    if output is not None:
        raise TypeError("optimize(): output= is only for a path input")
    worker = _gate.start_worker(checking)  # its imports overlap with the passes
    try:
        return _optimize_in_memory(model, original, ir_model, names, values, checking, worker)
    finally:
        if worker is not None:
            worker.close()


def _optimize_in_memory(model: Any, original: Any, ir_model: ir.Model, names: list[str], values: dict[str, Any],
                        checking: CheckOptions, worker: Any) -> Any:  # fmt: skip
    optimize_model(ir_model, names, **values)
    proto = modelio.model_to_proto(ir_model)

    def rebuild(kept: Sequence[str], cleanup: bool) -> ir.Model:
        if isinstance(original, pathlib.Path):
            fresh = modelio.load_model(original)
        else:
            source = modelio.proto_from_bytes(original) if isinstance(original, bytes) else original
            copy = onnx.ModelProto()
            copy.CopyFrom(source)
            fresh = modelio.model_from_proto(copy)
        optimize_model(fresh, kept, cleanup=cleanup, **values)
        return fresh

    report = _report.Report("", None, _report.summarize(ir_model))
    report.notes.extend(modelio.model_notes(ir_model))  # the load's lossless repairs, the passes' corrections
    failure = _gate.verify(original, proto, checking, report, logger.warning, rebuild=rebuild, names=names,
                      worker=worker)  # fmt: skip
    for note in [*report.notes, *(report.check.notes if report.check else [])]:
        logger.warning("%s", note)
    if failure is not None:
        raise CheckFailedError(failure)
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
