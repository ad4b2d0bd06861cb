"""Constant folding on hostile models: its cost stays bounded in time and memory.

Every case is a small model built here whose folding, done naively, runs out
of memory, computes for minutes or takes quadratic time. The pass runs in a
child process under ``RLIMIT_AS`` (a regression fails the test instead of
taking the machine down) with a generous timeout (a hang guard only); the
child reports, per model, what stays unfolded, its peak resident memory and
the work done, counted rather than timed: the kernel calls per op (a node
refused before evaluation has none) and the input-tuple elements copied by
input rewrites (linear surgery copies each node's inputs a bounded number of
times; replacing them one at a time is quadratic). The models without
external data share one child (interpreter start-up costs seconds); a case
that raises there is reported as its error.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import onnx.external_data_helper
import hypothesis
import hypothesis.strategies as st
import pytest
from onnx import TensorProto, helper, numpy_helper

REPO = pathlib.Path(__file__).resolve().parent.parent
F32 = TensorProto.FLOAT
I64 = TensorProto.INT64

#: Address space of the child: the interpreter with numpy, onnx and onnx_ir takes ~250 MiB.
ADDRESS_SPACE = 1536 << 20
#: Peak resident memory a bounded fold of one of these small models stays under.
PEAK_RSS_MIB = 600

_CHILD = r"""
import json, os, resource, sys, time
limit = int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
import onnx_ir as ir
import refimpl
from passes.fold import ConstantFoldingPass
from passes.fold import surgery

TRUE_RUN = refimpl.run
KERNEL_CALLS = {}
INPUT_COPIES = [0]


def counting_run(op_type, *args, **kwargs):
    KERNEL_CALLS[op_type] = KERNEL_CALLS.get(op_type, 0) + 1
    return TRUE_RUN(op_type, *args, **kwargs)


_replace_input_with = ir.Node.replace_input_with
_set_inputs = surgery.set_inputs


def counted_replace_input_with(self, index, value):
    INPUT_COPIES[0] += len(self.inputs)  # onnx_ir rebuilds the input tuple per call
    return _replace_input_with(self, index, value)


def counted_set_inputs(node, changes):
    INPUT_COPIES[0] += len(node.inputs)
    return _set_inputs(node, changes)


ir.Node.replace_input_with = counted_replace_input_with
surgery.set_inputs = counted_set_inputs


def peak_rss_mib():
    try:
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) for l in f if l.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def reset_peak_rss():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def uses_consistent(model):
    # The uses onnx_ir records must match the nodes' inputs exactly (surgery edits them in bulk).
    uses, ok = {}, True
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        for i, value in enumerate(node.inputs):
            if value is None:
                continue
            if value not in uses:
                uses[value] = set(value.uses())
                ok &= all(u.node.graph is not None and u.node.inputs[u.idx] is value for u in uses[value])
            ok &= (node, i) in uses[value]
    return ok


def run(job):
    model = ir.load(job["model"])
    KERNEL_CALLS.clear()
    INPUT_COPIES[0] = 0
    refimpl.run = counting_run
    real_run = refimpl.run
    if job.get("truncate"):
        def run_then_truncate(*args, **kwargs):
            refimpl.run = real_run
            results = real_run(*args, **kwargs)
            os.truncate(job["truncate"], 0)
            return results
        refimpl.run = run_then_truncate
    fold = ConstantFoldingPass(**job.get("kwargs", {}))
    reset_peak_rss()
    start = time.perf_counter()  # reported for the reader; no test asserts on it
    error = None
    try:
        fold(model)
    except Exception as e:  # reported with the time and memory it took
        error = f"{type(e).__name__}: {e}"
    finally:
        refimpl.run = real_run
    report = {"seconds": time.perf_counter() - start, "peak_rss_mib": peak_rss_mib(),
              "kernel_calls": dict(KERNEL_CALLS), "input_copies": INPUT_COPIES[0]}
    if error is not None:
        return {**report, "error": error}
    report.update(
        stats=fold.stats,
        uses_consistent=uses_consistent(model),
        op_types=[node.op_type for node in model.graph],
    )
    if job.get("save_to"):
        ir.save(model, job["save_to"], external_data=os.path.basename(job["save_to"]) + ".data")
    return report


