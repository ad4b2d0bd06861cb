"""The original's side of the check: what :class:`passes.verify.check.Checker` measures of the original.

Read the original, choose its inputs (sizes that make it run), run it on them and on every other
set of inputs (:mod:`passes.verify.sets`) in the check's child, and keep what it found: once, before
the optimised model exists (:meth:`OriginalSide.start`, see :mod:`passes.verify.early`), or in the
first :meth:`~passes.verify.check.Checker.check`. Its measurements serve every later comparison on
the same checker, and one more check of another model (:meth:`OriginalSide.reuse`: the final check
after the precision search, :class:`passes.verify.handoff.Handoff`); the model whose values the range
probe and the locator read may be another one computing the same (:meth:`OriginalSide.read_values_of`).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import google.protobuf.message

from passes.errors import first_line as _first_line
from passes.verify import files as _files, lowest as _lowest, npz, plan, sets, verdict
from passes.verify.child import WorkerError
from passes.verify.result import CheckResult, shown

__all__ = ["SPILL_BYTES", "OriginalSide"]

#: Expected outputs larger than this wait on disk (memory-mapped) while the optimised model runs.
SPILL_BYTES = 1 << 28


class OriginalSide:
    """The original's side of :class:`passes.verify.check.Checker` (its base: the state is the checker's)."""

    # The checker's state these methods read and set (see passes.verify.check.Checker.__init__).
    original: Any
    folder: Any
    worker: Any
    original_path: Any
    original_proto: Any
    original_seconds: float
    located_values: Any
    _original: Any
    _side: Any
    _source: Any

    timeout: float
    #: The original loads in onnxruntime but ran on none of the inputs tried (the check did not run).
    original_loaded: bool = False

    def _deadline(self) -> float:
        return time.monotonic() + self.timeout

    def start(self) -> None:
        """The original's side of :meth:`check` now, before the optimised model exists (its inputs,
        its runs on every set: :mod:`passes.verify.early` runs it while the passes run); its
        session is then dropped, its outputs kept."""
        assert self.folder is not None and self.worker is not None, "use Checker as a context manager"
        start = time.perf_counter()
        self._original = self._original_side(self._deadline())
        if not isinstance(self._original, CheckResult):
            self.release()
        self.original_seconds = time.perf_counter() - start

    def release(self) -> None:
        """Drops the original's session in the child (its outputs stay; a rerun for noise loads it
        again), if the child is alive (a dead one is restored by the next comparison)."""
        if self.worker is not None and self.worker.alive:
            with contextlib.suppress(WorkerError):
                self.worker.request({"op": "release"}, self._deadline())

    @property
    def started(self) -> bool:
        """:meth:`start` ran the original on its inputs and every set (False: it could not; then
        :meth:`check` says why)."""
        return self._original is not None and not isinstance(self._original, CheckResult)

    def reuse(self) -> bool:
        """The next :meth:`check` compares on what the first one measured of the original (its inputs,
        its runs on every set, its reruns for noise: the final check after the precision search, see
        :class:`passes.verify.gate.Handoff`) instead of running it again; False when none did."""
        if self._side is None:
            return False
        self._original, self.located_values = self._side, None
        return True

    def read_values_of(self, model: Any) -> None:
        """The model whose values :meth:`magnitudes`, :meth:`locate` and ``--repro`` read from now on
        (``original_path`` and ``original_proto`` name it): ``model``, a model computing what the
        original does (the precision search's float32 model, whose emulations are compared with the
        original's outputs), or the original again (None). After :meth:`start`."""
        assert self.folder is not None and self.original_path is not None
        if self._source is None:
            self._source = (self.original_path, self.original_proto)
        if model is None:
            self.original_path, self.original_proto = self._source
            return
        label = f"values-{len(list(self.folder.glob('values-*')))}"
        self.original_path, self.original_proto = _files.materialize(model, self.folder, label)

    def _original_side(self, deadline: float) -> CheckResult | tuple[Any, ...]:
        """Reads the original, chooses its inputs, runs it on them and on the other sets: why the check
        cannot go on (a result), or what it found (the specs, the given names, the chosen try, the answer)."""
        assert self.worker is not None and self.folder is not None
        try:
            self.original_path, self.original_proto = _files.materialize(self.original, self.folder, "original")
        except (OSError, ValueError, google.protobuf.message.DecodeError) as e:
            return CheckResult(True, skipped=f"the original model cannot be read: {_first_line(e)}")
        specs = plan.input_specs(self.original_proto)
        pinned = plan.pin_shapes(specs, self.shapes)
        given, refused = npz.given(self.folder, self.inputs, self.inputs_file, specs)
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
        every_input_given = bool(given) and all(s.name in given_names for s in specs)
        try:
            prepared = self.worker.request(self._prepare, deadline)
        except WorkerError as e:
            return verdict.not_run(e, specs, self.timeout)
        except OSError as e:
            return CheckResult(True, skipped=f"the check did not run: cannot start its process ({_first_line(e)})")
        if not prepared.get("ok"):
            self.original_loaded = prepared.get("stage") == "run"
            failed = verdict.original_failed(prepared, specs, every_input_given, self.memory_limit)
            static = self.free_dims is not None and prepared.get("stage") == "run" and not given
            free = plan.input_specs(self.original_proto)  # (specs has the static shapes pinned)
            if static and verdict.runs_free(self.worker, self._prepare, free, self.free_dims or {}, deadline):
                failed.shapes_refused = verdict.first_error(prepared)
            return failed
        self._prepared, self._noise = True, {}
        chosen = tries[prepared["try"] - 1]
        self._prepare["tries"] = [chosen]  # a restarted child makes the same inputs at once
        assert self._sets is not None
        self._sets.prepare = self._prepare
        planned = sets.plan_sets(specs, given, chosen, dims=self.dims, lists=self.dim_lists, precision=self.precision,
                                 seed=self.seed, out_bytes=plan.outputs_bytes(prepared["outputs"]))  # fmt: skip
        try:
            self._records = self._sets.run(planned, float(prepared.get("seconds", 0.0)), deadline)
        except WorkerError as e:
            return verdict.not_run(e, specs, self.timeout)
        return specs, given_names, chosen, prepared

    def _set_tolerances(self) -> None:
        assert self.original_proto is not None
        self._tolerances, self._sources = _lowest.output_tolerances(
            self.original_proto.graph, self.rtol, self.atol, self.precision, self.precision_tolerance)
