"""fold's values confirmed by onnxruntime: what it disagrees with or cannot compute stays computed."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

import passes
import refimpl
from helpers import ort_run
from passes.fold import ConstantFoldingPass
from passes.fold import agree, confirm

F32 = TensorProto.FLOAT


def make_model(nodes, inputs, outputs, initializers=(), *, functions=(), opset=18) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    opsets = [helper.make_opsetid("", opset)] + ([helper.make_opsetid("local", 1)] if functions else [])
    model = helper.make_model(graph, opset_imports=opsets, ir_version=8, functions=list(functions))
    onnx.checker.check_model(model, full_check=True)
    return model


def fold(proto: onnx.ModelProto, **kwargs) -> tuple[onnx.ModelProto, ConstantFoldingPass, bool]:
    model = ir.serde.deserialize_model(proto)
    fold_pass = ConstantFoldingPass(**kwargs)
    result = fold_pass(model)
    out = ir.serde.serialize_model(result.model)
    onnx.checker.check_model(out, full_check=True)
    json.dumps(fold_pass.stats)
    return out, fold_pass, result.modified


def ops(graph: onnx.GraphProto) -> list[str]:
    return [n.op_type for n in graph.node]


def same_in_ort(before: onnx.ModelProto, after: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    """Bit for bit (NaN payloads and the sign of zero included)."""
    for e, a in zip(ort_run(before, feeds), ort_run(after, feeds), strict=True):
        assert e.dtype == a.dtype and e.shape == a.shape
        assert e.tobytes() == a.tobytes()


@pytest.fixture
def wrong_neg(monkeypatch: pytest.MonkeyPatch) -> None:
    """refimpl's Neg made wrong (it adds 1): onnxruntime disagrees with every Neg it folds."""
    run = refimpl.run

    def patched(op, inputs, attrs, **kwargs):
        results = run(op, inputs, attrs, **kwargs)
        if op == "Neg":
            return [np.asarray(r + 1).astype(r.dtype) for r in results]
        return results

    monkeypatch.setattr(refimpl, "run", patched)


C = numpy_helper.from_array(np.array([1.0, -2.0, 3.0], np.float32), "c")
X = helper.make_tensor_value_info("x", F32, [3])
Y = helper.make_tensor_value_info("y", F32, [3])
HIGH = {"x": np.array([200.0, 200.0, 200.0], np.float32)}  # reaches the folded branch


def where_model() -> onnx.ModelProto:
    """``y = Where(x > 100, x + Neg(c), x)``: standard-normal inputs never reach the constant."""
    return make_model(
        [
            helper.make_node("Neg", ["c"], ["n"]),
            helper.make_node("Add", ["x", "n"], ["s"]),
            helper.make_node("Constant", [], ["t"], value_float=100.0),
            helper.make_node("Greater", ["x", "t"], ["g"]),
            helper.make_node("Where", ["g", "s", "x"], ["y"]),
        ],
        [X], [Y], [C],
    )  # fmt: skip


def test_disagreement_is_not_folded(wrong_neg: None) -> None:
    proto = where_model()
    out, fold_pass, _ = fold(proto)
    assert "Neg" in ops(out.graph)
    assert fold_pass.stats["disagrees_with_onnxruntime"] == {"Neg": 1}
    assert fold_pass.stats["folded"] == 0
    same_in_ort(proto, out, HIGH)


def test_disagreement_is_not_folded_whatever_the_check_draws(wrong_neg: None, tmp_path) -> None:
    """Through the command's route, with the check on: the output equals the original at x = 200."""
    source, target = tmp_path / "m.onnx", tmp_path / "out.onnx"
    onnx.save(where_model(), source)
    report = passes.optimize_file(source, target)
    fold_run = next(p for p in report.passes if p.name == "fold")
    assert fold_run.stats["disagrees_with_onnxruntime"] == {"Neg": 1}
    same_in_ort(onnx.load(source), onnx.load(target), HIGH)


