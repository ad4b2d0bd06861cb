"""Tests of the opset upgrade pass (``passes.upgrade``).

Every converted model must pass ``onnx.checker`` (full check) and give
bit-identical onnxruntime outputs (optimisations disabled) before and after.
"""

from __future__ import annotations

import copy
import pathlib
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import onnx
import onnx.helper as oh
import onnx_ir as ir
import pytest
from onnx.reference import ReferenceEvaluator

from passes.errors import InputError, UpgradeError
from passes.upgrade import UpgradeOpsetPass
from passes.upgrade import SEMANTIC_CHANGES
from passes.upgrade.registry import ADAPTERS, REFUSED_CHANGES
from passes.upgrade.schemas import reduce_ops_by_axes_version
from passes.verify.probe import max_supported_opset
from helpers import ort_run

REDUCE_18 = (
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceMax",
    "ReduceMean",
    "ReduceMin",
    "ReduceProd",
    "ReduceSumSquare",
)
RNG = np.random.default_rng(1234)
X = (np.abs(RNG.standard_normal((2, 3, 4))) + 0.25).astype(np.float32)


# --- helpers ---------------------------------------------------------------------------------


def info(name: str, array: np.ndarray | None = None, elem: int | None = None, shape=None) -> onnx.ValueInfoProto:
    if array is not None:
        elem, shape = oh.np_dtype_to_tensor_dtype(array.dtype), array.shape
    return oh.make_tensor_value_info(name, elem, shape)


def make_model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Mapping[str, np.ndarray],
    outputs: Iterable[str | onnx.ValueInfoProto],
    *,
    opset: int,
    initializers: Mapping[str, np.ndarray] | None = None,
    functions: Sequence[onnx.FunctionProto] = (),
    domains: Mapping[str, int] | None = None,
    ir_version: int = 8,
    infer: bool = True,
    check: bool = True,
) -> onnx.ModelProto:
    """A valid model; outputs given by name get their types from onnx shape inference."""
    graph = oh.make_graph(
        list(nodes),
        "g",
        [info(n, a) for n, a in inputs.items()],
        [oh.make_empty_tensor_value_info(o) if isinstance(o, str) else o for o in outputs],
        [onnx.numpy_helper.from_array(a, n) for n, a in (initializers or {}).items()],
    )
    opsets = [oh.make_opsetid("", opset)] + [oh.make_opsetid(d, v) for d, v in (domains or {}).items()]
    model = oh.make_model(graph, opset_imports=opsets, functions=list(functions), ir_version=ir_version)
    if infer:
        model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    _type_outputs_from_a_run(model, inputs)
    if check:
        onnx.checker.check_model(model, full_check=True)
    return model


