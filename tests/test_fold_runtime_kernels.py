"""fold takes onnxruntime's value where its kernel approximates (passes/fold/kernels.py, decide.py).

MLAS's float32 Sigmoid is up to 72M ULPs from the correctly rounded value in its tail, so the
confirmation declined a Swin-v2 continuous-position-bias MLP (a constant coordinate table through
MatMul, Relu, MatMul, Sigmoid, times 16). The claims the mechanism rests on are checked here on
this machine's onnxruntime: each kernel in ``RUNTIME_VALUED`` is outside agree's bound somewhere
(else the table is stale) and gives the same bits for a tensor whole and in parts, and at 1 and 2
threads; each in ``CUT_DEPENDENT`` does depend on the cut. Then the CPB block folds to one
constant in the main graph, an If branch and a function, bit-equal in onnxruntime to the original.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import refimpl
from passes.fold import ConstantFoldingPass, decide, kernels
from passes.fold.agree import agrees

F32 = TensorProto.FLOAT
ELEM = {"float32": TensorProto.FLOAT, "float64": TensorProto.DOUBLE}
#: The opset each op is run at (Gelu is 20), and the attribute sets of the op measured.
OPSET = {"Gelu": 20}
ATTRS = {"Gelu": [{}, {"approximate": "tanh"}]}


def one_node(op: str, dtype: str, attrs: dict, threads: int = 1) -> ort.InferenceSession:
    node = helper.make_node(op, ["x"], ["y"], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", ELEM[dtype], [None])],
                              [helper.make_tensor_value_info("y", ELEM[dtype], [None])])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET.get(op, 18))], ir_version=9)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def grid(dtype: str) -> np.ndarray:
    """The line near 0 with the tails (Sigmoid's clamp at ±18, HardSwish's zero at -3), tiny and
    special values, shuffled (each block then mixes every region)."""
    info = np.finfo(dtype)
    tiny = np.geomspace(float(info.tiny) / 4, 1e-3, 20_000)
    x = np.concatenate([np.linspace(-40, 40, 200_001), tiny, -tiny,
                        [0.0, -0.0, np.inf, -np.inf, np.nan, float(info.max), -float(info.max)]])  # fmt: skip
    return np.random.default_rng(0).permutation(x.astype(dtype))


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit for bit, any NaN equal to any NaN (its payload means nothing to a model)."""
    nan = np.isnan(a)
    return a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(nan, np.isnan(b))) and \
        a[~nan].tobytes() == b[~nan].tobytes()  # fmt: skip


PARTS = [(size, offset) for size in (1, 3, 7, 8, 15, 16, 17, 33, 63, 65, 4097) for offset in (0, 1, 5, 4099)]
TAKEN = [(op, dtype, attrs) for op, dtypes in kernels.RUNTIME_VALUED.items() for dtype in sorted(dtypes)
         for attrs in ATTRS.get(op, [{}])]  # fmt: skip


@pytest.mark.parametrize(("op", "dtype", "attrs"), TAKEN, ids=[f"{o}-{d}-{a}" for o, d, a in TAKEN])
def test_a_taken_kernel_approximates_and_its_bits_do_not_depend_on_the_cut(op: str, dtype: str, attrs: dict) -> None:
    x = grid(dtype)
    whole = one_node(op, dtype, attrs).run(None, {"x": x})[0]
    with np.errstate(all="ignore"):
        (ours,) = refimpl.run(op, [x], attrs, opset=OPSET.get(op, 18))
    assert not agrees(ours, whole)  # the reason it is in the table: refimpl's value is not onnxruntime's
    assert same_bits(one_node(op, dtype, attrs, threads=2).run(None, {"x": x})[0], whole)
    session = one_node(op, dtype, attrs)
    for size, offset in PARTS:
        part = session.run(None, {"x": x[offset : offset + size]})[0]
        assert same_bits(part, whole[offset : offset + size]), (size, offset)
    assert same_bits(one_at_a_time(session, x[:SINGLES]), whole[:SINGLES])


