"""Constant folding alone (load + fold + save) against other tools, each in its own process.

Tools, each run by ``harness.measure`` in a fresh interpreter (clean peak RSS;
the time is the child's own load + fold + save, without start-up and imports):

* ``ours``: ``ir.load`` -> ``ConstantFoldingPass()`` -> ``ir.save`` (the pass alone, with
  onnx_ir's own load and save, as the onnxscript rows);
* ``ours-modelio``: the same pass between the command's own load (validated, large weights
  moved out of the proto) and save (large arrays written straight to the file);
* ``onnxsim``: ``onnxsim.simplify(check_n=0, perform_optimization=False)`` (folding
  and shape inference, without the onnxoptimizer passes);
* ``onnxscript``: ``ir.load`` -> ``optimizer.fold_constants`` -> ``remove_unused_nodes``
  -> ``ir.save`` (its default size limits);
* ``onnxscript-opt``: the same with ``optimizer.optimize`` (folding plus its
  other rewrites, iterated: the cost that grows quadratically with the node count);
* ``onnxslim``: ``slim`` with only constant folding and dead-node elimination;
* ``onnxruntime``: the offline optimiser, ``ORT_ENABLE_BASIC`` with
  ``optimized_model_filepath``.

A tool that is not installed is reported as such; one that exceeds
``--timeout`` is reported as a timeout. Each output is checked (full onnx
check, loads in onnxruntime) and its node count reported.

Cases: a 5,000-node foldable chain; 1,000 independent 5-node constant chains;
5,000, 20,000 and 50,000 non-foldable nodes (the cost must grow linearly); a 100 MB
weight through Mul and Transpose. ``--quick`` shrinks every case for a smoke test.

Usage::

    python benchmarks/bench_fold.py [--quick] [--tools ours,onnxsim,...] [--json out.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import sys
import tempfile
from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from harness import Measurement, check_model_file, format_table, measure, save_json  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
F32 = TensorProto.FLOAT

# --- models --------------------------------------------------------------------------------------


def _model(nodes, inputs, outputs, initializers) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "bench", inputs, outputs, initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


def foldable_chain(n: int) -> onnx.ModelProto:
    """``c -> Mul/Add -> ... (n nodes) -> Add(x, .)``: everything but the last Add folds."""
    nodes, prev = [], "c"
    for i in range(n):
        nodes.append(helper.make_node("Mul" if i % 2 else "Add", [prev, "k"], [f"v{i}"], name=f"n{i}"))
        prev = f"v{i}"
    nodes.append(helper.make_node("Add", ["x", prev], ["y"], name="out"))
    inits = [
        numpy_helper.from_array(np.full(16, 0.5, np.float32), "c"),
        numpy_helper.from_array(np.full(16, 0.999, np.float32), "k"),
    ]
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", F32, [16])],
        [helper.make_tensor_value_info("y", F32, [16])],
        inits,
    )


def independent_chains(n_chains: int, length: int = 5) -> onnx.ModelProto:
    """``n_chains`` constant chains of ``length`` nodes, each added to the input at the end."""
    nodes, inits, outputs = [], [], []
    for c in range(n_chains):
        inits.append(numpy_helper.from_array(np.full(8, c, np.float32), f"c{c}"))
        prev = f"c{c}"
        for i in range(length):
            op = ("Neg", "Abs", "Sqrt", "Exp", "Neg")[i % 5]
            nodes.append(helper.make_node(op, [prev], [f"c{c}_{i}"], name=f"c{c}_n{i}"))
            prev = f"c{c}_{i}"
        nodes.append(helper.make_node("Add", ["x", prev], [f"y{c}"], name=f"c{c}_out"))
        outputs.append(helper.make_tensor_value_info(f"y{c}", F32, [8]))
    return _model(nodes, [helper.make_tensor_value_info("x", F32, [8])], outputs, inits)


def non_foldable(n: int) -> onnx.ModelProto:
    """``n`` nodes that all depend on the graph input: nothing folds."""
    nodes, prev = [], "x"
    for i in range(n):
        nodes.append(
            helper.make_node(
                ("Add", "Mul", "Relu", "Sub")[i % 4],
                [prev, "k"][: 1 if i % 4 == 2 else 2],
                [f"v{i}"],
                name=f"n{i}",
            )
        )
        prev = f"v{i}"
    inits = [numpy_helper.from_array(np.full(16, 0.5, np.float32), "k")]
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", F32, [16])],
        [helper.make_tensor_value_info(prev, F32, [16])],
        inits,
    )


def big_weight(megabytes: int) -> onnx.ModelProto:
    """A ``megabytes`` MB weight through Mul and Transpose into a MatMul with the input."""
    rows = int(np.sqrt(megabytes * (1 << 20) / 4))
    w = np.random.default_rng(0).standard_normal((rows, rows), dtype=np.float32)
    nodes = [
        helper.make_node("Mul", ["w", "half"], ["wm"], name="mul"),
        helper.make_node("Transpose", ["wm"], ["wt"], perm=[1, 0], name="transpose"),
        helper.make_node("MatMul", ["x", "wt"], ["y"], name="matmul"),
    ]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(0.5, np.float32), "half")]
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", F32, [1, rows])],
        [helper.make_tensor_value_info("y", F32, [1, rows])],
        inits,
    )


def cases(quick: bool) -> dict[str, Callable[[], onnx.ModelProto]]:
    if quick:
        return {
            "chain_200": lambda: foldable_chain(200),
            "chains_50x5": lambda: independent_chains(50),
            "nonfoldable_1k": lambda: non_foldable(1000),
            "nonfoldable_2.5k": lambda: non_foldable(2500),
            "weight_4MB": lambda: big_weight(4),
        }
    return {
        "chain_5k": lambda: foldable_chain(5000),
        "chains_1000x5": lambda: independent_chains(1000),
        "nonfoldable_5k": lambda: non_foldable(5000),
        "nonfoldable_20k": lambda: non_foldable(20000),
        "nonfoldable_50k": lambda: non_foldable(50000),
        "weight_100MB": lambda: big_weight(100),
    }


# --- tools (snippets run as ``python -c SNIPPET src dst``) -------------------------------------------

_PRELUDE = f"""
import json, sys, time
sys.path.insert(0, {str(ROOT)!r})
src, dst = sys.argv[1], sys.argv[2]
"""
# The nodes of the output are counted by the parent: reading a 100 MB output back in the child
# would add its size to the tool's peak memory.
_REPORT = """
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds}))
"""

TOOLS = {
    "ours": """
