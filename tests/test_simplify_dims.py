"""Dims derived from what the ops require (``passes.simplify.dims``), and the rewrites they allow.

onnx shape inference gives a fresh symbol to the length of ``Range(0, n, 1)``,
to a broadcast of two different symbols, to the dims of a Slice with computed
ends and of an Expand to a computed shape; the rules then could not prove
that a Reshape rebuilding ``[batch, seq, ...]`` restores its input. Each case
here runs the original and the simplified model in onnxruntime (optimisations
disabled) at several shapes, sizes 0 and 1 included, and compares values and
shapes exactly; the negative cases are where a dim is *not* proved, and there
the node must stay (a shape where removing it would change the result is run).

Left on purpose here: dynamo's ``view(batch, samples // 20 - 1, -1, 16)`` of a
tensor ``h`` whose frames are a graph input (not a conv stack's): nothing
proves ``frames == samples // 20 - 1``, so the view back to ``[batch, 2, L, 16]``
stays (onnxruntime sizes a ``-1`` beside a zero by a rule of its own, see
``tests/test_simplify_conv_dims.py``, where the frames come from convs and the
view back goes).
"""

from __future__ import annotations

import functools

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from hypothesis import event, given, reject, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import helpers
from passes.ir import inference
from passes.ir.names import Names
from passes.ir.walk import iter_scopes
from passes.simplify.dims import Clamped, SymbolicDims, broadcast_dim, derive
from passes.simplify.rules import Context
from test_simplify import _const, _io, _model, _ops, _simplify

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _run_both(original: onnx.ModelProto, result: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> bool:
    """Compares both models on ``feeds`` exactly (shapes too); False when the original fails there."""
    try:
        expected = helpers.ort_run(original, feeds)
    except Exception:  # noqa: BLE001  (the original does not accept this input: anything goes)
        return False
    got = helpers.ort_run(result, feeds)
    assert len(expected) == len(got)
    for a, b in zip(expected, got):
        assert a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    return True


def _floats(*shape: int) -> np.ndarray:
    return np.random.default_rng(sum(shape) + len(shape)).standard_normal(shape).astype(np.float32)


def _dim_nodes(source: str, axis: int, out: str) -> list[onnx.NodeProto]:
    """``out = Unsqueeze(Gather(Shape(source), axis), [0])``: dim ``axis`` of ``source`` as a 1-D tensor."""
    return [helper.make_node("Shape", [source], [f"{out}_shape"]), _const(f"{out}_i", np.array(axis)),
            helper.make_node("Gather", [f"{out}_shape", f"{out}_i"], [f"{out}_s"], axis=0),
            _const(f"{out}_z", np.array([0])), helper.make_node("Unsqueeze", [f"{out}_s", f"{out}_z"], [out])]


def _derived(proto: onnx.ModelProto) -> tuple[SymbolicDims, dict[str, ir.Value]]:
    """What :func:`derive` finds for ``proto``'s main graph, and its values by name."""
    model = ir.serde.deserialize_model(proto)
    inferred = inference.infer_all(model)
    ctx = Context(next(iter_scopes(model)), lambda: inferred, lambda: Names(model))
    values = {v.name: v for node in model.graph for v in node.outputs}
    values.update({v.name: v for v in model.graph.inputs})
    return derive(model.graph, ctx), values


# --- the broadcast rule, against concrete numbers ---------------------------------------------

@pytest.mark.parametrize("dims, expected", [
    (["s", "s"], "s"), (["s", 1], "s"), ([1, 1], 1), (["s", 4], 4), ([4, 1, "s"], 4), ([3, 4], None),
    (["s", "t"], None), (["s", Clamped("s", 4)], "s"), ([Clamped("s", 4), "s", 1], "s"),
    (["s", Clamped("s", 0)], None), (["t", Clamped("s", 4)], None), ([Clamped("s", 4)] * 2, Clamped("s", 4)),
    ([None, 4], 4), ([None, "s"], None), ([None, 1], None), ([-1, "s"], None),
])  # fmt: skip
def test_broadcast_dim(dims: list, expected: object) -> None:
    assert broadcast_dim(dims) == expected


_SYMBOLIC = st.one_of(st.integers(0, 4), st.sampled_from(["s", "t"]),
                      st.builds(Clamped, st.just("s"), st.integers(0, 4)))  # fmt: skip


def _value(dim: object, sizes: dict[str, int]) -> int:
    if isinstance(dim, Clamped):
        return min(sizes[dim.symbol], dim.bound)
    return sizes[dim] if isinstance(dim, str) else dim  # type: ignore[return-value]


@settings(max_examples=400)
@given(st.lists(_SYMBOLIC, min_size=1, max_size=4), st.integers(0, 6), st.integers(0, 6))
def test_broadcast_dim_holds_whenever_the_broadcast_succeeds(dims: list, s: int, t: int) -> None:
    """For every size of the symbols where numpy broadcasts the dims, the derived dim is the result."""
    derived = broadcast_dim(dims)
    sizes = {"s": s, "t": t}
    try:
        (actual,) = np.broadcast_shapes(*[(_value(d, sizes),) for d in dims])
    except ValueError:
        reject()  # these sizes do not broadcast: not an example
    if derived is not None:
        assert _value(derived, sizes) == actual


@functools.cache
def _broadcasting_session(op: str) -> object:
    """A session of ``op`` over two inputs of any shape (Expand: a data and a shape; Where: a condition and x)."""
    if op == "Expand":
        inputs = [_io("a", None), _io("b", [None], I64)]
    elif op == "Where":
        inputs = [_io("a", None, TensorProto.BOOL), _io("b", None)]
    else:
        inputs = [_io("a", None), _io("b", None)]
    node = helper.make_node(op, ["a", "b", "b"] if op == "Where" else ["a", "b"], ["y"])
    graph = helper.make_graph([node], "g", inputs, [_io("y", None)])
    return helpers.ort_session(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))


