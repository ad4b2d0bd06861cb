"""The report printed at the end of a run (and written as JSON with ``--report``)."""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
import re
from collections.abc import Iterable
from typing import IO, Any

import numpy as np
import onnx_ir as ir

from passes.atomic import write_text
from passes.errors import CheckFailedError, InputError
from passes.ir.walk import default_opset, iter_scopes
from passes.verify.result import QUOTE_LIMIT, CheckResult, name_text, unchecked_json

__all__ = ["ModelSummary", "PassRun", "Report", "disk_bytes", "human_bytes", "signature_text", "summarize"]


@dataclasses.dataclass
class PassRun:
    """What one pass did: its time, whether it changed the model, and its own statistics."""

    name: str
    seconds: float
    modified: bool
    stats: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: The error the pass raised (its message), or None.
    error: str | None = None


@dataclasses.dataclass
class ModelSummary:
    """Counts of a model: op types (main graph, subgraphs and functions), nodes, initializers;
    its signature (the graph's inputs and outputs: name, dtype, shape) and its size on disk.

    ``inputs`` and ``outputs`` hold ``{"name", "dtype", "shape"}`` per value (a dim: its size,
    its name, or None when unknown; ``shape`` None when the rank is unknown); ``file_bytes`` is
    the ``.onnx`` file with its external data (None for a model that is not in a file).
    """

    op_counts: dict[str, int]
    nodes: int
    initializers: int
    initializer_bytes: int
    opset: dict[str, int]
    inputs: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    outputs: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    file_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _strict(value: Any) -> Any:
    """``value`` with every non-finite float as a string and numpy scalars and arrays as Python values."""
    if isinstance(value, dict):
        return {k if isinstance(k, (str, int, bool)) or k is None else str(k): _strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(v) for v in value]
    if isinstance(value, np.ndarray):
        return _strict(value.tolist())
    if isinstance(value, np.generic) and not isinstance(value, (np.floating, np.complexfloating)):
        return value.item()
    if isinstance(value, (float, np.floating)):
        number = float(value)
        if math.isfinite(number):
            return number
        return "nan" if math.isnan(number) else ("inf" if number > 0 else "-inf")
    return value


def _op_key(node: ir.Node) -> str:
    return node.op_type if node.domain == "" else f"{node.domain}::{node.op_type}"


def _signature(value: ir.Value) -> dict[str, Any]:
    """``{"name", "dtype", "shape"}`` of a graph input or output."""
    kind = value.type
    dtype = kind.dtype.name.lower() if isinstance(kind, ir.TensorType) else (str(kind) if kind is not None else None)
    shape = None
    if value.shape is not None:
        shape = [d if isinstance(d, int) else (d.value if isinstance(d.value, str) and d.value else None)
                 for d in value.shape]  # fmt: skip
    return {"name": value.name, "dtype": dtype, "shape": shape}


def signature_text(entry: dict[str, Any]) -> str:
    """``float[N,3,224,224]`` (``?`` an unknown dim, ``[...]`` an unknown rank)."""
    shape = entry["shape"]
    dims = "..." if shape is None else ",".join("?" if d is None else name_text(str(d)) for d in shape)
    text = f"{entry['dtype'] or '?'}[{dims}]"
    return text if len(text) <= 2 * QUOTE_LIMIT else text[: 2 * QUOTE_LIMIT - 4] + "...]"


def disk_bytes(files: Iterable[str | os.PathLike[str]]) -> int | None:
    """The total size of ``files`` (a model and its external data), or None if one cannot be read."""
    try:
        return sum(os.stat(f).st_size for f in files)
    except OSError:
        return None


def human_bytes(n: int | None) -> str:
    """``39.0 KiB``; ``-`` for None."""
    if n is None:
        return "-"
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            return f"{value:.1f} {unit}"
    return f"{n} B"


def summarize(model: ir.Model) -> ModelSummary:
    """Counts ops, nodes and initializers of ``model`` without reading external data."""
    counts: collections.Counter[str] = collections.Counter()
    initializers = 0
    nbytes = 0
    for scope in iter_scopes(model):
        for node in scope.body:
            counts[_op_key(node)] += 1
        if isinstance(scope.body, ir.Graph):
            for value in scope.body.initializers.values():
                initializers += 1
                tensor = value.const_value
                if tensor is not None:
                    nbytes += tensor.nbytes
    return ModelSummary(
        dict(sorted(counts.items())),
        sum(counts.values()),
        initializers,
        nbytes,
        dict(model.opset_imports),
        [_signature(v) for v in model.graph.inputs if v.name not in model.graph.initializers],
        [_signature(v) for v in model.graph.outputs],
    )