import onnx_ir as ir
from passes.fold import ConstantFoldingPass
start = time.perf_counter()
model = ir.load(src)
ConstantFoldingPass()(model)
ir.save(model, dst)
""",
    "ours-modelio": """
from passes import modelio
from passes.fold import ConstantFoldingPass
start = time.perf_counter()
model = modelio.load_model(src)
ConstantFoldingPass()(model)
modelio.save_model(model, dst)
""",
    "onnxsim": """
import onnx, onnxsim
start = time.perf_counter()
model, _ = onnxsim.simplify(onnx.load(src), check_n=0, perform_optimization=False)
onnx.save(model, dst)
""",
    "onnxscript": """
import onnx_ir as ir
import onnxscript.optimizer
start = time.perf_counter()
model = ir.load(src)
onnxscript.optimizer.fold_constants(model)
onnxscript.optimizer.remove_unused_nodes(model)
ir.save(model, dst)
""",
    "onnxscript-opt": """
import onnx_ir as ir
import onnxscript.optimizer
start = time.perf_counter()
model = ir.load(src)
onnxscript.optimizer.optimize(model)
ir.save(model, dst)
""",
    "onnxslim": """
import onnx, onnxslim
start = time.perf_counter()
skip = ["graph_fusion", "subexpression_elimination", "weight_tying"]
model = onnxslim.slim(onnx.load(src), skip_optimizations=skip)
onnx.save(model, dst)
""",
    "onnxruntime": """
