"""A tree-ensemble model of ~200 MB of attributes through each tool, against protobuf's floor.

Gradient-boosted trees converted by skl2onnx or onnxmltools are one node whose
``nodes_*`` / ``class_*`` attributes hold tens of millions of numbers and
strings. The model is built at run time (``--trees`` full binary trees of
``--depth``; 3,000 of depth 10 give 6.1M tree nodes, 67M attribute elements,
217 MB), a ``TreeEnsembleClassifier`` (``ai.onnx.ml`` 3) at opset 13 whose
probabilities go through ``ZipMap`` (a sequence of maps, as skl2onnx writes).

Each tool runs in a fresh interpreter (``harness.measure``): the time of its
own load + passes + save after its imports, and its peak RSS, with ratios to
the floors of one run:

- ``cp``: copying the file (``shutil.copyfile``): the disk;
- ``protobuf``: ``ModelProto.ParseFromString`` of the file and
  ``SerializeToString`` to the output: what any tool that parses the model pays;
- ``ort-session``: one onnxruntime session on the model (no optimisation): what
  the onnxruntime check pays twice (original and output), in a child process
  whose memory ``optimize+check``'s figure does not include;
- ``optimize``: ours, ``passes.cli.main([IN, "-o", OUT, "--no-check", "-q"])``
  (upgrade to opset 18, fold, simplify, decompose; the ONNX checker on the way
  in and out), and ``optimize+check``: the same with the onnxruntime check;
- ``vc+onnxsim``, ``onnxscript``, ``onnxslim``, ``ort-basic``: as in
  ``bench_end_to_end`` (``harness.tool_snippet``).

Every output is then checked (``onnx.checker`` full check, loads in
onnxruntime) unless ``--no-verify``. ``--quick``: 300 trees (~22 MB).

Usage:
    python benchmarks/bench_large_attributes.py [--quick] [--trees N] [--depth D]
        [--tools T,...] [--timeout S] [--no-verify] [--json FILE]
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import sys
import tempfile
import time

import numpy as np
import onnx
from onnx import TensorProto, helper

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from harness import TOOLS, check_model_file, format_table, measure, save_json, tool_installed, tool_snippet  # noqa: E402

_FLOORS = {
    "cp": """
import shutil, sys, time
start = time.perf_counter()
shutil.copyfile(sys.argv[1], sys.argv[2])
print('{"seconds": %f}' % (time.perf_counter() - start))
""",
    "protobuf": """
import sys, time, onnx
start = time.perf_counter()
model = onnx.ModelProto()
with open(sys.argv[1], "rb") as f:
    model.ParseFromString(f.read())
with open(sys.argv[2], "wb") as f:
    f.write(model.SerializeToString())
print('{"seconds": %f}' % (time.perf_counter() - start))
""",
    "ort-session": """
