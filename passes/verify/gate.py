"""The verification gate every route passes: the ONNX checker's verdict, then the onnxruntime check.

* :class:`CheckOptions`: how the optimised model is checked.
* :class:`Gate`: its ``verify`` says whether the optimised model is refused
  (invalid, or different from the original in onnxruntime) in a :class:`Verdict`;
  a model that fails the checker only where the original already did is not
  blamed on the passes; after a mismatch the first differing node is located,
  and ``recheck`` compares further candidates (the pipeline uses it to find the
  pass that brought the difference). It knows nothing of passes or reports.
* :func:`start_worker`: the check's child process, started early; :func:`start_early`: the
  original's side of the check on it, while the passes run (:mod:`passes.verify.early`).

Importing this module is cheap: onnx is imported on first use, onnxruntime
only in the check's child process.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import logging
import os
import pathlib
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from passes import modelio  # light: it imports onnx and onnx_ir on first use
from passes.errors import InputError, first_line
from passes.lazy import lazy_module
from passes.limits import PROTOBUF_LIMIT
from passes.verify.defaults import DEFAULT_TIMEOUT

if TYPE_CHECKING:
    import onnx

    from passes.modelio import validate as _validate
else:
    onnx = lazy_module("onnx")
    _validate = lazy_module("passes.modelio.validate")
_declared = lazy_module("passes.modelio.declared")
_detach = lazy_module("passes.modelio.detach")

__all__ = ["CheckOptions", "Gate", "Verdict", "current_check", "start_early", "start_worker"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class CheckOptions:
    """How the optimised model is checked against the original (see :func:`passes.check`).

    Attributes:
        enabled: Run onnxruntime on both models and compare; the ONNX checker runs regardless.
        inputs: Input arrays by name (others are generated).
        inputs_source: Where ``inputs`` came from, for messages (``--inputs FILE``).
        inputs_file: An ``.npz`` of input arrays by name, read bounded (``--inputs FILE``).
        dims: Sizes of named dynamic dimensions for generated inputs: a size, or the sizes the check
            tries it at (``--dim NAME=A,B,...``: the first for the chosen inputs, the others for the
            larger sets, see :mod:`passes.verify.sets`).
        shapes: Static shapes of inputs by name (``--input-shape``): generated inputs take them.
        seed: Seed of generated inputs.
        rtol: Relative tolerance for float outputs (default per dtype).
        atol: Absolute tolerance for float outputs (default per dtype).
        required: A check that could not run is a failure (``--require-check``).
        timeout: Seconds onnxruntime may take (``--check-timeout``); the locator gets as much again.
        memory_limit: Address-space bound of the check's process in bytes (None: 3/4 of
            physical memory; 0: none).
        locate: After a mismatch, find the first differing node and the pass that caused it.
        precision: The half type the optimised model computes in (``--precision``: ``"float16"``,
            ``"bfloat16"``), set by the pipeline when the precision pass converted the model: its
            tolerance and other standard-normal sets instead of float32's edge values (see
            :class:`passes.verify.check.Checker`).
        precision_tolerance: ``--precision-tolerance`` (rtol, atol or None): the half type's
            tolerance instead of its default; set by the pipeline with ``precision``.
        repro: ``--repro DIR``: after a difference, the smallest reproduction is written there
            (:mod:`passes.verify.repro`).
        unfused_fallback: When the check refuses a model that simplify fused, check and write the same
            run without the fusions instead of failing (see :func:`passes.pipeline_check.unfused`);
            False: fail (``--no-unfused-fallback``, to look into the fusion's difference).
        command: The command line that ran, for the reproduction's README ("" for the API).
        static: The run's static shapes as flags (``--input-shape x:1,32,64``; "" for none), set by
            the pipeline with ``shapes`` and the fixed ``dims``: where the original does not run
            in onnxruntime at them but runs without them, the run is refused (exit 2, nothing
            written) with onnxruntime's message.
        free_dims: With ``static``: the caller's own ``dims`` (``--dim``), the sizes the original
            is tried at without the static shapes.
    """

    enabled: bool = True
    inputs: Mapping[str, Any] | None = None
    inputs_source: str = ""
    inputs_file: str | os.PathLike[str] | None = None
    dims: Mapping[str, int | Sequence[int]] = dataclasses.field(default_factory=dict)
    shapes: Mapping[str, Sequence[int]] = dataclasses.field(default_factory=dict)
    seed: int = 0
    rtol: float | None = None
    atol: float | None = None
    required: bool = False
    timeout: float = DEFAULT_TIMEOUT
    memory_limit: int | None = None
    locate: bool = True
    precision: str | None = None
    precision_tolerance: tuple[float, float | None] | None = None
    repro: str | os.PathLike[str] | None = None
    unfused_fallback: bool = True
    command: str = ""
    static: str = ""
    free_dims: Mapping[str, int | Sequence[int]] = dataclasses.field(default_factory=dict)


#: The check options of the run under way (set by the pipeline while the passes run): a pass that checks
#: its own candidates (``--precision``'s search for float32 islands) uses the same inputs, sizes and seed.
current_check: contextvars.ContextVar[CheckOptions | None] = contextvars.ContextVar("passes_check_options",
                                                                                    default=None)
def _validity(model: Any, *, with_data: bool = False) -> tuple[str | None, list[_validate.ShapeConflict]]:
    """The load-time validation of ``model`` (a path or a ``ModelProto``): why it is refused, or
    None, and the declared shapes its graph contradicts (which loading accepts).

    With ``with_data``, a file's external tensors are read into the model first (when they
    fit in memory), so that inference also sees their values, as it does in a result where
    small tensors are saved inline.
    """
    path = pathlib.Path(model) if isinstance(model, (str, os.PathLike)) else None
    whole = None
    try:
        if path is not None:
            proto, read_whole = modelio.read_graph(path)
            folder = str(path.parent)
            if with_data and 0 < _external_bytes(proto) < PROTOBUF_LIMIT:
                path = None  # validated in memory, like a model without external data
            if read_whole is not None:  # a view: the whole model is read alike if the view misleads the checker
                whole = lambda: _prepared(read_whole(), folder if path is None else None)
        elif isinstance(model, bytes):
            proto = modelio.proto_from_bytes(model)
            folder = None
        else:
            proto = onnx.ModelProto()
            proto.CopyFrom(model)
            folder = None
        proto = _prepared(proto, folder if path is None else None)
        external = _validate.check_contents(proto, path.parent if path else pathlib.Path.cwd())
        return None, modelio.check_view(proto, path, external, whole, log=False)
    except InputError as e:
        return str(e), []
    except (OSError, ValueError) as e:
        return first_line(e), []


def _prepared(proto: onnx.ModelProto, data_folder: str | None) -> onnx.ModelProto:
    """``proto`` as load reads it (IR 3 as IR 4), with its external data from ``data_folder`` if given."""
    if data_folder is not None:
        onnx.external_data_helper.load_external_data_for_model(proto, data_folder)
    if 0 < proto.ir_version < 4:
        proto.ir_version = 4  # as load does
    return proto


def _passes_strict_checker(staged: Any) -> bool:
    """The common case, without reading the result back into Python: a result saved without
    external data passes the checker with strict inference, run on its file. (With external
    data, or when this fails, :func:`_validity` reads the graph and decides.)"""
    if not isinstance(staged, (str, os.PathLike)):
        return False
    path = pathlib.Path(staged)
    if path.with_name(path.name + ".data").exists():
        return False  # strict inference needs the external tensors out of the way (see _validity)
    if path.stat().st_size >= _detach.MIN_FILE:
        return False  # its large attributes would be parsed in full: _validity reads them as markers
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError, RuntimeError, ValueError):
        return False
    return True


def _external_bytes(proto: onnx.ModelProto) -> int:
    """Bytes of the main graph's external initializers (as their ``length`` entries declare)."""
    total = 0
    for tensor in proto.graph.initializer:
        if onnx.external_data_helper.uses_external_data(tensor):
            lengths = [e.value for e in tensor.external_data if e.key == "length" and e.value.isdigit()]
            total += int(lengths[0]) if lengths else 0
    return total


