"""The onnxruntime before/after check.

Runs the original and the optimised model in onnxruntime (CPU, every graph
optimisation disabled so that onnxruntime's own rewrites cannot hide a bug) on
the same inputs and compares every output by name: same dtype and shape,
integers and booleans exactly equal, floats equal within the tolerance of the
lowest-precision float type the output depends on, with NaN in the same places
and infinities equal.

The sessions run in a child process (:mod:`passes.verify.worker`), with a time
limit and a memory bound, so that a crash or a hang in onnxruntime becomes a
check that did not run instead of taking the optimiser down. A check that did
not run says so (``CheckResult.checked`` is False) and why.

Generated inputs get sizes that make the original run: for each dynamic
dimension a short list of plausible sizes (by its name or position, see
:mod:`passes.verify.plan`) is tried, smallest first.

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
from passes.verify import files as _files, locate as _locate, npz, plan
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

#: Intermediate values fetched per run by the locator, in bytes.
LOCATE_BUDGET = 1 << 28


def _hint_for_sizes(specs: list[plan.InputSpec]) -> str:
    names = sorted({d for s in specs for d in s.dims if isinstance(d, str)})
    if names:
        return f"pass --dim NAME=SIZE (its dynamic dimensions: {', '.join(names)}) or --inputs FILE.npz"
    return "pass --inputs FILE.npz"


def _tries_text(attempts: list[dict[str, Any]]) -> str:
    """`` (sizes tried: (batch=1, height=32) (batch=1, height=64))``, or "" without named sizes."""
    sizes = ["(" + ", ".join(f"{k}={v}" for k, v in a["dims"].items()) + ")" for a in attempts if a.get("dims")]
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
    ) -> None:
        self.original = original
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
        self._sources: dict[str, tuple[str, str]] = {}  # output -> (dtype, value) that chose its tolerance
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
                return CheckResult(True, skipped=f"cannot generate input {spec.name!r} of type {spec.type_text}",
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
            return self._original_failed(prepared, specs, every_input_given)
        self._prepared = True
        chosen = tries[prepared["try"] - 1]
        self._prepare["tries"] = [chosen]  # a restarted child makes the same inputs at once
        used = InputsUsed(
            given=sorted(given_names), generated=list(chosen["inputs"]), seed=self.seed, dims=chosen["dims"],
            shapes=prepared["shapes"], tries=prepared["try"], attempts=prepared["attempts"],
        )  # fmt: skip
        result = self._compare(optimized, deadline)
        result.inputs = used
        result.notes.extend(self._declaration_notes(prepared["outputs"]))
        return result

    def _set_tolerances(self) -> None:
        assert self.original_proto is not None
        lowest = plan.float_dependencies(self.original_proto.graph)
        for output in self.original_proto.graph.output:
            found = lowest.get(output.name)
            if found is None:
                continue
            default_rtol, default_atol = TOLERANCES[found[0]]
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
            first = attempts[0].get("error", "") if attempts else ""
            if first and first != error:  # the smallest sizes' error is the telling one; the last may be a limit
                error = f"{first} (at the last sizes: {error})"
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
        request = {"op": "compare", "model": str(path), "tolerances": self._tolerances}
        try:
            if not self.worker.alive and self._prepared:
                again = self.worker.request(self._prepare or {}, deadline)
                if not again.get("ok"):
                    return CheckResult(True, skipped=f"the check did not run again: {again.get('error', '')}")
            compared = self.worker.request(request, deadline)
        except WorkerTimeout as e:
            return CheckResult(True, skipped=f"the check did not run: it did not finish within {self.timeout:g} s "
                               f"({e.phase})", hint="raise --check-timeout SECONDS")  # fmt: skip
        except WorkerCrashed as e:
            return CheckResult(False, error=f"{e} while {e.phase}, where the original ran")
        if not compared.get("ok"):
            return CheckResult(False, error=compared.get("error", ""))
        outputs = [OutputComparison.from_json(o) for o in compared["outputs"]]
        for o in outputs:
            if o.rtol is not None:
                o.tolerance_dtype, o.tolerance_value = self._sources.get(o.name, ("", ""))
        return CheckResult(all(o.ok for o in outputs), outputs=outputs)

    def _declaration_notes(self, outputs: Mapping[str, Any]) -> list[str]:
        assert self.original_proto is not None
        notes = []
        for name, declared in plan.declared_output_shapes(self.original_proto).items():
            shape = (outputs.get(name) or {}).get("shape")
            if shape is None:
                continue
            if len(declared) != len(shape) or any(isinstance(d, int) and d != s for d, s in zip(declared, shape)):
                shown = [d if d is not None else "?" for d in declared]
                notes.append(f"the original model declares output {name!r} as {shown} but computes {shape}")
        return notes

    def recheck(self, optimized: Any) -> CheckResult:
        """Compares another optimised model on the inputs :meth:`check` chose."""
        if not self._prepared:
            raise RuntimeError("recheck() needs a check() that ran")
        return self._compare(optimized, self._deadline())

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
        names, types = _locate.comparable_values(original, opt_proto)
        if not names:
            return FirstDifference(message="the two models have no intermediate value in common")
        tolerances = _locate.value_tolerances(original, names, self.rtol, self.atol)
        original_copy = _locate.augmented(original, self.original_path, names, types,
                                          self.folder / f"{label}-original")  # fmt: skip
        optimized_copy = _locate.augmented(opt_proto, opt_path, names, types, self.folder / f"{label}-optimized")
        deadline = self._deadline()
        if not self.worker.alive:
            again = self.worker.request(self._prepare or {}, deadline)
            if not again.get("ok"):
                return FirstDifference(message=f"the original did not run again: {again.get('error', '')}")
        answer = self.worker.request(
            {"op": "values", "original": str(original_copy), "optimized": str(optimized_copy), "names": names,
             "tolerances": tolerances, "budget": LOCATE_BUDGET}, deadline,
        )  # fmt: skip
        if not answer.get("ok"):
            return FirstDifference(message=f"onnxruntime could not run the copies: {answer.get('error', '')}")
        return _locate.first_difference(original, answer["values"])


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

    Returns:
        A :class:`CheckResult`: ``ok`` is False if any output differs or the
        optimised model fails to run where the original ran; ``checked`` is
        False (and ``skipped`` says why) when the comparison could not run.
    """
    with Checker(original, inputs=inputs, inputs_file=inputs_file, dims=dims, seed=seed, rtol=rtol,
                 atol=atol, timeout=timeout, memory_limit=memory_limit) as checker:  # fmt: skip
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
    from passes.verify import worker

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
            raise ValueError(f"cannot generate input {arg.name!r} of type {arg.type}; pass --inputs")
        shape = [d if isinstance(d, int) and d >= 0 else int((dims or {}).get(d, DEFAULT_DIM)) for d in arg.shape]
        feeds[arg.name] = np.asarray(worker._generate({"dtype": dtype, "shape": shape}, rng))  # noqa: SLF001
    return feeds

