"""Conv lengths as floor expressions of the input's dims (``passes.simplify.dim_exprs``), and the views they prove.

dynamo's wav2vec2 export computes the frame count of its conv feature extractor
again from ``Shape(input)`` (``samples // 20 - 1``) and views the attention
output back to ``[batch, 2, L, 16]`` with it; the convs give the same length as
``floor((n + pads - dilation*(k-1) - 1) / stride) + 1`` per layer. Both reduce to
one canonical expression, so the view back is a no-op. Each model here runs in
onnxruntime, original and simplified, at many lengths (where the floors step,
and where the original fails); the traps (another stride, another padding, a
length equal only at some sizes, a truncating division of a negative value)
must keep the view.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import helpers
from passes.simplify import dim_exprs
from passes.simplify.dim_exprs import FloorDiv, Product
from test_simplify import _const, _io, _model, _simplify
from test_simplify_dims import _derived, _floats, _run_both

# --- the algebra, against Python's integers ----------------------------------------------------


def _evaluate(dim: object, sizes: dict[str, int]) -> int:
    if isinstance(dim, int):
        return dim
    if isinstance(dim, str):
        return sizes[dim]
    if isinstance(dim, FloorDiv):
        return _evaluate(dim.expr, sizes) // dim.divisor
    if isinstance(dim, Product):
        return int(np.prod([_evaluate(f, sizes) for f in dim.factors], dtype=object))
    assert isinstance(dim, dim_exprs.Expr)
    return dim.const + sum(c * _evaluate(a, sizes) for a, c in dim.terms)


_STEP = st.one_of(st.tuples(st.just("add"), st.integers(-30, 30)), st.tuples(st.just("scale"), st.integers(-4, 4)),
                  st.tuples(st.just("div"), st.integers(1, 9)), st.tuples(st.just("plus"), st.sampled_from(["s", "t"])))  # fmt: skip


@settings(max_examples=400)
@given(st.lists(_STEP, min_size=1, max_size=8), st.integers(-200, 200), st.integers(-200, 200))
def test_canonical_form_is_the_same_function(steps: list, s: int, t: int) -> None:
    """Each expression built step by step equals Python's floor arithmetic at every value (negative ones too)."""
    sizes = {"s": s, "t": t}
    dim: object = "s"
    expected = s
    for op, arg in steps:
        if op == "add":
            dim, expected = dim_exprs.add(dim, arg), expected + arg
        elif op == "scale":
            dim, expected = dim_exprs.scale(dim, arg), expected * arg
        elif op == "div":
            dim, expected = dim_exprs.floordiv(dim, arg), expected // arg
        else:
            dim, expected = dim_exprs.add(dim, arg), expected + sizes[arg]
        assert _evaluate(dim, sizes) == expected, (steps, dim)


def _conv_length(n: object, kernel: int, stride: int, pads: int = 0, dilation: int = 1) -> object:
    return dim_exprs.add(dim_exprs.floordiv(dim_exprs.add(n, pads - dilation * (kernel - 1) - 1), stride), 1)


def test_conv_stack_length_is_the_exports_arithmetic() -> None:
    stack = _conv_length(_conv_length(_conv_length("n", 10, 5), 3, 2), 3, 2)
    assert stack == dim_exprs.add(dim_exprs.floordiv("n", 20), -1)
    assert stack == dim_exprs.floordiv(dim_exprs.add("n", -20), 20)  # another way to write it
    assert stack != dim_exprs.add(dim_exprs.floordiv("n", 21), -1)
    assert _conv_length(_conv_length("n", 10, 5, pads=2), 3, 2) != dim_exprs.add(dim_exprs.floordiv("n", 10), -1)
    assert dim_exprs.floordiv(dim_exprs.add(dim_exprs.scale("n", 4), 2), 4) == "n"
    assert not dim_exprs.is_nonnegative(stack) and dim_exprs.is_nonnegative(dim_exprs.floordiv("n", 20))


# --- a conv feature extractor, its length arithmetic, and the view back ------------------------


