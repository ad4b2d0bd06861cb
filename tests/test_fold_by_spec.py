"""Folds onnxruntime has no kernel for, kept by the spec (issue #34, item 9b).

onnxruntime's CPU provider has no bfloat16 Add: a bfloat16 constant chain was
left unfolded (unconfirmed). Where onnxruntime has no kernel for the node
itself and the spec fixes every bit of the result (``confirm.SPEC_FIXED``),
refimpl's value is kept and counted in ``stats["by_spec"]``; its inputs are
still confirmed, and a transcendental op stays unconfirmed. refimpl's
bfloat16 arithmetic is the spec's: computed in float32, rounded once to
nearest even; checked against ml_dtypes and against onnxruntime's own
float32 kernels and its bfloat16 Cast.
"""

from __future__ import annotations

import json
import pathlib

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import pytest
from hypothesis import given, strategies as st
from onnx import TensorProto, helper, numpy_helper

import passes
import refimpl
from helpers import ort_run
from passes.fold import ConstantFoldingPass

BF16, F32 = TensorProto.BFLOAT16, TensorProto.FLOAT
BF = np.dtype(ml_dtypes.bfloat16)


def _bits(values: list[float] | np.ndarray) -> np.ndarray:
    return np.asarray(values, np.float32).astype(BF)


def _tensor(name: str, array: np.ndarray) -> onnx.TensorProto:
    return helper.make_tensor(name, BF16, array.shape, array.view(np.uint16).tobytes(), raw=True)


#: Edge values of bfloat16 and, in pairs with B, sums that land on a tie (1 + 2**-8 is halfway
#: between 1 and 1 + 2**-7: to even, 1; 1 + 3 * 2**-8: to even, 1 + 2**-6), overflow, subnormals.
A = _bits([1.0, 1.0078125, 0.0, -0.0, np.inf, -np.inf, np.nan, 3.3895314e38, 9.18355e-41, -1.5, 2.0**-133, 1.0])
B = _bits([2.0**-8, 2.0**-8, -0.0, -0.0, 1.0, np.inf, 1.0, 3.3895314e38, 9.18355e-41, 1.5, 2.0**-133, -1.0])