@settings(max_examples=300)
@given(st.sampled_from(["Add", "Expand", "Where"]), st.lists(st.tuples(_SYMBOLIC, _SYMBOLIC), min_size=1, max_size=3),
       st.integers(0, 5), st.integers(0, 5))  # fmt: skip
def test_broadcast_dim_holds_in_onnxruntime(op: str, pairs: list, s: int, t: int) -> None:
    """onnxruntime's own broadcasting (empty tensors included): where it runs, each derived dim is its dim.

    Labels the examples where it ran (hypothesis' statistics), to see that they are many.
    """
    sizes = {"s": s, "t": t}
    a = [_value(x, sizes) for x, _ in pairs]
    b = [_value(y, sizes) for _, y in pairs]
    second = np.array(b, np.int64) if op == "Expand" else np.zeros(b, np.float32)
    try:
        first = np.zeros(a, np.bool_ if op == "Where" else np.float32)
        (got,) = _broadcasting_session(op).run(None, {"a": first, "b": second})  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001  (onnxruntime refuses these shapes)
        reject()
    event(f"{op} ran")
    for i, (x, y) in enumerate(pairs):
        derived = broadcast_dim([x, y])
        if derived is not None:
            assert _value(derived, sizes) == got.shape[i]


def test_union_find() -> None:
    found = SymbolicDims()
    found.union("unk__1", "s")
    found.union("unk__2", Clamped("unk__1", 8))
    assert found.find("unk__1") == "s" and found.find("unk__2") == Clamped("s", 8)
    found.union("s", 3)
    assert found.find("unk__2") == 3 and found.find(Clamped("unk__1", 2)) == 2
    found.union(3, 4)  # a contradiction (the model never runs): not recorded
    assert found.find(4) == 4 and found.find("s") == 3


# --- Range, broadcasts, MatMul: a Reshape back to the input's shape goes ---------------------

def _range_plus_x(start: int = 0, delta: int = 1) -> onnx.ModelProto:
    """``y = x + Range(start, seq, delta)[None, :, None]``, then ``Reshape(y, [batch, seq, 4])`` from x's shape."""
    nodes = [*_dim_nodes("x", 0, "b"), *_dim_nodes("x", 1, "s1"),
             _const("start", np.array(start)), _const("delta", np.array(delta)),
             helper.make_node("Range", ["start", "s1_s", "delta"], ["r"]),
             helper.make_node("Cast", ["r"], ["rf"], to=F), _const("axes", np.array([0, 2])),
             helper.make_node("Unsqueeze", ["rf", "axes"], ["ru"]), helper.make_node("Add", ["x", "ru"], ["y"]),
             _const("four", np.array([4])), helper.make_node("Concat", ["b", "s1", "four"], ["target"], axis=0),
             helper.make_node("Reshape", ["y", "target"], ["z"]), helper.make_node("Relu", ["z"], ["out"])]
    return _model(nodes, [_io("x", ["batch", "seq", 4])], [_io("out", [None, None, 4])])


SHAPES = [(1, 1), (2, 5), (0, 3), (3, 0), (1, 2), (2, 1)]


