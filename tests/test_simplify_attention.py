"""Scaled dot-product attention into Attention (opset 23): ``passes/simplify/fusions/attention.py``.

Each positive case builds a form an exporter writes (BERT's ``Transpose(perm=[0, 2, 3, 1])`` of K,
Llama's ``[0, 1, 3, 2]``, the scale as Mul, Div or split between Q and Kᵀ, masks that cannot fully
mask a row), runs the simplify pass, and asserts that the checker accepts the result, one Attention
replaced the chain (no Softmax left), the pass counted it, and onnxruntime (its optimisations
disabled) computes the same: NaN, the infinities and the sign of every zero in the same places,
finite values within the check's tolerance, on normal inputs, ``x * 30 + 5`` and edge values (±0,
NaN, ±inf, ±float max, ±1e30) in Q, K and V. Each trap asserts the chain stays, with its reason
logged. ``test_simplify_attention_ort.py`` pins what onnxruntime 1.32's kernel does (the module's
conditions rest on it) and runs tiny BERT, GPT-2 and Llama exports.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import helpers
from test_simplify_standard_fusions import Net, value_info

LOGGER = "passes.simplify"
B, H, S, L, D = 2, 3, 4, 5, 8
LOWEST = float(np.finfo(np.float32).min)
RULE = "fusions/attention"


# --- building models ----------------------------------------------------------------------------------


def chain(net: Net, q: str = "q", k: str = "k", v: str = "v", out: str = "y", layout: str = "llama",
          scale: str = "mul", factor: float = D**-0.5, mask: str | None = None, mask_first: bool = False,
          axis: int = -1) -> dict[str, str]:  # fmt: skip
    """``MatMul(Softmax(scale · Q @ Kᵀ [+ mask]), V)``; returns the intermediates by name."""
    kt = net.op("Transpose", k, perm=[0, 2, 3, 1] if layout == "bert" else [0, 1, 3, 2])
    if scale in ("split", "split_input"):  # sdpa: MatMul(Q · √s, Kᵀ · √s)
        root = net.const(np.sqrt(factor)) if scale == "split" else net.op("Sqrt", "s")
        scores = net.op("MatMul", net.op("Mul", q, root), net.op("Mul", kt, root))
        scaled = scores
    else:
        scores = net.op("MatMul", q, kt)
        if scale == "mul":
            scaled = net.op("Mul", scores, net.const(factor))
        elif scale == "div":
            scaled = net.op("Div", scores, net.const(1 / factor))
        elif scale == "vector":  # one scale per key: not a scalar
            scaled = net.op("Mul", scores, net.const(np.full(L, factor)))
        elif scale == "input":
            scaled = net.op("Mul", scores, "s")
        else:
            scaled = scores
    logits = scaled
    if mask is not None:
        logits = net.op("Add", mask, scaled) if mask_first else net.op("Add", scaled, mask)
    probs = net.op("Softmax", logits, axis=axis)
    y = net.op("MatMul", probs, v, out=out)
    return {"scores": scores, "scaled": scaled, "probs": probs, "y": y}


def masks(net: Net, kind: str) -> tuple[str | None, list[onnx.ValueInfoProto]]:
    """A mask of ``kind`` and the graph inputs it reads."""
    if kind == "none":
        return None, []
    if kind == "constant":
        causal = np.triu(np.full((S, L), -1e9), k=2)
        return net.const(causal[None, None]), []
    if kind == "constant_2d":
        return net.const(np.random.default_rng(0).standard_normal((S, L))), []
    if kind == "constant_partly_minus_inf":  # no row fully masked: -inf and the lowest float in some entries
        mask = np.zeros((1, 1, S, L))
        mask[0, 0, 0, :4] = -np.inf
        mask[0, 0, 1, 1:] = LOWEST
        mask[0, 0, 2, ::2] = [-np.inf, LOWEST, -np.inf]
        return net.const(mask), []
    if kind in ("constant_full_row", "constant_full_row_inf"):
        mask = np.zeros((1, 1, S, L))
        mask[0, 0, 1] = LOWEST if kind == "constant_full_row" else -np.inf
        mask[0, 0, 2, :2] = -np.inf  # a partly masked row is fine
        return net.const(mask), []
    if kind == "input":
        return "m", [value_info("m", [B, 1, S, L])]
    if kind.startswith("where"):
        value = {"where_lowest": LOWEST, "where_inf": -np.inf, "where_1e4": -1e4}[kind]
        zero = net.const(0.0)
        return net.op("Where", "m", zero, net.const(value)), [value_info("m", [B, 1, S, L], np.bool_)]
    if kind in ("bert_legacy", "bert_legacy_lowest"):  # (1 - mask) · -10000 (or finfo.min) of an int64 [B, L]
        expanded = net.op("Unsqueeze", net.op("Unsqueeze", "m", net.const([1], np.int64)), net.const([1], np.int64))
        inverted = net.op("Sub", net.const(1.0), net.op("Cast", expanded, to=TensorProto.FLOAT))
        full = net.op("Expand", inverted, net.const([B, 1, S, L], np.int64))
        factor = -1e4 if kind == "bert_legacy" else LOWEST
        return net.op("Mul", full, net.const(factor)), [value_info("m", [B, L], np.int64)]
    raise ValueError(kind)


def model(opset: int = 23, mask: str = "none", layout: str = "llama", batch=B, q_batch=None,
          outputs: tuple[str, ...] = (), **options) -> onnx.ModelProto:  # fmt: skip
    net = Net()
    mask_value, mask_inputs = masks(net, mask)
    named = chain(net, layout=layout, mask=mask_value, **options)
    k_shape = [batch, L, H, D] if layout == "bert" else [batch, H, L, D]
    inputs = [value_info("q", [q_batch or batch, H, S, D]), value_info("k", k_shape), value_info("v", [batch, H, L, D]), *mask_inputs]
    if options.get("scale") in ("input", "split_input"):
        inputs.append(value_info("s", []))
    extra = [value_info(named[o], [batch, H, S, L]) for o in outputs]
    graph = helper.make_graph(net.nodes, "g", inputs, [value_info("y", [batch, H, S, D]), *extra],
                              initializer=net.initializers)  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


# --- running and comparing ----------------------------------------------------------------------------


def _edges() -> np.ndarray:
    return np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 3.4028235e38, -3.4028235e38, 1e30, -1e30, 1.0, -1.0,
                     0.3, -0.7, 1e-3], np.float32)  # fmt: skip


def _feeds(original: onnx.ModelProto, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Normal, scaled and edge-valued Q, K, V; masks of every kind, fully masked rows included."""
    rng = np.random.default_rng(seed)
    inputs = {i.name: i for i in original.graph.input}
    found = []
    for kind in ("normal", "scaled", *("edges",) * 8):
        feeds: dict[str, np.ndarray] = {}
        for name in ("q", "k", "v"):
            shape = tuple(d.dim_value for d in inputs[name].type.tensor_type.shape.dim)
            if kind == "edges":
                feeds[name] = rng.choice(_edges(), size=shape)
            else:
                normal = rng.standard_normal(shape)
                feeds[name] = (normal * 30 + 5 if kind == "scaled" else normal).astype(np.float32)
        if "m" in inputs:
            info = inputs["m"].type.tensor_type
            shape = tuple(d.dim_value for d in info.shape.dim)
            keep = rng.random(shape) < 0.6
            if len(shape) == 4:  # a fully masked row
                keep[0, 0, 1, :] = False
            else:  # a fully padded sequence
                keep[0, :] = False
            if info.elem_type == TensorProto.BOOL:
                feeds["m"] = keep
            elif info.elem_type == TensorProto.INT64:
                feeds["m"] = np.where(keep, 1, rng.choice([0, -(2**63), 2**63 - 1], size=shape)).astype(np.int64)
            else:
                feeds["m"] = np.where(keep, 0.0, -1e4).astype(np.float32)
        if "s" in inputs:
            feeds["s"] = np.array(0.25, np.float32)
        found.append(feeds)
    return found