def _type_outputs_from_a_run(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> None:
    """Types the graph outputs that shape inference could not (data-dependent shapes)."""
    missing = [o for o in model.graph.output if not o.type.tensor_type.HasField("shape")]
    if not missing:
        return
    results = dict(zip([o.name for o in model.graph.output], ort_run(model, feeds)))
    for output in missing:
        output.CopyFrom(info(output.name, results[output.name]))


def upgrade(
    model: onnx.ModelProto, target: int | None = 18
) -> tuple[onnx.ModelProto, ir.passes.PassResult, UpgradeOpsetPass]:
    upgrade_pass = UpgradeOpsetPass(target)
    result = upgrade_pass(ir.from_proto(copy.deepcopy(model)))
    return ir.to_proto(result.model), result, upgrade_pass


def assert_identical(before: onnx.ModelProto, after: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> None:
    """The upgraded model is valid and onnxruntime gives the same bits."""
    onnx.checker.check_model(after, full_check=True)
    expected = ort_run(before, feeds)
    actual = ort_run(after, feeds)
    assert len(expected) == len(actual)
    for e, a in zip(expected, actual):
        assert e.dtype == a.dtype and e.shape == a.shape
        assert e.tobytes() == a.tobytes()


def convert(model: onnx.ModelProto, target: int = 18, feeds: Mapping[str, np.ndarray] | None = None):
    """Upgrades, checks validity and bit-identity, returns the upgraded proto and the pass."""
    after, result, upgrade_pass = upgrade(model, target)
    assert result.modified
    assert opset(after) == target
    assert_identical(model, after, feeds if feeds is not None else {"x": X})
    return after, upgrade_pass


def assert_same_as_onnx_converter(
    model: onnx.ModelProto, ours: onnx.ModelProto, feeds: Mapping[str, np.ndarray], target: int = 18
) -> None:
    """onnx's own converter, where it handles the model, computes the same bits as ours."""
    theirs = onnx.version_converter.convert_version(model, target)
    for a, b in zip(ort_run(ours, feeds), ort_run(theirs, feeds)):
        assert a.tobytes() == b.tobytes()


def opset(model: onnx.ModelProto | onnx.FunctionProto, domain: str = "") -> int | None:
    for entry in model.opset_import:
        if entry.domain == domain:
            return entry.version
    return None


def attrs(node: onnx.NodeProto) -> dict[str, object]:
    return {a.name: oh.get_attribute_value(a) for a in node.attribute}


def inits(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    return {t.name: onnx.numpy_helper.to_array(t) for t in graph.initializer}


def node_of(graph: onnx.GraphProto, op_type: str) -> onnx.NodeProto:
    (node,) = [n for n in graph.node if n.op_type == op_type]
    return node


# --- the nine reduce ops ---------------------------------------------------------------------

AXES_CASES = {"absent": None, "empty": [], "positive": [1], "negative": [-1], "several": [0, -1]}


@pytest.mark.parametrize("axes_case", AXES_CASES)
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("op_type", REDUCE_18)
def test_reduce_axes_become_an_input(op_type: str, keepdims: int, axes_case: str) -> None:
    axes = AXES_CASES[axes_case]
    node = oh.make_node(op_type, ["x"], ["y"], name="r", keepdims=keepdims)
    if axes is not None:
        node.attribute.append(oh.make_attribute("axes", axes, attr_type=onnx.AttributeProto.INTS))
    model = make_model([node], {"x": X}, ["y"], opset=13)
    after, _ = convert(model)
    assert_same_as_onnx_converter(model, after, {"x": X})

    node = node_of(after.graph, op_type)
    assert node.name == "r"
    assert attrs(node) == {"keepdims": keepdims}  # no axes attribute, noop_with_empty_axes left at 0
    if not axes:
        assert list(node.input) == ["x"]
        assert not after.graph.initializer
    else:
        assert len(node.input) == 2
        values = inits(after.graph)[node.input[1]]
        assert values.dtype == np.int64 and values.tolist() == axes
    assert [n.op_type for n in after.graph.node] == [op_type]  # no Constant node per reduce


@pytest.mark.parametrize("source", [11, 12, 13, 17])
def test_sources_11_to_17(source: int) -> None:
    """A mixed model exported at each source opset, with that opset's op forms."""
    nodes = [oh.make_node(op, ["x"], [f"y_{op}"], axes=[1]) for op in REDUCE_18]
    nodes += [
        oh.make_node("Softmax", ["x"], ["sm"], axis=-1),
        oh.make_node("ReduceMean", ["x"], ["s_in"], axes=[1]),
    ]
    if source < 13:
        nodes += [
            oh.make_node("ReduceSum", ["x"], ["s"], axes=[2], keepdims=0),
            oh.make_node("Squeeze", ["s_in"], ["q"], axes=[1]),
            oh.make_node("Unsqueeze", ["x"], ["u"], axes=[0, -1]),
            oh.make_node("Split", ["x"], ["p0", "p1"], axis=2, split=[1, 3]),
        ]
    else:
        nodes += [
            oh.make_node("ReduceSum", ["x", "axes2"], ["s"], keepdims=0),
            oh.make_node("Squeeze", ["s_in", "axes1"], ["q"]),
            oh.make_node("Unsqueeze", ["x", "axes0m1"], ["u"]),
            oh.make_node("Split", ["x", "split"], ["p0", "p1"], axis=2),
        ]
    initializers = (
        {}
        if source < 13
        else {
            "axes2": np.array([2], np.int64),
            "axes1": np.array([1], np.int64),
            "axes0m1": np.array([0, -1], np.int64),
            "split": np.array([1, 3], np.int64),
        }
    )
    outputs = [f"y_{op}" for op in REDUCE_18] + ["s", "q", "u", "p0", "p1", "sm"]
    model = make_model(nodes, {"x": X}, outputs, opset=source, initializers=initializers)
    after, upgrade_pass = convert(model)
    assert_same_as_onnx_converter(model, after, {"x": X})
    assert upgrade_pass.stats["source_opsets"] == [source]
    for node in after.graph.node:
        assert "axes" not in attrs(node) and "split" not in attrs(node)


def test_reducesum_13_forms_are_kept() -> None:
    """ReduceSum-13 already takes axes as an input: initializer, graph input, or none with noop."""
    nodes = [
        oh.make_node("ReduceSum", ["x", "ax_init"], ["a"], keepdims=0),
        oh.make_node("ReduceSum", ["x", "ax_input"], ["b"]),
        oh.make_node("ReduceSum", ["x"], ["c"], noop_with_empty_axes=1),
        oh.make_node("ReduceSum", ["x", "ax_empty"], ["d"], noop_with_empty_axes=1),
    ]
    model = make_model(
        nodes,
        {"x": X, "ax_input": np.array([0, 2], np.int64)},
        ["a", "b", "c", "d"],
        opset=13,
        initializers={"ax_init": np.array([-1], np.int64), "ax_empty": np.zeros(0, np.int64)},
    )
    after, upgrade_pass = convert(model, feeds={"x": X, "ax_input": np.array([0, 2], np.int64)})
    assert [list(n.input) for n in after.graph.node] == [list(n.input) for n in model.graph.node]
    assert [attrs(n) for n in after.graph.node] == [attrs(n) for n in model.graph.node]
    assert upgrade_pass.stats["applied"] == {}
    assert set(inits(after.graph)) == {"ax_init", "ax_empty"}


def test_matches_onnx_version_converter_with_fewer_nodes() -> None:
    nodes = [
        oh.make_node(op, ["x"], [f"y{i}"], axes=[i % 3 - 1], keepdims=i % 2) for i, op in enumerate(REDUCE_18)
    ]
    model = make_model(nodes, {"x": X}, [f"y{i}" for i in range(len(REDUCE_18))], opset=13)
    ours, _ = convert(model)
    theirs = onnx.version_converter.convert_version(model, 18)
    for a, b in zip(ort_run(ours, {"x": X}), ort_run(theirs, {"x": X})):
        assert a.tobytes() == b.tobytes()
    assert sum(n.op_type == "Constant" for n in theirs.graph.node) == len(REDUCE_18)
    assert len(ours.graph.node) == len(REDUCE_18)
    assert len(ours.graph.initializer) == 3  # axes -1, 0 and 1, shared


# --- sharing and naming of the axes constants ------------------------------------------------


def test_axes_initializers_are_shared_per_graph() -> None:
    then_graph = oh.make_graph(
        [oh.make_node("ReduceMean", ["x"], ["t"], axes=[1])], "then", [], [info("t", elem=1, shape=[2, 1, 4])]
    )
    else_graph = oh.make_graph(
        [oh.make_node("ReduceMax", ["x"], ["e"], axes=[1])], "else", [], [info("e", elem=1, shape=[2, 1, 4])]
    )
    nodes = [
        oh.make_node("ReduceMean", ["x"], ["a"], axes=[1]),
        oh.make_node("ReduceMax", ["x"], ["b"], axes=[1]),
        oh.make_node("ReduceMin", ["x"], ["c"], axes=[0]),
        oh.make_node("If", ["cond"], ["d"], then_branch=then_graph, else_branch=else_graph),
    ]
    feeds = {"x": X, "cond": np.array(True)}
    model = make_model(nodes, feeds, ["a", "b", "c", "d"], opset=13)
    after, upgrade_pass = convert(model, feeds=feeds)
    main = inits(after.graph)
    assert sorted(v.tolist() for v in main.values()) == [[0], [1]]
    assert after.graph.node[0].input[1] == after.graph.node[1].input[1]
    if_node = node_of(after.graph, "If")
    names = set(main)
    for branch in if_node.attribute:
        sub = inits(branch.g)
        assert [v.tolist() for v in sub.values()] == [[1]]  # its own initializer
        assert branch.g.node[0].input[1] in sub
        names.update(sub)
    assert len(names) == 4  # no name shared between graphs
    assert upgrade_pass.stats["initializers_added"] == 4
    assert_identical(model, after, {"x": X, "cond": np.array(False)})


def test_equal_axes_share_one_planned_input_and_each_model_owns_its_array() -> None:
    """Equal attribute values share one planned input (one read-only array), and every model
    still gets its own writable array: two upgrades, one after the other, hand out none twice."""
    nodes = [oh.make_node("ReduceMean", ["x"], ["a"], axes=[1]), oh.make_node("ReduceMax", ["x"], ["b"], axes=[1]),
             oh.make_node("ReduceMin", ["x"], ["c"], axes=[1, 2])]  # fmt: skip
    model = make_model(nodes, {"x": X}, ["a", "b", "c"], opset=13)
    first = UpgradeOpsetPass(18)(ir.from_proto(copy.deepcopy(model))).model
    second = UpgradeOpsetPass(18)(ir.from_proto(copy.deepcopy(model))).model
    for upgraded in (first, second):
        axes = [node.inputs[1] for node in upgraded.graph]
        assert axes[0] is axes[1] and axes[2] is not axes[0]
        assert [v.const_value.numpy().tolist() for v in upgraded.graph.initializers.values()] == [[1], [1, 2]]
    for mine, theirs in zip(first.graph.initializers.values(), second.graph.initializers.values()):
        array = mine.const_value.numpy()
        assert array.flags.writeable and not np.shares_memory(array, theirs.const_value.numpy())
    assert_identical(model, ir.to_proto(second), {"x": X})


def test_generated_names_do_not_collide() -> None:
    """Value names the pass would pick are taken, in the main graph and in a subgraph."""
    body = oh.make_graph(
        [
            oh.make_node("Identity", ["axes_1"], ["axes_1_1"]),
            oh.make_node("ReduceSum", ["axes_1_1"], ["t"], axes=[1]),
        ],
        "then",
        [],
        [info("t", elem=1, shape=[2, 1, 4])],
    )
    nodes = [
        oh.make_node("Relu", ["axes_1"], ["axes_1_2"]),
        oh.make_node("ReduceMean", ["axes_1_2"], ["y"], axes=[1]),
        oh.make_node("If", ["cond"], ["z"], then_branch=body, else_branch=body),
    ]
    feeds = {"axes_1": X, "cond": np.array(True)}
    model = make_model(nodes, feeds, ["y", "z"], opset=11)
    after, _ = convert(model, feeds=feeds)
    all_names = [v for n in after.graph.node for v in n.output] + [i.name for i in after.graph.input]
    all_names += list(inits(after.graph))
    for branch in node_of(after.graph, "If").attribute:
        all_names += [v for n in branch.g.node for v in n.output] + list(inits(branch.g))
    new = [n for n in all_names if n.startswith("axes_1") and n not in ("axes_1", "axes_1_1", "axes_1_2")]
    assert len(new) == 3  # main graph, then and else branches
    assert len(set(all_names)) == len(all_names) - 2  # only the shared branch body repeats (x2)


# --- control flow and functions --------------------------------------------------------------


def _reduce_body(name: str, source: str) -> list[onnx.NodeProto]:
    return [
        oh.make_node("ReduceMean", [source], [f"{name}_m"], axes=[-1], keepdims=1),
        oh.make_node("ReduceSum", [f"{name}_m"], [f"{name}_s"], axes=[0], keepdims=1),
        oh.make_node("ReduceLogSumExp", [f"{name}_s"], [f"{name}_r"], keepdims=1),
    ]


def test_if_loop_scan_and_if_inside_loop() -> None:
    shape = [1, 1, 1]
    then_g = oh.make_graph(_reduce_body("th", "x"), "then", [], [info("th_r", elem=1, shape=shape)])
    else_g = oh.make_graph(
        [oh.make_node("ReduceMax", ["x"], ["el_r"], axes=[0, 1, 2])],
        "else",
        [],
        [info("el_r", elem=1, shape=shape)],
    )
    inner_if = oh.make_node("If", ["cond"], ["lp_if"], then_branch=then_g, else_branch=else_g)
    loop_body = oh.make_graph(
        [
            inner_if,
            oh.make_node("ReduceProd", ["carry"], ["lp_p"], axes=[1], keepdims=1),
            oh.make_node("Add", ["lp_p", "lp_if"], ["carry_out"]),
            oh.make_node("Identity", ["c_in"], ["c_out"]),
        ],
        "loop",
        [info("i", elem=7, shape=[]), info("c_in", elem=9, shape=[]), info("carry", elem=1, shape=[2, 1, 4])],
        [info("c_out", elem=9, shape=[]), info("carry_out", elem=1, shape=[2, 1, 4])],
    )
    scan_body = oh.make_graph(
        [
            oh.make_node("ReduceL2", ["elem"], ["st_l2"], axes=[0], keepdims=0),
            oh.make_node("Add", ["state", "st_l2"], ["state_out"]),
            oh.make_node("ReduceSumSquare", ["elem"], ["scan_out"], axes=[-1], keepdims=1),
        ],
        "scan",
        [info("state", elem=1, shape=[4]), info("elem", elem=1, shape=[3, 4])],
        [info("state_out", elem=1, shape=[4]), info("scan_out", elem=1, shape=[3, 1])],
    )
    nodes = [
        oh.make_node("ReduceMin", ["x"], ["start"], axes=[1], keepdims=1),
        oh.make_node("Loop", ["trips", "cond", "start"], ["loop_out"], body=loop_body),
        oh.make_node("Scan", ["state0", "x"], ["state_final", "scanned"], body=scan_body, num_scan_inputs=1),
        oh.make_node("If", ["cond"], ["top_if"], then_branch=then_g, else_branch=else_g),
    ]
    feeds = {"x": X, "cond": np.array(True), "trips": np.array(3, np.int64), "state0": np.zeros(4, np.float32)}
    model = make_model(nodes, feeds, ["loop_out", "state_final", "scanned", "top_if"], opset=12)
    after, upgrade_pass = convert(model, feeds=feeds)
    assert_identical(model, after, feeds | {"cond": np.array(False)})
    assert sum(upgrade_pass.stats["converted"].values()) == 19  # every default-domain node of every graph
    assert upgrade_pass.stats["converted"]["ReduceSum"] == 2

    def walk(graph: onnx.GraphProto) -> Iterable[tuple[onnx.GraphProto, onnx.NodeProto]]:
        for node in graph.node:
            yield graph, node
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    yield from walk(attr.g)

    reduces = [(g, n) for g, n in walk(after.graph) if n.op_type.startswith("Reduce")]
    assert len(reduces) == 12
    for graph, node in reduces:
        assert "axes" not in attrs(node)
        if len(node.input) > 1:  # the constant lives in the graph that uses it
            assert node.input[1] in inits(graph)


def _function(
    nodes: list[onnx.NodeProto], attributes: Sequence[str] = (), function_opset: int = 13
) -> onnx.FunctionProto:
    return oh.make_function(
        "local", "F", ["a"], ["v", "w"], nodes, [oh.make_opsetid("", function_opset)], attributes=list(attributes)
    )


def _ref(node: onnx.NodeProto, name: str, ref: str, kind: int = onnx.AttributeProto.INTS) -> onnx.NodeProto:
    attr = onnx.AttributeProto(name=name, ref_attr_name=ref, type=kind)
    node.attribute.append(attr)
    return node


def test_function_gets_constants_and_keeps_attribute_references() -> None:
    function = _function(
        [
            oh.make_node("ReduceMean", ["a"], ["t"], axes=[1], keepdims=1),
            oh.make_node("ReduceMax", ["t"], ["u"], axes=[1]),
            oh.make_node("ReduceProd", ["u"], ["v"], axes=[0]),
            _ref(oh.make_node("ReduceL1", ["a"], ["w"], keepdims=0), "axes", "rax"),
        ],
        ["rax"],
    )
    nodes = [
        oh.make_node("F", ["x"], ["y", "z"], domain="local", rax=[0, -1]),
        oh.make_node("F", ["x"], ["y2", "z2"], domain="local", rax=[1]),
    ]
    outputs = ["y", "z", "y2", "z2"]
    model = make_model(nodes, {"x": X}, outputs, opset=13, functions=[function], domains={"local": 1})
    after, upgrade_pass = convert(model)
    (func,) = after.functions
    assert opset(func) == 18 and opset(after, "local") == 1
    assert [n.op_type for n in after.graph.node] == ["F", "F"]  # not inlined
    assert not after.graph.initializer
    constants = [n for n in func.node if n.op_type == "Constant"]
    assert len(constants) == 3  # [1] shared by ReduceMean/ReduceMax, [0], and the reference
    (ref_const,) = [c for c in constants if c.attribute[0].ref_attr_name]
    assert ref_const.attribute[0].name == "value_ints" and ref_const.attribute[0].ref_attr_name == "rax"
    reduce_l1 = node_of(func, "ReduceL1")
    assert reduce_l1.input[1] == ref_const.output[0]
    assert upgrade_pass.stats["constants_added"] == 3


def test_function_reference_without_binding_is_refused() -> None:
    """A call site that omits the referenced attribute would leave the Constant empty."""
    function = _function(
        [
            oh.make_node("Identity", ["a"], ["v"]),
            _ref(oh.make_node("ReduceL1", ["a"], ["w"], keepdims=0), "axes", "rax"),
        ],
        ["rax"],
    )
    nodes = [oh.make_node("F", ["x"], ["y", "z"], domain="local")]
    model = make_model(nodes, {"x": X}, ["y", "z"], opset=13, functions=[function], domains={"local": 1})
    assert_refused(model, "rax")


def test_function_attribute_references_of_every_kind_and_subgraphs() -> None:
    """References become Constants (CastLike for a float bound, as function types are unknown);
    a subgraph of a function gets its Constants in its own body."""
    ints, floats = onnx.AttributeProto.INTS, onnx.AttributeProto.FLOAT
    then_g = oh.make_graph(
        [_ref(oh.make_node("ReduceMean", ["a"], ["t"]), "axes", "rax")], "then", [], [info("t", elem=1)]
    )
    else_g = oh.make_graph([oh.make_node("ReduceMax", ["a"], ["e"], axes=[1])], "else", [], [info("e", elem=1)])
    nodes = [
        _ref(_ref(oh.make_node("Slice", ["a"], ["s"]), "starts", "st", ints), "ends", "en", ints),
        _ref(oh.make_node("Clip", ["s"], ["c"], max=0.9), "min", "lo", floats),
        _ref(oh.make_node("Pad", ["c"], ["w"], mode="constant"), "pads", "pd", ints),
        oh.make_node("If", ["cond"], ["v"], then_branch=then_g, else_branch=else_g),
    ]
    attributes = ["rax", "st", "en", "lo", "pd"]
    opsets = [oh.make_opsetid("", 9)]
    function = oh.make_function("local", "F", ["a", "cond"], ["v", "w"], nodes, opsets, attributes)
    bindings = {"rax": [1], "st": [0, 1], "en": [2, 3], "lo": 0.5, "pd": [0, 1, 0, 0, 0, 1]}
    call = oh.make_node("F", ["x", "cond"], ["y", "z"], domain="local", **bindings)
    feeds = {"x": X, "cond": np.array(True)}
    model = make_model([call], feeds, ["y", "z"], opset=9, functions=[function], domains={"local": 1})
    after, _ = convert(model, feeds=feeds)
    assert_identical(model, after, feeds | {"cond": np.array(False)})
    body = after.functions[0]
    references = {n.attribute[0].ref_attr_name: n.attribute[0].name for n in body.node if n.op_type == "Constant"}
    expected = {"st": "value_ints", "en": "value_ints", "lo": "value_float", "pd": "value_ints", "": "value"}
    assert references == expected
    assert [n.op_type for n in body.node if n.op_type == "CastLike"] == ["CastLike", "CastLike"]
    branches = {a.name: a.g for a in node_of(body, "If").attribute}
    assert [n.op_type for n in branches["then_branch"].node] == ["Constant", "ReduceMean"]
    assert branches["then_branch"].node[0].attribute[0].ref_attr_name == "rax"
    assert [n.op_type for n in branches["else_branch"].node] == ["Constant", "ReduceMax"]


# --- other models ----------------------------------------------------------------------------


def test_external_data_round_trip(tmp_path) -> None:
    weights = RNG.standard_normal((4, 4096)).astype(np.float32)
    nodes = [oh.make_node("MatMul", ["x", "w"], ["h"]), oh.make_node("ReduceMean", ["h"], ["y"], axes=[-1])]
    model = make_model(nodes, {"x": X}, ["y"], opset=13, initializers={"w": weights})
    source = tmp_path / "in.onnx"
    onnx.save_model(model, source, save_as_external_data=True, location="in.data", size_threshold=1024)
    loaded = ir.load(source)
    result = UpgradeOpsetPass()(loaded)
    assert result.modified
    target = tmp_path / "out.onnx"
    ir.save(result.model, target, external_data="out.data")
    assert (tmp_path / "out.data").stat().st_size >= weights.nbytes
    assert target.stat().st_size < weights.nbytes // 10  # the weights stayed outside
    upgraded = onnx.load(target)
    onnx.checker.check_model(str(target), full_check=True)
    assert opset(upgraded) == 18
    assert ort_run(str(target), {"x": X})[0].tobytes() == ort_run(str(source), {"x": X})[0].tobytes()


def test_custom_domain_node_and_ai_onnx_spelling() -> None:
    nodes = [
        oh.make_node("ReduceMean", ["x"], ["m"], axes=[1], domain="ai.onnx"),
        oh.make_node("Gelu", ["m"], ["y"], domain="com.microsoft", name="gelu", doc_string="custom"),
    ]
    graph = oh.make_graph(nodes, "g", [info("x", X)], [info("y", elem=1, shape=[2, 1, 4])])
    model = oh.make_model(
        graph, opset_imports=[oh.make_opsetid("ai.onnx", 13), oh.make_opsetid("com.microsoft", 1)], ir_version=8
    )
    after, result, _ = upgrade(model)
    assert result.modified
    onnx.checker.check_model(after, full_check=True)
    assert {e.domain: e.version for e in after.opset_import} == {"ai.onnx": 18, "com.microsoft": 1}
    assert after.graph.node[1] == model.graph.node[1]
    assert ort_run(after, {"x": X})[0].tobytes() == ort_run(model, {"x": X})[0].tobytes()


def test_names_doc_strings_metadata_and_value_info_are_kept() -> None:
    nodes = [
        oh.make_node("ReduceMean", ["x"], ["m"], axes=[1], name="mean", doc_string="the mean"),
        oh.make_node("Relu", ["m"], ["y"], name="relu"),
    ]
    model = make_model(nodes, {"x": X}, ["y"], opset=13)
    model.doc_string = "model doc"
    oh.set_model_props(model, {"author": "test"})
    model.graph.node[0].metadata_props.add(key="origin", value="exporter")
    after, _ = convert(model)
    assert after.doc_string == "model doc"
    assert {p.key: p.value for p in after.metadata_props} == {"author": "test"}
    mean = after.graph.node[0]
    assert (mean.name, mean.doc_string, mean.output[0]) == ("mean", "the mean", "m")
    assert {p.key: p.value for p in mean.metadata_props} == {"origin": "exporter"}
    assert {v.name for v in after.graph.value_info} >= {v.name for v in model.graph.value_info} - {"y"}
    assert after.ir_version == 8


def test_ir_version_is_raised_never_lowered() -> None:
    nodes = [oh.make_node("ReduceMean", ["x"], ["y"], axes=[1])]
    low = make_model(nodes, {"x": X}, ["y"], opset=11, ir_version=6)
    high = make_model(nodes, {"x": X}, ["y"], opset=11, ir_version=10)
    assert convert(low)[0].ir_version == 8
    assert convert(high)[0].ir_version == 10
    target = max_supported_opset()
    assert convert(low, target)[0].ir_version == onnx.helper.find_min_ir_version_for([oh.make_opsetid("", target)])


# --- no-op, idempotence, errors --------------------------------------------------------------


def test_second_run_is_a_no_op() -> None:
    model = make_model([oh.make_node("ReduceMean", ["x"], ["y"], axes=[1])], {"x": X}, ["y"], opset=13)
    once, _, _ = upgrade(model)
    twice, result, upgrade_pass = upgrade(once)
    assert not result.modified
    assert twice.SerializeToString() == once.SerializeToString()
    assert upgrade_pass.stats["converted"] == {}


def test_model_at_target_is_untouched() -> None:
    model = make_model([oh.make_node("ReduceMean", ["x", "ax"], ["y"])], {"x": X}, ["y"], opset=18,
                       initializers={"ax": np.array([1], np.int64)})
    reference = ir.to_proto(ir.from_proto(model)).SerializeToString()
    after, result, _ = upgrade(model)
    assert not result.modified
    assert after.SerializeToString() == reference


def assert_refused(model: onnx.ModelProto, *fragments: str, target: int = 18) -> None:
    """The pass raises UpgradeError naming the problem and leaves the model as it was."""
    ir_model = ir.from_proto(copy.deepcopy(model))
    reference = ir.to_proto(ir_model).SerializeToString()
    with pytest.raises(UpgradeError) as error:
        UpgradeOpsetPass(target)(ir_model)
    message = str(error.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message
    assert ir.to_proto(ir_model).SerializeToString() == reference


def test_op_without_adapter_is_refused_and_model_unchanged() -> None:
    """Scan-8 has a batch axis that Scan-9 removed; nothing is converted, not even the Reduce before it."""
    body = oh.make_graph(
        [oh.make_node("Add", ["s", "e"], ["s2"]), oh.make_node("Identity", ["e"], ["o"])],
        "body",
        [info("s", elem=1, shape=[4]), info("e", elem=1, shape=[4])],
        [info("s2", elem=1, shape=[4]), info("o", elem=1, shape=[4])],
    )
    nodes = [
        oh.make_node("ReduceMean", ["x"], ["m"], axes=[1]),
        oh.make_node("Scan", ["", "init", "x"], ["final", "out"], body=body, num_scan_inputs=1, name="scan8"),
    ]
    model = make_model(nodes, {"x": X, "init": np.zeros((2, 4), np.float32)}, ["m", "final", "out"], opset=8)
    assert_refused(model, "Scan", "'scan8'", "8", "18", "batch axis")


@pytest.mark.parametrize(
    ("key", "fragment"),
    [(("ReduceMean", 18), "attribute 'axes' does not exist in ReduceMean-18"), (("RoiAlign", 16), "half_pixel")],
)
def test_breaking_steps_are_detected_without_their_adapter(monkeypatch, key, fragment: str) -> None:
    """The schema check finds a removed attribute; the semantic table covers what schemas cannot show."""
    monkeypatch.delitem(ADAPTERS, key)
    if key[0] == "RoiAlign":
        node = oh.make_node("RoiAlign", ["x", "rois", "idx"], ["y"], output_height=2, output_width=2)
        model = make_model([node], {"x": X4, "rois": ROIS, "idx": BATCH_INDICES}, ["y"], opset=10)
    else:
        model = make_model([oh.make_node("ReduceMean", ["x"], ["y"], axes=[1])], {"x": X}, ["y"], opset=13)
    assert_refused(model, fragment)


def test_the_reduce_ops_that_moved_axes_come_from_the_schemas() -> None:
    assert reduce_ops_by_axes_version() == {13: ("ReduceSum",), 18: REDUCE_18}
    for op_type in REDUCE_18:
        assert ADAPTERS[(op_type, 18)].name == "axes attribute -> input"


def test_semantic_changes_have_adapters() -> None:
    """Each change is described once: by its adapter, or in REFUSED_CHANGES when it has none."""
    without = {key for key in SEMANTIC_CHANGES if key not in ADAPTERS}
    assert without == set(REFUSED_CHANGES) == {("Scan", 9)}
    described = {key: adapter.change for key, adapter in ADAPTERS.items() if adapter.change is not None}
    assert SEMANTIC_CHANGES == {**described, **REFUSED_CHANGES}


@pytest.mark.parametrize(("op_type", "target"), [("ReduceLogSum", 28), ("ReduceLogSumExp", 28)])
def test_types_dropped_by_the_target_are_refused(op_type: str, target: int) -> None:
    if target > max_supported_opset():
        pytest.skip(f"opset {target} is not supported here")
    x = np.arange(24, dtype=np.int32).reshape(2, 3, 4) + 1
    graph = oh.make_graph(
        [oh.make_node(op_type, ["x"], ["y"], axes=[1])], "g", [info("x", x)], [info("y", elem=6, shape=[2, 1, 4])]
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 13)], ir_version=8)
    assert_refused(model, op_type, "INT32", f"{op_type}-{target}", target=target)


def test_used_outputs_that_disappear_are_refused() -> None:
    bn = _batchnorm(5)
    model = make_model([bn], {"x": X4}, ["y", "mean", "var", "saved_mean"], opset=9, initializers=BN_PARAMS)
    assert_refused(model, "BatchNormalization", "saved_mean")


def test_a_model_above_the_target_is_left_as_it_is() -> None:
    model = make_model([oh.make_node("ReduceMean", ["x", "ax"], ["y"])], {"x": X}, ["y"], opset=19,
                       initializers={"ax": np.array([1], np.int64)})
    after, result, upgrade_pass = upgrade(model, target=None)  # the default target: 18, never lowering
    assert not result.modified and opset(after) == 19
    assert upgrade_pass.stats["converted"] == {}
    reference = ir.to_proto(ir.from_proto(model)).SerializeToString()
    ir_model = ir.from_proto(copy.deepcopy(model))
    with pytest.raises(InputError, match="--target-opset 18 is lower than the model's opset 19"):
        UpgradeOpsetPass(18)(ir_model)  # asked for explicitly: refused, never silently left
    assert ir.to_proto(ir_model).SerializeToString() == reference


@pytest.mark.parametrize("target", [6, 1, max_supported_opset() + 1])
def test_unsupported_targets_are_refused(target: int) -> None:
    with pytest.raises(UpgradeError, match=str(target)):
        UpgradeOpsetPass(target)


@pytest.mark.parametrize("target", [18, 21])
def test_the_pass_does_not_import_onnxruntime(target: int) -> None:
    """Only the probe (passes.verify.probe) imports onnxruntime, and targets up to 21 need none."""
    code = (
        "import sys, passes.upgrade; assert 'onnxruntime' not in sys.modules; "
        f"passes.upgrade.UpgradeOpsetPass({target}); assert 'onnxruntime' not in sys.modules"
    )
    root = pathlib.Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True)


def test_every_supported_target() -> None:
    ops = [op for op in REDUCE_18 if op != "ReduceLogSumExp"]  # see the next test
    nodes = [oh.make_node(op, ["x"], [f"y{i}"], axes=[1]) for i, op in enumerate(ops)]
    nodes += [oh.make_node("Split", ["x"], ["p0", "p1"], axis=1, split=[1, 2])]
    model = make_model(nodes, {"x": X}, [f"y{i}" for i in range(len(ops))] + ["p0", "p1"], opset=12)
    for target in range(13, max_supported_opset() + 1):
        after, _ = convert(model, target)
        # Reduce ops keep `axes` in the target's form: an attribute up to 17, an input from 18.
        for node in after.graph.node:
            if node.op_type.startswith("Reduce"):
                assert ("axes" in attrs(node)) == (target < 18) and len(node.input) == (1 if target < 18 else 2)


def test_reduce_logsumexp_above_27_is_the_same_op() -> None:
    """ReduceLogSumExp-28 only drops integer types; onnxruntime's opset-28 kernel rounds
    differently (1 ulp) from its opset-18 one, so bits can only match up to opset 27."""
    model = make_model([oh.make_node("ReduceLogSumExp", ["x"], ["y"], axes=[1])], {"x": X}, ["y"], opset=13)
    at_18, _ = convert(model, 18)
    for target in range(19, max_supported_opset() + 1):
        after, _, _ = upgrade(model, target)
        onnx.checker.check_model(after, full_check=True)
        assert after.graph.node == at_18.graph.node
        expected, actual = ort_run(model, {"x": X})[0], ort_run(after, {"x": X})[0]
        if target <= 27:
            assert expected.tobytes() == actual.tobytes()
        else:
            np.testing.assert_array_max_ulp(expected, actual, maxulp=1)


@pytest.mark.parametrize("target", [13, 15, 17, 18])
def test_opset_9_network_of_common_ops(target: int) -> None:
    """A network of the ops an opset-9 exporter emits: every node converts, every output keeps its bits."""
    w = {
        "w": RNG.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.2,
        "b": RNG.standard_normal(4).astype(np.float32),
        "scale": RNG.random(4).astype(np.float32),
        "bias": RNG.random(4).astype(np.float32),
        "mean": RNG.random(4).astype(np.float32),
        "var": RNG.random(4).astype(np.float32) + 0.5,
        "gw": RNG.standard_normal((10, 64)).astype(np.float32) * 0.1,
        "gb": RNG.standard_normal(10).astype(np.float32),
        "slope": np.array([0.1], np.float32),
        "shape": np.array([1, -1], np.int64),
        "lw": RNG.standard_normal((1, 20, 4)).astype(np.float32) * 0.3,
        "lr": RNG.standard_normal((1, 20, 5)).astype(np.float32) * 0.3,
        "idx": np.array([0, 2], np.int64),
        "ups": np.array([1, 1, 2, 2], np.float32),
    }
    w["gwT"] = w["gw"].T.copy()
    nodes = [
        oh.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        oh.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["bn"]),
        oh.make_node("PRelu", ["bn", "slope"], ["pr"]),
        oh.make_node("LeakyRelu", ["pr"], ["lr_"], alpha=0.2),
        oh.make_node("MaxPool", ["lr_"], ["mp"], kernel_shape=[2, 2], strides=[2, 2]),
        oh.make_node("AveragePool", ["lr_"], ["ap"], kernel_shape=[2, 2], strides=[2, 2], pads=[0, 0, 1, 1]),
        oh.make_node("Sum", ["mp", "ap"], ["s"]),
        oh.make_node("Max", ["s", "mp"], ["mx"]),
        oh.make_node("InstanceNormalization", ["mx", "scale", "bias"], ["inn"]),
        oh.make_node("Upsample", ["inn", "ups"], ["up"], mode="nearest"),
        oh.make_node("GlobalAveragePool", ["up"], ["gap"]),
        oh.make_node("Flatten", ["mx"], ["fl"], axis=1),
        oh.make_node("Gemm", ["fl", "gw", "gb"], ["gm"], transB=1),
        oh.make_node("Softmax", ["gm"], ["sm"]),
        oh.make_node("Reshape", ["gap", "shape"], ["rs"]),
        oh.make_node("Transpose", ["rs"], ["tr"], perm=[1, 0]),
        oh.make_node("Cast", ["tr"], ["ca"], to=onnx.TensorProto.DOUBLE),
        oh.make_node("Gather", ["sm", "idx"], ["ga"], axis=1),
        oh.make_node("Unsqueeze", ["ga"], ["uq"], axes=[0]),
        oh.make_node("Concat", ["uq", "uq"], ["cc"], axis=0),
        oh.make_node("Shape", ["cc"], ["sh"]),
        oh.make_node("ConstantOfShape", ["sh"], ["cos"]),
        oh.make_node("Constant", [], ["sh2"], value=onnx.numpy_helper.from_array(np.array([2, 10], np.int64))),
        oh.make_node("Expand", ["gb", "sh2"], ["ex"]),
        oh.make_node("Greater", ["ex", "gb"], ["gt"]),
        oh.make_node("Where", ["gt", "ex", "gb"], ["wh"]),
        oh.make_node("LSTM", ["seq", "lw", "lr"], ["ly", "lh"], hidden_size=5),
        oh.make_node("MatMul", ["fl", "gwT"], ["mm"]),
        oh.make_node("Dropout", ["mm"], ["do"], ratio=0.1),
        oh.make_node("Pad", ["do"], ["pd"], pads=[0, 1, 0, 1], value=0.5),
        oh.make_node("Clip", ["pd"], ["cl"], min=-0.1, max=0.1),
        oh.make_node("Slice", ["cl"], ["sl"], starts=[1], ends=[5], axes=[1]),
        oh.make_node("TopK", ["sl"], ["tv", "ti"], k=2),
        oh.make_node("ReduceMean", ["tv"], ["rm"], axes=[1]),
        oh.make_node("ArgMax", ["gm"], ["am"], axis=1),
        oh.make_node("Squeeze", ["rm"], ["sq"], axes=[1]),
        oh.make_node("Split", ["gm"], ["sp1", "sp2"], axis=1),
    ]
    feeds = {
        "x": RNG.standard_normal((1, 3, 8, 8)).astype(np.float32),
        "seq": RNG.standard_normal((3, 2, 4)).astype(np.float32),
    }
    outputs = ["fl", "gap", "ca", "cos", "wh", "ly", "lh", "sq", "am", "sp1", "sp2", "ti"]
    model = make_model(nodes, feeds, outputs, opset=9, initializers=w)
    after, upgrade_pass = convert(model, target, feeds=feeds)
    assert sum(upgrade_pass.stats["converted"].values()) == len(nodes)
    assert [n.op_type for n in after.graph.node].count("Resize") == 1
    assert ("axes" in attrs(node_of(after.graph, "ReduceMean"))) == (target < 18)


