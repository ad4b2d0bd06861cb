"""LLM-size exports: GPT-2 and Llama with many layers, ours next to vc+onnxsim and onnxslim.

Models (issue #37): transformers' ``GPT2LMHeadModel`` (sdpa attention) and ``LlamaForCausalLM``
(grouped-query attention, eager) from configs with random weights (nothing is downloaded; every
floating parameter offset so none is exactly 0 or 1, ``bench_simplify``'s exports at a larger
size: ``ExportSpec(layers=, hidden=)``), each by the TorchScript exporter (``dynamo=False``,
opset 17) and the dynamo exporter (``dynamo=True``, opset 18, ``optimize=False``: the raw graph).
The hidden size is small (64: the weights stay a few MiB) and the layers many, so what grows is
the node count: 48 layers for the TorchScript exports (GPT-2 10,096 nodes, Llama 10,863) and 80 for
the dynamo ones (10,310 and 17,190); ``--layers`` sets both. The dynamo exporter's own
optimiser (its default) leaves ~50-60 nodes a layer: 10k nodes would take ~190 layers, whose
export takes more than half an hour on 2 shared cores (measured: 24 layers, 1,216 / 1,485 nodes,
50-70 s), so the raw graphs stand in for the size. Exports take minutes: they are cached in ``--cache`` (default
``$TMPDIR/bench-llm-exports``), one file per spec (its name says arch, size, exporter and opset)
and torch version.

Tools (each in a fresh process, the tools' runs alternating, the median of ``--repeat``; the
child's own time without its imports, its peak RSS: that process's only, so ours' check, which
runs onnxruntime in a child process of its own, is not in it):

* ``vc+onnxsim``: onnx.version_converter to 18, then onnxsim.simplify (the reference of the ratios);
* ``ours+check``: ``python -m passes IN -o OUT -q --target-opset 18 --report R`` (the default
  pipeline with its onnxruntime check); its exit status says whether the check passed, and the
  report gives the phases (load, passes, save, check) and each pass's seconds;
* ``ours``: the same with ``--no-check``;
* ``onnxslim``: ``onnxslim.slim`` (keeps the opset).

Printed: per model and tool the median seconds and its ratio to vc+onnxsim, the peak RSS and its
ratio, the nodes after (main graph, subgraphs and functions), and for ours whether its check
passed; then ours' phases (medians). ``--keep DIR`` keeps every output.

Usage::

    python benchmarks/bench_llm.py [--quick] [--repeat N] [--layers N] [--hidden N] [--only PATTERN,...]
        [--tools T,...] [--cache DIR] [--keep DIR] [--json FILE] [--list]
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import pathlib
import statistics
import sys
import tempfile
from typing import Any

import onnx

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_simplify import ExportSpec  # noqa: E402
from harness import REPO, Measurement, count_nodes, measure, tool_installed, tool_snippet  # noqa: E402

TARGET = 18
#: Decoder layers of the TorchScript and of the dynamo exports (10k+ nodes each), and of ``--quick``.
TS_LAYERS, DYNAMO_LAYERS, QUICK_LAYERS, HIDDEN = 48, 80, 4, 64
#: (arch, dynamo, opset, the exporter's own folding/optimisation) of every export; the size comes
#: from --layers / --hidden.
KINDS = (("hf_gpt2", False, 17, True), ("hf_gpt2", True, 18, False), ("hf_llama", False, 17, True),
         ("hf_llama", True, 18, False))
TOOLS = ("vc+onnxsim", "ours+check", "ours", "onnxslim")
#: Where the exports are cached by default (``--cache``; ``bench_precision`` reads them there too).
CACHE = pathlib.Path(tempfile.gettempdir()) / "bench-llm-exports"

#: Ours through the command's entry point, its modules imported before the clock; prints the exit
#: status (a failed check is a result here, not a crash), the phases and the per-pass seconds.
_OURS = f"""
import json, sys, time
sys.path.insert(0, {str(REPO)!r})
src, dst, report = sys.argv[1], sys.argv[2], sys.argv[3]
import onnx, onnx_ir, numpy, refimpl
import passes.cli, passes.pipeline, passes.upgrade, passes.fold, passes.simplify, passes.decompose
import passes.modelio.load, passes.modelio.validate
start = time.perf_counter()
code = passes.cli.main([src, "-o", dst, "-q", "--report", report, *sys.argv[4:]])
seconds = time.perf_counter() - start
out = {{"seconds": seconds, "exit": code}}
try:
    with open(report, encoding="utf-8") as file:
        r = json.load(file)
    out["phases"] = r.get("phases") or {{}}
    out["pass_seconds"] = {{p["name"]: p.get("seconds") for p in r.get("passes") or []}}
    check = r.get("check") or {{}}
    out["check_ok"] = check.get("ok") if check.get("checked") else None
    out["status"] = r.get("status")
    out["report_error"] = (r.get("error") or "")[:200]