def test_real_disagreement_argmax_over_nan() -> None:
    """``ArgMax([1, nan, 3, nan])``: onnxruntime says 2; a refimpl that says otherwise is not trusted."""
    data = numpy_helper.from_array(np.array([1.0, np.nan, 3.0, np.nan], np.float32), "d")
    proto = make_model(
        [helper.make_node("ArgMax", ["d"], ["a"], keepdims=0), helper.make_node("Add", ["i", "a"], ["y"])],
        [helper.make_tensor_value_info("i", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, [])],
        [data],
    )  # fmt: skip
    try:
        ours: int | None = int(refimpl.run("ArgMax", [numpy_helper.to_array(data)], {"keepdims": 0}, opset=18,
                                          domain="")[0])  # fmt: skip
    except refimpl.UndefinedResultError:
        ours = None  # refimpl declines ArgMax over NaN (onnxruntime's answer depends on its code path)
    out, fold_pass, _ = fold(proto)
    if ours is None:
        assert "ArgMax" in ops(out.graph) and not fold_pass.stats["disagrees_with_onnxruntime"]
    elif ours == 2:
        assert "ArgMax" not in ops(out.graph) and fold_pass.stats["confirmed"] == 1
    else:
        assert "ArgMax" in ops(out.graph)
        assert fold_pass.stats["disagrees_with_onnxruntime"] == {"ArgMax": 1}
    same_in_ort(proto, out, {"i": np.array(0, np.int64)})


def test_disagreement_inside_if_branch(wrong_neg: None) -> None:
    then = helper.make_graph(
        [
            helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.array([0.0, -0.0, 5.0], np.float32))),
            helper.make_node("Neg", ["k"], ["nk"]),
            helper.make_node("Neg", ["c"], ["nc"]),  # c: an initializer of the main graph
            helper.make_node("Add", ["x", "nk"], ["tk"]),
            helper.make_node("Add", ["tk", "nc"], ["ty"]),
        ],
        "then", [], [helper.make_tensor_value_info("ty", F32, [3])],
    )  # fmt: skip
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["ey"])], "else", [],
                              [helper.make_tensor_value_info("ey", F32, [3])])  # fmt: skip
    proto = make_model(
        [
            helper.make_node("ReduceMax", ["x"], ["m"], keepdims=0),
            helper.make_node("Constant", [], ["t"], value_float=100.0),
            helper.make_node("Greater", ["m", "t"], ["g"]),
            helper.make_node("If", ["g"], ["y"], then_branch=then, else_branch=other),
        ],
        [X], [Y], [C],
    )  # fmt: skip
    out, fold_pass, _ = fold(proto)
    branch = next(a.g for a in out.graph.node[-1].attribute if a.name == "then_branch")
    assert ops(branch).count("Neg") == 2
    assert fold_pass.stats["disagrees_with_onnxruntime"] == {"Neg": 2}
    same_in_ort(proto, out, HIGH)


def test_disagreement_inside_function(wrong_neg: None) -> None:
    function = helper.make_function(
        "local", "AddNeg", ["a"], ["b"],
        [
            helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.array([1.0, 2.0, -0.0], np.float32))),
            helper.make_node("Neg", ["k"], ["nk"]),
            helper.make_node("Add", ["a", "nk"], ["b"]),
        ],
        [helper.make_opsetid("", 18)],
    )  # fmt: skip
    proto = make_model([helper.make_node("AddNeg", ["x"], ["y"], domain="local")], [X], [Y], functions=[function])
    out, fold_pass, _ = fold(proto)
    assert "Neg" in ops(out.functions[0])
    assert fold_pass.stats["disagrees_with_onnxruntime"] == {"Neg": 1}
    same_in_ort(proto, out, HIGH)


def test_a_fold_that_reads_a_disagreeing_value_is_undone_but_one_onnxruntime_confirms_stays(wrong_neg: None) -> None:
    """Reshape (exempt) of a wrong Neg is undone with it; IsNaN of it agrees with onnxruntime's chain."""
    shape = numpy_helper.from_array(np.array([3], np.int64), "shape")
    proto = make_model(
        [
            helper.make_node("Neg", ["c"], ["n"]),
            helper.make_node("Reshape", ["n", "shape"], ["r"]),
            helper.make_node("Add", ["x", "r"], ["y"]),
            helper.make_node("IsNaN", ["n"], ["nan"]),
        ],
        [X], [Y, helper.make_tensor_value_info("nan", TensorProto.BOOL, [3])], [C, shape],
    )  # fmt: skip
    out, fold_pass, _ = fold(proto)
    assert sorted(ops(out.graph)) == ["Add", "Neg", "Reshape"]
    assert fold_pass.stats["disagrees_with_onnxruntime"] == {"Neg": 1}
    assert fold_pass.stats["confirmed"] == 1  # IsNaN
    same_in_ort(proto, out, HIGH)