reports = []
for job in json.load(open(sys.argv[1])):
    try:
        reports.append(run(job))
    except Exception as e:
        reports.append({"error": f"{type(e).__name__}: {e}"})
print(json.dumps(reports))
"""


def fold_in_child(
    jobs: list[dict[str, Any]], tmp_path: pathlib.Path, timeout: float = 120
) -> list[dict[str, Any]]:
    """Folds each job's model file in one child process; a report per job.

    A job is ``{"model": path, "kwargs": {...}, "save_to": path, "truncate": path}``:
    ``kwargs`` for the pass, ``save_to`` where to save the result (external data
    next to it), ``truncate`` a file to truncate to 0 bytes right after the
    first kernel evaluation. A pass that raises is reported as ``error`` with
    its time and peak memory; any other failure in the child as ``error`` alone.
    """
    jobs_file = tmp_path / "jobs.json"
    jobs_file.write_text(json.dumps(jobs))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    argv = [sys.executable, "-c", _CHILD, str(jobs_file), str(ADDRESS_SPACE)]
    proc = subprocess.run(
        argv, check=False, capture_output=True, text=True, timeout=timeout, env=env
    )
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
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model


def vi(name: str, elem: int, shape: list | None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def assert_bounded(report: dict[str, Any], refused: str | None = None) -> None:
    """No error, consistent uses, peak memory under :data:`PEAK_RSS_MIB`; with ``refused``, no
    kernel of that op ran (refused before evaluation, not computed and thrown away)."""
    assert "error" not in report, report["error"]
    assert report["uses_consistent"]
    assert report["peak_rss_mib"] < PEAK_RSS_MIB, report
    if refused is not None:
        assert report["kernel_calls"].get(refused, 0) == 0, report


# --- the cases ---------------------------------------------------------------------------------------

#: Case name -> builder of its model. Each test below names the cases it checks.
CASES: dict[str, Callable[[], onnx.ModelProto]] = {}


def case(name: str) -> Callable[[Callable[[], onnx.ModelProto]], Callable[[], onnx.ModelProto]]:
    def register(build: Callable[[], onnx.ModelProto]) -> Callable[[], onnx.ModelProto]:
        CASES[name] = build
        return build

    return register


N_PARTS = 20_000


def _split_model(
    concat_inputs: list[str], extra_inputs: list[onnx.ValueInfoProto] = ()
) -> onnx.ModelProto:
    parts = [f"p{i}" for i in range(N_PARTS)]
    c = numpy_helper.from_array(np.arange(N_PARTS, dtype=np.float32), "c")
    nodes = [
        helper.make_node("Split", ["c"], parts, axis=0, num_outputs=N_PARTS, name="split"),
        helper.make_node("Concat", concat_inputs, ["cc"], axis=0, name="concat"),
        helper.make_node("Add", ["x", "cc"], ["y"], name="add"),
    ]
    width = len(concat_inputs)
    return make_model(nodes, [vi("x", F32, [width]), *extra_inputs], [vi("y", F32, [width])], [c])


case("split_concat_folds")(lambda: _split_model([f"p{i}" for i in range(N_PARTS)]))
case("split_concat_stays")(
    lambda: _split_model(["x1", *(f"p{i}" for i in range(N_PARTS))], [vi("x1", F32, [1])])
)

BIG = 10**10  # elements: 40 GB of float32


def _reduced(
    node: onnx.NodeProto, inits: list[onnx.TensorProto], elem: int = F32
) -> onnx.ModelProto:
    """``node`` (producing "big") followed by a ReduceMax to a scalar graph output."""
    reduce = helper.make_node("ReduceMax", ["big"], ["y"], keepdims=0, name="reduce")
    return make_model([node, reduce], [], [vi("y", elem, [])], inits)


def _col_row() -> list[onnx.TensorProto]:
    return [
        numpy_helper.from_array(np.ones((10**5, 1), np.float32), "col"),
        numpy_helper.from_array(np.ones((1, 10**5), np.float32), "row"),
    ]


BLOW_UPS = {
    "Pad": lambda: _reduced(
        helper.make_node("Pad", ["v", "pads"], ["big"]),
        [
            numpy_helper.from_array(np.float32([1, 2]), "v"),
            numpy_helper.from_array(np.array([0, BIG]), "pads"),
        ],
    ),
    "Add": lambda: _reduced(helper.make_node("Add", ["col", "row"], ["big"]), _col_row()),
    "Where": lambda: _reduced(
        helper.make_node("Where", ["cond", "row", "zero"], ["big"]),
        [
            numpy_helper.from_array(np.ones((10**5, 1), bool), "cond"),
            _col_row()[1],
            numpy_helper.from_array(np.float32(0), "zero"),
        ],
    ),
    "OneHot": lambda: _reduced(
        helper.make_node("OneHot", ["idx", "depth", "vals"], ["big"]),
        [
            numpy_helper.from_array(np.array([0, 1, 2]), "idx"),
            numpy_helper.from_array(np.array(BIG), "depth"),
            numpy_helper.from_array(np.float32([0, 1]), "vals"),
        ],
    ),
    "MatMul": lambda: _reduced(helper.make_node("MatMul", ["col", "row"], ["big"]), _col_row()),
    "Gather": lambda: _reduced(
        helper.make_node("Gather", ["wide", "idx"], ["big"], axis=0),
        [
            numpy_helper.from_array(np.ones((1, 10**6), np.float32), "wide"),
            numpy_helper.from_array(np.zeros(10**4, np.int64), "idx"),
        ],
    ),
    "Range": lambda: _reduced(  # 3e76 elements: a finite ratio, far too large
        helper.make_node("Range", ["s", "l", "d"], ["big"]),
        [
            numpy_helper.from_array(np.float32(0), "s"),
            numpy_helper.from_array(np.float32(3e38), "l"),
            numpy_helper.from_array(np.float32(1e-38), "d"),
        ],
    ),
}
for _name, _build in BLOW_UPS.items():
    case(f"blow_up_{_name}")(_build)

RANGE_OVERFLOWS = [(-1e308, 1e308, 1.0), (0.0, 1e308, 1e-300), (0.0, float("nan"), 1.0)]


def _range_model(start: float, limit: float, delta: float) -> onnx.ModelProto:
    inits = [
        numpy_helper.from_array(np.float64(v), n)
        for n, v in (("s", start), ("l", limit), ("d", delta))
    ]
    return _reduced(helper.make_node("Range", ["s", "l", "d"], ["big"]), inits, TensorProto.DOUBLE)


for _k, _args in enumerate(RANGE_OVERFLOWS):
    case(f"range_overflow_{_k}")(lambda args=_args: _range_model(*args))


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Every case of :data:`CASES` folded in one child process, by name."""
    folder = tmp_path_factory.mktemp("bounds")
    jobs = []
    for name, build in CASES.items():
        path = folder / f"{name}.onnx"
        onnx.save(build(), path)
        jobs.append({"model": str(path)})
    return dict(zip(CASES, fold_in_child(jobs, folder, timeout=300)))


