"""The fusions into standard ONNX ops: LayerNormalization (17), Gelu (20), RMSNormalization (23).

Each positive case builds the primitive form an exporter writes, runs the
simplify pass, and asserts that the checker accepts the result, the fused op
replaced the pattern, the pass counted it, and onnxruntime (its optimisations
disabled) computes the same within the check's tolerance on normal inputs,
on ``x * 30 + 5``, and on rows of edge values (±0, NaN, ±inf, ±1e30, constant
rows), where NaN, the infinities and the sign of every zero must be in the
same places. Each trap asserts the pattern stays, with its reason logged.
"""

from __future__ import annotations

import json
import logging
import pathlib

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import helper, numpy_helper

import helpers
from passes.cli import command as cli
from passes.simplify import SimplifyPass

LOGGER = "passes.simplify"
RNG = np.random.default_rng(23)
TOLERANCE = {np.float32: (1e-4, 1e-5), np.float16: (1e-2, 1e-3)}  # the check's (rtol, atol)


# --- building models ----------------------------------------------------------------------------------


class Net:
    """The nodes and constants of one graph (constants as initializers, or Constant nodes: ``inline``)."""

    def __init__(self, dtype=np.float32, opset: int = 18, inline: bool = False, suffix: str = "") -> None:
        self.dtype = np.dtype(dtype)
        self.opset = opset
        self.inline = inline
        self.suffix = suffix
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.count = 0

    def fresh(self, base: str) -> str:
        self.count += 1
        return f"{base}{self.count}{self.suffix}"

    def const(self, array, dtype=None) -> str:
        name = self.fresh("k")
        tensor = numpy_helper.from_array(np.asarray(array).astype(dtype or self.dtype), name)
        if self.inline:
            self.nodes.append(helper.make_node("Constant", [], [name], value=tensor))
        else:
            self.initializers.append(tensor)
        return name

    def op(self, op_type: str, *inputs: str, out: str | None = None, **attrs) -> str:
        name = out + self.suffix if out else self.fresh(op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [name], name=name, **attrs))
        return name

    def reduce_mean(self, x: str, axes, keepdims: int = 1) -> str:
        if self.opset >= 18:
            return self.op("ReduceMean", x, self.const(np.array(axes, np.int64), np.int64), keepdims=keepdims)
        return self.op("ReduceMean", x, axes=list(axes), keepdims=keepdims)


def _elem(dtype) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def value_info(name: str, shape, dtype=np.float32) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, _elem(dtype), shape)