def same_values(expected: np.ndarray, actual: np.ndarray) -> None:
    """NaN, inf and the sign of zero exactly; finite values within the check's tolerance."""
    assert expected.dtype == actual.dtype and expected.shape == actual.shape
    e, a = expected.astype(np.float64), actual.astype(np.float64)
    np.testing.assert_array_equal(np.isnan(a), np.isnan(e))
    infinite = np.isinf(a) | np.isinf(e)
    np.testing.assert_array_equal(a[infinite], e[infinite])
    zeros = (e == 0) & (a == 0)
    np.testing.assert_array_equal(np.signbit(a[zeros]), np.signbit(e[zeros]))
    finite = np.isfinite(e) & np.isfinite(a)
    np.testing.assert_allclose(a[finite], e[finite], rtol=1e-4, atol=1e-5)


def _same(original: onnx.ModelProto, result: onnx.ModelProto) -> None:
    for feeds in _feeds(original):
        for expected, actual in zip(helpers.ort_run(original, feeds), helpers.ort_run(result, feeds)):
            same_values(expected, actual)


def _fused(original: onnx.ModelProto, count: int = 1) -> onnx.ModelProto:
    result, stats = helpers.simplify_checked(original)
    ops = helpers.ops_recursive(result)
    assert ops.count("Attention") == count and "Softmax" not in ops, ops
    assert stats["applied"].get(RULE) == count and stats["fused"] >= count, stats
    return result