# --- linear rewrites -----------------------------------------------------------------------------


def test_split_into_20000_parts_feeding_one_concat_folds_in_linear_time(reports) -> None:
    # Replacing each part's use one at a time rebuilds the Concat's 20,000-input tuple per part.
    report = reports["split_concat_folds"]
    assert_bounded(report)
    assert report["kernel_calls"] == {"Split": 1, "Concat": 1}
    assert report["input_copies"] < 10 * N_PARTS, report["input_copies"]  # one at a time: 4e8
    assert report["op_types"] == ["Add"]
    assert report["stats"]["folded"] == 2
    assert report["stats"]["removed_initializers"] == N_PARTS + 1


def test_split_parts_feeding_a_concat_that_stays_are_redirected_in_linear_time(reports) -> None:
    # The Concat also takes a graph input: it stays, with 20,000 new initializer inputs.
    report = reports["split_concat_stays"]
    assert_bounded(report)
    assert report["kernel_calls"] == {"Split": 1}
    assert report["input_copies"] < 10 * N_PARTS, report["input_copies"]
    assert report["op_types"] == ["Concat", "Add"]
    assert report["stats"]["folded"] == 1


# --- every output is sized before evaluation --------------------------------------------------------


@pytest.mark.parametrize("op", list(BLOW_UPS))
def test_blow_up_is_refused_before_evaluation(op: str, reports) -> None:
    report = reports[f"blow_up_{op}"]
    assert_bounded(report, refused=op)
    assert report["op_types"] == [op, "ReduceMax"]
    assert report["stats"]["declined"] == {"too large": 1}
    assert report["stats"]["skipped_too_large"] == 1


