"""Every fusion rule produces the shape its pattern produces (``passes/simplify/fusions/accept.py``).

A pattern's output is the broadcast of everything its ops read: a constant of a higher rank than ``x``
(``x * 0.5 * (1 + Erf(x / √2))`` with a ``[1, 1]`` 0.5 on a rank-1 ``x``: ``[1, 8]``) raises it, where the
fused op's output has ``x``'s shape (Gelu: ``[8]``). The fusions check that for every rule alike. Property
tests over each family: one constant of the pattern given the shapes ``[]``, ``[1]``, ``[1, 1]``, ... on ``x``
of rank 1 to 3 (4 for RotaryEmbedding, the Conv's 4 for the fusions into weights, 2 for Gemm); the fusion
never applies where the constant's rank is higher than the output's (a rule may refuse more shapes on its
own), applies to the pattern as exporters write it, and onnxruntime gives the original's shape and values
either way. Then the check's hint: "rounding-sized" only for outputs of the same
shape that differ.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import pathlib
from collections.abc import Callable

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import helpers
from passes.cli import command as cli
from passes.cli.hints import check_hint
from passes.report import ModelSummary, PassRun, Report
from passes.verify.compare import compare
from passes.verify.result import CheckResult, FirstDifference

SQRT2 = float(np.sqrt(2.0))


@dataclasses.dataclass
class Pattern:
    """A fusion's primitive pattern on ``x``, with its constants by name; ``target`` is the one reshaped."""

    nodes: list[onnx.NodeProto]
    constants: dict[str, np.ndarray]
    opset: int
    fused: str  # the op the fusion writes (or the op it removes, for the fusions into weights: "-Mul")
    inputs: dict[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)


def _node(op, *inputs, out, **attrs):
    return helper.make_node(op, list(inputs), [out], name=out, **attrs)


def gelu(width: int) -> Pattern:
    nodes = [_node("Div", "x", "sqrt2", out="d"), _node("Erf", "d", out="e"), _node("Add", "e", "one", out="p"),
             _node("Mul", "x", "half", out="h"), _node("Mul", "h", "p", out="y")]  # fmt: skip
    return Pattern(nodes, {"sqrt2": np.float32(SQRT2), "one": np.float32(1), "half": np.float32(0.5)}, 20, "Gelu")


def layer_norm(width: int) -> Pattern:
    rng = np.random.default_rng(width)
    nodes = [_node("ReduceMean", "x", "axes", out="m"), _node("Sub", "x", "m", out="d"),
             _node("Pow", "d", "two", out="sq"), _node("ReduceMean", "sq", "axes", out="v"),
             _node("Add", "v", "eps", out="ve"), _node("Sqrt", "ve", out="r"), _node("Div", "one", "r", out="inv"),
             _node("Mul", "d", "inv", out="n"), _node("Mul", "n", "scale", out="s"), _node("Add", "s", "bias", out="y")]
    constants = {"axes": np.array([-1], np.int64), "two": np.float32(2), "eps": np.float32(1e-5), "one": np.float32(1),
                 "scale": rng.uniform(0.5, 1.5, width).astype(np.float32),
                 "bias": rng.uniform(0.2, 1.0, width).astype(np.float32)}  # fmt: skip
    return Pattern(nodes, constants, 18, "LayerNormalization")


def rms_norm(width: int) -> Pattern:
    rng = np.random.default_rng(width)
    nodes = [_node("Pow", "x", "two", out="sq"), _node("ReduceMean", "sq", "axes", out="v"),
             _node("Add", "v", "eps", out="ve"), _node("Sqrt", "ve", out="r"), _node("Div", "x", "r", out="n"),
             _node("Mul", "scale", "n", out="y")]  # fmt: skip
    constants = {"axes": np.array([-1], np.int64), "two": np.float32(2), "eps": np.float32(1e-6),
                 "scale": rng.uniform(0.5, 1.5, width).astype(np.float32)}
    return Pattern(nodes, constants, 23, "RMSNormalization")


def rotary(width: int) -> Pattern:
    """``x * cos + Concat(x2 * -1, x1) * sin`` on x ``[2, 3, 5, 8]`` with constant caches (equal halves)."""
    angles = np.arange(5)[:, None] * (1.0 / 10000 ** (np.arange(0, 8, 2) / 8))[None]
    emb = np.concatenate([angles, angles], axis=-1)[None, None]
    ints = {name: np.array([v], np.int64) for name, v in (("zero", 0), ("four", 4), ("end", 8), ("last", -1))}
    nodes = [_node("Slice", "x", "zero", "four", "last", out="x1"), _node("Slice", "x", "four", "end", "last", out="x2"),
             _node("Mul", "x2", "minus", out="nx2"), _node("Concat", "nx2", "x1", out="rot", axis=-1),
             _node("Mul", "x", "cos", out="a"), _node("Mul", "rot", "sin", out="b"), _node("Add", "a", "b", out="y")]
    constants = {**ints, "minus": np.float32(-1), "cos": np.cos(emb).astype(np.float32),
                 "sin": np.sin(emb).astype(np.float32)}
    return Pattern(nodes, constants, 23, "RotaryEmbedding")