def _refused(original: onnx.ModelProto, reason: str, caplog) -> dict:
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        result, stats = helpers.simplify_checked(original)
    assert "Attention" not in helpers.ops_recursive(result) and RULE not in stats["applied"], stats
    assert "Softmax" in helpers.ops_recursive(result)
    assert reason in caplog.text, caplog.text
    return stats


# --- fusing -------------------------------------------------------------------------------------------

FORMS = {
    "llama_layout_mul": dict(),
    "bert_layout_mul": dict(layout="bert"),
    "div_by_a_power_of_two": dict(scale="div", factor=0.25),
    "sdpa_split_scale_by_powers_of_two": dict(scale="split", factor=0.25),  # head size 16: √s = 0.5
    "sdpa_split_scale_of_8_to_the_minus_quarter": dict(scale="split"),  # kept on Q and K: scale 1
    "no_scale": dict(scale="none"),
    "constant_causal_mask": dict(mask="constant"),
    "constant_2d_mask_first": dict(mask="constant_2d", mask_first=True),
    "constant_mask_partly_minus_inf_and_lowest": dict(mask="constant_partly_minus_inf"),
    "float_mask_where_minus_1e4": dict(mask="where_1e4"),
    "bert_legacy_int_mask": dict(mask="bert_legacy", layout="bert"),
}


@pytest.mark.parametrize("name", sorted(FORMS))
def test_attention_fuses(name: str) -> None:
    original = model(**FORMS[name])
    result = _fused(original)
    node = next(n for n in result.graph.node if n.op_type == "Attention")
    scale = next(a.f for a in node.attribute if a.name == "scale")
    options = FORMS[name]
    kept = options.get("scale") == "split" and "factor" not in options
    expected = 1.0 if options.get("scale") == "none" or kept else options.get("factor", D**-0.5)
    assert scale == pytest.approx(expected, rel=1e-6)
    assert len(node.input) == (3 if FORMS[name].get("mask", "none") == "none" else 4)
    if FORMS[name].get("layout") == "bert":  # one Transpose of K's [B, L, H, D] to [B, H, L, D]
        key = next(n for n in result.graph.node if n.output[0] == node.input[1])
        assert key.op_type == "Transpose" and list(key.attribute[0].ints) == [0, 2, 1, 3]
    _same(original, result)


def test_a_split_scale_that_is_not_a_power_of_two_stays_on_q_and_k() -> None:
    """8^-¼ on Q and Kᵀ: Q keeps its Mul, K is Mul(K, 8^-¼) (the Transpose gone), scale 1: the chain's rounding."""
    result = _fused(model(scale="split"))
    node = next(n for n in result.graph.node if n.op_type == "Attention")
    producers = {o: n for n in result.graph.node for o in n.output}
    assert producers[node.input[0]].op_type == "Mul" and producers[node.input[1]].op_type == "Mul"
    assert producers[node.input[1]].input[0] == "k" and "Transpose" not in helpers.ops_recursive(result)


def gqa_model(repeat_v: int = 2, unsqueeze_axis: int = 2) -> onnx.ModelProto:
    """Llama's repeat_kv: Q of 4 heads, K and V of 2 heads each repeated twice (Unsqueeze, Expand, Reshape)."""
    heads, kv = 4, 2
    net = Net()
    repeated = []
    for name, times in (("k", 2), ("v", repeat_v)):
        wide = net.op("Unsqueeze", name, net.const([unsqueeze_axis], np.int64))
        target = [B, kv, times, L, D] if unsqueeze_axis == 2 else [times, kv, 1, L, D]
        expanded = net.op("Expand", wide, net.const(target, np.int64))
        merged = [B, kv * times, L, D]
        repeated.append(net.op("Reshape", expanded, net.const(merged, np.int64)))
    chain(net, k=repeated[0], v=repeated[1], mask=net.const(np.triu(np.full((S, L), -1e9), k=2)))
    inputs = [value_info("q", [B, heads, S, D]), value_info("k", [B, kv, L, D]), value_info("v", [B, kv, L, D])]
    graph = helper.make_graph(net.nodes, "g", inputs, [value_info("y", [B, heads, S, D])], initializer=net.initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])


