"""``--precision fp16|bf16``: each converted model loads in onnxruntime, keeps float32 inputs and
outputs, holds its float weights in the half type (but where an island needs float32), and
matches the float32 original within the half type's tolerance on three standard-normal sets.

The models: a CNN (Conv, BatchNormalization, Relu, GlobalAveragePool, Gemm), a transformer
block (MatMul, Softmax, the LayerNorm pattern, Erf GELU, residual Add), a block whose values
pass through 3e5, an op without a float16 kernel in onnxruntime's CPU provider
(HannWindow: found by probing every op, see ``test_the_kernel_probe_finds_the_op``), an
If, a Loop, a model-local function, external data; the check's own islands (a cancellation), a
refusal, float64 and integers untouched.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import passes
from passes import cli
from passes.verify.defaults import TOLERANCES

F32 = TensorProto.FLOAT
HALF = {"fp16": (TensorProto.FLOAT16, "float16"), "bf16": (TensorProto.BFLOAT16, "bfloat16")}
OPSET = 17


def _w(rng: np.random.Generator, name: str, *shape: int, scale: float = 0.3) -> onnx.TensorProto:
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def _model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto],
           initializers: list[onnx.TensorProto], functions: list[onnx.FunctionProto] = (),
           opset: int = OPSET) -> onnx.ModelProto:  # fmt: skip
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializers)
    imports = [helper.make_opsetid("", opset)] + ([helper.make_opsetid("local", 1)] if functions else [])
    model = helper.make_model(graph, opset_imports=imports, functions=list(functions))
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def cnn() -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "g", "be", "m", "v"], ["bn"]),
        helper.make_node("Relu", ["bn"], ["r"]),
        helper.make_node("Conv", ["r", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "wg", "bg"], ["y"], transB=1),
    ]
    inits = [_w(rng, "w1", 16, 3, 3, 3), _w(rng, "b1", 16), _w(rng, "g", 16), _w(rng, "be", 16),
             _w(rng, "m", 16, scale=0.1),
             numpy_helper.from_array(np.abs(rng.standard_normal(16)).astype(np.float32) + 0.5, "v"),
             _w(rng, "w2", 32, 16, 3, 3, scale=0.1), _w(rng, "b2", 32), _w(rng, "wg", 10, 32), _w(rng, "bg", 10)]
    return _model(nodes, [helper.make_tensor_value_info("x", F32, ["N", 3, 16, 16])],
                  [helper.make_tensor_value_info("y", F32, ["N", 10])], inits)  # fmt: skip


def transformer(layer_norm_op: bool = False) -> onnx.ModelProto:
    """One block: self-attention (one head), a LayerNorm (the pattern, or the op), an Erf GELU MLP,
    residual Adds."""
    rng = np.random.default_rng(2)
    d, hidden = 32, 64
    c = lambda name, value: numpy_helper.from_array(np.array(value, np.float32), name)  # noqa: E731
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q"]),
        helper.make_node("MatMul", ["x", "wk"], ["k"]),
        helper.make_node("MatMul", ["x", "wv"], ["v"]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node("Mul", ["s", "scale"], ["ss"]),
        helper.make_node("Softmax", ["ss"], ["a"], axis=-1),
        helper.make_node("MatMul", ["a", "v"], ["att"]),
        helper.make_node("MatMul", ["att", "wo"], ["o"]),
        helper.make_node("Add", ["x", "o"], ["h"]),
    ]
    if layer_norm_op:
        nodes.append(helper.make_node("LayerNormalization", ["h", "gamma", "beta"], ["n"], axis=-1))
    else:
        nodes += [
            helper.make_node("ReduceMean", ["h", "axes"], ["mu"]) if OPSET >= 18 else
            helper.make_node("ReduceMean", ["h"], ["mu"], axes=[-1]),
            helper.make_node("Sub", ["h", "mu"], ["hc"]),
            helper.make_node("Mul", ["hc", "hc"], ["sq"]),
            helper.make_node("ReduceMean", ["sq"], ["var"], axes=[-1]),
            helper.make_node("Add", ["var", "eps"], ["ve"]),
            helper.make_node("Sqrt", ["ve"], ["sd"]),
            helper.make_node("Div", ["hc", "sd"], ["nn"]),
            helper.make_node("Mul", ["nn", "gamma"], ["ng"]),
            helper.make_node("Add", ["ng", "beta"], ["n"]),
        ]
    nodes += [
        helper.make_node("MatMul", ["n", "w1"], ["m1"]),
        helper.make_node("Add", ["m1", "b1"], ["m1b"]),
        helper.make_node("Div", ["m1b", "sqrt2"], ["gd"]),
        helper.make_node("Erf", ["gd"], ["ge"]),
        helper.make_node("Add", ["ge", "one"], ["g1"]),
        helper.make_node("Mul", ["m1b", "g1"], ["gm"]),
        helper.make_node("Mul", ["gm", "half"], ["gelu"]),
        helper.make_node("MatMul", ["gelu", "w2"], ["m2"]),
        helper.make_node("Add", ["n", "m2"], ["y"]),
    ]
    inits = [_w(rng, n, d, d, scale=d**-0.5) for n in ("wq", "wk", "wv", "wo")]
    inits += [c("scale", d**-0.5), c("gamma", np.ones(d)), c("beta", np.zeros(d)), c("eps", 1e-5),
              _w(rng, "w1", d, hidden, scale=d**-0.5), _w(rng, "b1", hidden, scale=0.02),
              _w(rng, "w2", hidden, d, scale=hidden**-0.5), c("sqrt2", np.sqrt(2.0)), c("one", 1.0), c("half", 0.5)]
    return _model(nodes, [helper.make_tensor_value_info("x", F32, ["B", "S", d])],
                  [helper.make_tensor_value_info("y", F32, ["B", "S", d])], inits)  # fmt: skip


def large_values() -> onnx.ModelProto:
    """Values pass through about 3e5 (a scale up, a sum of squares, a scale down): in float16 they
    would be inf."""
    rng = np.random.default_rng(3)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["a"]),
        helper.make_node("Mul", ["a", "big"], ["b"]),        # |b| ~ 3e4 .. 3e5
        helper.make_node("Mul", ["b", "b"], ["b2"]),         # ~ 1e9..1e11
        helper.make_node("ReduceSum", ["b2", "axes"], ["s"], keepdims=1),
        helper.make_node("Sqrt", ["s"], ["n"]),              # ~ 3e5
        helper.make_node("Div", ["b", "n"], ["u"]),          # back to O(1)
        helper.make_node("MatMul", ["u", "w2"], ["y"]),
    ]
    inits = [_w(rng, "w", 16, 16, scale=0.25), numpy_helper.from_array(np.array(3e4, np.float32), "big"),
             numpy_helper.from_array(np.array([-1], np.int64), "axes"), _w(rng, "w2", 16, 8, scale=0.25)]
    return _model(nodes, [helper.make_tensor_value_info("x", F32, ["N", 16])],
                  [helper.make_tensor_value_info("y", F32, ["N", 8])], inits)  # fmt: skip


def no_half_kernel() -> onnx.ModelProto:
    """A Hann window (onnxruntime's CPU provider has no float16 HannWindow: the probe says so) of a
    length only known at run time, applied to a signal, then weights."""
    rng = np.random.default_rng(4)
    nodes = [
        helper.make_node("Shape", ["s"], ["shape"]),
        helper.make_node("Gather", ["shape", "one"], ["length"], axis=0),
        helper.make_node("HannWindow", ["length"], ["window"]),
        helper.make_node("Mul", ["s", "window"], ["ws"]),
        helper.make_node("ReduceSum", ["ws", "axes"], ["energy"], keepdims=1),
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Mul", ["h", "energy"], ["y"]),
    ]
    inits = [_w(rng, "w", 16, 8), numpy_helper.from_array(np.array(1, np.int64), "one"),
             numpy_helper.from_array(np.array([1], np.int64), "axes")]
    return _model(nodes, [helper.make_tensor_value_info("x", F32, ["N", 16]),
                          helper.make_tensor_value_info("s", F32, ["N", "L"])],
                  [helper.make_tensor_value_info("y", F32, ["N", 8])], inits)  # fmt: skip


def with_if() -> onnx.ModelProto:
    rng = np.random.default_rng(5)
    then = helper.make_graph([helper.make_node("MatMul", ["h", "wt"], ["t1"]),
                              helper.make_node("Tanh", ["t1"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", F32, None)])  # fmt: skip
    other = helper.make_graph([helper.make_node("MatMul", ["h", "we"], ["e1"]),
                               helper.make_node("Sigmoid", ["e1"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", F32, None)])  # fmt: skip
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
        helper.make_node("Greater", ["total", "zero"], ["cond"]),
        helper.make_node("If", ["cond"], ["branch"], then_branch=then, else_branch=other),
        helper.make_node("MatMul", ["branch", "wo"], ["y"]),
    ]
    inits = [_w(rng, "w", 16, 32), _w(rng, "wt", 32, 32, scale=0.2), _w(rng, "we", 32, 32, scale=0.2),
             _w(rng, "wo", 32, 8, scale=0.2), numpy_helper.from_array(np.array(0.0, np.float32), "zero")]
    return _model(nodes, [helper.make_tensor_value_info("x", F32, [4, 16])],
                  [helper.make_tensor_value_info("y", F32, [4, 8])], inits)  # fmt: skip


def with_loop() -> onnx.ModelProto:
    """A Loop carrying a float value through three MatMul+Tanh steps."""
    rng = np.random.default_rng(9)
    body = helper.make_graph(
        [helper.make_node("MatMul", ["acc_in", "w"], ["m"]), helper.make_node("Tanh", ["m"], ["acc_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", F32, None)],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", F32, None)],
    )  # fmt: skip
    nodes = [
        helper.make_node("MatMul", ["x", "w0"], ["h"]),
        helper.make_node("Loop", ["n", "t", "h"], ["final"], body=body),
        helper.make_node("MatMul", ["final", "w2"], ["y"]),
    ]
    inits = [_w(rng, "w0", 16, 32), _w(rng, "w", 32, 32, scale=0.2), _w(rng, "w2", 32, 8, scale=0.2),
             numpy_helper.from_array(np.array(3, np.int64), "n"), numpy_helper.from_array(np.array(True), "t")]
    return _model(nodes, [helper.make_tensor_value_info("x", F32, ["N", 16])],
                  [helper.make_tensor_value_info("y", F32, ["N", 8])], inits)  # fmt: skip


def with_function() -> onnx.ModelProto:
    rng = np.random.default_rng(6)
    body = [
        helper.make_node("MatMul", ["a", "w"], ["m"]),
        helper.make_node("Add", ["m", "a"], ["s"]),
        helper.make_node("Tanh", ["s"], ["out"]),
    ]
    function = helper.make_function("local", "Block", ["a", "w"], ["out"], body,
                                    [helper.make_opsetid("", OPSET)])  # fmt: skip
    nodes = [
        helper.make_node("MatMul", ["x", "w0"], ["h"]),
        helper.make_node("Block", ["h", "w1"], ["b1"], domain="local"),
        helper.make_node("Block", ["b1", "w2"], ["b2"], domain="local"),
        helper.make_node("MatMul", ["b2", "w3"], ["y"]),
    ]
    inits = [_w(rng, "w0", 16, 32), _w(rng, "w1", 32, 32, scale=0.15), _w(rng, "w2", 32, 32, scale=0.15),
             _w(rng, "w3", 32, 8, scale=0.2)]
    return _model(nodes, [helper.make_tensor_value_info("x", F32, ["N", 16])],
                  [helper.make_tensor_value_info("y", F32, ["N", 8])], inits, [function])  # fmt: skip


MODELS = {
    "cnn": cnn,
    "transformer": transformer,
    "transformer_layernorm_op": lambda: transformer(layer_norm_op=True),
    "large_values": large_values,
    "no_half_kernel": no_half_kernel,
    "if": with_if,
    "loop": with_loop,
    "function": with_function,
}


# --- checks ----------------------------------------------------------------------------------


def _session(path: pathlib.Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _feeds(session: ort.InferenceSession, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for info in session.get_inputs():
        shape = [d if isinstance(d, int) else 2 for d in info.shape]
        feeds[info.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def _half_share(model: onnx.ModelProto, base: pathlib.Path, half: int) -> float:
    """The share of the float weight bytes (float32 or half, counted at float32 size) held in ``half``."""
    total = in_half = 0

    def tensors(graph: onnx.GraphProto):
        yield from graph.initializer
        for node in graph.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.TENSOR:
                    yield attr.t
                for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
                    yield from tensors(sub)

    for tensor in tensors(model.graph):
        if tensor.data_type in (F32, half):
            count = int(np.prod(tensor.dims, dtype=np.int64))
            total += 4 * count
            in_half += 4 * count if tensor.data_type == half else 0
    return in_half / total if total else 1.0


def _convert(tmp_path: pathlib.Path, model: onnx.ModelProto, precision: str, name: str = "m",
             **save: object) -> tuple[pathlib.Path, pathlib.Path, dict]:  # fmt: skip
    source, target, report = tmp_path / f"{name}.onnx", tmp_path / f"{name}.{precision}.onnx", tmp_path / "r.json"
    onnx.save_model(model, str(source), **save)
    code = cli.main([str(source), "-o", str(target), "--precision", precision, "--report", str(report)])
    assert code == 0
    return source, target, json.loads(report.read_text())


def _assert_converted(source: pathlib.Path, target: pathlib.Path, precision: str, min_share: float = 0.9) -> None:
    half, name = HALF[precision]
    converted = onnx.load(str(target))
    original = onnx.load(str(source))
    # float32 inputs and outputs
    assert [(i.name, i.type.tensor_type.elem_type) for i in converted.graph.input] == \
        [(i.name, i.type.tensor_type.elem_type) for i in original.graph.input]  # fmt: skip
    assert [(o.name, o.type.tensor_type.elem_type) for o in converted.graph.output] == \
        [(o.name, o.type.tensor_type.elem_type) for o in original.graph.output]  # fmt: skip
    assert _half_share(converted, target.parent, half) >= min_share
    names = [n.name for n in converted.graph.node]
    assert len(names) == len(set(names)), "node names must be unique"
    a, b = _session(source), _session(target)  # it loads
    rtol, atol = TOLERANCES[name]
    for seed in (10, 11, 12):
        feeds = _feeds(a, seed)
        for expected, actual in zip(a.run(None, feeds), b.run(None, feeds)):
            assert actual.dtype == np.float32
            assert np.isfinite(actual).all()
            np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol)


def _assert_close(actual: np.ndarray, expected: np.ndarray, rtol: float, atol: float) -> None:
    """The precision check's criterion, computed here on our own: NaN and infinities where the
    float32 model has them, and each finite value within atol + rtol * |expected| or within
    rtol of the output's largest finite magnitude (half rounding errors scale with the values
    the computation carries: rounding the input of a residual block moves an output near 0 by
    the input's rounding)."""
    assert np.array_equal(np.isnan(actual), np.isnan(expected))
    infinite = np.isinf(expected)
    assert np.array_equal(np.isinf(actual), infinite) and (actual[infinite] == expected[infinite]).all()
    finite = np.isfinite(expected)
    error = np.abs(actual[finite].astype(np.float64) - expected[finite])
    scale = float(np.abs(expected[finite]).max()) if finite.any() else 0.0
    bound = np.maximum(atol + rtol * np.abs(expected[finite].astype(np.float64)), rtol * scale)
    assert (error <= bound).all(), f"max error {error.max():.3g}, worst excess {(error - bound).max():.3g}"


def _islands(report: dict) -> dict[str, str]:
    (run,) = [p for p in report["passes"] if p["name"] == "precision"]
    return run["stats"]["islands"]


@pytest.mark.parametrize("name", ["cnn", "transformer", "transformer_layernorm_op", "if", "loop", "function"])
def test_float16(tmp_path: pathlib.Path, name: str) -> None:
    source, target, report = _convert(tmp_path, MODELS[name](), "fp16")
    _assert_converted(source, target, "fp16")
    assert report["check"]["ok"]
    outputs = report["check"]["outputs"]
    assert all(o["tolerance_dtype"] == "float16" for o in outputs)


def test_bfloat16_cnn(tmp_path: pathlib.Path) -> None:
    source, target, report = _convert(tmp_path, cnn(), "bf16")
    _assert_converted(source, target, "bf16")
    assert report["check"]["outputs"][0]["tolerance_dtype"] == "bfloat16"


def test_large_values_stay_float32(tmp_path: pathlib.Path) -> None:
    """The values near 3e5 are computed in a float32 island (found on the check's inputs), not inf."""
    source, target, report = _convert(tmp_path, large_values(), "fp16")
    islands = _islands(report)
    assert any(why.startswith("range:") for why in islands.values()), islands
    # The big values' nodes are float32; the weights around them stay float16 where they can.
    _assert_converted(source, target, "fp16", min_share=0.5)


def test_the_kernel_probe_finds_the_op() -> None:
    from passes.verify.probe import has_kernel

    i64 = TensorProto.INT64
    assert not has_kernel("HannWindow", "", 18, (i64,), (TensorProto.FLOAT16,))
    assert has_kernel("HannWindow", "", 18, (i64,), (F32,))


def test_an_op_without_a_half_kernel_stays_float32(tmp_path: pathlib.Path) -> None:
    source, target, report = _convert(tmp_path, no_half_kernel(), "fp16")
    islands = _islands(report)
    (why,) = [why for label, why in islands.items() if "(HannWindow" in label]
    assert why.startswith("kernel:")
    _assert_converted(source, target, "fp16")


def test_external_data_stays_external(tmp_path: pathlib.Path) -> None:
    model = transformer()
    source, target, report = _convert(tmp_path, model, "fp16", save_as_external_data=True, size_threshold=0,
                                      location="m.onnx.data")  # fmt: skip
    _assert_converted(source, target, "fp16")
    converted = onnx.load(str(target), load_external_data=False)
    assert any(onnx.external_data_helper.uses_external_data(t) for t in converted.graph.initializer)


def test_subgraphs_and_functions_are_converted_inside(tmp_path: pathlib.Path) -> None:
    _, target, _ = _convert(tmp_path, with_if(), "fp16", "if")
    model = onnx.load(str(target))
    (if_node,) = [n for n in model.graph.node if n.op_type == "If"]
    for attr in if_node.attribute:
        casts = [n for n in attr.g.node if n.op_type == "Cast"]
        assert casts, "the branch computes in float16 between Casts"
    _, target, _ = _convert(tmp_path, with_function(), "fp16", "function")
    model = onnx.load(str(target))
    (function,) = model.functions
    assert any(n.op_type == "Cast" and n.attribute[0].i == TensorProto.FLOAT16 for n in function.node)


def test_no_precision_changes_nothing(tmp_path: pathlib.Path) -> None:
    source = tmp_path / "m.onnx"
    onnx.save_model(cnn(), str(source))
    plain = passes.optimize(str(source))
    assert all(t.dtype != 10 for t in plain.graph.initializers.values())
    from passes import modelio, pipeline

    runs = pipeline.optimize_model(modelio.load_model(source))
    assert "precision" not in [r.name for r in runs]  # opt-in: not in the default run without --precision
    (run,) = [r for r in pipeline.optimize_model(modelio.load_model(source), passes=["precision"])
              if r.name == "precision"]  # named without the option: runs and changes nothing
    assert not run.modified


def test_refuses_an_unknown_precision(tmp_path: pathlib.Path) -> None:
    with pytest.raises(passes.InputError, match="fp16 or bf16"):
        passes.optimize(cnn(), precision="fp8")


def cancellation() -> onnx.ModelProto:
    """(x + 1000) - 1000: in float16 the sum keeps 0.5 steps near 1000, so the difference loses the
    input's digits; within range (no range island), only the check and its locator find it."""
    rng = np.random.default_rng(7)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Add", ["h", "k"], ["shifted"]),
        helper.make_node("Sub", ["shifted", "k"], ["back"]),
        helper.make_node("MatMul", ["back", "w2"], ["y"]),
    ]
    inits = [_w(rng, "w", 16, 16), numpy_helper.from_array(np.array(1000.0, np.float32), "k"),
             _w(rng, "w2", 16, 8)]
    return _model(nodes, [helper.make_tensor_value_info("x", F32, ["N", 16])],
                  [helper.make_tensor_value_info("y", F32, ["N", 8])], inits)  # fmt: skip


