"""The fusions of the simplify pass: BatchNormalization and per-channel Mul/Add into Conv/ConvTranspose/Gemm,
MatMul+Add into Gemm.

Each positive case builds a small model with random weights (kept away from 0
and 1, so a fusion that drops a term or a factor shows), runs the pass, and
asserts that the checker accepts the result, the fused op is gone, the weights
were not duplicated, the pass counted the fusion, and onnxruntime (its own
optimisations disabled) computes the same outputs within 1e-5 (1e-3 in
float16). Each negative case asserts the model comes out bit-identical in
behaviour, with the op still there and the reason logged.
"""

from __future__ import annotations

import logging
import pathlib
from collections.abc import Callable

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import helpers
import passes
from passes import cli, modelio
from passes.simplify import SimplifyPass

RNG = np.random.default_rng(2024)
REPO = pathlib.Path(__file__).resolve().parent.parent
LOGGER = "passes.simplify"


# --- building models ----------------------------------------------------------------------------


def _random(shape, low: float = 0.3, high: float = 1.7, signed: bool = True, rng=None) -> np.ndarray:
    """Values in ±[low, high]: never 0, and never exactly 1 (a float draw)."""
    rng = rng or RNG
    values = rng.uniform(low, high, shape)
    if signed:
        values *= rng.choice([-1.0, 1.0], shape)
    return values


