"""The report printed at the end of a run (and written as JSON with ``--report``)."""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
import pathlib
import tempfile
from typing import IO, Any

import numpy as np
import onnx_ir as ir

from passes.errors import InputError
from passes.ir.walk import default_opset, iter_scopes
from passes.verify.result import CheckResult, name_text

__all__ = ["ModelSummary", "PassRun", "Report", "summarize"]


@dataclasses.dataclass
class PassRun:
    """What one pass did: its time, whether it changed the model, and its own statistics."""

    name: str
    seconds: float
    modified: bool
    stats: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class ModelSummary:
    """Counts of a model: op types (main graph, subgraphs and functions), nodes, initializers."""

    op_counts: dict[str, int]
    nodes: int
    initializers: int
    initializer_bytes: int
    opset: dict[str, int]

    def to_json(self) -> dict[str, Any]:
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
    )


def _format_stats(stats: dict[str, Any], limit: int = 6) -> tuple[str, list[str]]:
    """Scalars on the pass's line; each mapping on a line of its own (summarised if long)."""
    inline, nested = [], []
    for key, value in stats.items():
        if isinstance(value, dict):
            if not value:
                continue
            if len(value) <= limit:
                nested.append(f"{key}: " + ", ".join(f"{k} x{v}" for k, v in value.items()))
            else:
                total = sum(v for v in value.values() if isinstance(v, (int, float)))
                nested.append(f"{key}: {total} in {len(value)} kinds")
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

    def to_json(self) -> dict[str, Any]:
        return {
            "input": self.input,
            "output": self.output,
            "written": self.written,
            "before": self.before.to_json(),
            "after": self.after.to_json() if self.after else None,
            "passes": [dataclasses.asdict(p) for p in self.passes],
            "check": self.check.to_json() if self.check else None,
            "phases": dict(self.phases),
            "notes": list(self.notes),
        }

    def write_json(self, path: str | os.PathLike[str] | IO[str]) -> None:
        """Writes :meth:`to_json` as strict JSON to ``path``, or to an open text file.

        Strict: a non-finite float (an infinite error after a failed check)
        is written as the string ``"inf"``, ``"-inf"`` or ``"nan"``, never as
        the bare ``Infinity`` or ``NaN`` that JSON does not have. A path is
        written through a uniquely named temporary file next to it, then renamed.

        Raises:
            InputError: the file cannot be written.
        """
        text = json.dumps(_strict(self.to_json()), indent=2, default=str, allow_nan=False) + "\n"
        if not isinstance(path, (str, os.PathLike)):
            path.write(text)
            return
        target = pathlib.Path(path)
        tmp: pathlib.Path | None = None
        try:
            fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
            tmp = pathlib.Path(name)
            mask = os.umask(0o022)
            os.umask(mask)
            os.fchmod(fd, 0o666 & ~mask)  # as an ordinary new file would be, not mkstemp's 0600
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, target)
            tmp = None
        except OSError as e:
            raise InputError(f"{path}: cannot write the report ({e.strerror or e})") from e
        finally:
            if tmp is not None:
                tmp.unlink(missing_ok=True)

    def format(self) -> str:
        """A plain-text table: op counts before and after, totals, passes and the check."""
        after = self.after or self.before
        ops = sorted(set(self.before.op_counts) | set(after.op_counts))
        width = max([len("initializer bytes"), *(len(o) for o in ops)])
        lines = [f"{'op type':<{width}}  {'before':>9}  {'after':>9}"]
        lines.append("-" * (width + 22))
        for op in ops:
            lines.append(
                f"{op:<{width}}  {self.before.op_counts.get(op, 0):>9}  {after.op_counts.get(op, 0):>9}"
            )
        lines.append("-" * (width + 22))
        for label, b, a in (
            ("nodes", self.before.nodes, after.nodes),
            ("initializers", self.before.initializers, after.initializers),
            ("initializer bytes", self.before.initializer_bytes, after.initializer_bytes),
            ("opset", default_opset(self.before.opset) or "-", default_opset(after.opset) or "-"),
        ):
            lines.append(f"{label:<{width}}  {b:>9}  {a:>9}")
        if self.passes:
            lines.append("")
            lines.append(f"{'pass':<12}{'time (s)':>10}  {'changed':<8} details")
            for run in self.passes:
                inline, nested = _format_stats(run.stats)
                lines.append(f"{run.name:<12}{run.seconds:>10.3f}  {'yes' if run.modified else 'no':<8} {inline}")
                lines.extend(f"{'':<32}{line}" for line in nested)
        if self.check is not None:
            lines.append("")
            lines.extend(_check_lines(self.check))
        lines.extend(f"note: {note}" for note in self.notes)
        return "\n".join(lines)


def _check_lines(check: CheckResult) -> list[str]:
    """The check's summary, the inputs it used, each output with its tolerance, its notes."""
    lines = check.summary().splitlines()
    if check.inputs is not None:
        lines.append(f"  inputs: {check.inputs.text()}")
    for out in check.outputs:
        status = "ok" if out.ok else "MISMATCH"
        lines.append(
            f"  {name_text(out.name)}: {status}  max abs {out.max_abs_error:.3g}  max rel {out.max_rel_error:.3g}"
            f"  ({out.tolerance_text()})" + (f"  ({out.message})" if out.message and not out.ok else "")
        )
    lines.extend(f"note: {note}" for note in check.notes)
    return lines