@pytest.mark.parametrize("k", range(len(RANGE_OVERFLOWS)), ids=[str(a) for a in RANGE_OVERFLOWS])
def test_range_whose_length_overflows_is_refused_not_a_crash(k: int, reports) -> None:
    # (limit - start) / delta of finite doubles can be inf: math.ceil raised OverflowError.
    report = reports[f"range_overflow_{k}"]
    assert_bounded(report, refused="Range")
    assert report["op_types"] == ["Range", "ReduceMax"]
    assert report["stats"]["declined"] == {"output size unknown": 1}


# --- what the estimates still let fold (in this process) -----------------------------------------------


def _fold_here(model: onnx.ModelProto, confirm: bool = True) -> tuple[onnx.ModelProto, dict[str, Any]]:
    import onnx_ir as ir

    from passes.fold import ConstantFoldingPass

    ir_model = ir.serde.deserialize_model(model)
    fold = ConstantFoldingPass(confirm=confirm)
    fold(ir_model)
    out = ir.serde.serialize_model(ir_model)
    onnx.checker.check_model(out, full_check=True)
    return out, fold.stats


def _initializer(model: onnx.ModelProto, name: str) -> np.ndarray:
    return numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == name))


@pytest.mark.parametrize(
    ("node", "inits", "elem", "expected"),
    [
        (
            helper.make_node("NonZero", ["m"], ["r"]),  # sized by its bound: every element selected
            [numpy_helper.from_array(np.array([[1, 0], [0, 1]], np.float32), "m")],
            I64,
            np.array([[0, 1], [0, 1]]),
        ),
        (
            helper.make_node("Compress", ["v", "keep"], ["r"], axis=0),
            [
                numpy_helper.from_array(np.float32([1, 2, 3]), "v"),
                numpy_helper.from_array(np.array([1, 0, 1], bool), "keep"),
            ],
            F32,
            np.float32([1, 3]),
        ),
        (
            helper.make_node("OneHot", ["i", "depth", "vals"], ["r"]),
            [
                numpy_helper.from_array(np.array([0, 2]), "i"),
                numpy_helper.from_array(np.float32(3), "depth"),  # any numeric type
                numpy_helper.from_array(np.array([0, 5]), "vals"),
            ],
            I64,
            np.array([[5, 0, 0], [0, 0, 5]]),
        ),
        (
            helper.make_node("Pad", ["v", "pads", "cv"], ["r"]),
            [
                numpy_helper.from_array(np.float32([1, 2]), "v"),
                numpy_helper.from_array(np.array([1, 2]), "pads"),
                numpy_helper.from_array(np.float32(9), "cv"),
            ],
            F32,
            np.float32([9, 1, 2, 9, 9]),
        ),
        (
            helper.make_node("Reshape", ["v", "shape"], ["r"]),
            [
                numpy_helper.from_array(np.arange(6, dtype=np.float32), "v"),
                numpy_helper.from_array(np.array([-1, 3]), "shape"),
            ],
            F32,
            np.arange(6, dtype=np.float32).reshape(2, 3),
        ),
        (
            helper.make_node("Range", ["s", "l", "d"], ["r"]),
            [
                numpy_helper.from_array(np.float32(v), n)
                for n, v in (("s", 1), ("l", 2), ("d", 0.25))
            ],
            F32,
            np.float32([1, 1.25, 1.5, 1.75]),
        ),
    ],
    ids=lambda v: v.op_type if isinstance(v, onnx.NodeProto) else "",
)
def test_ops_sized_before_evaluation_still_fold(node, inits, elem, expected) -> None:
    model = make_model([node], [], [vi("r", elem, list(expected.shape))], inits)
    # Sizing, not onnxruntime, is under test: it has no OneHot kernel for a float depth with int64 values.
    out, stats = _fold_here(model, confirm=False)
    assert [n.op_type for n in out.graph.node] == [] and stats["declined"] == {}
    result = _initializer(out, "r")
    assert result.dtype == expected.dtype
    np.testing.assert_array_equal(result, expected)


