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

Both models are then also compared on more sets of inputs, which
standard-normal values never reach (:attr:`InputsUsed.sets`): edge values of
each input's type (:mod:`passes.verify.edges`), the same with NaN and
infinities, and every dynamic dimension 0 (else only the first). Index, shape
and size inputs keep the values that ran. The original runs on each first, in
its own request to the child: a set it cannot run (an error, a crash, no time
left in :data:`EXTRA_SETS_SHARE` of the time limit) is skipped with a note,
never a failure. An output is reported on the first set where it differs.

After a mismatch, :meth:`Checker.locate` finds the first node of the original
whose output differs (:mod:`passes.verify.locate`).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

import google.protobuf.message
import numpy as np
import onnx

from passes.errors import first_line as _first_line
from passes.verify import files as _files, locate as _locate, lowest as _lowest, npz, plan
from passes.verify.child import Worker, WorkerCrashed, WorkerError, WorkerTimeout, default_memory_limit
from passes.verify.compare import compare as _compare  # noqa: F401  the comparison, by its old name here
from passes.verify.result import (
    DEFAULT_DIM,
    DEFAULT_TIMEOUT,
    TOLERANCES,
    CheckResult,
    FirstDifference,
    InputsUsed,
    OutputComparison,
    default_tolerance,
    name_text,
    shown,
)

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

#: Expected outputs larger than this wait on disk (memory-mapped) while the optimised model runs.
SPILL_BYTES = 1 << 28

#: The share of the check's time limit that the original's runs on the sets after the chosen
#: one may take (edge values, 0-sized dims); the optimised model's runs on them take about as much.
EXTRA_SETS_SHARE = 0.25

#: Intermediate values fetched per run by the locator, in bytes.
LOCATE_BUDGET = 1 << 28


def _first_error(prepared: dict[str, Any]) -> str:
    """Why the original did not run on any try: the smallest sizes' error is the telling one (the last
    may be a limit), with the last's if it differs."""
    error = str(prepared.get("error", ""))
    attempts = prepared.get("attempts", [])
    first = attempts[0].get("error", "") if attempts else ""
    return f"{first} (at the last sizes: {error})" if first and first != error else error


def _hint_for_sizes(specs: list[plan.InputSpec]) -> str:
    names = sorted({d for s in specs for d in s.dims if isinstance(d, str)})
    if names:
        listed = ", ".join(name_text(n) for n in names[:10])
        listed += f" and {len(names) - 10} more" if len(names) > 10 else ""
        return f"pass --dim NAME=SIZE (its dynamic dimensions: {listed}) or --inputs FILE.npz"
    return "pass --inputs FILE.npz"


def _tries_text(attempts: list[dict[str, Any]]) -> str:
    """`` (sizes tried: (batch=1, height=32) (batch=1, height=64))``, or "" without named sizes."""
    sizes = ["(" + ", ".join(f"{name_text(k)}={v}" for k, v in a["dims"].items()) + ")"
             for a in attempts if a.get("dims")]  # fmt: skip
    return f" (sizes tried: {' '.join(sizes)})" if sizes else ""