#: Elements run one at a time (a scalar path where the whole tensor takes the vector one).
SINGLES = 6400


def one_at_a_time(session: ort.InferenceSession, x: np.ndarray) -> np.ndarray:
    return np.concatenate([session.run(None, {"x": x[i : i + 1]})[0] for i in range(x.size)])


CUT = [(op, dtype) for op, dtypes in kernels.CUT_DEPENDENT.items() for dtype in sorted(dtypes)]


@pytest.mark.parametrize(("op", "dtype"), CUT, ids=[f"{o}-{d}" for o, d in CUT])
def test_a_cut_dependent_kernel_does_depend_on_the_cut(op: str, dtype: str) -> None:
    attrs = {"approximate": "tanh"} if op == "Gelu" else {}
    x = grid(dtype)[:SINGLES]
    session = one_node(op, dtype, attrs)
    whole = session.run(None, {"x": x})[0]
    # else it could be taken: measure it with benchmarks/bench_kernel_ulps.py
    assert not same_bits(one_at_a_time(session, x), whole)


# --- the CPB block -----------------------------------------------------------------------------------


def cpb_arrays(seed: int = 0, rows: int = 49, hidden: int = 32, heads: int = 4, shift: float = 0.0) -> list[np.ndarray]:
    """A Swin-v2 style coordinate table (log-spaced relative coordinates; its centre row is zeros,
    ``shift`` moves them) and MLP weights scaled so that the Sigmoid's inputs reach its tail (where
    MLAS's value is not the correctly rounded one)."""
    rng = np.random.default_rng(seed)
    side = np.linspace(-8, 8, 7) + shift
    coords = np.stack(np.meshgrid(side, side), -1).reshape(-1, 2)
    table = (np.sign(coords) * np.log2(np.abs(coords) + 1.0) / np.log2(8)).astype(np.float32)[:rows]
    w1 = rng.standard_normal((2, hidden)).astype(np.float32) * 4
    w2 = rng.standard_normal((hidden, heads)).astype(np.float32) * 2
    return [table, w1, w2, np.array(16, np.float32)]


def cpb_nodes(p: str = "") -> list[onnx.NodeProto]:
    """table -> MatMul(w1) -> Relu -> MatMul(w2) -> Sigmoid -> * 16 -> bias; y = x + bias."""
    return [
        helper.make_node("MatMul", ["table", "w1"], [f"{p}h"]),
        helper.make_node("Relu", [f"{p}h"], [f"{p}r"]),
        helper.make_node("MatMul", [f"{p}r", "w2"], [f"{p}m"]),
        helper.make_node("Sigmoid", [f"{p}m"], [f"{p}s"]),
        helper.make_node("Mul", [f"{p}s", "sixteen"], [f"{p}bias"]),
        helper.make_node("Add", ["x", f"{p}bias"], [f"{p}y"]),
    ]


def weights(arrays: list[np.ndarray]) -> list[onnx.TensorProto]:
    return [numpy_helper.from_array(a, n) for a, n in zip(arrays, ("table", "w1", "w2", "sixteen"), strict=True)]


def main_model(arrays: list[np.ndarray]) -> onnx.ModelProto:
    shape = [arrays[0].shape[0], arrays[2].shape[1]]
    graph = helper.make_graph(cpb_nodes(), "cpb", [helper.make_tensor_value_info("x", F32, shape)],
                              [helper.make_tensor_value_info("y", F32, shape)], weights(arrays))  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


def if_model(arrays: list[np.ndarray]) -> onnx.ModelProto:
    shape = [arrays[0].shape[0], arrays[2].shape[1]]
    then = helper.make_graph(cpb_nodes("t_"), "then", [], [helper.make_tensor_value_info("t_y", F32, shape)])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["e_y"])], "else", [],
                              [helper.make_tensor_value_info("e_y", F32, shape)])  # fmt: skip
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)], "g",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, []), helper.make_tensor_value_info("x", F32, shape)],
        [helper.make_tensor_value_info("y", F32, shape)], weights(arrays))  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