# --- contractions have a compute budget ---------------------------------------------------------------


def _einsum_model(n_operands: int, size: int, dtype=np.float32) -> onnx.ModelProto:
    letters = "abcdefgh"
    equation = ",".join(letters[k : k + 2] for k in range(n_operands)) + f"->a{letters[n_operands]}"
    names = [f"m{k}" for k in range(n_operands)]
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((size, size)).astype(dtype), n) for n in names
    ]
    node = helper.make_node("Einsum", names, ["big"], equation=equation)
    return _reduced(node, inits, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))


case("einsum_5x60")(lambda: _einsum_model(5, 60))  # 60^6 x 5 = 2.3e11 steps: over 2 minutes
case("matmul_int64_1024")(  # 2^30 multiply-adds without BLAS: ~7 s
    lambda: _reduced(
        helper.make_node("MatMul", ["a", "a"], ["big"]),
        [numpy_helper.from_array(np.ones((1024, 1024), np.int64), "a")],
        I64,
    )
)


@pytest.mark.parametrize("name", ["einsum_5x60", "matmul_int64_1024"])
def test_contraction_over_its_compute_budget_is_not_evaluated(name: str, reports) -> None:
    report = reports[name]
    assert_bounded(report, refused=report["op_types"][0])
    assert report["op_types"][0] in ("Einsum", "MatMul") and len(report["op_types"]) == 2
    assert report["stats"]["declined"] == {"over compute budget": 1}


@pytest.mark.parametrize(
    ("node", "shapes", "dtype"),
    [
        (
            helper.make_node("Einsum", ["a", "b", "c"], ["r"], equation="ab,bc,cd->ad"),
            [(60, 60)] * 3,
            np.float32,
        ),
        (
            helper.make_node("MatMul", ["a", "b"], ["r"]),
            [(256, 512), (512, 256)],
            np.float32,
        ),  # 2^25
        (helper.make_node("MatMul", ["a", "b"], ["r"]), [(64, 64), (64, 64)], np.int64),
        (helper.make_node("Gemm", ["a", "b"], ["r"], transB=1), [(128, 64), (32, 64)], np.float32),
    ],
    ids=["einsum3", "matmul_f32", "matmul_i64", "gemm"],
)
def test_contractions_within_budget_still_fold(node, shapes, dtype) -> None:
    rng = np.random.default_rng(1)
    arrays = [(rng.standard_normal(s) * 3).astype(dtype) for s in shapes]
    inits = [numpy_helper.from_array(a, n) for a, n in zip(arrays, node.input)]
    if node.op_type == "Einsum":
        expected = np.einsum("ab,bc,cd->ad", *(a.astype(np.float64) for a in arrays)).astype(dtype)
    elif node.op_type == "Gemm":
        expected = arrays[0] @ arrays[1].T
    else:
        expected = arrays[0] @ arrays[1]
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    out, stats = _fold_here(make_model([node], [], [vi("r", elem, list(expected.shape))], inits))
    assert stats["declined"] == {} and [n.op_type for n in out.graph.node] == []
    np.testing.assert_allclose(_initializer(out, "r"), expected, rtol=1e-5, atol=1e-3)


# --- weights read from subgraphs stay initializers, and external ----------------------------------------