# --- other adapters --------------------------------------------------------------------------

X4 = RNG.standard_normal((2, 3, 5, 6)).astype(np.float32)
BN_PARAMS = {
    "scale": RNG.random(3).astype(np.float32),
    "bias": RNG.random(3).astype(np.float32),
    "mean_in": RNG.random(3).astype(np.float32),
    "var_in": (RNG.random(3) + 0.5).astype(np.float32),
}


def _batchnorm(outputs: int, **kwargs: object) -> onnx.NodeProto:
    names = ["y", "mean", "var", "saved_mean", "saved_var"][:outputs]
    inputs = ["x", "scale", "bias", "mean_in", "var_in"]
    return oh.make_node("BatchNormalization", inputs, names, name="bn", **kwargs)


def test_batchnorm_9_inference() -> None:
    model = make_model([_batchnorm(1)], {"x": X4}, ["y"], opset=9, initializers=BN_PARAMS)
    after, upgrade_pass = convert(model, feeds={"x": X4})
    assert attrs(after.graph.node[0]) == {}
    assert upgrade_pass.stats["applied"] == {}


def test_batchnorm_9_training_outputs_unused_are_dropped() -> None:
    """Five outputs mean training mode: opset 14 says it with training_mode=1 and three outputs."""
    model = make_model([_batchnorm(5)], {"x": X4}, ["y", "mean", "var"], opset=9, initializers=BN_PARAMS)
    after, _ = convert(model, feeds={"x": X4})
    node = after.graph.node[0]
    assert list(node.output) == ["y", "mean", "var"]
    assert attrs(node) == {"training_mode": 1}


