"""The memory bounds of issue #29 item 7: seconds and peak RSS of ``optimize`` on each case.

Cases (each built at run time in a temporary folder, seeded):

- ``if-weight``: a 256 MiB float32 external weight (pseudo-random, dense)
  used only inside an If branch (``MatMul(x, W)`` in ``then``, ``Identity(x)``
  in ``else``). Aim: under 1 GiB peak RSS.
- ``if-constant``: the same weight as a ``Constant`` node inside the branch,
  its tensor in external data.
- ``if-nested``: that Constant in the branch of an If nested in the branch
  (simplify lifts it out of the merged branch: it read the weight's bytes to
  compare it with the main graph's constants, 2.4x the weight in peak RSS).
- ``if-branch-initializer``: the weight an initializer of the branch.
- ``trees-cast`` / ``trees``: an ``ai.onnx.ml`` 1 ``TreeEnsembleClassifier``
  (opset 9, ``--trees`` trees of depth 10, about 99 MB of attribute lists)
  whose probabilities go ``Cast -> Identity -> ZipMap``, and the same without
  the Cast. Aim: the Cast case within 2x of the one without.

Each run is ``optimize IN -o OUT -q`` (the onnxruntime check on; ``--no-check``
with ``--no-check``) under ``/usr/bin/time -v`` when present: its wall time and
its "Maximum resident set size" (the largest single process of the tree, so
the check's onnxruntime child counts too).

Usage:
    python benchmarks/bench_bounds.py [--cases if-weight,if-constant,if-nested,if-branch-initializer,trees-cast,trees]
        [--trees N] [--no-check]
"""

from __future__ import annotations

import argparse
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
from onnx import TensorProto, helper

WEIGHT_SIDE = 8192  # 8192 x 8192 float32 = 256 MiB


def build_if_weight(path: pathlib.Path, side: int = WEIGHT_SIDE, constant: bool = False, nested: bool = False,
                    branch_initializer: bool = False) -> None:  # fmt: skip
    """Writes the If-branch model to ``path`` with its weight in ``path.name + '.data'``.

    ``constant``: the weight is a ``Constant`` node inside the branch (its tensor external
    too, as ``onnx.save_model(..., convert_attribute=True)`` writes it), not a main-graph initializer.
    ``nested``: the branch holds an If on the same condition whose branch holds the weight
    (simplify merges the two Ifs and lifts the weight out of the inner branch).
    ``branch_initializer``: the weight is an initializer of the branch itself.
    """
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((side, side), dtype=np.float32)
    init = onnx.numpy_helper.from_array(weight, "W")
    t = helper.make_tensor_value_info("t", TensorProto.FLOAT, [1, side])
    body = [helper.make_node("MatMul", ["x", "W"], ["t"])]
    if constant:
        body.insert(0, helper.make_node("Constant", [], ["W"], value=init))
    then = helper.make_graph(body, "then", [], [t], initializer=[init] if branch_initializer else [])
    other = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["e"])], "else", [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, [1, side])],
    )  # fmt: skip
    if nested:
        inner = helper.make_node("If", ["c"], ["t2"], then_branch=then, else_branch=other)
        t2 = helper.make_tensor_value_info("t2", TensorProto.FLOAT, [1, side])
        then = helper.make_graph([inner], "outer_then", [], [t2])
        other = helper.make_graph(
            [helper.make_node("Neg", ["x"], ["e2"])], "outer_else", [],
            [helper.make_tensor_value_info("e2", TensorProto.FLOAT, [1, side])],
        )  # fmt: skip
    node = helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)
    graph = helper.make_graph(
        [node], "if_weight",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, side])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, side])],
        initializer=[] if constant or branch_initializer else [init],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    onnx.save_model(model, str(path), save_as_external_data=True, location=path.name + ".data",
                    convert_attribute=constant)  # fmt: skip