def test_the_check_finds_the_islands_the_ranges_miss(tmp_path: pathlib.Path) -> None:
    source, target, report = _convert(tmp_path, cancellation(), "fp16")
    islands = _islands(report)
    checked = [label for label, why in islands.items() if why.startswith("check:")]
    # Sub, and what makes its input: the Add (fused with the MatMul into a Gemm by simplify)
    assert any("(Sub" in label for label in checked) and len(checked) >= 2, islands
    _assert_converted(source, target, "fp16")


def test_a_model_the_rounds_cannot_fix_is_refused(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No round of the locator left: the check fails, exit 1, nothing written, the pass named."""
    import passes.precision

    monkeypatch.setattr(passes.precision, "MAX_ROUNDS", 0)
    source, target = tmp_path / "m.onnx", tmp_path / "out.onnx"
    onnx.save_model(cancellation(), str(source))
    assert cli.main([str(source), "-o", str(target), "--precision", "fp16"]) == 1
    assert not target.exists()


def test_io_keeps_float32_at_the_boundary_only(tmp_path: pathlib.Path) -> None:
    """One Cast per graph input and output: inputs to the half type, outputs back."""
    _, target, _ = _convert(tmp_path, cnn(), "fp16")
    model = onnx.load(str(target))
    casts = [n for n in model.graph.node if n.op_type == "Cast"]
    assert sorted(n.input[0] for n in casts) == ["x", "y_fp16"]
    assert {n.output[0] for n in casts} == {"x_fp16", "y"}


def test_float64_and_integers_are_untouched_through_the_api() -> None:
    """The in-memory route (a ModelProto in, a ModelProto out) converts too; float64 and int64
    values and weights keep their types."""
    rng = np.random.default_rng(8)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Cast", ["h"], ["h64"], to=TensorProto.DOUBLE),
        helper.make_node("Mul", ["h64", "d"], ["m64"]),
        helper.make_node("Cast", ["m64"], ["m"], to=F32),
        helper.make_node("Relu", ["m"], ["y"]),
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Mul", ["shape", "k"], ["size"]),
    ]
    inits = [_w(rng, "w", 16, 8), numpy_helper.from_array(np.full(8, 0.5), "d"),
             numpy_helper.from_array(np.array([3, 3], np.int64), "k")]
    model = _model(nodes, [helper.make_tensor_value_info("x", F32, ["N", 16])],
                   [helper.make_tensor_value_info("y", F32, ["N", 8]),
                    helper.make_tensor_value_info("size", TensorProto.INT64, [2])], inits)  # fmt: skip
    converted = passes.optimize(model, precision="fp16")
    types = {t.name: t.data_type for t in converted.graph.initializer}
    assert types["w"] == TensorProto.FLOAT16 and types["d"] == TensorProto.DOUBLE and types["k"] == TensorProto.INT64
    mul = [n for n in converted.graph.node if n.op_type == "Mul" and "d" in n.input]
    assert len(mul) == 1


# --- --precision-io -------------------------------------------------------------------------


def _convert_with(tmp_path: pathlib.Path, model: onnx.ModelProto, *flags: str, name: str = "m",
                  **save: object) -> tuple[pathlib.Path, pathlib.Path, dict]:  # fmt: skip
    source, target, report = tmp_path / f"{name}.onnx", tmp_path / f"{name}.out.onnx", tmp_path / f"{name}.json"
    onnx.save_model(model, str(source), **save)
    code = cli.main([str(source), "-o", str(target), "--report", str(report), *flags])
    assert code == 0
    return source, target, json.loads(report.read_text())


#: The tolerance given on the command line: none, the half type's (compared element-wise or against
#: the output's largest magnitude, see _assert_close).
IO_TOLERANCE = {"cnn": None, "transformer": None}


@pytest.mark.parametrize("name", ["cnn", "transformer"])
def test_precision_io_makes_the_inputs_and_outputs_half(tmp_path: pathlib.Path, name: str) -> None:
    """--precision-io: float16 graph inputs and outputs, no Cast at the boundary; it loads in
    onnxruntime and, fed the float32 inputs rounded to float16, matches the float32 model within
    the tolerance on three input sets (its outputs widened to float32)."""
    tolerance = IO_TOLERANCE[name]
    flags = ["--precision", "fp16", "--precision-io"]
    if tolerance is not None:
        flags += ["--precision-tolerance", ",".join(f"{t:g}" for t in tolerance)]
    source, target, report = _convert_with(tmp_path, MODELS[name](), *flags)
    assert report["check"]["ok"] and report["written"]
    converted = onnx.load(str(target))
    assert {i.type.tensor_type.elem_type for i in converted.graph.input} == {TensorProto.FLOAT16}
    assert {o.type.tensor_type.elem_type for o in converted.graph.output} == {TensorProto.FLOAT16}
    inputs, outputs = {i.name for i in converted.graph.input}, {o.name for o in converted.graph.output}
    casts = [n for n in converted.graph.node if n.op_type == "Cast"]
    assert not [n for n in casts if n.input[0] in inputs or n.output[0] in outputs], "no Cast at the boundary"
    names = [n.name for n in converted.graph.node]
    assert len(names) == len(set(names))
    (run,) = [p for p in report["passes"] if p["name"] == "precision"]
    assert run["stats"]["io"] is True and run["stats"]["applied"]["inputs_and_outputs"] == 2
    rtol, atol = tolerance or TOLERANCES["float16"]
    a, b = _session(source), _session(target)  # it loads
    for seed in (10, 11, 12):
        feeds = _feeds(a, seed)
        half_feeds = {k: v.astype(np.float16) for k, v in feeds.items()}
        for expected, actual in zip(a.run(None, feeds), b.run(None, half_feeds)):
            assert actual.dtype == np.float16
            _assert_close(actual.astype(np.float32), expected, rtol, atol)


def test_precision_io_through_the_api_keeps_float64_and_integers() -> None:
    """The in-memory route converts the float32 input and output; an int64 output and a float64
    input keep their types."""
    rng = np.random.default_rng(8)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Relu", ["h"], ["y"]),
        helper.make_node("Shape", ["x"], ["size"]),
        helper.make_node("Mul", ["d", "d"], ["d2"]),
    ]
    model = _model(nodes, [helper.make_tensor_value_info("x", F32, ["N", 16]),
                           helper.make_tensor_value_info("d", TensorProto.DOUBLE, [3])],
                   [helper.make_tensor_value_info("y", F32, ["N", 8]),
                    helper.make_tensor_value_info("size", TensorProto.INT64, [2]),
                    helper.make_tensor_value_info("d2", TensorProto.DOUBLE, [3])], [_w(rng, "w", 16, 8)])  # fmt: skip
    converted = passes.optimize(model, precision="fp16", precision_io=True)
    types = {v.name: v.type.tensor_type.elem_type for v in [*converted.graph.input, *converted.graph.output]}
    assert types == {"x": TensorProto.FLOAT16, "d": TensorProto.DOUBLE, "y": TensorProto.FLOAT16,
                     "size": TensorProto.INT64, "d2": TensorProto.DOUBLE}  # fmt: skip


def _exit_code(argv: list[str]) -> int:
    """The command's exit code (argparse's usage errors exit by SystemExit)."""
    try:
        return cli.main(argv)
    except SystemExit as e:
        return int(e.code)


@pytest.mark.parametrize("flags, message", [
    (["--precision-io"], "--precision-io needs --precision"),
    (["--precision-tolerance", "1e-3"], "--precision-tolerance needs --precision"),
    (["--precision", "fp16", "--precision-tolerance", "1e-3", "--rtol", "1e-3"], "give one"),
    (["--passes", "upgrade", "--precision-io"], "which does not run"),
])  # fmt: skip
def test_options_that_make_no_sense_together_are_refused(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture,
                                                         flags: list[str], message: str) -> None:  # fmt: skip
    source, target = tmp_path / "m.onnx", tmp_path / "out.onnx"
    onnx.save_model(cnn(), str(source))
    before = source.read_bytes()
    assert _exit_code([str(source), "-o", str(target), *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not target.exists() and source.read_bytes() == before


# --- --precision-tolerance -------------------------------------------------------------------


@pytest.mark.parametrize("value", ["0", "-1e-2", "nan", "inf", "1e-2,-1", "1e-2,nan", "1e-2,1e-3,1", "x", ""])
def test_a_bad_tolerance_is_refused(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture, value: str) -> None:
    source, target = tmp_path / "m.onnx", tmp_path / "out.onnx"
    onnx.save_model(cnn(), str(source))
    assert _exit_code([str(source), "-o", str(target), "--precision", "fp16", "--precision-tolerance", value]) == 2
    err = capsys.readouterr().err
    assert "--precision-tolerance" in err and len(err.strip().splitlines()) == 1, err
    assert not target.exists()
    with pytest.raises(passes.InputError, match="precision-tolerance"):
        passes.optimize(cnn(), precision="fp16", precision_tolerance=value)


def test_a_tighter_tolerance_makes_more_islands_or_is_refused(tmp_path: pathlib.Path) -> None:
    """At float16's default tolerance the CNN needs no check island; at a hundredth of it the
    search puts nodes back in float32 (and the check holds the result to that tolerance), or,
    when float32 islands cannot get there, the run is refused (exit 1, nothing written)."""
    _, _, report = _convert_with(tmp_path, cnn(), "--precision", "fp16", name="default")
    default = [why for why in _islands(report).values() if why.startswith("check:")]
    source, target = tmp_path / "tight.onnx", tmp_path / "tight.out.onnx"
    onnx.save_model(cnn(), str(source))
    code = cli.main([str(source), "-o", str(target), "--precision", "fp16", "--precision-tolerance", "1e-4,1e-5",
                     "--report", str(tmp_path / "tight.json")])  # fmt: skip
    if code == 1:
        assert not target.exists()
        return
    assert code == 0
    report = json.loads((tmp_path / "tight.json").read_text())
    tight = [why for why in _islands(report).values() if why.startswith("check:")]
    assert len(tight) > len(default)
    (output,) = report["check"]["outputs"]
    assert (output["rtol"], output["atol"]) == (1e-4, 1e-5)


def test_the_tolerance_reaches_the_check(tmp_path: pathlib.Path) -> None:
    """RTOL alone keeps the type's atol; the report says where the tolerance came from."""
    _, _, report = _convert_with(tmp_path, cnn(), "--precision", "fp16", "--precision-tolerance", "2e-2")
    (output,) = report["check"]["outputs"]
    assert (output["rtol"], output["atol"]) == (2e-2, TOLERANCES["float16"][1])
    assert output["tolerance_value"] == "--precision-tolerance"
    (run,) = [p for p in report["passes"] if p["name"] == "precision"]
    assert run["stats"]["tolerance"] == [2e-2, None]