def mul_into_conv(width: int) -> Pattern:
    """``Conv(x, W, b) * c`` on x ``[2, 3, 6, 6]``: c per output channel."""
    rng = np.random.default_rng(1)
    nodes = [_node("Conv", "x", "w", "b", out="c"), _node("Mul", "c", "k", out="y")]
    constants = {"w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "b": rng.standard_normal(4).astype(np.float32),
                 "k": rng.uniform(0.5, 1.5, (4, 1, 1)).astype(np.float32)}  # fmt: skip
    return Pattern(nodes, constants, 18, "-Mul")


def matmul_add(width: int) -> Pattern:
    rng = np.random.default_rng(2)
    nodes = [_node("MatMul", "x", "w", out="m"), _node("Add", "m", "c", out="y")]
    constants = {"w": rng.standard_normal((width, 5)).astype(np.float32), "c": np.float32(0.5)}
    return Pattern(nodes, constants, 18, "Gemm")


#: family: (builder, the constants to reshape, x's ranks, how x's shape is made from its rank)
FAMILIES: dict[str, tuple[Callable[[int], Pattern], tuple[str, ...], tuple[int, ...]]] = {
    "gelu": (gelu, ("sqrt2", "one", "half"), (1, 2, 3)),
    "layer_norm": (layer_norm, ("two", "eps", "one", "scale", "bias"), (1, 2, 3)),
    "rms_norm": (rms_norm, ("two", "eps", "scale"), (1, 2, 3)),
    "rotary": (rotary, ("minus", "cos", "sin"), (4,)),
    "mul_into_conv": (mul_into_conv, ("k",), (4,)),
    "matmul_add": (matmul_add, ("c",), (2,)),
}
X_SHAPES = {"rotary": (2, 3, 5, 8), "mul_into_conv": (2, 3, 6, 6), "matmul_add": (3, 8)}


def _x_shape(family: str, rank: int) -> tuple[int, ...]:
    return X_SHAPES.get(family, (2, 3, 8)[-rank:])


def build(family: str, rank: int, target: str, extra: int, *, function: bool = False) -> tuple[onnx.ModelProto, int]:
    """The family's pattern with ``target`` given ``extra`` leading dims of 1 more than it has (its values
    kept), and the rank of the pattern's output."""
    maker = FAMILIES[family][0]
    shape = _x_shape(family, rank)
    pattern = maker(shape[-1])
    array = pattern.constants[target]
    pattern.constants[target] = array.reshape((1,) * extra + array.shape)
    out_rank = max(len(shape), pattern.constants[target].ndim) if family != "mul_into_conv" else max(
        4, pattern.constants[target].ndim)  # fmt: skip
    tensors = [numpy_helper.from_array(np.asarray(a), name) for name, a in pattern.constants.items()]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * out_rank)
    imports = [helper.make_opsetid("", pattern.opset)]
    if not function:
        graph = helper.make_graph(pattern.nodes, "g", [x], [y], initializer=tensors)
        return helper.make_model(graph, opset_imports=imports, ir_version=10), out_rank
    constants = [helper.make_node("Constant", [], [t.name], value=t) for t in tensors]
    body = helper.make_function("local", "F", ["x"], ["y"], constants + pattern.nodes, imports)
    graph = helper.make_graph([helper.make_node("F", ["x"], ["y"], domain="local")], "g", [x], [y])
    return helper.make_model(graph, opset_imports=[*imports, helper.make_opsetid("local", 1)], functions=[body],
                             ir_version=10), out_rank  # fmt: skip


def _fused(family: str, result: onnx.ModelProto) -> bool:
    op = FAMILIES[family][0](8).fused
    ops = helpers.ops_recursive(result)
    return op[1:] not in ops if op.startswith("-") else op in ops


def _same_in_onnxruntime(original: onnx.ModelProto, result: onnx.ModelProto, shape: tuple[int, ...]) -> None:
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    expected, actual = helpers.ort_run(original, {"x": x})[0], helpers.ort_run(result, {"x": x})[0]
    assert actual.shape == expected.shape
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5)