def _model(net: Net, shape, out: str = "y") -> onnx.ModelProto:
    graph = helper.make_graph(net.nodes, "g", [value_info("x", list(shape), net.dtype)],
                              [value_info(out, [None] * len(shape), net.dtype)], initializer=net.initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", net.opset)])


def layer_norm(net: Net, x: str = "x", width: int = 16, axes=(-1,), eps: float = 1e-5, square: str = "pow",
               divide: str = "div", eps_first: bool = False, scale="vector", bias="vector", out: str = "y",
               var_axes=None, eps_outside: bool = False, exponent: float = 2.0, swap: bool = False) -> str:
    """The exporters' LayerNorm: ``(x - mean) / sqrt(mean((x - mean)^2) + eps) * scale + bias``."""
    mean = net.reduce_mean(x, axes)
    d = net.op("Sub", x, mean)
    sq = net.op("Pow", d, net.const(exponent)) if square == "pow" else net.op("Mul", d, d)
    var = net.reduce_mean(sq, var_axes or axes)
    eps_name = net.const(eps)
    if eps_outside:
        root = net.op("Add", net.op("Sqrt", var), eps_name)
    else:
        shifted = net.op("Add", eps_name, var) if eps_first else net.op("Add", var, eps_name)
        root = net.op("Sqrt", shifted)
    if divide == "div":
        n = net.op("Div", d, root)
    else:
        r = net.op("Div", net.const(1.0), root) if divide == "one_over" else net.op("Reciprocal", root)
        n = net.op("Mul", r, d) if swap else net.op("Mul", d, r)
    shape = (width,) if isinstance(scale, str) and scale == "vector" else scale
    last = n
    if scale is not None:
        s = net.const(RNG.uniform(0.5, 1.5, shape) * RNG.choice([-1, 1], shape))
        last = net.op("Mul", s, last) if swap else net.op("Mul", last, s)
    if bias is not None:
        shape = (width,) if isinstance(bias, str) and bias == "vector" else np.shape(bias)
        b = net.const(RNG.uniform(0.2, 1.0, shape) * RNG.choice([-1, 1], shape) if isinstance(bias, str) else bias)
        return net.op("Add", b, last, out=out) if swap else net.op("Add", last, b, out=out)
    return net.op("Identity", last, out=out)


# --- running and comparing ----------------------------------------------------------------------------


_simplify = helpers.simplify_checked


def _edge_rows(width: int, dtype) -> np.ndarray:
    """Rows of edge values: ±0, NaN, ±inf, ±1e30 (inf in float16), constant rows, tiny values."""
    rows = [[0.0] * width, [-0.0] * width, [-0.0, 0.0] * (width // 2), [0.1] * width, [1e4 + 0.1] * width,
            [np.nan] + [1.0] * (width - 1), [np.inf] + [1.0] * (width - 1), [-np.inf] + [1.0] * (width - 1),
            [np.inf, -np.inf] + [1.0] * (width - 2), [1e30, -1e30] + [1.0] * (width - 2), [1e30] + [0.0] * (width - 1),
            [1e-30, -1e-30] + [0.0] * (width - 2), [-0.0, 1.0, -1.0, 0.0] * (width // 4), list(range(width)),
            [300.0, -300.0] * (width // 2)]  # fmt: skip
    with np.errstate(over="ignore"):
        return np.array(rows, dtype=np.float64).astype(dtype)


def _feeds(shape, dtype, rng=None) -> list[np.ndarray]:
    """Normal inputs, ``x * 30 + 5``, and (for the last axis) the edge rows, tiled over the leading dims."""
    rng = rng or np.random.default_rng(0)
    shape = [2 if not isinstance(d, int) else d for d in shape]
    normal = rng.standard_normal(shape).astype(np.float32)
    edge = _edge_rows(shape[-1], dtype)
    count = int(np.prod(shape[:-1]))
    tiled = np.resize(edge, (-(-len(edge) // count) * count, shape[-1]))
    edges = [tiled[i : i + count].reshape(shape) for i in range(0, len(tiled), count)]
    return [normal.astype(dtype), (normal * 30 + 5).astype(dtype), *edges]


def _same(original: onnx.ModelProto, result: onnx.ModelProto, shape, dtype=np.float32, extra=None) -> None:
    """Within the check's tolerance, NaN/inf in the same places, and every zero of the same sign."""
    rtol, atol = TOLERANCE[np.dtype(dtype).type]
    for x in _feeds(shape, dtype):
        feeds = {"x": x, **(extra or {})}
        for expected, actual in zip(helpers.ort_run(original, feeds), helpers.ort_run(result, feeds)):
            assert expected.dtype == actual.dtype and expected.shape == actual.shape
            e, a = expected.astype(np.float64), actual.astype(np.float64)
            np.testing.assert_array_equal(np.isnan(a), np.isnan(e))
            np.testing.assert_array_equal(np.isinf(a), np.isinf(e))
            np.testing.assert_array_equal(a[np.isinf(a)], e[np.isinf(e)])
            zeros = (e == 0) & (a == 0)
            np.testing.assert_array_equal(np.signbit(a[zeros]), np.signbit(e[zeros]))
            finite = np.isfinite(e) & np.isfinite(a)
            np.testing.assert_allclose(a[finite], e[finite], rtol=rtol, atol=atol)
    assert [(o.name, o.type) for o in result.graph.output] == [(o.name, o.type) for o in original.graph.output]


def _ops(model: onnx.ModelProto) -> list[str]:
    return helpers.ops_recursive(model)


def _refused(original: onnx.ModelProto, reason: str, caplog, shape=(2, 5, 16), **options) -> dict:
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        result, stats = _simplify(original, **options)
    assert stats["fused"] == 0, stats
    assert sorted(_ops(result)) == sorted(_ops(original)) or "Identity" not in _ops(result), _ops(result)
    if reason:
        assert reason in caplog.text, caplog.text
    _same(original, result, shape, np.dtype(original_dtype(original)).type)
    return stats


def original_dtype(model: onnx.ModelProto):
    return helper.tensor_dtype_to_np_dtype(model.graph.input[0].type.tensor_type.elem_type)


# --- LayerNormalization -------------------------------------------------------------------------------

SHAPE = ("batch", 5, 16)
LAYER_NORMS = {
    "pow_div": dict(),
    "mul_square": dict(square="mul"),
    "reciprocal": dict(divide="reciprocal"),
    "reciprocal_swapped": dict(divide="reciprocal", swap=True),
    "one_over": dict(divide="one_over"),
    "eps_first": dict(eps_first=True),
    "bert_eps": dict(eps=1e-12),
    "no_scale": dict(scale=None),
    "scalar_scale": dict(scale=()),
    "leading_one_scale": dict(scale=(1, 1, 16)),
    "a fresh bias of +0": dict(bias=np.zeros(16)),  # nn.LayerNorm's initial bias
    "two_trailing_axes": dict(axes=(1, 2), width=16, scale=(5, 16), bias=RNG.uniform(0.2, 1.0, (5, 16))),
    "positive_axis": dict(axes=(2,)),
}


@pytest.mark.parametrize("name", sorted(LAYER_NORMS))
def test_layer_norm_fuses(name: str) -> None:
    net = Net()
    layer_norm(net, **LAYER_NORMS[name])
    original = _model(net, SHAPE)
    result, stats = _simplify(original)
    assert _ops(result) == ["LayerNormalization"], _ops(result)
    assert stats["applied"]["fusions/layer_norm"] == 1 and stats["fused"] == 1, stats
    node = result.graph.node[0]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    axes = LAYER_NORMS[name].get("axes", (-1,))
    assert attrs["axis"] == -len(axes) and attrs["stash_type"] == 1
    assert attrs["epsilon"] == np.float32(LAYER_NORMS[name].get("eps", 1e-5))
    _same(original, result, SHAPE)


def test_layer_norm_at_opset_17_reads_axes_attributes() -> None:
    net = Net(opset=17)
    layer_norm(net)
    original = _model(net, SHAPE)
    result, _ = _simplify(original)
    assert _ops(result) == ["LayerNormalization"]
    _same(original, result, SHAPE)


def test_layer_norm_float16_computes_its_statistics_in_float32() -> None:
    net = Net(np.float16)
    layer_norm(net, eps=1e-5)
    original = _model(net, SHAPE)
    result, stats = _simplify(original)
    assert _ops(result) == ["LayerNormalization"], stats
    assert {a.name: a.i for a in result.graph.node[0].attribute if a.name == "stash_type"} == {"stash_type": 1}
    _same(original, result, SHAPE, np.float16)


def test_a_float16_bias_with_a_zero_is_not_fused(caplog) -> None:
    """onnxruntime's float16 kernel gives some zeros of a zero-centred row the sign -0 before the bias."""
    net = Net(np.float16)
    layer_norm(net, bias=np.array([0.0] + [0.5] * 15))
    _refused(_model(net, SHAPE), "the FLOAT16 bias has a zero entry", caplog)


def test_a_float16_eps_is_the_value_float16_rounds_it_to() -> None:
    """1e-12 is 0 in float16: the primitive graph adds 0, so the fused op's epsilon is 0 too."""
    net = Net(np.float16)
    layer_norm(net, eps=1e-12)
    original = _model(net, SHAPE)
    result, _ = _simplify(original)
    assert [a.f for a in result.graph.node[0].attribute if a.name == "epsilon"] == [0.0]
    _same(original, result, SHAPE, np.float16)


def test_layer_norm_is_idempotent() -> None:
    net = Net()
    layer_norm(net)
    once, _ = _simplify(_model(net, SHAPE))
    twice, stats = _simplify(once)
    assert stats["applied"] == {} and _ops(twice) == ["LayerNormalization"]


def test_a_graph_without_the_pattern_is_left_alone() -> None:
    net = Net()
    net.op("Add", net.op("Relu", "x"), net.const(RNG.uniform(0.5, 1, 16)), out="y")
    original = _model(net, SHAPE)
    result, stats = _simplify(original)
    assert stats["applied"] == {} and _ops(result) == ["Relu", "Add"]


def test_two_layer_norms_in_a_row() -> None:
    net = Net()
    layer_norm(net, x=layer_norm(net, out="h"), out="y")
    original = _model(net, SHAPE)
    result, stats = _simplify(original)
    assert _ops(result) == ["LayerNormalization", "LayerNormalization"], stats
    _same(original, result, SHAPE)


LAYER_NORM_TRAPS = {
    "eps outside the root": (dict(eps_outside=True), "the divisor is not a square root"),
    "mismatched axes": (dict(axes=(-1,), var_axes=(-2,), width=16), "reduce different axes"),
    "not the trailing axes": (dict(axes=(1,), scale=None, bias=RNG.uniform(0.2, 1, (5, 1))), "are not the trailing"),
    "a cube": (dict(exponent=3.0), "the power is not a constant 2"),
    "no bias": (dict(bias=None), ""),  # the rule starts at the bias's Add
    "a bias with a -0": (dict(bias=np.array([-0.0] + [0.5] * 15)), "the bias has a -0 entry"),
    "a scale over other axes": (dict(scale=(5, 1)), "broadcasts over axes that are not normalised"),
    "a bias over other axes": (dict(bias=RNG.uniform(0.2, 1, (2, 1, 16))), "broadcasts over axes that are not"),
}


@pytest.mark.parametrize("trap", sorted(LAYER_NORM_TRAPS))
def test_layer_norm_trap(trap: str, caplog) -> None:
    options, reason = LAYER_NORM_TRAPS[trap]
    net = Net()
    layer_norm(net, **options)
    _refused(_model(net, SHAPE), reason, caplog)


def test_a_mean_used_elsewhere_keeps_the_pattern(caplog) -> None:
    net = Net()
    layer_norm(net, out="h")
    mean = next(n.output[0] for n in net.nodes if n.op_type == "ReduceMean")
    net.op("Add", "h", mean, out="y")
    _refused(_model(net, SHAPE), "the mean used by it alone", caplog)


def test_keepdims_0_is_not_a_layer_norm(caplog) -> None:
    net = Net()
    mean = net.reduce_mean("x", (-1,), keepdims=0)
    d = net.op("Sub", "x", net.op("Unsqueeze", mean, net.const(np.array([-1]), np.int64)))
    var = net.reduce_mean(net.op("Mul", d, d), (-1,))
    n = net.op("Div", d, net.op("Sqrt", net.op("Add", var, net.const(1e-5))))
    net.op("Add", n, net.const(RNG.uniform(0.5, 1, 16)), out="y")
    _refused(_model(net, SHAPE), "the numerator is not x - ReduceMean(x)", caplog)


def test_a_double_pattern_is_not_fused(caplog) -> None:
    net = Net(np.float64)
    layer_norm(net)
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        result, stats = _simplify(_model(net, SHAPE))
    assert stats["fused"] == 0 and "x is DOUBLE" in caplog.text


def test_below_opset_17_it_is_counted_as_fusable_at_a_higher_opset(caplog) -> None:
    net = Net(opset=16)
    layer_norm(net)
    stats = _refused(_model(net, SHAPE), "LayerNormalization is an op from opset 17", caplog)
    assert stats["fusable_at_higher_opset"] == {"LayerNormalization@17": 1}, stats


def test_no_fuse_leaves_the_layer_norm() -> None:
    net = Net()
    layer_norm(net)
    original = _model(net, SHAPE)
    result, stats = _simplify(original, fuse=False)
    assert "LayerNormalization" not in _ops(result) and stats["fused"] == 0
    assert "fusable_at_higher_opset" not in stats


def test_layer_norm_in_if_branches() -> None:
    """In both branches of an If: constants as Constant nodes in one, outer initializers in the other."""
    branches, initializers = [], []
    for net in (Net(inline=True, suffix="_then"), Net(suffix="_else")):
        layer_norm(net)
        branches.append(helper.make_graph(net.nodes, "b" + net.suffix, [], [value_info("y" + net.suffix, [2, 5, 16])]))
        initializers += net.initializers
    if_node = helper.make_node("If", ["cond"], ["y"], then_branch=branches[0], else_branch=branches[1])
    graph = helper.make_graph([if_node], "g", [value_info("x", [2, 5, 16]), value_info("cond", [], np.bool_)], [value_info("y", [2, 5, 16])],
                              initializer=initializers)
    original = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    result, stats = _simplify(original)
    assert stats["applied"]["fusions/layer_norm"] == 2, stats
    assert [op for op in _ops(result) if op != "Constant"] == ["If", "LayerNormalization", "LayerNormalization"]
    for cond in (True, False):
        _same(original, result, (2, 5, 16), extra={"cond": np.array(cond)})


def _in_function(net: Net, shape) -> onnx.ModelProto:
    function = helper.make_function("local", "F", ["x"], ["y"], net.nodes,
                                    opset_imports=[helper.make_opsetid("", net.opset)])
    call = helper.make_node("F", ["x"], ["y"], domain="local")
    graph = helper.make_graph([call], "g", [value_info("x", list(shape), net.dtype)], [value_info("y", list(shape), net.dtype)])
    return helper.make_model(graph, functions=[function],
                             opset_imports=[helper.make_opsetid("", net.opset), helper.make_opsetid("local", 1)])


def test_layer_norm_in_a_function_is_left_alone(caplog) -> None:
    """A function body has no shapes: the normalised shape is not proved, so it does not fuse."""
    net = Net(inline=True)
    layer_norm(net)
    _refused(_in_function(net, (2, 5, 16)), "the rank of x is not known", caplog, shape=(2, 5, 16))


def test_the_command_fuses_a_layer_norm_and_its_check_passes(tmp_path: pathlib.Path, capsys) -> None:
    net = Net(opset=17)
    layer_norm(net, x=net.op("Relu", "x"))
    src, out, report = tmp_path / "ln.onnx", tmp_path / "out.onnx", tmp_path / "r.json"
    onnx.save(_model(net, (1, 8, 16)), str(src))
    assert cli.main([str(src), "-o", str(out), "--report", str(report)]) == 0
    assert "check passed" in capsys.readouterr().out
    assert _ops(onnx.load(str(out))) == ["Relu", "LayerNormalization"]
    runs = {r["name"]: r for r in json.loads(report.read_text())["passes"]}
    assert runs["simplify"]["stats"]["applied"]["fusions/layer_norm"] == 1
    assert cli.main([str(src), "-o", str(out), "--no-fuse", "-q"]) == 0
    assert "LayerNormalization" not in _ops(onnx.load(str(out)))


def test_the_onnxruntime_probe_finds_the_kernels() -> None:
    from passes.verify.probe import runs_op

    shapes = ((2, 4), (4,), (4,))
    assert runs_op("LayerNormalization", 18, onnx.TensorProto.FLOAT, shapes, (("axis", -1),))
    assert runs_op("LayerNormalization", 18, onnx.TensorProto.FLOAT16, shapes, (("axis", -1),))
    assert not runs_op("Gelu", 18, onnx.TensorProto.FLOAT, ((2, 4),))  # Gelu is an op from opset 20


# --- Gelu ------------------------------------------------------------------------------------------------

SQRT2, SQRT_2_PI = float(np.sqrt(2.0)), float(np.sqrt(2.0 / np.pi))


def gelu_erf(net: Net, x: str = "x", order: str = "torch", argument: str = "div", divisor: float = SQRT2,
             half: float = 0.5, out: str = "y") -> str:
    """``x · 0.5 · (1 + Erf(x / √2))`` in the association ``order`` exporters write."""
    if argument == "div":
        arg = net.op("Div", x, net.const(divisor))
    else:
        arg = net.op("Mul", net.const(1.0 / divisor), x)
    plus = net.op("Add", net.const(1.0), net.op("Erf", arg))
    if order == "torch":  # torch.onnx's nn.GELU: (x · (1 + erf)) · 0.5
        return net.op("Mul", net.op("Mul", x, plus), net.const(half), out=out)
    if order == "hf":  # HF's x * 0.5 * (1.0 + erf(...)): (x · 0.5) · (1 + erf)
        return net.op("Mul", net.op("Mul", x, net.const(half)), plus, out=out)
    return net.op("Mul", x, net.op("Mul", net.const(half), plus), out=out)  # x · (0.5 · (1 + erf))


def gelu_tanh(net: Net, x: str = "x", cube: str = "pow", coefficient: float = 0.044715, scale: float = SQRT_2_PI,
              out: str = "y") -> str:
    """GPT-2's ``0.5 · x · (1 + Tanh(√(2/π) · (x + 0.044715 · x³)))``."""
    x3 = net.op("Pow", x, net.const(3.0)) if cube == "pow" else net.op("Mul", net.op("Mul", x, x), x)
    total = net.op("Add", x, net.op("Mul", net.const(coefficient), x3))
    plus = net.op("Add", net.op("Tanh", net.op("Mul", total, net.const(scale))), net.const(1.0))
    return net.op("Mul", net.op("Mul", net.const(0.5), x), plus, out=out)


GELUS = {
    "erf_torch_order": (gelu_erf, dict(), "none"),
    "erf_hf_order": (gelu_erf, dict(order="hf"), "none"),
    "erf_nested_order": (gelu_erf, dict(order="nested"), "none"),
    "erf_times_reciprocal": (gelu_erf, dict(argument="mul"), "none"),
    "tanh_pow": (gelu_tanh, dict(), "tanh"),
    "tanh_cube_by_products": (gelu_tanh, dict(cube="mul"), "tanh"),
}


@pytest.mark.parametrize("name", sorted(GELUS))
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["float32", "float16"])
def test_gelu_fuses(name: str, dtype) -> None:
    build, options, approximate = GELUS[name]
    net = Net(dtype, opset=20)
    build(net, **options)
    original = _model(net, SHAPE)
    result, stats = _simplify(original)
    assert _ops(result) == ["Gelu"], _ops(result)
    assert [helper.get_attribute_value(a) for a in result.graph.node[0].attribute] == [approximate.encode()]
    assert stats["applied"] == {"fusions/gelu": 1}, stats
    _same(original, result, SHAPE, dtype)


def test_gelu_is_idempotent_and_leaves_other_products() -> None:
    net = Net(opset=20)
    g = gelu_erf(net, out="g")
    net.op("Mul", net.op("Mul", g, "x"), net.const(0.5), out="y")  # x · 0.5 · Gelu(x): not a Gelu
    once, stats = _simplify(_model(net, SHAPE))
    assert sorted(_ops(once)) == ["Gelu", "Mul", "Mul"], stats
    twice, stats = _simplify(once)
    assert stats["applied"] == {}


GELU_TRAPS = {
    "a division by 1.5": (gelu_erf, dict(divisor=1.5), "the Erf's argument is not x / √2"),
    "a division by 1.41421 (not √2 in float32)": (gelu_erf, dict(divisor=1.41421), "not x / √2"),
    "0.6 instead of 0.5": (gelu_erf, dict(half=0.6), "the constant factor is not 0.5"),
    "a tanh coefficient of 0.0447": (gelu_tanh, dict(coefficient=0.0447), "coefficient is not 0.044715"),
    "a tanh scale that is not √(2/π)": (gelu_tanh, dict(scale=0.8), "not √(2/π) times a sum"),
}


@pytest.mark.parametrize("trap", sorted(GELU_TRAPS))
def test_gelu_trap(trap: str, caplog) -> None:
    build, options, reason = GELU_TRAPS[trap]
    net = Net(opset=20)
    build(net, **options)
    _refused(_model(net, SHAPE), reason, caplog)


def test_the_tanh_form_never_becomes_erf_nor_erf_tanh() -> None:
    net = Net(opset=20)
    gelu_erf(net, out="e")
    gelu_tanh(net, x="e", out="y")
    result, _ = _simplify(_model(net, SHAPE))
    modes = [helper.get_attribute_value(n.attribute[0]) for n in result.graph.node]
    assert modes == [b"none", b"tanh"]


def test_below_opset_20_gelu_is_counted_as_fusable_at_a_higher_opset(caplog) -> None:
    net = Net(opset=18)
    gelu_erf(net, out="e")
    gelu_tanh(net, x="e", out="y")
    stats = _refused(_model(net, SHAPE), "Gelu is an op from opset 20", caplog)
    assert stats["fusable_at_higher_opset"] == {"Gelu@20": 2}, stats


def test_a_double_gelu_is_not_fused(caplog) -> None:
    from passes.verify.probe import runs_op

    assert not runs_op("Gelu", 20, onnx.TensorProto.DOUBLE, ((2, 4),))  # no approximate="none" kernel
    net = Net(np.float64, opset=20)
    gelu_tanh(net)
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        result, stats = _simplify(_model(net, SHAPE))
    assert stats["fused"] == 0 and "x is DOUBLE" in caplog.text


def test_no_fuse_leaves_the_gelu() -> None:
    net = Net(opset=20)
    gelu_erf(net)
    result, stats = _simplify(_model(net, SHAPE), fuse=False)
    assert "Gelu" not in _ops(result) and stats["applied"] == {}


def test_gelu_in_if_branches_and_a_function() -> None:
    branches, initializers = [], []
    for net, build in ((Net(opset=20, inline=True, suffix="_then"), gelu_erf),
                       (Net(opset=20, suffix="_else"), gelu_tanh)):  # fmt: skip
        build(net)
        branches.append(helper.make_graph(net.nodes, "b" + net.suffix, [], [value_info("y" + net.suffix, [2, 5, 16])]))
        initializers += net.initializers
    if_node = helper.make_node("If", ["cond"], ["y"], then_branch=branches[0], else_branch=branches[1])
    graph = helper.make_graph([if_node], "g", [value_info("x", [2, 5, 16]), value_info("cond", [], np.bool_)], [value_info("y", [2, 5, 16])],
                              initializer=initializers)
    original = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    result, stats = _simplify(original)
    assert stats["applied"]["fusions/gelu"] == 2, stats
    for cond in (True, False):
        _same(original, result, (2, 5, 16), extra={"cond": np.array(cond)})

    net = Net(opset=20, inline=True)
    gelu_tanh(net)
    original = _in_function(net, (2, 5, 16))
    result, stats = _simplify(original)
    assert stats["applied"] == {"fusions/gelu": 1} and [n.op_type for n in result.functions[0].node] == ["Gelu"]
    _same(original, result, (2, 5, 16))


def test_the_command_fuses_gelu_at_target_20_and_counts_it_below(tmp_path: pathlib.Path, capsys) -> None:
    net = Net(opset=17)
    gelu_erf(net, x=net.op("Relu", "x"))
    src, out, report = tmp_path / "gelu.onnx", tmp_path / "out.onnx", tmp_path / "r.json"
    onnx.save(_model(net, (1, 8, 16)), str(src))
    assert cli.main([str(src), "-o", str(out), "--report", str(report), "-q"]) == 0
    stats = {r["name"]: r for r in json.loads(report.read_text())["passes"]}["simplify"]["stats"]
    assert stats["fusable_at_higher_opset"] == {"Gelu@20": 1}, stats
    assert cli.main([str(src), "-o", str(out), "--target-opset", "20", "--report", str(report)]) == 0
    assert "check passed" in capsys.readouterr().out
    assert _ops(onnx.load(str(out))) == ["Relu", "Gelu"]


# --- RMSNormalization -----------------------------------------------------------------------------------


def rms_norm(net: Net, x: str = "x", width: int = 16, eps: float = 1e-6, widen: bool = False, divide: str = "rsqrt",
             square: str = "pow", axes=(-1,), eps_outside: bool = False, swap: bool = False, out: str = "y") -> str:
    """Llama's/T5's ``weight * (x * rsqrt(mean(x²) + eps))``, the statistics in float32 when ``widen``."""
    xs = net.op("Cast", x, to=onnx.TensorProto.FLOAT) if widen else x
    stats = np.float32 if widen else None
    sq = net.op("Pow", xs, net.const(2.0, stats)) if square == "pow" else net.op("Mul", xs, xs)
    var = net.reduce_mean(sq, axes)
    if eps_outside:
        root = net.op("Add", net.op("Sqrt", var), net.const(eps, stats))
    else:
        root = net.op("Sqrt", net.op("Add", var, net.const(eps, stats)))
    if divide == "div":
        n = net.op("Div", xs, root)
    else:  # rsqrt: Reciprocal(root), or TorchScript's Div(1, root)
        one = {"one_over": 1.0, "two_over": 2.0}.get(divide)
        inverse = net.op("Div", net.const(one, stats), root) if one is not None else net.op("Reciprocal", root)
        n = net.op("Mul", xs, inverse)
    if widen:
        n = net.op("Cast", n, to=_elem(net.dtype))
    weight = net.const(RNG.uniform(0.5, 1.5, width) * RNG.choice([-1, 1], width))
    return net.op("Mul", n, weight, out=out) if swap else net.op("Mul", weight, n, out=out)


RMS_NORMS = {
    "t5": (np.float32, dict()),
    "div": (np.float32, dict(divide="div", swap=True)),
    "one_over": (np.float32, dict(divide="one_over")),
    "llama_one_over_widened": (np.float16, dict(divide="one_over", widen=True)),
    "mul_square": (np.float32, dict(square="mul")),
    "llama_float16_widened": (np.float16, dict(widen=True)),
    "float16": (np.float16, dict(eps=1e-5)),
}


@pytest.mark.parametrize("name", sorted(RMS_NORMS))
def test_rms_norm_fuses(name: str) -> None:
    dtype, options = RMS_NORMS[name]
    net = Net(dtype, opset=23)
    rms_norm(net, **options)
    original = _model(net, SHAPE)
    result, stats = _simplify(original)
    assert _ops(result) == ["RMSNormalization"], _ops(result)
    assert stats["applied"] == {"fusions/rms_norm": 1}, stats
    attrs = {a.name: helper.get_attribute_value(a) for a in result.graph.node[0].attribute}
    assert attrs["axis"] == -1 and attrs["stash_type"] == 1
    _same(original, result, SHAPE, dtype)
    again, stats = _simplify(result)
    assert stats["applied"] == {}


RMS_TRAPS = {
    "eps outside the root": (dict(eps_outside=True), "the divisor is not a square root"),
    "not the trailing axis": (dict(axes=(1,)), "are not the trailing axes"),
    "2 over the root": (dict(divide="two_over"), "no input is x / sqrt(mean(x²) + eps)"),
}


@pytest.mark.parametrize("trap", sorted(RMS_TRAPS))
def test_rms_norm_trap(trap: str, caplog) -> None:
    options, reason = RMS_TRAPS[trap]
    net = Net(opset=23)
    rms_norm(net, **options)
    _refused(_model(net, SHAPE), reason, caplog)


def test_a_widened_rms_norm_not_cast_back_is_not_fused(caplog) -> None:
    """Statistics in float32 and a float32 weight: the output is float32, not x's float16."""
    net = Net(np.float32, opset=23)
    xs = net.op("Cast", "x", to=onnx.TensorProto.FLOAT)
    var = net.reduce_mean(net.op("Mul", xs, xs), (-1,))
    n = net.op("Mul", xs, net.op("Reciprocal", net.op("Sqrt", net.op("Add", var, net.const(1e-6)))))
    net.op("Mul", net.const(RNG.uniform(0.5, 1.5, 16)), n, out="y")
    graph = helper.make_graph(net.nodes, "g", [value_info("x", list(SHAPE), np.float16)], [value_info("y", [None] * 3)],
                              initializer=net.initializers)
    original = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        result, stats = _simplify(original)
    assert stats["fused"] == 0 and "the result is not cast back to x's type" in caplog.text, stats


def test_below_opset_23_rms_norm_is_counted_as_fusable_at_a_higher_opset(caplog) -> None:
    net = Net(opset=20)
    rms_norm(net)
    stats = _refused(_model(net, SHAPE), "RMSNormalization is an op from opset 23", caplog)
    assert stats["fusable_at_higher_opset"] == {"RMSNormalization@23": 1}, stats


def test_no_fuse_leaves_the_rms_norm() -> None:
    net = Net(opset=23)
    rms_norm(net)
    result, stats = _simplify(_model(net, SHAPE), fuse=False)
    assert "RMSNormalization" not in _ops(result) and stats["applied"] == {}


def test_rms_norm_in_if_branches_but_not_in_a_function(caplog) -> None:
    branches, initializers = [], []
    for net in (Net(opset=23, inline=True, suffix="_then"), Net(opset=23, suffix="_else")):
        rms_norm(net)
        branches.append(helper.make_graph(net.nodes, "b" + net.suffix, [], [value_info("y" + net.suffix, [2, 5, 16])]))
        initializers += net.initializers
    if_node = helper.make_node("If", ["cond"], ["y"], then_branch=branches[0], else_branch=branches[1])
    graph = helper.make_graph([if_node], "g", [value_info("x", [2, 5, 16]), value_info("cond", [], np.bool_)], [value_info("y", [2, 5, 16])],
                              initializer=initializers)
    original = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    result, stats = _simplify(original)
    assert stats["applied"]["fusions/rms_norm"] == 2, stats
    for cond in (True, False):
        _same(original, result, (2, 5, 16), extra={"cond": np.array(cond)})

    net = Net(opset=23, inline=True)
    rms_norm(net)
    _refused(_in_function(net, (2, 5, 16)), "the rank of x is not known", caplog, shape=(2, 5, 16))


def test_a_layer_norm_at_opset_23_is_a_layer_norm_not_an_rms_norm_of_x_minus_mean() -> None:
    net = Net(opset=23)
    layer_norm(net)
    original = _model(net, SHAPE)
    result, stats = _simplify(original)
    assert _ops(result) == ["LayerNormalization"], stats
    _same(original, result, SHAPE)


def test_the_command_fuses_rms_norm_at_target_23(tmp_path: pathlib.Path, capsys) -> None:
    net = Net(np.float16, opset=18)
    rms_norm(net, x=net.op("Relu", "x"), widen=True)
    src, out, report = tmp_path / "rms.onnx", tmp_path / "out.onnx", tmp_path / "r.json"
    onnx.save(_model(net, (1, 8, 16)), str(src))
    assert cli.main([str(src), "-o", str(out), "--report", str(report), "-q"]) == 0
    stats = {r["name"]: r for r in json.loads(report.read_text())["passes"]}["simplify"]["stats"]
    assert stats["fusable_at_higher_opset"] == {"RMSNormalization@23": 1}, stats
    assert cli.main([str(src), "-o", str(out), "--target-opset", "23"]) == 0
    assert "check passed" in capsys.readouterr().out
    assert _ops(onnx.load(str(out))) == ["Relu", "RMSNormalization"]


def test_onnxruntime_is_imported_only_once_a_pattern_is_found() -> None:
    """The probe imports onnxruntime; simplify on a model without these patterns never asks it."""
    import subprocess
    import sys

    code = ("import sys, onnx_ir as ir; from passes.simplify import SimplifyPass; "
            "m = ir.load(sys.argv[1]); SimplifyPass()(m); print('onnxruntime' in sys.modules)")  # fmt: skip
    demo = pathlib.Path(__file__).resolve().parent.parent / "models" / "demo.onnx"
    found = subprocess.run([sys.executable, "-c", code, str(demo)], capture_output=True, text=True, check=True)
    assert found.stdout.strip() == "False", found.stderr


def test_a_long_chain_of_products_is_not_walked_from_every_mul(monkeypatch: pytest.MonkeyPatch) -> None:
    """3,000 Muls in a row: the Gelu rule reads at most five factors from each (not the chain: O(n²))."""
    from passes.simplify.fusions import gelu as gelu_module

    net = Net(opset=20)
    value = "x"
    for _ in range(3000):
        value = net.op("Mul", value, net.const(1.0001))
    net.op("Identity", value, out="y")
    model = ir.serde.deserialize_model(_model(net, (4,)))
    calls = []
    original = gelu_module.sole_user
    monkeypatch.setattr(gelu_module, "sole_user", lambda v: calls.append(v) or original(v))
    SimplifyPass()(model)
    assert len(calls) < 10 * 3000, len(calls)


@pytest.mark.parametrize("build, opset, op", [(layer_norm, 18, "LayerNormalization"), (gelu_erf, 20, "Gelu"),
                                              (rms_norm, 23, "RMSNormalization")])  # fmt: skip
def test_no_kernel_in_onnxruntime_means_no_fusion(build, opset, op, monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    """The probe's answer decides (here a runtime that lacks the kernel, for every type)."""
    from passes.verify import probe

    monkeypatch.setattr(probe, "runs_op", lambda *args: False)
    net = Net(opset=opset)
    build(net)
    _refused(_model(net, SHAPE), f"onnxruntime's CPU provider has no {op}-{opset} kernel for FLOAT", caplog)
