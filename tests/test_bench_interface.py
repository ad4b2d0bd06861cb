"""The simplification benchmark's check of the graph inputs a tool's output keeps.

``bench_simplify.interface_change`` decides whether another tool's output counts
as right: dropping an initializer-backed input of an IR >= 4 model (below IR 4
they are constants in onnxruntime, so dropping them is right), reordering inputs or narrowing a symbolic dim (onnxslim's trap in the
simplify issue) must be reported; renaming a symbol, widening a dim or keeping
everything must not.
"""

from __future__ import annotations

import pathlib
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks"))
import bench_simplify  # noqa: E402


def _graph(inputs: list[tuple[str, int, list | None]], initializers: tuple[str, ...] = ()):
    values = [helper.make_tensor_value_info(name, dtype, shape) for name, dtype, shape in inputs]
    inits = [numpy_helper.from_array(np.ones(3, np.float32), name) for name in initializers]
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    node = helper.make_node("Identity", [inputs[0][0]], ["y"])
    return helper.make_graph([node], "g", values, [out], inits)


ORIGINAL = _graph([("x", TensorProto.FLOAT, ["n", 3]), ("w", TensorProto.FLOAT, [3])], initializers=("w",))


@pytest.mark.parametrize(("inputs", "expected"), [
    ([("x", TensorProto.FLOAT, ["n", 3]), ("w", TensorProto.FLOAT, [3])], ""),
    ([("x", TensorProto.FLOAT, ["batch", 3]), ("w", TensorProto.FLOAT, [3])], ""),  # a symbol renamed
    ([("x", TensorProto.FLOAT, ["n", None]), ("w", TensorProto.FLOAT, None)], ""),  # widened
    ([("x", TensorProto.FLOAT, ["n", 3])], "drops 1 of the 2 inputs (e.g. 'w')"),
    ([("w", TensorProto.FLOAT, [3]), ("x", TensorProto.FLOAT, ["n", 3])], "reorders the inputs"),
    ([("x", TensorProto.FLOAT, [2, 3]), ("w", TensorProto.FLOAT, [3])], "narrows dim 0 of input 'x' from n to 2"),
    ([("x", TensorProto.FLOAT, ["n", 4]), ("w", TensorProto.FLOAT, [3])], "changes dim 1 of input 'x'"),
    ([("x", TensorProto.FLOAT, ["n"]), ("w", TensorProto.FLOAT, [3])], "changes the rank of input 'x'"),
    ([("x", TensorProto.DOUBLE, ["n", 3]), ("w", TensorProto.FLOAT, [3])], "changes the type of input 'x'"),
])
def test_interface_change(inputs, expected) -> None:
    found = bench_simplify.interface_change(ORIGINAL, _graph(inputs))
    assert found.startswith(expected) and bool(found) == bool(expected), found


def test_below_ir_4_initializer_backed_inputs_are_constants_not_inputs() -> None:
    """onnxruntime runs an IR 3 model's initializers as constants: dropping them changes nothing callers see;
    dropping or reordering a real input still does."""
    original = _graph([("w", TensorProto.FLOAT, [3]), ("x", TensorProto.FLOAT, ["n", 3])], initializers=("w",))
    assert bench_simplify.interface_change(original, _graph([("x", TensorProto.FLOAT, ["n", 3])]), 3) == ""
    assert bench_simplify.interface_change(original, _graph([("x", TensorProto.FLOAT, ["n", 3])])).startswith(
        "drops 1 of the 2 inputs (e.g. 'w')")  # from IR 4 it is an input callers may feed
    assert bench_simplify.interface_change(original, _graph([("x", TensorProto.FLOAT, [2, 3])]), 3).startswith(
        "narrows dim 0 of input 'x'")


def test_an_input_without_a_shape_must_stay_without_one() -> None:
    original = _graph([("x", TensorProto.FLOAT, None)])
    assert bench_simplify.interface_change(original, _graph([("x", TensorProto.FLOAT, ["n"])])).startswith(
        "gives input 'x' a rank")
    assert bench_simplify.interface_change(original, _graph([("x", TensorProto.FLOAT, None)])) == ""


def test_a_cell_with_changed_inputs_is_wrong_and_not_best() -> None:
    cell = bench_simplify.Cell("m", "tool", nodes=5, valid=True, equal=True, interface="drops 1 of the 2 inputs")
    assert cell.wrong and not cell.good and cell.text() == "5 (inputs changed)"
