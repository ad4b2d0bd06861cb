"""The check's sets of inputs after the chosen one: which to make, and running the original on them.

:func:`plan_sets` describes each set (see :attr:`passes.verify.result.InputsUsed.sets`):
the larger sizes (:func:`passes.verify.plan.larger_sizes`: each dynamic dimension
at a larger size than the one that ran, ``--dim NAME=A,B,...``'s further sizes),
then edge values of each input's type (:mod:`passes.verify.edges`), the same with
NaN and infinities, and every dynamic dimension 0 (else only the first); with
``--precision``, two more standard-normal seeds instead of the edge values, and
a sequence-like dimension long (:data:`passes.verify.plan.LONG_SEQUENCE`).
:class:`SetRunner` runs the original on each in its own request to the child: a
set it cannot run (an error, a crash, no time left in :data:`EXTRA_SETS_SHARE`
of the time limit) is skipped with a note, never a failure; a larger set runs
only within :func:`affordable`'s budget, else it is skipped and the note says so.

The long sizes are bounded by what they are measured to cost, not by an estimate
linear in their bytes (eager attention grows with the square of the sequence):
the shortest runs first (within :func:`affordable`), and each longer one
(``grows``) runs too, as one more set, only while its time predicted from the
last measured run, growing at least as the square of the size
(:data:`GROWTH_EXPONENT`, more if the last two runs measured more), stays under
:func:`larger_seconds`; the note of the longest that ran says why not longer.
Every set runs again for each model compared (each round of the precision search).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

from passes.verify import lowest as _lowest, plan
from passes.verify.child import Worker, WorkerCrashed, WorkerTimeout
from passes.verify.result import name_text

__all__ = ["EXTRA_SETS_SHARE", "FAST_SECONDS", "GROWTH_EXPONENT", "LARGER_BYTES", "LARGER_SECONDS", "SetRunner",
           "affordable", "larger_seconds", "plan_sets", "predicted", "sizes_text"]

#: The share of the check's time limit that the original's runs on the sets after the chosen
#: one may take (edge values, 0-sized dims, larger sizes); the optimised model's runs take about as much.
EXTRA_SETS_SHARE = 0.25

#: A larger set runs when the chosen inputs' run took less than this many seconds...
FAST_SECONDS = 0.25
#: ... or is estimated within this factor of it; and, either way, under :data:`LARGER_BYTES` of inputs and outputs.
SLOWER_FACTOR = 2.0
#: Bytes of inputs plus outputs (estimated) above which a larger set is not run.
LARGER_BYTES = 1 << 30
#: Seconds one run of the original on a larger set may be estimated at, unless the chosen inputs'
#: run took more than half of it (:func:`larger_seconds`): it runs again for every model compared
#: (each round of the precision search).
LARGER_SECONDS = 2.0
#: A longer size's run is predicted from the last measured one as (size ratio) ** this at least
#: (eager attention's scores are quadratic in the sequence).
GROWTH_EXPONENT = 2.0


def sizes_text(dims: Mapping[str, int]) -> str:
    """``batch=3, sequence=256``."""
    return ", ".join(f"{name_text(k)}={v}" for k, v in dims.items())


def _larger_sets(specs: list[plan.InputSpec], chosen: dict[str, Any], shapes: Any, dims: Mapping[str, int],
                 lists: Mapping[str, Sequence[int]], precision: str | None, seed: int,
                 out_bytes: int) -> list[tuple[dict[str, Any], str]]:  # fmt: skip
    """The larger-size sets, each with its estimate (scale of the inputs' bytes, bytes of inputs and
    outputs), its longer forms (``grows``: with ``--precision``, a long sequence's further sizes, each
    run as one more set while the measured runs predict it affordable) and its shorter form
    (``fallbacks``: every dim at most twice its size, :func:`passes.verify.plan.larger_sizes`'s
    ``modest``), tried when the original does not run the first form or it is over the budget."""
    steps = max([1, *(len(v) - 1 for v in lists.values())])
    base_bytes = max(1, plan.input_bytes(chosen))
    longs: tuple[int | None, ...] = plan.LONG_SEQUENCE if precision is not None else (None,)
    found: list[tuple[dict[str, Any], str]] = []
    for step in range(1, steps + 1):
        forms: list[dict[str, Any]] = []
        for long, modest in [*((n, False) for n in longs), (None, True)]:
            sized = plan.larger_sizes(specs, chosen, step=step, dims=dims, lists=lists, given=shapes, sequence=long,
                                      modest=modest)  # fmt: skip
            if sized is None or (forms and sized["inputs"] == forms[-1]["inputs"]):
                continue
            scale = plan.input_bytes(sized) / base_bytes
            name = "larger" if steps == 1 else f"larger-{step}"
            forms.append({"name": name, "label": f"larger-size ({sizes_text(sized['dims']) or 'unnamed dims'})",
                          "kind": "sizes", **sized, "seed": seed + 3 if precision else seed,
                          "estimate": {"scale": scale, "bytes": int(plan.input_bytes(sized) + out_bytes * scale)},
                          "as": f"at {sizes_text(sized['dims']) or 'smaller unnamed dims'}", "modest": modest})  # fmt: skip
        if not forms:
            if step == 1:
                found.append(({"name": "larger", "label": "larger-size", "kind": "sizes"},
                              "no dynamic dimension left free to take a larger size"))  # fmt: skip
            continue
        modest = [form.pop("modest") for form in forms]
        first = forms[0]
        longer = [f for f, m in zip(forms[1:], modest[1:]) if not m]
        if longer:
            first["grows"] = longer
        if len(longer) < len(forms) - 1:
            first["fallbacks"] = [f for f, m in zip(forms[1:], modest[1:]) if m]
        found.append((first, ""))
    return found


def plan_sets(specs: list[plan.InputSpec], given: dict[str, Any] | None, chosen: dict[str, Any], *,
              dims: Mapping[str, int], lists: Mapping[str, Sequence[int]] | None = None,
              precision: str | None = None, seed: int = 0,
              out_bytes: int = 0) -> list[tuple[dict[str, Any], str]]:  # fmt: skip
    """Each set after the chosen one: its description, and why it cannot be made ("" if it can).
    A set may have other forms (``fallbacks``, each saying ``as`` what), tried in turn when the
    original does not run the first or it is over the budget: the 0-sized-dims set with only the
    first dynamic dimension 0, the others as chosen; the larger set at shorter sizes."""
    keep = sorted(s.name for s in specs if s.index)
    values = [s for s in specs if not s.index and s.dtype is not None and s.dtype != "bool"]
    floats = [s for s in values if s.dtype in _lowest.FLOAT_TYPES.values()]
    shapes = given["shapes"] if given else None
    zero = plan.zero_sizes(specs, dims=dims, given=shapes)
    first = plan.zero_sizes(specs, dims=dims, given=shapes, base=chosen)
    if zero is not None and first is not None and first["inputs"] != zero["inputs"]:
        zero["fallbacks"] = [{"name": "zero-dims", "label": "0-sized-dimension", "kind": "sizes", **first,
                              "as": "with only the first dynamic dimension 0"}]  # fmt: skip
    larger = _larger_sets(specs, chosen, shapes, dims, lists or {}, precision, seed, out_bytes)
    zeros = ({"name": "zero-dims", "label": "0-sized-dimension", "kind": "sizes", **(zero or {})},
             "" if zero else "no dynamic dimension left free to be 0")  # fmt: skip
    if precision is not None:
        generated = "" if chosen["inputs"] else "every input is given: no other seed to draw"
        return [
            *(({"name": f"normal-{k}", "label": f"seeded standard-normal (seed {seed + k})",
                "kind": "sizes", "inputs": chosen["inputs"], "dims": chosen["dims"], "seed": seed + k},
               generated) for k in (1, 2)),
            *larger, zeros,
        ]  # fmt: skip
    return [
        *larger,
        ({"name": "edge", "label": "edge-value", "kind": "edge", "keep": keep},
         "" if values else "no input takes edge values (each is an index, a shape, a size or a bool)"),
        ({"name": "edge-nonfinite", "label": "NaN/infinity", "kind": "nonfinite", "keep": keep},
         "" if floats else "no float input that takes NaN or infinities"),
        zeros,
    ]  # fmt: skip


def affordable(estimate: Mapping[str, Any], seconds: float) -> str:
    """Why a larger set is over the check's budget ("" when it is not): its inputs and outputs
    over :data:`LARGER_BYTES`, or the chosen inputs' run ``seconds`` not under :data:`FAST_SECONDS`
    and the larger set estimated (linearly in its inputs' bytes: a floor) beyond :data:`SLOWER_FACTOR`
    times it, or that estimate over :func:`larger_seconds` whatever the first run took."""
    scale, size = float(estimate["scale"]), int(estimate["bytes"])
    if size > LARGER_BYTES:
        return f"its inputs and outputs are estimated at {size / (1 << 20):.0f} MiB, over {LARGER_BYTES >> 20} MiB"
    if seconds >= FAST_SECONDS and scale > SLOWER_FACTOR:
        return (f"the chosen inputs' run took {seconds:.2g} s and this set is estimated at {seconds * scale:.2g} s "
                f"(more than {SLOWER_FACTOR:g}x)")  # fmt: skip
    if seconds * scale > larger_seconds(seconds):
        return (f"the chosen inputs' run took {seconds:.2g} s and this set is estimated at {seconds * scale:.2g} s "
                f"at least, over {larger_seconds(seconds):.2g} s")  # fmt: skip
    return ""


def larger_seconds(seconds: float) -> float:
    """Seconds one run on a larger set may take when the chosen inputs' run took ``seconds``:
    :data:`LARGER_SECONDS`, or :data:`SLOWER_FACTOR` times that run if more."""
    return max(LARGER_SECONDS, SLOWER_FACTOR * seconds)


def predicted(measured: float, ratio: float, exponent: float) -> float:
    """Seconds a run at ``ratio`` times the size of one that took ``measured`` is predicted at."""
    return measured * ratio ** max(GROWTH_EXPONENT, exponent)


class SetRunner:
    """Runs the original on the planned sets in the child, keeping those it runs.

    Attributes:
        prepare: The ``prepare`` request that chose the inputs (restored first after a crash).
        kept: The sets the original ran on, in order (restored after it).
        shapes: The inputs' shapes of the last set the original ran on.
    """

    def __init__(self, worker: Worker, timeout: float) -> None:
        self.worker = worker
        self.timeout = timeout
        self.prepare: dict[str, Any] = {}
        self.kept: list[dict[str, Any]] = []
        self.shapes: dict[str, list[int]] = {}  # the inputs' shapes of the last set added
        self.seconds = 0.0  # the original's run on the last set added

    def run(self, plans: list[tuple[dict[str, Any], str]], seconds: float,
            deadline: float) -> list[dict[str, Any]]:  # fmt: skip
        """Runs the original on each planned set (the chosen inputs' run took ``seconds``); the
        records of every set, the chosen one (``normal``) first.

        A set the original cannot run (an error, a crash, no time left, over the budget) is skipped
        with a note; a crash or a timeout restarts the child with the sets kept so far.
        """
        records = [{"name": "normal", "label": "seeded standard-normal", "tried": True, "ran": True, "ok": None,
                    "note": ""}]  # fmt: skip
        self.kept = []
        budget = time.monotonic() + self.timeout * EXTRA_SETS_SHARE
        for description, reason in plans:
            record = {"name": description["name"], "label": description["label"], "tried": not reason,
                      "ran": False, "ok": None, "note": reason, "dims": None}  # fmt: skip
            records.append(record)
            if not reason:
                ran = self._run_forms(record, description, seconds, min(budget, deadline), deadline)
                if ran is not None and ran.get("estimate"):
                    records.extend(self._grow(record, ran, description.get("grows", ()), seconds,
                                              min(budget, deadline), deadline))  # fmt: skip
        return records

    def _run_forms(self, record: dict[str, Any], description: dict[str, Any], seconds: float, budget: float,
                   deadline: float) -> dict[str, Any] | None:  # fmt: skip
        """Runs the original on the first form of a set (it, then its ``fallbacks``) that is within the
        budget and runs, and says in the record's note why the forms before it were not used; the
        form that ran, if it is the first (whose ``grows`` may follow), else None."""
        said: list[str] = []
        used: dict[str, Any] | None = None
        for number, form in enumerate((description, *description.get("fallbacks", ()))):
            lead = f"nor {form['as']}: " if number else ""
            over = affordable(form["estimate"], seconds) if "estimate" in form else ""
            if over:
                said.append(f"{lead}over the check's budget: {over}" if number else
                            f"{form.get('as', 'it is')} over the check's budget: {over}")  # fmt: skip
                continue
            expected = seconds * float(form.get("estimate", {}).get("scale", 1.0))
            now = time.monotonic()
            if now + expected > budget:
                said.append(f"no time left: the original takes {expected:.2g} s a run and the check gives more "
                            f"sets {self.timeout * EXTRA_SETS_SHARE:g} s of --check-timeout")  # fmt: skip
                break
            run = {k: v for k, v in form.items() if k not in ("fallbacks", "grows", "estimate", "as")}
            error = self.add(run, min(deadline, now + max(10.0, 10 * expected)), deadline, now)
            if error is None:
                record.update(ran=True, dims=form.get("dims"), shapes=self.shapes, label=form["label"])
                if said:
                    said.append(f"it runs {form['as']}, which was used")
                used = form if number == 0 else None
                break
            where = f" {form['as']}" if "as" in form else ""
            said.append(f"{lead}{error}" if number else f"the original does not run on it{where}: {error}")
        record["note"] = "; ".join(said)
        return used

    def _grow(self, record: dict[str, Any], ran: dict[str, Any], grows: Sequence[dict[str, Any]], seconds: float,
              budget: float, deadline: float) -> list[dict[str, Any]]:  # fmt: skip
        """Runs the original on each longer form of a set that ran (``ran``, whose ``record`` it is), as
        one more set each, while its run predicted from the last measured one (:func:`predicted`)
        is under :func:`larger_seconds` and the budget; the records of those that ran. The last record
        that ran says why no longer form ran (none when every one did)."""
        added: list[dict[str, Any]] = []
        last, measured, scale = record, self.seconds, float(ran["estimate"]["scale"])
        exponent = GROWTH_EXPONENT
        for number, form in enumerate(grows, 1):
            ratio = float(form["estimate"]["scale"]) / max(scale, 1e-9)
            expected = predicted(measured, ratio, exponent)
            over = affordable(form["estimate"], 0.0)
            why = ""
            if over:
                why = f"over the check's budget: {over}"
            elif expected > larger_seconds(seconds):
                why = (f"the run {ran['as']} took {measured:.2g} s, so this one is predicted at {expected:.2g} s "
                       f"(growing as the size to the power {max(GROWTH_EXPONENT, exponent):.2g}), "
                       f"over {larger_seconds(seconds):.2g} s")  # fmt: skip
            elif time.monotonic() + expected > budget:
                why = (f"no time left: predicted at {expected:.2g} s and the check gives more sets "
                       f"{self.timeout * EXTRA_SETS_SHARE:g} s of --check-timeout")  # fmt: skip
            if not why:
                now = time.monotonic()
                name = f"{ran['name']}+{number}"
                run = {k: v for k, v in form.items() if k not in ("fallbacks", "grows", "estimate", "as")}
                error = self.add({**run, "name": name}, min(deadline, now + max(10.0, 10 * expected)), deadline, now)
                if error is None:
                    last = {"name": name, "label": form["label"], "tried": True, "ran": True, "ok": None, "note": "",
                            "dims": form.get("dims"), "shapes": self.shapes}  # fmt: skip
                    added.append(last)
                    if measured > 0 and self.seconds > 0 and ratio > 1:
                        exponent = math.log(self.seconds / measured) / math.log(ratio)
                    measured, scale, ran = self.seconds, float(form["estimate"]["scale"]), form
                    continue
                why = f"the original does not run on it: {error}"
            text = f"not {form['as']}: {why}"
            last["note"] = f"{last['note']}; {text}" if last["note"] else text
            break
        return added

    def add(self, description: dict[str, Any], limit: float, deadline: float, now: float) -> str | None:
        """Runs the original on one more set; why it does not run, or None (the set is kept)."""
        try:
            answer = self.worker.request({"op": "add_set", "set": description}, limit)
        except WorkerTimeout as e:
            self.restore(deadline)
            return f"it did not finish within {limit - now:.3g} s ({e.phase})"
        except WorkerCrashed as e:
            self.restore(deadline)
            return str(e)
        if not answer.get("ok"):
            return str(answer.get("error", ""))
        self.kept.append(description)
        self.shapes = answer.get("shapes", {})
        self.seconds = float(answer.get("seconds", 0.0))
        return None

    def restore(self, deadline: float) -> None:
        """A new child with the chosen inputs and the sets kept so far (after a crash or a timeout).

        Raises:
            WorkerError: the child cannot do again what it did.
        """
        again = self.worker.request(self.prepare, deadline)
        if not again.get("ok"):
            raise WorkerCrashed(f"the original did not run again: {again.get('error', '')}", "restarting")
        for description in self.kept:
            again = self.worker.request({"op": "add_set", "set": description}, deadline)
            if not again.get("ok"):
                raise WorkerCrashed(f"the original did not run again: {again.get('error', '')}", "restarting")