@settings(max_examples=40, deadline=None)
@given(family=st.sampled_from(sorted(FAMILIES)), data=st.data())
def test_a_fusion_applies_exactly_where_its_output_has_the_patterns_shape(family: str, data) -> None:
    _, targets, ranks = FAMILIES[family]
    rank = data.draw(st.sampled_from(ranks), label="rank of x")
    target = data.draw(st.sampled_from(targets), label="constant")
    base = np.asarray(FAMILIES[family][0](_x_shape(family, rank)[-1]).constants[target]).ndim
    most = 4 - base if target == "minus" else 5  # the rotated halves' Concat takes one rank
    extra = data.draw(st.integers(0, most), label="leading ones")
    original, out_rank = build(family, rank, target, extra)
    result, stats = helpers.simplify_checked(original, full_check=False)
    x_rank = len(_x_shape(family, rank))
    fused = _fused(family, result)
    if fused:  # never where the constant raises the pattern's rank (a rule may refuse more shapes on its own)
        assert base + extra <= x_rank and out_rank == x_rank, (stats, base + extra)
    if extra == 0:  # the pattern as exporters write it: fused
        assert fused, stats
    _same_in_onnxruntime(original, result, _x_shape(family, rank))


@settings(max_examples=12, deadline=None)
@given(target=st.sampled_from(("sqrt2", "one", "half")), extra=st.integers(0, 3))
def test_in_a_function_body_gelu_takes_only_scalars(target: str, extra: int) -> None:
    """A function body has no shapes: the rank of x is unknown, so only rank-0 constants prove nothing broadcasts."""
    original, _ = build("gelu", 1, target, extra, function=True)
    result, _ = helpers.simplify_checked(original, full_check=False)
    assert _fused("gelu", result) == (extra == 0)
    _same_in_onnxruntime(original, result, (8,))


@pytest.mark.parametrize("function", [False, True], ids=["main graph", "function"])
def test_the_issues_gelu_keeps_its_shape_through_the_command(function: bool, tmp_path: pathlib.Path, caplog) -> None:
    """``x * 0.5 * (1 + Erf(x / √2))``, 0.5 a ``[1, 1]`` constant, x ``[8]``: the output is ``[1, 8]``; the fusion
    is declined with the reason, and the command exits 0 (it exited 1 with a "rounding-sized" hint)."""
    original, _ = build("gelu", 1, "half", 2, function=function)
    src, out = tmp_path / "gelu.onnx", tmp_path / "out.onnx"
    onnx.save(original, str(src))
    with caplog.at_level(logging.DEBUG, logger="passes.simplify"):
        assert cli.main([str(src), "-o", str(out), "--target-opset", "20", "-q"]) == 0
    why = "the rank of the fused op's output is not known" if function else "broadcasts the pattern's output to rank 2"
    assert why in caplog.text
    result = onnx.load(str(out))
    assert "Gelu" not in helpers.ops_recursive(result)
    x = np.linspace(-3, 3, 8, dtype=np.float32)
    assert helpers.ort_run(result, {"x": x})[0].shape == helpers.ort_run(original, {"x": x})[0].shape == (1, 8)


# --- the check's hint -------------------------------------------------------------------------------------


def _hints(*outputs) -> list[str]:
    summary = ModelSummary({}, 0, 0, 0, {"": 20})
    check = CheckResult(False, outputs=list(outputs), first_difference=FirstDifference(pass_name="simplify"))
    report = Report("in.onnx", "out.onnx", summary, summary, [PassRun("simplify", 0.1, True, {"fused": 1})], check)
    return check_hint(report)


def test_the_rounding_hint_needs_outputs_of_the_same_shape_that_differ() -> None:
    x = np.linspace(-3, 3, 8, dtype=np.float32)
    wider = compare("y", x.reshape(1, 8), x, 1e-7, 1e-7)  # the issue's Gelu: [8] where the original is [1, 8]
    assert not wider.ok and wider.max_abs_error == 0
    hints = _hints(wider)
    assert any("--no-fuse" in h for h in hints) and not any("rounding-sized" in h for h in hints), hints
    signs = compare("y", np.array([0.0, 1.0], np.float32), np.array([-0.0, 1.0], np.float32), 1e-7, 1e-7)
    assert not signs.ok and not any("rounding-sized" in h for h in _hints(signs))  # the sign of a zero: no rounding
    rounded = compare("y", x, x + np.float32(1e-6), 1e-7, 1e-7)
    assert not rounded.ok and any("rounding-sized (max abs" in h for h in _hints(rounded))
    assert math.isclose(rounded.max_abs_error, 1e-6, rel_tol=0.2)