def _declared_shapes(model: Any) -> dict[str, tuple[Any, ...]]:
    """The shapes the model declares for its outputs and ``value_info`` entries, by name."""
    if isinstance(model, (str, os.PathLike)):
        proto, _ = modelio.read_graph(model)
    elif isinstance(model, bytes):
        proto = modelio.proto_from_bytes(model)
    else:
        proto = model
    shapes = {}
    for info in [*proto.graph.value_info, *proto.graph.output]:
        dims = _declared.declared_dims(info.type)  # the same reading as the conflicts'
        if dims is not None:
            shapes[info.name] = dims
    return shapes


def _checker_verdict(original: Any, staged: Any, notes: list[str]) -> str | None:
    """The ONNX checker (the load-time validation) on the optimised model; why it is refused, or None.

    What the original already had is not blamed on the passes: a failure the
    original shows too (with its external tensors read, as the result may hold
    them inline), or a declared shape the original declares the same way
    that the graph contradicts (inference sees through a folded value that it
    could not see through before). Those become ``notes``.
    """
    if _passes_strict_checker(staged):
        return None
    invalid, conflicts = _validity(staged)
    if invalid is not None:
        if invalid in (_validity(original)[0], _validity(original, with_data=True)[0]):
            notes.append(f"the optimised model fails the ONNX checker as the original does: {invalid}")
            return None
        return f"the optimised model is invalid: {invalid}"
    if not conflicts:
        return None
    declared = _declared_shapes(original)
    for conflict in conflicts:
        if declared.get(conflict.name) != conflict.declared:
            return f"the optimised model is invalid: {conflict.text()} (a declaration the passes wrote)"
        notes.append(
            f"the ONNX checker's strict inference now sees that {conflict.text()}; the original model "
            "declares it so (not the passes' doing); kept as declared"
        )
    return None