def test_grouped_query_attention_reads_k_and_v_before_their_repeat() -> None:
    original = gqa_model()
    result = _fused(original)
    node = next(n for n in result.graph.node if n.op_type == "Attention")
    assert list(node.input[:3]) == ["q", "k", "v"], node
    ops = helpers.ops_recursive(result)
    assert not {"Expand", "Unsqueeze", "Reshape"} & set(ops), ops
    _same(original, result)


def test_k_and_v_repeated_differently_stay_repeated() -> None:
    """Unsqueeze on axis 0 (B = 2 repeats of the batch, not of the heads): the repeat is not repeat_kv."""
    original = gqa_model(unsqueeze_axis=0)
    result = _fused(original)
    node = next(n for n in result.graph.node if n.op_type == "Attention")
    assert node.input[1] != "k" and node.input[2] != "v", node
    _same(original, result)


def test_llama_layout_reads_k_directly() -> None:
    """Transpose(K, [0, 1, 3, 2]) composed with the swap back is the identity: K is read as it is."""
    result = _fused(model())
    node = next(n for n in result.graph.node if n.op_type == "Attention")
    assert list(node.input[:3]) == ["q", "k", "v"] and "Transpose" not in helpers.ops_recursive(result)


def test_symbolic_batch_fuses() -> None:
    original = model(batch="batch")
    result = _fused(original)
    for batch in (1, 3):
        rng = np.random.default_rng(batch)
        feeds = {n: rng.standard_normal((batch, H, S if n == "q" else L, D)).astype(np.float32) for n in "qkv"}
        same_values(helpers.ort_run(original, feeds)[0], helpers.ort_run(result, feeds)[0])


def test_attention_is_idempotent() -> None:
    once = _fused(model(mask="constant"))
    twice, stats = helpers.simplify_checked(once)
    assert RULE not in stats["applied"] and helpers.ops_recursive(twice).count("Attention") == 1


def test_no_fuse_leaves_the_chain() -> None:
    result, stats = helpers.simplify_checked(model(), fuse=False)
    assert "Attention" not in helpers.ops_recursive(result) and stats["fused"] == 0, stats


MASK_VALUES = [0.0, -np.inf, LOWEST, -1e4, 1.5, -0.0, np.nan, np.inf]


_ROW = st.lists(st.sampled_from(range(len(MASK_VALUES))), min_size=L, max_size=L)
_MASKED_ROW = st.lists(st.sampled_from([1, 2]), min_size=L, max_size=L)  # -inf and the lowest float only


@settings(max_examples=25)
@given(rows=st.lists(st.one_of(_ROW, _ROW, _MASKED_ROW), min_size=S, max_size=S), seed=st.integers(0, 2**16))
def test_a_constant_mask_fuses_exactly_when_the_kernel_agrees(rows: list[list[int]], seed: int) -> None:
    """Any constant mask of these values: fused iff no row is all -inf or the lowest float, and where
    fused, onnxruntime computes the same on edge-valued Q, K and V (NaN, inf and zero signs exactly)."""
    mask = np.array([[MASK_VALUES[i] for i in row] for row in rows], np.float32).reshape(1, 1, S, L)
    net = Net()
    chain(net, mask=net.const(mask))
    inputs = [value_info("q", [B, H, S, D]), value_info("k", [B, H, L, D]), value_info("v", [B, H, L, D])]
    graph = helper.make_graph(net.nodes, "g", inputs, [value_info("y", [B, H, S, D])], initializer=net.initializers)
    original = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    result, stats = helpers.simplify_checked(original)
    fully_masked = bool(np.any(np.all(mask <= LOWEST, axis=-1)))
    assert (RULE in stats["applied"]) == (not fully_masked), (mask, stats)
    rng = np.random.default_rng(seed)
    for kind in ("normal", "edges"):
        feeds = {n: (rng.choice(_edges(), size=(B, H, S if n == "q" else L, D)) if kind == "edges" else
                     rng.standard_normal((B, H, S if n == "q" else L, D)).astype(np.float32)) for n in "qkv"}  # fmt: skip
        same_values(helpers.ort_run(original, feeds)[0], helpers.ort_run(result, feeds)[0])


# --- not fusing ---------------------------------------------------------------------------------------