def _extractor(length: str = "exact", pads: int = 0) -> onnx.ModelProto:
    """``x: [batch, samples]`` through convs (k10 s5, k3 s2, k3 s2) to ``[batch, L, 32]``, viewed by ``L`` as computed.

    ``h = view(frames, [b, L, -1, 16])`` (allowzero=1), ``Relu`` over ``[b, heads, L, 16]``, and the
    view back ``[b, 2, L, 16]`` (the output). ``length`` writes ``L`` as: ``exact``
    ``samples // 20 - 1``; ``rewritten`` ``(samples + 20) // 20 - 2``; ``stride21`` ``samples // 21 - 1``;
    ``negative`` ``(samples - 40) // 20 + 1`` (onnxruntime's Div truncates the negative values of
    ``samples - 40``); ``pads`` pads the first conv by that much on each side.
    """
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
               for n, s in (("w1", (32, 1, 10)), ("w2", (32, 32, 3)), ("w3", (32, 32, 3)))]  # fmt: skip
    arithmetic = {
        "exact": [("Div", "n", "twenty", "q"), ("Add", "q", "minus_one", "length")],
        "rewritten": [("Add", "n", "twenty", "d"), ("Div", "d", "twenty", "q"), ("Add", "q", "minus_two", "length")],
        "stride21": [("Div", "n", "twenty_one", "q"), ("Add", "q", "minus_one", "length")],
        "negative": [("Sub", "n", "forty", "d"), ("Div", "d", "twenty", "q"), ("Add", "q", "one", "length")],
    }[length]
    nodes = [_const("axis1", np.array([1])), helper.make_node("Unsqueeze", ["x", "axis1"], ["x3"]),
             helper.make_node("Conv", ["x3", "w1"], ["c1"], kernel_shape=[10], strides=[5], pads=[pads, pads]),
             helper.make_node("Conv", ["c1", "w2"], ["c2"], kernel_shape=[3], strides=[2]),
             helper.make_node("Conv", ["c2", "w3"], ["c3"], kernel_shape=[3], strides=[2]),
             helper.make_node("Transpose", ["c3"], ["frames"], perm=[0, 2, 1]),
             helper.make_node("Shape", ["x"], ["b"], start=0, end=1),
             helper.make_node("Shape", ["x"], ["n1"], start=1, end=2), helper.make_node("Squeeze", ["n1"], ["n"]),
             *(_const(name, np.array(v)) for name, v in
               (("twenty", 20), ("twenty_one", 21), ("forty", 40), ("one", 1), ("minus_one", -1), ("minus_two", -2))),
             *(helper.make_node(op, [a, b], [out]) for op, a, b, out in arithmetic),
             _const("flat", np.array([-1])), helper.make_node("Reshape", ["length", "flat"], ["l1"]),
             _const("width", np.array([16])), _const("two", np.array([2])),
             helper.make_node("Concat", ["b", "l1", "flat", "width"], ["t"], axis=0),
             helper.make_node("Reshape", ["frames", "t"], ["view"], allowzero=1),
             helper.make_node("Transpose", ["view"], ["heads"], perm=[0, 2, 1, 3]),
             helper.make_node("Relu", ["heads"], ["act"]),
             helper.make_node("Concat", ["b", "two", "l1", "width"], ["back"], axis=0),
             helper.make_node("Reshape", ["act", "back"], ["out"], allowzero=1)]  # fmt: skip
    return _model(nodes, [_io("x", ["batch", "samples"])], [_io("out", [None, None, None, None])], weights)


_LENGTHS = [0, 9, 10, 14, 15, 19, 20, 21, 29, 39, 40, 41, 59, 60, 79, 80, 81, 99, 100, 137, 159, 160]


def _compare_at_lengths(original: onnx.ModelProto, result: onnx.ModelProto) -> int:
    """Runs both at every batch in 0..2 and length in :data:`_LENGTHS`; how many runs the original accepted."""
    ran = 0
    for batch in (0, 1, 2):
        for samples in _LENGTHS:
            ran += _run_both(original, result, {"x": _floats(batch, samples)})
    return ran