except (OSError, ValueError) as error:
    out["report_error"] = f"no report: {{error}}"
print(json.dumps(out))
"""

#: The export child: ``bench_simplify.export_spec`` of the spec given as JSON.
_EXPORT = f"""
import json, sys, time, traceback
sys.path.insert(0, {str(HERE)!r})
import bench_simplify
start = time.perf_counter()
try:
    bench_simplify.export_spec(bench_simplify.ExportSpec(**json.loads(sys.argv[1])), sys.argv[2])
except BaseException as error:
    print(json.dumps({{"error": bench_simplify.one_line(error)}}))
    traceback.print_exc()
    sys.exit(1)
print(json.dumps({{"seconds": time.perf_counter() - start}}))
"""


def specs(layers: int | None, hidden: int) -> list[ExportSpec]:
    """The four exports of hidden size ``hidden``, at ``layers`` decoder layers (None: 10k+ nodes each)."""
    return [ExportSpec(arch, dynamo, opset, fold, layers=layers or (DYNAMO_LAYERS if dynamo else TS_LAYERS),
                       hidden=hidden) for arch, dynamo, opset, fold in KINDS]


def _torch_version() -> str:
    import importlib.metadata

    return importlib.metadata.version("torch").replace("+", "_")


def exported(spec: ExportSpec, cache: pathlib.Path, timeout: float) -> tuple[pathlib.Path | None, str]:
    """The cached export of ``spec`` (exported first in a child process if absent); (path, error)."""
    path = cache / f"{spec.name}.torch{_torch_version()}.onnx"
    if path.exists():
        return path, ""
    cache.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial.onnx")
    fields = {"arch": spec.arch, "dynamo": spec.dynamo, "opset": spec.opset, "fold": spec.fold,
              "layers": spec.layers, "hidden": spec.hidden}
    print(f"exporting {spec.name} ...", file=sys.stderr, flush=True)
    m = measure("export", spec.name, _EXPORT, [json.dumps(fields), str(partial)], timeout)
    if not m.ok or not partial.exists():
        partial.unlink(missing_ok=True)
        return None, (m.extra.get("error") or m.error or "no result")[:200]
    partial.rename(path)
    print(f"exported {spec.name} in {m.seconds:.0f} s", file=sys.stderr, flush=True)
    return path, ""


def _snippet(tool: str) -> tuple[str, list[str]]:
    """(snippet, arguments after src and dst) of ``tool``."""
    if tool == "ours+check":
        return _OURS, ["--target-opset", str(TARGET)]
    if tool == "ours":
        return _OURS, ["--target-opset", str(TARGET), "--no-check"]
    return tool_snippet(tool, TARGET), []


def _nodes(path: pathlib.Path) -> int | None:
    try:
        return count_nodes(onnx.load(str(path), load_external_data=False))
    except Exception:  # noqa: BLE001 - an unreadable output is a cell, not a crash
        return None


def run_model(spec: ExportSpec, src: pathlib.Path, tools: list[str], repeat: int, work: pathlib.Path,
              keep: bool) -> dict[str, Any]:
    """Every tool ``repeat`` times on ``src``, alternating; the row of this model."""
    row: dict[str, Any] = {"model": spec.name, "nodes": _nodes(src), "tools": {}}
    runs: dict[str, list[Measurement]] = {t: [] for t in tools}
    for index in range(repeat):
        for tool in tools:
            snippet, extra = _snippet(tool)
            dst = work / f"{spec.name}.{tool}.{index}.onnx"
            args = [str(src), str(dst)] + ([str(dst.with_suffix(".json"))] if tool.startswith("ours") else []) + extra
            m = measure(tool, spec.name, snippet, args)
            runs[tool].append(m)
            cell = row["tools"].setdefault(tool, {})
            if index == 0:
                cell["nodes"] = _nodes(dst) if dst.exists() else None
            if not keep or index:
                dst.unlink(missing_ok=True)
                for side in (dst.with_suffix(".json"), dst.with_name(dst.name + ".data")):
                    side.unlink(missing_ok=True)
            note = m.error or (f"exit {m.extra['exit']}" if m.extra.get("exit") else "")
            print(f"{spec.name} / {tool} #{index + 1}: {m.seconds} s, {m.peak_rss_mib:.0f} MiB {note}",
                  file=sys.stderr, flush=True)
    for tool, measured in runs.items():
        cell = row["tools"][tool]
        times = [m.seconds for m in measured if m.ok and m.seconds is not None]
        cell["seconds"] = statistics.median(times) if len(times) == len(measured) else None
        cell["peak_mib"] = max(m.peak_rss_mib for m in measured)
        cell["error"] = next((m.error for m in measured if m.error), "")
        if tool.startswith("ours"):
            exits = [m.extra.get("exit") for m in measured]
            cell["exit"] = exits
            cell["check_ok"] = [m.extra.get("check_ok") for m in measured]
            cell["report_error"] = next((m.extra["report_error"] for m in measured if m.extra.get("report_error")), "")
            phases = [m.extra.get("phases") or {} for m in measured]
            cell["phases"] = {k: statistics.median(p.get(k) or 0.0 for p in phases) for k in phases[0]}
            per_pass = [m.extra.get("pass_seconds") or {} for m in measured]
            cell["pass_seconds"] = {k: statistics.median(p.get(k) or 0.0 for p in per_pass) for k in per_pass[0]}
            if any(exits):
                cell["error"] = cell["report_error"] or f"exit status {exits}"
    return row


def _ratio(value: float | None, reference: float | None) -> str:
    return f"{value / reference:.2f}x" if value is not None and reference else "-"


def table(rows: list[dict[str, Any]]) -> str:
    """Per model and tool: seconds, peak RSS, ratios to vc+onnxsim, nodes after, ours' check."""
    header = (f"{'model':<34} {'tool':<11} {'median s':>9} {'x vc+sim':>8} {'peak MiB':>9} {'x vc+sim':>8}"
              f" {'nodes':>7}  note")
    lines = [header, "-" * len(header)]
    for row in rows:
        if "error" in row:
            lines.append(f"{row['model']:<34} export failed: {row['error']}")
            continue
        ref = row["tools"].get("vc+onnxsim", {})
        lines.append(f"{row['model']:<34} {'(input)':<11} {'':>9} {'':>8} {'':>9} {'':>8} {row['nodes']:>7}")
        for tool, cell in row["tools"].items():
            seconds = f"{cell['seconds']:.2f}" if cell["seconds"] is not None else "fail"
            note = cell["error"][:70]
            if tool == "ours+check" and not note:
                checks = cell["check_ok"]
                note = "check passed" if all(checks) else f"check: {checks}"
            nodes = cell["nodes"] if cell["nodes"] is not None else "-"
            lines.append(f"{'':<34} {tool:<11} {seconds:>9} {_ratio(cell['seconds'], ref.get('seconds')):>8}"
                         f" {cell['peak_mib']:>9.0f} {_ratio(cell['peak_mib'], ref.get('peak_mib')):>8}"
                         f" {nodes:>7}  {note}")
    return "\n".join(lines)