import sys, time, onnxruntime as ort
start = time.perf_counter()
options = ort.SessionOptions()
options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
options.log_severity_level = 3
ort.InferenceSession(sys.argv[1], options, providers=["CPUExecutionProvider"])
print('{"seconds": %f}' % (time.perf_counter() - start))
""",
}
_CHECKED = tool_snippet("optimize").replace('"--no-check", ', "")  # ours with its onnxruntime check
assert _CHECKED != tool_snippet("optimize"), "harness's optimize snippet no longer passes --no-check"


def build_model(path: pathlib.Path, trees: int, depth: int = 10, features: int = 100, classes: int = 3) -> None:
    """Writes the tree-ensemble classifier (random splits and weights, seeded) to ``path``."""
    rng = np.random.default_rng(0)
    per, inner = 2 ** (depth + 1) - 1, 2**depth - 1
    ids = np.arange(per)
    leaf = ids >= inner
    leaves = trees * (per - inner)
    lists = {
        "nodes_treeids": np.repeat(np.arange(trees), per),
        "nodes_nodeids": np.tile(ids, trees),
        "nodes_featureids": rng.integers(0, features, trees * per),
        "nodes_values": rng.standard_normal(trees * per).astype(np.float32),
        "nodes_truenodeids": np.tile(np.where(leaf, 0, 2 * ids + 1), trees),
        "nodes_falsenodeids": np.tile(np.where(leaf, 0, 2 * ids + 2), trees),
        "nodes_missing_value_tracks_true": np.zeros(trees * per, np.int64),
        "class_treeids": np.repeat(np.arange(trees), per - inner),
        "class_nodeids": np.tile(ids[leaf], trees),
        "class_ids": rng.integers(0, classes, leaves),
        "class_weights": rng.standard_normal(leaves).astype(np.float32),
    }
    node = helper.make_node("TreeEnsembleClassifier", ["X"], ["label", "probabilities"], domain="ai.onnx.ml",
                            classlabels_int64s=list(range(classes)), post_transform="SOFTMAX")  # fmt: skip
    for name, values in lists.items():
        attr = node.attribute.add(name=name)
        if values.dtype.kind == "f":
            attr.type = onnx.AttributeProto.FLOATS
            attr.floats.extend(values.tolist())
        else:
            attr.type = onnx.AttributeProto.INTS
            attr.ints.extend(values.tolist())
    modes = node.attribute.add(name="nodes_modes", type=onnx.AttributeProto.STRINGS)
    modes.strings.extend(np.where(np.tile(leaf, trees), b"LEAF", b"BRANCH_LEQ").tolist())
    zipmap = helper.make_node("ZipMap", ["probabilities"], ["output_probability"], domain="ai.onnx.ml",
                              classlabels_int64s=list(range(classes)))  # fmt: skip
    maps = helper.make_sequence_type_proto(
        helper.make_map_type_proto(TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, [])))
    graph = helper.make_graph(
        [node, zipmap], "trees", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", features])],
        [helper.make_tensor_value_info("label", TensorProto.INT64, ["N"]), helper.make_value_info("output_probability", maps)],
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 13), helper.make_opsetid("ai.onnx.ml", 3)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=8,
                              producer_name="onnx-optimize benchmarks/bench_large_attributes.py")  # fmt: skip
    onnx.save_model(model, str(path))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="300 trees (about 22 MB) instead of 3000")
    parser.add_argument("--trees", type=int, default=None, help="number of trees (overrides --quick)")
    parser.add_argument("--depth", type=int, default=10, help="depth of each full binary tree (default 10)")
    parser.add_argument("--tools", default=",".join(("optimize", "optimize+check", *TOOLS[1:])),
                        help="comma-separated tools (default: all)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per tool (default 900)")
    parser.add_argument("--no-verify", action="store_true", help="do not check the outputs")
    parser.add_argument("--json", type=pathlib.Path, default=None, help="where to save the measurements")
    args = parser.parse_args(argv)
    trees = args.trees or (300 if args.quick else 3000)
    folder = pathlib.Path(tempfile.mkdtemp(prefix="bench_large_attributes."))
    results = []
    try:
        src = folder / "trees.onnx"
        start = time.perf_counter()
        build_model(src, trees, args.depth)
        size_mib = src.stat().st_size / 2**20
        case = f"{trees} trees, {size_mib:.0f} MiB"
        print(f"bench_large_attributes: built {case} in {time.perf_counter() - start:.1f} s", file=sys.stderr)
        tools = [t for t in args.tools.split(",") if t]
        runs = [(name, snippet) for name, snippet in _FLOORS.items()]
        for tool in tools:
            if tool == "optimize+check":
                runs.append((tool, _CHECKED))
            elif (missing := tool_installed(tool)) == "":
                runs.append((tool, tool_snippet(tool)))
            else:
                print(f"bench_large_attributes: {tool}: {missing}", file=sys.stderr)
        for name, snippet in runs:
            out = folder / f"{name}.onnx"
            result = measure(name, case, snippet, [src, out], timeout=args.timeout)
            if result.ok and not args.no_verify and name not in ("cp", "ort-session") and out.exists():
                result.extra.update(check_model_file(out, timeout=args.timeout))
            result.extra["rss_over_size"] = round(result.peak_rss_mib / size_mib, 2)
            if "baseline_rss_kib" in result.extra:  # what the tool's imports alone hold, before the work
                net = result.peak_rss_mib - result.extra["baseline_rss_kib"] / 1024
                result.extra["net_rss_over_size"] = round(net / size_mib, 2)
            results.append(result)
            shown = f"{result.seconds:.2f} s" if result.seconds is not None else f"failed ({result.error})"
            print(f"bench_large_attributes: {name}: {shown}, {result.peak_rss_mib:.0f} MiB "
                  f"({result.extra['rss_over_size']}x the file)", file=sys.stderr, flush=True)  # fmt: skip
            out.unlink(missing_ok=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(format_table(results, reference="protobuf"))
    print("peak RSS / model size (after the imports' own, where known): " + ", ".join(
        f"{r.tool} {r.extra['rss_over_size']}x" + (f" ({r.extra['net_rss_over_size']}x)" if "net_rss_over_size" in r.extra else "")
        for r in results))  # fmt: skip
    print("optimize+check: onnxruntime runs in a child process, whose memory is not counted (see ort-session)")
    if args.json:
        save_json(args.json, results, meta={"trees": trees, "depth": args.depth, "model_mib": size_mib})
    ours = [r for r in results if r.tool.startswith("optimize")]
    return 0 if all(r.ok and r.extra.get("valid", True) for r in ours) else 1


if __name__ == "__main__":
    sys.exit(main())