def test_external_weights_used_only_in_a_branch_stay_external_initializers(tmp_path) -> None:
    # Each weight's only use is inside the then-branch: folding it there made an inline
    # Constant holding the whole weight (above 2 GB the save failed).
    from helpers import ort_run

    shape = [512, 1024]  # 2 MiB each, over the 1 MiB size limit
    rng = np.random.default_rng(0)
    weights = {
        n: rng.standard_normal(shape).astype(np.float32) for n in ("w_neg", "w_out", "w_add")
    }
    then_branch = helper.make_graph(
        [
            helper.make_node("Neg", ["w_neg"], ["t_neg"]),  # the result would be a 2 MiB Constant
            helper.make_node(
                "Identity", ["w_out"], ["t_out"]
            ),  # a branch output: the weight itself
            helper.make_node("Identity", ["w_add"], ["t_id"]),
            helper.make_node("Add", ["t_id", "x"], ["t_add"]),
        ],
        "then",
        [],
        [vi("t_neg", F32, shape), vi("t_out", F32, shape), vi("t_add", F32, shape)],
    )
    else_branch = helper.make_graph(
        [helper.make_node("Identity", ["x"], [f"e{k}"]) for k in range(3)],
        "else",
        [],
        [vi(f"e{k}", F32, shape) for k in range(3)],
    )
    nodes = [
        helper.make_node(
            "If", ["b"], ["y0", "y1", "y2"], then_branch=then_branch, else_branch=else_branch
        )
    ]
    model = make_model(
        nodes,
        [vi("b", TensorProto.BOOL, []), vi("x", F32, shape)],
        [vi(f"y{k}", F32, shape) for k in range(3)],
        [numpy_helper.from_array(w, n) for n, w in weights.items()],
    )
    src = tmp_path / "src" / "model.onnx"
    src.parent.mkdir()
    onnx.save(model, src, save_as_external_data=True, location="model.data", size_threshold=1024)
    dst = tmp_path / "dst" / "model.onnx"
    dst.parent.mkdir()

    [report] = fold_in_child([{"model": str(src), "save_to": str(dst)}], tmp_path)
    assert_bounded(report)
    assert report["stats"]["declined"] == {"too large": 1, "initializer kept": 1}
    assert report["stats"]["folded"] == 1  # the Identity feeding Add now reads w_add directly

    out = onnx.load(dst, load_external_data=False)
    assert dst.stat().st_size < 100_000  # no weight inline
    assert sorted(t.name for t in out.graph.initializer) == sorted(weights)
    assert all(onnx.external_data_helper.uses_external_data(t) for t in out.graph.initializer)
    branch = next(a.g for a in out.graph.node[0].attribute if a.name == "then_branch")
    assert [n.op_type for n in branch.node] == ["Neg", "Identity", "Add"]
    assert list(branch.node[2].input) == ["w_add", "x"]
    x = rng.standard_normal(shape).astype(np.float32)
    for b in (True, False):
        feeds = {"b": np.array(b), "x": x}
        for before, after in zip(ort_run(str(src), feeds), ort_run(str(dst), feeds)):
            np.testing.assert_array_equal(before, after)


# --- external data is read with checked reads, not memory maps ------------------------------------------


def test_external_data_truncated_during_folding_is_an_error_not_sigbus(tmp_path) -> None:
    # The weight is read for the first fold; the file is then truncated. Through a memory map,
    # the second read touched pages past the end of the file: SIGBUS killed the process.
    w = numpy_helper.from_array(np.arange(256 * 256, dtype=np.float32).reshape(256, 256), "w")
    nodes = [
        helper.make_node("Mul", ["w", "two"], ["a"], name="mul"),
        helper.make_node("Add", ["w", "two"], ["b"], name="add"),
    ]
    two = numpy_helper.from_array(np.float32(2), "two")
    model = make_model(nodes, [], [vi("a", F32, [256, 256]), vi("b", F32, [256, 256])], [w, two])
    src = tmp_path / "model.onnx"
    onnx.save(model, src, save_as_external_data=True, location="model.data", size_threshold=1024)

    [report] = fold_in_child(
        [{"model": str(src), "truncate": str(tmp_path / "model.data")}], tmp_path
    )
    assert report["error"].startswith("InputError: cannot read the data of 'w', input of ")
    assert "'model.data' is truncated: bytes 0..262144 needed, the file has 0" in report["error"]
    assert report["peak_rss_mib"] < PEAK_RSS_MIB


def _external(tmp_path: pathlib.Path, array: np.ndarray, dtype: Any = None, offset: int = 0) -> Any:
    import onnx_ir as ir

    tensor = ir.Tensor(array, dtype=dtype)
    data = tensor.tobytes()
    (tmp_path / "w.bin").write_bytes(b"\0" * offset + data)
    return ir.ExternalTensor(
        "w.bin",
        offset,
        len(data),
        tensor.dtype,
        shape=tensor.shape,
        name="w",
        base_dir=str(tmp_path),
    )