def build_trees(path: pathlib.Path, trees: int = 1200, depth: int = 10, cast: bool = True,
                features: int = 20, classes: int = 3) -> None:  # fmt: skip
    """Writes a TreeEnsembleClassifier (opset 9, ai.onnx.ml 1) whose probabilities reach a ZipMap."""
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
        "nodes_hitrates": np.ones(trees * per, np.float32),
        "nodes_truenodeids": np.tile(np.where(leaf, 0, 2 * ids + 1), trees),
        "nodes_falsenodeids": np.tile(np.where(leaf, 0, 2 * ids + 2), trees),
        "nodes_missing_value_tracks_true": np.zeros(trees * per, np.int64),
        "class_treeids": np.repeat(np.arange(trees), per - inner),
        "class_nodeids": np.tile(ids[leaf], trees),
        "class_ids": rng.integers(0, classes, leaves),
        "class_weights": rng.standard_normal(leaves).astype(np.float32),
    }
    node = helper.make_node("TreeEnsembleClassifier", ["X"], ["label", "probabilities"], domain="ai.onnx.ml",
                            classlabels_int64s=list(range(classes)), post_transform="NONE")  # fmt: skip
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
    nodes = [node]
    probabilities = "probabilities"
    if cast:
        nodes.append(helper.make_node("Cast", [probabilities], ["cast"], to=TensorProto.FLOAT))
        probabilities = "cast"
    nodes.append(helper.make_node("Identity", [probabilities], ["ident"]))
    nodes.append(helper.make_node("ZipMap", ["ident"], ["output_probability"], domain="ai.onnx.ml",
                                  classlabels_int64s=list(range(classes))))  # fmt: skip
    maps = helper.make_sequence_type_proto(
        helper.make_map_type_proto(TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, [])))
    graph = helper.make_graph(
        nodes, "trees", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", features])],
        [helper.make_tensor_value_info("label", TensorProto.INT64, ["N"]), helper.make_value_info("output_probability", maps)],
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 9), helper.make_opsetid("ai.onnx.ml", 1)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=4)
    onnx.save_model(model, str(path))


def measure(model: pathlib.Path, out: pathlib.Path, check: bool, timeout: float = 1800) -> dict:
    """Seconds, peak RSS (MiB, the largest process of the run) and exit code of ``optimize``."""
    argv = [sys.executable, "-m", "passes", str(model), "-o", str(out), "-q"]
    if not check:
        argv.append("--no-check")
    timer = shutil.which("time") or ("/usr/bin/time" if pathlib.Path("/usr/bin/time").exists() else None)
    if timer:
        argv = [timer, "-v", *argv]
    start = time.perf_counter()
    run = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    seconds = time.perf_counter() - start
    found = re.search(r"Maximum resident set size \(kbytes\): (\d+)", run.stderr)
    rss = int(found.group(1)) / 1024 if found else float("nan")
    return {"seconds": round(seconds, 1), "peak_rss_mib": round(rss), "exit": run.returncode,
            "stderr": "" if run.returncode == 0 else run.stderr[-2000:]}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="if-weight,if-constant,if-nested,if-branch-initializer,trees-cast,trees")
    parser.add_argument("--trees", type=int, default=1200)
    parser.add_argument("--no-check", action="store_true", help="run optimize with --no-check")
    args = parser.parse_args(argv)
    builders = {
        "if-weight": build_if_weight,
        "if-constant": lambda p: build_if_weight(p, constant=True),
        "if-nested": lambda p: build_if_weight(p, constant=True, nested=True),
        "if-branch-initializer": lambda p: build_if_weight(p, branch_initializer=True),
        "trees-cast": lambda p: build_trees(p, args.trees, cast=True),
        "trees": lambda p: build_trees(p, args.trees, cast=False),
    }
    with tempfile.TemporaryDirectory() as tmp:
        for case in args.cases.split(","):
            model = pathlib.Path(tmp, f"{case}.onnx")
            builders[case](model)
            size = sum(f.stat().st_size for f in pathlib.Path(tmp).glob(f"{case}.onnx*")) / 2**20
            result = measure(model, pathlib.Path(tmp, f"{case}.out.onnx"), check=not args.no_check)
            print(f"{case:10s} {size:7.1f} MiB in  {result['seconds']:7.1f} s  "
                  f"peak RSS {result['peak_rss_mib']:6d} MiB  exit {result['exit']}", flush=True)  # fmt: skip
            if result["stderr"]:
                print(result["stderr"], file=sys.stderr)
            for stale in pathlib.Path(tmp).glob(f"{case}*"):
                stale.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