def _spec_add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The spec's bfloat16 Add: in float32, rounded once to nearest even (ml_dtypes' conversion)."""
    with np.errstate(all="ignore"):  # inf - inf and the overflow are meant
        return (a.astype(np.float32) + b.astype(np.float32)).astype(BF)


def _same(expected: np.ndarray, actual: np.ndarray) -> None:
    """Equal bit for bit where not NaN (the sign of zero included), NaN in the same places."""
    e, a = np.asarray(expected).astype(np.float32), np.asarray(actual).astype(np.float32)
    assert e.shape == a.shape
    assert np.array_equal(np.isnan(e), np.isnan(a))
    keep = ~np.isnan(e)
    assert e[keep].view(np.uint32).tolist() == a[keep].view(np.uint32).tolist()


def _fold(proto: onnx.ModelProto) -> tuple[onnx.ModelProto, ConstantFoldingPass]:
    model = ir.serde.deserialize_model(proto)
    fold_pass = ConstantFoldingPass()
    out = ir.serde.serialize_model(fold_pass(model).model)
    onnx.checker.check_model(out, full_check=True)
    json.dumps(fold_pass.stats)
    return out, fold_pass


def _chain(where: str = "main") -> onnx.ModelProto:
    """``y = x * Cast(Add(a, b), float)`` with bfloat16 constants a, b (main graph, If branch, function)."""
    x, y = helper.make_tensor_value_info("x", F32, [len(A)]), helper.make_tensor_value_info("y", F32, [len(A)])
    chain = [helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Cast", ["s"], ["sf"], to=F32),
             helper.make_node("Mul", ["x", "sf"], ["y"])]  # fmt: skip
    opsets = [helper.make_opsetid("", 18)]
    if where == "main":
        graph = helper.make_graph(chain, "g", [x], [y], [_tensor("a", A), _tensor("b", B)])
        return helper.make_model(graph, opset_imports=opsets, ir_version=8)
    constants = [helper.make_node("Constant", [], ["a"], value=_tensor("a", A)),
                 helper.make_node("Constant", [], ["b"], value=_tensor("b", B))]  # fmt: skip
    if where == "branch":
        then = helper.make_graph(constants + chain, "then", [], [y])
        other = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [],
                                  [helper.make_tensor_value_info("e", F32, [len(A)])])  # fmt: skip
        graph = helper.make_graph([helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)], "g",
                                  [helper.make_tensor_value_info("c", TensorProto.BOOL, []), x], [y])  # fmt: skip
        return helper.make_model(graph, opset_imports=opsets, ir_version=8)
    function = helper.make_function("local", "Scale", ["x"], ["y"], constants + chain, opsets)
    graph = helper.make_graph([helper.make_node("Scale", ["x"], ["y"], domain="local")], "g", [x], [y])
    return helper.make_model(graph, opset_imports=[*opsets, helper.make_opsetid("local", 1)], ir_version=8,
                             functions=[function])  # fmt: skip


def _nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    found, graphs = [], [model.graph, *model.functions]
    for graph in graphs:
        for node in graph.node:
            found.append(node)
            graphs += [a.g for a in node.attribute if a.HasField("g")]
    return found


@pytest.mark.parametrize("where", ["main", "branch", "function"])
def test_a_bfloat16_add_onnxruntime_has_no_kernel_for_is_folded_by_the_spec(where: str) -> None:
    proto = _chain(where)
    with pytest.raises(Exception, match="Could not find an implementation for Add"):
        ort_run(proto, {"x": np.ones(len(A), np.float32)} | ({"c": np.array(True)} if where == "branch" else {}))
    out, fold_pass = _fold(proto)
    assert fold_pass.stats["by_spec"] == {"Add": 1}
    assert fold_pass.stats["unconfirmed"] == {} and fold_pass.stats["confirmed"] == 1  # the Cast, in onnxruntime
    assert [n.op_type for n in _nodes(out) if n.op_type not in ("Constant", "If", "Identity", "Scale")] == ["Mul"]
    x = np.ones(len(A), np.float32)
    feeds = {"x": x} | ({"c": np.array(True)} if where == "branch" else {})
    (got,) = ort_run(out, feeds)  # the folded model runs in onnxruntime; the original does not
    _same(_spec_add(A, B).astype(np.float32), got)
    assert got[:2].tolist() == [1.0, 1.015625]  # the two ties, to even


def test_the_command_folds_it_and_says_so(tmp_path: pathlib.Path, capsys) -> None:
    from passes.cli import command

    src, out = tmp_path / "bf16.onnx", tmp_path / "out.onnx"
    onnx.save(_chain(), src)
    assert command.main([str(src), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "by_spec: Add x1" in text
    assert "NOT CHECKED: the original model does not load in onnxruntime" in text  # it never could
    assert [n.op_type for n in onnx.load(out).graph.node] == ["Mul"]


def test_the_inputs_of_a_fold_by_the_spec_are_still_confirmed(monkeypatch: pytest.MonkeyPatch) -> None:
    """``Add(Cast(f, bfloat16), b)``: the Cast has a kernel; made wrong in refimpl, onnxruntime
    disagrees with it, and the Add by the spec, which read it, is undone too."""
    f = numpy_helper.from_array(np.array([1.0, 2.5, -3.0], np.float32), "f")
    proto = helper.make_model(helper.make_graph(
        [helper.make_node("Cast", ["f"], ["fb"], to=BF16), helper.make_node("Add", ["fb", "b"], ["s"]),
         helper.make_node("Cast", ["s"], ["sf"], to=F32), helper.make_node("Mul", ["x", "sf"], ["y"])], "g",
        [helper.make_tensor_value_info("x", F32, [3])], [helper.make_tensor_value_info("y", F32, [3])],
        [f, _tensor("b", _bits([0.5, 0.25, 2.0]))]), opset_imports=[helper.make_opsetid("", 18)], ir_version=8)  # fmt: skip
    out, fold_pass = _fold(proto)
    assert fold_pass.stats["by_spec"] == {"Add": 1} and [n.op_type for n in out.graph.node] == ["Mul"]
    run = refimpl.run

    def wrong_cast(op, inputs, attrs, **kwargs):
        results = run(op, inputs, attrs, **kwargs)
        if op == "Cast" and attrs.get("to") == BF16:
            return [(r.astype(np.float32) + 1).astype(BF) for r in results]
        return results

    monkeypatch.setattr(refimpl, "run", wrong_cast)
    out, fold_pass = _fold(proto)
    # the first Cast disagrees; the Add and the Cast that read it take its verdict (each "reads the
    # result of" the one before): nothing is kept by the spec, every node stays
    assert fold_pass.stats["disagrees_with_onnxruntime"] == {"Cast": 2, "Add": 1}
    assert fold_pass.stats["by_spec"] == {} and fold_pass.stats["confirmed"] == 0
    assert [n.op_type for n in out.graph.node] == ["Cast", "Add", "Cast", "Mul"]


@pytest.mark.parametrize("op", ["Exp", "Relu"])
def test_an_op_whose_result_the_spec_leaves_open_stays_unconfirmed(op: str) -> None:
    """bfloat16 Exp (its last bit) and Relu (the sign of max(-0, 0)): no kernel, and the spec does not
    fix every bit: not folded."""
    proto = helper.make_model(helper.make_graph(
        [helper.make_node(op, ["a"], ["e"]), helper.make_node("Cast", ["e"], ["ef"], to=F32),
         helper.make_node("Mul", ["x", "ef"], ["y"])], "g",
        [helper.make_tensor_value_info("x", F32, [len(A)])], [helper.make_tensor_value_info("y", F32, [len(A)])],
        [_tensor("a", A)]), opset_imports=[helper.make_opsetid("", 18)], ir_version=8)  # fmt: skip
    out, fold_pass = _fold(proto)
    assert fold_pass.stats["by_spec"] == {} and fold_pass.stats["unconfirmed"] == {op: 1, "Cast": 1}
    assert [n.op_type for n in out.graph.node] == [op, "Cast", "Mul"]


def test_an_integer_relu_onnxruntime_has_no_kernel_for_is_folded_by_the_spec() -> None:
    """int16 Relu: no kernel in onnxruntime's CPU provider; max(x, 0) is exact."""
    k = numpy_helper.from_array(np.array([-3, 0, 7, -32768, 32767], np.int16), "k")
    i16 = TensorProto.INT16
    proto = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["k"], ["r"]), helper.make_node("Add", ["r", "i"], ["y"])], "g",
        [helper.make_tensor_value_info("i", i16, [5])], [helper.make_tensor_value_info("y", i16, [5])], [k]),
        opset_imports=[helper.make_opsetid("", 18)], ir_version=8)  # fmt: skip
    out, fold_pass = _fold(proto)
    assert fold_pass.stats["by_spec"] == {"Relu": 1} and [n.op_type for n in out.graph.node] == ["Add"]
    (got,) = ort_run(out, {"i": np.zeros(5, np.int16)})
    assert got.tolist() == [0, 0, 7, 0, 32767]