def test_range_length_is_its_limit() -> None:
    original = _range_plus_x()
    found, values = _derived(original)
    assert found.shape(values["r"]) == ("seq",) and found.shape(values["y"]) == ("batch", "seq", 4)
    result, stats = _simplify(original)
    assert "Reshape" not in _ops(result), stats
    for b, s in SHAPES:
        assert _run_both(original, result, {"x": _floats(b, s, 4)})


@pytest.mark.parametrize("start, delta", [(1, 1), (0, 2)])
def test_range_of_another_length_is_not_its_limit(start: int, delta: int) -> None:
    """``Range(1, s, 1)`` has ``s - 1`` elements: at batch 0 and seq 1 the Add gives ``[0, 0, 4]``, the Reshape ``[0, 1, 4]``."""
    original = _range_plus_x(start, delta)
    found, values = _derived(original)
    assert found.shape(values["y"])[1] != "seq"
    result, _ = _simplify(original)
    assert "Reshape" in _ops(result)
    assert _run_both(original, result, {"x": _floats(0, 1, 4)})
    # Range(start, s, delta) broadcasts against seq only where its length is s or 1 (or s is 0 with
    # it): the original refuses the other shapes, and the result agrees wherever it runs.
    ran = [(b, s) for b, s in SHAPES if _run_both(original, result, {"x": _floats(b, s, 4)})]
    length = {(1, 1): lambda s: max(0, s - 1), (0, 2): lambda s: (s + 1) // 2}[(start, delta)]
    assert ran == [(b, s) for b, s in SHAPES if length(s) in (s, 1)], ran


def _position_table(rows: int, length_from: str = "x") -> onnx.ModelProto:
    """``y = x + table[:seq]`` (a learned position table of ``rows`` rows), then ``Reshape(y, Shape(x))``."""
    table = _floats(rows, 4)
    nodes = [_const("table", table), *_dim_nodes(length_from, 1, "n"), _const("zero", np.array([0])),
             helper.make_node("Slice", ["table", "zero", "n", "zero"], ["rows"]),
             helper.make_node("Add", ["x", "rows"], ["y"]), helper.make_node("Shape", ["x"], ["xs"]),
             helper.make_node("Reshape", ["y", "xs"], ["z"]), helper.make_node("Relu", ["z"], ["out"])]
    inputs = [_io("x", ["batch", "seq", 4])] + ([_io("other", ["batch", "len"])] if length_from == "other" else [])
    return _model(nodes, inputs, [_io("out", [None, None, 4])])


def test_slice_of_a_table_up_to_the_length_broadcasts_to_the_length() -> None:
    original = _position_table(5)
    found, values = _derived(original)
    assert found.shape(values["rows"]) == (Clamped("seq", 5), 4)
    assert found.shape(values["y"]) == ("batch", "seq", 4)
    result, _ = _simplify(original)
    assert "Reshape" not in _ops(result)


@settings(max_examples=60)
@given(st.integers(1, 5), st.integers(0, 3), st.integers(0, 7))
def test_position_table_property(rows: int, batch: int, seq: int) -> None:
    """At every size where the original runs (seq <= rows, or a table of one row), the result is the same."""
    original = _position_table(rows)
    result, _ = _simplify(original)
    assert "Reshape" not in _ops(result)
    ran = _run_both(original, result, {"x": _floats(batch, seq, 4)})
    assert ran == (seq <= rows or rows == 1)


def test_slice_up_to_another_length_is_not_proved() -> None:
    """The table is sliced to another input's length: ``[0, 1, 4] + [3, 4]`` is ``[0, 3, 4]``, reshaped to ``[0, 1, 4]``."""
    original = _position_table(5, length_from="other")
    found, values = _derived(original)
    assert found.shape(values["y"])[1] not in ("seq", "len")
    result, _ = _simplify(original)
    assert "Reshape" in _ops(result)
    feeds = {"x": _floats(0, 1, 4), "other": np.zeros((0, 3), np.float32)}
    assert _run_both(original, result, feeds)
    assert helpers.ort_run(result, feeds)[0].shape == (0, 1, 4)


def _attention() -> onnx.ModelProto:
    """T5's self-attention with a relative bias from ``Range(0, seq)``, its output reshaped by its own dims."""
    nodes = [_const("heads", np.array([0, 0, 2, 4])), helper.make_node("Reshape", ["x", "heads"], ["xh"]),
             helper.make_node("Transpose", ["xh"], ["q"], perm=[0, 2, 1, 3]),
             helper.make_node("Transpose", ["xh"], ["kt"], perm=[0, 2, 3, 1]),
             helper.make_node("MatMul", ["q", "kt"], ["scores"]),
             *_dim_nodes("q", 2, "len"), _const("zero", np.array(0)), _const("one", np.array(1)),
             helper.make_node("Range", ["zero", "len_s", "one"], ["r"]),
             _const("a0", np.array([0])), _const("a1", np.array([1])),
             helper.make_node("Unsqueeze", ["r", "a0"], ["row"]), helper.make_node("Unsqueeze", ["r", "a1"], ["col"]),
             helper.make_node("Sub", ["row", "col"], ["rel"]), helper.make_node("Cast", ["rel"], ["bias"], to=F),
             helper.make_node("Add", ["scores", "bias"], ["logits"]),
             helper.make_node("Softmax", ["logits"], ["weights"], axis=-1),
             helper.make_node("MatMul", ["weights", "q"], ["o"]),
             *_dim_nodes("o", 0, "ob"), _const("two", np.array([2])), _const("four", np.array([4])),
             helper.make_node("Concat", ["ob", "two", "len", "four"], ["back"], axis=0),
             helper.make_node("Reshape", ["o", "back"], ["o2"]),
             helper.make_node("Transpose", ["o2"], ["ot"], perm=[0, 2, 1, 3]),
             *_dim_nodes("x", 0, "xb"), *_dim_nodes("x", 1, "xs"), _const("minus", np.array([-1])),
             helper.make_node("Concat", ["xb", "xs", "minus"], ["merged"], axis=0),
             helper.make_node("Reshape", ["ot", "merged"], ["out"])]
    return _model(nodes, [_io("x", ["batch", "seq", 8])], [_io("out", [None, None, None])])


def test_attention_output_keeps_its_dims() -> None:
    original = _attention()
    found, values = _derived(original)
    assert found.shape(values["o"]) == ("batch", 2, "seq", 4)
    result, _ = _simplify(original)
    assert _ops(original).count("Reshape") - _ops(result).count("Reshape") == 1
    for b, s in SHAPES:  # a size 0: the original's -1 next to a 0 fails in onnxruntime
        assert _run_both(original, result, {"x": _floats(b, s, 8)}) or 0 in (b, s)


def test_matmul_in_a_branch_proves_nothing_in_the_main_graph() -> None:
    """A MatMul needs equal contracted dims only where it runs: in an If branch it may not."""
    then = helper.make_graph([helper.make_node("MatMul", ["a", "c"], ["p"])], "then", [], [_io("p", [None, None])])
    other = helper.make_graph([helper.make_node("Identity", ["a"], ["q"])], "else", [], [_io("q", [None, None])])
    nodes = [*_dim_nodes("a", 1, "k"), *_dim_nodes("c", 1, "n"),
             helper.make_node("Concat", ["k", "n"], ["target"], axis=0),
             helper.make_node("Reshape", ["c", "target"], ["y"]),
             helper.make_node("If", ["cond"], ["branch"], then_branch=then, else_branch=other)]
    original = _model(nodes, [_io("a", ["m", "k1"]), _io("c", ["k2", "n"]), _io("cond", [], TensorProto.BOOL)],
                      [_io("y", [None, None]), _io("branch", [None, None])])  # fmt: skip
    result, _ = _simplify(original)
    assert "Reshape" in _ops(result)
    feeds = {"a": _floats(2, 3), "c": _floats(5, 0), "cond": np.array(False)}
    assert _run_both(original, result, feeds)


def test_matmul_contracted_dims_are_equal() -> None:
    """In the main graph it does: ``Reshape(c, [k1, n])`` of ``c: [k2, n]`` is then ``c``."""
    nodes = [helper.make_node("MatMul", ["a", "c"], ["p"]), *_dim_nodes("a", 1, "k"), *_dim_nodes("c", 1, "n"),
             helper.make_node("Concat", ["k", "n"], ["target"], axis=0),
             helper.make_node("Reshape", ["c", "target"], ["r"]), helper.make_node("Relu", ["r"], ["y"])]
    original = _model(nodes, [_io("a", ["m", "k1"]), _io("c", ["k2", "n"])], [_io("y", [None, None]), _io("p", [None, None])])
    result, _ = _simplify(original)
    assert "Reshape" not in _ops(result)
    for m, k, n in [(2, 3, 4), (1, 1, 1), (0, 2, 0), (2, 0, 3)]:
        assert _run_both(original, result, {"a": _floats(m, k), "c": _floats(k, n)})


def test_concat_proves_nothing_of_its_other_axes() -> None:
    """onnxruntime skips an empty input of Concat: ``Concat([0, 5], [2, 3])`` runs, so 5 and 3 need not agree.

    ``Reshape(e, [0, a.size(1)])`` of ``e: [0, n]`` gives ``[0, 3]``: not ``e`` (``[0, 5]``).
    """
    nodes = [helper.make_node("Concat", ["e", "a"], ["c"], axis=0), *_dim_nodes("a", 1, "m"),
             _const("zero", np.array([0])), helper.make_node("Concat", ["zero", "m"], ["target"], axis=0),
             helper.make_node("Reshape", ["e", "target"], ["r"]), helper.make_node("Relu", ["r"], ["y"])]
    original = _model(nodes, [_io("e", ["k", "n"]), _io("a", ["j", "m"])], [_io("y", [None, None]), _io("c", [None, None])])
    found, values = _derived(original)
    assert found.find("n") != found.find("m")
    result, _ = _simplify(original)
    assert "Reshape" in _ops(result)
    feeds = {"e": _floats(0, 5), "a": _floats(2, 3)}
    assert _run_both(original, result, feeds) and helpers.ort_run(result, feeds)[0].shape == (0, 3)


# --- Slice's unsliced axes, Where in shape arithmetic: BERT's token types -------------------

def _token_types(rows: int = 6) -> onnx.ModelProto:
    """``buffer[:, :seq].expand(b, -1)`` with ``b = buffer[:, :seq].size(0)`` (1), as TorchScript writes it."""
    nodes = [_const("buffer", np.arange(rows, dtype=np.int64).reshape(1, rows)), *_dim_nodes("ids", 1, "n"),
             _const("zero", np.array([0])), _const("one", np.array([1])),
             helper.make_node("Slice", ["buffer", "zero", "n", "one", "one"], ["sliced"]),
             *_dim_nodes("sliced", 0, "rows"), _const("minus", np.array([-1])),
             helper.make_node("Concat", ["rows", "minus"], ["built"], axis=0),
             _const("is_minus", np.array([False, True])), _const("ones", np.array([1, 1])),
             helper.make_node("Where", ["is_minus", "ones", "built"], ["shape"]),
             helper.make_node("Expand", ["sliced", "shape"], ["types"]),
             helper.make_node("Add", ["types", "ids"], ["out"])]
    return _model(nodes, [_io("ids", ["batch", "seq"], I64)], [_io("out", [None, None], I64)])


def test_slice_keeps_the_axes_it_does_not_slice() -> None:
    original = _token_types()
    found, values = _derived(original)
    assert found.shape(values["sliced"]) == (1, Clamped("seq", 6))
    result, _ = _simplify(original)
    assert "Expand" not in _ops(result) and "Where" not in _ops(result)
    for b, s in SHAPES:
        assert _run_both(original, result, {"ids": np.arange(b * s, dtype=np.int64).reshape(b, s)})


# --- Reshape of a flattened tensor to a computed shape ---------------------------------------

def _view_of_flat(first: str = "x") -> onnx.ModelProto:
    """``x.view(-1).view(shape)`` with ``shape`` ``[x.size(0), x.size(1)]``, or ``[z.size(0), w.size(0)]`` for ``first="z"``."""
    second = _dim_nodes("x", 1, "d1") if first == "x" else _dim_nodes("w", 0, "d1")
    nodes = [_const("flat", np.array([-1])), helper.make_node("Reshape", ["x", "flat"], ["f"]),
             *_dim_nodes(first, 0, "d0"), *second, helper.make_node("Concat", ["d0", "d1"], ["target"], axis=0),
             helper.make_node("Reshape", ["f", "target"], ["y"])]
    inputs = [_io("x", ["n", "m", 1])] + ([_io("z", ["k"]), _io("w", ["j"])] if first == "z" else [])
    return _model(nodes, inputs, [_io("y", [None, None])])


def test_reshape_of_a_flat_tensor_to_its_own_dims() -> None:
    original = _view_of_flat()
    result, stats = _simplify(original)
    assert _ops(result).count("Reshape") == 1 and stats["applied"].get("chains/reshape_of_reshape")
    for n, m in [(2, 3), (0, 3), (2, 0), (1, 1)]:  # m = 0: the original copies past a 1-D tensor's rank, and fails
        assert _run_both(original, result, {"x": _floats(n, m, 1)}) or m == 0


def test_reshape_of_a_flat_tensor_to_other_dims_stays() -> None:
    """Entry 0 from another tensor: a 0 there copies the flat count in the original, x's dim 0 if merged.

    ``x: [2, 3, 1]``, ``z: [0]``, ``w: [1]``: the original gives ``[6, 1]``; a merged Reshape would
    ask ``[2, 1]`` of 6 elements.
    """
    original = _view_of_flat("z")
    result, stats = _simplify(original)
    assert not stats["applied"].get("chains/reshape_of_reshape")
    feeds = {"x": _floats(2, 3, 1), "z": np.zeros(0, np.float32), "w": np.zeros(1, np.float32)}
    assert _run_both(original, result, feeds)
    assert helpers.ort_run(result, feeds)[0].shape == (6, 1)


# --- dynamo's views by a computed length the frames are not proved to equal: left (see the docstring) ---

def _dynamo_view(allowzero: int) -> onnx.ModelProto:
    """An attention view as dynamo writes it: ``L = samples // 20 - 1`` (a value, not a dim) in ``view(batch, L, -1, 16)``.

    The heads are transposed, activated, and viewed back as ``[batch, 2, L, 16]``.
    """
    nodes = [helper.make_node("Shape", ["x"], ["b"], start=0, end=1),
             helper.make_node("Shape", ["x"], ["n1"], start=1, end=2), helper.make_node("Squeeze", ["n1"], ["n"]),
             _const("twenty", np.array(20)), helper.make_node("Div", ["n", "twenty"], ["q"]),
             _const("minus_one", np.array(-1)), helper.make_node("Add", ["q", "minus_one"], ["length"]),
             _const("flat", np.array([-1])), helper.make_node("Reshape", ["length", "flat"], ["l1"]),
             _const("heads", np.array([-1])), _const("width", np.array([16])),
             helper.make_node("Concat", ["b", "l1", "heads", "width"], ["t"], axis=0),
             helper.make_node("Reshape", ["h", "t"], ["view"], allowzero=allowzero),
             helper.make_node("Transpose", ["view"], ["o"], perm=[0, 2, 1, 3]), helper.make_node("Relu", ["o"], ["o2"]),
             _const("two", np.array([2])), helper.make_node("Concat", ["b", "two", "l1", "width"], ["back"], axis=0),
             helper.make_node("Reshape", ["o2", "back"], ["out"], allowzero=allowzero)]
    return _model(nodes, [_io("x", ["batch", "samples"]), _io("h", ["batch", "frames", 32])],
                  [_io("out", [None, None, None, None])])  # fmt: skip


def test_allowzero_views_prove_no_size_positive() -> None:
    """``allowzero=1``: onnxruntime runs ``[0, L, -1, 16]`` (the spec says invalid) and picks the -1 itself.

    At batch 0 and ``L = 2`` the heads are then not 2: the view back must stay.
    """
    original = _dynamo_view(allowzero=1)
    result, _ = _simplify(original)
    assert any(node.op_type == "Reshape" and "out" in node.output for node in result.graph.node)
    assert _run_both(original, result, {"x": _floats(0, 60), "h": _floats(0, 0, 32)})


@st.composite
def _dynamo_sizes(draw: st.DrawFn) -> tuple[int, int, int, int]:
    """``(allowzero, batch, samples, frames)`` the original accepts, with ``L = samples // 20 - 1``.

    The view ``[batch, L, -1, 16]`` of ``h`` and the view back ``[batch, 2, L, 16]`` run when
    ``frames == L`` (2 heads); with ``allowzero=0`` a 0 in a target copies the input's dim, so
    ``L = 0`` runs with any ``frames >= 1``; with ``allowzero=1`` and batch 0 every view is empty
    and onnxruntime runs ``L <= 2`` with any ``frames`` (it picks the -1 itself).
    """
    allowzero = draw(st.sampled_from([0, 1]), label="allowzero")
    batch = draw(st.integers(0 if allowzero else 1, 3), label="batch")
    if allowzero and batch == 0 and draw(st.booleans(), label="any frames"):
        length, frames = draw(st.integers(0, 2), label="L"), draw(st.integers(0, 6), label="frames")
    elif not allowzero and draw(st.booleans(), label="L = 0"):
        length, frames = 0, draw(st.integers(1, 6), label="frames")
    else:
        length = draw(st.integers(0 if allowzero else 1, 5), label="L")
        frames = length
    samples = 20 * (length + 1) + draw(st.integers(0, 19), label="samples % 20")
    return allowzero, batch, samples, frames


@settings(max_examples=60)
@given(_dynamo_sizes())
def test_dynamo_view_property(sizes: tuple[int, int, int, int]) -> None:
    """At sizes the original runs (batch 0 and ``L = 0`` included), the result is the same."""
    allowzero, batch, samples, frames = sizes
    original = _dynamo_view(allowzero=allowzero)
    result, _ = _simplify(original)
    assert _run_both(original, result, {"x": _floats(batch, samples), "h": _floats(batch, frames, 32)}), sizes


# --- Transpose, shape-preserving ops, Reshape to its target's entries -------------------------

def _heads_view(variant: str = "attention") -> onnx.ModelProto:
    """``view(b, s, 2, 16)`` of ``x: [batch, seq, 32]``, attention over its heads, then a view back to ``[b, 2, s, 16]``.

    The view's target goes through a ``Where`` (as TorchScript's ``expand`` writes), which onnx's
    data propagation does not follow: inference gives the view fresh symbols, and only
    :func:`derive` can prove the view back restores the attention output. Traps:
    ``minus_one`` views ``x: [batch, seq, 64]`` as ``[b, -1, 2, 16]``; ``copied_zero`` views with
    ``allowzero=0`` by a dim ``n`` of another input (a 0 there copies ``seq``), and back by
    ``[b, 2, n, 16]``; ``moved`` transposes the seq axis last (``[b, 2, 16, s]``).
    """
    second = {"minus_one": "minus", "copied_zero": "n"}.get(variant, "s")
    nodes = [*_dim_nodes("x", 0, "b"), *_dim_nodes("x", 1, "s"), *_dim_nodes("z", 0, "n"),
             _const("two", np.array([2])), _const("w", np.array([16])), _const("minus", np.array([-1])),
             helper.make_node("Concat", ["b", second, "two", "w"], ["t0"], axis=0),
             _const("pick", np.array([True, True, False, True])), _const("heads", np.array([1, 1, 2, 1])),
             helper.make_node("Where", ["pick", "t0", "heads"], ["t"]),
             helper.make_node("Reshape", ["x", "t"], ["view"], allowzero=0 if variant == "copied_zero" else 1)]
    if variant == "moved":
        nodes += [helper.make_node("Transpose", ["view"], ["q"], perm=[0, 2, 3, 1]), helper.make_node("Relu", ["q"], ["o"])]
    else:
        nodes += [helper.make_node("Transpose", ["view"], ["q"], perm=[0, 2, 1, 3]),
                  helper.make_node("Transpose", ["view"], ["k"], perm=[0, 2, 3, 1]),
                  helper.make_node("MatMul", ["q", "k"], ["scores"]),
                  helper.make_node("Softmax", ["scores"], ["p"], axis=-1), helper.make_node("IsNaN", ["p"], ["nan"]),
                  _const("zero", np.array(0.0, np.float32)), helper.make_node("Where", ["nan", "zero", "p"], ["p2"]),
                  helper.make_node("MatMul", ["p2", "q"], ["o"])]
    third = "n" if variant == "copied_zero" else "s"
    nodes += [helper.make_node("Concat", ["b", "two", third, "w"], ["back"], axis=0),
              helper.make_node("Reshape", ["o", "back"], ["out"], allowzero=1)]
    width = 64 if variant == "minus_one" else 32
    return _model(nodes, [_io("x", ["batch", "seq", width]), _io("z", ["zn"])], [_io("out", [None, None, None, None])])


def _derived_alone(proto: onnx.ModelProto) -> tuple[SymbolicDims, dict[str, ir.Value]]:
    """What :func:`derive` finds from the graph inputs' shapes alone (no inference at all)."""
    model = ir.serde.deserialize_model(proto)
    ctx = Context(next(iter_scopes(model)), lambda: {}, lambda: Names(model))
    values = {v.name: v for node in model.graph for v in node.outputs}
    return derive(model.graph, ctx), values


def _view_back_kept(result: onnx.ModelProto) -> bool:
    return any(node.op_type == "Reshape" and "out" in node.output for node in result.graph.node)


def test_transpose_softmax_isnan_and_reshape_carry_dims_alone() -> None:
    found, values = _derived_alone(_heads_view())
    expected = {"view": ("batch", "seq", 2, 16), "q": ("batch", 2, "seq", 16), "k": ("batch", 2, 16, "seq"),
                "scores": ("batch", 2, "seq", "seq"), "p": ("batch", 2, "seq", "seq"),
                "nan": ("batch", 2, "seq", "seq"), "p2": ("batch", 2, "seq", "seq"), "o": ("batch", 2, "seq", 16),
                "out": ("batch", 2, "seq", 16)}  # fmt: skip
    assert {name: found.shape(values[name]) for name in expected} == expected


def test_view_back_after_attention_goes() -> None:
    original = _heads_view()
    result, stats = _simplify(original)
    assert not _view_back_kept(result) and stats["applied"].get("noops/same_shape")
    for b, s in [(2, 5), (1, 3), (0, 3), (2, 0)]:
        assert _run_both(original, result, {"x": _floats(b, s, 32), "z": _floats(1)})
    again, stats = _simplify(result)  # a fixed point: nothing more to do
    assert not stats["applied"] and _ops(again) == _ops(result)


@pytest.mark.parametrize("variant, feeds", [
    ("minus_one", {"x": _floats(0, 3, 64), "z": _floats(1)}),  # the -1 is 6: [0, 2, 6, 16] viewed as [0, 2, 3, 16]
    ("copied_zero", {"x": _floats(0, 3, 32), "z": _floats(0)}),  # the 0 copies 3: [0, 2, 3, 16] viewed as [0, 2, 0, 16]
    ("moved", {"x": _floats(1, 3, 32), "z": _floats(1)}),  # [1, 2, 16, 3] viewed as [1, 2, 3, 16]
])  # fmt: skip
def test_view_back_stays_where_the_dims_differ(variant: str, feeds: dict[str, np.ndarray]) -> None:
    """At ``feeds`` the original runs and the view back changes the shape: it must stay."""
    original = _heads_view(variant)
    result, _ = _simplify(original)
    assert _view_back_kept(result)
    assert _run_both(original, result, feeds)
    assert helpers.ort_run(result, feeds)[0].shape != helpers.ort_run(_drop_view_back(original), feeds)[0].shape


def _drop_view_back(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto`` with its view back replaced by an Identity: what removing it would compute."""
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    for node in copy.graph.node:
        if node.op_type == "Reshape" and "out" in node.output:
            node.CopyFrom(helper.make_node("Identity", ["o"], ["out"]))
    return copy


@pytest.mark.parametrize("pieces, allowzero, expected", [
    (["b", "s", "four"], 0, ("batch", "seq", 4)),
    (["zero", "s", "four"], 0, ("batch", "seq", 4)),  # 0 copies the input's dim
    (["zero", "s", "four"], 1, (0, "seq", 4)),
    (["b", "minus", "four"], 1, ("batch", None, 4)),  # -1: not derived
    (["b", "n", "four"], 1, ("batch", "zn", 4)),
    (["b", "n", "four"], 0, ("batch", None, 4)),  # n may be 0, which copies seq
    (["s", "b", "four"], 0, (None, None, 4)),  # seq may be 0, which copies batch
])  # fmt: skip
def test_reshape_dims_from_its_target(pieces: list[str], allowzero: int, expected: tuple) -> None:
    nodes = [*_dim_nodes("x", 0, "b"), *_dim_nodes("x", 1, "s"), *_dim_nodes("z", 0, "n"),
             _const("zero", np.array([0])), _const("minus", np.array([-1])), _const("four", np.array([4])),
             helper.make_node("Concat", pieces, ["t"], axis=0),
             helper.make_node("Reshape", ["x", "t"], ["y"], allowzero=allowzero)]
    found, values = _derived_alone(_model(nodes, [_io("x", ["batch", "seq", 4]), _io("z", ["zn"])], [_io("y", None)]))
    assert found.shape(values["y"]) == expected


@pytest.mark.parametrize("node", [
    helper.make_node("ReduceMean", ["x", "axes"], ["y"], keepdims=0),
    helper.make_node("ReduceMean", ["x", "axes"], ["y"], keepdims=1),
    helper.make_node("Flatten", ["x"], ["y"], axis=1),
    helper.make_node("Transpose", ["x"], ["y"], perm=[0, 1]),  # not a permutation of 3 axes: the node fails
], ids=["reduce_keepdims_0", "reduce_keepdims_1", "flatten", "bad_perm"])  # fmt: skip
def test_ops_that_change_the_shape_derive_nothing(node: onnx.NodeProto) -> None:
    nodes = [_const("axes", np.array([1])), node]
    found, values = _derived_alone(_model(nodes, [_io("x", ["batch", "seq", 4])], [_io("y", None)]))
    assert found.shape(values["y"]) is None


def test_transpose_without_perm_reverses() -> None:
    nodes = [helper.make_node("Transpose", ["x"], ["y"]), helper.make_node("Sigmoid", ["y"], ["z"])]
    found, values = _derived_alone(_model(nodes, [_io("x", ["batch", "seq", 4])], [_io("z", None)]))
    assert found.shape(values["z"]) == (4, "seq", "batch")