# --- external weights, converted block by block ----------------------------------------------


def wide(count: int = 12, side: int = 256, seed: int = 11) -> onnx.ModelProto:
    """``count`` MatMuls of one input by pseudo-random float32 weights (``side`` x ``side``), concatenated."""
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("MatMul", ["x", f"w{i}"], [f"m{i}"], name=f"mm{i}") for i in range(count)]
    nodes.append(helper.make_node("Concat", [f"m{i}" for i in range(count)], ["y"], name="concat", axis=1))
    inits = [_w(rng, f"w{i}", side, side, scale=0.25 * side**-0.5) for i in range(count)]
    return _model(nodes, [helper.make_tensor_value_info("x", F32, [1, side])],
                  [helper.make_tensor_value_info("y", F32, [1, side * count])], inits)  # fmt: skip


def test_external_weights_are_converted_block_by_block(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """External data stays external, and each converted tensor's bytes are numpy's astype(float16)
    of its source, though written a chunk (here 64 KiB of a 256 KiB tensor) at a time."""
    from passes.precision import lazy

    monkeypatch.setattr(lazy, "CHUNK", 64 << 10)
    model = wide()
    sources = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}  # saving moves them out
    source, target, report = _convert_with(tmp_path, model, "--precision", "fp16", save_as_external_data=True,
                                           size_threshold=0, location="m.onnx.data")  # fmt: skip
    assert report["check"]["ok"]
    stored = onnx.load(str(target), load_external_data=False)
    weights = {t.name: t for t in stored.graph.initializer}
    assert all(onnx.external_data_helper.uses_external_data(weights[f"w{i}"]) for i in range(12))
    assert {weights[f"w{i}"].data_type for i in range(12)} == {TensorProto.FLOAT16}
    converted = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(target)).graph.initializer}
    for name, array in sources.items():
        expected = array.astype(np.float16)
        assert converted[name].view(np.uint16).tobytes() == expected.view(np.uint16).tobytes()


