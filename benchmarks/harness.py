"""Shared benchmark utilities: run each tool in a fresh subprocess, measure, compare.

A tool is a Python snippet run with ``python -c``; it receives its arguments in
``sys.argv[1:]``, does only that tool's work and prints, as its last stdout
line, a JSON object with at least ``"seconds"`` (the time of the work itself,
measured by the child, without interpreter start-up and imports). The parent
measures the child's wall time; the child reports its own peak RSS (Linux
``VmHWM``; ``ru_maxrss`` of a child would also count the parent's pages it held
between fork and exec, and ``RUSAGE_CHILDREN`` keeps the maximum over all
children).

Usage::

    results = [measure("ours", "1k nodes", OUR_SNIPPET, [src, dst]), ...]
    print(format_table(results, reference="ours"))
    save_json("bench.json", results, meta={...})
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = [
    "TOOLS",
    "child_env",
    "Measurement",
    "check_model_file",
    "count_nodes",
    "default_opset",
    "format_table",
    "load_models_builder",
    "ort_session",
    "measure",
    "op_counts",
    "save_json",
    "tool_installed",
    "tool_snippet",
]

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent

_CHECK_SNIPPET = r"""
import json, sys
result = {"seconds": 0.0}
try:
    import onnx
    onnx.checker.check_model(sys.argv[1], full_check=True)
    result["valid"] = True
except Exception as error:  # report, never hide: the message goes into the table
    result["valid"] = False
    result["valid_error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"
try:
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    ort.InferenceSession(sys.argv[1], options, providers=["CPUExecutionProvider"])
    result["loads_in_ort"] = True
except Exception as error:
    result["loads_in_ort"] = False
    result["ort_error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"
print(json.dumps(result))
"""


@dataclasses.dataclass
class Measurement:
    """One run of one tool on one case.

    Attributes:
        tool: The tool's name.
        case: The case's name.
        seconds: Time of the work as reported by the child (None if it failed).
        wall_seconds: Wall time of the whole child process.
        peak_rss_mib: Peak resident memory of the child, in MiB.
        ok: Whether the child exited with status 0 and reported its time.
        error: The last stderr line when it failed.
        extra: Other fields the child or a later check reported.
    """

    tool: str
    case: str
    seconds: float | None
    wall_seconds: float
    peak_rss_mib: float
    ok: bool
    error: str = ""
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


# Appended to every snippet: the child's own peak RSS. Linux's VmHWM belongs to the
# process image, so unlike ru_maxrss it does not count the parent's pages the child
# had between fork and exec.
_PEAK_EPILOGUE = """
def _harness_peak_kib():
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    import resource, sys as _sys
    scale = 1 / 1024 if _sys.platform == "darwin" else 1
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale)
import json as _json
print(_json.dumps({"peak_rss_kib": _harness_peak_kib()}))
"""


def child_env(*paths: str | os.PathLike[str]) -> dict[str, str]:
    """The environment of a benchmarked child process: ``paths`` first on ``PYTHONPATH``, and bytecode
    cached as an installed package has it (a sandbox's ``PYTHONDONTWRITEBYTECODE`` would make ours,
    run from the checkout, compile its ~150 modules on every run, ~0.3 s the other tools and an
    installed user do not pay)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (*map(str, paths), env.get("PYTHONPATH", "")) if p)
    return env