def test_intermediate_values_are_compared_when_their_reader_stays(wrong_neg: None, monkeypatch) -> None:
    """c -> Neg -> Abs -> Add(x): Abs is compared (its value is written) and disagrees; then Neg,
    which the restored Abs reads, is compared in a second session and disagrees too."""
    sessions: list[list[str]] = []
    compute = confirm.Batch._compute

    def spy(self, targets):
        sessions.append([f.op_type for f in targets])
        compute(self, targets)

    monkeypatch.setattr(confirm.Batch, "_compute", spy)
    proto = make_model(
        [helper.make_node("Neg", ["c"], ["n"]), helper.make_node("Abs", ["n"], ["a"]),
         helper.make_node("Add", ["x", "a"], ["y"])],
        [X], [Y], [C],
    )  # fmt: skip
    out, fold_pass, _ = fold(proto)
    assert sessions == [["Abs"], ["Neg"]]
    assert ops(out.graph) == ["Neg", "Abs", "Add"]
    assert fold_pass.stats["disagrees_with_onnxruntime"] == {"Abs": 1, "Neg": 1}
    same_in_ort(proto, out, HIGH)


def test_if_condition_onnxruntime_disagrees_with_is_not_inlined(monkeypatch: pytest.MonkeyPatch) -> None:
    run = refimpl.run

    def patched(op, inputs, attrs, **kwargs):
        results = run(op, inputs, attrs, **kwargs)
        return [np.logical_not(r) for r in results] if op == "Greater" else results

    monkeypatch.setattr(refimpl, "run", patched)
    branch = lambda name, op: helper.make_graph(  # noqa: E731
        [helper.make_node(op, ["x"], [name])], name, [], [helper.make_tensor_value_info(name, F32, [3])])
    a = numpy_helper.from_array(np.array(1.0, np.float32), "a")
    b = numpy_helper.from_array(np.array(2.0, np.float32), "b")
    proto = make_model(
        [
            helper.make_node("Greater", ["a", "b"], ["g"]),
            helper.make_node("If", ["g"], ["y"], then_branch=branch("t", "Neg"), else_branch=branch("e", "Abs")),
        ],
        [X], [Y], [a, b],
    )  # fmt: skip
    out, fold_pass, _ = fold(proto)
    assert fold_pass.stats["if_inlined"] == 0 and "If" in ops(out.graph)
    assert fold_pass.stats["disagrees_with_onnxruntime"] == {"Greater": 1}
    same_in_ort(proto, out, {"x": np.array([-1.0, 0.0, 2.0], np.float32)})


def test_no_op() -> None:
    proto = make_model([helper.make_node("Neg", ["x"], ["y"])], [X], [Y])
    out, fold_pass, modified = fold(proto)
    assert not modified
    assert fold_pass.stats["confirmed"] == 0
    assert fold_pass.stats["disagrees_with_onnxruntime"] == {} and fold_pass.stats["unconfirmed"] == {}


