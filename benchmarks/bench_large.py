"""A large model with dense weights through ``optimize --no-check``, against ``cp`` of its weight file.

The model is built at run time: ``--weights`` float32 4096x4096 MatMul weights
(64 MiB each; the default 96 make 6 GiB) as external data in one file, every
byte written (pseudo-random values from ``numpy.random.default_rng(seed)``, in
[0.25, 0.75): none is 0 or 1, no block is a hole, no two weights are equal),
and an opset-13 graph ``x -> MatMul(w0) -> ... -> MatMul(wN-1) ->
ReduceL2(axes=[-1]) -> ReduceLogSum(axes=[-1])``. The passes upgrade the Reduce
ops (axes become inputs) and touch no weight, so the output's data file holds
the input's weights: the floor is copying the file.

Earlier versions built the data file with ``os.truncate`` (a sparse file of
zeros) unless ``--dense`` was given: a copy that keeps holes writes nothing,
so that measured nothing about real weights. The file is now always dense.

Measured, in ``--pairs`` pairs that alternate the order (optimize then cp, cp
then optimize, ...), each pair preceded by ``sync``:

- ``optimize``: ``python -m passes IN -o OUT --no-check -q --report R`` (start-up,
  the load with its validation and the ONNX checker, the passes, the save, the
  checker on the output), and the phase times of its report;
- ``cp``: ``cp IN.data OUT.data`` (GNU cp: ``copy_file_range`` where it can).

The figure is the median over the pairs of optimize's time over cp's. With
``--baseline DIR`` (another checkout of this repository, e.g. ``git archive
COMMIT | tar -x -C DIR``) each round also runs ``optimize`` from DIR, the three
in rotating order, for a before/after comparison on the same model. Each
``optimize`` runs with its checkout as the working folder: ``python -m`` puts
the working folder first on ``sys.path``, so run from elsewhere (as this script
was until 2026-12-04) both would have run the code of the folder it was started in. The page
cache (``--cache``): ``drop`` runs ``sync; echo 3 > /proc/sys/vm/drop_caches``
before every run (both read the weights from the disk, and optimize its Python
modules too); ``warm`` reads the input's data file once before every run (both
read it from memory); ``auto`` (the default) drops when this process may,
else warm. The state used is printed and saved. On a virtual disk whose host
keeps recently read blocks, dropped is not cold and favours cp, which starts
copying at once where optimize's save starts seconds later (measured: a copy
3 s after the drop took 8-36 % longer; see docs/benchmarks.md); warm compares
like with like. Every timed run then starts ``--settle`` seconds (default 2)
after that preparation, so that none starts in a state the others do not see:
a copy started at once after the read-through was measured faster than the
same copy started 0.5 s later (64 MiB calls, 3 GiB: 1.2 s against 2.1 s), which
favoured ``cp`` over a command that copies after its start-up. Peak RSS is the child's
(``/usr/bin/time -v`` when present, else ``ru_maxrss`` of the children).

The other tools (``--tools``, none by default: most load every weight, which
takes minutes and more memory than the weights) run once each after the pairs,
each as a user would run it on a model over 2 GB, saving external data:
``vc+onnxsim`` (``onnx.load``, ``onnx.version_converter`` to 18,
``onnxsim.simplify``, ``onnx.save`` with external data), ``onnxscript``
(``ir.load``, its version converter with fallback, ``optimizer.optimize``,
``ir.save`` with external data), ``onnxslim`` (``onnxslim.slim(IN, OUT,
save_as_external_data=True)``) and ``ort-basic`` (an onnxruntime session
writing its basic-optimised model with external initializers). A tool is
stopped when its resident memory passes ``--rss-cap`` (default 16 GiB, at most
70 % of physical memory) or it runs longer than ``--timeout``; its row then
says so.

Every output is checked in a child process: ``onnx.checker`` on the file
(which also checks that the external data is there), the opset it declares
(the passes' target is 18; ``ort-basic`` does not upgrade), the size of its
data file, which must hold every weight, and the disk space it takes.

The input and each copy take the size of the weights on disk; the script
checks that twice that is free (``shutil.disk_usage``) and removes what it
wrote after each run and the model at the end.

Usage:
    python benchmarks/bench_large.py [--weights N | --quick] [--pairs N] [--cache auto|drop|warm] [--baseline DIR]
        [--dir DIR] [--settle S] [--seed S] [--tools vc+onnxsim,onnxscript,onnxslim,ort-basic] [--rss-cap GIB]
        [--timeout S] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from harness import child_env  # noqa: E402  (stdlib only at import)

SIDE = 4096
WEIGHT_BYTES = SIDE * SIDE * 4
FULL_WEIGHTS = 96
QUICK_WEIGHTS = 16


def build_model(folder: pathlib.Path, weights: int, seed: int = 0) -> pathlib.Path:
    """Writes ``model.onnx`` and its dense ``model.onnx.data`` into ``folder``; returns its path.

    Each weight is a fresh draw of ``default_rng(seed)``: float32 in [0.25, 0.75)
    (none 0 or 1), written in 64 MiB chunks; the file is synced before return so
    that its write-back does not land in the first timed run.
    """
    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    data_name = "model.onnx.data"
    inits, nodes, prev = [], [], "x"
    for i in range(weights):
        tensor = TensorProto(name=f"w{i}", data_type=TensorProto.FLOAT, dims=[SIDE, SIDE])
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", data_name), ("offset", str(i * WEIGHT_BYTES)), ("length", str(WEIGHT_BYTES))):
            tensor.external_data.add(key=key, value=value)
        inits.append(tensor)
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"h{i}"], name=f"mm{i}"))
        prev = f"h{i}"
    nodes.append(helper.make_node("ReduceL2", [prev], ["l2"], name="l2", axes=[-1], keepdims=1))
    nodes.append(helper.make_node("ReduceLogSum", ["l2"], ["y"], name="logsum", axes=[-1], keepdims=1))
    graph = helper.make_graph(
        nodes, "large",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", SIDE])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 1])],
        inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8,
                              producer_name="onnx-optimize benchmarks/bench_large.py")  # fmt: skip
    path = folder / "model.onnx"
    onnx.save_model(model, str(path))
    rng = np.random.default_rng(seed)
    block = np.empty(SIDE * SIDE, dtype=np.float32)
    with open(folder / data_name, "wb") as f:
        for _ in range(weights):
            rng.random(out=block, dtype=np.float32)
            block *= 0.5
            block += 0.25
            f.write(memoryview(block))
        f.flush()
        os.fsync(f.fileno())
    return path


def _run(command: list[str], env: dict[str, str] | None = None, cwd: pathlib.Path | None = None) -> dict[str, Any]:
    """Runs ``command`` (in ``cwd``); its wall time, exit status and peak RSS (MiB)."""
    timer = shutil.which("time") or ("/usr/bin/time" if os.path.exists("/usr/bin/time") else None)
    with tempfile.NamedTemporaryFile("r", suffix=".time") as stats:
        full = [timer, "-v", "-o", stats.name, *command] if timer else command
        start = time.perf_counter()
        proc = subprocess.run(full, env=env, cwd=cwd, capture_output=True, text=True)
        wall = time.perf_counter() - start
        rss_kib = 0
        if timer:
            for line in stats.read().splitlines():
                if "Maximum resident set size" in line:
                    rss_kib = int(line.rsplit(":", 1)[1])
        else:
            rss_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    error = "" if proc.returncode == 0 else (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
    return {"seconds": wall, "exit": proc.returncode, "peak_rss_mib": rss_kib / 1024, "error": error}


#: The other tools, each run as ``python -c SNIPPET IN OUT`` (OUT's data file is ``OUT.data``).
OTHER_TOOLS: dict[str, str] = {
    "vc+onnxsim": """
