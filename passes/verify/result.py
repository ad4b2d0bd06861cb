"""What the check found: plain data the report, the command and the check's child share.

:class:`CheckResult` is one run of the check (passed, failed, or why it did not run), with an
:class:`OutputComparison` per output, the :class:`InputsUsed` both models ran on and, after a
failure, the :class:`FirstDifference` the locator found; each gives its JSON form (strict JSON:
:func:`json_safe`) and the text the command prints (names cut by :func:`shown`). What the check
does when nothing is said (sizes, tries, time limit, tolerances) is :mod:`passes.verify.defaults`.
The check's child process imports this module, so it must stay cheap: the standard library only
(and :mod:`passes.options`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from passes.options import short

__all__ = [
    "QUOTE_LIMIT",
    "CheckResult",
    "FirstDifference",
    "InputsUsed",
    "OutputComparison",
    "json_safe",
    "name_text",
    "shown",
    "shown_names",
    "unchecked_json",
]

#: Characters of a name or value quoted in a message (a name may be megabytes long).
QUOTE_LIMIT = 100


def shown(text: Any) -> str:
    """``repr(text)`` cut to about :data:`QUOTE_LIMIT` characters, for a message."""
    return short(str(text), QUOTE_LIMIT)


def name_text(name: str) -> str:
    """A name as is, unless it is long (then quoted and cut)."""
    return name if len(name) <= QUOTE_LIMIT else shown(name)


def shown_names(names: list[str], limit: int = 5) -> str:
    """Some names, each cut, then how many more."""
    text = ", ".join(shown(n) for n in names[:limit])
    return text + (f" and {len(names) - limit} more" if len(names) > limit else "")


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float as a string (``"inf"``, ``"-inf"``, ``"nan"``): strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


@dataclasses.dataclass
class OutputComparison:
    """How one output of the optimised model compares with the original's.

    ``tolerance_dtype`` is the float type that chose the tolerance (the
    lowest-precision one the output depends on) and ``tolerance_value`` the
    value of the original graph that has it (or the flag: ``--precision-tolerance``);
    both empty for an exact comparison or when ``--rtol`` and ``--atol`` set it;
    ``tolerance_flags`` the flags that set it (``--rtol``, ``--atol``, both, or "").
    ``input_set`` names the set of inputs compared (see :class:`InputsUsed`):
    the first one where the output differs, else the first set. ``within_scale``
    counts the elements of the edge-value sets that are beyond the tolerance of
    their own value but within that of the output's largest magnitude (rounding
    of sums of huge terms where they cancel).
    """

    name: str
    ok: bool
    dtype: str = ""
    shape: tuple[int, ...] | None = None
    max_abs_error: float = 0.0
    max_rel_error: float = 0.0
    mismatches: int = 0
    message: str = ""
    rtol: float | None = None
    atol: float | None = None
    tolerance_dtype: str = ""
    tolerance_value: str = ""
    input_set: str = "normal"
    within_scale: int = 0
    tolerance_flags: str = ""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> OutputComparison:
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in fields}
        if values.get("shape") is not None:
            values["shape"] = tuple(values["shape"])
        return cls(**values)

    def tolerance_text(self, precision: str = "") -> str:
        """``rtol 0.0001 atol 1e-05: float32's default``, ``rtol 0 atol 0: --rtol --atol``,
        ``rtol 0 (--rtol) atol 1e-05 (float32's default)``, ``rtol 0.01 atol 0.001: float16's default
        (--precision fp16)``; ``exact`` for a comparison without tolerance. ``precision``: the run's
        ``--precision`` value, said when it chose the type."""
        if self.rtol is None:
            return "exact"
        if self.tolerance_value == "--precision-tolerance":
            default = "--precision-tolerance"
        elif self.tolerance_value.startswith("--precision"):
            default = f"{self.tolerance_dtype}'s default (--precision {precision})" if precision else \
                f"{self.tolerance_dtype}'s default (--precision)"
        else:
            default = f"{self.tolerance_dtype or 'the type'}'s default"
        flags = self.tolerance_flags.split()
        if not flags:
            return f"rtol {self.rtol:g} atol {self.atol:g}: {default}"
        if len(flags) == 2:
            return f"rtol {self.rtol:g} atol {self.atol:g}: --rtol --atol"
        rtol_from = "--rtol" if flags == ["--rtol"] else default
        atol_from = "--atol" if flags == ["--atol"] else default
        return f"rtol {self.rtol:g} ({rtol_from}) atol {self.atol:g} ({atol_from})"

    def bound_text(self, within_scale: int = 0) -> str:
        """Why an output that passed shows a relative error beyond ``rtol``: the bound its elements met
        (``atol``, and for ``within_scale`` elements ``rtol`` of the output's largest magnitude); ""
        when every element was within ``rtol`` of its own value."""
        if not self.ok or self.rtol is None or self.atol is None or not self.max_rel_error > self.rtol:
            return ""
        scaled = f" or, for {within_scale} element(s), within {self.rtol:g} of the output's largest magnitude" \
            if within_scale else ""
        return f" (beyond rtol {self.rtol:g} only within atol {self.atol:g}{scaled})"


@dataclasses.dataclass
class InputsUsed:
    """The inputs both models ran on.

    Attributes:
        given: Names of the inputs the caller gave.
        generated: Names of the generated inputs.
        seed: Seed of the generated inputs.
        dims: Size of each named dynamic dimension.
        shapes: Shape of every input.
        tries: How many sets of generated sizes were tried (1 when the first ran).
        attempts: For each failed try, its sizes and the error.
        sets: Every set of inputs the check planned, in order: ``name`` (``normal``: the
            seeded standard-normal inputs above; ``edge``, ``edge-nonfinite``: edge values
            of each input's type, without and with NaN and infinities; ``zero-dims``: every
            dynamic dimension 0), ``label``, ``tried`` (False: the set does not apply, e.g.
            no dynamic dimension), ``ran`` (the original ran on it, so both models were
            compared on it), ``ok`` (None until compared), ``note`` (why it was skipped;
            a set tried and skipped is also one of the result's ``notes``), ``dims`` (the
            0-sized set's sizes) and, for the edge-value sets, ``within_scale``: per output,
            how many elements matched only within the tolerance of the output's largest
            magnitude; ``shapes``: the inputs' shapes of a set that ran. ``larger``, ``larger-2``...:
            the dynamic dimensions at larger sizes (:mod:`passes.verify.sets`).
        sizes: Each dynamic dimension's sizes over the sets both models ran on, the chosen
            inputs' first (a named one by its name, an unnamed one as ``input[axis]``).
    """

    given: list[str] = dataclasses.field(default_factory=list)
    generated: list[str] = dataclasses.field(default_factory=list)
    seed: int = 0
    dims: dict[str, int] = dataclasses.field(default_factory=dict)
    shapes: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    tries: int = 0
    attempts: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    sets: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    sizes: dict[str, list[int]] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def sets_text(self) -> str:
        """``also edge-value, NaN/infinity inputs; skipped: 0-sized-dimension (see the note)``, or "".

        Why a set tried was skipped is one of the result's notes (printed after the outputs), not repeated here.
        """
        ran = [s["label"] for s in self.sets[1:] if s.get("ran")]
        skipped = [f"{s['label']} (see the note)" for s in self.sets[1:] if s.get("tried") and not s.get("ran")]
        parts = [f"also {', '.join(ran)} inputs"] if ran else []
        if skipped:
            parts.append("skipped: " + "; ".join(skipped))
        return "; ".join(parts)

    def sizes_text(self) -> str:
        """``batch=1, height=64`` (named dims), else the generated inputs' shapes."""
        if self.dims:
            return ", ".join(f"{name_text(k)}={v}" for k, v in self.dims.items())
        shapes = {k: v for k, v in self.shapes.items() if k in self.generated}
        return ", ".join(f"{name_text(k)}{list(v)}" for k, v in shapes.items()) or "static shapes"

    def text(self) -> str:
        parts = []
        if self.generated:
            parts.append(f"generated (seed {self.seed}): {self.sizes_text()}")
        if self.sizes:  # sizes checked: batch 1, 3, 0; sequence 16, 256, 0
            parts.append("sizes checked: " + "; ".join(f"{name_text(k)} {', '.join(map(str, v))}"
                                                       for k, v in self.sizes.items()))  # fmt: skip
        if self.given:
            parts.append("given: " + ", ".join(name_text(n) for n in self.given))
        if self.tries > 1:
            parts.append(f"try {self.tries}; earlier sizes did not run: {self.attempts[0].get('error', '')}")
        if self.sets_text():
            parts.append(self.sets_text())
        return "; ".join(parts) or "none"


@dataclasses.dataclass
class FirstDifference:
    """Where the optimised model starts to differ from the original.

    Attributes:
        node: Name of the first node, in the original's topological order, whose
            output differs beyond tolerance ("" if none could be named).
        op: Its op type (``domain::op`` outside the default domain).
        position: Its index in the original graph's node list.
        output: The output of that node that differs.
        max_abs_error: That output's max abs error.
        inputs: For each input of the node: its name and max abs error, or None
            when the optimised model has no value of that name to compare.
        pass_name: The pass whose addition to the pipeline brings the mismatch
            (found by rerunning the pipeline with fewer passes), or "".
        pipelines: Each rerun: the passes it ran and whether the check passed.
        compared: How many intermediate values were compared (those both models compute the same
            way: see ``passes.verify.locate``).
        seconds: Time the locator took.
        message: Why it could not say more, if it could not.
        rewritten: The nodes of the original before it whose outputs the passes rewrote (a fused
            Conv) or removed (a BatchNormalization fused away), so not compared: ``node``, ``op``,
            ``position``, ``how``; the difference may start there.
    """

    node: str = ""
    op: str = ""
    position: int = -1
    output: str = ""
    max_abs_error: float = 0.0
    inputs: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    pass_name: str = ""
    pipelines: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    compared: int = 0
    seconds: float = 0.0
    message: str = ""
    rewritten: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def rewritten_text(self) -> str:
        """``'a' (Conv, rewritten), 'b' (BatchNormalization, fused away or removed)``, or ""."""
        return ", ".join(f"{shown(r['node'] or '#' + str(r['position']))} ({r['op']}, {r['how']})"
                         for r in self.rewritten)

    def summary(self) -> str:
        """One or two lines: the node and its inputs' errors; the pass."""
        lines = []
        if self.output:
            label = f"node {shown(self.node)}" if self.node else f"the node making {shown(self.output)}"
            differing = [i for i in self.inputs if i.get("max_abs_error") is not None and not i.get("ok", True)]
            unknown = [i["name"] for i in self.inputs if i.get("max_abs_error") is None]
            worst = max((i["max_abs_error"] for i in self.inputs if i.get("max_abs_error") is not None), default=0.0)
            if differing:
                first = differing[0]
                why = (f"its input {shown(first['name'])} ({first.get('kind', 'value')}) already differs "
                       f"(max abs error {first['max_abs_error']:.3g})")  # fmt: skip
            elif worst == 0 and not unknown:
                why = "its inputs are identical: this node itself changed the result"
            elif len(unknown) == len(self.inputs):
                why = f"its inputs are not compared ({shown_names(unknown)})"
            elif worst == 0:
                why = f"its compared inputs are identical (not compared: {shown_names(unknown)})"
            else:
                why = f"its inputs match within tolerance (max abs error {worst:.3g})"
            if self.rewritten and not differing:
                why += f"; before it, the passes rewrote nodes whose values are not compared: {self.rewritten_text()}"
            lines.append(
                f"first difference: {label} ({self.op}, #{self.position} in the original), output "
                f"{shown(self.output)} max abs error {self.max_abs_error:.3g}; {why}"
            )
        elif self.message:
            rewritten = f": {self.rewritten_text()}" if self.rewritten else ""
            lines.append(f"first difference: not located ({self.message}{rewritten})")
        if self.pass_name:
            lines.append(f"  introduced by pass {shown(self.pass_name)} (the pipeline without it matches)")
        elif self.pipelines:
            lines.append("  no single pass found: " + "; ".join(
                f"{'+'.join(p['passes']) or '(none)'}: {'ok' if p['ok'] else 'differs'}" for p in self.pipelines))
        return "\n".join(lines)


def unchecked_json(reason: str) -> dict[str, Any]:
    """The report's ``check`` when there is no :class:`CheckResult` (``--no-check``, a run that stopped
    before its check, a model the ONNX checker refused): the same fields, ``checked`` false."""
    return {"ok": None, "checked": False, "reason": reason, "skipped": reason, "hint": None, "error": None,
            "inputs": None, "outputs": [], "first_difference": None, "repro": None, "notes": [], "seconds": {},
            "not_compared": [], "without_fusions": None}


@dataclasses.dataclass
class CheckResult:
    """The outcome of :func:`passes.check`.

    Attributes:
        ok: True when every output matched (or the check did not run: see ``checked``;
            the JSON form says ``null`` then, so that a reader of ``ok`` alone is not told
            that an unchecked model passed).
        skipped: Why the check could not run (the original model does not run in
            onnxruntime on any inputs tried, crashed or timed out, or inputs cannot
            be generated); None when it ran.
        hint: What would let it run (``--dim NAME=SIZE``, ``--inputs FILE.npz``...).
        error: Why the optimised model failed to run where the original ran.
        inputs_rejected: The check did not run because the original model does not
            run on the inputs the caller gave (wrong names, dtypes or shapes).
        shapes_refused: onnxruntime's message where the original model does not run at the
            static shapes the run declares (``--input-shape``, ``--fix-dim``) but runs without them:
            the request is what fails (see ``free_dims`` of :class:`passes.verify.check.Checker`).
        outputs: One comparison per output of the original model.
        inputs: The inputs both models ran on.
        first_difference: Where a mismatch starts (only after a failure).
        notes: Facts about the original found on the way (a declared output shape
            its graph contradicts...).
        seconds: Time of the check and, after a failure, of the locator.
        not_compared: The outputs left out of the comparison on a set of inputs, because the
            original disagrees with itself there or onnxruntime fails to run it again (see
            :mod:`passes.verify.verdict`): ``{"output", "set", "reason"}`` each; never a failure.
        repro: With ``--repro DIR``, after a difference: what was written there (see
            :func:`passes.verify.repro.reproduce`), or None.
        without_fusions: After a difference in a run whose simplify fused, the same run without
            the fusions (:func:`passes.pipeline_check.unfused`): ``{"fused", "fused_check",
            "unfused_check"}``, the fusions' count, the fused model's failure and the unfused model's
            ("passed" when it is the one written); None when not tried.
    """

    ok: bool
    skipped: str | None = None
    error: str | None = None
    inputs_rejected: bool = False
    shapes_refused: str | None = None
    outputs: list[OutputComparison] = dataclasses.field(default_factory=list)
    hint: str = ""
    inputs: InputsUsed | None = None
    first_difference: FirstDifference | None = None
    notes: list[str] = dataclasses.field(default_factory=list)
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    repro: dict[str, Any] | None = None
    not_compared: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    without_fusions: dict[str, Any] | None = None

    @property
    def checked(self) -> bool:
        """Whether the models were actually compared."""
        return self.skipped is None

    @property
    def failures(self) -> list[OutputComparison]:
        return [o for o in self.outputs if not o.ok]

    def summary(self) -> str:
        if self.skipped:
            hint = f"; {self.hint}" if self.hint else ""
            return f"NOT CHECKED: {self.skipped}{hint}"
        if self.error:
            text = f"check failed: the optimised model does not run: {self.error}"
        elif self.ok:
            text = f"check passed: {len(self.outputs)} output(s) match"
        else:
            text = "check failed: " + "; ".join(f"output {shown(o.name)}: {o.message}" for o in self.failures[:5])
            if len(self.failures) > 5:
                text += f"; and {len(self.failures) - 5} more output(s)"
        if self.first_difference is not None:
            text += "\n" + self.first_difference.summary()
        if self.repro is not None:
            text += "\n" + self.repro_text()
        return text

    def repro_text(self) -> str:
        """``--repro DIR``'s line: what was written there and how to compare it again, or why not."""
        assert self.repro is not None
        r = self.repro
        if not r.get("written"):
            return f"reproduction: none written to {shown(r['folder'])}: {r.get('message', '')}"
        stopped = f"; the search stopped early ({r['stopped']}): the smallest found by then" if r.get("stopped") else ""
        return (f"reproduction: {shown(r['folder'])}: {r['original_nodes']} and {r['optimized_nodes']} node(s) whose "
                f"output {shown(r['output'])} differs in {r['mismatches']} element(s) (max abs error "
                f"{r['max_abs_error']:.3g}){stopped}; compare them again: {r['rerun']}")

    @property
    def reason(self) -> str | None:
        """Why the check did not run or did not pass, in one line; None when it passed."""
        if self.skipped:
            return self.skipped
        if self.error:
            return f"the optimised model does not run: {self.error}"
        return None if self.ok else self.summary().split("\n", 1)[0]

    def to_json(self) -> dict[str, Any]:
        return json_safe({
            "ok": self.ok if self.checked else None,
            "checked": self.checked,
            "reason": self.reason,
            "skipped": self.skipped,
            "hint": self.hint or None,
            "error": self.error,
            "inputs": self.inputs.to_json() if self.inputs else None,
            "outputs": [o.to_json() for o in self.outputs],
            "first_difference": self.first_difference.to_json() if self.first_difference else None,
            "notes": list(self.notes),
            "not_compared": list(self.not_compared),
            "seconds": dict(self.seconds),
            "repro": self.repro,
            "without_fusions": self.without_fusions,
        })