def test_batchnorm_7_spatial() -> None:
    model = make_model([_batchnorm(1, spatial=1)], {"x": X4}, ["y"], opset=7, initializers=BN_PARAMS)
    after, _ = convert(model, feeds={"x": X4})
    assert attrs(after.graph.node[0]) == {}
    outputs = [info("y", elem=1, shape=list(X4.shape))]
    model = make_model([_batchnorm(1, spatial=0)], {"x": X4}, outputs, opset=7, initializers=BN_PARAMS)
    assert_refused(model, "spatial=0")


@pytest.mark.parametrize("source", [11, 13, 17])
def test_split_without_split_gets_num_outputs(source: int) -> None:
    model = make_model([oh.make_node("Split", ["x"], ["a", "b"], axis=-1)], {"x": X}, ["a", "b"], opset=source)
    after, _ = convert(model)
    node = after.graph.node[0]
    assert attrs(node) == {"axis": -1, "num_outputs": 2} and list(node.input) == ["x"]


def test_split_12_split_attribute_becomes_input() -> None:
    node = oh.make_node("Split", ["x"], ["a", "b"], axis=2, split=[3, 1])
    model = make_model([node], {"x": X}, ["a", "b"], opset=12)
    after, _ = convert(model)
    node = after.graph.node[0]
    assert attrs(node) == {"axis": 2}
    assert inits(after.graph)[node.input[1]].tolist() == [3, 1]


