"""The check's verdict from the child's answers: why it did not run, which output differs where, and noise.

:func:`original_failed` and :func:`not_run` turn a ``prepare`` that failed (or a
child that died) into a :class:`~passes.verify.result.CheckResult` that says why
and what would help. :func:`merge_sets` gives each output its comparison on the
first set of inputs where it differs. The original's own noise is not a pass's
fault: where outputs differ, the original is run again on that set (only then,
to keep the cost down) and :func:`drop_noise` leaves out of the comparison every
output on which it disagrees with itself, and every output of a set on which
onnxruntime aborts or fails when it runs the original again; each is listed in
``CheckResult.not_compared`` with the reason and a note, and never fails the
check. :func:`declaration_notes` names the outputs the original declares with
another shape than it computes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from passes.verify import plan
from passes.verify.child import WorkerError, WorkerTimeout
from passes.verify.result import CheckResult, OutputComparison, name_text, shown

__all__ = ["declaration_notes", "drop_noise", "first_error", "merge_sets", "not_run", "original_failed",
           "runs_free", "size_hint"]  # fmt: skip


def first_error(prepared: dict[str, Any]) -> str:
    """Why the original did not run on any try: the smallest sizes' error is the telling one (the last
    may be a limit), with the last's if it differs."""
    error = str(prepared.get("error", ""))
    attempts = prepared.get("attempts", [])
    first = attempts[0].get("error", "") if attempts else ""
    return f"{first} (at the last sizes: {error})" if first and first != error else error


def size_hint(specs: list[plan.InputSpec]) -> str:
    """The flags that choose other inputs: ``--dim`` with the model's dim names, ``--inputs``."""
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


def not_run(error: WorkerError, specs: list[plan.InputSpec], timeout: float) -> CheckResult:
    """The check did not run: the child timed out or died."""
    if isinstance(error, WorkerTimeout):
        named = any(isinstance(d, str) for s in specs for d in s.dims)
        smaller = " or pass smaller --dim sizes" if named else ""
        return CheckResult(
            True, skipped=f"the check did not run: it did not finish within {timeout:g} s "
            f"({error.phase})", hint=f"raise --check-timeout SECONDS{smaller}",
        )  # fmt: skip
    return CheckResult(
        True, skipped=f"the check did not run: {error} while {error.phase}",
        hint="pass --inputs FILE.npz with inputs it runs on, or --no-check",
    )  # fmt: skip


def original_failed(prepared: dict[str, Any], specs: list[plan.InputSpec], every_input_given: bool,
                    memory_limit: int) -> CheckResult:  # fmt: skip
    """The check did not run: the original does not load or run in onnxruntime (``prepared`` says where)."""
    stage, error = prepared.get("stage"), prepared.get("error", "")
    if stage in ("startup", "memory"):
        bound = f" within its memory bound of {memory_limit >> 20} MiB" if memory_limit else ""
        what = "could not start onnxruntime" if stage == "startup" else "ran out of memory"
        return CheckResult(True, skipped=f"the check did not run: its process {what}{bound} ({error})",
                           hint="raise --check-memory SIZE" if memory_limit else "")  # fmt: skip
    if stage == "load":
        return CheckResult(True, skipped=f"the original model does not load in onnxruntime: {error}")
    if stage == "run" and every_input_given:
        return CheckResult(True, inputs_rejected=True,
                           skipped=f"the original model does not run in onnxruntime on the given inputs: {error}")
    if stage == "run":
        return CheckResult(
            True, skipped=f"the original model does not run in onnxruntime on generated inputs"
            f"{_tries_text(prepared.get('attempts', []))}: {first_error(prepared)}", hint=size_hint(specs),
        )  # fmt: skip
    return CheckResult(True, skipped=f"the check did not run: {error}", hint=size_hint(specs))


def differing(outputs: list[OutputComparison], sets: list[dict[str, Any]]) -> dict[str | None, list[str]]:
    """The outputs that differ on each set (None: the chosen inputs), as the child answered."""
    found: dict[str | None, list[str]] = {}
    names = [o.name for o in outputs if not o.ok and o.message != "missing from the optimised model"
             and o.message != "not an output of the original model"]  # fmt: skip
    if names:
        found[None] = names
    for answer in sets:
        names = [o["name"] for o in answer.get("outputs", [])]
        if names:
            found[answer["name"]] = names
    return found


