"""The ReduceLogSumExp decomposition: conformance, graph structure, scopes, opsets, skips.

Numbers come from the spec page, the onnx backend cases (both run after decomposition in
onnxruntime with optimisations disabled) or the long-double oracle and bounds of
``test_decompose_accuracy``; the graphs are inspected for what must and must not be there.
"""

from __future__ import annotations

import functools
import json
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import onnx
import onnx.backend.test.case.node as node_cases
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from helpers import ort_run, spec_examples
from passes.decompose import DecomposeLogSumExpPass, logsumexp
from test_decompose_accuracy import _assert_accurate, oracle

F32, F64, F16, BF16 = TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16
I64, BOOL = TensorProto.INT64, TensorProto.BOOL
PRIMITIVES = {
    "ReduceMax", "Clip", "Min", "Max", "Sub", "Exp", "ReduceSum", "Log", "Add", "Cast", "Constant",
    "Reshape", "Shape", "Slice", "Concat", "Unsqueeze",
}  # fmt: skip

X = (np.arange(60, dtype=np.float32).reshape(3, 4, 5) - 30) / 7
#: The old counter names of the tests below, and the reasons ``stats["declined"]`` counts.
REASONS = {"skipped_integer": "integer input", "skipped_unknown_type": "unknown element type",
           "skipped_unsupported": "unsupported opset or type"}  # fmt: skip


# --- helpers -------------------------------------------------------------------------------


def vi(name: str, elem: int, shape: Sequence[int | str] | None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def make_model(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    initializers: Sequence[onnx.TensorProto] = (),
    *,
    opset: int = 18,
) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model


def lse_node(inputs: list[str], output: str = "y", name: str = "lse", **attrs: Any) -> onnx.NodeProto:
    return helper.make_node("ReduceLogSumExp", inputs, [output], name=name, **attrs)


def axes_init(values: Sequence[int], name: str = "axes") -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, dtype=np.int64), name)


def lse_model(
    x_shape: Sequence[int | str],
    y_shape: Sequence[int | str],
    axes: Sequence[int] | None,
    *,
    keepdims: int = 1,
    opset: int = 18,
    elem: int = F32,
) -> onnx.ModelProto:
    """y = ReduceLogSumExp(x) with ``axes`` as the opset has them: attribute, or initializer input."""
    if opset >= 18 and axes is not None:
        node, inits = lse_node(["x", "axes"], keepdims=keepdims), [axes_init(axes)]
    elif axes is not None:
        node, inits = lse_node(["x"], axes=list(axes), keepdims=keepdims), []
    else:
        node, inits = lse_node(["x"], keepdims=keepdims), []
    return make_model([node], [vi("x", elem, x_shape)], [vi("y", elem, y_shape)], inits, opset=opset)


def decompose(proto: onnx.ModelProto) -> tuple[onnx.ModelProto, DecomposeLogSumExpPass, ir.passes.PassResult]:
    """Runs the pass on a copy of ``proto``; checks the result with the full checker."""
    model = ir.serde.deserialize_model(proto)
    lse_pass = DecomposeLogSumExpPass()
    result = lse_pass(model)
    out = ir.serde.serialize_model(result.model)
    onnx.checker.check_model(out, full_check=True)
    assert tuple(lse_pass.stats) == ("applied", "declined")  # the one shape of every pass's stats
    json.dumps(lse_pass.stats)
    return out, lse_pass, result


def all_nodes(model: onnx.ModelProto) -> Iterator[onnx.NodeProto]:
    """Every node: main graph, subgraphs (nested) and function bodies."""

    def walk(nodes: Sequence[onnx.NodeProto]) -> Iterator[onnx.NodeProto]:
        for node in nodes:
            yield node
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.GRAPH:
                    yield from walk(attribute.g.node)
                for graph in attribute.graphs:
                    yield from walk(graph.node)

    yield from walk(model.graph.node)
    for function in model.functions:
        yield from walk(function.node)


def op_types(model: onnx.ModelProto) -> set[str]:
    return {n.op_type for n in all_nodes(model)}


def by_op(model: onnx.ModelProto, *op_type: str) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.op_type in op_type]


def attr(node: onnx.NodeProto, name: str) -> Any:
    found = [a for a in node.attribute if a.name == name]
    return helper.get_attribute_value(found[0]) if found else None


def producer(model: onnx.ModelProto, value: str) -> onnx.NodeProto:
    return next(n for n in model.graph.node if value in n.output)


def only(key: str) -> dict[str, dict[str, int]]:
    """The stats of a run that counted one node: decomposed, or declined for ``key``'s reason."""
    if key == "decomposed":
        return {"applied": {"ReduceLogSumExp": 1}, "declined": {}}
    return {"applied": {}, "declined": {REASONS[key]: 1}}