ROIS = np.array([[0, 0, 4, 4], [1.2, 0.5, 5.1, 3.3], [0.1, 0.1, 2, 5]], np.float32)
BATCH_INDICES = np.array([0, 1, 1], np.int64)


@pytest.mark.parametrize("mode", ["avg", "max"])
def test_roialign_10_pins_output_half_pixel(mode: str) -> None:
    roi_attrs = {"mode": mode, "output_height": 3, "output_width": 2, "sampling_ratio": 2, "spatial_scale": 0.9}
    node = oh.make_node("RoiAlign", ["x", "rois", "idx"], ["y"], **roi_attrs)
    feeds = {"x": X4, "rois": ROIS, "idx": BATCH_INDICES}
    model = make_model([node], feeds, ["y"], opset=10)
    after, _ = convert(model, feeds=feeds)
    assert_same_as_onnx_converter(model, after, feeds)
    assert attrs(after.graph.node[0])["coordinate_transformation_mode"] == b"output_half_pixel"
    restamped = make_model([node], feeds, ["y"], opset=16)  # what a plain version bump would compute
    assert ort_run(restamped, feeds)[0].tobytes() != ort_run(model, feeds)[0].tobytes()


def test_slice_9_topk_9_pad_10_clip_10() -> None:
    nodes = [
        oh.make_node("Slice", ["x"], ["s1"], starts=[0, 1], ends=[2, 100], axes=[0, -1]),
        oh.make_node("Slice", ["x"], ["s2"], starts=[1, 0], ends=[-1, 2]),
        oh.make_node("TopK", ["x"], ["tv", "ti"], k=2, axis=-1),
        oh.make_node("Pad", ["x"], ["p1"], pads=[0, 1, 2, 1, 0, 0], value=1.5),
        oh.make_node("Pad", ["x"], ["p2"], pads=[0, 1, 2, 1, 0, 0]),
        oh.make_node("Pad", ["x"], ["p3"], pads=[0, 1, 1, 0, 1, 1], mode="reflect"),
        oh.make_node("Clip", ["x"], ["c1"], min=0.4, max=0.9),
        oh.make_node("Clip", ["x"], ["c2"], max=0.7),
        oh.make_node("Clip", ["x"], ["c3"]),
    ]
    outputs = ["s1", "s2", "tv", "ti", "p1", "p2", "p3", "c1", "c2", "c3"]
    model = make_model(nodes, {"x": X}, outputs, opset=9)
    after, _ = convert(model)
    assert_same_as_onnx_converter(model, after, {"x": X})
    by_output = {n.output[0]: n for n in after.graph.node}
    values = inits(after.graph)
    assert [values[i].tolist() for i in by_output["s1"].input[1:]] == [[0, 1], [2, 100], [0, -1]]
    assert len(by_output["s2"].input) == 3
    assert values[by_output["tv"].input[1]].tolist() == [2]
    pad_value = values[by_output["p1"].input[2]]
    assert pad_value.tolist() == 1.5 and pad_value.dtype == np.float32
    assert len(by_output["p2"].input) == 2  # constant_value 0 is the default
    assert list(by_output["c2"].input)[1] == "" and values[by_output["c2"].input[2]].tolist() == np.float32(0.7)
    assert list(by_output["c3"].input) == ["x"]
    moved = {"starts", "ends", "k", "pads", "value", "min", "max"}
    assert all(not attrs(n).keys() & moved for n in after.graph.node)