@pytest.mark.parametrize(
    ("array", "dtype"),
    [
        (np.arange(12, dtype=np.float32).reshape(3, 4) / 7, None),
        (np.array([[True, False, True]]), None),
        (np.arange(10, dtype=np.float16), None),
        (np.arange(-8, 8, dtype=np.int8).reshape(4, 4), "INT4"),  # packed two per byte
        (np.zeros((0, 3), np.int64), None),
    ],
    ids=["float32", "bool", "float16", "int4", "empty"],
)
def test_checked_read_gives_the_same_array_as_onnx_ir(array, dtype, tmp_path) -> None:
    import onnx_ir as ir

    from passes.ir.tensors import read_external

    tensor = _external(tmp_path, array, getattr(ir.DataType, dtype) if dtype else None, offset=3)
    result = read_external(tensor)
    expected = tensor.numpy()
    assert result.dtype == expected.dtype and result.shape == expected.shape
    np.testing.assert_array_equal(result.astype(np.float64), expected.astype(np.float64))


def test_checked_read_refuses_short_files_fifos_and_paths_outside_the_folder(tmp_path) -> None:
    import onnx_ir as ir

    from passes.errors import InputError
    from passes.ir.tensors import read_external

    tensor = _external(tmp_path, np.ones(1000, np.float32), offset=8)
    os.truncate(tmp_path / "w.bin", 1000)
    with pytest.raises(
        InputError, match=r"'w.bin' is truncated: bytes 8..4008 needed, the file has 1000"
    ):
        read_external(tensor)

    os.mkfifo(tmp_path / "fifo")  # opening it to read would block without O_NONBLOCK
    fifo = ir.ExternalTensor(
        "fifo", 0, 4, ir.DataType.FLOAT, shape=ir.Shape([1]), name="f", base_dir=str(tmp_path)
    )
    with pytest.raises(InputError, match="not a regular file"):
        read_external(fifo)

    inside = tmp_path / "model"
    inside.mkdir()
    outside = ir.ExternalTensor(
        "../w.bin",
        8,
        4000,
        ir.DataType.FLOAT,
        shape=ir.Shape([1000]),
        name="o",
        base_dir=str(inside),
    )
    with pytest.raises(InputError, match="is outside"):
        read_external(outside)
    (inside / "link.bin").symlink_to(tmp_path / "w.bin")
    linked = ir.ExternalTensor(
        "link.bin", 0, 4, ir.DataType.FLOAT, shape=ir.Shape([1]), name="l", base_dir=str(inside)
    )
    with pytest.raises(InputError, match="is outside"):
        read_external(linked)