#: Counters of what a pass did not do (why a rule or a fold did not apply): in ``-v`` and ``--report`` only.
_DETAIL_KEYS = frozenset({"unsupported", "declined"})

#: Why a pass makes the model larger, said on its line when it did (``--skip`` keeps the op).
_GROWTH = {
    "decompose": ("applied", "ReduceLogSumExp → primitive ops (ReduceMax, Clip, Sub, Exp, ReduceSum, Log, Add) "
                                "for runtimes without it; --skip decompose keeps it"),
}


#: Details said even for a pass that changed nothing (otherwise only its name, time and "no" are).
_SAID_UNCHANGED = frozenset({"fusable_at_higher_opset", "skipped", "unlocated", "proven_sizes", "proven_note"})


def _is_zero(value: Any) -> bool:
    return (isinstance(value, (int, float)) and value == 0) or value is None or value in ({}, [])


def _kinds(value: dict[str, Any], limit: int) -> str:
    """``Conv x40, Add x30, Mul x20 and 6 more`` (the most frequent first) for a long mapping of counts."""
    top = sorted(value.items(), key=lambda kv: -kv[1])[:3]
    named = ", ".join(f"{k} x{v}" if isinstance(v, int) else f"{k} {v:.3g}" for k, v in top)
    total = sum(value.values())
    return f"{total:g} in {len(value)} kinds: {named} and {len(value) - len(top)} more"


def _format_stats(stats: dict[str, Any], limit: int = 6, *, verbose: bool = True,
                  hidden: frozenset[str] = frozenset()) -> tuple[str, list[str]]:  # fmt: skip
    """Scalars on the pass's line; each mapping on a line of its own (summarised if long).

    Without ``verbose``, zero, None and False values, the counters of what did not apply
    and the ``hidden`` keys are left out.
    """
    inline, nested = [], []
    for key, value in stats.items():
        if not verbose and (_is_zero(value) or key in _DETAIL_KEYS or key in hidden):
            continue
        if isinstance(value, dict):
            if not value:
                continue
            if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value.values()):
                shown = [f"{k}: {v:.3g}" if isinstance(v, float) else f"{k}: {v}" for k, v in value.items()]
                more = f"; and {len(shown) - limit} more" if len(shown) > limit else ""
                nested.append(f"{key}: " + "; ".join(shown[:limit]) + more)  # named things and why (islands)
            elif len(value) <= limit:
                nested.append(f"{key}: " + ", ".join(f"{k} x{v}" if isinstance(v, int) else f"{k} {v:.3g}"
                                                     for k, v in value.items()))  # fmt: skip
            else:
                nested.append(f"{key}: {_kinds(value, limit)}")
        else:
            inline.append(f"{key}={value}")
    return " ".join(inline), nested