def test_pad_10_value_minus_zero_is_written() -> None:
    """Pad-10's ``value=-0.0`` pads with -0: dropped like a +0 value (the default), the upgraded
    model padded with +0 (sweep6: a fuzz of opset-9 chains, the sign of zero compared)."""
    nodes = [oh.make_node("Pad", ["x"], ["y"], pads=[0, 1, 2, 1, 0, 0], value=-0.0),
             oh.make_node("Pad", ["x"], ["z"], pads=[0, 1, 2, 1, 0, 0], value=0.0)]  # fmt: skip
    model = make_model(nodes, {"x": X}, ["y", "z"], opset=10)
    after, _ = convert(model)  # the same bits: the padding of y is -0
    by_output = {n.output[0]: n for n in after.graph.node}
    minus_zero = inits(after.graph)[by_output["y"].input[2]]
    assert minus_zero.dtype == np.float32 and np.signbit(minus_zero) and minus_zero == 0
    assert len(by_output["z"].input) == 2  # +0 is the default
    assert np.signbit(ort_run(after, {"x": X})[0][0, 0, 0])


def test_clip_10_with_unknown_input_type_uses_castlike() -> None:
    nodes = [oh.make_node("Relu", ["x"], ["r"]), oh.make_node("Clip", ["r"], ["y"], min=0.5)]
    model = make_model(nodes, {"x": X}, ["y"], opset=10, infer=False)
    model.graph.output[0].CopyFrom(info("y", elem=1, shape=list(X.shape)))
    after, _ = convert(model)
    assert [n.op_type for n in after.graph.node] == ["Relu", "CastLike", "Clip"]


def test_squeeze_unsqueeze_12() -> None:
    nodes = [
        oh.make_node("ReduceMean", ["x"], ["m"], axes=[1]),
        oh.make_node("Squeeze", ["m"], ["a"], axes=[1]),
        oh.make_node("Squeeze", ["m"], ["b"]),
        oh.make_node("Unsqueeze", ["x"], ["c"], axes=[-1, 0]),
    ]
    model = make_model(nodes, {"x": X}, ["a", "b", "c"], opset=12)
    after, _ = convert(model)
    assert [len(n.input) for n in after.graph.node] == [2, 2, 1, 2]