def drop_noise(outputs: list[OutputComparison], sets: list[dict[str, Any]], noise: Mapping[str | None, Any],
               labels: Mapping[str, str]) -> tuple[list[dict[str, Any]], list[str]]:  # fmt: skip
    """Leaves out what the original's second runs (``noise``: per set, ``{"noisy": {output: max abs}}``
    or ``{"error": ...}``) show is not the optimised model's doing, in place; the ``not_compared``
    entries and their notes."""
    not_compared: list[dict[str, Any]] = []
    notes: list[str] = []
    for key, answer in noise.items():
        name = key or "normal"
        label = labels.get(name, name)
        if answer.get("error"):
            reason = f"onnxruntime fails when it runs the original again on these inputs: {answer['error']}"
            dropped = {n: None for n in answer["names"]}
        else:
            reason = "the original's own output differs between two runs on these inputs"
            dropped = answer.get("noisy", {})
        for output, error in dropped.items():
            why = reason if error is None else f"{reason} (max abs {error:.3g})"
            not_compared.append({"output": output, "set": name, "reason": why})
            notes.append(f"output {shown(output)} not compared on the {label} inputs ({name!r}): {why}")
        if key is None:
            for i, o in enumerate(outputs):
                if o.name in dropped:
                    outputs[i] = OutputComparison(o.name, True, o.dtype, o.shape, input_set="normal",
                                                  message=f"not compared: {reason}")  # fmt: skip
        else:
            for answer_set in sets:
                if answer_set["name"] == key:
                    answer_set["outputs"] = [o for o in answer_set["outputs"] if o["name"] not in dropped]
                    answer_set["ok"] = not answer_set["outputs"] and not answer_set.get("error")
    return not_compared, notes


def merge_sets(outputs: list[OutputComparison], sets: list[dict[str, Any]],
               records: list[dict[str, Any]]) -> tuple[list[str], list[dict[str, Any]], str | None]:  # fmt: skip
    """Each output's comparison on the first set where it differs (the chosen inputs' otherwise),
    in place; the sets the optimised model does not run on; the sets' records with their verdicts;
    the first set where an output differs (None: none)."""
    last = [dict(r) for r in records]
    by_name = {r["name"]: r for r in last}
    by_name["normal"]["ok"] = all(o.ok for o in outputs)
    position = {o.name: i for i, o in enumerate(outputs)}
    errors = []
    failing = None if by_name["normal"]["ok"] else "normal"
    for found in sets:
        record = by_name.get(found["name"], {"label": found["name"]})
        record["ok"] = bool(found["ok"])
        if found.get("within_scale"):
            record["within_scale"] = found["within_scale"]
        if not found["ok"] and failing is None:
            failing = found["name"]
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
    return errors, last, failing


def declaration_notes(declared: Mapping[str, list[Any]], outputs: Mapping[str, Any]) -> list[str]:
    """The outputs whose ``declared`` shape the original's computed one (``outputs``: described) contradicts."""
    notes = []
    for name, dims in declared.items():
        shape = (outputs.get(name) or {}).get("shape")
        if shape is None:
            continue
        if len(dims) != len(shape) or any(isinstance(d, int) and d != s for d, s in zip(dims, shape)):
            text = "[" + ", ".join(str(d) if isinstance(d, int) else shown(d or "?") for d in dims) + "]"
            notes.append(f"the original model declares output {shown(name)} as {text} but computes {shape}")
    return notes


def runs_free(worker: Any, prepare: dict[str, Any], specs: list[plan.InputSpec],
              free_dims: Mapping[str, int | Sequence[int]], deadline: float) -> bool:  # fmt: skip
    """Whether the original (``prepare``'s model) runs on generated inputs without the run's static
    shapes, at the caller's own ``--dim`` sizes ``free_dims``, the others planned (a failure with
    them is then the static shapes' doing: ``CheckResult.shapes_refused``)."""
    free = {k: v if isinstance(v, int) else v[0] for k, v in free_dims.items()}
    tries, _ = plan.size_tries(specs, dims=free)
    try:
        return bool(tries) and bool(worker.request({**prepare, "tries": tries}, deadline).get("ok"))
    except (WorkerError, OSError):
        return False