@dataclasses.dataclass
class Report:
    """Everything a run did: before/after summaries, each pass, and the check."""

    input: str
    output: str | None
    before: ModelSummary
    after: ModelSummary | None = None
    passes: list[PassRun] = dataclasses.field(default_factory=list)
    check: CheckResult | None = None
    written: bool = False
    #: Seconds of each phase of the run (load, passes, save, check), in order.
    phases: dict[str, float] = dataclasses.field(default_factory=dict)
    #: Facts about the original found on the way (what the ONNX checker refuses in it too...).
    notes: list[str] = dataclasses.field(default_factory=list)
    #: How the run ended: ``ok`` (checked, equal), ``not checked`` (written without a check: it could
    #: not run, or ``--no-check``), ``check failed`` (exit 1), ``error`` (a refusal after the load, exit 2).
    status: str = "ok"
    #: The message of the error that ended the run, or None.
    error: str | None = None
    #: Why there is no check result when ``check`` is None (``--no-check``, a run that stopped before it).
    unchecked: str = "not run: the run stopped before the check"

    def conclude(self, error: BaseException | None = None) -> None:
        """Sets :attr:`status` and :attr:`error` from how the run ends (``error``: what it raises)."""
        if error is not None:
            self.error = str(error)
            self.status = "check failed" if isinstance(error, CheckFailedError) else "error"
        else:
            self.error = None
            self.status = "ok" if self.check is not None and self.check.checked and self.check.ok else "not checked"

    def to_dict(self) -> dict[str, Any]:
        """The report as a dict (what ``--report`` writes, before non-finite floats become strings;
        every field is listed in docs/report.schema.json)."""
        return {
            "input": self.input,
            "output": self.output,
            "written": self.written,
            "status": self.status,
            "error": self.error,
            "before": self.before.to_dict(),
            "after": self.after.to_dict() if self.after else None,
            "passes": [dataclasses.asdict(p) for p in self.passes],
            "check": self.check.to_json() if self.check else unchecked_json(self.unchecked),
            "phases": dict(self.phases),
            "notes": list(self.notes),
        }

    def to_json(self) -> str:
        """The report as strict JSON text (what ``--report`` writes; see :meth:`write_json`)."""
        return json.dumps(_strict(self.to_dict()), indent=2, default=str, allow_nan=False) + "\n"

    def write_json(self, path: str | os.PathLike[str] | IO[str]) -> None:
        """Writes :meth:`to_json` to ``path``, or to an open text file.

        Strict: a non-finite float (an infinite error after a failed check)
        is written as the string ``"inf"``, ``"-inf"`` or ``"nan"``, never as
        the bare ``Infinity`` or ``NaN`` that JSON does not have. A path is
        written through a uniquely named temporary file next to it, then renamed.

        Raises:
            InputError: the file cannot be written.
        """
        text = self.to_json()
        if not isinstance(path, (str, os.PathLike)):
            path.write(text)
            return
        try:
            write_text(path, text)
        except OSError as e:
            raise InputError(f"{path}: cannot write the report ({e.strerror or e})") from e

    def _precision_flag(self) -> str:
        """``fp16`` or ``bf16`` when the precision pass converted the model, else ""."""
        types = {"float16": "fp16", "bfloat16": "bf16"}
        return next((types.get(r.stats.get("precision"), "") for r in self.passes if r.name == "precision"), "")

    def _pass_lines(self, verbose: bool) -> list[str]:
        """A line per pass, then its mappings; a pass that changed nothing (and raised nothing) only says
        so without ``verbose``. The precision search's errors are left out when the check ran (it
        gives each output's error once)."""
        checked = self.check is not None and self.check.checked
        hidden = frozenset({"failure", *(("max_abs_error",) if checked else ())})
        lines = []
        for run in self.passes:
            stats = run.stats
            if not (verbose or run.modified or run.error):
                stats = {k: v for k, v in stats.items() if k in _SAID_UNCHANGED}
            inline, nested = _format_stats(stats, verbose=verbose, hidden=hidden)
            key, why = _GROWTH.get(run.name, ("", ""))
            if key and run.stats.get(key):
                inline = f"{inline}: {why}" if inline else why
            line = f"{run.name:<12}{run.seconds:>10.3f}  {'yes' if run.modified else 'no':<8} {inline}"
            lines.append(line.rstrip())
            lines.extend(f"{'':<32}{line}" for line in nested)
        return lines

    def format(self, verbose: bool = False) -> str:
        """A plain-text table: op counts before and after, totals, passes and the check.

        Without ``verbose``, a pass's zero counters and its counters of what did not
        apply are left out (the JSON report has them all); a pass that makes the
        model larger says why. On a failed check, the first difference is left to
        the error message (see :func:`passes.cli.hints.check_hint`), so that it is said once.
        """
        after = self.after or self.before
        ops = sorted(set(self.before.op_counts) | set(after.op_counts))
        width = max([len("initializer bytes"), *(len(o) for o in ops)])
        lines = [f"{'op type':<{width}}  {'before':>9}  {'after':>9}"]
        lines.append("-" * (width + 22))
        done = self.after is not None  # else the run stopped before the passes' result: no "after"
        for op in ops:
            a = after.op_counts.get(op, 0) if done else "-"
            lines.append(f"{op:<{width}}  {self.before.op_counts.get(op, 0):>9}  {a:>9}")
        lines.append("-" * (width + 22))
        for label, b, a in (
            ("nodes", self.before.nodes, after.nodes),
            ("initializers", self.before.initializers, after.initializers),
            ("initializer bytes", self.before.initializer_bytes, after.initializer_bytes),
            ("opset", default_opset(self.before.opset) or "-", default_opset(after.opset) or "-"),
        ):
            lines.append(f"{label:<{width}}  {b:>9}  {a if done else '-':>9}")
        if self.before.file_bytes is not None or after.file_bytes is not None:
            b, a = human_bytes(self.before.file_bytes), human_bytes(after.file_bytes) if done else "-"
            lines.append(f"{'size on disk':<{width}}  {b:>9}  {a:>9}")
        if done:
            lines.extend(_signature_lines(self.before, after, verbose))
        if self.passes:
            lines.append("")
            lines.append(f"{'pass':<12}{'time (s)':>10}  {'changed':<8} details")
            lines.extend(self._pass_lines(verbose))
        if self.check is not None:
            lines.append("")
            lines.extend(_check_lines(self.check, self._precision_flag()))
        lines.extend(f"note: {note}" for note in self.notes)
        return "\n".join(lines)