@pytest.mark.parametrize("op_type", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("axis", [None, 0, 1, 2, 3, -1, -2])
def test_softmax_12_axis_keeps_2d_meaning(op_type: str, axis: int | None) -> None:
    kwargs = {} if axis is None else {"axis": axis}
    model = make_model([oh.make_node(op_type, ["x"], ["y"], name="sm", **kwargs)], {"x": X4}, ["y"], opset=12)
    after, _ = convert(model, feeds={"x": X4})
    if axis in (3, -1):
        assert [n.op_type for n in after.graph.node] == [op_type]
    else:
        assert [n.op_type for n in after.graph.node] == ["Shape", "Flatten", op_type, "Reshape"]
        assert after.graph.node[-1].output[0] == "y"
        assert attrs(node_of(after.graph, op_type)) == {"axis": -1}
    assert node_of(after.graph, op_type).name == "sm"


def test_softmax_12_with_unknown_rank_and_inside_function() -> None:
    function = oh.make_function(
        "local", "F", ["a"], ["v"], [oh.make_node("LogSoftmax", ["a"], ["v"], axis=1)], [oh.make_opsetid("", 11)]
    )
    nodes = [
        oh.make_node("Relu", ["x"], ["r"]),
        oh.make_node("Softmax", ["r"], ["s"], axis=2),
        oh.make_node("F", ["s"], ["y"], domain="local"),
    ]
    model = make_model(nodes, {"x": X4}, ["y"], opset=11, functions=[function], domains={"local": 1}, infer=False)
    model.graph.output[0].CopyFrom(info("y", elem=1, shape=list(X4.shape)))
    after, _ = convert(model, feeds={"x": X4})
    assert [n.op_type for n in after.graph.node] == ["Relu", "Shape", "Flatten", "Softmax", "Reshape", "F"]
    function = after.functions[0]
    assert [n.op_type for n in function.node] == ["Shape", "Flatten", "LogSoftmax", "Reshape"]
    assert function.node[-1].output[0] == "v" == function.output[0]


def test_softmax_12_on_the_last_axis_known_only_by_inference_is_not_wrapped() -> None:
    # As in classifier heads: Softmax(axis=1) of a Gemm output the model leaves unshaped.
    w = np.random.default_rng(5).standard_normal((X.shape[-1], 3)).astype(np.float32)
    x2 = X.reshape(-1, X.shape[-1])
    nodes = [oh.make_node("Gemm", ["x", "w"], ["logits"]), oh.make_node("Softmax", ["logits"], ["y"], axis=1)]
    model = make_model(nodes, {"x": x2}, ["y"], opset=11, initializers={"w": w}, infer=False)
    model.graph.output[0].CopyFrom(info("y", elem=1, shape=[x2.shape[0], 3]))
    assert not model.graph.value_info  # the rank of 'logits' is not in the model
    after, _ = convert(model, feeds={"x": x2})
    assert [n.op_type for n in after.graph.node] == ["Gemm", "Softmax"]
    assert "logits" not in {v.name for v in after.graph.value_info}  # inference informed the plan only


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("scales", [[1, 1, 2, 3], [1, 1, 1.5, 2.5], [1, 1, 0.6, 0.5], [1, 1, 0.3, 1]])
def test_resize_10(mode: str, scales: list[float]) -> None:
    node = oh.make_node("Resize", ["x", "scales"], ["y"], mode=mode)
    model = make_model([node], {"x": X4}, ["y"], opset=10, initializers={"scales": np.array(scales, np.float32)})
    after, _ = convert(model, feeds={"x": X4})
    resize = after.graph.node[0]
    assert list(resize.input) == ["x", "", "scales"]
    assert attrs(resize)["coordinate_transformation_mode"] == b"asymmetric"


def test_resize_11_tf_half_pixel_for_nn_is_refused() -> None:
    mode = {"mode": "nearest", "coordinate_transformation_mode": "tf_half_pixel_for_nn"}
    node = oh.make_node("Resize", ["x", "roi", "scales"], ["y"], **mode)
    inits_ = {"roi": np.zeros(0, np.float32), "scales": np.array([1, 1, 2, 2], np.float32)}
    model = make_model([node], {"x": X4}, ["y"], opset=11, initializers=inits_)
    assert_refused(model, "tf_half_pixel_for_nn", "Resize-13")


def test_resize_10_nearest_with_mixed_or_dynamic_scales_is_refused() -> None:
    node = oh.make_node("Resize", ["x", "scales"], ["y"], mode="nearest")
    scales = {"scales": np.array([1, 1, 2, 0.6], np.float32)}
    mixed = make_model([node], {"x": X4}, ["y"], opset=10, initializers=scales)
    assert_refused(mixed, "above and below 1")
    dynamic = make_model([node], {"x": X4, "scales": np.ones(4, np.float32)}, ["y"], opset=10)
    assert_refused(dynamic, "unknown before run time")


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("source", [7, 9])
def test_upsample_becomes_resize(mode: str, source: int) -> None:
    scales = np.array([1, 1, 2, 1.5], np.float32)
    if source == 7:
        node = oh.make_node("Upsample", ["x"], ["y"], mode=mode, scales=scales.tolist())
        model = make_model([node], {"x": X4}, ["y"], opset=7)
    else:
        node = oh.make_node("Upsample", ["x", "scales"], ["y"], mode=mode)
        model = make_model([node], {"x": X4}, ["y"], opset=9, initializers={"scales": scales})
    after, _ = convert(model, feeds={"x": X4})
    assert [n.op_type for n in after.graph.node] == ["Resize"]


def test_dropout_7_mask() -> None:
    unused_mask = make_model([oh.make_node("Dropout", ["x"], ["y", "mask"], ratio=0.3)], {"x": X}, ["y"], opset=7)
    after, _ = convert(unused_mask)
    assert list(after.graph.node[0].output) == ["y"]
    assert inits(after.graph)[after.graph.node[0].input[1]].tolist() == np.float32(0.3)
    used_mask = make_model([oh.make_node("Dropout", ["x"], ["y", "mask"])], {"x": X}, ["y", "mask"], opset=7)
    assert_refused(used_mask, "mask", "bool")


def test_dropout_11_ratio_and_mask() -> None:
    """The ratio moves to an input; the mask output stays.

    Spec and onnxruntime disagree on the inference-mode mask of Dropout-10/11: the
    onnx reference gives all True (as for Dropout-12+), onnxruntime's Dropout-10
    kernel all False. The spec decides, so only Y is compared bit for bit.
    """
    node = oh.make_node("Dropout", ["x"], ["y", "mask"], ratio=0.2)
    model = make_model([node], {"x": X}, ["y", "mask"], opset=11)
    after, result, _ = upgrade(model)
    assert result.modified
    onnx.checker.check_model(after, full_check=True)
    node = after.graph.node[0]
    assert list(node.output) == ["y", "mask"] and attrs(node) == {}
    assert inits(after.graph)[node.input[1]].tolist() == np.float32(0.2)
    (y_before, mask_before), (y_after, mask_after) = ort_run(model, {"x": X}), ort_run(after, {"x": X})
    assert y_before.tobytes() == y_after.tobytes()
    spec_mask = ReferenceEvaluator(model).run(None, {"x": X})[1]
    assert spec_mask.all() and mask_after.all()
    assert not mask_before.any()  # onnxruntime's opset-11 mask, which the spec contradicts


def test_scatter_10_becomes_scatter_elements() -> None:
    feeds = {
        "x": np.zeros((3, 3), np.float32),
        "i": np.array([[1, 0, 2], [0, 2, 1]], np.int64),
        "u": np.array([[1, 1.1, 1.2], [2, 2.1, 2.2]], np.float32),
    }
    node = oh.make_node("Scatter", ["x", "i", "u"], ["y"], axis=0, name="sc")
    model = make_model([node], feeds, ["y"], opset=10)
    after, _ = convert(model, feeds=feeds)
    assert [(n.op_type, n.name) for n in after.graph.node] == [("ScatterElements", "sc")]


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic", None])
def test_gridsample_16_to_20(mode: str | None) -> None:
    grid = (RNG.random((2, 4, 4, 2)) * 2.2 - 1.1).astype(np.float32)
    kwargs = {} if mode is None else {"mode": mode}
    node = oh.make_node("GridSample", ["x", "grid"], ["y"], **kwargs)
    model = make_model([node], {"x": X4, "grid": grid}, ["y"], opset=16)
    after, _ = convert(model, 20, feeds={"x": X4, "grid": grid})
    expected = {"bilinear": b"linear", "bicubic": b"cubic", "nearest": b"nearest", None: None}[mode]
    assert attrs(after.graph.node[0]).get("mode") == expected


@pytest.mark.parametrize("axis", [None, 1, 2])
def test_dft_17_to_20(axis: int | None) -> None:
    signal = RNG.standard_normal((2, 8, 6, 1)).astype(np.float32)
    kwargs = {} if axis is None else {"axis": axis}
    model = make_model([oh.make_node("DFT", ["x"], ["y"], **kwargs)], {"x": signal}, ["y"], opset=17)
    after, _ = convert(model, 20, feeds={"x": signal})
    node = after.graph.node[0]
    assert attrs(node) == {} and inits(after.graph)[node.input[2]].tolist() == (axis or 1)


def test_groupnorm_18_float16_follows_the_spec() -> None:
    """GroupNormalization-18 computes in the input type (its function body); opset 21 says so
    with stash_type. onnxruntime computes opset 18 in float for float16, so its bits differ:
    the spec decides."""
    x = RNG.standard_normal((2, 6, 3, 3)).astype(np.float16)
    params = {"scale": RNG.random(3).astype(np.float16), "bias": RNG.random(3).astype(np.float16)}
    nodes = [oh.make_node("GroupNormalization", ["x", "scale", "bias"], ["y"], num_groups=3)]
    model = make_model(nodes, {"x": x}, ["y"], opset=18, initializers=params, check=False)
    after, result, _ = upgrade(model, 21)
    assert result.modified
    onnx.checker.check_model(after, full_check=True)
    assert attrs(node_of(after.graph, "GroupNormalization"))["stash_type"] == onnx.TensorProto.FLOAT16
    expected, actual = ort_run(model, {"x": x})[0], ort_run(after, {"x": x})[0]
    np.testing.assert_allclose(actual.astype(np.float32), expected.astype(np.float32), atol=4e-3)


@pytest.mark.parametrize("static_channels", [True, False])
def test_groupnorm_18_to_21(static_channels: bool) -> None:
    x = RNG.standard_normal((2, 6, 3, 3)).astype(np.float32)
    params = {"scale": RNG.random(3).astype(np.float32), "bias": RNG.random(3).astype(np.float32)}
    nodes = [oh.make_node("GroupNormalization", ["x", "scale", "bias"], ["y"], num_groups=3, epsilon=1e-3)]
    # onnx deprecated GroupNormalization-18 (so the checker refuses the source model), but
    # exporters emitted it and onnxruntime runs it.
    model = make_model(nodes, {"x": x}, ["y"], opset=18, initializers=params, check=False)
    if not static_channels:
        model.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "C"
    after, upgrade_pass = convert(model, 21, feeds={"x": x})
    expected = ["Reshape", "Expand", "Reshape"] * 2 + ["GroupNormalization"]
    if not static_channels:
        expected = ["Shape", "Div", "Concat"] + expected
    assert [n.op_type for n in after.graph.node] == expected


def _softmax_11(op_type: str, axis: int, *, branch: bool) -> onnx.ModelProto:
    """``op_type``-11 over a non-last ``axis`` of a rank-3 input of dynamic dims (in an If branch if ``branch``)."""
    x = oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["a", "b", "c"])
    y = oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["a", "b", "c"])
    nodes = [oh.make_node(op_type, ["x"], ["y"], name="sm", axis=axis)]
    inputs = [x]
    if branch:
        then = oh.make_graph(nodes, "then", [], [y])
        other = oh.make_graph([oh.make_node("Identity", ["x"], ["y"])], "else", [], [y])
        nodes = [oh.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other)]
        inputs = [oh.make_tensor_value_info("cond", onnx.TensorProto.BOOL, []), x]
    graph = oh.make_graph(nodes, "g", inputs, [y])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 11)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.mark.parametrize("branch", [False, True], ids=["main", "if_branch"])