FULLY_MASKED = "fully mask"
TRAPS = {
    "a constant mask with a row of the lowest float": (dict(mask="constant_full_row"), "constant mask is fully masked"),
    "a constant mask with a row of -inf": (dict(mask="constant_full_row_inf"), "constant mask is fully masked"),
    "a mask that is a graph input": (dict(mask="input"), FULLY_MASKED),
    "Where(mask, 0, finfo.min)": (dict(mask="where_lowest"), FULLY_MASKED),
    "Where(mask, 0, -inf)": (dict(mask="where_inf"), FULLY_MASKED),
    "(1 - mask) · finfo.min": (dict(mask="bert_legacy_lowest", layout="bert"), FULLY_MASKED),
    "a zero scale": (dict(factor=0.0), "scaled by a one-element float constant"),
    "a negative scale": (dict(factor=-0.25), "scaled by a one-element float constant"),
    "a scale per key": (dict(scale="vector"), "scaled by a one-element float constant"),
    "a scale that is an input": (dict(scale="input"), "scaled by a one-element float constant"),
    "a Softmax on another axis": (dict(axis=2), "not on the last axis"),
    "a Div by √8": (dict(scale="div"), "not a power of two: the kernel multiplies by its inverse"),
    "a split scale not yet a constant": (dict(scale="split_input"), "not a constant (yet"),
    "the probabilities used elsewhere": (dict(outputs=("probs",)), "not a Softmax used by it alone"),
    "the scores used elsewhere": (dict(outputs=("scores",)), "scaled by a one-element float constant"),
    "a Q of batch 1 broadcast against K": (dict(q_batch=1), "batch of Q, Kᵀ and V is not proved the same"),
}


@pytest.mark.parametrize("trap", sorted(TRAPS))
def test_attention_trap(trap: str, caplog) -> None:
    options, reason = TRAPS[trap]
    _refused(model(**options), reason, caplog)


def test_below_opset_23_it_is_counted_as_fusable_at_a_higher_opset(caplog) -> None:
    stats = _refused(model(opset=18, mask="constant"), "Attention is an op from opset 23", caplog)
    assert stats["fusable_at_higher_opset"] == {"Attention@23": 1}, stats


def test_no_kernel_in_onnxruntime_means_no_fusion(monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    from passes.verify import probe

    monkeypatch.setattr(probe, "runs_op", lambda *args: False)
    _refused(model(), "onnxruntime's CPU provider has no Attention-23 kernel for FLOAT", caplog)


def test_attention_in_if_branches_but_not_in_a_function(caplog) -> None:
    """In both branches of an If (constants as Constant nodes, Q, K, V outer values of declared shapes); a
    function body has no shapes, so the Softmax's axis is not proved the last and it does not fuse."""
    branches = []
    for suffix in ("_then", "_else"):
        net = Net(inline=True, suffix=suffix)
        chain(net, out="y", mask=net.const(np.triu(np.full((S, L), -1e9), k=2)[None, None]))
        branches.append(helper.make_graph(net.nodes, "b" + suffix, [], [value_info("y" + suffix, [B, H, S, D])]))
    if_node = helper.make_node("If", ["cond"], ["y"], then_branch=branches[0], else_branch=branches[1])
    inputs = [value_info("q", [B, H, S, D]), value_info("k", [B, H, L, D]), value_info("v", [B, H, L, D]), value_info("cond", [], np.bool_)]
    graph = helper.make_graph([if_node], "g", inputs, [value_info("y", [B, H, S, D])])
    original = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    result, stats = helpers.simplify_checked(original)
    assert stats["applied"][RULE] == 2, stats
    assert helpers.ops_recursive(result).count("Attention") == 2 and "Softmax" not in helpers.ops_recursive(result)
    for cond in (True, False):
        for feeds in _feeds(model()):
            feeds["cond"] = np.array(cond)
            same_values(helpers.ort_run(original, feeds)[0], helpers.ort_run(result, feeds)[0])

    net = Net(inline=True)
    chain(net)
    function = helper.make_function("local", "F", ["q", "k", "v"], ["y"], net.nodes,
                                    opset_imports=[helper.make_opsetid("", 23)])  # fmt: skip
    call = helper.make_node("F", ["q", "k", "v"], ["y"], domain="local")
    graph = helper.make_graph([call], "g", inputs[:3], [value_info("y", [B, H, S, D])])
    in_function = helper.make_model(graph, functions=[function],
                                    opset_imports=[helper.make_opsetid("", 23), helper.make_opsetid("local", 1)])
    _refused(in_function, "the scores' rank is not proved", caplog)
