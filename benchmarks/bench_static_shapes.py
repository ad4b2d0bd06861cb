"""Node counts with static input shapes: ours against onnxsim and onnxslim with their shape options (#25).

Users who deploy at one size run a simplifier with the inputs' shapes made
static, so that every Shape/Gather/Concat chain folds. Per model and tool, each
run in a fresh process with a time limit: the nodes after (main graph, subgraphs
and functions, counted recursively), whether the output passes
``onnx.checker.check_model(full_check=True)`` (valid) and whether it gives the
same outputs as the original in onnxruntime at those shapes (equal; same
inputs, same tolerances as ``bench_simplify``, whose reference and verify
children this reuses). The inputs' narrowing is the point here, so the
inputs' contract of ``bench_simplify`` is not checked.

Tools:

- ``optimize``: ours, ``python -m passes IN -o OUT --no-check -q --input-shape NAME:D0,...``
  (per input; default passes, target opset 18); its own onnxruntime check is also run once
  (without ``--no-check``) and reported in the "own check" column;
- ``onnxsim``: ``onnxsim.simplify(model, overwrite_input_shapes={NAME: [D0, ...]})``
  (the CLI's ``--overwrite-input-shape``; keeps the opset);
- ``onnxslim``: ``onnxslim.slim(model, input_shapes=["NAME:D0,..."])`` (the CLI's
  ``--input-shapes``; keeps the opset).

Models: ``models/real/small_cnn_opset13.onnx`` and ``models/real/tiny_bert_opset17.onnx``
(shipped), and bench_simplify's exports ``hf_bert_ts_opset17``, ``hf_gpt2_ts_opset17`` and
``hf_vit_ts_opset17`` (exported here if ``--keep DIR`` has no copy; torch and transformers
needed), each at the shapes in :data:`CASES`.

Usage::

    python benchmarks/bench_static_shapes.py [--only NAME,...] [--keep DIR] [--timeout S] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fnmatch
import json
import os
import pathlib
import sys
import tempfile
import time

import onnx

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
import bench_simplify  # noqa: E402
from harness import count_nodes, default_opset, measure, op_counts, tool_installed  # noqa: E402

TOOLS = ("optimize", "onnxsim", "onnxslim")


@dataclasses.dataclass(frozen=True)
class Case:
    """A model and the static shapes of its fed inputs."""

    name: str
    shapes: dict[str, tuple[int, ...]]
    path: str = ""  # a repository file; "" for a bench_simplify export named ``name``


CASES = (
    Case("small_cnn_opset13", {"pixels": (1, 3, 16, 16)}, "models/real/small_cnn_opset13.onnx"),
    Case("tiny_bert_opset17", {"input_ids": (1, 16), "attention_mask": (1, 16)},
         "models/real/tiny_bert_opset17.onnx"),
    Case("hf_bert_ts_opset17", {"input_ids": (1, 12), "attention_mask": (1, 12)}),
    Case("hf_gpt2_ts_opset17", {"input_ids": (1, 12), "attention_mask": (1, 12)}),
    Case("hf_vit_ts_opset17", {"pixel_values": (1, 3, 32, 32)}),
)

_PRELUDE = f"""
import json, sys, time, warnings, logging
sys.path.insert(0, {str(REPO)!r})
warnings.simplefilter("ignore")
logging.disable(logging.WARNING)
src, dst, shapes_json = sys.argv[1], sys.argv[2], sys.argv[3]
SHAPES = json.loads(shapes_json)
"""
_SNIPPETS = {
    "optimize": """
import passes.cli
start = time.perf_counter()
argv = [src, "-o", dst, "--no-check", "-q"]
for name, dims in SHAPES.items():
    argv += ["--input-shape", name + ":" + ",".join(map(str, dims))]
code = passes.cli.main(argv)
if code:
    sys.exit(code)
""",
    "onnxsim": """
import onnx, onnxsim
start = time.perf_counter()
model, ok = onnxsim.simplify(onnx.load(src), overwrite_input_shapes=SHAPES)
if not ok:
    sys.exit("onnxsim: the simplified model failed onnxsim's own check")
onnx.save(model, dst)
""",
    "onnxslim": """
import onnx, onnxslim
start = time.perf_counter()
shapes = [name + ":" + ",".join(map(str, dims)) for name, dims in SHAPES.items()]
onnx.save(onnxslim.slim(onnx.load(src), input_shapes=shapes), dst)
""",
}
_REPORT = """
print(json.dumps({"seconds": time.perf_counter() - start}))
"""
_PACKAGES = {"optimize": "optimize", "onnxsim": "vc+onnxsim", "onnxslim": "onnxslim"}

# Ours with its own onnxruntime check, at the static shapes.
_OWN_CHECK = _PRELUDE + """
import contextlib, io
import passes.cli
argv = [src, "-o", dst, "-q"]
for name, dims in SHAPES.items():
    argv += ["--input-shape", name + ":" + ",".join(map(str, dims))]