@pytest.mark.parametrize("length", ["exact", "rewritten"])
def test_view_back_by_the_computed_length_goes(length: str) -> None:
    original = _extractor(length)
    result, stats = _simplify(original)
    reshapes = [node for node in result.graph.node if node.op_type == "Reshape"]
    assert [node.output[0] for node in reshapes] == ["l1", "view"]  # the view of the frames stays, the view back goes
    assert stats["applied"]["noops/same_shape"] >= 1
    assert result.graph.output[0].name == "out"
    assert _compare_at_lengths(original, result) == 3 * sum(n >= 40 for n in _LENGTHS)  # the stack needs 40 samples


def test_derived_lengths_of_the_stack() -> None:
    found, values = _derived(_extractor())
    expected = dim_exprs.add(dim_exprs.floordiv("samples", 20), -1)
    assert found.shape(values["c3"]) == ("batch", 32, expected)
    assert found.shape(values["view"]) == ("batch", expected, 2, 16)  # the -1 sized by onnxruntime's rule
    assert found.positive(expected) and found.nonnegative(expected)


@pytest.mark.parametrize("length, pads", [("stride21", 0), ("negative", 0), ("exact", 1)])
def test_view_back_by_another_length_stays(length: str, pads: int) -> None:
    """Another stride, a truncated negative quotient, another padding: the lengths differ at some sizes."""
    original = _extractor(length, pads)
    result, _ = _simplify(original)
    assert "out" in [node.output[0] for node in result.graph.node if node.op_type == "Reshape"]
    _compare_at_lengths(original, result)


