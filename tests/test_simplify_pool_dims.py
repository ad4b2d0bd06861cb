"""Pool, SAME-padded and transposed-conv lengths as onnxruntime computes them (``passes.simplify.dim_windows``).

A CNN exported from torch with ``MaxPool2d(3, 2, ceil_mode=True)`` over dynamic
H/W and a view by ``h // 2`` computed from the input's shape: the pool's length,
``floor((n + u - 3 - 1 + pads) / 2) + 1`` in onnxruntime's ceil rule, is ``floor(n / 2)``,
so the view and the Shape arithmetic feeding it go. Every derived length is run
against onnxruntime's output shape at many lengths, small ones included, where
onnxruntime's rules (a truncating division in floor mode, a last window dropped
in ceil mode) part from the schema's formulas; the traps must keep the view.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st
from onnx import helper, numpy_helper

import helpers
from test_simplify import _const, _io, _model, _simplify
from test_simplify_conv_dims import _evaluate
from test_simplify_dims import _derived, _floats, _run_both

_POOLS = ("MaxPool", "AveragePool", "LpPool")


def _window_model(op: str, kernel: int, attrs: dict, rank: int = 1) -> onnx.ModelProto:
    """``op`` over ``x: [1, 1, n]`` (or ``[1, 1, n, m]`` at rank 2) with a ones weight for the convs."""
    weights, inputs = [], ["x"]
    if op in ("Conv", "ConvTranspose"):
        weights = [numpy_helper.from_array(np.ones((1, 1) + (kernel,) * rank, np.float32), "w")]
        inputs.append("w")
    else:
        attrs = {**attrs, "kernel_shape": [kernel] * rank}
    spatial = ["n", "m"][:rank]
    return _model([helper.make_node(op, inputs, ["y"], **attrs)], [_io("x", ["batch", 1, *spatial])], [_io("y", None)],
                  weights, opset=19)  # fmt: skip


def _lengths(model: onnx.ModelProto, lengths: range, rank: int = 1, batch: int = 1) -> dict[int, int | None]:
    """onnxruntime's output length of the first spatial axis at each input length (None where it fails)."""
    session = helpers.ort_session(model)
    out: dict[int, int | None] = {}
    for n in lengths:
        try:
            (y,) = session.run(None, {"x": np.ones((batch, 1, n) + (5,) * (rank - 1), np.float32)})[:1]
        except Exception:  # noqa: BLE001  (the node fails at this length)
            out[n] = None
            continue
        out[n] = y.shape[2]
    return out


def _runs(model: onnx.ModelProto, lengths: range, rank: int = 1) -> list[tuple[int, int]]:
    """``(n, length)`` where onnxruntime runs, on an empty batch (where pools run at ``n = 0``) and a batch of 1."""
    return [(n, length) for batch in (0, 1) for n, length in _lengths(model, lengths, rank, batch).items()
            if length is not None]  # fmt: skip


@st.composite
def _windows(draw: st.DrawFn) -> tuple[str, int, dict]:
    op = draw(st.sampled_from([*_POOLS, "Conv", "ConvTranspose"]))
    kernel, stride = draw(st.integers(1, 5)), draw(st.integers(1, 4))
    dilation = draw(st.integers(1, 2))
    auto_pad = draw(st.sampled_from(["NOTSET", "NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"]))
    attrs: dict = {"strides": [stride], "dilations": [dilation], "auto_pad": auto_pad}
    if auto_pad == "NOTSET":  # onnxruntime refuses a pool whose pads are not below the kernel
        most = kernel - 1 if op in _POOLS else 3
        attrs["pads"] = [draw(st.integers(0, most)), draw(st.integers(0, most))]
    if op in _POOLS:
        attrs["ceil_mode"] = draw(st.integers(0, 1))
    if op == "ConvTranspose":
        attrs["output_padding"] = [draw(st.integers(0, stride - 1))]  # onnxruntime fails a larger one
    return op, kernel, attrs