err = io.StringIO()
start = time.perf_counter()
with contextlib.redirect_stderr(err):
    code = passes.cli.main(argv)
lines = [line for line in err.getvalue().splitlines() if line.strip()]
print(json.dumps({"seconds": time.perf_counter() - start, "exit_code": code,
                  "message": lines[-1][:200] if lines else ""}))
"""


def _dims_for(path: pathlib.Path, shapes: dict[str, tuple[int, ...]]) -> dict[str, int]:
    """The sizes of the original's named dims at ``shapes`` (what bench_simplify's reference takes)."""
    model = onnx.load(str(path), load_external_data=False)
    dims: dict[str, int] = {}
    for value in model.graph.input:
        if value.name not in shapes:
            continue
        declared = value.type.tensor_type.shape.dim
        if len(declared) != len(shapes[value.name]):
            raise SystemExit(f"bench_static_shapes: {value.name} has rank {len(declared)}, "
                             f"not {len(shapes[value.name])}")
        for d, size in zip(declared, shapes[value.name], strict=True):
            if d.dim_param:
                if dims.setdefault(d.dim_param, size) != size:
                    raise SystemExit(f"bench_static_shapes: dim {d.dim_param} gets two sizes")
            elif d.HasField("dim_value") and d.dim_value != size:
                raise SystemExit(f"bench_static_shapes: {value.name} has a static {d.dim_value}, not {size}")
    return dims


def _source(case: Case, folder: pathlib.Path, timeout: float) -> tuple[pathlib.Path | None, str]:
    if case.path:
        return REPO / case.path, ""
    src = folder / "exports" / f"{case.name}.onnx"
    if not src.exists():
        src.parent.mkdir(parents=True, exist_ok=True)
        partial = src.with_suffix(".partial.onnx")
        m = measure("export", case.name, bench_simplify._EXPORT, [case.name, partial], timeout)
        if not m.ok or not partial.exists():
            partial.unlink(missing_ok=True)
            return None, "export failed: " + bench_simplify._failure(m, timeout)[1]
        partial.rename(src)
    return src, ""


def run_case(case: Case, tools: list[str], folder: pathlib.Path, timeout: float, keep: bool,
             own_check: bool) -> bench_simplify.ModelResult:
    shapes_text = "; ".join(f"{n}:{','.join(map(str, d))}" for n, d in case.shapes.items())
    result = bench_simplify.ModelResult(case.name, case.path or "export", shapes_text)
    src, status = _source(case, folder, timeout)
    if src is None:
        result.status = status
        return result
    header = onnx.load(str(src), load_external_data=False)
    result.nodes_before, result.opset_before = count_nodes(header), default_opset(header)
    result.op_counts_before = op_counts(header)
    del header
    work = folder / "outputs"
    work.mkdir(parents=True, exist_ok=True)
    ref = work / f"{case.name}.static.reference.pkl"
    dims = _dims_for(src, case.shapes)
    m = measure("reference", case.name, bench_simplify._child("reference"), [src, ref, json.dumps(dims)], timeout)
    if m.ok:
        result.inputs = m.extra.get("inputs", [])
        fed = {i["name"]: tuple(i["shape"]) for i in result.inputs}
        for name, shape in case.shapes.items():
            if fed.get(name) != shape:
                raise SystemExit(f"bench_static_shapes: {case.name}: {name} is fed {fed.get(name)}, not {shape}")
    else:
        result.reference = bench_simplify._failure(m, timeout)[1]
        ref.unlink(missing_ok=True)
    shapes_json = json.dumps({n: list(d) for n, d in case.shapes.items()})
    for tool in tools:
        cell = result.cells[tool] = bench_simplify.Cell(case.name, tool)
        missing = tool_installed(_PACKAGES[tool])
        if missing:
            cell.status, cell.error = "not installed", missing
            continue
        dst = work / f"{case.name}.static.{tool}.onnx"
        dst.unlink(missing_ok=True)
        m = measure(tool, case.name, _PRELUDE + _SNIPPETS[tool] + _REPORT, [src, dst, shapes_json], timeout)
        cell.wall_s, cell.peak_rss_mb = m.wall_seconds, m.peak_rss_mib
        if not m.ok or not dst.exists():
            cell.status, cell.error = (bench_simplify._failure(m, timeout) if not m.ok
                                       else ("failed", "wrote no output"))
        else:
            cell.work_s = m.seconds
            # No original: the inputs are narrowed on purpose, so the inputs' contract is not checked.
            bench_simplify.record_verification(cell, case.name, [dst, ref if ref.exists() else ""], timeout)
        if not keep:
            dst.unlink(missing_ok=True)
        print(f"bench_static_shapes: {case.name:<24} {tool:<9} {cell.text():<22} "
              f"{cell.error or cell.valid_error or cell.equal_detail}"[:240], file=sys.stderr, flush=True)
    if own_check and "optimize" in tools and not tool_installed("optimize"):
        dst = work / f"{case.name}.static.own_check.onnx"
        c = measure("own check", case.name, _OWN_CHECK, [src, dst, shapes_json], timeout)
        if not c.ok:
            result.own_check = bench_simplify._failure(c, timeout)[0]
        else:
            code, message = c.extra.get("exit_code"), c.extra.get("message", "")
            result.own_check = "pass" if code == 0 else f"exit {code}: {message}"
        dst.unlink(missing_ok=True)
    if not keep:
        ref.unlink(missing_ok=True)
    return result


def table(results: list[bench_simplify.ModelResult], tools: list[str]) -> str:
    lines = ["| model | static shapes | nodes before | " + " | ".join(tools) + " | own check |",
             "|" + "---|" * (len(tools) + 4)]
    notes = []
    for r in results:
        if r.status != "ok":
            lines.append(f"| {r.name} | {r.description} | | {r.status} |" + " |" * len(tools))
            continue
        good = [c.nodes for c in r.cells.values() if c.good]
        best = min(good) if good else None
        cells = []
        for tool in tools:
            c = r.cells[tool]
            cells.append(f"**{c.text()}**" if c.good and c.nodes == best else c.text())
            reason = c.error or "; ".join(x for x in (c.valid_error, c.equal_detail) if x)
            if reason and (c.status != "ok" or c.wrong):
                notes.append(f"- {r.name}, {tool}: {bench_simplify._md(reason)}")
        lines.append(f"| {r.name} | {r.description} | {r.nodes_before} | " + " | ".join(cells)
                     + f" | {bench_simplify._md(r.own_check)} |")
    ours = "optimize"
    diffs = []
    for r in results:
        if r.status != "ok" or ours not in r.cells or not r.cells[ours].good:
            continue
        rivals = [(r.cells[t].nodes, t) for t in tools if t != ours and r.cells[t].good]
        if rivals and r.cells[ours].nodes > min(rivals)[0]:
            n, t = min(rivals)
            a, b = r.cells[ours].op_counts, r.cells[t].op_counts
            ops = {op: (a.get(op, 0), b.get(op, 0)) for op in sorted(set(a) | set(b)) if a.get(op, 0) != b.get(op, 0)}
            diffs.append(f"- {r.name}: ours {r.cells[ours].nodes} vs {t} {n}: "
                         + ", ".join(f"{op} {x}/{y}" for op, (x, y) in ops.items()))
    out = "\n".join(lines)
    if diffs:
        out += "\n\nWhere ours has more nodes than the best other tool (op types, ours / theirs):\n\n" + "\n".join(diffs)
    if notes:
        out += "\n\nNotes:\n\n" + "\n".join(notes)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated case names or shell patterns")
    parser.add_argument("--tools", default=",".join(TOOLS), help="comma-separated subset of " + ",".join(TOOLS))
    parser.add_argument("--keep", type=pathlib.Path, metavar="DIR",
                        help="exports in DIR/exports (bench_simplify's, reused) and outputs in DIR/outputs")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--no-own-check", action="store_true")
    parser.add_argument("--json", type=pathlib.Path)
    args = parser.parse_args(argv)
    tools = [t for t in args.tools.split(",") if t]
    if set(tools) - set(TOOLS):
        parser.error(f"unknown tools: {', '.join(sorted(set(tools) - set(TOOLS)))}")
    patterns = [p for p in args.only.split(",") if p]
    cases = [c for c in CASES if not patterns or any(fnmatch.fnmatchcase(c.name, p) for p in patterns)]
    started = time.time()
    with contextlib.ExitStack() as stack:
        if args.keep:
            folder = args.keep.resolve()
            folder.mkdir(parents=True, exist_ok=True)
        else:
            folder = pathlib.Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench_static_")))
        results = [run_case(c, tools, folder, args.timeout, args.keep is not None, not args.no_own_check)
                   for c in cases]
    seconds = time.time() - started
    text = (f"## bench_static_shapes ({len(results)} models, {seconds / 60:.1f} min, {os.cpu_count()} CPUs)\n\n"
            + table(results, tools))
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "benchmark": "static_shapes", "tools": tools, "seconds": seconds,
            "models": [{**{k: v for k, v in dataclasses.asdict(r).items() if k != "cells"},
                        "cells": {t: dataclasses.asdict(c) for t, c in r.cells.items()}} for r in results],
            "table": text}, indent=2, default=str) + "\n", encoding="utf-8")
    broken = [r.name for r in results if r.status == "ok" and "optimize" in r.cells and r.cells["optimize"].wrong]
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
