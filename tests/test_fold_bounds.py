"""Constant folding on hostile models: its cost stays bounded in time and memory.

Every case is a small model built here whose folding, done naively, runs out
of memory, computes for minutes or takes quadratic time. Each runs the pass
in a child process under ``RLIMIT_AS`` (so that a regression fails the test
instead of taking the machine down) with a timeout, and asserts what stays
unfolded, how long the pass took and the child's peak memory.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

REPO = pathlib.Path(__file__).resolve().parent.parent
F32 = TensorProto.FLOAT
I64 = TensorProto.INT64

#: Address space of the child: the interpreter with numpy, onnx and onnx_ir takes ~250 MiB.
ADDRESS_SPACE = 1536 << 20
#: Peak resident memory a bounded fold of these small models stays under.
PEAK_RSS_MIB = 600

_CHILD = r"""
import json, resource, sys, time
limit = int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
import onnx_ir as ir
from passes.fold import ConstantFoldingPass

model = ir.load(sys.argv[1])
fold = ConstantFoldingPass(**json.loads(sys.argv[2]))
start = time.perf_counter()
fold(model)
seconds = time.perf_counter() - start
# The uses onnx_ir records must match the nodes' inputs exactly (surgery edits them in bulk).
uses, consistent = {}, True
for node in ir.traversal.RecursiveGraphIterator(model.graph):
    for i, value in enumerate(node.inputs):
        if value is not None:
            if value not in uses:
                uses[value] = set(value.uses())
                consistent &= all(u.node.graph is not None and u.node.inputs[u.idx] is value
                                  for u in uses[value])
            consistent &= (node, i) in uses[value]
if len(sys.argv) > 4:
    ir.save(model, sys.argv[4], external_data=sys.argv[4] + ".data")
print(json.dumps({
    "seconds": seconds,
    "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "stats": fold.stats,
    "uses_consistent": consistent,
    "op_types": [node.op_type for node in model.graph],
}))
"""


def fold_in_child(
    model: onnx.ModelProto | pathlib.Path,
    tmp_path: pathlib.Path,
    *,
    timeout: float = 60,
    save_to: pathlib.Path | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Folds ``model`` (a proto, or a file) in a child process; what it reports."""
    if isinstance(model, onnx.ModelProto):
        onnx.checker.check_model(model, full_check=True)
        path = tmp_path / "model.onnx"
        onnx.save(model, path)
    else:
        path = model
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    argv = [sys.executable, "-c", _CHILD, str(path), json.dumps(kwargs), str(ADDRESS_SPACE)]
    if save_to is not None:
        argv.append(str(save_to))
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, f"child exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def make_model(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    initializers: list[onnx.TensorProto] = (),
    opset: int = 18,
) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def vi(name: str, elem: int, shape: list | None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def assert_bounded(report: dict[str, Any], seconds: float = 5.0) -> None:
    assert report["uses_consistent"]
    assert report["seconds"] < seconds, report
    assert report["peak_rss_mib"] < PEAK_RSS_MIB, report


# --- linear rewrites -----------------------------------------------------------------------------

N_PARTS = 20_000


def _split_model(concat_inputs: list[str], extra_inputs: list[onnx.ValueInfoProto] = ()) -> onnx.ModelProto:
    parts = [f"p{i}" for i in range(N_PARTS)]
    c = numpy_helper.from_array(np.arange(N_PARTS, dtype=np.float32), "c")
    nodes = [
        helper.make_node("Split", ["c"], parts, axis=0, num_outputs=N_PARTS, name="split"),
        helper.make_node("Concat", concat_inputs, ["cc"], axis=0, name="concat"),
        helper.make_node("Add", ["x", "cc"], ["y"], name="add"),
    ]
    width = len(concat_inputs)
    return make_model(nodes, [vi("x", F32, [width]), *extra_inputs], [vi("y", F32, [width])], [c])


def test_split_into_20000_parts_feeding_one_concat_folds_in_linear_time(tmp_path) -> None:
    # Replacing each part's use one at a time rebuilds the Concat's 20,000-input tuple per part.
    report = fold_in_child(_split_model([f"p{i}" for i in range(N_PARTS)]), tmp_path)
    assert report["op_types"] == ["Add"]
    assert report["stats"]["folded"] == 2
    assert report["stats"]["removed_initializers"] == N_PARTS + 1
    assert_bounded(report)


def test_split_parts_feeding_a_concat_that_stays_are_redirected_in_linear_time(tmp_path) -> None:
    # The Concat also takes the graph input: it stays, with 20,000 new initializer inputs.
    model = _split_model(["x1", *(f"p{i}" for i in range(N_PARTS))], [vi("x1", F32, [1])])
    report = fold_in_child(model, tmp_path)
    assert report["op_types"] == ["Concat", "Add"]
    assert report["stats"]["folded"] == 1
    assert_bounded(report)
