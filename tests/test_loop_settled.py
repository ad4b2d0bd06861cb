"""Work not repeated where nothing changed: the pass loop skips a repeating pass settled with no
change since its last run, simplify's CSE sweeps only where a change can bring a merge, and the
inference's reading of the inferred copy gives what ``ir.serde`` reads."""

from __future__ import annotations

import collections

import hypothesis.strategies as st
import numpy as np
import onnx
import onnx.helper as oh
import onnx_ir as ir
from hypothesis import given

from helpers import ort_run
from passes import loop
from passes.ir import inference
from passes.simplify import SimplifyPass, cse


class _Probe(ir.passes.InPlacePass):
    """Adds an Identity to the graph in its first ``changes`` calls; counts its calls."""

    def __init__(self, changes: int, settled: bool = False) -> None:
        super().__init__()
        self.changes, self.calls = changes, 0
        if settled:
            self.settled = True

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        self.calls += 1
        if self.calls > self.changes:
            return ir.passes.PassResult(model, modified=False)
        last = model.graph.outputs[0]
        node = ir.node("Identity", [last], outputs=[ir.val(f"{last.name}_{self.calls}", last.dtype, last.shape)])
        model.graph.append(node)
        model.graph.outputs[0] = node.outputs[0]
        return ir.passes.PassResult(model, modified=True)


def _model() -> ir.Model:
    x = ir.val("x", ir.DataType.FLOAT, ir.Shape([2]))
    y = ir.val("y", ir.DataType.FLOAT, ir.Shape([2]))
    graph = ir.Graph([x], [y], nodes=[ir.node("Relu", [x], outputs=[y])], opset_imports={"": 18})
    return ir.Model(graph, ir_version=10)


def _run(*passes: _Probe) -> tuple[ir.Model, list]:
    record = loop.Record()
    model = _model()
    loop.run(loop.build([(f"p{i}", p, True) for i, p in enumerate(passes)], record), model)
    return model, record.runs


def test_a_pass_that_changed_nothing_is_not_rerun_until_another_changes_the_graph() -> None:
    changer, watcher = _Probe(changes=2), _Probe(changes=0)
    model, runs = _run(changer, watcher)
    # Round 1 and 2: the changer changes, so the watcher runs after it; round 3: the changer finds
    # nothing and the watcher, unchanged since its round-2 run that changed nothing, is skipped.
    assert (changer.calls, watcher.calls) == (3, 2)
    assert len(model.graph) == 3  # Relu and the two Identities: the skip changed nothing of the result
    assert [r.stats.get("rounds", 1) for r in runs] == [3, 2]


def test_a_pass_that_says_it_settled_is_not_rerun_after_its_own_change() -> None:
    settler, watcher = _Probe(changes=1, settled=True), _Probe(changes=0)
    _run(settler, watcher)
    assert (settler.calls, watcher.calls) == (1, 1)  # round 2 would have run both for nothing


def test_a_pass_that_changed_and_did_not_settle_runs_again() -> None:
    changer, other = _Probe(changes=1), _Probe(changes=1)
    _run(changer, other)
    # Round 1: both change; round 2: both run (each changed, neither said it settled) and change nothing.
    assert (changer.calls, other.calls) == (2, 2)


def test_each_run_of_a_manager_runs_every_pass_once_at_least() -> None:
    watcher = _Probe(changes=0)
    manager = loop.build([("a", _Probe(changes=0), True), ("w", watcher, True)], loop.Record())
    loop.run(manager, _model())
    loop.run(manager, _model())  # another model
    assert watcher.calls == 2
    model = _model()
    manager(model)
    model.graph.node(0).op_type = "Neg"  # the caller changes the model between two runs
    manager(model)
    assert watcher.calls == 4


def _duplicated_chain() -> onnx.ModelProto:
    """Two equal Exp(x) branches (CSE merges them, then their equal users), a Constant to lift."""
    nodes = [
        oh.make_node("Exp", ["x"], ["a1"]), oh.make_node("Exp", ["x"], ["a2"]),
        oh.make_node("Constant", [], ["k"], value=onnx.numpy_helper.from_array(np.float32(-0.0))),
        oh.make_node("Sub", ["a1", "k"], ["b1"]), oh.make_node("Sub", ["a2", "k"], ["b2"]),
        oh.make_node("Mul", ["b1", "b2"], ["y"]),
    ]  # fmt: skip
    graph = oh.make_graph(nodes, "g", [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4])],
                          [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4])])  # fmt: skip
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=10)


def _counted_sweeps(monkeypatch) -> list[bool]:
    sweeps: list[bool] = []
    real = cse.eliminate

    def counted(model: ir.Model, applied: collections.Counter[str]) -> bool:
        sweeps.append(real(model, applied))
        return sweeps[-1]

    monkeypatch.setattr(cse, "eliminate", counted)
    return sweeps


def test_no_cse_sweep_where_only_dead_nodes_went_since_one_that_merged_nothing(monkeypatch) -> None:
    sweeps = _counted_sweeps(monkeypatch)
    proto = _duplicated_chain()
    del proto.graph.node[1]  # one Exp: nothing to merge
    proto.graph.node[3].input[0] = "x"
    model = ir.serde.deserialize_model(proto)
    simplify = SimplifyPass()
    simplify(model)
    # Round 1 lifts the Constant (a change) and sweeps: nothing to merge. Round 2 changes nothing,
    # and only the lifted Constant went since that sweep: no second sweep (it would find nothing).
    assert sweeps == [False]
    assert simplify.stats["applied"] == {"constants/constant_to_initializer": 1} and simplify.stats["rounds"] == 2
    assert [n.op_type for n in model.graph] == ["Exp", "Sub", "Sub", "Mul"]
    x = np.array([0.5, -np.inf, np.nan, -0.0], dtype=np.float32)
    np.testing.assert_array_equal(ort_run(ir.serde.serialize_model(model), {"x": x})[0],
                                  ort_run(proto, {"x": x})[0])  # fmt: skip