import os, sys, onnx, onnx.version_converter, onnxsim
src, dst = sys.argv[1], sys.argv[2]
model = onnx.version_converter.convert_version(onnx.load(src), 18)
model, ok = onnxsim.simplify(model)
if not ok:
    sys.exit("onnxsim: the simplified model failed onnxsim's own check")
onnx.save(model, dst, save_as_external_data=True, location=os.path.basename(dst) + ".data")
""",
    "onnxscript": """
import os, sys, onnx_ir as ir, onnxscript.optimizer, onnxscript.version_converter
src, dst = sys.argv[1], sys.argv[2]
model = ir.load(src)
onnxscript.version_converter.convert_version(model, 18, fallback=True)
onnxscript.optimizer.optimize(model)
ir.save(model, dst, external_data=os.path.basename(dst) + ".data")
""",
    "onnxslim": """
import sys, onnxslim
onnxslim.slim(sys.argv[1], sys.argv[2], save_as_external_data=True)
""",
    "ort-basic": """
import os, sys, onnxruntime as ort
src, dst = sys.argv[1], sys.argv[2]
options = ort.SessionOptions()
options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
options.optimized_model_filepath = dst
options.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                 os.path.basename(dst) + ".data")
options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
options.log_severity_level = 3
ort.InferenceSession(src, options, providers=["CPUExecutionProvider"])
""",
}

_CHECK_OUTPUT = """
import json, os, sys, onnx
path = sys.argv[1]
onnx.checker.check_model(path)
model = onnx.load(path, load_external_data=False)
opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
data = [t for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
files = {e.value for t in data for e in t.external_data if e.key == "location"}
stats = [os.stat(os.path.join(os.path.dirname(path), f)) for f in files]
print(json.dumps({"opset": opset, "external_tensors": len(data), "data_bytes": sum(s.st_size for s in stats),
                  "allocated_bytes": sum(s.st_blocks * 512 for s in stats)}))
"""


def _rss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _run_capped(command: list[str], rss_cap_kib: int, timeout: float) -> dict[str, Any]:
    """Runs ``command``, stopping it past ``rss_cap_kib`` of resident memory or ``timeout`` seconds.

    Peak RSS is the child's own (``wait4``), so the parent's pages do not count.
    """
    start = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err)
        stopped = ""
        while True:
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                break
            if _rss_kib(process.pid) > rss_cap_kib:
                stopped = f"stopped past {rss_cap_kib / 2**20:.0f} GiB of resident memory"
            elif time.perf_counter() - start > timeout:
                stopped = f"stopped after {timeout:.0f} s"
            if stopped:
                process.kill()
                pid, status, usage = os.wait4(process.pid, 0)
                break
            time.sleep(0.1)
        process.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - start
        err.seek(0)
        lines = err.read().decode(errors="replace").strip().splitlines()
    error = stopped or ("" if process.returncode == 0 else (lines or [f"exit {process.returncode}"])[-1][:160])
    return {"seconds": wall, "exit": process.returncode if not stopped else -9, "peak_rss_mib": usage.ru_maxrss / 1024,
            "error": error}


def _check_output(path: pathlib.Path) -> dict[str, Any]:
    """``onnx.checker`` on a written model, its opset and the size of its data files (in a child)."""
    proc = subprocess.run([sys.executable, "-c", _CHECK_OUTPUT, str(path)], capture_output=True, text=True)
    if proc.returncode:
        return {"valid": False, "check_error": (proc.stderr.strip().splitlines() or ["?"])[-1][:160]}
    return {"valid": True, **json.loads(proc.stdout.strip().splitlines()[-1])}


def _remove(*paths: pathlib.Path) -> None:
    for path in paths:
        path.unlink(missing_ok=True)


_DROP_CACHES = "/proc/sys/vm/drop_caches"


def _drop_caches() -> bool:
    """``sync; echo 3 > /proc/sys/vm/drop_caches``; whether it could."""
    os.sync()
    try:
        with open(_DROP_CACHES, "w", encoding="ascii") as f:
            f.write("3\n")
    except OSError:
        return False
    return True


def _read_through(path: pathlib.Path) -> None:
    """Reads ``path`` once, so that its pages are in the page cache."""
    buffer = bytearray(8 << 20)
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buffer):
            pass


def _prepare(cache: str, data: pathlib.Path, settle: float) -> None:
    """Before each timed run: nothing dirty left to write back, the page cache as ``cache`` says, then ``settle`` s."""
    if cache == "drop":
        if not _drop_caches():
            raise SystemExit(f"bench_large: cannot write {_DROP_CACHES} any more")
    else:
        os.sync()
        _read_through(data)
    time.sleep(settle)


CACHE_STATES = {
    "drop": "dropped before every run (sync; echo 3 > /proc/sys/vm/drop_caches): both read the weights from disk",
    "warm": "warm: sync, then the input's data file read once before every run (both read it from memory)",
}


def _optimize_run(src: pathlib.Path, out: pathlib.Path, checkout: pathlib.Path, check: bool) -> dict[str, Any]:
    """``optimize`` from ``checkout``: run in it, since ``python -m`` puts the working folder first on
    ``sys.path``, before ``PYTHONPATH`` (from another checkout's folder, that one's code would run)."""
    report = out.with_name("report.json")
    run = _run([sys.executable, "-m", "passes", str(src), "-o", str(out), "--no-check", "-q",
                "--report", str(report)], child_env(checkout), checkout)  # fmt: skip
    data = out.with_name(out.name + ".data")
    run["output_bytes"] = data.stat().st_size if data.exists() else 0
    if report.exists():
        run["phases"] = json.loads(report.read_text()).get("phases", {})
    if check and run["exit"] == 0:  # checked once: the runs write the same bytes
        run.update(_check_output(out))
    _remove(out, data, report)
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK_WEIGHTS} weights (1 GiB) instead of {FULL_WEIGHTS} (6 GiB)")
    parser.add_argument("--weights", type=int, default=None,
                        help=f"number of 64 MiB weights (default {FULL_WEIGHTS}; overrides --quick)")
    parser.add_argument("--pairs", type=int, default=3, help="alternating optimize/cp pairs, rounds with --baseline (default: 3)")
    parser.add_argument("--repeat", type=int, default=None, help=argparse.SUPPRESS)  # the old name of --pairs
    parser.add_argument("--cache", choices=("auto", "drop", "warm"), default="auto",
                        help="the page cache before each run: dropped, warm, or dropped if permitted (default)")
    parser.add_argument("--settle", type=float, default=2.0,
                        help="seconds to wait after preparing the page cache, before each timed run (default: 2)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights' values")
    parser.add_argument("--baseline", type=pathlib.Path, default=None,
                        help="another checkout whose optimize also runs in each round (before/after)")
    parser.add_argument("--dir", type=pathlib.Path, default=None,
                        help="where to build the model (default: a temp folder)")
    parser.add_argument("--tools", default="none",
                        help=f"other tools to run once each, comma-separated, or none (the default; have: "
                             f"{','.join(OTHER_TOOLS)})")  # fmt: skip
    parser.add_argument("--rss-cap", type=float, default=None,
                        help="GiB of resident memory past which another tool is stopped (default: 16, "
                             "at most 70%% of physical memory)")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=1800, help="seconds after which another tool is stopped")
    parser.add_argument("--json", type=pathlib.Path, default=None, help="where to save the measurements")
    args = parser.parse_args(argv)
    if not 0 <= args.settle <= 60:
        parser.error(f"--settle {args.settle}: give seconds from 0 to 60")
    others = [t for t in args.tools.split(",") if t and t != "none"]
    unknown = set(others) - set(OTHER_TOOLS)
    if unknown:
        parser.error(f"unknown tool {', '.join(sorted(unknown))} (have: {', '.join(OTHER_TOOLS)})")
    physical_kib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 1024
    rss_cap_kib = int(min(args.rss_cap * 2**20 if args.rss_cap else 16 * 2**20, 0.7 * physical_kib))
    weights = args.weights or (QUICK_WEIGHTS if args.quick else FULL_WEIGHTS)
    pairs = args.repeat or args.pairs
    nbytes = weights * WEIGHT_BYTES
    parent = (args.dir or pathlib.Path(tempfile.gettempdir())).resolve()  # the children run elsewhere
    if not parent.is_dir():
        parser.error(f"--dir {parent}: not a directory")
    free = shutil.disk_usage(parent).free
    needed = 2 * nbytes + (256 << 20)
    if free < needed:
        print(f"bench_large: skipped: {free / 2**30:.1f} GiB free in {parent}, needs {needed / 2**30:.1f} GiB",
              file=sys.stderr)  # fmt: skip
        if args.json:
            args.json.write_text(json.dumps({"meta": {"skipped": "not enough free disk"}, "results": []}) + "\n")
        return 0
    cache = args.cache
    if cache == "auto":
        cache = "drop" if _drop_caches() else "warm"
    elif cache == "drop" and not _drop_caches():
        parser.error(f"--cache drop: cannot write {_DROP_CACHES} (not permitted here); use --cache warm")
    if args.baseline is not None and not (args.baseline / "passes" / "__main__.py").is_file():
        parser.error(f"--baseline {args.baseline}: no passes/__main__.py there")
    checkouts = {"optimize": REPO}
    if args.baseline is not None:
        checkouts["baseline"] = args.baseline.resolve()
    order = [*checkouts, "cp"]
    results: dict[str, list[dict[str, Any]]] = {tool: [] for tool in order}
    ratios: list[float] = []
    baseline_ratios: list[float] = []
    folder = pathlib.Path(tempfile.mkdtemp(prefix="bench_large.", dir=parent))
    try:
        start = time.perf_counter()
        src = build_model(folder, weights, args.seed)
        data = src.with_name(src.name + ".data")
        print(f"bench_large: built {nbytes / 2**30:.2f} GiB of dense weights in {time.perf_counter() - start:.1f} s; "
              f"page cache {cache}", file=sys.stderr, flush=True)  # fmt: skip
        out = folder / "out.onnx"
        copy = folder / "copy.data"
        for i in range(pairs):
            pair: dict[str, dict[str, Any]] = {}
            for tool in order[i % len(order):] + order[:i % len(order)]:
                _prepare(cache, data, args.settle)
                if tool in checkouts:
                    run = _optimize_run(src, out, checkouts[tool], check=i == 0)
                else:
                    run = _run(["cp", str(data), str(copy)])
                    run["output_bytes"] = copy.stat().st_size if copy.exists() else 0
                    _remove(copy)
                pair[tool] = run
                results[tool].append(run)
            ratio = pair["optimize"]["seconds"] / pair["cp"]["seconds"]
            ratios.append(ratio)
            baseline = ""
            if "baseline" in pair:
                baseline_ratios.append(pair["baseline"]["seconds"] / pair["cp"]["seconds"])
                baseline = f", baseline {pair['baseline']['seconds']:.2f} s (ratio {baseline_ratios[-1]:.2f})"
            print(f"bench_large: pair {i + 1} ({order[i % len(order)]} first): optimize "
                  f"{pair['optimize']['seconds']:.2f} s ({pair['optimize']['peak_rss_mib']:.0f} MiB), cp "
                  f"{pair['cp']['seconds']:.2f} s, ratio {ratio:.2f}{baseline}"
                  + "".join(f" ({t}: {r['error']})" for t, r in pair.items() if r["error"]),
                  file=sys.stderr, flush=True)  # fmt: skip
        for tool in others:
            dst = folder / f"{tool}.onnx"
            _prepare(cache, data, args.settle)
            run = _run_capped([sys.executable, "-c", OTHER_TOOLS[tool], str(src), str(dst)], rss_cap_kib, args.timeout)
            if run["exit"] == 0:
                run.update(_check_output(dst))
            results[tool] = [run]
            for path in folder.iterdir():  # whatever the tool wrote (ORT and onnxslim may add files)
                if path not in (src, data):
                    _remove(path) if path.is_file() else shutil.rmtree(path, ignore_errors=True)
            print(f"bench_large: {tool}: {run['seconds']:.2f} s, {run['peak_rss_mib']:.0f} MiB"
                  + (f" ({run['error'] or run.get('check_error', '')})" if run["error"] or not run.get("valid", True)
                     else ""), file=sys.stderr, flush=True)  # fmt: skip
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    summary = {
        tool: {
            "median_seconds": statistics.median(r["seconds"] for r in runs),
            "median_peak_rss_mib": statistics.median(r["peak_rss_mib"] for r in runs),
            "max_peak_rss_mib": max(r["peak_rss_mib"] for r in runs),
            "ok": all(r["exit"] == 0 and r.get("valid", True) for r in runs),
            "runs": len(runs),
            "opset": next((r["opset"] for r in runs if "opset" in r), None),
            "data_bytes": next((r["data_bytes"] for r in runs if "data_bytes" in r),
                               next((r["output_bytes"] for r in runs if "output_bytes" in r), None)),
            "allocated_bytes": next((r["allocated_bytes"] for r in runs if "allocated_bytes" in r), None),
            "error": next((r["error"] or r.get("check_error", "") for r in runs
                           if r["error"] or not r.get("valid", True)), ""),
        }
        for tool, runs in results.items()
    }
    for tool in checkouts:
        phase_names = {name for r in results[tool] for name in r.get("phases", {})}
        summary[tool]["median_phase_seconds"] = {
            name: statistics.median(r["phases"].get(name, 0.0) for r in results[tool] if "phases" in r)
            for name in sorted(phase_names)
        }
    ratio = statistics.median(ratios)
    cp = summary["cp"]["median_seconds"]
    gib = nbytes / 2**30
    print(f"{gib:.2f} GiB of dense weights ({weights} x 64 MiB); {pairs} alternating pairs; page cache "
          f"{CACHE_STATES[cache]}")  # fmt: skip
    print(f"optimize / cp: median of the pairs' ratios {ratio:.2f} (pairs: {', '.join(f'{r:.2f}' for r in ratios)})")
    if baseline_ratios:
        print(f"baseline / cp: median {statistics.median(baseline_ratios):.2f} "
              f"(pairs: {', '.join(f'{r:.2f}' for r in baseline_ratios)}; baseline: {args.baseline})")
    print(f"{'tool':<11} {'seconds':>8} {'x cp':>6} {'GiB/s':>6} {'peak MiB':>9} {'opset':>5} {'data GiB':>8} "
          f"{'on disk':>7}  ok")  # fmt: skip
    for tool, t in summary.items():
        seconds = t["median_seconds"]
        opset = "-" if t["opset"] is None else str(t["opset"])
        data_gib, disk = (("-" if t[key] is None else f"{t[key] / 2**30:.2f}")
                          for key in ("data_bytes", "allocated_bytes"))  # fmt: skip
        print(f"{tool:<11} {seconds:>8.2f} {seconds / cp:>6.2f} {gib / seconds:>6.2f} {t['max_peak_rss_mib']:>9.0f} "
              f"{opset:>5} {data_gib:>8} {disk:>7}  {'yes' if t['ok'] else 'NO: ' + t['error']}")  # fmt: skip
    for tool in checkouts:
        phases = summary[tool]["median_phase_seconds"]
        if phases:
            print(f"{tool} phases (median s): " + ", ".join(f"{k} {v:.2f}" for k, v in phases.items())
                  + (f"; save / cp = {phases['save'] / cp:.2f}" if "save" in phases else ""))  # fmt: skip
    if args.json:
        meta = {"weights": weights, "bytes": nbytes, "dense": True, "pairs": pairs, "cache": cache,
                "cache_state": CACHE_STATES[cache], "settle_seconds": args.settle, "seed": args.seed, "optimize_over_cp": ratio,
                "pair_ratios": ratios, "baseline": str(args.baseline) if args.baseline else None,
                "baseline_pair_ratios": baseline_ratios, "dir": str(parent), "rss_cap_mib": rss_cap_kib / 1024,
                "timeout": args.timeout}  # fmt: skip
        args.json.write_text(json.dumps({"meta": meta, "summary": summary, "results": results}, indent=2) + "\n")
    # Another tool failing is a result, not a failure of the benchmark.
    return 0 if summary["optimize"]["ok"] and summary["cp"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