def test_byte_moving_ops_are_not_sent_to_onnxruntime(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[str] = []
    compute = confirm.Batch._compute

    def spy(self, targets):
        sent.extend(f.op_type for f in targets)
        compute(self, targets)

    monkeypatch.setattr(confirm.Batch, "_compute", spy)
    w = numpy_helper.from_array(np.arange(3, dtype=np.float32).reshape(1, 3), "w")
    proto = make_model(
        [helper.make_node("Transpose", ["w"], ["wt"]), helper.make_node("Reshape", ["wt", "s"], ["r"]),
         helper.make_node("Add", ["x", "r"], ["y"])],
        [X], [Y], [w, numpy_helper.from_array(np.array([3], np.int64), "s")],
    )  # fmt: skip
    out, fold_pass, _ = fold(proto)
    assert ops(out.graph) == ["Add"]
    assert sent == []
    assert fold_pass.stats["confirmed"] == 0 and fold_pass.stats["folded"] == 2
    same_in_ort(proto, out, HIGH)


def test_what_onnxruntime_has_no_kernel_for_is_unconfirmed_unless_the_spec_fixes_it() -> None:
    """onnxruntime's CPU provider has no Relu for int16 (folded by the spec: max(x, 0) is exact; see
    tests/test_fold_by_spec.py) and no bfloat16 Exp (the spec leaves its rounding open: it stays)."""
    k = numpy_helper.from_array(np.array([-3, 0, 7], np.int16), "k")
    e = helper.make_tensor("e", TensorProto.BFLOAT16, [3], np.array([0, 16256, 49024], np.uint16).tobytes(), raw=True)
    proto = make_model(
        [helper.make_node("Relu", ["k"], ["r"]), helper.make_node("Abs", ["k"], ["a"]),
         helper.make_node("Add", ["r", "i"], ["y"]), helper.make_node("Add", ["a", "i"], ["z"]),
         helper.make_node("Exp", ["e"], ["x"]), helper.make_node("Cast", ["x"], ["w"], to=F32)],
        [helper.make_tensor_value_info("i", TensorProto.INT16, [3])],
        [helper.make_tensor_value_info("y", TensorProto.INT16, [3]),
         helper.make_tensor_value_info("z", TensorProto.INT16, [3]), helper.make_tensor_value_info("w", F32, [3])],
        [k, e],
    )  # fmt: skip
    out, fold_pass, _ = fold(proto)
    assert "Relu" not in ops(out.graph) and "Abs" not in ops(out.graph) and "Exp" in ops(out.graph)
    assert fold_pass.stats["by_spec"] == {"Relu": 1}
    assert fold_pass.stats["unconfirmed"] == {"Exp": 1, "Cast": 1}
    assert fold_pass.stats["confirmed"] == 1  # Abs, in the same batch: one bad node hides no other


def test_nan_signed_zero_and_infinities_that_agree_are_folded() -> None:
    k = numpy_helper.from_array(np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45], np.float32), "k")
    proto = make_model(
        [helper.make_node("Neg", ["k"], ["n"]), helper.make_node("Reciprocal", ["n"], ["r"]),
         helper.make_node("Add", ["x", "r"], ["y"])],
        [helper.make_tensor_value_info("x", F32, [6])], [helper.make_tensor_value_info("y", F32, [6])], [k],
    )  # fmt: skip
    out, fold_pass, _ = fold(proto)
    assert ops(out.graph) == ["Add"]
    # Reciprocal's value is compared; Neg's, only an intermediate, is computed on the way.
    assert fold_pass.stats["confirmed"] == 1 and fold_pass.stats["disagrees_with_onnxruntime"] == {}
    folded = numpy_helper.to_array(next(t for t in out.graph.initializer if t.name == "r"))
    assert np.signbit(folded[:2]).tolist() == [True, False]  # 1/-0 = -inf, 1/0 = inf
    same_in_ort(proto, out, {"x": np.zeros(6, np.float32)})


def test_confirmation_off_folds_what_refimpl_computes(wrong_neg: None) -> None:
    out, fold_pass, _ = fold(where_model(), confirm=False)
    assert "Neg" not in ops(out.graph)
    assert fold_pass.stats["confirmed"] == 0 and fold_pass.stats["disagrees_with_onnxruntime"] == {}


@pytest.mark.parametrize(
    ("expected", "actual", "same"),
    [
        ([0.0], [-0.0], False),
        ([np.nan, 1.0], [1.0, np.nan], False),
        ([np.inf], [-np.inf], False),
        ([np.inf, np.nan, -0.0], [np.inf, np.nan, -0.0], True),
        ([1.0], [1.0 + 8 * 2**-23], True),
        ([1.0], [1.0 + 64 * 2**-23], False),
        ([1e-45], [0.0], False),
    ],
)
def test_agrees_float32(expected: list[float], actual: list[float], same: bool) -> None:
    assert agree.agrees(np.array(expected, np.float32), np.array(actual, np.float32)) is same