import onnxruntime as ort
start = time.perf_counter()
options = ort.SessionOptions()
options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
options.optimized_model_filepath = dst
options.log_severity_level = 3
ort.InferenceSession(src, options, providers=["CPUExecutionProvider"])
""",
}
_PACKAGE = {
    "ours": "onnx_ir",
    "ours-modelio": "onnx_ir",
    "onnxsim": "onnxsim",
    "onnxscript": "onnxscript",
    "onnxscript-opt": "onnxscript",
    "onnxslim": "onnxslim",
    "onnxruntime": "onnxruntime",
}


def run_tool(tool: str, case: str, src: pathlib.Path, dst: pathlib.Path, timeout: float) -> Measurement:
    """Measures one tool on one case; checks and counts the nodes of what it wrote."""
    if importlib.util.find_spec(_PACKAGE[tool]) is None:
        return Measurement(tool, case, None, 0.0, 0.0, False, "not installed")
    result = measure(tool, case, _PRELUDE + TOOLS[tool] + _REPORT, [src, dst], timeout)
    if not result.ok and result.wall_seconds >= timeout:
        result.error = f"timeout (> {timeout:.0f} s)"
    if result.ok:
        result.extra["nodes_after"] = len(onnx.load(str(dst), load_external_data=False).graph.node)
        result.extra.update(check_model_file(dst))
    return result


def node_table(results: list[Measurement], nodes_before: dict[str, int]) -> str:
    """Nodes before and after folding, per case and tool."""
    lines = [f"{'case':<28} {'tool':<14} {'nodes before':>12} {'nodes after':>12}"]
    for m in results:
        after = m.extra.get("nodes_after", "-")
        lines.append(f"{m.case:<28} {m.tool:<14} {nodes_before[m.case]:>12} {after!s:>12}")
    return "\n".join(lines)


# --- driver --------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    parser.add_argument("--tools", default=",".join(TOOLS), help="comma-separated subset of %(default)s")
    parser.add_argument("--cases", default="", help="comma-separated subset of the case names")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per tool and case")
    parser.add_argument("--json", type=pathlib.Path, default=None, help="where to save the measurements")
    args = parser.parse_args(argv)
    tools = [t for t in args.tools.split(",") if t]
    if unknown := [t for t in tools if t not in TOOLS]:
        parser.error(f"unknown tools: {', '.join(unknown)}")
    selected = cases(args.quick)
    if args.cases:
        selected = {name: build for name, build in selected.items() if name in args.cases.split(",")}
    results: list[Measurement] = []
    nodes_before: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="bench_fold_") as tmp:
        for case, build in selected.items():
            model = build()
            nodes_before[case] = len(model.graph.node)
            src = pathlib.Path(tmp) / f"{case}.onnx"
            onnx.save(model, src)
            del model
            for tool in tools:
                result = run_tool(
                    tool, case, src, pathlib.Path(tmp) / f"{case}.{tool}.onnx", args.timeout
                )
                results.append(result)
                print(
                    f"{case} / {tool}: {result.seconds} s, {result.peak_rss_mib:.0f} MiB {result.error}",
                    flush=True,
                )
    print()
    print(format_table(results, reference="ours"))
    print()
    print(node_table(results, nodes_before))
    if args.json is not None:
        meta = {
            "quick": args.quick,
            "timeout": args.timeout,
            "python": sys.version.split()[0],
            "nodes_before": nodes_before,
        }
        save_json(args.json, results, meta)
    ours = [m for m in results if m.tool == "ours"]
    return 0 if all(m.ok and m.extra.get("valid") and m.extra.get("loads_in_ort") for m in ours) else 1


if __name__ == "__main__":
    raise SystemExit(main())