# --- refimpl's bfloat16 arithmetic is the spec's ------------------------------------------------------

_BINARY = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide}


def _onnxruntime_in_float32(op: str, inputs: list[np.ndarray]) -> np.ndarray:
    """onnxruntime's float32 ``op`` on the bfloat16 inputs widened by its Cast, rounded to bfloat16 by its
    Cast: the spec's computation, with onnxruntime's kernels (it has these in float32 and bfloat16 Cast)."""
    names = [f"in{i}" for i in range(len(inputs))]
    nodes = [helper.make_node("Cast", [n], [f"{n}f"], to=F32) for n in names]
    nodes += [helper.make_node(op, [f"{n}f" for n in names], ["r"]), helper.make_node("Cast", ["r"], ["rb"], to=BF16),
              helper.make_node("Cast", ["rb"], ["out"], to=F32)]  # fmt: skip
    graph = helper.make_graph(nodes, "g", [], [helper.make_tensor_value_info("out", F32, None)],
                              [_tensor(n, a) for n, a in zip(names, inputs)])  # fmt: skip
    (out,) = ort_run(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8), {})
    return out


def _refimpl(op: str, inputs: list[np.ndarray]) -> np.ndarray:
    with np.errstate(all="ignore"):
        (out,) = refimpl.run(op, inputs, {}, opset=18)
    assert out.dtype == BF
    return out