def _run(snippet: str, args: Sequence[str], timeout: float) -> tuple[int, str, str, float]:
    """Runs ``python -c snippet args`` and returns (status, stdout, stderr, wall seconds)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        code = snippet + "\n" + _PEAK_EPILOGUE
        process = subprocess.Popen([sys.executable, "-c", code, *args], stdout=out, stderr=err, env=child_env())
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        wall = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    return process.returncode, stdout, stderr, wall


def _json_lines(stdout: str) -> dict[str, Any]:
    """Merges the JSON objects printed on their own lines."""
    report: dict[str, Any] = {}
    for line in stdout.splitlines():
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                report.update(json.loads(line))
            except json.JSONDecodeError:
                continue
    return report


def measure(tool: str, case: str, snippet: str, args: Sequence[str], timeout: float = 3600) -> Measurement:
    """Runs one tool on one case in a fresh interpreter."""
    status, stdout, stderr, wall = _run(snippet, [str(a) for a in args], timeout)
    report = _json_lines(stdout)
    ok = status == 0 and "seconds" in report
    error = "" if ok else (stderr.strip().splitlines() or [f"exit status {status}"])[-1][:200]
    seconds = report.pop("seconds", None) if ok else None
    rss = report.pop("peak_rss_kib", 0) / 1024
    return Measurement(tool, case, seconds, wall, rss, ok, error, report)


def check_model_file(path: str | os.PathLike[str], timeout: float = 3600) -> dict[str, Any]:
    """Whether a saved model passes the full onnx check and loads in onnxruntime (in a subprocess)."""
    result = measure("check", str(path), _CHECK_SNIPPET, [str(path)], timeout)
    if not result.ok:
        return {"valid": False, "loads_in_ort": False, "check_error": result.error}
    return result.extra


def _ratio(value: float | None, reference: float | None) -> str:
    if value is None or not reference:
        return "-"
    return f"{value / reference:.2f}x"


def format_table(results: Iterable[Measurement], reference: str) -> str:
    """A text table: time and peak RSS per case and tool, with ratios to the ``reference`` tool."""
    results = list(results)
    by_case: dict[str, dict[str, Measurement]] = {}
    for m in results:
        by_case.setdefault(m.case, {})[m.tool] = m
    header = (
        f"{'case':<28} {'tool':<14} {'time s':>9} {'x ' + reference:>8} {'peak MiB':>9} {'x ' + reference:>8}"
        "  valid  ort  note"
    )
    lines = [header, "-" * len(header)]
    for case, tools in by_case.items():
        ref = tools.get(reference)
        for tool, m in tools.items():
            seconds = f"{m.seconds:.3f}" if m.seconds is not None else "fail"
            flags = [m.extra.get("valid"), m.extra.get("loads_in_ort")]
            marks = ["yes" if f else "no" if f is False else "-" for f in flags]
            note = m.error or m.extra.get("valid_error") or m.extra.get("ort_error") or ""
            time_ratio = _ratio(m.seconds, ref.seconds if ref else None)
            rss_ratio = _ratio(m.peak_rss_mib, ref.peak_rss_mib if ref else None)
            lines.append(
                f"{case:<28} {tool:<14} {seconds:>9} {time_ratio:>8} {m.peak_rss_mib:>9.1f} {rss_ratio:>8}"
                f"  {marks[0]:<5}  {marks[1]:<3}  {note[:60]}"
            )
    return "\n".join(lines)


def save_json(
    path: str | os.PathLike[str], results: Iterable[Measurement], meta: dict[str, Any] | None = None
) -> None:
    """Writes the measurements (and a description of the run) as JSON."""
    payload = {"meta": meta or {}, "results": [dataclasses.asdict(m) for m in results]}
    pathlib.Path(path).write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")


# --- the tools the benchmarks compare (bench_end_to_end, bench_simplify) ---------------------------
#
# Each is a snippet for :func:`measure`, run as ``python -c SNIPPET src dst``: its imports, then
# (the clock started after them) load + passes + save, then one JSON line with "seconds" and the
# peak RSS after the imports ("baseline_rss_kib").

#: Tool names, ours first.
TOOLS = ("optimize", "vc+onnxsim", "onnxscript", "onnxslim", "ort-basic")

_TOOL_PRELUDE = """
import json, sys, time, warnings, logging
sys.path.insert(0, {repo!r})
warnings.simplefilter("ignore")
logging.disable(logging.WARNING)
src, dst = sys.argv[1], sys.argv[2]
TARGET = {target}
"""
_TOOL_BASELINE = """
def _vm_hwm_kib():
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0
baseline_kib = _vm_hwm_kib()
start = time.perf_counter()
"""
_TOOL_REPORT = """
print(json.dumps({"seconds": time.perf_counter() - start, "baseline_rss_kib": baseline_kib}))
"""

#: Per tool: (imports, work). Ours runs the command's entry point ``passes.cli.main`` (what
#: ``optimize`` runs, minus the process exit: ``python -m passes`` ends the process itself, so the
#: snippet could not report); its modules are imported before the clock, so that, as for the
#: other tools, the work alone is timed.
_TOOL_SNIPPETS: dict[str, tuple[str, str]] = {
    "optimize": ("""
import onnx, onnx_ir, numpy, refimpl
import passes.cli, passes.pipeline, passes.upgrade, passes.fold, passes.simplify, passes.decompose
import passes.modelio.load, passes.modelio.validate
""", """
code = passes.cli.main([src, "-o", dst, "--no-check", "-q", "--target-opset", str(TARGET)])
if code:
    sys.exit(code)
"""),
    # The command as users run it by default: with the onnxruntime check (its child process, the
    # confirmation of folded values, the standard-normal, edge-value and 0-sized sets). Not in TOOLS:
    # bench_end_to_end --check runs it in place of "optimize".
    "optimize+check": ("""
import onnx, onnx_ir, numpy, refimpl
import passes.cli, passes.pipeline, passes.upgrade, passes.fold, passes.simplify, passes.decompose
import passes.modelio.load, passes.modelio.validate
""", """
code = passes.cli.main([src, "-o", dst, "-q", "--target-opset", str(TARGET)])
if code:
    sys.exit(code)
"""),
    "vc+onnxsim": ("""
