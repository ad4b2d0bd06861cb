"""The range probe's magnitudes (``--precision``'s range islands) fetch scalars, not the values.

:func:`passes.verify.values.magnitudes` runs a copy of the original whose outputs are each
float32 value's max, min and sum, once per set; the values holding a NaN or an infinity on some
set are measured again in the graph (their largest finite magnitude). Compared here with the
child fetching every value whole (the way it measured before) over the same sets — the chosen
inputs, larger sizes, edge values, NaN and infinities, 0-sized dims — on values that are finite,
huge, hold -inf (a mask), NaN (Sqrt of negatives), overflow to inf, or are empty; before opset
9 (no ``Where``) the non-finite ones are fetched whole.
"""

from __future__ import annotations

import shutil
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from passes.verify import locate, values
from passes.verify.check import Checker

F32 = TensorProto.FLOAT


def _model(opset: int) -> onnx.ModelProto:
    mask = np.zeros(4, np.float32)
    mask[1] = -np.inf
    nodes = [
        helper.make_node("Mul", ["x", "k"], ["big"]),  # up to ~4e30, finite
        helper.make_node("Add", ["x", "mask"], ["masked"]),  # -inf in one column
        helper.make_node("Sqrt", ["x"], ["root"]),  # NaN where x < 0
        helper.make_node("Mul", ["big", "k"], ["over"]),  # overflows to +-inf
        helper.make_node("Relu", ["masked"], ["relu"]),
        helper.make_node("Flatten", ["x"], ["flat"], axis=0),
        helper.make_node("Slice" if opset >= 10 else "Identity", ["flat", "zero", "zero", "one"][: 4 if opset >= 10 else 1],
                         ["empty"]),  # fmt: skip
        helper.make_node("Add", ["relu", "root"], ["y"]),
    ]
    inits = [numpy_helper.from_array(np.array([1e30], np.float32), "k"), numpy_helper.from_array(mask, "mask"),
             numpy_helper.from_array(np.array([0], np.int64), "zero"),
             numpy_helper.from_array(np.array([1], np.int64), "one")]  # fmt: skip
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F32, ["n", 4])],
                              [helper.make_tensor_value_info("y", F32, ["n", 4]),
                               helper.make_tensor_value_info("over", F32, ["n", 4]),
                               helper.make_tensor_value_info("empty", F32, None)], inits)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 7
    return model


def _whole(checker: Checker, names: list[str]) -> dict[str, float]:
    """Every value fetched whole by the child over the checker's sets (the former way)."""
    original = onnx.load(str(checker.original_path))
    types = locate.tensor_types(original)
    copy = locate.augmented(original, checker.original_path, names, types, checker.folder / "whole")
    try:
        answer = checker.worker.request({"op": "magnitudes", "model": str(copy), "names": names}, time.monotonic() + 60)
    finally:
        shutil.rmtree(copy.parent, ignore_errors=True)
    assert answer["ok"], answer
    return answer["values"]


@pytest.mark.parametrize("opset", [8, 13, 18])
def test_scalars_give_what_the_whole_values_give(opset: int) -> None:
    model = _model(opset)
    with Checker(model) as checker:
        result = checker.check(model)
        assert result.checked, result.summary()
        ran = [s["name"] for s in result.inputs.sets if s.get("ran")]
        assert {"larger", "edge", "edge-nonfinite", "zero-dims"} <= set(ran), result.inputs.sets
        found = checker.magnitudes()
        names = ["big", "masked", "root", "over", "relu", "flat", "empty", "y"]
        expected = _whole(checker, names)
    assert found == expected
    assert {"big", "masked", "root", "relu", "y"} <= set(found)  # finite values beside the -inf and NaN
    assert found["big"] > 1e30 and found["masked"] == found["flat"]


def test_the_copy_fetches_scalars_and_measures_after_each_node() -> None:
    model = _model(18)
    proto, triples = values.reductions(model, ["big", "masked"])
    outputs = {o.name for o in proto.graph.output}
    assert outputs == {o for triple in triples.values() for o in triple} and len(outputs) == 6
    order = [n.op_type for n in proto.graph.node]
    assert order[:4] == ["Mul", "ReduceMax", "ReduceMin", "ReduceSum"]  # right after the value's node
    masked, maxima = values.finite_maxima(model, ["masked"])
    assert list(maxima) == ["masked"] and [o.name for o in masked.graph.output] == [maxima["masked"]]
    assert values.finite_maxima(_model(8), ["masked"]) is None  # no Where before opset 9


def test_a_sum_that_overflows_is_measured_again_only_where_its_max_does_not_decide(
        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """``huge`` and ``y`` (every element near 3e38, finite: a mask's fill value) have sums that
    overflow; with ``above`` their max or min, an element's value above the limit, decides without
    the second run, which measures only ``masked`` (its largest finite magnitude, x's, is below the
    limit: its -inf is what makes the sum infinite). The magnitudes are those of the values
    fetched whole either way."""
    mask = np.zeros(4, np.float32)
    mask[1] = -np.inf
    nodes = [helper.make_node("Abs", ["x"], ["a"]), helper.make_node("Mul", ["a", "k"], ["spread"]),
             helper.make_node("Add", ["spread", "fill"], ["huge"]), helper.make_node("Add", ["x", "mask"], ["masked"]),
             helper.make_node("Relu", ["masked"], ["relu"]), helper.make_node("Sub", ["relu", "huge"], ["y"])]
    inits = [numpy_helper.from_array(np.array(1e36, np.float32), "k"), numpy_helper.from_array(mask, "mask"),
             numpy_helper.from_array(np.array(3e38, np.float32), "fill")]  # fmt: skip
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F32, ["n", 4])],
                              [helper.make_tensor_value_info("y", F32, ["n", 4])], inits)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    measured: list[list[str]] = []
    finite_maxima = values.finite_maxima
    monkeypatch.setattr(values, "finite_maxima", lambda original, names: measured.append(list(names)) or
                        finite_maxima(original, names))  # fmt: skip
    with Checker(model, precision="float16", rounding=True) as checker:
        checker.start()
        plain = checker.magnitudes()
        decided = checker.magnitudes(above=4096.0)
        expected = _whole(checker, ["a", "spread", "huge", "masked", "relu", "y"])
    assert measured == [["huge", "masked", "y"], ["masked"]]
    assert plain == expected and decided == expected
    assert expected["huge"] >= 3e38