def test_agrees_exact_types() -> None:
    assert agree.agrees(np.array([1, 2], np.int64), np.array([1, 2], np.int64))
    assert not agree.agrees(np.array([1, 2], np.int64), np.array([1, 2], np.int32))
    assert not agree.agrees(np.array([True]), np.array([False]))
    assert agree.agrees(np.array(["a", "bc"], dtype=object), np.array(["a", "bc"]))
    assert not agree.agrees(np.array(["a"], dtype=object), np.array(["b"]))


def test_float16_chain_onnxruntime_runs_in_float32_stays_computed() -> None:
    """onnxruntime runs Add -> Sub on float16 in float32 between Casts (no rounding between them):
    (1 + 2**-11) - 1 is 2**-11 there, 0 in refimpl's op-by-op rounding. The Sub disagrees, and the
    Add it reads stays computed too, so that the Sub still reads the unrounded sum."""
    a = numpy_helper.from_array(np.float16([1.0, 3.0]), "a")
    b = numpy_helper.from_array(np.float16([2.0**-11, 0.1]), "b")
    f16 = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT16, [2])  # noqa: E731
    proto = make_model(
        [helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Sub", ["s", "a"], ["d"]),
         helper.make_node("Mul", ["d", "x"], ["y"])],
        [f16("x")], [f16("y")], [a, b],
    )  # fmt: skip
    out, fold_pass, _ = fold(proto)
    assert ops(out.graph) == ["Add", "Sub", "Mul"]
    assert fold_pass.stats["disagrees_with_onnxruntime"] == {"Sub": 1}
    assert fold_pass.stats["unconfirmed"] == {"Add": 1}
    same_in_ort(proto, out, {"x": np.float16([2.0, 3.0])})


