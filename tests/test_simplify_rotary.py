"""The rotate-half rotary embedding into RotaryEmbedding (opset 23): ``passes/simplify/fusions/rotary.py``.

Each positive case builds the form an exporter writes for HF Llama's
``apply_rotary_pos_emb`` (Q and K, sharing cos and sin), runs the simplify
pass, and asserts that the checker accepts the result, RotaryEmbedding
replaced the rotation (no Slice, Neg or rotating Concat left), the pass counted
it, and onnxruntime (its optimisations disabled) computes the same: within the
check's tolerance on normal inputs and on ``x * 30 + 5``, with NaN, the
infinities and the sign of every zero in the same places on edge values (±0,
NaN, ±inf, float max, ±1e30, tiny normals), bit for bit in float16. Each trap
asserts the pattern stays, with its reason logged. The probes at the end pin
what onnxruntime 1.32's kernel does, which the module's conditions rest on.
"""

from __future__ import annotations

import json
import logging
import pathlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import helpers
from passes.cli import command as cli

LOGGER = "passes.simplify"
TOLERANCE = {np.float32: (1e-4, 1e-5), np.float16: (1e-2, 1e-3)}  # the check's (rtol, atol)
HEADS, SEQ, WIDTH = 4, 5, 8
INV_FREQ = 1.0 / 10000 ** (np.arange(0, WIDTH, 2) / WIDTH)


# --- building models ----------------------------------------------------------------------------------


class Net:
    """The nodes and initializers of one graph (constants as Constant nodes when ``inline``)."""

    def __init__(self, dtype=np.float32, opset: int = 23, inline: bool = False, suffix: str = "") -> None:
        self.dtype, self.opset, self.inline, self.suffix = np.dtype(dtype), opset, inline, suffix
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.count = 0

    def const(self, array, dtype=None) -> str:
        self.count += 1
        name = f"k{self.count}{self.suffix}"
        tensor = numpy_helper.from_array(np.asarray(array).astype(dtype or self.dtype), name)
        if self.inline:
            self.nodes.append(helper.make_node("Constant", [], [name], value=tensor))
        else:
            self.initializers.append(tensor)
        return name

    def ints(self, values) -> str:
        return self.const(np.array(values, np.int64), np.int64)

    def op(self, op_type: str, *inputs: str, out: str | None = None, **attrs) -> str:
        self.count += 1
        name = (out or f"{op_type.lower()}{self.count}") + self.suffix
        self.nodes.append(helper.make_node(op_type, list(inputs), [name], name=name, **attrs))
        return name

    def unsqueeze(self, x: str, axes) -> str:
        if self.opset >= 13:
            return self.op("Unsqueeze", x, self.ints(axes))
        return self.op("Unsqueeze", x, axes=list(axes))


def cos_sin(net: Net, form: str = "dynamo", pos: str = "pos", halves: str = "same") -> tuple[str, str]:
    """Llama's ``LlamaRotaryEmbedding``: ``emb = cat(freqs, freqs)``, then ``cos``/``sin`` as exported,
    unsqueezed over the heads. ``form``: ``dynamo`` (``Cos(Concat)``), ``ts`` (TorchScript's ``Cast(Mul(
    Cos(Concat), 1.0))``), ``constant`` (a folded ``[1, 1, S, D]`` cache), ``gather`` (``cos_cached[pos]``)."""
    if form == "constant":
        angles = np.arange(SEQ)[:, None] * INV_FREQ[None]
        emb = np.concatenate([angles, angles], axis=-1)
        cos, sin = np.cos(emb), np.sin(emb)
        if halves == "different":
            cos[..., -1] *= 0.5
        return net.const(cos[None, None]), net.const(sin[None, None])
    if form == "gather":
        angles = np.arange(64)[:, None] * INV_FREQ[None]
        emb = np.concatenate([angles, angles], axis=-1)
        cos, sin = net.const(np.cos(emb)), net.const(np.sin(emb) * (1e30 if halves == "huge" else 1))
        return [net.unsqueeze(net.op("Gather", c, pos, axis=0), [1]) for c in (cos, sin)]  # type: ignore[return-value]
    positions = net.op("Cast", net.unsqueeze(pos, [-1]), to=helper.np_dtype_to_tensor_dtype(net.dtype))
    freqs = net.op("Mul", positions, net.const(INV_FREQ))
    other = net.op("Mul", positions, net.const(INV_FREQ * 1.5)) if halves == "different" else freqs
    emb = net.op("Concat", freqs, other, axis=-1)
    results = []
    for op in ("Cos", "Sin"):
        value = net.op(op, emb)
        if form == "ts":
            value = net.op("Cast", net.op("Mul", value, net.const(1.0)), to=helper.np_dtype_to_tensor_dtype(net.dtype))
        results.append(net.unsqueeze(value, [1]))
    return results[0], results[1]