class Net:
    """Nodes and weights of one graph; weights as initializers, or as Constant nodes (``inline``)."""

    def __init__(self, dtype=np.float32, inline: bool = False, suffix: str = "", rng=None) -> None:
        self.rng = rng or RNG
        self.dtype = np.dtype(dtype)
        self.inline = inline
        self.suffix = suffix
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []

    def random(self, shape, *args, **kwargs) -> np.ndarray:
        return _random(shape, *args, rng=self.rng, **kwargs)

    def name(self, base: str) -> str:
        return base + self.suffix

    def weight(self, base: str, array: np.ndarray) -> str:
        name = self.name(base)
        tensor = numpy_helper.from_array(np.asarray(array).astype(self.dtype), name)
        if self.inline:
            self.nodes.append(helper.make_node("Constant", [], [name], value=tensor))
        else:
            self.initializers.append(tensor)
        return name

    def node(self, op: str, inputs: list[str], outputs: list[str], **attrs) -> str:
        self.nodes.append(helper.make_node(op, inputs, [self.name(o) if o else "" for o in outputs],
                                           name=self.name(outputs[0]), **attrs))
        return self.name(outputs[0])

    def conv(self, x: str, out: str, cin: int = 3, cout: int = 4, kernel=(3, 3), bias: bool = True,
             group: int = 1, transpose: bool = False) -> str:
        if transpose:
            shape = (cin, cout // group, *kernel)
        else:
            shape = (cout, cin // group, *kernel)
        fan_in = cin // group * int(np.prod(kernel))
        inputs = [x, self.weight(out + "_w", self.random(shape) / np.sqrt(fan_in))]  # activations stay ~1
        if bias:
            inputs.append(self.weight(out + "_b", self.random(cout)))
        pads = [1] * (2 * len(kernel))
        return self.node("ConvTranspose" if transpose else "Conv", inputs, [out], pads=pads, group=group)

    def bn(self, x: str, out: str, channels: int = 4, epsilon: float = 1e-3, outputs=(), **attrs) -> str:
        params = [self.weight(out + "_scale", self.random(channels)),
                  self.weight(out + "_shift", self.random(channels)),
                  self.weight(out + "_mean", self.random(channels)),
                  self.weight(out + "_var", self.random(channels, 0.2, 2.0, signed=False))]
        return self.node("BatchNormalization", [x, *params], [out, *outputs], epsilon=epsilon, **attrs)

    def model(self, inputs, outputs, opset: int = 18, ir_version: int | None = None) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, "g", inputs, outputs, initializer=self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        if ir_version is not None:
            model.ir_version = ir_version
        return model


def _elem(dtype) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def _io(name: str, shape, dtype=np.float32) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, _elem(dtype), shape)


def _image(shape=(2, 3, 5, 5), dtype=np.float32) -> list[onnx.ValueInfoProto]:
    return [_io("x", list(shape), dtype)]


def _out(dtype=np.float32, rank: int = 4) -> list[onnx.ValueInfoProto]:
    return [_io("y", [None] * rank, dtype)]


# --- running the pass -------------------------------------------------------------------------------


_simplify = helpers.simplify_checked


_ops = helpers.ops_recursive


def _feeds(proto: onnx.ModelProto) -> dict[str, np.ndarray]:
    feeds = {}
    initializers = {i.name for i in proto.graph.initializer}
    for value in proto.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        dtype = helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        shape = [d.dim_value for d in tensor.shape.dim]
        feeds[value.name] = (RNG.random(shape) < 0.5) if dtype == np.bool_ else RNG.standard_normal(shape).astype(dtype)
    return feeds


def _close(original: onnx.ModelProto, result: onnx.ModelProto, feeds=None, tolerance: float = 1e-5) -> None:
    feeds = feeds or _feeds(original)
    expected, actual = helpers.ort_run(original, feeds), helpers.ort_run(result, feeds)
    for a, b in zip(expected, actual):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(b.astype(np.float64), a.astype(np.float64), rtol=tolerance, atol=tolerance)
    assert [(o.name, o.type) for o in result.graph.output] == [(o.name, o.type) for o in original.graph.output]
    assert [(i.name, i.type) for i in result.graph.input] == [(i.name, i.type) for i in original.graph.input]


def _identical(original: onnx.ModelProto, result: onnx.ModelProto, feeds=None) -> None:
    feeds = feeds or _feeds(original)
    for a, b in zip(helpers.ort_run(original, feeds), helpers.ort_run(result, feeds)):
        np.testing.assert_array_equal(a, b)


def _weight_bytes(proto: onnx.ModelProto) -> int:
    total = sum(numpy_helper.to_array(t).nbytes for t in proto.graph.initializer)

    def walk(graph: onnx.GraphProto) -> int:
        found = 0
        for node in graph.node:
            for attr in node.attribute:
                if node.op_type == "Constant" and attr.name == "value":
                    found += numpy_helper.to_array(attr.t).nbytes
                elif attr.type == onnx.AttributeProto.GRAPH:
                    found += walk(attr.g)
        return found

    return total + walk(proto.graph) + sum(walk(helper.make_graph(list(f.node), "f", [], [])) for f in proto.functions)


# --- what fuses ---------------------------------------------------------------------------------------

CASES: dict[str, tuple[Callable[[], onnx.ModelProto], tuple[str, ...], str, float]] = {}


def case(*gone: str, rule: str, tolerance: float = 1e-5):
    def register(build: Callable[[], onnx.ModelProto]):
        CASES[build.__name__] = (build, gone, rule, tolerance)
        return build

    return register


@case("BatchNormalization", rule="batchnorm_into_conv")
def conv_bn():
    net = Net()
    net.bn(net.conv("x", "c"), "y")
    return net.model(_image(), _out())


@case("BatchNormalization", rule="batchnorm_into_conv")
def conv_without_bias_bn():
    net = Net()
    net.bn(net.conv("x", "c", bias=False), "y")
    return net.model(_image(), _out())


@case("BatchNormalization", rule="batchnorm_into_conv")
def grouped_conv_bn():
    net = Net()
    net.bn(net.conv("x", "c", cin=4, cout=6, group=2), "y", channels=6)
    return net.model(_image((2, 4, 5, 5)), _out())


@case("BatchNormalization", rule="batchnorm_into_conv")
def conv1d_bn():
    net = Net()
    net.bn(net.conv("x", "c", kernel=(3,)), "y")
    return net.model(_image((2, 3, 7)), _out(rank=3))


@case("BatchNormalization", rule="batchnorm_into_conv")
def conv_bn_opset13():
    """Opset 9-13: inference mode is a BatchNormalization with one output."""
    net = Net()
    net.bn(net.conv("x", "c"), "y")
    return net.model(_image(), _out(), opset=13)


@case("BatchNormalization", rule="batchnorm_into_conv")
def conv_bn_opset7():
    """Opset 7-8: ``spatial`` defaults to 1 (per-channel statistics)."""
    net = Net()
    net.bn(net.conv("x", "c"), "y")
    return net.model(_image(), _out(), opset=7)


@case("BatchNormalization", rule="batchnorm_into_conv", tolerance=1e-2)
def conv_bn_float16():
    net = Net(np.float16)
    net.bn(net.conv("x", "c"), "y")
    return net.model(_image(dtype=np.float16), _out(np.float16))


@case("BatchNormalization", rule="batchnorm_into_conv_transpose")
def conv_transpose_bn():
    net = Net()
    net.bn(net.conv("x", "c", cout=5, transpose=True), "y", channels=5)
    return net.model(_image(), _out())


@case("BatchNormalization", rule="batchnorm_into_conv_transpose")
def conv_transpose_without_bias_bn():
    net = Net()
    net.bn(net.conv("x", "c", cout=5, transpose=True, bias=False), "y", channels=5)
    return net.model(_image(), _out())


def _gemm(trans_b: int, c_shape, dtype=np.float32, **attrs):
    net = Net(dtype)
    b = net.weight("gemm_b", _random((4, 5) if trans_b else (5, 4)))
    inputs = ["x", b]
    if c_shape is not None:
        inputs.append(net.weight("gemm_c", _random(c_shape)))
    net.node("Gemm", inputs, ["g"], transB=trans_b, **attrs)
    net.bn("g", "y")
    return net.model([_io("x", [3, 5], dtype)], _out(dtype, rank=2))


@case("BatchNormalization", rule="batchnorm_into_gemm")
def gemm_bn():
    return _gemm(0, (4,))


@case("BatchNormalization", rule="batchnorm_into_gemm")
def gemm_trans_b_row_bias_bn():
    return _gemm(1, (1, 4), alpha=0.7, beta=1.3)


@case("BatchNormalization", rule="batchnorm_into_gemm")
def gemm_scalar_bias_bn():
    return _gemm(0, (), beta=-0.6, transA=0)


@case("BatchNormalization", rule="batchnorm_into_gemm", tolerance=1e-12)
def gemm_bn_float64():
    """onnxruntime's CPU Conv has no double kernel; its Gemm does."""
    return _gemm(0, (4,), np.float64)


@case("BatchNormalization", rule="batchnorm_into_gemm")
def gemm_without_bias_bn():
    return _gemm(1, None, alpha=1.4)


def _conv_then(op: str, shape, bias: bool = True, swapped: bool = False, kernel=(3, 3), out_rank=None):
    net = Net()
    c = net.conv("x", "c", bias=bias, kernel=kernel)
    # A Mul by a negative scale turns the Conv's +0 into -0, which the fused Conv cannot give: not fused.
    k = net.weight("k", _random(shape, signed=op != "Mul"))
    net.node(op, [k, c] if swapped else [c, k], ["y"])
    return net.model(_image((2, 3, *([5] * len(kernel)))), _out(rank=out_rank or len(kernel) + 2))


@case("Mul", rule="mul_into_conv")
def conv_mul_per_channel():
    return _conv_then("Mul", (4, 1, 1))


@case("Mul", rule="mul_into_conv")
def conv_mul_leading_one():
    return _conv_then("Mul", (1, 4, 1, 1), swapped=True)


@case("Mul", rule="mul_into_conv")
def conv_without_bias_mul_scalar():
    return _conv_then("Mul", (), bias=False)


@case("Mul", rule="mul_into_conv")
def conv1d_mul():
    return _conv_then("Mul", (4, 1), kernel=(3,))


@case("Add", rule="add_into_conv")
def conv_add_per_channel():
    return _conv_then("Add", (1, 4, 1, 1))


@case("Add", rule="add_into_conv")
def conv_without_bias_add():
    """The Conv gets a bias."""
    return _conv_then("Add", (4, 1, 1), bias=False, swapped=True)


@case("Add", rule="add_into_conv")
def conv_add_scalar():
    return _conv_then("Add", (1,))


@case("BatchNormalization", "Mul", "Add", rule="batchnorm_into_conv")
def conv_bn_mul_add():
    """Three fusions in a row (one per round): one Conv remains."""
    net = Net()
    t = net.bn(net.conv("x", "c"), "t")
    u = net.node("Mul", [t, net.weight("k", _random((4, 1, 1), signed=False))], ["u"])
    net.node("Add", [u, net.weight("a", _random((1, 4, 1, 1)))], ["y"])
    return net.model(_image(), _out())


def _matmul_add(c_shape, dtype=np.float32, swapped: bool = False, rows: int | str = 3, opset: int = 18,
                a_shape=None, b_shape=(5, 4), c_input: bool = False, out_rank: int = 2) -> onnx.ModelProto:
    """``y = Add(MatMul(x, w), c)`` (or ``Add(c, MatMul(x, w))``); ``c`` a weight, or a graph input (``c_input``)."""
    net = Net(dtype)
    inputs = [_io("x", list(a_shape or (rows, 5)), dtype)]
    m = net.node("MatMul", ["x", net.weight("w", net.random(b_shape))], ["m"])
    if c_input:
        inputs.append(_io("c", list(c_shape), dtype))
        c = "c"
    else:
        c = net.weight("c", net.random(c_shape))
    net.node("Add", [c, m] if swapped else [m, c], ["y"])
    return net.model(inputs, [_io("y", [None] * out_rank, dtype)], opset=opset)


@case("MatMul", "Add", rule="matmul_add_into_gemm")
def matmul_add_vector():
    """The scikit-learn MLP layer: a bias per column."""
    return _matmul_add((4,))


@case("MatMul", "Add", rule="matmul_add_into_gemm")
def matmul_add_row():
    return _matmul_add((1, 4))


@case("MatMul", "Add", rule="matmul_add_into_gemm")
def matmul_add_matrix():
    """C of the result's own static shape [M, N]."""
    return _matmul_add((3, 4))


@case("MatMul", "Add", rule="matmul_add_into_gemm")
def matmul_add_column():
    return _matmul_add((3, 1))


@case("MatMul", "Add", rule="matmul_add_into_gemm")
def matmul_add_scalar():
    return _matmul_add(())


@case("MatMul", "Add", rule="matmul_add_into_gemm")
def matmul_add_swapped():
    """``Add(C, MatMul(A, B))``: Add commutes, Gemm still gets C third."""
    return _matmul_add((4,), swapped=True)


@case("MatMul", "Add", rule="matmul_add_into_gemm")
def matmul_add_opset11():
    return _matmul_add((4,), opset=11)


@case("MatMul", "Add", rule="matmul_add_into_gemm")
def matmul_add_c_is_a_graph_input():
    """C need not be a constant: Gemm takes any C."""
    return _matmul_add((1, 4), c_input=True)


@case("MatMul", "Add", rule="matmul_add_into_gemm", tolerance=1e-12)
def matmul_add_float64():
    return _matmul_add((4,), np.float64)


@case("MatMul", "Add", rule="matmul_add_into_gemm", tolerance=1e-2)
def matmul_add_float16():
    return _matmul_add((4,), np.float16)


def _pad_conv(pads, opset: int = 18, value=None, mode: str | None = None, axes=None, conv_pads=None,
              kernel=(3, 3), group: int = 1, channels: int = 4, pads_input: bool = False,
              x_channels: int | None = None, **conv_extra) -> onnx.ModelProto:
    """x -> Pad -> Conv (random weights, a bias) -> y; ``pads_input``: the pads are a graph input."""
    net = Net()
    attrs = {} if mode is None else {"mode": mode}
    if opset < 11:
        attrs["pads"] = list(pads)
        if value is not None:
            attrs["value"] = float(value)
        inputs = ["x"]
    else:
        inputs = ["x", "pads"]
        if not pads_input:
            net.initializers.append(numpy_helper.from_array(np.array(pads, np.int64), "pads"))
        inputs.append("" if value is None else net.weight("value", np.array(value)))
        if axes is not None:
            net.initializers.append(numpy_helper.from_array(np.array(axes, np.int64), "axes"))
            inputs.append("axes")
    while inputs and not inputs[-1]:
        inputs.pop()
    padded = net.node("Pad", inputs, ["padded"], **attrs)
    weight = net.weight("w", net.random((4, channels // group, *kernel)) / np.sqrt(channels * np.prod(kernel)))
    conv_attrs = ({"group": group} if group != 1 else {}) | conv_extra
    if conv_pads is not None:
        conv_attrs["pads"] = conv_pads
    net.node("Conv", [padded, weight, net.weight("b", net.random(4))], ["y"], **conv_attrs)
    rank = 2 + len(kernel)
    image = [_io("x", [2, x_channels or channels, *([6] * len(kernel))])]
    extra = [_io("pads", [len(pads)], np.int64)] if pads_input else []
    return net.model(image + extra, _out(rank=rank), opset=opset)


@case("Pad", rule="pad_into_conv")
def pad_conv():
    return _pad_conv([0, 0, 1, 2, 0, 0, 2, 1], conv_pads=[1, 0, 0, 1])


@case("Pad", rule="pad_into_conv")
def pad_conv_explicit_zero():
    return _pad_conv([0, 0, 1, 1, 0, 0, 1, 1], value=0.0, mode="constant")


@case("Pad", rule="pad_into_conv")
def pad_conv_axes():
    return _pad_conv([1, 0, 0, 2], axes=[-2, 3])


@case("Pad", rule="pad_into_conv")
def pad_conv_depthwise():
    return _pad_conv([0, 0, 1, 1, 0, 0, 1, 1], group=4)


@case("Pad", rule="pad_into_conv")
def pad_conv1d():
    return _pad_conv([0, 0, 3, 0, 0, 1], kernel=(3,), conv_pads=[1, 1])


@case("Pad", rule="pad_into_conv")
def pad_conv_auto_pad_valid():  # EfficientNet's TensorFlow-style "same" padding before a stride-2 Conv
    return _pad_conv([0, 0, 0, 0, 0, 0, 1, 1], group=4, auto_pad="VALID", strides=[2, 2])


@case("Pad", rule="pad_into_conv")
def pad_conv_opset10():
    return _pad_conv([0, 0, 1, 1, 0, 0, 1, 1], opset=10, value=0.0)


MATMUL_CASES = sorted(name for name, (_, _, rule, _) in CASES.items() if rule == "matmul_add_into_gemm")


@pytest.mark.parametrize("name", sorted(CASES))
def test_fusion(name: str) -> None:
    build, gone, rule, tolerance = CASES[name]
    original = build()
    onnx.checker.check_model(original, full_check=True)
    result, stats = _simplify(original)
    for op in gone:
        assert op not in _ops(result), (_ops(original), _ops(result))
    assert stats["fused"] > 0 and stats["applied"].get(f"fusions/{rule}", 0) > 0, stats
    assert "Constant" not in _ops(result)  # main-graph constants are initializers
    assert _weight_bytes(result) <= _weight_bytes(original)  # the old weights are gone, none duplicated
    _close(original, result, tolerance=tolerance)
    again, stats_again = _simplify(result)
    assert _ops(again) == _ops(result) and stats_again["fused"] == 0  # one run reaches the fixpoint


@pytest.mark.parametrize("name", MATMUL_CASES)
def test_matmul_add_becomes_one_gemm_with_the_defaults(name: str) -> None:
    original = CASES[name][0]()
    result, stats = _simplify(original)
    assert _ops(result) == ["Gemm"] and stats["applied"] == {"fusions/matmul_add_into_gemm": 1}, stats
    gemm = result.graph.node[0]
    matmul = next(n for n in original.graph.node if n.op_type == "MatMul")
    add = next(n for n in original.graph.node if n.op_type == "Add")
    c = next(i for i in add.input if i != matmul.output[0])
    assert list(gemm.input) == [*matmul.input, c] and not gemm.attribute  # alpha = beta = 1, no transposes
    assert list(gemm.output) == ["y"]


def test_the_gemm_takes_the_adds_name_inside_the_graph() -> None:
    """The Add's output is no graph output: the Gemm's output takes its name, its users read it."""
    net = Net()
    m = net.node("MatMul", ["x", net.weight("w", net.random((5, 4)))], ["m"])
    t = net.node("Add", [m, net.weight("c", net.random(4))], ["t"])
    net.node("Relu", [t], ["y"])
    original = net.model([_io("x", ["batch", 5])], [_io("y", ["batch", 4])])
    result, stats = _simplify(original)
    assert _ops(result) == ["Gemm", "Relu"] and stats["fused"] == 1, stats
    gemm, relu = result.graph.node
    assert list(gemm.output) == ["t"] and list(relu.input) == ["t"]
    feeds = {"x": RNG.standard_normal((6, 5)).astype(np.float32)}  # a dynamic batch, M symbolic
    _close(original, result, feeds)


def test_the_chain_becomes_one_conv() -> None:
    result, stats = _simplify(conv_bn_mul_add())
    assert _ops(result) == ["Conv"] and stats["fused"] == 3, stats


def test_fused_weights_are_rounded_once_from_float64() -> None:
    original = conv_bn()
    result, _ = _simplify(original)
    weights = {t.name: numpy_helper.to_array(t) for t in original.graph.initializer}
    epsilon = next(a.f for n in original.graph.node for a in n.attribute if a.name == "epsilon")
    s = weights["y_scale"].astype(np.float64) / np.sqrt(weights["y_var"].astype(np.float64) + np.float64(epsilon))
    expected_w = (weights["c_w"].astype(np.float64) * s[:, None, None, None]).astype(np.float32)
    expected_b = ((weights["c_b"].astype(np.float64) - weights["y_mean"]) * s + weights["y_shift"]).astype(np.float32)
    conv = next(n for n in result.graph.node if n.op_type == "Conv")
    fused = {t.name: numpy_helper.to_array(t) for t in result.graph.initializer}
    np.testing.assert_array_equal(fused[conv.input[1]], expected_w)
    np.testing.assert_array_equal(fused[conv.input[2]], expected_b)


# --- what does not fuse, and why ------------------------------------------------------------------


def _refused(original: onnx.ModelProto, op: str, reason: str, caplog, feeds=None, **options) -> dict:
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        result, stats = _simplify(original, **options)
    assert _ops(result).count(op) == _ops(original).count(op), (_ops(original), _ops(result))
    assert stats["fused"] == 0, stats
    if reason:
        assert reason in caplog.text, caplog.text
    _identical(original, result, feeds)
    return stats


def test_weights_shared_by_two_convs_are_not_duplicated(caplog) -> None:
    net = Net()
    c = net.conv("x", "c")
    net.bn(c, "t")
    net.node("Conv", ["x", "c_w"], ["d"], pads=[1, 1, 1, 1])
    net.node("Add", ["t", "d"], ["y"])
    _refused(net.model(_image(), _out()), "BatchNormalization", "weight has other users", caplog)


def test_a_bias_shared_by_two_convs_is_read_not_changed() -> None:
    """A bias is one value per channel: the fused Conv gets its own, the other Conv keeps the shared one."""
    net = Net()
    c = net.conv("x", "c")
    net.bn(c, "t")
    net.node("Conv", ["x", net.weight("w2", net.random((4, 3, 3, 3))), "c_b"], ["d"], pads=[1, 1, 1, 1])
    net.node("Add", ["t", "d"], ["y"])
    original = net.model(_image(), _out())
    result, stats = _simplify(original)
    assert "BatchNormalization" not in _ops(result) and stats["fused"] == 1
    fused, other = (n for n in result.graph.node if n.op_type == "Conv")
    assert other.input[2] == "c_b" and fused.input[2] != "c_b"
    _close(original, result)


def test_parameters_that_are_graph_inputs_are_not_folded(caplog) -> None:
    """IR 3 style: every initializer is also a graph input, which a caller may override."""
    net = Net()
    net.bn(net.conv("x", "c"), "y")
    inputs = _image() + [_io(t.name, list(t.dims)) for t in net.initializers]
    original = net.model(inputs, _out(), opset=7, ir_version=3)
    _refused(original, "BatchNormalization", "is a graph input", caplog)


def _same_outputs(original: onnx.ModelProto, result: onnx.ModelProto) -> None:
    """``_close`` for a result that lost its initializer-backed inputs (fed neither)."""
    feeds = _feeds(original)
    for a, b in zip(helpers.ort_run(original, feeds), helpers.ort_run(result, feeds), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)


def test_frozen_initializer_inputs_fold_and_fuse() -> None:
    """--freeze-initializer-inputs: the IR 3 model's weights become constants, the BatchNormalization fuses."""
    net = Net()
    net.bn(net.conv("x", "c"), "y")
    inputs = _image() + [_io(t.name, list(t.dims)) for t in net.initializers]
    original = net.model(inputs, _out(), opset=7, ir_version=3)
    result, stats = _simplify(original, freeze_initializer_inputs=True)
    assert [i.name for i in result.graph.input] == ["x"] and result.ir_version >= 4
    assert _ops(result) == ["Conv"] and stats["applied"]["constants/frozen_input"] == len(net.initializers)
    _same_outputs(original, result)  # onnxruntime runs an IR 3 model with its initializers as constants


def test_the_command_freezes_an_ir3_model_at_load(tmp_path, capsys) -> None:
    """An IR 3 model's weights are constants at load (as onnxruntime runs them; tests/test_ir3_constants.py):
    they fold and fuse without the flag, and the check passes."""
    net = Net()
    net.bn(net.conv("x", "c"), "y")
    src = tmp_path / "ir3.onnx"
    onnx.save(net.model(_image() + [_io(t.name, list(t.dims)) for t in net.initializers], _out(), opset=7,
                        ir_version=3), src)
    out = tmp_path / "out.onnx"
    assert cli.main([str(src), "-o", str(out)]) == 0
    assert "check passed" in capsys.readouterr().out
    result = onnx.load(str(out))
    assert [i.name for i in result.graph.input] == ["x"] and _ops(result) == ["Conv"]


def test_freezing_leaves_real_inputs_and_subgraphs_alone() -> None:
    """Only main-graph inputs backed by an initializer go; a plain input and a model without any stay."""
    net = Net()
    net.bn(net.conv("x", "c"), "y")
    original = net.model(_image() + [_io("y_var", [4])], _out())  # IR 8: y_var's initializer is its default
    result, stats = _simplify(original, freeze_initializer_inputs=True)
    assert [i.name for i in result.graph.input] == ["x"] and "BatchNormalization" not in _ops(result)
    _same_outputs(original, result)
    plain, stats = _simplify(result, freeze_initializer_inputs=True)
    assert "constants/frozen_input" not in stats["applied"] and plain == result  # nothing left to freeze


def test_a_bn_parameter_that_is_a_graph_input_at_ir_8_is_not_folded(caplog) -> None:
    """An initializer that is also a graph input is a default a caller may override."""
    net = Net()
    net.bn(net.conv("x", "c"), "y")
    original = net.model(_image() + [_io("y_var", [4])], _out())
    _refused(original, "BatchNormalization", "parameter is not a constant (or is a graph input)", caplog)
    override = {**_feeds(original), "y_var": np.full(4, 3.0, np.float32)}
    _identical(original, _simplify(original)[0], override)


def test_training_mode_is_not_fused(caplog) -> None:
    net = Net()
    net.bn(net.conv("x", "c"), "y", outputs=("rm", "rv"), training_mode=1)
    _refused(net.model(_image(), _out()), "BatchNormalization", "training mode", caplog)


def test_the_mean_output_in_use_is_training_mode_before_opset_14(caplog) -> None:
    net = Net()
    net.bn(net.conv("x", "c"), "y", outputs=("mean", "var", "saved_mean", "saved_var"))
    original = net.model(_image(), _out() + [_io("mean", [4])], opset=13)
    _refused(original, "BatchNormalization", "training mode", caplog)


def test_a_shared_mean_parameter_is_read_not_changed() -> None:
    """The BN's mean is also an input of another node: the fusion reads it; the other node sees it unchanged.

    BatchNormalization parameters are per channel, so reading a shared one
    duplicates nothing large; exporters share equal parameters across layers
    (models/real/small_cnn_opset11_nofold.onnx does), so this must fuse.
    """
    net = Net()
    t = net.bn(net.conv("x", "c"), "t")
    net.node("Add", [t, "t_mean"], ["y"])  # the mean again, broadcast along the last axis
    original = net.model(_image((2, 3, 4, 4)), _out())
    result, stats = _simplify(original)
    assert "BatchNormalization" not in _ops(result) and stats["fused"] == 1
    assert "t_mean" in {t.name for t in result.graph.initializer}
    mean = next(t for t in original.graph.initializer if t.name == "t_mean")
    kept = next(t for t in result.graph.initializer if t.name == "t_mean")
    np.testing.assert_array_equal(numpy_helper.to_array(kept), numpy_helper.to_array(mean))
    _close(original, result)


def test_a_conv_output_that_is_a_graph_output_stays(caplog) -> None:
    net = Net()
    net.bn(net.conv("x", "c"), "y")
    original = net.model(_image(), _out() + [_io("c", [None] * 4)])
    _refused(original, "BatchNormalization", "output has other users (or is a graph output)", caplog)


def test_a_conv_output_with_another_user_stays(caplog) -> None:
    net = Net()
    c = net.conv("x", "c")
    t = net.bn(c, "t")
    net.node("Sub", [t, c], ["y"])
    _refused(net.model(_image(), _out()), "BatchNormalization", "output has other users", caplog)


def test_a_fused_graph_output_keeps_its_name_type_and_shape() -> None:
    """The BN's output is a graph output and has another user: the Conv's output takes its place."""
    net = Net()
    t = net.bn(net.conv("x", "c"), "t")
    net.node("Relu", [t], ["r"])
    original = net.model(_image(), [_io("t", [2, 4, 5, 5]), _io("r", [2, 4, 5, 5])])
    result, stats = _simplify(original)
    assert _ops(result) == ["Conv", "Relu"] and stats["fused"] == 1
    conv, relu = result.graph.node
    assert list(conv.output) == ["t"] and list(relu.input) == ["t"]
    _close(original, result)


def test_no_fuse_leaves_everything(caplog) -> None:
    original = conv_bn_mul_add()
    stats = _refused(original, "BatchNormalization", "", caplog, fuse=False)
    result, _ = _simplify(original, fuse=False)
    assert _ops(result) == _ops(original)
    assert not any(name.startswith("fusions/") for name in stats["applied"])
    assert not any(name.startswith("fusions/") for name in stats["declined"])


def test_a_negative_variance_is_not_fused(caplog) -> None:
    """sqrt(var + epsilon) of a negative is NaN: the BN's NaN outputs stay where they are."""
    net = Net()
    net.bn(net.conv("x", "c"), "y")
    var = next(t for t in net.initializers if t.name == "y_var")
    var.CopyFrom(numpy_helper.from_array(np.array([0.5, -1.0, 0.7, 1.2], np.float32), "y_var"))
    _refused(net.model(_image(), _out()), "BatchNormalization", "1 / sqrt(var + epsilon) is not finite", caplog)


def test_a_gemm_weight_shared_with_a_matmul_is_not_duplicated(caplog) -> None:
    original = _gemm(0, (4,))
    original.graph.node.append(helper.make_node("MatMul", ["x", "gemm_b"], ["m"]))
    original.graph.output.append(_io("m", [3, 4]))
    _refused(original, "BatchNormalization", "weight has other users", caplog)


def test_a_grouped_conv_transpose_is_not_fused(caplog) -> None:
    net = Net()
    net.bn(net.conv("x", "c", cin=4, cout=6, transpose=True, group=2), "y", channels=6)
    _refused(net.model(_image((2, 4, 5, 5)), _out()), "BatchNormalization", "grouped ConvTranspose", caplog)


def test_a_gemm_bias_that_differs_per_row_is_not_fused(caplog) -> None:
    _refused(_gemm(0, (3, 4)), "BatchNormalization", "not the same for every row", caplog)


def test_a_gemm_bias_that_is_a_graph_input_is_not_fused(caplog) -> None:
    original = _gemm(0, (4,))
    original.graph.input.append(_io("gemm_c", [4]))
    _refused(original, "BatchNormalization", "bias is not a constant (or is a graph input)", caplog)


@pytest.mark.parametrize("shape, reason", [
    ((1, 1, 1, 5), "not per channel"),  # per column of the image
    ((1, 4, 5, 1), "not per channel"),  # per channel and row
    ((2, 1, 1, 1), "not per channel"),  # per sample
    ((2, 4, 1, 1), "not per channel"),  # per sample and channel
    ((1, 1, 4, 1, 1), "higher rank"),  # adds an axis
])
def test_a_constant_that_is_not_per_channel_is_not_fused(shape, reason, caplog) -> None:
    _refused(_conv_then("Mul", shape, out_rank=max(4, len(shape))), "Mul", reason, caplog)


def test_a_rank_3_constant_on_a_1d_conv_broadcasts_and_is_not_fused(caplog) -> None:
    """[C, 1, 1] is per channel for a 2-D conv's [N, C, H, W] output, not for a 1-D conv's [N, C, L]."""
    net = Net()
    c = net.conv("x", "c", kernel=(3,))
    net.node("Add", [c, net.weight("k", _random((4, 1, 1)))], ["y"])
    original = net.model(_image((4, 3, 5)), [_io("y", [None] * 3)])
    _refused(original, "Add", "not per channel", caplog)


def test_a_residual_add_of_two_convs_is_not_fused(caplog) -> None:
    net = Net()
    net.node("Add", [net.conv("x", "c"), net.conv("x", "d")], ["y"])
    _refused(net.model(_image(), _out()), "Add", "not a constant", caplog)


def test_bfloat16_weights_are_not_fused(caplog) -> None:
    net = Net(ml_dtypes.bfloat16)
    net.bn(net.conv("x", "c"), "y")
    original = net.model(_image(dtype=ml_dtypes.bfloat16), _out(ml_dtypes.bfloat16), opset=22)
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        result, stats = _simplify(original)
    assert "BatchNormalization" in _ops(result) and stats["fused"] == 0
    assert "not float16/float/double" in caplog.text


def _x_feed(shape, dtype=np.float32) -> dict[str, np.ndarray]:
    return {"x": RNG.standard_normal(shape).astype(dtype)}


@pytest.mark.parametrize("a_shape, b_shape, c_shape, out_rank, reason", [
    ((2, 3, 5), (5, 4), (4,), 3, "the MatMul's A has rank 3 (Gemm takes matrices only)"),  # onnxsim adds Reshapes
    ((3, 5), (2, 5, 4), (4,), 3, "the MatMul's B has rank 3"),
    ((3, 5), (5,), (3,), 1, "the MatMul's B has rank 1"),
    ((5,), (5, 4), (4,), 1, "the MatMul's A has rank 1"),
])
def test_a_matmul_that_is_not_of_two_matrices_is_not_fused(a_shape, b_shape, c_shape, out_rank, reason,
                                                           caplog) -> None:
    original = _matmul_add(c_shape, a_shape=a_shape, b_shape=b_shape, out_rank=out_rank)
    _refused(original, "MatMul", reason, caplog)


def test_a_matmul_of_unknown_rank_is_not_fused(caplog) -> None:
    """A is x reshaped to a graph input's shape of unknown length: its rank is not proved.

    (A graph input without a shape would say the same, but the checker refuses
    a graph input without one.) Here the feed makes it a matrix, so the model runs.
    """
    original = _matmul_add((4,))
    original.graph.input.append(_io("s", ["k"], np.int64))
    original.graph.node.insert(0, helper.make_node("Reshape", ["x", "s"], ["a"]))
    original.graph.node[1].input[0] = "a"
    feeds = {**_x_feed((3, 5)), "s": np.array([3, 5], np.int64)}
    _refused(original, "MatMul", "the rank of the MatMul's A is not known", caplog, feeds=feeds)


def test_a_matmul_used_twice_is_not_fused(caplog) -> None:
    original = _matmul_add((4,))
    original.graph.node.append(helper.make_node("Relu", ["m"], ["r"]))
    original.graph.output.append(_io("r", [3, 4]))
    _refused(original, "MatMul", "the MatMul's output has other users", caplog)


def test_a_matmul_output_that_is_a_graph_output_is_not_fused(caplog) -> None:
    original = _matmul_add((4,))
    original.graph.output.append(_io("m", [3, 4]))
    _refused(original, "MatMul", "the MatMul's output has other users (or is a graph output)", caplog)


@pytest.mark.parametrize("rows, c_shape, reason", [
    (1, (2, 4), "C of shape [2, 4] is not proven to broadcast to the MatMul's [1, 4]"),  # the Add makes [2, 4]
    ("n", (2, 4), "C of shape [2, 4] is not proven to broadcast to the MatMul's ['n', 4]"),  # [2, 4] for n = 1
    (3, (1, 3, 4), "C has rank 3: the Add broadcasts the MatMul's result"),  # the Add makes [1, 3, 4]
])
def test_a_c_that_broadcasts_the_product_is_not_fused(rows, c_shape, reason, caplog) -> None:
    original = _matmul_add(c_shape, rows=rows, out_rank=max(2, len(c_shape)))
    _refused(original, "MatMul", reason, caplog, feeds=_x_feed((1, 5)) if rows == "n" else None)


def test_a_c_of_unknown_shape_is_not_fused(caplog) -> None:
    original = _matmul_add(("k",), c_input=True)
    feeds = {**_x_feed((3, 5)), "c": RNG.standard_normal(4).astype(np.float32)}
    _refused(original, "MatMul", "C's shape is not known statically", caplog, feeds=feeds)


def test_matmul_add_before_opset_11_is_not_fused(caplog) -> None:
    _refused(_matmul_add((4,), opset=9), "MatMul", "opset 9 is before 11", caplog)


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_an_integer_matmul_add_is_not_fused(dtype, caplog) -> None:
    """Gemm's schema takes int32/int64 from opset 11, but onnxruntime has no integer Gemm kernel."""
    _refused(_matmul_add((4,), dtype), "MatMul", "onnxruntime has no integer Gemm kernel", caplog)


def test_onnxruntime_still_has_no_integer_gemm() -> None:
    """Why integers are refused: if this starts failing, matmul_add_into_gemm may accept them (exactly)."""
    model = helpers.node_model("Gemm", [("a", np.ones((2, 3), np.int64)), ("b", np.ones((3, 4), np.int64)),
                                        ("c", np.ones(4, np.int64))], [("y", np.int64)], opset=18)
    with pytest.raises(Exception, match="NOT_IMPLEMENTED"):
        helpers.ort_run(model, {"a": np.ones((2, 3), np.int64), "b": np.ones((3, 4), np.int64),
                                "c": np.ones(4, np.int64)})


def test_a_bfloat16_matmul_add_fuses() -> None:
    """Gemm-13 takes bfloat16 (its schema says so); onnxruntime's CPU runs neither form, so only the checker here."""
    original = _matmul_add((4,), ml_dtypes.bfloat16)
    result, stats = _simplify(original)
    assert _ops(result) == ["Gemm"] and stats["fused"] == 1, stats


def test_no_fuse_leaves_matmul_add(caplog) -> None:
    original = _matmul_add((4,))
    stats = _refused(original, "MatMul", "", caplog, fuse=False)
    assert "Gemm" not in _ops(_simplify(original, fuse=False)[0])
    assert "fusions/matmul_add_into_gemm" not in stats["declined"]


# --- subgraphs and functions ---------------------------------------------------------------------------


def test_fusion_in_if_branches() -> None:
    """Conv+BN in both branches: weights as Constant nodes in one, outer initializers in the other."""
    then = Net(inline=True, suffix="_then")
    then.bn(then.conv("x", "c"), "y")
    other = Net(suffix="_else")
    other.bn(other.conv("x", "c"), "y")

    def branch(net: Net, tag: str) -> onnx.GraphProto:
        return helper.make_graph(net.nodes, tag, [], [_io(net.name("y"), None)])

    if_node = helper.make_node("If", ["cond"], ["y"], then_branch=branch(then, "then"),
                               else_branch=branch(other, "else"))
    graph = helper.make_graph([if_node], "g", _image() + [_io("cond", [], np.bool_)], _out(),
                              initializer=other.initializers)
    original = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    result, stats = _simplify(original)
    assert "BatchNormalization" not in _ops(result) and stats["fused"] == 2, stats
    lifted = {i.name for i in result.graph.initializer}
    for branch_graph in (a.g for a in result.graph.node[0].attribute):
        conv = next(n for n in branch_graph.node if n.op_type == "Conv")
        assert set(conv.input[1:]) <= lifted, (conv.input, lifted)  # new constants: lifted to the main graph
        assert "Constant" not in [n.op_type for n in branch_graph.node]
    assert len(lifted) == 4  # W' and b' of each branch; the else branch's old weights were dead and are gone
    feeds = _feeds(original)
    for cond in (True, False):
        _close(original, result, {**feeds, "cond": np.array(cond)})


def _in_function(net: Net, inputs, outputs) -> onnx.ModelProto:
    function = helper.make_function("local", "F", ["x"], ["y"], net.nodes,
                                    opset_imports=[helper.make_opsetid("", 18)])
    call = helper.make_node("F", ["x"], ["y"], domain="local")
    graph = helper.make_graph([call], "g", inputs, outputs)
    return helper.make_model(graph, functions=[function],
                             opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("local", 1)])


def test_fusion_in_a_function() -> None:
    """Function bodies have no types or shapes; the rules read both from the constants."""
    net = Net(inline=True)
    t = net.bn(net.conv("x", "c"), "t")
    net.node("Mul", [t, net.weight("k", _random((4, 1, 1), signed=False))], ["y"])
    original = _in_function(net, _image(), _out())
    result, stats = _simplify(original)
    assert "BatchNormalization" not in _ops(result) and "Mul" not in _ops(result) and stats["fused"] == 2, stats
    assert [n.op_type for n in result.functions[0].node].count("Constant") == 2  # W' and b'
    _close(original, result)


def test_a_function_whose_weight_is_an_input_is_refused_cleanly(caplog) -> None:
    net = Net(inline=True)
    net.bn(net.conv("x", "c"), "y")
    net.nodes = [n for n in net.nodes if n.output[0] != "c_w"]
    function = helper.make_function("local", "F", ["x", "c_w"], ["y"], net.nodes,
                                    opset_imports=[helper.make_opsetid("", 18)])
    call = helper.make_node("F", ["x", "w"], ["y"], domain="local")
    graph = helper.make_graph([call], "g", _image() + [_io("w", [4, 3, 3, 3])], _out())
    original = helper.make_model(graph, functions=[function],
                                 opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("local", 1)])
    _refused(original, "BatchNormalization", "weight is not a constant", caplog)


def test_matmul_add_into_gemm_in_if_branches() -> None:
    """MatMul+Add on the outer x in both branches: weights as Constant nodes in one, outer initializers in the other."""
    branches = []
    initializers = []
    for net, tag in ((Net(inline=True, suffix="_then"), "then"), (Net(suffix="_else"), "else")):
        m = net.node("MatMul", ["x", net.weight("w", net.random((5, 4)))], ["m"])
        net.node("Add", [m, net.weight("c", net.random(4))], ["y"])
        branches.append(helper.make_graph(net.nodes, tag, [], [_io(net.name("y"), [3, 4])]))
        initializers += net.initializers
    if_node = helper.make_node("If", ["cond"], ["y"], then_branch=branches[0], else_branch=branches[1])
    graph = helper.make_graph([if_node], "g", [_io("x", [3, 5]), _io("cond", [], np.bool_)], [_io("y", [3, 4])],
                              initializer=initializers)
    original = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    result, stats = _simplify(original)
    assert sorted(_ops(result)) == ["Gemm", "Gemm", "If"], _ops(result)  # then's weights: lifted to initializers
    assert stats["applied"]["fusions/matmul_add_into_gemm"] == 2, stats
    for branch_graph in (a.g for a in result.graph.node[0].attribute):
        gemm = next(n for n in branch_graph.node if n.op_type == "Gemm")
        assert [o.name for o in branch_graph.output] == list(gemm.output)  # the branch output keeps its name
    feeds = _feeds(original)
    for cond in (True, False):
        _close(original, result, {**feeds, "cond": np.array(cond)})


def test_matmul_add_in_a_function_is_left_alone(caplog) -> None:
    """A function body has no inferred shapes: the ranks of A and B are not proved, so nothing fuses."""
    net = Net(inline=True)
    m = net.node("MatMul", ["x", net.weight("w", net.random((5, 4)))], ["m"])
    net.node("Add", [m, net.weight("c", net.random(4))], ["y"])
    original = _in_function(net, [_io("x", [3, 5])], [_io("y", [3, 4])])
    stats = _refused(original, "MatMul", "the rank of the MatMul's A is not known", caplog)
    assert stats["declined"]["fusions/matmul_add_into_gemm"] >= 1, stats
    assert "Gemm" not in _ops(_simplify(original)[0])


# --- end to end ---------------------------------------------------------------------------------------------


def test_the_command_fuses_and_its_check_passes(tmp_path, capsys) -> None:
    """Two Conv+BN layers (weights of its own seed: the test does not depend on the others' draws)."""
    net = Net(rng=np.random.default_rng(5))
    t = net.bn(net.conv("x", "c", cin=3, cout=8), "t", channels=8)
    r = net.node("Relu", [t], ["r"])
    net.bn(net.conv(r, "d", cin=8, cout=8), "y", channels=8)
    src, out = tmp_path / "conv_bn.onnx", tmp_path / "out.onnx"
    onnx.save(net.model([_io("x", [1, 3, 16, 16])], _out()), str(src))
    assert cli.main([str(src), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "fused=2" in printed and "check passed" in printed, printed
    assert _ops(onnx.load(str(out))) == ["Conv", "Relu", "Conv"]


def test_the_nofold_cnn_loses_its_batchnorms() -> None:
    path = REPO / "models" / "real" / "small_cnn_opset11_nofold.onnx"
    original = onnx.load(str(path))
    assert _ops(original).count("BatchNormalization") == 4
    result = passes.optimize(original)  # checks against onnxruntime at the default tolerance
    assert "BatchNormalization" not in _ops(result)
    unfused = passes.optimize(original, fuse=False, check=False)
    assert _ops(unfused).count("BatchNormalization") == 4
    assert len(_ops(result)) == len(_ops(unfused)) - 4


def _mlp_outputs(original: onnx.ModelProto, result: onnx.ModelProto) -> list[tuple[str, np.ndarray, np.ndarray]]:
    feeds = {"X": RNG.standard_normal((7, 8)).astype(np.float32)}
    expected, actual = helpers.ort_run(original, feeds), helpers.ort_run(result, feeds)
    names = [o.name for o in original.graph.output]
    assert names == [o.name for o in result.graph.output]
    found = []
    for name, a, b in zip(names, expected, actual):
        if isinstance(a, list):  # ZipMap: a list of {class: probability}
            a, b = np.array([list(d.values()) for d in a]), np.array([list(d.values()) for d in b])
        found.append((name, a, b))
    return found


def test_the_sklearn_mlp_keeps_its_layers_where_its_label_is_an_argmax() -> None:
    """The scikit-learn MLP's label is the ArgMax of its probabilities: a Gemm's rounding could move a
    near-tie to another class, so its two MatMul+Add layers stay (declined, with the reason), bit for bit."""
    path = REPO / "models" / "real" / "sk_mlp_opset13.onnx"
    original = onnx.load(str(path))
    assert _ops(original).count("MatMul") == 2 and "ArgMax" in _ops(original)
    result = passes.optimize(original)
    assert "Gemm" not in _ops(result) and _ops(result).count("MatMul") == 2, _ops(result)
    simplify = SimplifyPass()
    simplify(modelio.model_from_proto(original))  # a map-typed output (ZipMap): the project's loader
    stats = simplify.stats
    assert stats["declined"]["fusions/matmul_add_into_gemm: rounding amplified by ArgMax"] == 2, stats
    for name, a, b in _mlp_outputs(original, result):
        np.testing.assert_array_equal(b, a, err_msg=name)


def test_the_sklearn_mlp_gets_two_gemms_without_its_label() -> None:
    """Its probabilities alone: the two MatMul+Add layers become Gemm, as onnxruntime's basic level makes them."""
    path = REPO / "models" / "real" / "sk_mlp_opset13.onnx"
    original = onnx.load(str(path))
    kept = [o for o in original.graph.output if o.name == "output_probability"]
    del original.graph.output[:]
    original.graph.output.extend(kept)
    result = passes.optimize(original)  # checks against onnxruntime at the default tolerance
    unfused = passes.optimize(original, fuse=False, check=False)
    assert _ops(result).count("Gemm") == 2 and "MatMul" not in _ops(result), _ops(result)
    assert _ops(unfused).count("MatMul") == 2 and "Gemm" not in _ops(unfused)
    assert len(_ops(result)) == len(_ops(unfused)) - 2
    for name, a, b in _mlp_outputs(original, result):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.parametrize(("model", "reason"), [
    (lambda: _pad_conv([0, 0, 1, 1, 0, 0, 1, 1], mode="reflect"), "mode is reflect"),
    (lambda: _pad_conv([0, 0, 1, 1, 0, 0, 1, 1], value=0.5), "value is not +0"),
    (lambda: _pad_conv([0, 0, 1, 1, 0, 0, 1, 1], value=-0.0), "value is not +0"),
    (lambda: _pad_conv([0, 0, 1, 1, 0, 0, 1, 1], opset=10, value=-0.0), "value is not +0"),
    (lambda: _pad_conv([0, 0, 2, 1, 0, 0, -1, 1]), "crops"),
    (lambda: _pad_conv([0, 1, 1, 1, 0, 0, 1, 1], x_channels=3), "batch or channel axis"),
    (lambda: _pad_conv([0, 0, 1, 1, 0, 0, 1, 1], pads_input=True), "pads are not a constant"),
], ids=["reflect", "value", "minus-zero", "minus-zero-opset10", "negative", "channel", "pads-input"])
def test_a_pad_that_is_not_the_convs_padding_stays(model, reason, caplog) -> None:
    original = model()
    feeds = _feeds(original)
    if "pads" in feeds:
        feeds["pads"] = np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)
    _refused(original, "Pad", reason, caplog, feeds)


def test_a_pad_before_a_conv_with_auto_pad_stays(caplog) -> None:
    original = _pad_conv([0, 0, 1, 1, 0, 0, 1, 1])
    conv = next(n for n in original.graph.node if n.op_type == "Conv")
    conv.attribute.append(helper.make_attribute("auto_pad", "SAME_UPPER"))
    _refused(original, "Pad", "auto_pad is SAME_UPPER", caplog)


def test_a_pad_before_a_conv_with_auto_pad_valid_becomes_its_pads() -> None:
    original = pad_conv_auto_pad_valid()
    result, stats = _simplify(original)
    assert _ops(result) == ["Conv"] and stats["applied"] == {"fusions/pad_into_conv": 1}, stats
    conv = {a.name: helper.get_attribute_value(a) for a in result.graph.node[0].attribute}
    assert "auto_pad" not in conv and conv["pads"] == [0, 0, 1, 1] and conv["strides"] == [2, 2]
    _identical(original, result)


def test_a_pad_with_another_user_stays(caplog) -> None:
    original = _pad_conv([0, 0, 1, 1, 0, 0, 1, 1])
    original.graph.node.append(helper.make_node("Relu", ["padded"], ["r"]))
    original.graph.output.append(_io("r", [None] * 4))
    _refused(original, "Pad", "the Pad's output has other users", caplog)


def test_pads_add_up_with_the_convs_own() -> None:
    original = pad_conv()
    result, stats = _simplify(original)
    assert _ops(result) == ["Conv"] and stats["applied"] == {"fusions/pad_into_conv": 1}, stats
    conv = result.graph.node[0]
    assert list(conv.input)[0] == "x"
    assert helper.get_attribute_value(next(a for a in conv.attribute if a.name == "pads")) == [2, 2, 2, 2]
    _identical(original, result)  # onnxruntime's implicit padding is the same zeros in the same sums
