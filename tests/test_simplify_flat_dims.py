"""Products of dims (``passes.simplify.dim_exprs.Product``): the length of a flattened feature map.

SegFormer's dynamo export (issue #38) flattens its patch embedding ``[B, C, h, w]``
to ``[B, C, h*w]``, computes ``h*w`` again from ``Shape(pixel_values)``
(``((H - 1) // 4 + 1) * ((W - 1) // 4 + 1)``, and ``numel // (B*C)`` after the
reduction Conv), views the attention by it and back to ``[B, heads, h*w, 16]``.
The view back is a no-op only when the prover knows the product, that the Conv's
``H - 1`` is ``>= 0`` (onnxruntime fails the Conv otherwise, so ``(H - 1) // 4``
truncates as floor does) and that ``(B*C*h*w) // (B*C)`` is ``h*w``. Each model
runs in onnxruntime, original and simplified, at many sizes (where the floors
step, and where the original fails); the traps (another product, a division by
what is not a factor, a view with allowzero) keep what they must.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from onnx import helper, numpy_helper

from passes.simplify import dim_exprs
from passes.simplify.dim_exprs import Product
from test_simplify import _assert_same, _const, _io, _model, _ops, _simplify
from test_simplify_conv_dims import _evaluate
from test_simplify_dims import _derived, _floats, _run_both

# --- the algebra, against Python's integers (``_evaluate``: test_simplify_conv_dims) ----------------

_FACTORS = st.sampled_from(["s", "t", "u", 3, -2, dim_exprs.add("s", -1), dim_exprs.floordiv(dim_exprs.add("t", 3), 4)])


@settings(max_examples=300, deadline=None)
@given(st.lists(_FACTORS, min_size=1, max_size=4), st.lists(_FACTORS, min_size=1, max_size=3),
       st.integers(-50, 50), st.integers(-50, 50), st.integers(-50, 50))
def test_products_and_their_division_are_the_same_function(left: list, right: list, s: int, t: int, u: int) -> None:
    """A product is the product at every value, in any order; dividing out a factor gives the others exactly."""
    sizes = {"s": s, "t": t, "u": u}
    product, reordered = 1, 1
    for factor in left:
        product = dim_exprs.multiply(product, factor)
    for factor in reversed(left):
        reordered = dim_exprs.multiply(factor, reordered)
    assert product == reordered  # the product commutes: one canonical form
    expected = int(np.prod([_evaluate(f, sizes) for f in left], dtype=object))
    assert _evaluate(product, sizes) == expected
    divisor = 1
    for factor in right:
        divisor = dim_exprs.multiply(divisor, factor)
    assume(not isinstance(divisor, int))
    rest = dim_exprs.divide_out(product, divisor)
    value = _evaluate(divisor, sizes)
    if rest is not None and value != 0:
        assert _evaluate(rest, sizes) * value == expected
        assert int(np.trunc(expected / value)) == _evaluate(rest, sizes)  # what onnxruntime's Div gives


def test_products_compare_by_their_factors() -> None:
    h, w = dim_exprs.add(dim_exprs.floordiv(dim_exprs.add("H", -1), 4), 1), dim_exprs.add(dim_exprs.floordiv("W", 2), 1)
    assert dim_exprs.multiply(h, w) == dim_exprs.multiply(w, h)
    assert dim_exprs.multiply(h, w) != dim_exprs.multiply(w, w)
    assert dim_exprs.multiply(dim_exprs.multiply("B", 8), h) == dim_exprs.scale(dim_exprs.multiply("B", h), 8)
    assert dim_exprs.multiply(dim_exprs.add(dim_exprs.scale("s", 3), -3), "t") == \
        dim_exprs.scale(dim_exprs.multiply("t", dim_exprs.add("s", -1)), 3)  # the content comes out
    assert dim_exprs.divide_out(dim_exprs.multiply(dim_exprs.multiply("B", h), w), dim_exprs.multiply(w, "B")) == h
    assert dim_exprs.divide_out(dim_exprs.multiply("B", h), w) is None
    assert dim_exprs.divide_out(dim_exprs.multiply("B", "B"), dim_exprs.multiply(dim_exprs.multiply("B", "B"), "B")) \
        is None
    assert dim_exprs.is_nonnegative(dim_exprs.multiply(h, "B"))
    assert not dim_exprs.is_nonnegative(dim_exprs.multiply(dim_exprs.add("H", -1), "B"))
    assert dim_exprs.atoms(dim_exprs.multiply(h, w)) == {"H", "W"}


# --- a patch embedding, flattened, viewed by heads and back ----------------------------------------

_C = 8


def _patches(hw: str = "product", back: str = "product", flat_allowzero: int = 0) -> onnx.ModelProto:
    """``x: [batch, 3, H, W]`` -> Conv k7 s4 p3 -> ``[b, 8, h, w]`` -> ``[b, 8, -1]`` -> ``[b, P, 8]``.

    ``h = (H - 1) // 4 + 1`` (and ``w``) from ``Shape(x)``; ``P`` written as ``hw``:
    ``product`` ``h * w``; ``numel`` ``(b*8*h*w) // (b*8)``. The view ``[b, P, -1, 8]``
    (allowzero=1), a Transpose to ``[b, heads, P, 8]``, Softmax, and the view back
    ``[b, -1, Q, 8]`` (allowzero=1, the output) with ``Q`` written as ``back``:
    ``product`` as ``hw``; ``square`` ``w * w`` (not P where h != w); ``notfactor``
    ``(b*8*h*w) // (b*w)`` (which is not ``h * w``).
    """
    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((_C, 3, 7, 7)).astype(np.float32), "wt")
    nodes = [helper.make_node("Conv", ["x", "wt"], ["c"], kernel_shape=[7, 7], strides=[4, 4], pads=[3, 3, 3, 3]),
             helper.make_node("Shape", ["x"], ["b"], start=0, end=1), helper.make_node("Squeeze", ["b"], ["bs"]),
             *(_const(n, np.array(v)) for n, v in (("m1", -1), ("four", 4), ("one", 1), ("chan", _C))),
             _const("flat", np.array([-1])), _const("width", np.array([_C]))]
    for axis, name in ((2, "h"), (3, "w")):
        nodes += [helper.make_node("Shape", ["x"], [f"{name}_s"], start=axis, end=axis + 1),
                  helper.make_node("Squeeze", [f"{name}_s"], [f"{name}_n"]),
                  helper.make_node("Add", [f"{name}_n", "m1"], [f"{name}_a"]),
                  helper.make_node("Div", [f"{name}_a", "four"], [f"{name}_q"]),
                  helper.make_node("Add", [f"{name}_q", "one"], [name])]
    nodes += [helper.make_node("Mul", ["bs", "chan"], ["bc"]), helper.make_node("Mul", ["bc", "h"], ["bch"]),
              helper.make_node("Mul", ["bch", "w"], ["numel"]), helper.make_node("Mul", ["h", "w"], ["product"]),
              helper.make_node("Div", ["numel", "bc"], ["by_numel"]), helper.make_node("Mul", ["w", "w"], ["square"]),
              helper.make_node("Mul", ["bs", "w"], ["bw"]), helper.make_node("Div", ["numel", "bw"], ["notfactor"]),
              helper.make_node("Reshape", [{"product": "product", "numel": "by_numel"}[hw], "flat"], ["p1"]),
              helper.make_node("Reshape", [back if back != "product" else "product", "flat"], ["q1"]),
              helper.make_node("Concat", ["b", "width", "flat"], ["flat_t"], axis=0),
              helper.make_node("Reshape", ["c", "flat_t"], ["cf"], allowzero=flat_allowzero),
              helper.make_node("Transpose", ["cf"], ["seq"], perm=[0, 2, 1]),
              helper.make_node("Concat", ["b", "p1", "flat", "width"], ["heads_t"], axis=0),
              helper.make_node("Reshape", ["seq", "heads_t"], ["v"], allowzero=1),
              helper.make_node("Transpose", ["v"], ["vt"], perm=[0, 2, 1, 3]),
              helper.make_node("Softmax", ["vt"], ["sm"], axis=-1),
              helper.make_node("Concat", ["b", "flat", "q1", "width"], ["back_t"], axis=0),
              helper.make_node("Reshape", ["sm", "back_t"], ["out"], allowzero=1)]
    return _model(nodes, [_io("x", ["batch", 3, "H", "W"])], [_io("out", [None] * 4)], [weight])


_SIZES = [(0, 5, 5), (1, 0, 4), (1, 1, 1), (1, 1, 9), (2, 4, 5), (1, 5, 4), (1, 8, 9), (2, 9, 12), (0, 13, 7),
          (1, 16, 16), (1, 17, 3)]


def _compare(original: onnx.ModelProto, result: onnx.ModelProto) -> int:
    """Runs both at every (batch, H, W) of :data:`_SIZES`; how many runs the original accepted."""
    return sum(_run_both(original, result, {"x": _floats(b, 3, h, w)}) for b, h, w in _SIZES)


def _view_back_kept(result: onnx.ModelProto) -> bool:
    return any(n.op_type == "Reshape" and n.output[0] == "out" for n in result.graph.node)


@pytest.mark.parametrize("hw", ["product", "numel"])
def test_view_back_by_the_product_goes(hw: str) -> None:
    original = _patches(hw)
    result, _ = _simplify(original)
    assert not _view_back_kept(result), _ops(result)
    assert [n.op_type for n in result.graph.node if n.output[0] == "out"] == ["Softmax"]
    assert sum(n.op_type == "Reshape" and n.input[0] in ("c", "seq") for n in result.graph.node) == 2  # flatten, heads
    assert _compare(original, result) >= 7  # batch 0 too; H or W of 0 fails the Conv


@pytest.mark.parametrize(("back", "runs"), [("square", 4), ("notfactor", 0)])
def test_view_back_by_another_length_stays(back: str, runs: int) -> None:
    """``square`` runs where h == w and where w divides h (then a real reshape: h=2, w=1 gives [1, 2, 1, 8])."""
    original = _patches(back=back)
    result, _ = _simplify(original)
    assert _view_back_kept(result), _ops(result)
    assert _compare(original, result) >= runs


def test_derived_dims_are_the_products() -> None:
    found, values = _derived(_patches("numel"))
    h = dim_exprs.floordiv(dim_exprs.add("H", 3), 4)  # floor((H + 6 - 7) / 4) + 1
    w = dim_exprs.floordiv(dim_exprs.add("W", 3), 4)
    area = dim_exprs.multiply(h, w)
    assert found.shape(values["c"]) == ("batch", _C, h, w)
    assert found.shape(values["cf"]) == ("batch", _C, area)
    assert found.shape(values["v"]) == ("batch", area, 1, _C)
    assert found.shape(values["out"]) == ("batch", 1, area, _C)
    assert found.nonnegative(dim_exprs.add("H", -1)) and not found.nonnegative(dim_exprs.add("H", -2))


def test_flatten_with_allowzero_derives_no_product() -> None:
    """With allowzero, onnxruntime sizes -1 over the non-zero dims: a product of dims that may be 0 is not it."""
    found, values = _derived(_patches(flat_allowzero=1))
    assert not isinstance(found.shape(values["cf"])[2], Product)
    original = _patches(flat_allowzero=1)
    result, _ = _simplify(original)
    _compare(original, result)


def test_same_padding_conv_marks_no_span() -> None:
    """SAME padding runs at every length >= 1: ``H - 1`` is then not marked, ``(H - 1) // 4`` not derived."""
    proto = _patches()
    conv = proto.graph.node[0]
    del conv.attribute[:]
    conv.attribute.extend([helper.make_attribute("kernel_shape", [7, 7]), helper.make_attribute("strides", [4, 4]),
                           helper.make_attribute("auto_pad", "SAME_UPPER")])
    found, _ = _derived(proto)
    assert not found.nonnegative(dim_exprs.add("H", -1))
    result, _ = _simplify(proto)
    assert _compare(proto, result) >= 7


_NUMEL = _patches("numel")
_NUMEL_SIMPLIFIED = _simplify(_NUMEL)[0]


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 3), st.integers(1, 40), st.integers(1, 40))
def test_view_back_property(batch: int, height: int, width: int) -> None:
    """At any sizes the Conv accepts, the simplified model gives the original's output, bit for bit."""
    assert not _view_back_kept(_NUMEL_SIMPLIFIED)
    ran = _run_both(_NUMEL, _NUMEL_SIMPLIFIED, {"x": _floats(batch, 3, height, width)})
    assert ran or batch == 0  # heights and widths >= 1 fit the Conv; at batch 0 the Div by b*8 fails