#: Inputs and outputs listed without ``-v`` (the JSON report has them all).
_SIGNATURE_LINES = 8


def _signature_lines(before: ModelSummary, after: ModelSummary, verbose: bool) -> list[str]:
    """The graph's inputs and outputs, before and after: name, dtype, shape (``same`` when unchanged)."""
    rows: list[tuple[str, str, str, str]] = []
    for kind, old, new in (("input", before.inputs, after.inputs), ("output", before.outputs, after.outputs)):
        olds = {e["name"]: e for e in old}
        news = {e["name"]: e for e in new}
        names = list(dict.fromkeys([*olds, *news]))
        shown = names if verbose else names[:_SIGNATURE_LINES]
        for name in shown:
            b = signature_text(olds[name]) if name in olds else "-"
            a = signature_text(news[name]) if name in news else "-"
            rows.append((kind, name_text(name), b, "same" if a == b else a))
        if len(shown) < len(names):
            rows.append((kind, f"... {len(names) - len(shown)} more (-v)", "", ""))
    if not rows:
        return []
    label = max(len(f"{k} {n}") for k, n, _, _ in rows)
    width = max(len("before"), *(len(b) for _, _, b, _ in rows))
    lines = ["", f"{'signature':<{label}}  {'before':<{width}}  after"]
    lines.extend(f"{k + ' ' + n:<{label}}  {b:<{width}}  {a}".rstrip() for k, n, b, a in rows)
    return lines


def _check_lines(check: CheckResult, precision: str = "") -> list[str]:
    """The check's status, the inputs it used, each output with its tolerance, its notes.

    A mismatch's sentence is said here once, on each output's line; the first
    difference and the way out belong to the error (see :func:`passes.cli.hints.check_hint`).
    """
    failures = check.failures if check.checked and not check.error else []
    if failures:
        lines = [f"check failed: {len(failures)} of {len(check.outputs)} output(s) differ"]
    elif check.first_difference is not None:
        lines = check.summary().split("\n")[:1]
    else:
        lines = check.summary().splitlines()
    if check.inputs is not None:
        lines.append(f"  inputs: {check.inputs.text()}")
    for out in check.outputs:
        status = "ok" if out.ok else "MISMATCH"
        why = ""
        if not out.ok:
            why = f"  ({_differing(out)})" if out.mismatches and out.shape is not None else (
                f"  ({out.message})" if out.message else "")
        scaled = out.within_scale + sum((s.get("within_scale") or {}).get(out.name, 0)
                                        for s in (check.inputs.sets if check.inputs else []))  # fmt: skip
        lines.append(
            f"  {name_text(out.name)}: {status}  max abs {out.max_abs_error:.3g}  max rel {out.max_rel_error:.3g}"
            f"{out.bound_text(scaled)}  ({out.tolerance_text(precision)})" + why
        )
    lines.extend(f"note: {note}" for note in check.notes)
    return lines


def _differing(out: Any) -> str:
    """The count of differing elements, with what the line's max errors cannot show (from the
    comparison's message): the set of inputs they differ on, and how many differ in NaN/inf
    placement or only in the sign of zero (max abs 0 then)."""
    total = math.prod(out.shape)
    message = out.message or ""
    where = message.split(": ", 1)[0] + ": " if message.startswith("on the ") else ""
    details = "".join(f"; {d}" for d in re.findall(r"; (\d+ (?:in NaN/inf placement|only in the sign of zero))",
                                                   message))  # fmt: skip
    return f"{where}{out.mismatches} of {total} element(s) differ beyond the tolerance{details}"