@dataclasses.dataclass
class Verdict:
    """What the gate says of an optimised model.

    Attributes:
        failure: Why it is refused (invalid, different in onnxruntime, or a required check
            that could not run), or None.
        notes: What the caller should know although the model is accepted (a checker failure
            the original shares, a declared shape the original already contradicts).
        result: The onnxruntime check's result (None when it did not run).
        invalid: The ONNX checker refused the optimised model (``failure`` says why).
    """

    failure: str | None = None
    notes: list[str] = dataclasses.field(default_factory=list)
    result: Any = None
    invalid: bool = False

    @property
    def differs(self) -> bool:
        """The check ran and found a difference (the caller may look for the pass that brought it)."""
        return self.result is not None and self.result.checked and not self.result.ok


class Gate:
    """The ONNX checker and the onnxruntime check of optimised models against one original.

    A context manager: the check's process and the original's outputs are kept
    until it closes, so that :meth:`recheck` can compare more candidates (the
    pipeline's search for the pass that brought a difference) without running
    the original again.
    """

    def __init__(self, original: Any, check: CheckOptions, warn: Callable[[str], None], worker: Any = None,
                 *, rounding: bool = True, early: Any = None, handoff: Any = None) -> None:  # fmt: skip
        """``rounding``: whether the optimised model may round differently from the original (a
        fusion or a decomposition ran); False holds every input set to the element-wise tolerance.
        ``early``: the original's side of the check already under way on ``worker``
        (:class:`passes.verify.early.Early`, see :func:`start_early`). ``handoff``: the run's
        :class:`passes.verify.handoff.Handoff`, whose kept checker (the precision search's) is reused if it fits."""
        self.original, self.check, self.warn, self.worker = original, check, warn, worker
        self.rounding, self.early, self.handoff = rounding, early, handoff
        self._checker: Any = None
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> Gate:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    @property
    def folder(self) -> pathlib.Path:
        """A private temporary folder, removed when the gate closes (only once the check has run)."""
        assert self._checker is not None and self._checker.folder is not None
        return pathlib.Path(self._checker.folder)

    def verify(self, staged: Any) -> Verdict:
        """The ONNX checker, then (if enabled) the onnxruntime comparison; after a mismatch, the
        first differing node is located.

        Raises:
            InputError: the given ``--inputs`` do not fit the model.
        """
        verdict = Verdict()
        check = self.check
        # The early start compares while the ONNX checker runs here (its result dropped if it refuses).
        ahead = self.early is not None and check.enabled and self.early.compare(staged, check, self.rounding)
        verdict.failure = _checker_verdict(self.original, staged, verdict.notes)
        verdict.invalid = verdict.failure is not None
        if verdict.failure is not None or not check.enabled:
            if self.early is not None:
                self.early.close()
            return verdict
        from passes.verify import check as check_module  # the child process only when checking
        from passes.verify.early import new_checker

        handed = self.handoff.take(check) if self.handoff is not None and not ahead else None
        if ahead:
            self._checker, result = self.early.result()
            self._stack.push(self._checker)  # entered by the early start; exited with the gate
        elif handed is not None and handed.reuse():  # the original's inputs and runs as the search measured them
            self._checker = self._stack.push(handed)
            handed.rounding = self.rounding
            handed.read_values_of(None)  # the locator reads the original again
            result = handed.check(staged)
        else:
            if handed is not None:
                handed.__exit__(None, None, None)  # (an early start that was dropped stopped its child: a new one)
            worker = self.worker if self.early is None else None
            self._checker = self._stack.enter_context(new_checker(self.original, check, worker, self.rounding))
            result = self._checker.check(staged)
        verdict.result = result
        if check.locate and result.checked and not result.ok:
            start = time.perf_counter()
            found = self._checker.locate(staged) if not result.error else check_module.FirstDifference()
            found.seconds = round(time.perf_counter() - start, 3)
            result.first_difference = found
            result.seconds["locate"] = found.seconds
        if result.shapes_refused is not None:
            message = " ".join(result.shapes_refused.split())
            raise InputError(f"{check.static}: the model cannot run at these shapes (onnxruntime: "
                             f"{message if len(message) <= 300 else message[:297] + '...'})")
        if result.inputs_rejected:
            source = check.inputs_source or (str(check.inputs_file) if check.inputs_file else "(given)")
            raise InputError(f"--inputs {source}: {result.skipped}")
        if not result.checked:
            if check.required:
                verdict.failure = f"{result.summary()} (--require-check)"
            elif self._checker.original_loaded and (problem := self._default_load(staged)) is not None:
                # the original loads but does not run on the inputs tried: the optimised model must load too
                verdict.failure = f"the optimised model: {problem}, where the original loads ({result.summary()})"
            else:
                self.warn(result.summary())
            return verdict
        if not result.ok:
            verdict.failure = result.summary()
        elif check.precision is not None and (problem := self._default_load(staged)) is not None:
            # half-type graphs meet onnxruntime's optimisers (default_load)
            verdict.failure = (f"--precision: the {check.precision} model: {problem}, where the original loads; "
                               "with them off, as the check runs, it loads and matches (--force writes it)")
        return verdict

    def _default_load(self, staged: Any) -> str | None:
        """Why onnxruntime cannot build a default session (``ORT_ENABLE_ALL``) for ``staged`` where it
        can for the original, or None (:mod:`passes.verify.default_load`; in the check's child, done)."""
        from passes.verify import default_load, files

        worker, deadline = self._checker.worker, time.monotonic() + self.check.timeout
        problem = default_load.failure(worker, files.runnable(staged, self.folder, "default-load"), deadline)
        original = files.runnable(self.original, self.folder, "default-load-original")
        if problem is None or default_load.failure(worker, original, deadline) is not None:
            return None
        return problem

    def reproduce(self, staged: Any, verdict: Verdict, reads: Sequence[pathlib.Path] = (),
                  writes: Sequence[pathlib.Path] = ()) -> None:  # fmt: skip
        """With ``--repro DIR``, after a difference: the smallest reproduction written to DIR (which
        must hold none of ``reads`` and ``writes``, the run's files); the result's ``repro`` says
        what was done, and the failure says it too."""
        if self.check.repro is None or not verdict.differs:
            return
        from passes.verify import repro

        verdict.result.repro = repro.reproduce(self._checker, staged, verdict.result, self.check.repro,
                                               command=self.check.command, reads=reads, writes=writes)  # fmt: skip
        verdict.failure = verdict.result.summary()

    def verify_again(self, candidate: Any, *, rounding: bool) -> Verdict:
        """Another candidate checked as :meth:`verify` checked the first: the ONNX checker, then the
        comparison on the same inputs and sets, with ``rounding`` saying whether this candidate may
        round differently (see :meth:`__init__`); follows a verify that ran the comparison."""
        assert self._checker is not None, "verify_again follows a verify that ran the check"
        verdict = Verdict()
        verdict.failure = _checker_verdict(self.original, candidate, verdict.notes)
        verdict.invalid = verdict.failure is not None
        if verdict.failure is not None:
            return verdict
        before, self._checker.rounding = self._checker.rounding, rounding
        try:
            verdict.result = self._checker.recheck(candidate)
        finally:
            self._checker.rounding = before
        if not (verdict.result.checked and verdict.result.ok):
            verdict.failure = verdict.result.summary()
        return verdict

    def accepts(self, candidate: Any) -> bool:
        """Whether the ONNX checker accepts ``candidate`` as :meth:`verify` does (no comparison)."""
        return _checker_verdict(self.original, candidate, []) is None

    def recheck(self, candidate: Any) -> bool | None:
        """Whether ``candidate`` computes what the original does (None: the check could not say)."""
        assert self._checker is not None, "recheck follows a verify that ran the check"
        result = self._checker.recheck(candidate)
        return result.ok if result.checked else None


def start_early(original: pathlib.Path, check: CheckOptions, worker: Any, nbytes: int) -> Any:
    """The original's side of the check started now on ``worker``, while the passes run
    (:class:`passes.verify.early.Early`; give it to :class:`Gate`, close it whatever happens);
    None when there is no check, no child, one core only (the original's runs would be timed
    against the passes', and the larger sets' budget reads those times), or the original's files
    (``nbytes``) are over :data:`passes.verify.early.EARLY_BYTES`."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if not check.enabled or worker is None or cores < 2:
        return None
    from passes.verify import early

    if nbytes > early.EARLY_BYTES or not worker.take():  # (the thread holds it while it works)
        return None
    try:
        return early.Early(original, check, worker)
    except BaseException:
        worker.give_back()
        raise


def start_worker(check: CheckOptions) -> Any:
    """The check's child process, started now (None when there is no check)."""
    if not check.enabled:
        return None
    from passes.verify.child import Worker, current, default_memory_limit

    limit = default_memory_limit() if check.memory_limit is None else check.memory_limit
    try:
        worker = Worker(limit).start()
    except OSError:
        return None  # the check starts its own and reports why it cannot
    current.set(worker)  # fold's confirmation uses it too (passes.fold.confirm)
    return worker