def test_external_weights_are_converted_in_bounded_memory(tmp_path: pathlib.Path) -> None:
    """The whole run (load, the passes with the search for islands, the save, the check; the
    onnxruntime sessions run in a child process) allocates far less than the weights: 24 weights
    of 1 MiB are never in memory together. Python's allocations are traced (numpy's arrays
    included) after a first run has imported every module; a run that held the converted
    weights until the save peaked above 24 MiB (12 MiB of float16 copies, and the search's
    rounded float32 copies written inline), this one at about 3 MiB."""
    import tracemalloc

    count, side = 24, 512
    model = wide(count, side)
    total = count * side * side * 4
    source, target = tmp_path / "m.onnx", tmp_path / "out.onnx"
    onnx.save_model(model, str(source), save_as_external_data=True, size_threshold=0, location="m.onnx.data")
    del model
    _convert_with(tmp_path, wide(2, 16), "--precision", "fp16", "-q", name="warm", save_as_external_data=True,
                  size_threshold=0, location="warm.onnx.data")  # fmt: skip
    tracemalloc.start()
    try:
        code = cli.main([str(source), "-o", str(target), "--precision", "fp16", "-q"])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert code == 0
    assert peak < total / 4, f"peak {peak >> 20} MiB of Python allocations for {total >> 20} MiB of weights"
    stored = onnx.load(str(target), load_external_data=False)
    assert {t.data_type for t in stored.graph.initializer} == {TensorProto.FLOAT16}