def test_lengths_where_the_traps_differ_are_run() -> None:
    """The traps' lengths differ from the convs' at lengths the comparisons run (so the traps test something)."""
    conv = [(n - 5) // 5 for n in _LENGTHS]  # k10 s5 alone, then two k3 s2
    conv = [(c - 1) // 2 for c in conv]
    conv = [(c - 1) // 2 for c in conv]
    stride21 = [n // 21 - 1 for n in _LENGTHS]
    truncated = [int((n - 40) / 20) + 1 for n in _LENGTHS]
    assert conv != stride21 and conv != truncated
    assert conv == [n // 20 - 1 for n in _LENGTHS]


def test_conv_that_fails_short_inputs() -> None:
    """onnxruntime fails a Conv whose input is shorter than its dilated kernel (the premise of the floor)."""
    weights = [numpy_helper.from_array(np.ones((1, 1, 10), np.float32), "w")]
    model = _model([helper.make_node("Conv", ["x", "w"], ["y"], strides=[5], pads=[2, 2])],
                   [_io("x", [1, 1, "n"])], [_io("y", None)], weights)  # fmt: skip
    for n in range(0, 30):
        try:
            (y,) = helpers.ort_run(model, {"x": np.ones((1, 1, n), np.float32)})
        except Exception:  # noqa: BLE001
            assert n + 4 < 10
            continue
        assert y.shape[-1] == (n + 4 - 10) // 5 + 1 >= 1


@pytest.mark.parametrize("shape, target, allowzero", [
    ((0, 5, 32), (0, 5, -1, 16), 1), ((3, 0, 32), (3, 0, -1, 16), 1), ((0, 0, 32), (0, 0, -1, 16), 1),
    ((0, 2, 5, 16), (-1, 5, 16), 0), ((3, 2, 5, 16), (-1, 5, 16), 0), ((3, 0, 32), (3, 0, -1, 16), 0),
])  # fmt: skip
def test_minus_one_as_onnxruntime_sizes_it(shape: tuple, target: tuple, allowzero: int) -> None:
    """The rule of :func:`dims._minus_one` (the others cancel against the input's dims), in onnxruntime itself."""
    node = helper.make_node("Reshape", ["x", "s"], ["y"], allowzero=allowzero)
    model = _model([node], [_io("x", None), _io("s", None, TensorProto.INT64)], [_io("y", None)])
    feeds = {"x": np.ones(shape, np.float32), "s": np.array(target, np.int64)}
    try:
        (y,) = helpers.ort_run(model, feeds)
    except Exception:  # noqa: BLE001
        assert allowzero == 0 and 0 in target  # without allowzero, a -1 beside a 0 fails
        return
    i = target.index(-1)
    if allowzero:
        nonzero = int(np.prod([d for d in shape if d])) // int(np.prod([d for d in target if d > 0]))
        assert y.shape[i] == nonzero
    else:
        assert y.shape[i] == int(np.prod(shape)) // int(np.prod([d for d in target if d > 0]))


# --- the derived dims against onnxruntime's shapes ----------------------------------------------


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 5), st.integers(1, 3), st.integers(0, 2), st.integers(0, 2), st.integers(1, 2),
                          st.booleans()), min_size=1, max_size=2))  # fmt: skip
def test_conv_length_is_onnxruntimes(layers: list) -> None:
    """Stacks of (kernel, stride, pad begin, pad end, dilation, VALID): the derived length is onnxruntime's."""
    nodes, weights, source = [], [], "x"
    for i, (kernel, stride, begin, end, dilation, valid) in enumerate(layers):
        weights.append(numpy_helper.from_array(np.ones((1, 1, kernel), np.float32), f"w{i}"))
        padding = {"auto_pad": "VALID"} if valid else {"pads": [begin, end]}
        nodes.append(helper.make_node("Conv", [source, f"w{i}"], [f"y{i}"], strides=[stride], dilations=[dilation],
                                      **padding))  # fmt: skip
        source = f"y{i}"
    model = _model(nodes, [_io("x", [1, 1, "n"])], [_io(source, None)], weights)
    found, values = _derived(model)
    derived = found.shape(values[source])
    assert derived is not None and found.positive(derived[2])
    session = helpers.ort_session(model)
    ran = 0
    for n in range(0, 48):
        try:
            (y,) = session.run(None, {"x": np.ones((1, 1, n), np.float32)})
        except Exception:  # noqa: BLE001  (too short for a kernel: the node fails)
            continue
        ran += 1
        assert y.shape[2] == _evaluate(derived[2], {"n": n}) >= 1, (layers, n, derived[2])
    assert ran


def _view(pieces: list[str], allowzero: int) -> onnx.ModelProto:
    """``Reshape(x: [b, s, 32], Concat(pieces))``; a piece is ``b``/``s`` (the dim of x) or an int."""
    nodes = [helper.make_node("Shape", ["x"], ["b"], start=0, end=1),
             helper.make_node("Shape", ["x"], ["s"], start=1, end=2)]
    names = []
    for i, piece in enumerate(pieces):
        if piece in ("b", "s"):
            names.append(piece)
        else:
            names.append(f"c{i}")
            nodes.append(_const(f"c{i}", np.array([int(piece)])))
    nodes += [helper.make_node("Concat", names, ["t"], axis=0),
              helper.make_node("Reshape", ["x", "t"], ["y"], allowzero=allowzero)]  # fmt: skip
    return _model(nodes, [_io("x", ["batch", "seq", 32])], [_io("y", None)])


@pytest.mark.parametrize("pieces, allowzero, expected", [
    (["b", "s", "-1", "16"], 1, ("batch", "seq", 2, 16)),
    (["b", "s", "-1", "16"], 0, ("batch", "seq", 2, 16)),
    (["b", "-1", "16"], 0, ("batch", dim_exprs.scale("seq", 2), 16)),
    (["-1", "s", "8"], 0, (dim_exprs.scale("batch", 4), "seq", 8)),
    (["b", "-1", "16"], 1, ("batch", None, 16)),  # a dim left over: at s = 0 onnxruntime skips it
    (["b", "s", "-1", "5"], 1, ("batch", "seq", None, 5)),  # 32 is not a multiple of 5: the node fails
    (["s", "b", "-1", "16"], 1, ("seq", "batch", 2, 16)),  # the others cancel in any order
])  # fmt: skip
def test_minus_one_derived_is_onnxruntimes(pieces: list[str], allowzero: int, expected: tuple) -> None:
    model = _view(pieces, allowzero)
    found, values = _derived(model)
    derived = found.shape(values["y"])
    assert derived is not None
    assert tuple(d if not isinstance(d, str) or not d.startswith("unk__") else None for d in derived) == expected
    session = helpers.ort_session(model)
    for b in (0, 1, 3):
        for s in (0, 1, 2):
            try:
                (y,) = session.run(None, {"x": np.ones((b, s, 32), np.float32)})
            except Exception:  # noqa: BLE001  (a -1 beside a 0 without allowzero)
                continue
            for dim, actual in zip(expected, y.shape):
                if dim is not None:
                    assert _evaluate(dim, {"batch": b, "seq": s}) == actual, (pieces, b, s)


# --- the same, as torch's dynamo exporter writes it ---------------------------------------------


def _dynamo_export() -> onnx.ModelProto:
    """Convs (k10 s5, k3 s2, k3 s2) over ``x: [batch, samples]``; attention over ``view(b, samples//20 - 1, -1, 16)``."""
    import warnings

    torch = pytest.importorskip("torch")
    torch.manual_seed(0)

    class Extractor(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.convs = torch.nn.ModuleList([torch.nn.Conv1d(1, 8, 10, stride=5), torch.nn.Conv1d(8, 8, 3, stride=2),
                                              torch.nn.Conv1d(8, 32, 3, stride=2)])  # fmt: skip

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = x[:, None]
            for conv in self.convs:
                h = torch.relu(conv(h))
            b, n = x.shape[0], x.shape[1] // 20 - 1
            v = h.transpose(1, 2).reshape(b, n, -1, 16).transpose(1, 2)
            a = torch.softmax(v @ v.transpose(-1, -2), -1) @ v
            return a.reshape(b, 2, n, 16).transpose(1, 2).reshape(b, n, 32)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dims = ({0: torch.export.Dim("batch"), 1: torch.export.Dim("samples", min=40)},)
        program = torch.onnx.export(Extractor(), (torch.randn(2, 400),), dynamo=True, dynamic_shapes=dims,
                                    opset_version=18, verbose=False)  # fmt: skip
    return program.model_proto


def test_dynamo_export_view_back_goes() -> None:
    original = _dynamo_export()
    views = [node for node in original.graph.node if node.op_type == "Reshape"]
    result, _ = _simplify(original)
    kept = [node for node in result.graph.node if node.op_type == "Reshape"]
    assert len(kept) == len(views) - 1  # the view back to [b, 2, L, 16] (the attention output's own shape)
    assert not any(node.input[0].startswith("matmul") for node in kept)
    rng = np.random.default_rng(1)
    for batch in (0, 1, 2):
        for samples in (40, 59, 60, 61, 99, 100, 123):
            feeds = {"x": rng.standard_normal((batch, samples)).astype(np.float32)}
            assert _run_both(original, result, feeds), (batch, samples)


def test_view_back_in_a_branch_goes() -> None:
    """The same extractor as an If's branch: the branch's own facts prove the view back there too.

    The else branch gives another shape, so the If's output shape is not the then branch's.
    """
    inner = _extractor()
    cond = helper.make_tensor_value_info("cond", TensorProto.BOOL, [])
    body = helper.make_graph(list(inner.graph.node), "then", [], [_io("out", [None] * 4)], list(inner.graph.initializer))
    other = helper.make_graph([_const("skip", np.zeros((1, 2, 1, 16), np.float32))], "else", [], [_io("skip", [1, 2, 1, 16])])
    model = _model([helper.make_node("If", ["cond"], ["y"], then_branch=body, else_branch=other)],
                   [_io("x", ["batch", "samples"]), cond], [_io("y", [None] * 4)])  # fmt: skip
    result, _ = _simplify(model, full_check=False)
    branch = next(a.g for node in result.graph.node for a in node.attribute if a.name == "then_branch")
    assert [node.output[0] for node in branch.node if node.op_type == "Reshape"] == ["l1", "view"]
    assert [output.name for output in branch.output] == ["out"]
    ran = 0
    for samples in (40, 59, 60, 100):
        for flag in (True, False):
            ran += _run_both(model, result, {"x": _floats(2, samples), "cond": np.array(flag)})
    assert ran == 8