def rotate(net: Net, x: str, cos: str, sin: str, out: str, neg: str = "neg", split: int = WIDTH // 2,
           swap: bool = False, order: str = "rotate_half") -> str:  # fmt: skip
    """``x * cos + rotate_half(x) * sin`` (``swap``: every operand order reversed)."""
    x1 = net.op("Slice", x, net.ints([0]), net.ints([split]), net.ints([-1]), net.ints([1]))
    x2 = net.op("Slice", x, net.ints([split]), net.ints([2**63 - 1]), net.ints([-1]), net.ints([1]))
    minus = net.op("Neg", x2) if neg == "neg" else net.op("Mul", x2, net.const(-1.0))
    rotated = net.op("Concat", minus, x1, axis=-1) if order == "rotate_half" else net.op("Concat", x1, minus, axis=-1)
    if swap:
        return net.op("Add", net.op("Mul", sin, rotated), net.op("Mul", cos, x), out=out)
    return net.op("Add", net.op("Mul", x, cos), net.op("Mul", rotated, sin), out=out)


def _io(name: str, shape, dtype) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), shape)


def llama(dtype=np.float32, opset: int = 23, form: str = "dynamo", batch="batch", pos_batch=1,
          **options) -> onnx.ModelProto:  # fmt: skip
    """Q and K of one attention layer (K with 2 heads: grouped-query attention) rotated by shared cos/sin."""
    net = Net(dtype, opset)
    halves = options.pop("halves", "same")
    seq = SEQ if form == "constant" else "seq"  # a folded cache has the static length it was folded at
    cos, sin = cos_sin(net, form, halves=halves)
    rotate(net, "q", cos, sin, "q_embed", **options)
    rotate(net, "k", cos, sin, "k_embed", **options)
    inputs = [_io("q", [batch, HEADS, seq, WIDTH], dtype), _io("k", [batch, 2, seq, WIDTH], dtype)]
    if form != "constant":
        inputs.append(_io("pos", [pos_batch, seq], np.int64))
    outputs = [_io(name, [batch, h, seq, WIDTH], dtype) for name, h in (("q_embed", HEADS), ("k_embed", 2))]
    graph = helper.make_graph(net.nodes, "g", inputs, outputs, initializer=net.initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


# --- running and comparing ----------------------------------------------------------------------------


_simplify = helpers.simplify_checked


def _ops(model: onnx.ModelProto) -> list[str]:
    return helpers.ops_recursive(model)


def _edges(dtype) -> np.ndarray:
    """Edge values, without subnormals (see ``test_float32_zeros_differ_only_where_a_product_underflows``)."""
    info = np.finfo(dtype)
    with np.errstate(over="ignore"):
        return np.array([0.0, -0.0, np.nan, np.inf, -np.inf, float(info.max), -float(info.max), 1e30, -1e30,
                         float(info.smallest_normal), -float(info.smallest_normal), 1.0, -1.0, 0.3, -0.7, 1e-3],
                        dtype=np.float64).astype(dtype)  # fmt: skip


def _feeds(model: onnx.ModelProto, dtype, batch: int = 2, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Normal q and k, ``x * 30 + 5``, and edge values, with positions 0.. and far positions."""
    rng = np.random.default_rng(seed)
    names = [i.name for i in model.graph.input]
    found = []
    for kind in ("normal", "scaled", *("edges",) * 6):
        feeds: dict[str, np.ndarray] = {}
        for name, heads in (("q", HEADS), ("k", 2)):
            shape = (batch, heads, SEQ, WIDTH)
            if kind == "edges":
                feeds[name] = rng.choice(_edges(dtype), size=shape)
            else:
                normal = rng.standard_normal(shape)
                feeds[name] = (normal * 30 + 5 if kind == "scaled" else normal).astype(dtype)
        if "pos" in names:
            pos_batch = model.graph.input[names.index("pos")].type.tensor_type.shape.dim[0]
            rows = batch if pos_batch.dim_param else 1
            start = 0 if kind != "scaled" else 40
            feeds["pos"] = np.tile(np.arange(start, start + SEQ, dtype=np.int64), (rows, 1))
        found.append(feeds)
    return found


def _same(original: onnx.ModelProto, result: onnx.ModelProto, dtype=np.float32, batch: int = 2) -> None:
    """Within the check's tolerance (float16: bit for bit); NaN, inf and the sign of zero exactly."""
    rtol, atol = TOLERANCE[np.dtype(dtype).type]
    for feeds in _feeds(original, dtype, batch):
        for expected, actual in zip(helpers.ort_run(original, feeds), helpers.ort_run(result, feeds)):
            assert expected.dtype == actual.dtype and expected.shape == actual.shape
            if np.dtype(dtype) == np.float16:
                _bit_for_bit(expected, actual)
                continue
            e, a = expected.astype(np.float64), actual.astype(np.float64)
            np.testing.assert_array_equal(np.isnan(a), np.isnan(e))
            np.testing.assert_array_equal(a[np.isinf(a) | np.isinf(e)], e[np.isinf(a) | np.isinf(e)])
            zeros = (e == 0) & (a == 0)
            np.testing.assert_array_equal(np.signbit(a[zeros]), np.signbit(e[zeros]))
            finite = np.isfinite(e) & np.isfinite(a)
            np.testing.assert_allclose(a[finite], e[finite], rtol=rtol, atol=atol)


def _bit_for_bit(expected: np.ndarray, actual: np.ndarray) -> None:
    """The same bits, but for the sign and payload of NaN (onnxruntime's float16 ops differ there)."""
    nan = np.isnan(expected)
    np.testing.assert_array_equal(nan, np.isnan(actual))
    assert expected[~nan].tobytes() == actual[~nan].tobytes()


def _fused(original: onnx.ModelProto, count: int = 2) -> tuple[onnx.ModelProto, dict]:
    result, stats = _simplify(original)
    ops = _ops(result)
    assert ops.count("RotaryEmbedding") == count, ops
    assert stats["applied"].get("fusions/rotary_embedding") == count and stats["fused"] >= count, stats
    assert not {"Slice", "Neg"} & set(ops), ops
    return result, stats


def _refused(original: onnx.ModelProto, reason: str, caplog, **options) -> dict:
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        result, stats = _simplify(original, **options)
    assert "RotaryEmbedding" not in _ops(result) and "fusions/rotary_embedding" not in stats["applied"], stats
    assert reason in caplog.text, caplog.text
    return stats


# --- fusing -------------------------------------------------------------------------------------------

FORMS = {
    "dynamo": dict(),
    "torchscript": dict(form="ts"),
    "neg_as_mul_by_minus_one": dict(neg="mul"),
    "operands_swapped": dict(swap=True),
    "folded_constant_cache": dict(form="constant"),
    "gathered_from_a_constant_cache": dict(form="gather", pos_batch="batch"),
}


@pytest.mark.parametrize("name", sorted(FORMS))
def test_rotary_fuses(name: str) -> None:
    original = llama(**FORMS[name])
    result, _ = _fused(original)
    assert not any(n.op_type == "Concat" and len(n.input) == 2 and n.input[0].startswith("neg")
                   for n in result.graph.node)  # fmt: skip
    node = next(n for n in result.graph.node if n.op_type == "RotaryEmbedding")
    assert [a.name for a in node.attribute] == []  # interleaved=0, full rotation, num_heads from the 4-D x
    _same(original, result)


def test_the_halves_of_the_cache_are_the_half_computed_once() -> None:
    """Cos(f) and Sin(f) of the half replace Cos/Sin of Concat(f, f); Q and K share them (cse)."""
    result, _ = _fused(llama())
    ops = _ops(result)
    assert ops.count("Cos") == 1 and ops.count("Sin") == 1 and ops.count("Concat") == 1, ops  # + the Expand target
    cos = next(n for n in result.graph.node if n.op_type == "Cos")
    assert cos.input[0].startswith("mul"), cos  # the freqs, not their Concat


def test_a_batch_of_one_is_expanded_to_x_batch() -> None:
    """onnxruntime's kernel takes 3-D caches of x's batch only: a [1, S, D/2] cache is expanded; the fused
    model runs at batch 0, 1, 2 and 3 (onnxsim 0.8.1's fused Llama fails at batch 2)."""
    original = llama()
    result, _ = _fused(original)
    assert _ops(result).count("Expand") == 2 and _ops(result).count("Shape") == 1, _ops(result)
    shape = next(n for n in result.graph.node if n.op_type == "Shape")
    assert shape.input[0] == "q"  # a graph input of the same batch symbol: one Shape for every fusion
    for batch in (0, 1, 3):
        _same(original, result, batch=batch)


def test_a_cache_of_x_batch_needs_no_expand() -> None:
    original = llama(pos_batch="batch")
    result, _ = _fused(original)
    assert "Expand" not in _ops(result) and "Shape" not in _ops(result), _ops(result)
    _same(original, result)


def test_static_batch_of_one_needs_no_expand() -> None:
    original = llama(batch=1)
    result, _ = _fused(original)
    assert "Expand" not in _ops(result), _ops(result)
    _same(original, result, batch=1)


def test_float16_is_bit_for_bit() -> None:
    original = llama(np.float16, form="ts")
    result, _ = _fused(original)
    _same(original, result, np.float16)


def test_rotary_is_idempotent() -> None:
    once, _ = _fused(llama())
    twice, stats = _simplify(once)
    assert "fusions/rotary_embedding" not in stats["applied"] and _ops(twice).count("RotaryEmbedding") == 2


# --- not fusing ---------------------------------------------------------------------------------------

TRAPS = {
    "halves of cos that differ": (dict(halves="different"), "a Concat that is not of one value with itself"),
    "a constant cache whose halves differ": (dict(form="constant", halves="different"),
                                             "its two halves are not equal bit for bit"),
    "a split that is not at the middle": (dict(split=3), "x1 is not x[..., 0:4]"),
    "the negated half second": (dict(order="other"), "the rotation's first half is not -x2"),
    "a cache beyond [-1, 1]": (dict(form="gather", pos_batch="batch", halves="huge"), "beyond [-1, 1]"),
}


@pytest.mark.parametrize("trap", sorted(TRAPS))
def test_rotary_trap(trap: str, caplog) -> None:
    options, reason = TRAPS[trap]
    original = llama(**options)
    _refused(original, reason, caplog)


def test_a_cache_unsqueezed_on_another_axis_is_not_matched(caplog) -> None:
    """Only the exporters' ``cos[:, None]`` is read (here axis 0 of a batch-1 cache would broadcast the same)."""
    net = Net()
    angles = net.op("Mul", net.op("Cast", net.unsqueeze("pos", [-1]), to=TensorProto.FLOAT), net.const(INV_FREQ))
    emb = net.op("Concat", angles, angles, axis=-1)
    cos, sin = (net.unsqueeze(net.op(op, emb), [0]) for op in ("Cos", "Sin"))  # [1, 1, S, D] from a [1, S, D]
    rotate(net, "q", cos, sin, "y")
    inputs = [_io("q", [1, HEADS, "seq", WIDTH], np.float32), _io("pos", [1, "seq"], np.int64)]
    graph = helper.make_graph(net.nodes, "g", inputs, [_io("y", [1, HEADS, "seq", WIDTH], np.float32)],
                              initializer=net.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    _refused(model, "not Unsqueeze(e, axes=[1])", caplog)


def test_below_opset_23_it_is_counted_as_fusable_at_a_higher_opset(caplog) -> None:
    stats = _refused(llama(opset=18), "RotaryEmbedding is an op from opset 23", caplog)
    assert stats["fusable_at_higher_opset"] == {"RotaryEmbedding@23": 2}, stats


def test_no_fuse_leaves_the_rotation() -> None:
    result, stats = _simplify(llama(), fuse=False)
    assert "RotaryEmbedding" not in _ops(result) and stats["fused"] == 0, stats


def test_no_kernel_in_onnxruntime_means_no_fusion(monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    from passes.verify import probe

    monkeypatch.setattr(probe, "runs_op", lambda *args: False)
    _refused(llama(), "onnxruntime's CPU provider has no RotaryEmbedding-23 kernel for FLOAT", caplog)


def test_rotary_in_if_branches_but_not_in_a_function(caplog) -> None:
    """In both branches of an If, constants as Constant nodes (with outer initializers, onnx's inference in
    the branch does not read them, so the cache's shape is not proved); a function body has no shapes,
    so there D is not proved static and it does not fuse."""
    branches, initializers = [], []
    for net in (Net(inline=True, suffix="_then"), Net(inline=True, suffix="_else")):
        cos, sin = cos_sin(net, "dynamo")
        rotate(net, "q", cos, sin, "y")
        branches.append(helper.make_graph(net.nodes, "b" + net.suffix, [],
                                          [_io("y" + net.suffix, [1, HEADS, SEQ, WIDTH], np.float32)]))  # fmt: skip
        initializers += net.initializers
    if_node = helper.make_node("If", ["cond"], ["y"], then_branch=branches[0], else_branch=branches[1])
    inputs = [_io("q", [1, HEADS, SEQ, WIDTH], np.float32), _io("pos", [1, SEQ], np.int64), _io("cond", [], np.bool_)]
    graph = helper.make_graph([if_node], "g", inputs, [_io("y", [1, HEADS, SEQ, WIDTH], np.float32)],
                              initializer=initializers)
    original = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    result, stats = _simplify(original)
    assert stats["applied"]["fusions/rotary_embedding"] == 2, stats
    assert _ops(result).count("RotaryEmbedding") == 2 and "Slice" not in _ops(result)
    rng = np.random.default_rng(0)
    for cond in (True, False):
        feeds = {"q": rng.standard_normal((1, HEADS, SEQ, WIDTH)).astype(np.float32),
                 "pos": np.arange(SEQ, dtype=np.int64)[None], "cond": np.array(cond)}  # fmt: skip
        for e, a in zip(helpers.ort_run(original, feeds), helpers.ort_run(result, feeds)):
            np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-5)

    net = Net(inline=True)
    cos, sin = cos_sin(net, "dynamo")
    rotate(net, "q", cos, sin, "y")
    function = helper.make_function("local", "F", ["q", "pos"], ["y"], net.nodes,
                                    opset_imports=[helper.make_opsetid("", 23)])  # fmt: skip
    call = helper.make_node("F", ["q", "pos"], ["y"], domain="local")
    graph = helper.make_graph([call], "g", inputs[:2], [_io("y", [1, HEADS, SEQ, WIDTH], np.float32)])
    model = helper.make_model(graph, functions=[function],
                              opset_imports=[helper.make_opsetid("", 23), helper.make_opsetid("local", 1)])  # fmt: skip
    _refused(model, "the last dim of x is not static", caplog)


def test_the_command_fuses_at_target_23_and_counts_it_below(tmp_path: pathlib.Path, capsys) -> None:
    src, out, report = tmp_path / "rope.onnx", tmp_path / "out.onnx", tmp_path / "r.json"
    onnx.save(llama(opset=18), str(src))
    assert cli.main([str(src), "-o", str(out), "--report", str(report), "-q"]) == 0
    stats = {r["name"]: r for r in json.loads(report.read_text())["passes"]}["simplify"]["stats"]
    assert stats["fusable_at_higher_opset"] == {"RotaryEmbedding@23": 2}, stats
    assert cli.main([str(src), "-o", str(out), "--target-opset", "23", "--report", str(report)]) == 0
    assert "check passed" in capsys.readouterr().out
    assert _ops(onnx.load(str(out))).count("RotaryEmbedding") == 2
    assert cli.main([str(src), "-o", str(out), "--target-opset", "23", "--no-fuse", "-q"]) == 0
    assert "RotaryEmbedding" not in _ops(onnx.load(str(out)))


# --- what onnxruntime's kernel does (the module's conditions rest on these) -----------------------------


def _pair(dtype) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """The primitive rotation of an x [B, H, S, D] by caches c, s [B, S, D/2] fed as inputs, and the kernel."""
    net = Net(dtype)
    cos, sin = (net.unsqueeze(net.op("Concat", v, v, axis=-1), [1]) for v in ("c", "s"))
    rotate(net, "x", cos, sin, "y")
    inputs = [_io("x", None, dtype), _io("c", None, dtype), _io("s", None, dtype)]
    primitive = helper.make_graph(net.nodes, "p", inputs, [_io("y", None, dtype)], initializer=net.initializers)
    kernel = helper.make_graph([helper.make_node("RotaryEmbedding", ["x", "c", "s"], ["y"])], "k", inputs,
                               [_io("y", None, dtype)])  # fmt: skip
    opsets = [helper.make_opsetid("", 23)]
    return helper.make_model(primitive, opset_imports=opsets), helper.make_model(kernel, opset_imports=opsets)


def _kernel_trials(dtype, cache: str, seed: int = 0, trials: int = 40):
    """(x, c, s, primitive, kernel) on random edge x (subnormals too) and Llama-like or random caches."""
    primitive, kernel = _pair(dtype)
    rng = np.random.default_rng(seed)
    info = np.finfo(dtype)
    values = np.concatenate([_edges(dtype), np.array([info.smallest_subnormal, -info.smallest_subnormal], dtype)])
    angles = np.arange(SEQ)[:, None] * INV_FREQ[None] * 37.0
    for _ in range(trials):
        x = rng.choice(values, size=(2, 3, SEQ, WIDTH))
        if cache == "llama":
            c, s = (np.broadcast_to(f(angles), (2, SEQ, WIDTH // 2)).astype(dtype) for f in (np.cos, np.sin))
        else:  # uniform in [-1, 1] with zeros of either sign
            c, s = (rng.uniform(-1, 1, (2, SEQ, WIDTH // 2)).astype(dtype) for _ in range(2))
            c[rng.random(c.shape) < 0.2], s[rng.random(s.shape) < 0.2] = 0.0, -0.0
        feeds = {"x": x, "c": np.ascontiguousarray(c), "s": np.ascontiguousarray(s)}
        yield x, helpers.ort_run(primitive, feeds)[0], helpers.ort_run(kernel, feeds)[0]


@pytest.mark.parametrize("cache", ["llama", "uniform_with_zeros"])
def test_float16_kernel_is_bit_for_bit_on_edge_values(cache: str) -> None:
    for _, expected, actual in _kernel_trials(np.float16, cache):
        _bit_for_bit(expected, actual)


@pytest.mark.parametrize("cache", ["llama", "uniform_with_zeros"])
def test_float32_zeros_differ_only_where_a_product_underflows(cache: str) -> None:
    """With caches in [-1, 1]: NaN and inf where the primitive ops put them; a zero of another sign only
    in a row holding a subnormal x (its product with a cache value underflows, and the kernel's fused
    multiply-add keeps the sign of the exact, nonzero result: the primitive +0 is the kernel's -0)."""
    seen = 0
    for x, expected, actual in _kernel_trials(np.float32, cache):
        assert np.array_equal(np.isnan(expected), np.isnan(actual))
        infinite = np.isinf(expected) | np.isinf(actual)
        assert np.array_equal(expected[infinite], actual[infinite])
        signs = (expected == 0) & (actual == 0) & (np.signbit(expected) != np.signbit(actual))
        subnormal_rows = np.any((x != 0) & (np.abs(x) < np.finfo(np.float32).smallest_normal), axis=-1, keepdims=True)
        assert not np.any(signs & ~subnormal_rows)
        assert np.all(np.signbit(actual[signs]))  # the kernel's -0, the primitive's +0
        seen += int(signs.sum())
    assert seen > 0  # the exception is real (it is stated in the module and in docs/passes.md)


def test_float32_caches_beyond_one_put_nan_elsewhere() -> None:
    """Why caches must be in [-1, 1]: x · 1e30 overflows in the primitive Mul, and inf - inf is NaN, where
    the kernel's fused multiply-add subtracts from the exact product."""
    primitive, kernel = _pair(np.float32)
    x = np.zeros((1, 1, 1, WIDTH), np.float32)
    x[..., 0] = x[..., WIDTH // 2] = 1e30
    cache = np.array([[[1e30, 1.0, 1.0, 1.0]]], np.float32)
    feeds = {"x": x, "c": cache, "s": cache}
    expected, actual = helpers.ort_run(primitive, feeds)[0], helpers.ort_run(kernel, feeds)[0]
    assert not np.array_equal(np.isnan(expected), np.isnan(actual)), (expected, actual)


def test_the_kernel_refuses_a_cache_of_another_batch() -> None:
    """Why a batch-1 cache is expanded: 3-D caches must have x's batch (the primitive ops broadcast)."""
    _, kernel = _pair(np.float32)
    feeds = {"x": np.ones((2, 1, SEQ, WIDTH), np.float32), "c": np.ones((1, SEQ, 4), np.float32),
             "s": np.zeros((1, SEQ, 4), np.float32)}  # fmt: skip
    with pytest.raises(Exception, match="same shape as input 'x'"):
        helpers.ort_run(kernel, feeds)
