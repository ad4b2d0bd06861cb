"""The onnxruntime before/after check.

Runs the original and the optimised model in onnxruntime (CPU, every graph
optimisation disabled so that onnxruntime's own rewrites cannot hide a bug) on
the same inputs and compares every output by name: same dtype and shape,
integers, booleans and strings exactly equal, floats equal within the
tolerance of the lowest-precision float type the output depends on, with NaN in
the same places, infinities equal and, where both are zero, the same sign of
zero.

The sessions run in a child process (:mod:`passes.verify.worker`), with a time
limit and a memory bound, so that a crash or a hang in onnxruntime becomes a
check that did not run instead of taking the optimiser down. A check that did
not run says so (``CheckResult.checked`` is False) and why.

Generated inputs get sizes that make the original run: for each dynamic
dimension a short list of plausible sizes (by its name or position, see
:mod:`passes.verify.plan`) is tried, smallest first.

Both models are then also compared on more sets of inputs (:mod:`passes.verify.sets`:
every dynamic dimension at a larger size within a budget, edge values, NaN and
infinities, 0-sized dimensions). An output is reported on the first set where it
differs, unless the original disagrees with itself there (:mod:`passes.verify.verdict`).

After a mismatch, :meth:`Checker.locate` finds the first node of the original
whose output differs (:mod:`passes.verify.locate`).
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from passes.errors import first_line as _first_line
from passes.verify import files as _files, plan, sets, verdict, values as _values
from passes.verify.child import Worker, WorkerCrashed, WorkerError, WorkerTimeout, default_memory_limit
from passes.verify.ort_io import make_inputs
from passes.verify.original import OriginalSide
from passes.verify.defaults import DEFAULT_DIM, DEFAULT_TIMEOUT, TOLERANCES
from passes.verify.result import CheckResult, FirstDifference, InputsUsed, OutputComparison

__all__ = [
    "DEFAULT_DIM",
    "DEFAULT_TIMEOUT",
    "TOLERANCES",
    "CheckResult",
    "Checker",
    "OutputComparison",
    "check",
    "make_inputs",
]



class Checker(OriginalSide):
    """One check: the original's inputs and outputs, kept in a child process for reuse.

    Used as a context manager; :meth:`check` first, then (after a failure)
    :meth:`locate` and :meth:`recheck` of other candidate models on the same
    inputs. The child is killed on exit, whatever the reason.

    Args:
        original: The reference model: a path, serialized bytes, an ``onnx.ModelProto``
            or an ``onnx_ir.Model``.
        inputs: Input arrays by name; missing ones are generated.
        inputs_file: An ``.npz`` of input arrays by name (read bounded, see :mod:`passes.verify.npz`).
        dims: Sizes of named dynamic dimensions for generated inputs: a size, or a list of sizes
            (``--dim NAME=A,B,...``: the first for the chosen inputs, the others for larger sets).
        shapes: Static shapes of inputs by name (``--input-shape``): generated inputs take them,
            and the names of their dims take their sizes.
        seed: Seed of the generated inputs.
        rtol: Relative tolerance for float outputs (default: from the dtype, see :data:`TOLERANCES`).
        atol: Absolute tolerance for float outputs (default: from the dtype).
        timeout: Seconds the onnxruntime part may take (the locator gets as much again).
        memory_limit: The child's address-space bound in bytes; None: 3/4 of physical memory; 0: none.
        worker: A child already started (see :meth:`Worker.start`) to use instead of a new one;
            the checker closes it on exit like its own, unless ``keep_worker``.
        keep_worker: ``worker`` is lent (the run's check child, to the precision search): on exit
            the child is left running for its owner (but killed on an error or an interrupt).
        rounding: Whether the optimised models may round differently (see :func:`check`).
        precision: The half type an optimised model computes in (``"float16"``, ``"bfloat16"``:
            ``--precision``): float outputs are compared at that type's tolerance (at least), and
            the sets after the seeded standard-normal one are two more standard-normal sets
            (other seeds), a larger set with sequence-like dims long (see :mod:`passes.verify.sets`)
            and the 0-sized dimensions, not float32's edge values (1e30, 3e38 and
            float32 subnormals are outside the half type's range: a half model is not asked to
            hold them). An optimised model whose graph inputs (outputs) are of that type where the
            original's are float32 (``--precision-io``) is fed the same inputs rounded to it (as
            numpy's ``astype`` rounds), and its outputs are widened to float32 to be compared.
        precision_tolerance: ``--precision-tolerance``: (rtol, atol or None) instead of the half
            type's default tolerance (:func:`passes.verify.defaults.default_tolerance`).
        free_dims: With static shapes declared (``--input-shape``, ``--fix-dim``: ``shapes`` and
            ``dims`` hold them), the caller's own ``--dim`` sizes: when the original does not run
            on generated inputs at the static shapes, it is run once without them (these sizes,
            the others planned); if it runs there, the shapes are what fails and
            ``CheckResult.shapes_refused`` holds onnxruntime's message. A model onnxruntime cannot
            load (a custom op) or run at any size is not the request's fault.
    """

    def __init__(
        self,
        original: Any,
        *,
        inputs: Mapping[str, Any] | None = None,
        inputs_file: str | os.PathLike[str] | None = None,
        dims: Mapping[str, int | Sequence[int]] | None = None,
        shapes: Mapping[str, Sequence[int]] | None = None,
        seed: int = 0,
        rtol: float | None = None,
        atol: float | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        memory_limit: int | None = None,
        worker: Worker | None = None,
        rounding: bool = False,
        precision: str | None = None,
        precision_tolerance: tuple[float, float | None] | None = None,
        free_dims: Mapping[str, int | Sequence[int]] | None = None,
        keep_worker: bool = False,
    ) -> None:
        self.original = original
        self.keep_worker = keep_worker and worker is not None
        self.free_dims = None if free_dims is None else dict(free_dims)
        self.rounding = rounding
        self.precision = precision
        self.precision_tolerance = precision_tolerance
        self.inputs = dict(inputs or {})
        self.inputs_file = os.fspath(inputs_file) if inputs_file is not None else None
        lists = {k: [int(v)] if isinstance(v, int) else [int(s) for s in v] for k, v in (dims or {}).items()}
        self.dims = {k: v[0] for k, v in lists.items() if v}
        self.dim_lists = {k: v for k, v in lists.items() if len(v) > 1}
        self.shapes = dict(shapes or {})
        self.seed = seed
        self.rtol, self.atol = rtol, atol
        self.timeout = DEFAULT_TIMEOUT if timeout is None else float(timeout)
        self.memory_limit = default_memory_limit() if memory_limit is None else int(memory_limit)
        self.folder: pathlib.Path | None = None
        self.worker: Worker | None = worker
        self._prepare: dict[str, Any] | None = None
        self._original: CheckResult | tuple[Any, ...] | None = None  # what start() found, for check()
        self._side: tuple[Any, ...] | None = None  # what the first check found of the original (reuse())
        self._source: tuple[Any, ...] | None = None  # the original's path and graph (read_values_of())
        self.original_seconds = 0.0  #: what :meth:`start` took (the check's time limit counts it)
        self._prepared = False
        self._tolerances: dict[str, tuple[float, float]] = {}
        self._sets: sets.SetRunner | None = None  # the sets after the chosen one that the original runs
        self._records: list[dict[str, Any]] = []
        self._last_sets: list[dict[str, Any]] = []  # the sets, with the last comparison's verdicts
        self._noise: dict[tuple[str | None, str], float | None] = {}  # (set, output): the original's own noise
        #: The first set of inputs where an output differs, after a comparison (None: none).
        self.failing_set: str | None = None
        #: The outputs that differ after a comparison (the locator looks only upstream of them).
        self.failing_outputs: list[str] = []
        self._sources: dict[str, tuple[str, str]] = {}  # output -> (dtype, value) that chose its tolerance
        #: The locator's last comparison of every value both models name (``--repro`` starts from it).
        self.located_values: dict[str, Any] | None = None
        self.original_path: pathlib.Path | None = None
        self.original_proto: onnx.ModelProto | None = None
        if self.inputs and self.inputs_file is not None:
            raise ValueError("give inputs or inputs_file, not both")

    def __enter__(self) -> Checker:
        self.folder = pathlib.Path(tempfile.mkdtemp(prefix="optimize-check-"))
        if self.worker is None:
            self.worker = Worker(self.memory_limit)
        self._sets = sets.SetRunner(self.worker, self.timeout)
        try:
            self.worker.start()  # its imports overlap with reading the original here
        except OSError:
            pass  # the first request says why
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            # A lent child is left running, but for an error or an interrupt (a request may be under way).
            if self.worker is not None and (not self.keep_worker or exc_type is not None):
                self.worker.close()
        finally:
            if self.folder is not None:
                shutil.rmtree(self.folder, ignore_errors=True)

    # --- the check ---------------------------------------------------------------------------

    def check(self, optimized: Any) -> CheckResult:
        """Runs the original (choosing its inputs) unless :meth:`start` did, then ``optimized``; compares."""
        assert self.folder is not None and self.worker is not None, "use Checker as a context manager"
        start = time.perf_counter()
        original, self._original = self._original, None  # (a later check() chooses its inputs again)
        if original is None:
            deadline = self._deadline()
            original = self._original_side(deadline)
        else:  # the time limit is the whole check's: what the original's side took is spent
            deadline = time.monotonic() + max(0.0, self.timeout - self.original_seconds)
        if not isinstance(original, CheckResult):
            self._side = original
        result = original if isinstance(original, CheckResult) else self._check(optimized, deadline, original)
        result.seconds["check"] = round(time.perf_counter() - start, 3)
        return result

    def _check(self, optimized: Any, deadline: float, original: tuple[Any, ...]) -> CheckResult:
        specs, given_names, chosen, prepared = original
        self._last_sets = [dict(r) for r in self._records]
        result = self._compare(optimized, deadline)
        result.inputs = InputsUsed(
            given=sorted(given_names), generated=list(chosen["inputs"]), seed=self.seed, dims=chosen["dims"],
            shapes=prepared["shapes"], tries=prepared["try"], attempts=prepared["attempts"], sets=self._last_sets,
            sizes=plan.sizes_checked(specs, prepared["shapes"], self._records),
        )  # fmt: skip
        declared = plan.declared_output_shapes(self.original_proto)
        result.notes.extend(verdict.declaration_notes(declared, prepared["outputs"]))
        result.notes.extend(f"input set {r['name']!r} ({r['label']} inputs) {'(used): ' if r['ran'] else 'skipped: '}"
                            f"{r['note']}" for r in self._records if r["tried"] and r["note"])  # fmt: skip
        return result

    def _compare(self, optimized: Any, deadline: float) -> CheckResult:
        assert self.worker is not None and self.folder is not None
        label = f"optimized-{len(list(self.folder.glob('optimized-*')))}"
        try:
            path = _files.runnable(optimized, self.folder, label)
        except (OSError, ValueError) as e:
            return CheckResult(False, error=f"the optimised model cannot be read: {_first_line(e)}")
        request = {"op": "compare", "model": str(path), "tolerances": self._tolerances, "rounding": self.rounding,
                   "half_io": self.precision is not None}  # fmt: skip
        if not self.worker.alive and self._prepared:
            try:
                self._sets_restore(deadline)
            except WorkerError as e:
                return CheckResult(True, skipped=f"the check did not run again: {e} ({e.phase})")
        try:
            compared = self.worker.request(request, deadline)
        except WorkerTimeout as e:
            return CheckResult(True, skipped=f"the check did not run: it did not finish within {self.timeout:g} s "
                               f"({e.phase})", hint="raise --check-timeout SECONDS")  # fmt: skip
        except WorkerCrashed as e:
            return CheckResult(False, error=f"{e} while {e.phase}, where the original ran")
        if not compared.get("ok"):
            return CheckResult(False, error=compared.get("error", ""))
        outputs = [OutputComparison.from_json(o) for o in compared["outputs"]]
        answers = compared.get("sets", [])
        noise = self._again(verdict.differing(outputs, answers), deadline)
        labels = {r["name"]: r["label"] for r in self._records}
        not_compared, noted = verdict.drop_noise(outputs, answers, noise, labels)
        errors, self._last_sets, self.failing_set = verdict.merge_sets(outputs, answers, self._records)
        flags = " ".join(flag for flag, value in (("--rtol", self.rtol), ("--atol", self.atol)) if value is not None)
        for o in outputs:
            if o.rtol is not None:
                o.tolerance_dtype, o.tolerance_value = self._sources.get(o.name, ("", ""))
                o.tolerance_flags = flags
        ok = all(o.ok for o in outputs) and not errors
        self.failing_outputs = [o.name for o in outputs if not o.ok]
        return CheckResult(ok, outputs=outputs, error="; ".join(errors) or None, notes=noted,
                           not_compared=not_compared)  # fmt: skip

    def _again(self, differing: dict[str | None, list[str]], deadline: float) -> dict[str | None, Any]:
        """The original run again on each set where outputs differ (once per set and output: it does
        not depend on the model compared): per set, the outputs on which it disagrees with itself
        (``noisy``), or why it did not run again (``error``, ``names``)."""
        assert self.worker is not None
        found: dict[str | None, Any] = {}
        for key, names in differing.items():
            asked, answer = [n for n in names if (key, n) not in self._noise], {"ok": True}
            try:
                if asked:
                    request = {"op": "again", "set": key, "names": asked, "tolerances": self._tolerances}
                    answer = self.worker.request(request, deadline)
            except WorkerError as e:
                answer = {"ok": False, "error": f"{e} ({e.phase})"}
                with contextlib.suppress(WorkerError):  # the next request says why
                    self._sets_restore(deadline)
            if not answer.get("ok"):
                found[key] = {"error": answer.get("error", ""), "names": names}
                continue
            self._noise.update({(key, n): answer.get("noisy", {}).get(n) for n in asked})
            if noisy := {n: self._noise[(key, n)] for n in names if self._noise.get((key, n)) is not None}:
                found[key] = {"noisy": noisy}
        return found

    def _sets_restore(self, deadline: float) -> None:
        assert self._sets is not None
        self._sets.restore(deadline)

    def recheck(self, optimized: Any) -> CheckResult:
        """Compares another optimised model on the inputs :meth:`check` chose."""
        if not self._prepared:
            raise RuntimeError("recheck() needs a check() that ran")
        return self._compare(optimized, self._deadline())

    def ready(self) -> None:
        """The child holds the chosen inputs and the kept sets (restarted if it died), for more
        requests on them after :meth:`check` (``--repro``'s, see :mod:`passes.verify.repro`); raises
        ``WorkerError`` when the child cannot do again what it did."""
        assert self.worker is not None
        if not self.worker.alive and self._prepared:
            self._sets_restore(self._deadline())

    # --- the locator -------------------------------------------------------------------------

    def locate(self, optimized: Any) -> FirstDifference:
        """The first node of the original whose output differs from the optimised model's."""
        start = time.perf_counter()
        try:
            found = self._locate(optimized)
        except WorkerTimeout as e:
            found = FirstDifference(message=f"did not finish within {self.timeout:g} s ({e.phase})")
        except WorkerCrashed as e:
            found = FirstDifference(message=f"{e} while {e.phase}")
        found.seconds = round(time.perf_counter() - start, 3)
        return found

    def _locate(self, optimized: Any) -> FirstDifference:
        return _values.first_difference(self, optimized)

    def magnitudes(self, above: float | None = None) -> dict[str, float]:
        """The largest finite magnitude of each float32 value of the original's main graph over
        the inputs the check ran it on (the chosen set and the kept ones); empty when the check
        has not run or the child could not answer. After :meth:`start` or :meth:`check`; ``above``:
        see :func:`passes.verify.values.magnitudes`."""
        return _values.magnitudes(self, above) if self._prepared else {}


def check(
    original: Any,
    optimized: Any,
    *,
    inputs: Mapping[str, np.ndarray] | None = None,
    dims: Mapping[str, int | Sequence[int]] | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    seed: int = 0,
    timeout: float | None = DEFAULT_TIMEOUT,
    memory_limit: int | None = None,
    locate: bool = True,
    inputs_file: str | os.PathLike[str] | None = None,
    rounding: bool = True,
) -> CheckResult:
    """Runs both models in onnxruntime (in a child process) on the same inputs and compares every output.

    Args:
        original: The reference model: a path, serialized bytes, an ``onnx.ModelProto``
            or an ``onnx_ir.Model``.
        optimized: The model to check, in any of the same forms.
        inputs: Input arrays by name; missing ones are generated, with sizes
            that make the original run (see :mod:`passes.verify.plan`).
        dims: Sizes for named dynamic dimensions of generated inputs: a size, or a list (the first
            for the chosen inputs, the others for sets at larger sizes: see :class:`Checker`).
        rtol: Relative tolerance for float outputs; default per dtype (:data:`TOLERANCES`)
            of the lowest-precision float type the output depends on.
        atol: Absolute tolerance for float outputs; default likewise.
        seed: Seed of the generated inputs.
        timeout: Seconds onnxruntime may take (and as much again for the locator).
        memory_limit: Address-space bound of the child in bytes (None: 3/4 of memory; 0: none).
        locate: After a mismatch, find the first node whose output differs.
        inputs_file: An ``.npz`` of input arrays by name, instead of or besides ``inputs``.
        rounding: ``optimized`` may round differently (a fusion ran): on the edge-value input
            sets a finite value may then also be within ``rtol`` of the output's largest
            magnitude (sums of 1e30 terms that cancel). False holds every set to the
            element-wise tolerance. NaN/inf placement and the sign of zero are exact either way.

    Returns:
        A :class:`CheckResult`: ``ok`` is False if any output differs or the
        optimised model fails to run where the original ran; ``checked`` is
        False (and ``skipped`` says why) when the comparison could not run.
    """
    with Checker(original, inputs=inputs, inputs_file=inputs_file, dims=dims, seed=seed, rtol=rtol,
                 atol=atol, timeout=timeout, memory_limit=memory_limit, rounding=rounding) as checker:  # fmt: skip
        result = checker.check(optimized)
        if locate and result.checked and not result.ok and not result.error:
            result.first_difference = checker.locate(optimized)
            result.seconds["locate"] = result.first_difference.seconds
    return result