def random(shape: Sequence[int], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# --- conformance: spec examples and backend cases ------------------------------------------


SPEC = [
    ex
    for ex in spec_examples("ReduceLogSumExp-*")
    if ex.name.startswith(("test_reduce_log_sum_exp", "test_cc_reducelogsumexp"))
]


def test_spec_page_examples_are_found() -> None:
    assert len(SPEC) == 17


@pytest.mark.parametrize("ex", SPEC, ids=lambda ex: ex.name)
def test_spec_example_after_decomposition(ex: Any) -> None:
    inputs = [vi(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in ex.inputs.items()]
    outputs = [vi(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in ex.outputs.items()]
    node = helper.make_node(ex.op_type, ex.input_names, ex.output_names, name="lse", **ex.attributes)
    out, lse_pass, result = decompose(make_model([node], inputs, outputs, opset=ex.opset))

    assert result.modified and lse_pass.stats == only("decomposed")
    assert "ReduceLogSumExp" not in op_types(out) and op_types(out) <= PRIMITIVES
    for actual, expected in zip(ort_run(out, ex.inputs), ex.output_list()):
        assert actual.shape == expected.shape and actual.dtype == expected.dtype
        # The page prints 8 significant digits.
        np.testing.assert_allclose(actual, expected, rtol=1e-6 if expected.dtype == np.float32 else 1e-8)


@functools.lru_cache(maxsize=1)
def _backend_cases() -> dict[str, Any]:
    """The onnx backend cases of ReduceLogSumExp, collected once per module (~8 s)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the generators compute log(0)
        cases = node_cases.collect_testcases()
    return {c.name: c for c in cases if "reduce_log_sum_exp" in c.name and not c.name.endswith("_expanded")}


def test_backend_cases_are_found() -> None:
    assert len(_backend_cases()) >= 9


@pytest.mark.parametrize("name", list(_backend_cases()))
def test_backend_case_after_decomposition(name: str) -> None:
    case = _backend_cases()[name]
    out, lse_pass, _ = decompose(case.model)
    opset = next(o.version for o in case.model.opset_import if o.domain in ("", "ai.onnx"))
    if opset >= 28:  # onnxruntime 1.32 runs ReduceLogSumExp-28 as its function body: the op stays
        assert lse_pass.stats == {"applied": {}, "declined": {logsumexp.FUNCTION_BODY: 1}}
        assert "ReduceLogSumExp" in op_types(out)
        return
    assert lse_pass.stats == only("decomposed")
    assert "ReduceLogSumExp" not in op_types(out)
    for inputs, expected_outputs in case.data_sets:
        feeds = {info.name: a for info, a in zip(case.model.graph.input, inputs)}
        for actual, expected in zip(ort_run(out, feeds), expected_outputs):
            assert actual.shape == expected.shape and actual.dtype == expected.dtype
            np.testing.assert_allclose(actual, expected, rtol=8 * np.finfo(expected.dtype).eps)


def test_where_onnxruntime_runs_the_function_body_the_op_stays_and_the_run_is_exact(tmp_path) -> None:
    """ReduceLogSumExp-28 has no kernel in onnxruntime 1.32: it computes the schema's body (in double,
    without the max shift), so a float32 1e30 gives inf there and the decomposition 1e30. The op stays
    and the whole run (its check's edge values included) is exact; at opset 18 it is decomposed."""
    from passes import cli

    x = np.array([[1e30, 0, 1], [1, 2, 3], [-np.inf, -np.inf, -np.inf], [np.nan, 0, 1], [-0.0, 0, 88.8]], np.float32)
    for opset, kept in ((28, True), (18, False)):
        model = make_model([lse_node(["x", "axes"], keepdims=0)], [vi("x", F32, ["n", 3])], [vi("y", F32, ["n"])],
                           [axes_init([1])], opset=opset)  # fmt: skip
        if opset == 28:
            model.ir_version = 11
        src, out = tmp_path / f"m{opset}.onnx", tmp_path / f"o{opset}.onnx"
        onnx.save(model, src)
        assert cli.main([str(src), str(out), "-q"]) == 0
        optimised = onnx.load(out)
        assert ("ReduceLogSumExp" in op_types(optimised)) == kept
        if kept:
            (want,), (got,) = ort_run(model, {"x": x}), ort_run(optimised, {"x": x})
            assert np.isinf(want[0]) and want.tobytes() == got.tobytes()  # the body's inf, bit for bit


# --- the rewrite at each opset -------------------------------------------------------------


def test_opset18_input_form_uses_the_same_axes_value_everywhere() -> None:
    node = lse_node(["x", "axes"], keepdims=0)
    model = make_model([node], [vi("x", F32, [3, 4, 5]), vi("axes", I64, [1])], [vi("y", F32, [3, 5])])
    out, _, result = decompose(model)

    assert result.modified
    reduces = by_op(out, "ReduceMax", "ReduceSum")
    assert len(reduces) == 3  # the maximum, the sum, and the keepdims=0 shift
    assert all(n.input[1] == "axes" and attr(n, "axes") is None for n in reduces)
    assert [attr(n, "keepdims") for n in by_op(out, "ReduceSum")] == [0]
    feeds = {"x": X, "axes": np.array([-2], np.int64)}
    _assert_accurate(ort_run(out, feeds)[0], X, (-2,), 0)


def test_opset13_attribute_form() -> None:
    out, _, _ = decompose(lse_model([3, 4, 5], [1, 4, 1], [0, -1], opset=13))

    (rmax,) = by_op(out, "ReduceMax")
    assert list(attr(rmax, "axes")) == [0, -1] and len(rmax.input) == 1  # an attribute below 18
    (rsum,) = by_op(out, "ReduceSum")
    assert len(rsum.input) == 2 and attr(rsum, "axes") is None  # an input from 13
    axes = producer(out, rsum.input[1])
    assert axes.op_type == "Constant"
    np.testing.assert_array_equal(numpy_helper.to_array(attr(axes, "value")), [0, -1])
    _assert_accurate(ort_run(out, {"x": X})[0], X, (0, -1), 1)


@pytest.mark.parametrize("opset", [7, 9, 10, 11, 12])
@pytest.mark.parametrize("elem", [F32, F64, F16])
def test_old_opsets_use_ops_of_that_opset(opset: int, elem: int) -> None:
    out, lse_pass, _ = decompose(lse_model([3, 4, 5], [3, 5], [1], keepdims=0, opset=opset, elem=elem))
    if elem == F64 and opset < 8:  # no op to clamp a double: Min/Max broadcast from 8
        assert lse_pass.stats == only("skipped_unsupported")
        assert op_types(out) == {"ReduceLogSumExp"}
        return
    assert lse_pass.stats == only("decomposed")
    for node in by_op(out, "ReduceSum", "ReduceMax"):
        assert list(attr(node, "axes")) == [1] and len(node.input) == 1
    # Clip-6 has float32 attribute bounds; doubles use Min/Max below 12 (onnxruntime's Clip-11
    # is float only).
    assert ("Min" in op_types(out)) == (elem == F64 and opset < 12)
    assert all(len(n.input) == (1 if opset < 11 else 3) for n in by_op(out, "Clip"))
    x = X.astype(helper.tensor_dtype_to_np_dtype(elem))
    _assert_accurate(ort_run(out, {"x": x})[0], x, (1,), 0)


@pytest.mark.parametrize("opset", [1, 6])
def test_opset_below_7_is_left_and_counted(opset: int) -> None:
    """Sub and Add broadcast only through the legacy attribute there."""
    out, lse_pass, result = decompose(lse_model([3, 4], [3, 1], [1], opset=opset))
    assert not result.modified and lse_pass.stats == only("skipped_unsupported")
    assert op_types(out) == {"ReduceLogSumExp"}


@pytest.mark.parametrize("opset", [22, 28])
def test_written_with_the_ai_onnx_domain(opset: int) -> None:
    node = helper.make_node("ReduceLogSumExp", ["x", "axes"], ["y"], domain="ai.onnx", keepdims=1)
    graph = helper.make_graph([node], "g", [vi("x", F64, [3, 4, 5])], [vi("y", F64, [3, 4, 1])], [axes_init([2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("ai.onnx", opset)], ir_version=10)
    out, lse_pass, _ = decompose(model)
    x = X.astype(np.float64)
    if opset == 28:  # onnxruntime computes ReduceLogSumExp-28 by its function body: the op stays
        assert lse_pass.stats == {"applied": {}, "declined": {logsumexp.FUNCTION_BODY: 1}}
        assert op_types(out) == {"ReduceLogSumExp"}
        return
    assert lse_pass.stats == only("decomposed")
    _assert_accurate(ort_run(out, {"x": x})[0], x, (2,), 1)


# --- axes at run time, reduce-all, noop ----------------------------------------------------


@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("noop", [0, 1])
@pytest.mark.parametrize("axes", [[], [1], [-1, 0], [0, 1, 2]], ids=str)
def test_axes_as_graph_input_at_run_time(keepdims: int, noop: int, axes: list[int]) -> None:
    rank = 3 if keepdims or (noop and not axes) else 3 - len(axes or [0, 1, 2])
    node = lse_node(["x", "axes"], keepdims=keepdims, noop_with_empty_axes=noop)
    inputs = [vi("x", F32, [3, 4, 5]), vi("axes", I64, ["n"])]
    out, _, _ = decompose(make_model([node], inputs, [vi("y", F32, [f"d{i}" for i in range(rank)])]))
    assert "Reshape" not in op_types(out)  # no two-level sum without known axes
    got = ort_run(out, {"x": X, "axes": np.array(axes, np.int64)})[0]
    if noop and not axes:
        np.testing.assert_array_equal(got, X)
    else:
        _assert_accurate(got, X, tuple(axes), keepdims)


def test_computed_axes() -> None:
    """Axes that nodes compute: Shape -> Size -> Sub -> Unsqueeze gives [rank - 1]."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Size", ["shape"], ["rank"]),
        helper.make_node("Sub", ["rank", "one"], ["last"]),
        helper.make_node("Unsqueeze", ["last", "zero"], ["axes"]),
        lse_node(["x", "axes"], keepdims=0),
    ]
    inits = [numpy_helper.from_array(np.array(1, np.int64), "one"), axes_init([0], "zero")]
    out, _, _ = decompose(make_model(nodes, [vi("x", F32, [3, 4, 5])], [vi("y", F32, [3, 4])], inits))
    assert all(n.input[1] == "axes" for n in by_op(out, "ReduceMax", "ReduceSum"))
    _assert_accurate(ort_run(out, {"x": X})[0], X, (2,), 0)


@pytest.mark.parametrize("opset", [13, 18])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_all_without_axes(opset: int, keepdims: int) -> None:
    y_shape = [1, 1, 1] if keepdims else []
    out, _, _ = decompose(lse_model([3, 4, 5], y_shape, None, keepdims=keepdims, opset=opset))
    got = ort_run(out, {"x": X})[0]
    assert got.shape == tuple(y_shape)
    _assert_accurate(got, X, None, keepdims)


def test_empty_axes_attribute_reduces_everything_at_opset13() -> None:
    node = lse_node(["x"], keepdims=0)
    node.attribute.append(helper.make_attribute("axes", [], attr_type=onnx.AttributeProto.INTS))
    out, _, _ = decompose(make_model([node], [vi("x", F32, [3, 4, 5])], [vi("y", F32, [])], opset=13))
    _assert_accurate(ort_run(out, {"x": X})[0], X, None, 0)


def test_noop_with_empty_axes_is_passed_on_and_gives_the_identity() -> None:
    node = lse_node(["x"], noop_with_empty_axes=1, keepdims=0)
    out, _, _ = decompose(make_model([node], [vi("x", F32, [3, 4, 5])], [vi("y", F32, [3, 4, 5])]))
    reduces = by_op(out, "ReduceMax", "ReduceSum")
    assert reduces and all(attr(n, "noop_with_empty_axes") == 1 for n in reduces)
    x = X.copy()
    x[0, 0, :3] = [np.inf, -np.inf, np.nan]
    np.testing.assert_array_equal(ort_run(out, {"x": x})[0], x)


# --- two-level sums ------------------------------------------------------------------------


@pytest.mark.parametrize("opset", [13, 14, 18])
def test_long_sum_over_a_static_shape_is_two_level(opset: int) -> None:
    out, _, _ = decompose(lse_model([4, 512, 6], [4, 6], [1], keepdims=0, opset=opset))
    (reshape,) = by_op(out, "Reshape")
    target = producer(out, reshape.input[1])
    assert target.op_type == "Constant"  # static: a constant target, no Shape ops
    np.testing.assert_array_equal(numpy_helper.to_array(attr(target, "value")), [4, 16, 32, 6])
    assert len(by_op(out, "ReduceSum")) == 2
    x = random((4, 512, 6))
    _assert_accurate(ort_run(out, {"x": x})[0], x, (1,), 0)


@pytest.mark.parametrize(
    "shape,axes",
    [((4, 512, 6), (1, 2)), ((6, 512, 4), (0, -2)), ((256, 3, 4), (0, 2)), ((5, 6, 300), (2, 0)),
     ((2, 70, 3, 80), (1, 3))],
)  # fmt: skip
@pytest.mark.parametrize("keepdims", [0, 1])
def test_two_level_sum_with_several_reduced_axes(
    shape: tuple[int, ...], axes: tuple[int, ...], keepdims: int
) -> None:
    """The split axis may have reduced axes before and after it; the result keeps their order."""
    reduced = {a % len(shape) for a in axes}
    y_shape = [1 if a in reduced else d for a, d in enumerate(shape)]
    if not keepdims:
        y_shape = [d for a, d in enumerate(shape) if a not in reduced]
    out, _, _ = decompose(lse_model(shape, y_shape, axes, keepdims=keepdims))
    assert "Reshape" in op_types(out)
    x = random(shape, seed=4)
    _assert_accurate(ort_run(out, {"x": x})[0], x, axes, keepdims)


@pytest.mark.parametrize("opset", [14, 15, 18])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_long_sum_with_symbolic_dims_takes_the_shape_at_run_time(opset: int, keepdims: int) -> None:
    y_shape = ["batch", 1, "width"] if keepdims else ["batch", "width"]
    out, _, _ = decompose(lse_model(["batch", 256, "width"], y_shape, [-2], keepdims=keepdims, opset=opset))
    assert {"Reshape", "Shape", "Concat"} <= op_types(out)
    assert ("Slice" in op_types(out)) == (opset < 15)  # Shape takes start/end from 15
    assert ("Unsqueeze" in op_types(out)) == bool(keepdims)
    for shape in [(2, 256, 3), (1, 256, 1), (0, 256, 2)]:
        x = random(shape, seed=1)
        _assert_accurate(ort_run(out, {"x": x})[0], x, (-2,), keepdims)


def test_symbolic_dims_at_opset13_keep_a_single_sum() -> None:
    """A run-time Reshape target may hold a 0, which needs allowzero (opset 14)."""
    out, _, _ = decompose(lse_model(["n", 256], ["n", 1], [1], opset=13))
    assert "Reshape" not in op_types(out) and len(by_op(out, "ReduceSum")) == 1
    x = random((3, 256), seed=2)
    _assert_accurate(ort_run(out, {"x": x})[0], x, (1,), 1)


def test_reduce_all_of_a_long_static_tensor_is_two_level() -> None:
    out, _, _ = decompose(lse_model([64, 128], [1, 1], None))
    assert {"Reshape", "Unsqueeze"} <= op_types(out)
    x = random((64, 128), seed=3)
    _assert_accurate(ort_run(out, {"x": x})[0], x, None, 1)


@pytest.mark.parametrize("n", [63, 127])
def test_short_or_prime_sums_keep_a_single_sum(n: int) -> None:
    """63 terms are too few to split; 127 is prime and cannot be split."""
    out, _, _ = decompose(lse_model([4, n], [4], [1], keepdims=0, opset=13))
    assert "Reshape" not in op_types(out) and len(by_op(out, "ReduceSum")) == 1


# --- scopes: subgraphs and functions -------------------------------------------------------


def _branch(name: str, axis: int) -> onnx.GraphProto:
    """A branch computing ReduceLogSumExp(x, [axis], keepdims=0) of the outer ``x``.

    Both branches name their node "lse": the new names must still be unique in the model.
    """
    node = lse_node(["x", f"{name}_axes"], f"{name}_out", name="lse", keepdims=0)
    outputs = [vi(f"{name}_out", F32, [3, 5])]
    return helper.make_graph([node], name, [], outputs, [axes_init([axis], f"{name}_axes")])


@pytest.mark.parametrize("cond", [True, False])
def test_inside_if_branches(cond: bool) -> None:
    node = helper.make_node("If", ["c"], ["y"], then_branch=_branch("then", 1), else_branch=_branch("else", -2))
    model = make_model([node], [vi("x", F32, [3, 4, 5]), vi("c", BOOL, [])], [vi("y", F32, [3, 5])])
    out, lse_pass, _ = decompose(model)
    assert lse_pass.stats["applied"]["ReduceLogSumExp"] == 2 and "ReduceLogSumExp" not in op_types(out)
    new_nodes = [n for n in all_nodes(out) if n.name.startswith("lse/")]
    assert len({n.name for n in new_nodes}) == len(new_nodes) > 10
    values = [v for n in all_nodes(out) for v in n.output]
    assert len(set(values)) == len(values)
    _assert_accurate(ort_run(out, {"x": X, "c": np.array(cond)})[0], X, (1,), 0)


def _bounds(graph: onnx.GraphProto, initializers: bool = False) -> list[float]:
    """The float constants of ``graph`` itself (not its subgraphs): the clamp's bounds; its Constant
    nodes', or (``initializers``) its initializers'."""
    if initializers:
        values = [numpy_helper.to_array(t) for t in graph.initializer]
    else:
        values = [numpy_helper.to_array(attr(n, "value")) for n in graph.node if n.op_type == "Constant"]
    return sorted(float(v) for v in values if v.dtype.kind == "f")


def test_the_clamp_bounds_are_made_once_per_graph_and_type() -> None:
    """Three decompositions in the main graph read one pair of bounds; each branch of an If has its own;
    a double one its own pair; and a decomposition that amplification declines makes none. The main
    graph's are initializers (as simplify would lift them), a branch's Constant nodes."""
    big32, big64 = float(np.finfo(np.float32).max), float(np.finfo(np.float64).max)
    branches = helper.make_node("If", ["c"], ["b"], then_branch=_branch("then", 1), else_branch=_branch("else", -2))
    nodes = [
        lse_node(["x", "a1"], "p", name="first", keepdims=1),
        lse_node(["p", "a0"], "q", name="second", keepdims=0),
        lse_node(["x", "a0"], "r", name="third", keepdims=0),
        branches,
        lse_node(["d", "a0"], "s", name="double", keepdims=0),
        lse_node(["x", "a0"], "t", name="declined", keepdims=0),
        helper.make_node("ArgMax", ["t"], ["u"], axis=0),
    ]
    inputs = [vi("x", F32, [3, 4, 5]), vi("c", BOOL, []), vi("d", F64, [3, 4, 5])]
    outputs = [vi("p", F32, [3, 1, 5]), vi("q", F32, [1, 5]), vi("r", F32, [4, 5]), vi("b", F32, [3, 5]),
               vi("s", F64, [4, 5]), vi("u", I64, [1, 5])]  # fmt: skip
    model = make_model(nodes, inputs, outputs, [axes_init([1], "a1"), axes_init([0], "a0")])
    out, lse_pass, _ = decompose(model)
    assert lse_pass.stats["applied"]["ReduceLogSumExp"] == 6 and len(op_types(out) & {"ReduceLogSumExp"}) == 1
    assert _bounds(out.graph, initializers=True) == [-big64, -big32, big32, big64]
    assert _bounds(out.graph) == []  # no Constant node for them in the main graph
    clips = [n for n in out.graph.node if n.op_type == "Clip"]
    assert len(clips) == 4 and len({tuple(n.input[1:]) for n in clips}) == 2  # float32 three times, double once
    for branch in ("then_branch", "else_branch"):
        assert _bounds(attr(next(n for n in out.graph.node if n.op_type == "If"), branch)) == [-big32, big32]
    d = (np.arange(60, dtype=np.float64).reshape(3, 4, 5) - 30) / 7
    p, q, r, b, s, _ = ort_run(out, {"x": X, "c": np.array(True), "d": d})
    _assert_accurate(p, X, (1,), 1)
    _assert_accurate(q, p, (0,), 0)
    _assert_accurate(r, X, (0,), 0)
    _assert_accurate(b, X, (1,), 0)
    _assert_accurate(s, d, (0,), 0)


def test_below_ir_version_4_the_main_graphs_bounds_stay_constant_nodes() -> None:
    """An initializer must be a graph input before IR version 4: the bounds are Constant nodes there."""
    model = make_model([lse_node(["x"], "y", axes=[1], keepdims=0)], [vi("x", F32, [3, 4, 5])],
                       [vi("y", F32, [3, 5])], opset=11)  # fmt: skip
    model.ir_version = 3
    out, lse_pass, _ = decompose(model)
    big = float(np.finfo(np.float32).max)
    assert lse_pass.stats["applied"]["ReduceLogSumExp"] == 1
    assert _bounds(out.graph) == [-big, big] and not out.graph.initializer
    _assert_accurate(ort_run(out, {"x": X})[0], X, (1,), 0)


def test_inside_a_loop_body() -> None:
    """acc <- ReduceLogSumExp(x + acc, axis 1, keepdims=1), three times."""
    body = helper.make_graph(
        [
            helper.make_node("Add", ["x", "acc_in"], ["shifted"]),
            lse_node(["shifted", "loop_axes"], "acc_out", name="loop_lse", keepdims=1),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "body",
        [vi("i", I64, []), vi("cond_in", BOOL, []), vi("acc_in", F32, [3, 1, 5])],
        [vi("cond_out", BOOL, []), vi("acc_out", F32, [3, 1, 5])],
        [axes_init([1], "loop_axes")],
    )
    body.value_info.append(vi("shifted", F32, [3, 4, 5]))
    loop = helper.make_node("Loop", ["n", "", "init"], ["y"], body=body)
    inputs = [vi("x", F32, [3, 4, 5]), vi("n", I64, []), vi("init", F32, [3, 1, 5])]
    out, lse_pass, _ = decompose(make_model([loop], inputs, [vi("y", F32, [3, 1, 5])]))
    assert lse_pass.stats == only("decomposed") and "ReduceLogSumExp" not in op_types(out)
    acc = np.zeros((3, 1, 5), np.float32)
    got = ort_run(out, {"x": X, "n": np.array(3, np.int64), "init": acc})[0]
    for _ in range(3):  # the oracle step by step, rounded to float32 after each step
        acc = oracle(X + acc, (1,), 1)[0].astype(np.float32)
    np.testing.assert_allclose(got, acc, rtol=4 * np.finfo(np.float32).eps)


def _function_model(*, typed: bool = True, opset: int = 13, model_opset: int = 13) -> onnx.ModelProto:
    """A model calling a local function that applies ReduceLogSumExp to its input.

    Function inputs carry no types in ONNX; with ``typed`` the function's value_info
    (IR 10) gives the type of the node's output, which is T as well.
    """
    if opset >= 18:
        inputs, body = ["fx", "faxes"], [lse_node(["fx", "faxes"], "fy", name="fn_lse", keepdims=0)]
    else:
        inputs, body = ["fx"], [lse_node(["fx"], "fy", name="fn_lse", axes=[-1], keepdims=0)]
    fn = helper.make_function("local", "LSE", inputs, ["fy"], body, opset_imports=[helper.make_opsetid("", opset)])
    if typed:
        fn.value_info.append(vi("fy", F32, None))
    call = helper.make_node("LSE", ["x", "axes"][: len(inputs)], ["y"], domain="local")
    graph_inputs = [vi("x", F32, [3, 4, 5]), vi("axes", I64, [1])][: len(inputs)]
    graph = helper.make_graph([call], "g", graph_inputs, [vi("y", F32, [3, 4])])
    opsets = [helper.make_opsetid("", model_opset), helper.make_opsetid("local", 1)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=10, functions=[fn])
    onnx.checker.check_model(model, full_check=True)
    return model


def test_inside_a_model_local_function_with_the_function_opset() -> None:
    out, lse_pass, result = decompose(_function_model(opset=13, model_opset=13))
    assert result.modified and lse_pass.stats == only("decomposed")
    body = out.functions[0].node
    assert "ReduceLogSumExp" not in {n.op_type for n in body}
    rmax = next(n for n in body if n.op_type == "ReduceMax")
    assert list(attr(rmax, "axes")) == [-1]  # the ReduceMax-13 form
    assert [n.op_type for n in out.graph.node] == ["LSE"] and list(out.functions[0].output) == ["fy"]
    _assert_accurate(ort_run(out, {"x": X})[0], X, (-1,), 0)


def test_inside_a_function_with_axes_as_a_function_input() -> None:
    out, lse_pass, _ = decompose(_function_model(opset=18, model_opset=18))
    assert lse_pass.stats == only("decomposed")
    reduces = [n for n in out.functions[0].node if n.op_type in ("ReduceMax", "ReduceSum")]
    assert reduces and all(n.input[1] == "faxes" for n in reduces)
    _assert_accurate(ort_run(out, {"x": X, "axes": np.array([1], np.int64)})[0], X, (1,), 0)


def test_function_whose_opset_conflicts_with_the_model_for_new_ops_is_left() -> None:
    """Function opset 13, model 14: the same ReduceLogSumExp schema, but not the same Sub/Add."""
    out, lse_pass, result = decompose(_function_model(opset=13, model_opset=14))
    assert not result.modified and lse_pass.stats == only("skipped_unsupported")
    assert [n.op_type for n in out.functions[0].node] == ["ReduceLogSumExp"]


def test_function_without_type_information_is_left_and_counted() -> None:
    out, lse_pass, result = decompose(_function_model(typed=False))
    assert not result.modified and lse_pass.stats == only("skipped_unknown_type")
    assert [n.op_type for n in out.functions[0].node] == ["ReduceLogSumExp"]


# --- no-op, idempotence, skips -------------------------------------------------------------


def test_model_without_reducelogsumexp_is_not_modified() -> None:
    nodes = [helper.make_node("ReduceLogSum", ["x"], ["a"], axes=[1]), helper.make_node("Exp", ["a"], ["y"])]
    model = make_model(nodes, [vi("x", F32, [3, 4, 5])], [vi("y", F32, [3, 1, 5])], opset=13)
    out, lse_pass, result = decompose(model)
    assert not result.modified and lse_pass.stats == {"applied": {}, "declined": {}}
    round_trip = ir.serde.serialize_model(ir.serde.deserialize_model(model))
    assert out.graph.SerializeToString() == round_trip.graph.SerializeToString()


def test_second_run_changes_nothing() -> None:
    once, _, first = decompose(lse_model([3, 512], [3], [1], keepdims=0))
    twice, lse_pass, second = decompose(once)
    assert first.modified and not second.modified
    assert lse_pass.stats == {"applied": {}, "declined": {}}
    assert twice.graph.SerializeToString() == once.graph.SerializeToString()


@pytest.mark.parametrize("elem", [TensorProto.INT32, TensorProto.INT64])
def test_integer_input_is_left_and_counted(elem: int) -> None:
    nodes = [lse_node(["x", "axes"]), helper.make_node("Neg", ["y"], ["z"])]
    model = make_model(nodes, [vi("x", elem, [2, 3])], [vi("z", elem, [2, 1])], [axes_init([1])])
    out, lse_pass, result = decompose(model)
    assert not result.modified and lse_pass.stats == only("skipped_integer")
    assert [n.op_type for n in out.graph.node] == ["ReduceLogSumExp", "Neg"]
    x = np.array([[1, 2, 3], [-4, 0, 4]], dtype=helper.tensor_dtype_to_np_dtype(elem))
    np.testing.assert_array_equal(ort_run(out, {"x": x})[0], ort_run(model, {"x": x})[0])


def _untyped_chain(output_typed: bool) -> onnx.ModelProto:
    """x -> Relu -> r -> ReduceLogSumExp -> z -> Identity -> y, where r has no type information."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        lse_node(["r"], "z", axes=[1]),
        helper.make_node("Identity", ["z"], ["y"]),
    ]
    model = make_model(nodes, [vi("x", F32, [3, 4])], [vi("y", F32, [3, 1])], opset=13)
    if output_typed:
        model.graph.value_info.append(vi("z", F32, [3, 1]))
    return model


def test_element_type_unknown_to_the_model_comes_from_shape_inference() -> None:
    model = _untyped_chain(output_typed=False)
    out, lse_pass, result = decompose(model)
    assert result.modified and lse_pass.stats == only("decomposed")
    assert "ReduceLogSumExp" not in op_types(out)
    x = X[:, :, 0]
    _assert_accurate(ort_run(out, {"x": x})[0], np.maximum(x, 0), (1,), 1)
    # Inference only informed the rewrite: r is still untyped in the output model.
    assert "r" not in {v.name for v in out.graph.value_info}


def test_element_type_known_from_the_output_is_enough() -> None:
    out, lse_pass, _ = decompose(_untyped_chain(output_typed=True))
    assert lse_pass.stats == only("decomposed")
    x = X[:, :, 0]
    _assert_accurate(ort_run(out, {"x": x})[0], np.maximum(x, 0), (1,), 1)


# --- names, types, casts -------------------------------------------------------------------


def test_new_nodes_are_named_after_the_original_and_outputs_keep_name_type_shape() -> None:
    nodes = [
        lse_node(["x", "axes"], "mid", name="head/lse", keepdims=1),
        helper.make_node("Neg", ["mid"], ["y"], name="neg"),
        helper.make_node("Identity", ["x"], ["head/lse/max_output"], name="head/lse/max"),  # taken names
    ]
    outputs = [vi("y", F32, [3, 1, 5]), vi("head/lse/max_output", F32, [3, 4, 5])]
    model = make_model(nodes, [vi("x", F32, [3, 4, 5])], outputs, [axes_init([1])])
    model.graph.value_info.append(vi("mid", F32, [3, 1, 5]))
    out, _, _ = decompose(model)

    new = [n for n in out.graph.node if n.name not in ("neg", "head/lse/max")]
    assert new and all(n.name.startswith("head/lse/") for n in new)
    names = [n.name for n in out.graph.node]
    assert len(names) == len(set(names)) and "head/lse/max_1" in names
    values = [o for n in out.graph.node for o in n.output]
    assert len(values) == len(set(values))
    assert producer(out, "mid").op_type == "Add" and producer(out, "mid").name == "head/lse/add"
    (info,) = [v for v in out.graph.value_info if v.name == "mid"]
    assert info.type == vi("mid", F32, [3, 1, 5]).type
    assert [o.name for o in out.graph.output] == ["y", "head/lse/max_output"]
    y, copy = ort_run(out, {"x": X})
    _assert_accurate(-y, X, (1,), 1)
    np.testing.assert_array_equal(copy, X)


def test_unnamed_node_takes_its_prefix_from_the_output_name() -> None:
    node = helper.make_node("ReduceLogSumExp", ["x"], ["scores"], axes=[0])
    out, _, _ = decompose(make_model([node], [vi("x", F32, [3, 4])], [vi("scores", F32, [1, 4])], opset=13))
    assert all(n.name.startswith("scores/") for n in out.graph.node)
    assert out.graph.output[0].name == "scores" and out.graph.output[0].type == vi("scores", F32, [1, 4]).type


@pytest.mark.parametrize("elem", [F16, BF16, F32, F64])
def test_no_cast_to_double_and_casts_only_around_half_types(elem: int) -> None:
    out, _, _ = decompose(lse_model([3, 512], [3], [-1], keepdims=0, elem=elem))
    casts = [n for n in all_nodes(out) if n.op_type == "Cast"]
    assert all(attr(n, "to") != F64 for n in casts)
    constants = [numpy_helper.to_array(attr(n, "value")) for n in all_nodes(out) if n.op_type == "Constant"]
    constants += [numpy_helper.to_array(t) for t in out.graph.initializer]  # the main graph's bounds
    float_constants = [c for c in constants if c.dtype.kind == "f"]
    assert float_constants
    if elem in (F16, BF16):
        assert [attr(n, "to") for n in casts] == [F32, elem]  # in, then out
        assert all(c.dtype == np.float32 for c in float_constants)
    else:
        assert not casts
        assert all(c.dtype == helper.tensor_dtype_to_np_dtype(elem) for c in float_constants)
    if elem != F64:  # float32 and the half types compute in float32: no double value anywhere
        inferred = onnx.shape_inference.infer_shapes(out, strict_mode=True)
        assert inferred.graph.value_info
        assert all(v.type.tensor_type.elem_type != F64 for v in inferred.graph.value_info)


def test_two_nodes_in_a_chain_and_a_shared_input() -> None:
    nodes = [
        lse_node(["x", "a1"], "p", name="first", keepdims=1),
        lse_node(["p", "a0"], "q", name="second", keepdims=0),
        lse_node(["x", "a0"], "r", name="third", keepdims=0),
    ]
    outputs = [vi("p", F32, [3, 1, 5]), vi("q", F32, [1, 5]), vi("r", F32, [4, 5])]
    model = make_model(nodes, [vi("x", F32, [3, 4, 5])], outputs, [axes_init([1], "a1"), axes_init([0], "a0")])
    out, lse_pass, _ = decompose(model)
    assert lse_pass.stats["applied"]["ReduceLogSumExp"] == 3
    p, q, r = ort_run(out, {"x": X})
    _assert_accurate(p, X, (1,), 1)
    _assert_accurate(q, p, (0,), 0)  # p as the model computed it feeds q
    _assert_accurate(r, X, (0,), 0)