@settings(max_examples=150, deadline=None)
@given(_windows())
def test_window_length_is_onnxruntimes(case: tuple[str, int, dict]) -> None:
    """Where derived, the length is onnxruntime's at every length 0..40 the node runs (``>= 1`` where marked)."""
    op, kernel, attrs = case
    model = _window_model(op, kernel, attrs)
    found, values = _derived(model)
    shape = found.shape(values["y"])
    derived = None if shape is None or len(shape) != 3 else shape[2]
    symbolic = derived is not None and not (isinstance(derived, str) and derived.startswith("unk__"))
    event(f"{op} {attrs['auto_pad']}: {'derived' if symbolic else 'not derived'}")
    assume(symbolic)
    runs = _runs(model, range(0, 41))
    for n, length in runs:
        assert length == _evaluate(derived, {"n": n}), (op, kernel, attrs, n, str(derived))
        if found.positive(derived):
            assert length >= 1
    assert runs


@pytest.mark.parametrize("op, kernel, attrs", [
    ("MaxPool", 3, {"strides": [1], "pads": [1, 1]}),  # Inception's
    ("MaxPool", 2, {"strides": [1]}),
    ("AveragePool", 3, {"strides": [2], "pads": [2, 1]}),
    ("MaxPool", 3, {"strides": [2], "ceil_mode": 1}),  # GoogLeNet's
    ("AveragePool", 2, {"strides": [2], "ceil_mode": 1}),
    ("MaxPool", 3, {"strides": [2], "auto_pad": "VALID", "ceil_mode": 1}),
    ("LpPool", 5, {"strides": [1], "pads": [2, 2]}),  # YOLO's SPPF kernel, as LpPool
    ("MaxPool", 3, {"strides": [2], "auto_pad": "SAME_UPPER"}),
    ("AveragePool", 3, {"strides": [3], "auto_pad": "SAME_LOWER", "ceil_mode": 1}),
    ("Conv", 3, {"strides": [2], "auto_pad": "SAME_UPPER"}),
    ("ConvTranspose", 4, {"strides": [2], "pads": [1, 1]}),
    ("ConvTranspose", 3, {"strides": [2], "pads": [1, 1], "output_padding": [1]}),
])  # fmt: skip
@pytest.mark.parametrize("rank", [1, 2])
def test_common_windows_are_derived(op: str, kernel: int, attrs: dict, rank: int) -> None:
    """The windows real models use are derived, on every spatial axis, and are onnxruntime's lengths."""
    attrs = {k: v * rank if isinstance(v, list) and k != "pads" else v for k, v in attrs.items()}
    if "pads" in attrs:
        attrs["pads"] = attrs["pads"][:1] * rank + attrs["pads"][1:] * rank
    model = _window_model(op, kernel, attrs, rank)
    found, values = _derived(model)
    derived = found.shape(values["y"])
    assert derived is not None and not any(isinstance(d, str) and d.startswith("unk__") for d in derived[2:]), derived
    runs = _runs(model, range(0, 30), rank)
    assert runs
    for n, length in runs:
        assert length == _evaluate(derived[2], {"n": n, "m": 5})