@pytest.mark.parametrize("op_type", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("axis", [0, 1, -2])
@pytest.mark.parametrize("dims", [(2, 0, 3), (0, 3, 4), (2, 3, 0), (2, 3, 4)], ids=lambda d: "x".join(map(str, d)))
def test_softmax_11_over_a_non_last_axis_runs_with_a_zero_sized_dim(op_type, axis, dims, branch) -> None:
    """``Reshape(..., Shape(x))`` without ``allowzero`` reads a 0 in Shape(x) as "copy the 2-D input's dim":
    [2, 0, 3] at axis 1 failed in onnxruntime where the original runs. With ``allowzero=1`` it is that dim."""
    model = _softmax_11(op_type, axis, branch=branch)
    after, _, _ = upgrade(model)
    graph = after.graph
    if branch:
        graph = next(a.g for a in node_of(after.graph, "If").attribute if a.name == "then_branch")
    reshapes = [n for n in graph.node if n.op_type == "Reshape"]
    assert [attrs(n) for n in reshapes] == [{"allowzero": 1}]
    feeds = {"x": RNG.standard_normal(dims).astype(np.float32)}
    if branch:
        feeds["cond"] = np.array(True)
    assert_identical(model, after, feeds)


# --- targets below 18 --------------------------------------------------------------------------


@pytest.mark.parametrize("target", [13, 14])
def test_softmax_12_wrapping_below_14_needs_positive_static_dims(target: int) -> None:
    """Reshape-13 has no allowzero (a 0 in the shape copies a dim): the wrapping is written at 13 only
    where no dim can be 0, and refused (naming the opset that can) where one might be."""
    model = make_model([oh.make_node("Softmax", ["x"], ["y"], axis=1)], {"x": X4}, ["y"], opset=12)
    after, _ = convert(model, target, feeds={"x": X4})
    assert [n.op_type for n in after.graph.node] == ["Shape", "Flatten", "Softmax", "Reshape"]
    assert attrs(after.graph.node[-1]) == ({} if target < 14 else {"allowzero": 1})
    dynamic = copy.deepcopy(model)
    dynamic.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    if target < 14:
        assert_refused(dynamic, "Softmax", "allowzero (opset 14)", "--target-opset 14", target=target)
    else:
        empty = np.zeros((0, 3, 5, 6), np.float32)
        after, _ = convert(dynamic, target, feeds={"x": empty})
        assert_identical(dynamic, after, {"x": X4})


@pytest.mark.parametrize("target", [13, 14, 15])
def test_clip_10_with_unknown_input_type_needs_castlike_from_15(target: int) -> None:
    nodes = [oh.make_node("Relu", ["x"], ["r"]), oh.make_node("Clip", ["r"], ["y"], min=0.5)]
    model = make_model(nodes, {"x": X}, ["y"], opset=10, infer=False)
    model.graph.output[0].CopyFrom(info("y", elem=1, shape=list(X.shape)))
    if target < 15:
        assert_refused(model, "Clip", "CastLike (opset 15)", "--target-opset 15", target=target)
    else:
        after, _ = convert(model, target)
        assert [n.op_type for n in after.graph.node] == ["Relu", "CastLike", "Clip"]


@pytest.mark.parametrize("target", [11, 13, 15, 17])
def test_lower_targets_of_mixed_forms_and_subgraphs(target: int) -> None:
    """Opset-9 nodes in the main graph, an If branch and a function reach each target, bit for bit."""
    branch = oh.make_graph(
        [oh.make_node("ReduceMax", ["x"], ["bm"], axes=[2]), oh.make_node("Unsqueeze", ["bm"], ["bo"], axes=[0])],
        "then", [], [info("bo", elem=1, shape=None)],
    )
    other = oh.make_graph(
        [oh.make_node("ReduceMin", ["x"], ["om"], axes=[2]), oh.make_node("Unsqueeze", ["om"], ["oo"], axes=[0])],
        "else", [], [info("oo", elem=1, shape=None)],
    )
    function = oh.make_function(
        "local", "F", ["a"], ["v"],
        [oh.make_node("Slice", ["a"], ["sl"], starts=[0], ends=[2], axes=[2]),
         oh.make_node("ReduceSum", ["sl"], ["v"], axes=[1])],
        [oh.make_opsetid("", 9)],
    )  # fmt: skip
    nodes = [
        oh.make_node("ReduceSum", ["x"], ["rs"], axes=[0], keepdims=0),
        oh.make_node("Greater", ["rs", "zero"], ["g"]),
        oh.make_node("Constant", [], ["cond"], value=oh.make_tensor("c", onnx.TensorProto.BOOL, [], [True])),
        oh.make_node("If", ["cond"], ["iy"], then_branch=branch, else_branch=other),
        oh.make_node("F", ["x"], ["fy"], domain="local"),
        oh.make_node("Pad", ["x"], ["pd"], pads=[0, 0, 1, 0, 0, 1], value=-2.5),
    ]
    model = make_model(nodes, {"x": X}, ["rs", "g", "iy", "fy", "pd"], opset=9, functions=[function],
                       domains={"local": 1}, initializers={"zero": np.zeros((1,), np.float32)})  # fmt: skip
    after, upgrade_pass = convert(model, target)
    assert opset(after.functions[0]) == target
    assert upgrade_pass.stats["source_opsets"] == [9]
    reduces = [n for n in after.graph.node if n.op_type == "ReduceSum"]
    reduces += [n for n in after.functions[0].node if n.op_type == "ReduceSum"]
    if_node = node_of(after.graph, "If")
    reduces += [n for g in if_node.attribute for n in g.g.node if n.op_type.startswith("Reduce")]
    for node in reduces:  # ReduceSum takes axes as an input from 13, the others from 18
        as_input = target >= (13 if node.op_type == "ReduceSum" else 18)
        assert ("axes" in attrs(node)) != as_input


def test_a_lower_target_than_the_model_is_refused_and_18_stays_the_default() -> None:
    model = make_model([oh.make_node("ReduceMean", ["x"], ["y"], axes=[1])], {"x": X}, ["y"], opset=13)
    with pytest.raises(InputError, match="--target-opset 11 is lower than the model's opset 13"):
        UpgradeOpsetPass(11)(ir.from_proto(copy.deepcopy(model)))
    after, _, _ = upgrade(model, target=None)
    assert opset(after) == 18