def test_a_large_weight_transform_is_confirmed_in_one_session(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 4 MiB weight through Mul and Sqrt: one session, the weight read by the child from a file.

    (Read by an Add: a MatMul's result changes by rounding when its weight becomes an initializer,
    which onnxruntime prepacks.)"""
    requests: list[dict] = []
    write = confirm.Batch._write

    def spy(self, targets, folder):
        written = write(self, targets, folder)
        requests.append(written[0])
        return written

    monkeypatch.setattr(confirm.Batch, "_write", spy)
    w = numpy_helper.from_array(np.random.default_rng(0).random((1024, 1024), np.float32), "w")
    two = numpy_helper.from_array(np.float32(2.0), "two")
    proto = make_model(
        [helper.make_node("Mul", ["w", "two"], ["m"]), helper.make_node("Sqrt", ["m"], ["r"]),
         helper.make_node("Add", ["x", "r"], ["y"])],
        [helper.make_tensor_value_info("x", F32, [1, 1024])], [helper.make_tensor_value_info("y", F32, [1024, 1024])],
        [w, two],
    )  # fmt: skip
    out, fold_pass, _ = fold(proto, size_limit=8 << 20)
    assert ops(out.graph) == ["Add"] and fold_pass.stats["confirmed"] == 1  # Sqrt's; Mul's is intermediate
    assert len(requests) == 1 and len(requests[0]["raw"]) == 1  # w, not inlined into the model
    same_in_ort(proto, out, {"x": np.ones((1, 1024), np.float32)})


def test_a_crash_of_onnxruntime_leaves_the_values_unconfirmed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sessions run in a child process: its death (a signal in a kernel) costs the folds, not the run."""
    from passes.verify.child import WorkerCrashed

    class Crashing:
        alive = True

        def start(self) -> Crashing:
            return self

        def request(self, message, deadline):
            raise WorkerCrashed("onnxruntime crashed (SIGSEGV)", "computing the folded constants")

        def close(self) -> None:
            pass

    monkeypatch.setattr(confirm.Runner, "own_worker", lambda self: Crashing())
    proto = where_model()
    out, fold_pass, _ = fold(proto)
    assert "Neg" in ops(out.graph)
    assert fold_pass.stats["unconfirmed"] == {"Neg": 1} and fold_pass.stats["folded"] == 0
    same_in_ort(proto, out, HIGH)


def _children() -> set[int]:
    """The pids of this process's ``passes.verify.worker`` children (from /proc)."""
    import os

    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read()
        except (OSError, ValueError, IndexError):
            continue
        if parent == os.getpid() and b"passes.verify.worker" in command:
            found.add(int(entry))
    return found


@pytest.mark.skipif(not __import__("os").path.isdir("/proc/self"), reason="reads /proc")
def test_runs_in_one_process_share_one_idle_child_and_a_dead_one_is_replaced() -> None:
    """Many runs in one process start onnxruntime once; one child at most waits between them."""
    confirm.close_idle()
    proto = where_model()
    before = _children()
    pids = []
    for _ in range(4):
        out, fold_pass, _ = fold(proto)
        fold_pass.close()
        assert fold_pass.stats["folded"] == 1 and "Neg" not in ops(out.graph)
        new = _children() - before
        assert len(new) == 1
        pids.append(new.pop())
    assert len(set(pids)) == 1
    import os
    import signal

    os.kill(pids[0], signal.SIGKILL)  # an idle child that died is not used again
    out, fold_pass, _ = fold(proto)
    fold_pass.close()
    assert fold_pass.stats["folded"] == 1
    new = _children() - before
    assert len(new) == 1 and new != {pids[0]}
    confirm.close_idle()
    assert _children() - before == set()


@pytest.mark.parametrize("to", [TensorProto.FLOAT8E5M2, TensorProto.FLOAT8E4M3FN])
def test_a_cast_to_float8_is_confirmed_by_onnxruntime_s_bytes(to: int) -> None:
    """onnxruntime returns float8 through the tensor's bytes; float8_e5m2 says numpy kind "f" but numpy's
    finfo refuses it (the comparison then raised: an internal error for onnx's test_cast_FLOAT_to_FLOAT8E5M2)."""
    edge = np.array([0.0, -0.0, 1.0, -1.5, 3.1, 448.0, 57344.0, 1e6, -1e6, np.inf, -np.inf, np.nan,
                     2.0**-17, -(2.0**-10), 0.4, 1e-3], np.float32)  # fmt: skip
    model = make_model([helper.make_node("Cast", ["c"], ["y"], to=to)], [],
                       [helper.make_tensor_value_info("y", to, [16])], [numpy_helper.from_array(edge, "c")],
                       opset=19)  # fmt: skip
    out, fold_pass, modified = fold(model)
    assert modified and ops(out.graph) == [] and fold_pass.stats["confirmed"] == 1, fold_pass.stats
    folded = out.graph.initializer[0]
    assert folded.name == "y" and folded.data_type == to
    # Bit for bit what onnxruntime computes for the original (the tensor's bytes).
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (value,) = session.run_with_ort_values(None, {})
    import ctypes

    assert ctypes.string_at(value.data_ptr(), value.tensor_size_in_bytes()) == numpy_helper.to_array(folded).tobytes()


@pytest.mark.parametrize("like_shape", [[0], [10, 1, 5]])
def test_castlike_s_size_is_its_first_input_s_not_a_broadcast_with_the_type_giver(like_shape: list[int],
                                                                                   caplog) -> None:  # fmt: skip
    """CastLike's second input gives only the type: an empty one made the estimate 0 (a warning for onnx's
    test_castlike_* cases), a larger one made it too large for the size limit."""
    x = np.arange(15, dtype=np.float32).reshape(3, 5) / 7
    model = make_model([helper.make_node("CastLike", ["x", "like"], ["y"])], [],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [3, 5])],
                       [numpy_helper.from_array(x, "x"),
                        numpy_helper.from_array(np.zeros(like_shape, np.float16), "like")])  # fmt: skip
    with caplog.at_level("WARNING"):
        out, fold_pass, modified = fold(model, size_limit=100)  # the result: 30 bytes; the broadcast: 300
    assert modified and ops(out.graph) == [], fold_pass.stats
    assert not [r for r in caplog.records if "estimated before evaluation" in r.getMessage()]
    (folded,) = [t for t in out.graph.initializer if t.name == "y"]
    np.testing.assert_array_equal(numpy_helper.to_array(folded).view(np.uint16),
                                  ort_run(model, {})[0].view(np.uint16))  # fmt: skip