def test_cse_sweeps_again_after_a_merge_and_at_every_call(monkeypatch) -> None:
    sweeps = _counted_sweeps(monkeypatch)
    proto = _duplicated_chain()
    model = ir.serde.deserialize_model(proto)
    simplify = SimplifyPass()
    simplify(model)
    # Round 1 lifts the Constant and merges both pairs in one sweep (users after their producers);
    # round 2 changes nothing and, the last sweep having merged, sweeps once more: nothing.
    assert sweeps == [True, False]
    assert simplify.stats["applied"]["cse/merged"] == 2 and simplify.settled
    assert [n.op_type for n in model.graph] == ["Exp", "Sub", "Mul"]
    out = ir.serde.serialize_model(model)
    x = np.array([0.5, -np.inf, np.nan, -0.0], dtype=np.float32)
    np.testing.assert_array_equal(ort_run(out, {"x": x})[0], ort_run(proto, {"x": x})[0])
    sweeps.clear()
    simplify(model)  # a graph it settled: one sweep that merges nothing, then the call ends
    assert sweeps == [False] and not simplify.stats["applied"]


_DIMS = st.lists(st.tuples(st.one_of(st.integers(0, 2**40), st.sampled_from(["n", "batch", ""]), st.none()),
                           st.sampled_from([None, "DATA_BATCH", ""])), max_size=4)  # fmt: skip


@given(elem=st.sampled_from([0, 1, 7, 16]), dims=st.one_of(st.none(), _DIMS))
def test_the_inferred_types_read_as_ir_serde_reads_them(elem: int, dims) -> None:
    type_proto = onnx.TypeProto()
    tensor_type = type_proto.tensor_type
    tensor_type.elem_type = elem
    if dims is not None:
        tensor_type.shape.SetInParent()
        for value, denotation in dims:
            dim = tensor_type.shape.dim.add()
            if isinstance(value, int):
                dim.dim_value = value
            elif isinstance(value, str):
                dim.dim_param = value
            if denotation is not None:
                dim.denotation = denotation
    read = inference.tensor_type(type_proto)
    assert read is not None
    dtype, shape = read
    assert dtype == (ir.DataType(elem) if elem else None)
    expected = ir.serde.deserialize_type_proto_for_shape(type_proto)
    if expected is None:
        assert shape is None
    else:
        made = ir.Shape(shape[0], denotations=shape[1], frozen=True)
        assert made == expected and made.frozen
        assert [type(d) for d in made] == [type(d) for d in expected]
        assert [made.get_denotation(i) for i in range(len(made))] == [
            expected.get_denotation(i) for i in range(len(expected))]


def test_cse_sweeps_again_where_the_dead_node_removal_changed_a_node_that_stays(monkeypatch) -> None:
    """Two equal Clips, one with an absent ``max`` at its end: they differ until the removal of dead
    values leaves that input out, and the next round's sweep merges them."""
    sweeps = _counted_sweeps(monkeypatch)
    nodes = [
        oh.make_node("Constant", [], ["k"], value=onnx.numpy_helper.from_array(np.float32(2.0))),
        oh.make_node("Clip", ["x", "lo", ""], ["a"]),
        oh.make_node("Clip", ["x", "lo"], ["b"]),
        oh.make_node("Add", ["a", "b"], ["s"]), oh.make_node("Mul", ["s", "k"], ["y"]),
    ]  # fmt: skip
    graph = oh.make_graph(nodes, "g", [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 1, 4]),
                                       oh.make_tensor_value_info("lo", onnx.TensorProto.FLOAT, [])],
                          [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 1, 4])])  # fmt: skip
    proto = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=10)
    model = ir.serde.deserialize_model(proto)
    SimplifyPass()(model)
    assert sweeps == [False, True, False]
    assert [n.op_type for n in model.graph] == ["Clip", "Add", "Mul"]
    x = np.array([[[1.0, -0.0, np.nan, -np.inf]]], dtype=np.float32)
    feeds = {"x": x, "lo": np.array(-1.0, np.float32)}
    assert ort_run(ir.serde.serialize_model(model), feeds)[0].tobytes() == ort_run(proto, feeds)[0].tobytes()


def test_counts_a_later_run_takes_back_are_not_reported_as_zero() -> None:
    """simplify reports fusable patterns as the change since its previous run: one found in the
    first run and gone by the last sums to 0 and is left out (no ``Attention@23 x0``), with its
    table when nothing is left in it; top-level counts stay, zero or not."""
    from passes import loop

    first = {"fusable_at_higher_opset": {"Attention@23": 2, "Gelu@20": 1}, "fused": 0, "declined": {"x": 1}}
    second = {"fusable_at_higher_opset": {"Attention@23": -2}, "fused": 0, "declined": {}}
    total = loop._add_stats(first, second)  # noqa: SLF001 (the summation under test)
    assert total == {"fusable_at_higher_opset": {"Gelu@20": 1}, "fused": 0, "declined": {"x": 1}}
    third = {"fusable_at_higher_opset": {"Gelu@20": -1}, "fused": 0}
    assert loop._add_stats(total, third) == {"fused": 0, "declined": {"x": 1}}  # noqa: SLF001
    assert loop._add_stats({"declined": {}}, {"declined": {}}) == {"declined": {}}  # noqa: SLF001