def function_model(arrays: list[np.ndarray]) -> onnx.ModelProto:
    """The block in a model-local function whose constants are Constant nodes."""
    shape = [arrays[0].shape[0], arrays[2].shape[1]]
    constants = [helper.make_node("Constant", [], [n], value=t) for n, t in
                 zip(("table", "w1", "w2", "sixteen"), weights(arrays), strict=True)]  # fmt: skip
    function = helper.make_function("local", "Cpb", ["x"], ["y"], constants + cpb_nodes()[:-1] +
                                    [helper.make_node("Add", ["x", "bias"], ["y"])],
                                    [helper.make_opsetid("", 18)])  # fmt: skip
    graph = helper.make_graph([helper.make_node("Cpb", ["x"], ["y"], domain="local")], "g",
                              [helper.make_tensor_value_info("x", F32, shape)],
                              [helper.make_tensor_value_info("y", F32, shape)])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("local", 1)],
                             ir_version=8, functions=[function])  # fmt: skip


def fold(proto: onnx.ModelProto, **kwargs) -> tuple[onnx.ModelProto, dict]:
    onnx.checker.check_model(proto, full_check=True)
    fold_pass = ConstantFoldingPass(**kwargs)
    out = ir.serde.serialize_model(fold_pass(ir.serde.deserialize_model(proto)).model)
    onnx.checker.check_model(out, full_check=True)
    json.dumps(fold_pass.stats)
    return out, fold_pass.stats


def run(model: onnx.ModelProto, feeds: dict, level: ort.GraphOptimizationLevel, threads: int) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def assert_same_outputs(original: onnx.ModelProto, folded: onnx.ModelProto, feeds: dict) -> None:
    """Bit for bit in onnxruntime, every optimisation off and on, at 1 and 2 threads."""
    for level in (ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_ALL):
        for threads in (1, 2):
            expected, actual = run(original, feeds, level, threads), run(folded, feeds, level, threads)
            for e, a in zip(expected, actual, strict=True):
                assert same_bits(e, a), (level, threads)


def x_feed(arrays: list[np.ndarray]) -> np.ndarray:
    return np.zeros((arrays[0].shape[0], arrays[2].shape[1]), np.float32)  # y is the bias itself


def test_the_block_reaches_the_sigmoid_s_tail() -> None:
    """The case matters: the confirmation alone would decline this Sigmoid (refimpl's value is not onnxruntime's)."""
    arrays = cpb_arrays()
    m = np.maximum(arrays[0] @ arrays[1], 0) @ arrays[2]
    (ours,) = refimpl.run("Sigmoid", [m], {}, opset=18)
    theirs = one_node("Sigmoid", "float32", {}).run(None, {"x": m.reshape(-1)})[0].reshape(m.shape)
    assert m.min() < -17 and not agrees(ours, theirs)


def test_cpb_block_folds_to_one_initializer_with_onnxruntime_s_bits() -> None:
    arrays = cpb_arrays()
    original = main_model(arrays)
    out, stats = fold(original)
    assert [n.op_type for n in out.graph.node] == ["Add"]  # no Sigmoid, no MatMul left
    assert [i.name for i in out.graph.initializer] == ["bias"]
    assert stats["runtime_decided"] == {"MatMul": 1, "Sigmoid": 1}  # the centre row's zeros: a sign of zero
    assert stats["applied"] == {"MatMul": 2, "Relu": 1, "Sigmoid": 1, "Mul": 1}
    assert stats["disagrees_with_onnxruntime"] == {} and stats["declined"] == {}
    assert_same_outputs(original, out, {"x": x_feed(arrays)})


def test_in_an_if_branch_the_block_is_one_constant_node() -> None:
    arrays = cpb_arrays(1)
    original = if_model(arrays)
    out, stats = fold(original)
    assert stats["runtime_decided"] == {"MatMul": 1, "Sigmoid": 1}
    branch = next(a.g for a in out.graph.node[0].attribute if a.name == "then_branch")
    assert [n.op_type for n in branch.node] == ["Constant", "Add"]
    for c in (True, False):
        assert_same_outputs(original, out, {"c": np.array(c), "x": x_feed(arrays)})