import onnx, onnx.version_converter, onnxsim
""", """
model = onnx.version_converter.convert_version(onnx.load(src), TARGET)
model, ok = onnxsim.simplify(model)
if not ok:
    sys.exit("onnxsim: the simplified model failed onnxsim's own check")
onnx.save(model, dst)
"""),
    # fallback=True: where onnxscript's own converter has no adapter, it falls back to onnx's.
    "onnxscript": ("""
import onnx_ir as ir, onnxscript.optimizer, onnxscript.version_converter
""", """
model = ir.load(src)
onnxscript.version_converter.convert_version(model, TARGET, fallback=True)
onnxscript.optimizer.optimize(model)
ir.save(model, dst)
"""),
    "onnxslim": ("""
import onnx, onnxslim
""", """
onnx.save(onnxslim.slim(onnx.load(src)), dst)
"""),
    "ort-basic": ("""
import onnxruntime as ort
""", """
options = ort.SessionOptions()
options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
options.optimized_model_filepath = dst
options.log_severity_level = 3
ort.InferenceSession(src, options, providers=["CPUExecutionProvider"])
"""),
}

#: The modules a tool needs (for "not installed").
_TOOL_PACKAGES = {
    "optimize": ("passes", "onnx_ir", "onnxruntime"),
    "optimize+check": ("passes", "onnx_ir", "onnxruntime"),
    "vc+onnxsim": ("onnx", "onnxsim"),
    "onnxscript": ("onnxscript", "onnx_ir"),
    "onnxslim": ("onnxslim",),
    "ort-basic": ("onnxruntime",),
}


# onnxsim with its own target opset (0.8 has ``simplify(..., target_opset_version=N)``, the CLI's
# ``--target-opset``, which also enables its
# fusions into LayerNormalization-17, Gelu-20, RMSNormalization-23); an onnxsim without that parameter
# gets onnx.version_converter first, as in "vc+onnxsim".
_ONNXSIM_OWN_TARGET = """
import inspect
model = onnx.load(src)
if "target_opset_version" in inspect.signature(onnxsim.simplify).parameters:
    model, ok = onnxsim.simplify(model, target_opset_version=TARGET)
else:
    model, ok = onnxsim.simplify(onnx.version_converter.convert_version(model, TARGET))
if not ok:
    sys.exit("onnxsim: the simplified model failed onnxsim's own check")
onnx.save(model, dst)
"""


def tool_snippet(tool: str, target_opset: int = 18, onnxsim_target: bool = False) -> str:
    """The :func:`measure` snippet of ``tool`` (one of :data:`TOOLS`), converting to ``target_opset``.

    ``onnxsim_target``: ``vc+onnxsim`` lets onnxsim convert to ``target_opset`` itself where it can
    (onnxsim 0.8's ``target_opset_version``) instead of onnx.version_converter first.
    """
    imports, work = _TOOL_SNIPPETS[tool]
    if tool == "vc+onnxsim" and onnxsim_target:
        work = _ONNXSIM_OWN_TARGET
    prelude = _TOOL_PRELUDE.format(repo=str(REPO), target=int(target_opset))
    return prelude + imports + _TOOL_BASELINE + work + _TOOL_REPORT


def tool_installed(tool: str) -> str:
    """"" if ``tool`` can run here, else ``"not installed (module, ...)"``."""
    import importlib.util

    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    missing = [m for m in _TOOL_PACKAGES[tool] if importlib.util.find_spec(m) is None]
    return f"not installed ({', '.join(missing)})" if missing else ""


# --- models --------------------------------------------------------------------------------------


def _walk_nodes(model: Any) -> Iterable[Any]:
    """Every node of the main graph, its subgraphs (recursively) and the model-local functions."""
    import onnx

    stack = [model.graph.node, *(f.node for f in model.functions)]
    while stack:
        for node in stack.pop():
            yield node
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    stack.append(attr.g.node)
                for g in attr.graphs:
                    stack.append(g.node)


def count_nodes(model: Any) -> int:
    """Nodes of an ``onnx.ModelProto``: main graph, every subgraph and every model-local function."""
    return sum(1 for _ in _walk_nodes(model))


def op_counts(model: Any) -> dict[str, int]:
    """Op-type histogram over the same nodes as :func:`count_nodes` (``domain::Op`` outside ai.onnx)."""
    counts: dict[str, int] = {}
    for node in _walk_nodes(model):
        key = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))


def default_opset(model: Any) -> int | None:
    """The model's ai.onnx opset version."""
    return next((int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")), None)


def ort_session(model: Any) -> Any:
    """An onnxruntime CPU session of ``model`` (a ``ModelProto``): one thread, its graph optimisations off."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def load_models_builder() -> Any:
    """``models/build_real_models.py`` as a module (its ``installed_models()`` lists the shipped models)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_real_models", REPO / "models" / "build_real_models.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("build_real_models", module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module