class Checker:
    """One check: the original's inputs and outputs, kept in a child process for reuse.

    Used as a context manager; :meth:`check` first, then (after a failure)
    :meth:`locate` and :meth:`recheck` of other candidate models on the same
    inputs. The child is killed on exit, whatever the reason.

    Args:
        original: The reference model: a path, serialized bytes, an ``onnx.ModelProto``
            or an ``onnx_ir.Model``.
        inputs: Input arrays by name; missing ones are generated.
        inputs_file: An ``.npz`` of input arrays by name (read bounded, see :mod:`passes.verify.npz`).
        dims: Sizes of named dynamic dimensions for generated inputs.
        shapes: Static shapes of inputs by name (``--input-shape``): generated inputs take them,
            and the names of their dims take their sizes.
        seed: Seed of the generated inputs.
        rtol: Relative tolerance for float outputs (default: from the dtype, see :data:`TOLERANCES`).
        atol: Absolute tolerance for float outputs (default: from the dtype).
        timeout: Seconds the onnxruntime part may take (the locator gets as much again).
        memory_limit: The child's address-space bound in bytes; None: 3/4 of physical memory; 0: none.
        worker: A child already started (see :meth:`Worker.start`) to use instead of a new one;
            the checker closes it on exit like its own.
        rounding: Whether the optimised models may round differently (see :func:`check`).
        precision: The half type an optimised model computes in (``"float16"``, ``"bfloat16"``:
            ``--precision``): float outputs are compared at that type's tolerance (at least), and
            the sets after the seeded standard-normal one are two more standard-normal sets
            (other seeds) and the 0-sized dimensions, not float32's edge values (1e30, 3e38 and
            float32 subnormals are outside the half type's range: a half model is not asked to
            hold them). An optimised model whose graph inputs (outputs) are of that type where the
            original's are float32 (``--precision-io``) is fed the same inputs rounded to it (as
            numpy's ``astype`` rounds), and its outputs are widened to float32 to be compared.
        precision_tolerance: ``--precision-tolerance``: (rtol, atol or None) instead of the half
            type's default tolerance (:func:`passes.verify.result.default_tolerance`).
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
        dims: Mapping[str, int] | None = None,
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
        free_dims: Mapping[str, int] | None = None,
    ) -> None:
        self.original = original
        self.free_dims = None if free_dims is None else dict(free_dims)
        self.rounding = rounding
        self.precision = precision
        self.precision_tolerance = precision_tolerance
        self.inputs = dict(inputs or {})
        self.inputs_file = os.fspath(inputs_file) if inputs_file is not None else None
        self.dims = dict(dims or {})
        self.shapes = dict(shapes or {})
        self.seed = seed
        self.rtol, self.atol = rtol, atol
        self.timeout = DEFAULT_TIMEOUT if timeout is None else float(timeout)
        self.memory_limit = default_memory_limit() if memory_limit is None else int(memory_limit)
        self.folder: pathlib.Path | None = None
        self.worker: Worker | None = worker
        self._prepare: dict[str, Any] | None = None
        self._prepared = False
        self._tolerances: dict[str, tuple[float, float]] = {}
        self._kept: list[dict[str, Any]] = []  # the sets after the chosen one that the original runs
        self._records: list[dict[str, Any]] = []
        self._last_sets: list[dict[str, Any]] = []  # the sets, with the last comparison's verdicts
        self._failing_set: str | None = None
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
        try:
            self.worker.start()  # its imports overlap with reading the original here
        except OSError:
            pass  # the first request says why
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            if self.worker is not None:
                self.worker.close()
        finally:
            if self.folder is not None:
                shutil.rmtree(self.folder, ignore_errors=True)

    # --- the check ---------------------------------------------------------------------------

    def _deadline(self) -> float:
        return time.monotonic() + self.timeout

    def _given(self, specs: list[plan.InputSpec]) -> tuple[dict[str, Any] | None, str | None]:
        """The caller's inputs as an inspected ``.npz`` (path, names), or why they are refused."""
        assert self.folder is not None
        path = os.path.abspath(self.inputs_file) if self.inputs_file is not None else None
        if self.inputs:
            path = str(self.folder / "given.npz")
            np.savez(path, **{k: np.asarray(v) for k, v in self.inputs.items()})
        if path is None:
            return None, None
        declared = {s.name: (s.dtype, s.dims if s.dtype is not None else None) for s in specs}
        try:
            members = npz.inspect(path, declared)
        except ValueError as e:
            return None, str(e)
        return {"path": path, "names": [m.name for m in members], "shapes": {m.name: m.shape for m in members},
                "raw": {m.name: m.dtype for m in members if m.raw}}, None

    def check(self, optimized: Any) -> CheckResult:
        """Runs the original (choosing its inputs), then ``optimized``, and compares them."""
        assert self.folder is not None and self.worker is not None, "use Checker as a context manager"
        start = time.perf_counter()
        result = self._check(optimized)
        result.seconds["check"] = round(time.perf_counter() - start, 3)
        return result

    def _check(self, optimized: Any) -> CheckResult:
        assert self.worker is not None and self.folder is not None
        try:
            self.original_path, self.original_proto = _files.materialize(self.original, self.folder, "original")
        except (OSError, ValueError, google.protobuf.message.DecodeError) as e:
            return CheckResult(True, skipped=f"the original model cannot be read: {_first_line(e)}")
        specs = plan.input_specs(self.original_proto)
        pinned = plan.pin_shapes(specs, self.shapes)
        given, refused = self._given(specs)
        if refused is not None:
            return CheckResult(True, skipped=refused, inputs_rejected=True)
        given_names = set(given["names"]) if given else set()
        for spec in specs:
            if spec.dtype is None and spec.name not in given_names:
                return CheckResult(True, skipped=f"cannot generate input {shown(spec.name)} of type {spec.type_text}",
                                   hint="pass --inputs FILE.npz")  # fmt: skip
        tries, dropped = plan.size_tries(specs, dims={**pinned, **self.dims}, given=given["shapes"] if given else None)
        if not tries:
            return CheckResult(True, skipped=dropped[0], hint="pass --inputs FILE.npz or smaller --dim sizes")
        self._set_tolerances()
        self._prepare = {
            "op": "prepare", "model": str(self.original_path), "tries": tries, "seed": self.seed,
            "given": {k: given[k] for k in ("path", "names", "raw")} if given else None,
            "spill_dir": str(self.folder), "spill_bytes": SPILL_BYTES,
        }  # fmt: skip
        deadline = self._deadline()
        every_input_given = bool(given) and all(s.name in given_names for s in specs)
        try:
            prepared = self.worker.request(self._prepare, deadline)
        except WorkerError as e:
            return self._not_run(e, specs)
        except OSError as e:
            return CheckResult(True, skipped=f"the check did not run: cannot start its process ({_first_line(e)})")
        if not prepared.get("ok"):
            failed = self._original_failed(prepared, specs, every_input_given)
            static = self.free_dims is not None and prepared.get("stage") == "run" and not given
            if static and self._runs_free(deadline):
                failed.shapes_refused = _first_error(prepared)
            return failed
        self._prepared = True
        chosen = tries[prepared["try"] - 1]
        self._prepare["tries"] = [chosen]  # a restarted child makes the same inputs at once
        try:
            self._records = self._run_sets(self._plan_sets(specs, given, chosen), prepared, deadline)
        except WorkerError as e:
            return self._not_run(e, specs)
        result = self._compare(optimized, deadline)
        result.inputs = InputsUsed(
            given=sorted(given_names), generated=list(chosen["inputs"]), seed=self.seed, dims=chosen["dims"],
            shapes=prepared["shapes"], tries=prepared["try"], attempts=prepared["attempts"], sets=self._last_sets,
        )  # fmt: skip
        result.notes.extend(self._declaration_notes(prepared["outputs"]))
        result.notes.extend(f"input set {r['name']!r} ({r['label']} inputs) skipped: {r['note']}"
                            for r in self._records if r["tried"] and not r["ran"])  # fmt: skip
        return result

    # --- the sets of inputs after the chosen one ---------------------------------------------

    def _plan_sets(self, specs: list[plan.InputSpec], given: dict[str, Any] | None,
                   chosen: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:  # fmt: skip
        """Each set after the chosen one: its description, and why it cannot be made ("" if it can).
        The 0-sized-dims set has a second form (``then``), tried when the original does not run
        the first: only the first dynamic dimension 0, the others as chosen."""
        keep = sorted(s.name for s in specs if s.index)
        values = [s for s in specs if not s.index and s.dtype is not None and s.dtype != "bool"]
        floats = [s for s in values if s.dtype in _lowest.FLOAT_TYPES.values()]
        shapes = given["shapes"] if given else None
        zero = plan.zero_sizes(specs, dims=self.dims, given=shapes)
        first = plan.zero_sizes(specs, dims=self.dims, given=shapes, base=chosen)
        if zero is not None and first is not None and first["inputs"] != zero["inputs"]:
            zero["then"] = {"name": "zero-dims", "label": "0-sized-dimension", "kind": "sizes", **first}
        if self.precision is not None:
            generated = "" if chosen["inputs"] else "every input is given: no other seed to draw"
            return [
                *(({"name": f"normal-{k}", "label": f"seeded standard-normal (seed {self.seed + k})",
                    "kind": "sizes", "inputs": chosen["inputs"], "dims": chosen["dims"], "seed": self.seed + k},
                   generated) for k in (1, 2)),
                ({"name": "zero-dims", "label": "0-sized-dimension", "kind": "sizes", **(zero or {})},
                 "" if zero else "no dynamic dimension left free to be 0"),
            ]  # fmt: skip
        return [
            ({"name": "edge", "label": "edge-value", "kind": "edge", "keep": keep},
             "" if values else "no input takes edge values (each is an index, a shape, a size or a bool)"),
            ({"name": "edge-nonfinite", "label": "NaN/infinity", "kind": "nonfinite", "keep": keep},
             "" if floats else "no float input that takes NaN or infinities"),
            ({"name": "zero-dims", "label": "0-sized-dimension", "kind": "sizes", **(zero or {})},
             "" if zero else "no dynamic dimension left free to be 0"),
        ]  # fmt: skip

    def _run_sets(self, plans: list[tuple[dict[str, Any], str]], prepared: dict[str, Any],
                  deadline: float) -> list[dict[str, Any]]:  # fmt: skip
        """Runs the original on each planned set; the ones it runs are kept for the comparisons.

        A set the original cannot run (an error, a crash, no time left) is skipped
        with a note; a crash or a timeout restarts the child with the sets kept so far.
        """
        assert self.worker is not None
        records = [{"name": "normal", "label": "seeded standard-normal", "tried": True, "ran": True, "ok": None,
                    "note": ""}]  # fmt: skip
        self._kept = []
        seconds = float(prepared.get("seconds", 0.0))
        budget = time.monotonic() + self.timeout * EXTRA_SETS_SHARE
        for description, reason in plans:
            record = {"name": description["name"], "label": description["label"], "tried": not reason,
                      "ran": False, "ok": None, "note": reason, "dims": None}  # fmt: skip
            records.append(record)
            if reason:
                continue
            now = time.monotonic()
            if now + seconds > min(budget, deadline):
                record["note"] = (f"no time left: the original takes {seconds:.2g} s a run and the check gives "
                                  f"more sets {self.timeout * EXTRA_SETS_SHARE:g} s of --check-timeout")  # fmt: skip
                continue
            limit = min(deadline, now + max(10.0, 10 * seconds))
            errors = []
            for form in (description, description.get("then")):
                if form is None:
                    break
                form = {k: v for k, v in form.items() if k != "then"}
                error = self._add_set(form, limit, deadline, now)
                if error is None:
                    record["ran"], record["dims"] = True, form.get("dims")
                    break
                errors.append(error)
            if errors:
                record["note"] = "the original does not run on it: " + errors[0]
            if len(errors) == 2:
                record["note"] += f"; nor with only the first dynamic dimension 0: {errors[1]}"
            elif errors and record["ran"]:
                record["note"] += "; it runs with only the first dynamic dimension 0, which was used"
        self._last_sets = [dict(r) for r in records]
        return records

    def _add_set(self, description: dict[str, Any], limit: float, deadline: float, now: float) -> str | None:
        """Runs the original on one more set; why it does not run, or None (the set is kept)."""
        assert self.worker is not None
        try:
            answer = self.worker.request({"op": "add_set", "set": description}, limit)
        except WorkerTimeout as e:
            self._restore(deadline)
            return f"it did not finish within {limit - now:.3g} s ({e.phase})"
        except WorkerCrashed as e:
            self._restore(deadline)
            return str(e)
        if not answer.get("ok"):
            return str(answer.get("error", ""))
        self._kept.append(description)
        return None

    def _restore(self, deadline: float) -> None:
        """A new child with the chosen inputs and the sets kept so far (after a crash or a timeout).

        Raises:
            WorkerError: the child cannot do again what it did.
        """
        assert self.worker is not None
        again = self.worker.request(self._prepare or {}, deadline)
        if not again.get("ok"):
            raise WorkerCrashed(f"the original did not run again: {again.get('error', '')}", "restarting")
        for description in self._kept:
            again = self.worker.request({"op": "add_set", "set": description}, deadline)
            if not again.get("ok"):
                raise WorkerCrashed(f"the original did not run again: {again.get('error', '')}", "restarting")

    def _set_tolerances(self) -> None:
        assert self.original_proto is not None
        lowest = _lowest.float_dependencies(self.original_proto.graph)
        for output in self.original_proto.graph.output:
            found = lowest.get(output.name)
            if found is None:
                continue
            if self.precision is not None:
                found = _lowest.lower(found, (self.precision, f"--precision ({self.precision})"))
                if found[0] == self.precision and self.precision_tolerance is not None:
                    found = (found[0], "--precision-tolerance")
            default_rtol, default_atol = default_tolerance(found[0], self.precision, self.precision_tolerance)
            rtol = default_rtol if self.rtol is None else self.rtol
            atol = default_atol if self.atol is None else self.atol
            self._tolerances[output.name] = (rtol, atol)
            if self.rtol is None or self.atol is None:
                self._sources[output.name] = found

    def _not_run(self, error: WorkerError, specs: list[plan.InputSpec]) -> CheckResult:
        if isinstance(error, WorkerTimeout):
            named = any(isinstance(d, str) for s in specs for d in s.dims)
            smaller = " or pass smaller --dim sizes" if named else ""
            return CheckResult(
                True, skipped=f"the check did not run: it did not finish within {self.timeout:g} s "
                f"({error.phase})", hint=f"raise --check-timeout SECONDS{smaller}",
            )  # fmt: skip
        return CheckResult(
            True, skipped=f"the check did not run: {error} while {error.phase}",
            hint="pass --inputs FILE.npz with inputs it runs on, or --no-check",
        )  # fmt: skip

    def _runs_free(self, deadline: float) -> bool:
        """Whether the original runs on generated inputs without the static shapes (``free_dims``)."""
        assert self.worker is not None and self.original_proto is not None and self._prepare is not None
        tries, _ = plan.size_tries(plan.input_specs(self.original_proto), dims=self.free_dims)
        try:
            return bool(tries) and bool(self.worker.request({**self._prepare, "tries": tries}, deadline).get("ok"))
        except (WorkerError, OSError):
            return False

    def _original_failed(self, prepared: dict[str, Any], specs: list[plan.InputSpec],
                         every_input_given: bool) -> CheckResult:  # fmt: skip
        stage, error = prepared.get("stage"), prepared.get("error", "")
        if stage in ("startup", "memory"):
            bound = f" within its memory bound of {self.memory_limit >> 20} MiB" if self.memory_limit else ""
            what = "could not start onnxruntime" if stage == "startup" else "ran out of memory"
            return CheckResult(True, skipped=f"the check did not run: its process {what}{bound} ({error})",
                               hint="raise --check-memory SIZE" if self.memory_limit else "")  # fmt: skip
        if stage == "load":
            return CheckResult(True, skipped=f"the original model does not load in onnxruntime: {error}")
        if stage == "run" and every_input_given:
            return CheckResult(True, inputs_rejected=True,
                               skipped=f"the original model does not run in onnxruntime on the given inputs: {error}")
        if stage == "run":
            attempts = prepared.get("attempts", [])
            error = _first_error(prepared)
            return CheckResult(
                True, skipped=f"the original model does not run in onnxruntime on generated inputs"
                f"{_tries_text(attempts)}: {error}", hint=_hint_for_sizes(specs),
            )  # fmt: skip
        return CheckResult(True, skipped=f"the check did not run: {error}", hint=_hint_for_sizes(specs))

    def _compare(self, optimized: Any, deadline: float) -> CheckResult:
        assert self.worker is not None and self.folder is not None
        label = f"optimized-{len(list(self.folder.glob('optimized-*')))}"
        try:
            path, _ = _files.materialize(optimized, self.folder, label)
        except (OSError, ValueError) as e:
            return CheckResult(False, error=f"the optimised model cannot be read: {_first_line(e)}")
        request = {"op": "compare", "model": str(path), "tolerances": self._tolerances, "rounding": self.rounding,
                   "half_io": self.precision is not None}  # fmt: skip
        if not self.worker.alive and self._prepared:
            try:
                self._restore(deadline)
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
        errors = self._merge_sets(outputs, compared.get("sets", []))
        flags = " ".join(flag for flag, value in (("--rtol", self.rtol), ("--atol", self.atol)) if value is not None)
        for o in outputs:
            if o.rtol is not None:
                o.tolerance_dtype, o.tolerance_value = self._sources.get(o.name, ("", ""))
                o.tolerance_flags = flags
        ok = all(o.ok for o in outputs) and not errors
        return CheckResult(ok, outputs=outputs, error="; ".join(errors) or None)

    def _merge_sets(self, outputs: list[OutputComparison], sets: list[dict[str, Any]]) -> list[str]:
        """Each output's comparison on the first set where it differs (the chosen inputs' otherwise);
        the sets the optimised model does not run on; the sets' verdicts in :attr:`_last_sets`."""
        self._last_sets = [dict(r) for r in self._records]
        records = {r["name"]: r for r in self._last_sets}
        records["normal"]["ok"] = all(o.ok for o in outputs)
        position = {o.name: i for i, o in enumerate(outputs)}
        errors = []
        self._failing_set = None if records["normal"]["ok"] else "normal"
        for found in sets:
            record = records.get(found["name"], {"label": found["name"]})
            record["ok"] = bool(found["ok"])
            if found.get("within_scale"):
                record["within_scale"] = found["within_scale"]
            if not found["ok"] and self._failing_set is None:
                self._failing_set = found["name"]
            if found.get("error"):
                errors.append(f"on the {record['label']} inputs ({found['name']!r}), where the original runs: "
                              f"{found['error']}")  # fmt: skip
            for data in found["outputs"]:
                differs = OutputComparison.from_json(data)
                differs.input_set = found["name"]
                differs.message = f"on the {record['label']} inputs ({found['name']!r}): {differs.message}"
                i = position.get(differs.name)
                if i is not None and outputs[i].ok:
                    outputs[i] = differs
        return errors

    def _declaration_notes(self, outputs: Mapping[str, Any]) -> list[str]:
        assert self.original_proto is not None
        notes = []
        for name, declared in plan.declared_output_shapes(self.original_proto).items():
            shape = (outputs.get(name) or {}).get("shape")
            if shape is None:
                continue
            if len(declared) != len(shape) or any(isinstance(d, int) and d != s for d, s in zip(declared, shape)):
                dims = "[" + ", ".join(str(d) if isinstance(d, int) else shown(d or "?") for d in declared) + "]"
                notes.append(f"the original model declares output {shown(name)} as {dims} but computes {shape}")
        return notes

    def recheck(self, optimized: Any) -> CheckResult:
        """Compares another optimised model on the inputs :meth:`check` chose."""
        if not self._prepared:
            raise RuntimeError("recheck() needs a check() that ran")
        return self._compare(optimized, self._deadline())

    def ready(self) -> None:
        """The child holds the chosen inputs and the kept sets (restarted if it died), for more
        requests on them after :meth:`check` (``--repro``'s, see :mod:`passes.verify.repro`).

        Raises:
            WorkerError: the child cannot do again what it did.
        """
        assert self.worker is not None
        if not self.worker.alive and self._prepared:
            self._restore(self._deadline())

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
        assert self.worker is not None and self.folder is not None and self.original_proto is not None
        assert self.original_path is not None
        label = f"located-{len(list(self.folder.glob('located-*')))}"
        opt_path, _ = _files.materialize(optimized, self.folder, label)
        original, opt_proto = _files.whole(self.original_path), _files.whole(opt_path)  # copies that run need every attribute
        if self.precision is not None:  # half values compared as float32 under their own names
            opt_proto = _locate.widened(original, opt_proto)
        correspondence = _locate.Correspondence(original, opt_proto, through_casts=self.precision is not None)
        names, types = _locate.comparable_values(original, opt_proto, correspondence)
        if not names:
            return FirstDifference(message="the two models have no intermediate value in common")
        tolerances = _locate.value_tolerances(original, names, self.rtol, self.atol, self.precision,
                                              self.precision_tolerance)  # fmt: skip
        original_copy = _locate.augmented(original, self.original_path, names, types,
                                          self.folder / f"{label}-original")  # fmt: skip
        optimized_copy = _locate.augmented(opt_proto, opt_path, names, types, self.folder / f"{label}-optimized")
        deadline = self._deadline()
        try:
            if not self.worker.alive:
                self._restore(deadline)
            answer = self.worker.request(
                {"op": "values", "original": str(original_copy), "optimized": str(optimized_copy), "names": names,
                 "tolerances": tolerances, "budget": LOCATE_BUDGET, "set": self._failing_set,
                 "rounding": self.rounding, "half_io": self.precision is not None}, deadline,
            )  # fmt: skip
        finally:  # the copies' links to the models' data files: a later load of the input refuses a linked file
            for copy in (original_copy, optimized_copy):
                shutil.rmtree(copy.parent, ignore_errors=True)
        if not answer.get("ok"):
            return FirstDifference(message=f"onnxruntime could not run the copies: {answer.get('error', '')}")
        self.located_values = answer["values"]
        return _locate.first_difference(original, answer["values"], correspondence)

    def magnitudes(self) -> dict[str, float]:
        """The largest finite magnitude of each float32 value of the original's main graph over
        the inputs the check ran it on (the chosen set and the kept ones); empty when the
        check has not run or the child could not answer. After :meth:`check`."""
        if not self._prepared or self.original_path is None or self.worker is None or self.folder is None:
            return {}
        original = _files.whole(self.original_path)
        types = _locate.tensor_types(original)
        outputs = {o.name for o in original.graph.output}
        names = [n for node in original.graph.node for n in node.output
                 if n and types.get(n) == onnx.TensorProto.FLOAT and n not in outputs]  # fmt: skip
        names += [o.name for o in original.graph.output if types.get(o.name) == onnx.TensorProto.FLOAT]
        label = f"magnitudes-{len(list(self.folder.glob('magnitudes-*')))}"
        copy = _locate.augmented(original, self.original_path, names, types, self.folder / label)
        deadline = self._deadline()
        try:
            if not self.worker.alive:
                self._restore(deadline)
            answer = self.worker.request({"op": "magnitudes", "model": str(copy), "names": names}, deadline)
        except WorkerError:
            return {}
        finally:
            shutil.rmtree(copy.parent, ignore_errors=True)
        return dict(answer.get("values", {})) if answer.get("ok") else {}


def check(
    original: Any,
    optimized: Any,
    *,
    inputs: Mapping[str, np.ndarray] | None = None,
    dims: Mapping[str, int] | None = None,
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
        dims: Sizes for named dynamic dimensions of generated inputs.
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


def make_inputs(session: Any, *, dims: Mapping[str, int] | None = None, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs for every graph input of an onnxruntime ``session``, in this process.

    Floats are standard normal, integers uniform in [0, 4), booleans fair coins;
    a dynamic dimension takes its size from ``dims`` by name, else
    :data:`DEFAULT_DIM`. (The check itself chooses sizes that make the model
    run and index ranges from the graph; see :mod:`passes.verify.plan`.)

    Raises:
        ValueError: an input has a type that cannot be generated (sequence, map...).
    """
    from passes.verify import ort_io

    rng = np.random.default_rng(seed)
    names = {
        "tensor(float)": "float32", "tensor(double)": "float64", "tensor(float16)": "float16",
        "tensor(bfloat16)": "bfloat16", "tensor(bool)": "bool", "tensor(string)": "str",
    }  # fmt: skip
    feeds = {}
    for arg in session.get_inputs():
        dtype = names.get(arg.type) or (arg.type[len("tensor("):-1] if arg.type.startswith("tensor(int")
                                        or arg.type.startswith("tensor(uint") else None)  # fmt: skip
        if dtype is None:
            raise ValueError(f"cannot generate input {shown(arg.name)} of type {arg.type}; pass --inputs")
        shape = [d if isinstance(d, int) and d >= 0 else int((dims or {}).get(d, DEFAULT_DIM)) for d in arg.shape]
        feeds[arg.name] = np.asarray(ort_io.generate({"dtype": dtype, "shape": shape}, rng))
    return feeds