def test_in_a_function_the_block_is_one_constant_node() -> None:
    arrays = cpb_arrays(2)
    original = function_model(arrays)
    out, stats = fold(original)
    assert stats["runtime_decided"] == {"MatMul": 1, "Sigmoid": 1}
    assert [n.op_type for n in out.functions[0].node] == ["Constant", "Add"]
    assert_same_outputs(original, out, {"x": x_feed(arrays)})


def test_no_op_on_a_sigmoid_of_an_input() -> None:
    arrays = cpb_arrays()
    shape = [arrays[0].shape[0], arrays[2].shape[1]]
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["s", "sixteen"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F32, shape)],
                              [helper.make_tensor_value_info("y", F32, shape)], weights(arrays)[3:])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    out, stats = fold(model)
    assert [n.op_type for n in out.graph.node] == ["Sigmoid", "Mul"]
    assert stats["folded"] == 0 and stats["runtime_decided"] == {}


def test_without_confirmation_refimpl_s_value_folds() -> None:
    """No runtime to ask: the correctly rounded value, as before (unconfirmed like every fold then)."""
    arrays = cpb_arrays(shift=0.5)  # no zero row: no sign of zero for the runtime to choose
    out, stats = fold(main_model(arrays), confirm=False)
    assert [n.op_type for n in out.graph.node] == ["Add"] and stats["runtime_decided"] == {}
    table, w1, w2, sixteen = arrays
    (h,) = refimpl.run("MatMul", [table, w1], {}, opset=18)
    (r,) = refimpl.run("Relu", [h], {}, opset=18)
    (m,) = refimpl.run("MatMul", [r, w2], {}, opset=18)
    (s,) = refimpl.run("Sigmoid", [m], {}, opset=18)
    (bias,) = refimpl.run("Mul", [s, sixteen], {}, opset=18)
    assert same_bits(numpy_helper.to_array(out.graph.initializer[0]), bias)


def test_over_the_budget_the_sigmoid_stays(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decide, "MAX_DECIDED", 0)
    arrays = cpb_arrays(shift=0.5)
    original = main_model(arrays)
    out, stats = fold(original)
    assert [n.op_type for n in out.graph.node] == ["Sigmoid", "Mul", "Add"]
    assert stats["declined"] == {decide.NOT_COMPUTED: 1}
    assert_same_outputs(original, out, {"x": x_feed(arrays)})


def test_a_cut_dependent_kernel_still_declines(caplog: pytest.LogCaptureFixture) -> None:
    """float32 Mish in its tail: onnxruntime's value is thousands of ULPs off and depends on the cut,
    so it is not taken: the node stays, with the reason."""
    x = numpy_helper.from_array(np.linspace(-99, -90, 64, dtype=np.float32), "c")
    graph = helper.make_graph([helper.make_node("Mish", ["c"], ["m"]), helper.make_node("Add", ["x", "m"], ["y"])],
                              "g", [helper.make_tensor_value_info("x", F32, [64])],
                              [helper.make_tensor_value_info("y", F32, [64])], [x])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    with caplog.at_level("INFO", logger="passes.fold"):
        out, stats = fold(model)
    assert [n.op_type for n in out.graph.node] == ["Mish", "Add"]
    assert stats["disagrees_with_onnxruntime"] == {"Mish": 1} and stats["runtime_decided"] == {}
    assert stats["cut_dependent"] == {"Mish": 1}  # counted, by op, under its reason
    assert "depend on how the tensor is cut" in caplog.text
    feeds = {"x": np.zeros(64, np.float32)}
    assert_same_outputs(model, out, feeds)


def test_float16_is_not_taken() -> None:
    """onnxruntime computes a float16 Sigmoid in float32 between Casts it may drop: not in the table."""
    assert kernels.runtime_valued("", "Sigmoid", "float16") is None
    assert kernels.runtime_valued("", "Sigmoid", "float32") is not None
    assert kernels.runtime_valued("com.microsoft", "Sigmoid", "float32") is None