@pytest.mark.parametrize("kernel, pads, n, batch", [(2, [0, 0], 1, 1), (3, [1, 1], 0, 0)])
def test_truncating_floor_pool_is_not_derived(kernel: int, pads: list[int], n: int, batch: int) -> None:
    """``MaxPool(k=2, s=2)`` unpadded gives length 1 at n=1, and ResNet's ``MaxPool(k=3, s=2, pads=1)`` length 1 at
    n=0 on an empty batch, where the floor gives 0 (onnxruntime truncates); elsewhere it is the floor."""
    model = _window_model("MaxPool", kernel, {"strides": [2], "pads": pads})
    found, values = _derived(model)
    shape = found.shape(values["y"])
    assert shape is None or isinstance(shape[2], str) and shape[2].startswith("unk__")
    reach = sum(pads) - kernel
    assert _lengths(model, range(n, n + 1), batch=batch)[n] == 1 != (n + reach) // 2 + 1
    assert all(length == (m + reach) // 2 + 1 for m, length in _runs(model, range(n + 1, 12)))


def test_dilated_same_pool_is_not_derived() -> None:
    """onnxruntime's SAME pool with a dilation is not ``ceil(n / s)`` (its padding ignores the dilation)."""
    model = _window_model("MaxPool", 2, {"strides": [1], "dilations": [2], "auto_pad": "SAME_UPPER"})
    found, values = _derived(model)
    shape = found.shape(values["y"])
    assert shape is None or isinstance(shape[2], str)
    lengths = _lengths(model, range(1, 10))
    assert any(length is not None and length != n for n, length in lengths.items())


def test_pools_and_convs_fail_a_zero_length() -> None:
    """onnxruntime fails a zero length (also beside a non-zero one); a Conv even on an empty batch (the premise of
    its ``>= 1`` marks)."""
    for op, kernel, attrs in [("MaxPool", 3, {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
                              ("AveragePool", 2, {"strides": [2, 2], "ceil_mode": 1, "pads": [1, 1, 1, 1]}),
                              ("MaxPool", 3, {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
                              ("Conv", 3, {"strides": [2, 2], "auto_pad": "SAME_LOWER"}),
                              ("Conv", 3, {"strides": [2, 2], "pads": [1, 1, 1, 1]})]:  # fmt: skip
        model = _window_model(op, kernel, attrs, rank=2)
        assert _lengths(model, range(0, 1), rank=2) == {0: None}, op
        if op == "Conv":  # a pool runs on an empty batch, at any length: its SAME length is not marked
            assert _lengths(model, range(0, 1), rank=2, batch=0) == {0: None}


# --- a ceil-mode pool, its length arithmetic, and the view back ---------------------------------


def _pooled(length: str = "exact", stride: int = 2, pads: int = 0) -> onnx.ModelProto:
    """``x: [batch, 4, n]`` through ``MaxPool(k3, stride, ceil_mode=1)`` and Sigmoid, viewed as ``[b, 4, L]``.

    ``length`` writes ``L`` as: ``exact`` ``n // 2`` (the pool's length at stride 2, no pads);
    ``floor`` ``(n - 1) // 2`` (what the pool gives with ``ceil_mode=0``).
    """
    arithmetic = {"exact": [("Div", "n", "two", "length")],
                  "floor": [("Sub", "n", "one", "d"), ("Div", "d", "two", "length")]}[length]  # fmt: skip
    nodes = [helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[3], strides=[stride], ceil_mode=1,
                              pads=[pads, pads]),
             helper.make_node("Sigmoid", ["p"], ["s"]),
             helper.make_node("Shape", ["x"], ["b"], start=0, end=1),
             helper.make_node("Shape", ["x"], ["n1"], start=2, end=3), helper.make_node("Squeeze", ["n1"], ["n"]),
             _const("two", np.array(2)), _const("one", np.array(1)), _const("four", np.array([4])),
             *(helper.make_node(op, [a, b], [out]) for op, a, b, out in arithmetic),
             _const("axis0", np.array([0])), helper.make_node("Unsqueeze", ["length", "axis0"], ["l1"]),
             helper.make_node("Concat", ["b", "four", "l1"], ["t"], axis=0),
             helper.make_node("Reshape", ["s", "t"], ["out"])]  # fmt: skip
    return _model(nodes, [_io("x", ["batch", 4, "n"])], [_io("out", [None, None, None])])


def _compare(original: onnx.ModelProto, result: onnx.ModelProto) -> int:
    """Both at batch 0..2 and every length 0..24 (ceil and floor differ at the even ones); runs the original took."""
    return sum(_run_both(original, result, {"x": _floats(batch, 4, n)}) for batch in (0, 1, 2) for n in range(25))


def test_view_by_the_pools_length_goes() -> None:
    original = _pooled()
    result, stats = _simplify(original)
    assert [node.op_type for node in result.graph.node] == ["MaxPool", "Sigmoid"]
    assert stats["applied"]["noops/same_shape"] == 1
    assert result.graph.output[0].name == "out"
    assert _compare(original, result) == 3 * 24 + 1  # every length but 0, which runs on an empty batch


@pytest.mark.parametrize("length, stride, pads", [("floor", 2, 0), ("exact", 3, 0), ("exact", 2, 1)])
def test_view_by_another_length_stays(length: str, stride: int, pads: int) -> None:
    """The floor-mode length, another stride, padding: each differs from the pool's at some lengths."""
    original = _pooled(length, stride, pads)
    result, _ = _simplify(original)
    assert "Reshape" in [node.op_type for node in result.graph.node]
    _compare(original, result)


def test_lengths_where_the_traps_differ_are_run() -> None:
    pooled = {n: length for n, length in _lengths(_window_model("MaxPool", 3, {"strides": [2], "ceil_mode": 1}),
                                                  range(1, 25)).items()}  # fmt: skip
    assert pooled == {n: n // 2 for n in range(1, 25)}
    assert any(pooled[n] != (n - 1) // 2 for n in pooled)


# --- the same, as torch exports it ---------------------------------------------------------------


def _torch_export(dynamo: bool) -> onnx.ModelProto:
    """Conv, ReLU, ``MaxPool2d(3, 2, ceil_mode=True)`` over ``x: [b, 3, h, w]``, ``reshape(b, 8, h // 2, w // 2)``."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
            self.pool = torch.nn.MaxPool2d(3, 2, ceil_mode=True)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.pool(torch.relu(self.conv(x)))
            return torch.sigmoid(y).reshape(x.shape[0], 8, x.shape[2] // 2, x.shape[3] // 2)

    example = (torch.randn(2, 3, 32, 40),)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            dims = ({0: torch.export.Dim("batch"), 2: torch.export.Dim("h", min=4, max=512),
                     3: torch.export.Dim("w", min=4, max=512)},)  # fmt: skip
            return torch.onnx.export(Net(), example, dynamo=True, dynamic_shapes=dims, opset_version=18,
                                     verbose=False).model_proto  # fmt: skip
        import io

        buffer = io.BytesIO()
        torch.onnx.export(Net(), example, buffer, dynamo=False, opset_version=17, input_names=["x"],
                          dynamic_axes={"x": {0: "b", 2: "h", 3: "w"}})  # fmt: skip
        return onnx.load_from_string(buffer.getvalue())


@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "torchscript"])
def test_torch_export_view_goes(dynamo: bool) -> None:
    original = _torch_export(dynamo)
    assert "Reshape" in [node.op_type for node in original.graph.node]
    result, _ = _simplify(original)
    assert [node.op_type for node in result.graph.node] == ["Conv", "Relu", "MaxPool", "Sigmoid"]
    rng = np.random.default_rng(2)
    ran = 0
    for batch in (0, 1, 2):
        for h, w in ((1, 1), (4, 4), (5, 7), (8, 9), (17, 16), (33, 40)):
            ran += _run_both(original, result, {"x": rng.standard_normal((batch, 3, h, w)).astype(np.float32)})
    assert ran == 3 * 6


# --- If branches: their own facts, and only there -----------------------------------------------


def _branch(name: str, nodes: list[onnx.NodeProto], outputs: list[tuple[str, int]]) -> onnx.GraphProto:
    """A branch graph with ``outputs`` given as (name, rank)."""
    return helper.make_graph(nodes, name, [], [_io(o, [None] * rank) for o, rank in outputs])


def test_pool_view_in_a_branch_goes() -> None:
    """The ceil-mode pool and its view as an If's then branch (over the outer ``x``): the view goes there."""
    inner = _pooled()
    body = _branch("then", list(inner.graph.node), [("out", 3)])
    other = _branch("else", [helper.make_node("Sigmoid", ["x"], ["skip"])], [("skip", 3)])
    inputs = [_io("x", ["batch", 4, "n"]), _io("cond", [], onnx.TensorProto.BOOL)]
    model = _model([helper.make_node("If", ["cond"], ["y"], then_branch=body, else_branch=other)], inputs,
                   [_io("y", [None] * 3)])  # fmt: skip
    result, _ = _simplify(model, full_check=False)
    branch = next(a.g for node in result.graph.node for a in node.attribute if a.name == "then_branch")
    assert [node.op_type for node in branch.node] == ["MaxPool", "Sigmoid"]
    ran = sum(_run_both(model, result, {"x": _floats(batch, 4, n), "cond": np.array(flag)})
              for batch in (0, 2) for n in (1, 2, 5, 8, 13) for flag in (True, False))  # fmt: skip
    assert ran == 20


def test_pool_view_in_a_nested_branch_goes() -> None:
    """The same branch one If deeper (inside the outer If's then branch): the view goes there too."""
    inner = _pooled()
    leaf = _branch("leaf", list(inner.graph.node), [("out", 3)])
    skip = _branch("skip", [helper.make_node("Sigmoid", ["x"], ["s1"])], [("s1", 3)])
    middle = _branch("middle", [helper.make_node("If", ["cond2"], ["mid"], then_branch=leaf, else_branch=skip)], [("mid", 3)])
    other = _branch("else", [helper.make_node("Relu", ["x"], ["s2"])], [("s2", 3)])
    model = _model([helper.make_node("If", ["cond"], ["y"], then_branch=middle, else_branch=other)],
                   [_io("x", ["batch", 4, "n"]), _io("cond", [], onnx.TensorProto.BOOL),
                    _io("cond2", [], onnx.TensorProto.BOOL)], [_io("y", [None] * 3)])  # fmt: skip
    result, _ = _simplify(model, full_check=False)
    outer = next(a.g for node in result.graph.node for a in node.attribute if a.name == "then_branch")
    nested = next(a.g for node in outer.node for a in node.attribute if a.name == "then_branch")
    assert [node.op_type for node in nested.node] == ["MaxPool", "Sigmoid"]
    ran = sum(_run_both(model, result, {"x": _floats(batch, 4, n), "cond": np.array(a), "cond2": np.array(b)})
              for batch in (0, 2) for n in (1, 2, 5, 8) for a in (True, False) for b in (True, False))  # fmt: skip
    assert ran == 32


def _leak() -> onnx.ModelProto:
    """``If(c)``: the then branch's MatMul of ``A: [2, n]`` by ``B: [m, 3]`` requires ``n == m`` there alone.

    Each branch and the main graph expand ``a: [n]`` to ``Shape(b: [m])`` (then a Relu): a no-op only where
    ``n == m`` (at ``n = 1`` it broadcasts to ``m``, and runs).
    """
    def expand(out: str) -> list[onnx.NodeProto]:
        return [helper.make_node("Shape", ["b"], [f"{out}_shape"]),
                helper.make_node("Expand", ["a", f"{out}_shape"], [f"{out}_big"]), helper.make_node("Relu", [f"{out}_big"], [out])]

    then = _branch("then", [helper.make_node("MatMul", ["A", "B"], ["mm"]), *expand("e1")], [("e1", 1), ("mm", 2)])
    other = _branch("else", [*expand("e2"), _const("zeros", np.zeros((2, 3), np.float32))], [("e2", 1), ("zeros", 2)])
    nodes = [helper.make_node("If", ["c"], ["y", "w"], then_branch=then, else_branch=other), *expand("z")]
    inputs = [_io("c", [], onnx.TensorProto.BOOL), _io("a", ["n"]), _io("b", ["m"]), _io("A", [2, "n"]), _io("B", ["m", 3])]
    return _model(nodes, inputs, [_io("y", [None]), _io("w", [None, None]), _io("z", [None])])


def test_a_branchs_facts_stay_in_the_branch() -> None:
    original = _leak()
    result, _ = _simplify(original, full_check=False)
    branches = {a.name: a.g for node in result.graph.node for a in node.attribute}
    assert "Expand" not in [node.op_type for node in branches["then_branch"].node]  # n == m where it runs
    assert "Expand" in [node.op_type for node in branches["else_branch"].node]
    assert "Expand" in [node.op_type for node in result.graph.node]
    ran = 0
    for n, m in ((4, 4), (1, 5), (1, 1)):
        for flag in (True, False):
            feeds = {"c": np.array(flag), "a": _floats(n), "b": _floats(m), "A": _floats(2, n), "B": _floats(m, 3)}
            ran += _run_both(original, result, feeds)
    assert ran == 5  # the then branch fails at n=1, m=5


# --- Resize: to sizes, not by scales -------------------------------------------------------------


def _upsampled(factor: int = 2, view: int = 2) -> onnx.ModelProto:
    """``x: [b, 3, h, w]`` resized to ``sizes = [b, 3, factor*h, factor*w]`` (nearest), Sigmoid, then viewed as
    ``[b, 3, view*h, view*w]`` computed again from ``Shape(x)``."""
    nodes = [helper.make_node("Shape", ["x"], ["bc"], start=0, end=2), helper.make_node("Shape", ["x"], ["hw"], start=2),
             _const("factor", np.array(factor)), _const("view", np.array(view)),
             helper.make_node("Mul", ["hw", "factor"], ["hw2"]), helper.make_node("Concat", ["bc", "hw2"], ["sizes"], axis=0),
             helper.make_node("Resize", ["x", "", "", "sizes"], ["up"], mode="nearest"),
             helper.make_node("Sigmoid", ["up"], ["s"]),
             helper.make_node("Mul", ["hw", "view"], ["hw3"]), helper.make_node("Concat", ["bc", "hw3"], ["t"], axis=0),
             helper.make_node("Reshape", ["s", "t"], ["out"])]  # fmt: skip
    return _model(nodes, [_io("x", ["batch", 3, "h", "w"])], [_io("out", [None] * 4)])


@pytest.mark.parametrize("factor, view", [(2, 2), (2, 3)])
def test_view_of_a_resize_to_computed_sizes(factor: int, view: int) -> None:
    """Resized to ``2h, 2w``: the view to ``2h, 2w`` goes; to ``3h, 3w`` (a trap) it stays."""
    original = _upsampled(factor, view)
    result, _ = _simplify(original)
    reshapes = [node for node in result.graph.node if node.op_type == "Reshape"]
    assert len(reshapes) == (factor != view)
    ran = sum(_run_both(original, result, {"x": _floats(batch, 3, h, w)})
              for batch in (0, 1, 2) for h, w in ((0, 0), (1, 1), (2, 5), (7, 3)))  # fmt: skip
    assert ran == {2: 12, 3: 6}[view]  # the trap runs on empty tensors alone, where its view is another shape


def test_resize_by_scales_is_not_floor_in_onnxruntime() -> None:
    """Why scales give no length: onnxruntime sizes ``2.0 * n`` in float32, ``2**25`` at ``n = 2**24 + 1``."""
    scales = numpy_helper.from_array(np.array([1.0, 2.0], np.float32), "scales")
    model = _model([helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest")], [_io("x", [1, "n"])],
                   [_io("y", None)], [scales])  # fmt: skip
    (y,) = helpers.ort_run(model, {"x": np.zeros((1, 2**24 + 1), np.float32)})
    assert y.shape[1] == 2**25 != 2 * (2**24 + 1)
