"""The pass registry (CLI names → passes) and the optimisation pipeline."""

from __future__ import annotations

import dataclasses
import logging
import os
import pathlib
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import onnx
import onnx_ir as ir

from passes import modelio
from passes.cleanup import CleanupPass
from passes.decompose import DecomposeLogSumExpPass
from passes.fold import ConstantFoldingPass
from passes.upgrade import UpgradeOpsetPass
from passes.errors import InputError, OptimizeError

__all__ = [
    "DEFAULT_TARGET_OPSET",
    "DEFAULT_FOLD_SIZE_LIMIT",
    "PASSES",
    "Options",
    "PassRun",
    "PassSpec",
    "build_pass_manager",
    "optimize",
    "run_pipeline",
    "select_passes",
]

logger = logging.getLogger(__name__)

DEFAULT_TARGET_OPSET = 18
DEFAULT_FOLD_SIZE_LIMIT = 1 << 20


@dataclasses.dataclass(frozen=True)
class Options:
    """Options shared by the passes.

    Attributes:
        target_opset: The default-domain opset the upgrade pass converts to.
        fold_size_limit: Constant folding only creates a constant larger than
            this many bytes when the model does not grow by it.
    """

    target_opset: int = DEFAULT_TARGET_OPSET
    fold_size_limit: int = DEFAULT_FOLD_SIZE_LIMIT


@dataclasses.dataclass(frozen=True)
class PassSpec:
    """A pass the CLI can run: its name, a one-line description, and how to build it."""

    name: str
    description: str
    build: Callable[[Options], ir.passes.PassBase]


def _registry() -> dict[str, PassSpec]:
    """The passes in their default order. A pass not written yet is simply absent."""
    specs: list[PassSpec] = [
        PassSpec(
            "upgrade",
            "convert the default-domain opset to --target-opset (Reduce axes become inputs)",
            lambda options: UpgradeOpsetPass(options.target_opset),
        ),
        PassSpec(
            "fold",
            "constant folding: evaluate nodes with constant inputs with refimpl",
            lambda options: ConstantFoldingPass(options.fold_size_limit),
        ),
        PassSpec(
            "decompose",
            "rewrite ReduceLogSumExp into max-shifted primitive ops (no float64)",
            lambda options: DecomposeLogSumExpPass(),
        ),
    ]
    return {spec.name: spec for spec in specs}


PASSES: dict[str, PassSpec] = _registry()


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


def build_pass_manager(
    passes: Iterable[str] | None = None, options: Options | None = None, *, cleanup: bool = True
) -> ir.passes.PassManager:
    """An ``onnx_ir`` pass manager running the named passes, for composing with other passes."""
    options = options or Options()
    built = [PASSES[name].build(options) for name in select_passes(passes)]
    if cleanup:
        built.append(CleanupPass())
    return ir.passes.PassManager(built, steps=1)


@dataclasses.dataclass
class PassRun:
    """What one pass did: its time, whether it changed the model, and its own statistics."""

    name: str
    seconds: float
    modified: bool
    stats: dict[str, Any] = dataclasses.field(default_factory=dict)


def _root_cause(error: BaseException) -> BaseException:
    """The innermost :class:`OptimizeError` behind onnx_ir's PassError wrapping, if any."""
    seen = error
    while seen is not None:
        if isinstance(seen, OptimizeError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return error


def run_pipeline(
    model: ir.Model,
    passes: Sequence[str],
    options: Options | None = None,
    *,
    cleanup: bool = True,
    progress: Callable[[str], None] | None = None,
) -> list[PassRun]:
    """Runs the named passes in order (then the clean-up) on ``model`` in place.

    Raises:
        OptimizeError: a pass refused the model (for example an upgrade without an adapter).
    """
    options = options or Options()
    runs: list[PassRun] = []
    steps: list[tuple[str, ir.passes.PassBase]] = [(n, PASSES[n].build(options)) for n in passes]
    if cleanup:
        steps.append(("cleanup", CleanupPass()))
    for name, pass_ in steps:
        if progress:
            progress(f"running {name}")
        start = time.perf_counter()
        try:
            result = pass_(model)
        except ir.passes.PassError as e:
            cause = _root_cause(e)
            if isinstance(cause, OptimizeError):
                raise cause from e
            raise
        seconds = time.perf_counter() - start
        stats = dict(getattr(pass_, "stats", None) or {})
        runs.append(PassRun(name, seconds, bool(result.modified), stats))
        logger.info("pass %s: %.3f s, modified=%s", name, seconds, result.modified)
    return runs


def optimize(
    model: Any,
    *,
    passes: Iterable[str] | None = None,
    skip: Iterable[str] = (),
    target_opset: int = DEFAULT_TARGET_OPSET,
    fold_size_limit: int = DEFAULT_FOLD_SIZE_LIMIT,
    output: str | os.PathLike[str] | None = None,
) -> Any:
    """Optimises a model with the named passes (default: all) and the clean-up.

    Args:
        model: A path to an ``.onnx`` file, an ``onnx.ModelProto`` or an ``onnx_ir.Model``.
            An ``onnx_ir.Model`` is changed in place; the other forms are not changed.
        passes: Pass names to run, in order (see ``PASSES``). None runs all of them.
        skip: Pass names not to run.
        target_opset: Opset for the upgrade pass.
        fold_size_limit: Size limit in bytes for constants created by folding.
        output: With a path input, write the result there atomically and return its path.

    Returns:
        The same kind of object as ``model``: an ``onnx_ir.Model`` for an
        ``onnx_ir.Model``, an ``onnx.ModelProto`` for a ``ModelProto``; for a path,
        the output path if ``output`` is given, else the optimised ``onnx_ir.Model``.

    Raises:
        InputError: bad input or options.
        OptimizeError: a pass refused the model.
    """
    names = select_passes(passes, skip)
    options = Options(target_opset=target_opset, fold_size_limit=fold_size_limit)
    if isinstance(model, (str, os.PathLike)):
        ir_model = modelio.load_model(model)
        run_pipeline(ir_model, names, options)
        if output is None:
            return ir_model
        with modelio.staged_output(output) as staged:
            staged.save(ir_model)
            staged.commit()
        return pathlib.Path(output)
    if isinstance(model, onnx.ModelProto):
        copy = onnx.ModelProto()
        copy.CopyFrom(model)  # model_from_proto edits the proto it is given
        ir_model = modelio.model_from_proto(copy)
        run_pipeline(ir_model, names, options)
        return modelio.model_to_proto(ir_model)
    if isinstance(model, ir.Model):
        run_pipeline(model, names, options)
        return model
    raise TypeError(f"optimize() takes a path, an onnx.ModelProto or an onnx_ir.Model, not {type(model).__name__}")