# --- a real Swin-v2 export (torch, transformers: the `heavy` marker) ----------------------------------


def swinv2_export(opset: int, path: str) -> None:
    """transformers' Swinv2 (depths [1, 1], embed_dim 16, random weights offset by [0.01, 0.1), nothing
    downloaded), its CPB MLP's head 0 scaled by -6 so that its biases reach the Sigmoid's tail (a
    head that learned to mask far positions), exported by TorchScript with a dynamic batch."""
    import contextlib
    import io
    import warnings

    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.Swinv2Config(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2],
                                       window_size=4, num_labels=10)  # fmt: skip
    torch.manual_seed(0)
    model = transformers.Swinv2ForImageClassification(config).eval()
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            if tensor.is_floating_point():
                tensor.add_(torch.empty(tensor.shape, dtype=tensor.dtype).uniform_(0.01, 0.1, generator=gen))
        for name, module in model.named_modules():
            if name.endswith("continuous_position_bias_mlp"):
                module[2].weight[0].mul_(-6.0)

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(pixel_values=x).logits

    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(Logits().eval(), (torch.randn(1, 3, 32, 32),), path, dynamo=False, opset_version=opset,
                          input_names=["pixel_values"], output_names=["logits"],
                          dynamic_axes={"pixel_values": {0: "batch"}, "logits": {0: "batch"}})  # fmt: skip


def histogram(model: onnx.ModelProto) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in model.graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


@pytest.mark.heavy
@pytest.mark.parametrize("opset", [17, 18])
def test_a_swin_v2_export_folds_its_cpb_sigmoids(opset: int, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    from passes import cli

    src, out, report = tmp_path / "swinv2.onnx", tmp_path / "out.onnx", tmp_path / "report.json"
    swinv2_export(opset, str(src))
    before = histogram(onnx.load(src))
    assert before["Sigmoid"] == 2  # one CPB MLP per block

    def optimise() -> tuple[dict[str, int], dict[str, dict[str, int]]]:
        assert cli.main([str(src), "-o", str(out), "--report", str(report), "-q"]) == 0
        written = json.loads(report.read_text())
        assert written["check"]["ok"], written["check"]  # outputs equal in onnxruntime
        stats: dict[str, dict[str, int]] = {}
        for run in (p for p in written["passes"] if p["name"] == "fold"):
            for key in ("runtime_decided", "disagrees_with_onnxruntime"):
                for op, n in run["stats"][key].items():
                    stats.setdefault(key, {}).setdefault(op, 0)
                    stats[key][op] += n
        return histogram(onnx.load(out)), stats

    after, stats = optimise()
    assert "Sigmoid" not in after and "Relu" not in after  # the CPB MLPs are constants now
    assert stats == {"runtime_decided": {"Sigmoid": 2}}
    # without the table, the confirmation declines them: the Sigmoids and their * 16 stay
    monkeypatch.setattr(kernels, "RUNTIME_VALUED", {})
    kept, stats = optimise()
    assert kept["Sigmoid"] == 2 and kept["Mul"] == after["Mul"] + 2
    assert stats == {"disagrees_with_onnxruntime": {"Mul": 2, "Sigmoid": 2}}


def test_the_table_is_measured_on_this_onnxruntime(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tables hold for the release they were measured on; under another one nothing is taken."""
    import importlib.metadata

    assert kernels.measured_release(), (
        f"onnxruntime {importlib.metadata.version('onnxruntime')} is not {kernels.MEASURED_ON}: "
        "measure the tables again (benchmarks/bench_kernel_ulps.py) and update MEASURED_ON")
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "1.99.0")
    kernels.measured_release.cache_clear()
    try:
        assert kernels.runtime_valued("", "Sigmoid", "float32") is None
    finally:
        monkeypatch.undo()
        kernels.measured_release.cache_clear()
    assert kernels.runtime_valued("", "Sigmoid", "float32") is not None