def test_a_kernel_bug_is_counted_apart_and_the_node_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """An exception escaping a kernel is a refimpl bug: counted as kernel_bugs, never as 'failed'."""
    import onnx_ir as ir
    from onnx import TensorProto, helper, numpy_helper

    import refimpl
    from passes.fold import ConstantFoldingPass

    def broken(op_type, inputs, attributes=None, **kwargs):
        raise refimpl.KernelBugError(op_type, 14, "", IndexError("list index out of range"))

    monkeypatch.setattr(refimpl, "run", broken)
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["c"]), helper.make_node("Mul", ["x", "c"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        initializer=[numpy_helper.from_array(np.ones(2, np.float32), "a"),
                     numpy_helper.from_array(np.ones(2, np.float32), "b")],
    )  # fmt: skip
    model = ir.serde.deserialize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    fold = ConstantFoldingPass()
    fold(model)
    assert fold.stats["kernel_bugs"] == {"Add": 1} and fold.stats["failed"] == {}
    assert [n.op_type for n in model.graph] == ["Add", "Mul"]


# --- a fuzzer of blow-ups: op attributes and constant shapes drawn to be huge -------------------

def _blow_up(kind: str, n: int, m: int) -> onnx.ModelProto:
    """A small model whose one constant node would produce about n * m elements (or cost)."""
    f = lambda name, shape: numpy_helper.from_array(np.full(shape, 0.5, np.float32), name)  # noqa: E731
    i = lambda name, values: numpy_helper.from_array(np.asarray(values, np.int64), name)  # noqa: E731
    builds = {
        "pad": ([helper.make_node("Pad", ["a", "p"], ["c"])], [f("a", [1, 2]), i("p", [0, 0, m, n])]),
        "add": ([helper.make_node("Add", ["a", "b"], ["c"])], [f("a", [n, 1]), f("b", [1, m])]),
        "where": ([helper.make_node("Where", ["k", "a", "b"], ["c"])],
                  [numpy_helper.from_array(np.ones((n, 1), bool), "k"), f("a", [1, m]), f("b", [1])]),
        "onehot": ([helper.make_node("OneHot", ["x", "d", "v"], ["c"])],
                   [i("x", [0, 1]), i("d", [n * m]), numpy_helper.from_array(np.array([0.0, 1.0], np.float32), "v")]),
        "matmul": ([helper.make_node("MatMul", ["a", "b"], ["c"])], [f("a", [n, 1]), f("b", [1, m])]),
        "gather": ([helper.make_node("Gather", ["a", "x"], ["c"], axis=1)],
                   [f("a", [1, m]), i("x", np.zeros((min(n, 10**4), 1)))]),
        "range": ([helper.make_node("Range", ["s", "l", "d"], ["c"])],
                  [numpy_helper.from_array(np.array(v, np.float32), k) for k, v in (("s", 0), ("l", n * m), ("d", 1))]),
        "constant_of_shape": ([helper.make_node("ConstantOfShape", ["s"], ["c"])], [i("s", [n, m])]),
        "expand": ([helper.make_node("Expand", ["a", "s"], ["c"])], [f("a", [1]), i("s", [n, m])]),
        "tile": ([helper.make_node("Tile", ["a", "r"], ["c"])], [f("a", [2, 2]), i("r", [n, m])]),
    }
    nodes, inits = builds[kind]
    nodes = [*nodes, helper.make_node("Shape", ["c"], ["y"])]
    return make_model(nodes, [], [vi("y", I64, [None])], inits)


_KINDS = ["pad", "add", "where", "onehot", "matmul", "gather", "range", "constant_of_shape", "expand", "tile"]
_OP_OF_KIND = {"pad": "Pad", "add": "Add", "where": "Where", "onehot": "OneHot", "matmul": "MatMul",
               "gather": "Gather", "range": "Range", "constant_of_shape": "ConstantOfShape",
               "expand": "Expand", "tile": "Tile"}  # fmt: skip


@hypothesis.settings(max_examples=3, deadline=None, derandomize=True, phases=[hypothesis.Phase.generate],
                     suppress_health_check=list(hypothesis.HealthCheck))  # fmt: skip
@hypothesis.given(st.lists(
    st.tuples(st.sampled_from(_KINDS), st.integers(10**3, 10**5), st.integers(10**3, 10**5)),
    min_size=6, max_size=6,
))  # fmt: skip
def test_fuzzed_blow_ups_are_refused_in_bounded_time_and_memory(
    tmp_path_factory: pytest.TempPathFactory, drawn: list[tuple[str, int, int]]
) -> None:
    folder = tmp_path_factory.mktemp("blowups")
    jobs = []
    for k, (kind, n, m) in enumerate(drawn):
        path = folder / f"{k}_{kind}.onnx"
        onnx.save_model(_blow_up(kind, n, m), str(path))
        jobs.append({"model": str(path)})
    # The results are up to 1e10 elements: folding must refuse what is over the size limit before
    # computing it (the Shape after it may still fold, from the inferred shape alone), in bounded
    # time and memory. (A Gather's result is as large as its indices: it may fold.)
    for (kind, n, m), report in zip(drawn, fold_in_child(jobs, folder)):
        too_large = kind != "gather" and n * m * 4 > 1 << 20
        assert_bounded(report, refused=_OP_OF_KIND[kind] if too_large else None)
        if too_large:
            assert report["stats"]["folded"] <= 1, (kind, n, m, report["stats"])