@pytest.mark.parametrize("op", ["Sqrt", "Reciprocal", "Neg", "Abs"])
def test_every_bfloat16_value_of_a_unary_op_is_the_spec_s(op: str) -> None:
    x = np.arange(1 << 16, dtype=np.uint16).view(BF)
    ours = _refimpl(op, [x])
    spec = {"Sqrt": np.sqrt, "Reciprocal": lambda v: 1 / v, "Neg": np.negative, "Abs": np.abs}[op]
    with np.errstate(all="ignore"):
        _same(spec(x.astype(np.float32)).astype(BF), ours)
    _same(_onnxruntime_in_float32(op, [x]), ours)


@pytest.mark.parametrize("op", sorted(_BINARY))
def test_a_million_bfloat16_pairs_of_a_binary_op_are_the_spec_s(op: str) -> None:
    rng = np.random.default_rng(34)
    a = rng.integers(0, 1 << 16, 1 << 20, dtype=np.uint16).view(BF)
    b = rng.integers(0, 1 << 16, 1 << 20, dtype=np.uint16).view(BF)
    a, b = np.concatenate([a, np.repeat(A, len(B))]), np.concatenate([b, np.tile(B, len(A))])  # every edge pair
    ours = _refimpl(op, [a, b])
    with np.errstate(all="ignore"):
        _same(_BINARY[op](a.astype(np.float32), b.astype(np.float32)).astype(BF), ours)
    _same(_onnxruntime_in_float32(op, [a, b]), ours)


@given(st.lists(st.integers(0, (1 << 16) - 1), min_size=1, max_size=64), st.data(), st.sampled_from(sorted(_BINARY)))
def test_bfloat16_arithmetic_property(bits: list[int], data: st.DataObject, op: str) -> None:
    """Any bit patterns (NaN, infinities, subnormals, ±0): refimpl equals ml_dtypes' float32-then-round and
    onnxruntime's float32 kernel rounded by its bfloat16 Cast."""
    other = data.draw(st.lists(st.integers(0, (1 << 16) - 1), min_size=len(bits), max_size=len(bits)))
    a, b = np.array(bits, np.uint16).view(BF), np.array(other, np.uint16).view(BF)
    ours = _refimpl(op, [a, b])
    with np.errstate(all="ignore"):
        _same(_BINARY[op](a.astype(np.float32), b.astype(np.float32)).astype(BF), ours)
    _same(_onnxruntime_in_float32(op, [a, b]), ours)


def test_cast_to_bfloat16_is_onnxruntime_s_bit_for_bit() -> None:
    """Cast float32 -> bfloat16 (onnxruntime has the kernel): round to nearest even, confirmed by it."""
    rng = np.random.default_rng(7)
    f = np.concatenate([rng.integers(0, 1 << 32, 1 << 18, dtype=np.uint64).astype(np.uint32).view(np.float32),
                        np.array([1 + 2**-8, 1 + 3 * 2**-8, 3.3961776e38, -0.0, np.inf, 1e-40], np.float32)])  # fmt: skip
    (ours,) = refimpl.run("Cast", [f], {"to": BF16}, opset=19)
    graph = helper.make_graph([helper.make_node("Cast", ["f"], ["b"], to=BF16), helper.make_node("Cast", ["b"], ["out"], to=F32)],
                              "g", [], [helper.make_tensor_value_info("out", F32, None)], [numpy_helper.from_array(f, "f")])  # fmt: skip
    (theirs,) = ort_run(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9), {})
    _same(theirs, ours)
    _same(f.astype(BF), ours)


def test_no_op_a_float32_chain_is_confirmed_not_by_the_spec() -> None:
    proto = helper.make_model(helper.make_graph(
        [helper.make_node("Add", ["a", "a"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y"])], "g",
        [helper.make_tensor_value_info("x", F32, [3])], [helper.make_tensor_value_info("y", F32, [3])],
        [numpy_helper.from_array(np.array([1.0, -0.0, np.inf], np.float32), "a")]),
        opset_imports=[helper.make_opsetid("", 18)], ir_version=8)  # fmt: skip
    out, fold_pass = _fold(proto)
    assert fold_pass.stats["by_spec"] == {} and fold_pass.stats["confirmed"] == 1
    assert passes  # the package imports (the API) stay light
