"""CSE's sweep: a node alone in reading its first input gets no key, and still merges when a merge
earlier in the same sweep gives that input a second user (the cascade of a duplicated chain)."""

from __future__ import annotations

import collections

import numpy as np
import onnx_ir as ir
from onnx import TensorProto, helper

from helpers import ort_run
from passes.simplify import cse


def _model(order: list[str]) -> ir.Model:
    nodes = {
        "a1": helper.make_node("Relu", ["x"], ["a1"], name="a1"),
        "b1": helper.make_node("Neg", ["a1"], ["b1"], name="b1"),
        "a2": helper.make_node("Relu", ["x"], ["a2"], name="a2"),
        "b2": helper.make_node("Neg", ["a2"], ["b2"], name="b2"),
        "c1": helper.make_node("Abs", ["b1"], ["c1"], name="c1"),
        "c2": helper.make_node("Abs", ["b2"], ["c2"], name="c2"),
    }
    graph = helper.make_graph(
        [nodes[n] for n in order] + [helper.make_node("Sub", ["c1", "c2"], ["y"], name="sub")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
    )  # fmt: skip
    return ir.serde.deserialize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))


def test_a_duplicated_chain_merges_in_one_sweep_whatever_the_order() -> None:
    for order in (["a1", "b1", "c1", "a2", "b2", "c2"], ["a1", "a2", "b1", "b2", "c1", "c2"],
                  ["a2", "b2", "a1", "c2", "b1", "c1"]):  # fmt: skip
        model = _model(order)
        applied: collections.Counter[str] = collections.Counter()
        assert cse.eliminate(model, applied)
        assert applied["cse/merged"] == 3, order
        kept = [n.name for n in model.graph]
        first = [n for n in order if n in kept]
        assert sorted(n[0] for n in first) == ["a", "b", "c"]
        for name in first:  # the first of each pair in the list is the one kept
            twin = name[0] + ("2" if name[1] == "1" else "1")
            assert order.index(name) < order.index(twin)
        sub = next(n for n in model.graph if n.op_type == "Sub")
        assert sub.inputs[0] is sub.inputs[1]
        x = np.array([-1.5, 0.0, 2.0], dtype=np.float32)
        (y,) = ort_run(ir.serde.serialize_model(model), {"x": x})
        np.testing.assert_array_equal(y, np.zeros(3, dtype=np.float32))


def test_nodes_alone_on_their_inputs_are_left() -> None:
    model = _model(["a1", "b1", "c1", "a2", "b2", "c2"])
    relu = [n for n in model.graph if n.name == "a2"][0]
    relu.op_type = "Sigmoid"  # a2 no longer a twin of a1: nothing below it merges either
    applied: collections.Counter[str] = collections.Counter()
    assert not cse.eliminate(model, applied)
    assert len(list(model.graph)) == 7 and not applied