def test_no_float32_weights_is_a_no_op(tmp_path: pathlib.Path) -> None:
    """A model whose weights and values are float64 and int64 (no float32 anywhere): the pass changes
    nothing, with or without --precision-io, and the output runs as the input does."""
    rng = np.random.default_rng(12)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Relu", ["h"], ["y"]),
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Mul", ["shape", "k"], ["size"]),
    ]
    inits = [numpy_helper.from_array(rng.standard_normal((16, 8)), "w"),
             numpy_helper.from_array(np.array([3, 3], np.int64), "k")]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.DOUBLE, ["N", 16])],
                   [helper.make_tensor_value_info("y", TensorProto.DOUBLE, ["N", 8]),
                    helper.make_tensor_value_info("size", TensorProto.INT64, [2])], inits)  # fmt: skip
    for flags in (["--precision", "fp16"], ["--precision", "fp16", "--precision-io"]):
        source, target, report = _convert_with(tmp_path, model, *flags)
        (run,) = [p for p in report["passes"] if p["name"] == "precision"]
        assert not run["modified"] and not run["stats"]["applied"]
        converted = onnx.load(str(target))
        assert {t.name: t.data_type for t in converted.graph.initializer} == {
            "w": TensorProto.DOUBLE, "k": TensorProto.INT64}
        assert not [n for n in converted.graph.node if n.op_type == "Cast"]
        feeds = {"x": rng.standard_normal((2, 16))}
        for expected, actual in zip(_session(source).run(None, feeds), _session(target).run(None, feeds)):
            np.testing.assert_array_equal(actual, expected)