def phase_table(rows: list[dict[str, Any]]) -> str:
    """Ours' phases and passes (medians, seconds), with and without the check."""
    lines = []
    for row in rows:
        for tool in ("ours+check", "ours"):
            cell = row.get("tools", {}).get(tool)
            if not cell or not cell.get("phases"):
                continue
            phases = " ".join(f"{k} {v:.2f}" for k, v in cell["phases"].items())
            passes = " ".join(f"{k} {v:.2f}" for k, v in cell["pass_seconds"].items())
            lines.append(f"{row['model']:<34} {tool:<11} {phases} | {passes}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_LAYERS} layers, one run: a smoke test")
    parser.add_argument("--repeat", type=int, default=None, help="runs per tool and model (default 3, --quick 1)")
    parser.add_argument("--layers", type=int, default=None, help=f"decoder layers (default {TS_LAYERS} TorchScript, {DYNAMO_LAYERS} dynamo)")
    parser.add_argument("--hidden", type=int, default=HIDDEN, help="hidden size, a multiple of 16 (default %(default)s)")
    parser.add_argument("--only", default="", help="comma-separated model names or patterns (see --list)")
    parser.add_argument("--tools", default=",".join(TOOLS), help="comma-separated subset of %(default)s")
    parser.add_argument("--cache", type=pathlib.Path, default=CACHE,
                        help="folder of the cached exports (default: %(default)s)")
    parser.add_argument("--keep", type=pathlib.Path, default=None, help="keep every tool's first output there")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per export (default %(default)s)")
    parser.add_argument("--json", type=pathlib.Path, default=None, help="where to save the rows")
    parser.add_argument("--list", action="store_true", help="list the models and stop")
    args = parser.parse_args(argv)
    layers = args.layers or (QUICK_LAYERS if args.quick else None)
    if (layers is not None and layers < 1) or args.hidden < 16 or args.hidden % 16:
        parser.error("--layers must be positive and --hidden a positive multiple of 16")
    repeat = args.repeat or (1 if args.quick else 3)
    tools = [t for t in args.tools.split(",") if t]
    unknown = sorted(set(tools) - set(TOOLS))
    if unknown:
        parser.error(f"unknown tools: {', '.join(unknown)} (known: {', '.join(TOOLS)})")
    chosen = specs(layers, args.hidden)
    if args.list:
        print("\n".join(f"{s.name}: {s.description}" for s in chosen))
        return 0
    patterns = [p for p in args.only.split(",") if p]
    if patterns:
        chosen = [s for s in chosen if any(fnmatch.fnmatchcase(s.name, p) for p in patterns)]
        if not chosen:
            parser.error(f"no model matches {args.only} (see --list)")
    missing = {t: tool_installed(t) for t in tools if t in ("vc+onnxsim", "onnxslim") and tool_installed(t)}
    for tool, why in missing.items():
        print(f"{tool}: {why}; left out", file=sys.stderr)
    tools = [t for t in tools if t not in missing]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-llm-") as tmp:
        work = args.keep or pathlib.Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for spec in chosen:
            src, error = exported(spec, args.cache, args.timeout)
            if src is None:
                rows.append({"model": spec.name, "error": error})
                continue
            rows.append(run_model(spec, src, tools, repeat, work, args.keep is not None))
    print(table(rows))
    print()
    print("ours' phases (median s): load passes save check | each pass")
    print(phase_table(rows))
    if args.json is not None:
        meta = {"repeat": repeat, "layers": layers, "hidden": args.hidden, "target_opset": TARGET,
                "torch": _torch_version()}
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n", encoding="utf-8")
    failed = any(c.get("exit") and any(c["exit"]) for r in rows for c in r.get("tools", {}).values())
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
