"""The original's own noise is not a pass's fault.

``RandomNormalLike`` without a seed: two runs of one onnxruntime session differ (a new session
repeats the first draws). An output it feeds, where the two models differ, is run again in the
original: it disagrees with itself, so it is not compared (``not_compared``, a note), never a
failure, never located; a deterministic second output is still compared, and a difference
there still fails the check and is located.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import passes
from helpers import ort_session
from passes.verify import verdict
from passes.verify.result import OutputComparison


def _noisy(second: str = "Relu", doubled: bool = False) -> onnx.ModelProto:
    """y1 = x + RandomNormalLike(x), y2 = second(x). ``doubled``: the random values are the second half
    of a draw twice as large (another sequence of draws: where the two models differ)."""
    if doubled:
        draw = [helper.make_node("Concat", ["x", "x"], ["xx"], axis=0),
                helper.make_node("RandomNormalLike", ["xx"], ["rr"]), helper.make_node("Shape", ["x"], ["s"]),
                helper.make_node("Gather", ["s", "zero"], ["b"], axis=0),
                helper.make_node("Slice", ["rr", "b", "big", "zero"], ["r"])]  # fmt: skip
        inits = [numpy_helper.from_array(np.array([0], np.int64), "zero"),
                 numpy_helper.from_array(np.array([1 << 40], np.int64), "big")]  # fmt: skip
    else:
        draw, inits = [helper.make_node("RandomNormalLike", ["x"], ["r"])], []
    graph = helper.make_graph(
        [*draw, helper.make_node("Add", ["x", "r"], ["y1"]), helper.make_node(second, ["x"], ["y2"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y1", TensorProto.FLOAT, ["batch", 4]),
         helper.make_tensor_value_info("y2", TensorProto.FLOAT, ["batch", 4])], inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_two_runs_of_one_session_differ() -> None:
    """The premise: y1 changes from run to run, y2 does not."""
    session = ort_session(_noisy())
    x = np.ones((2, 4), np.float32)
    (a1, a2), (b1, b2) = session.run(None, {"x": x}), session.run(None, {"x": x})
    assert not np.array_equal(a1, b1) and np.array_equal(a2, b2)


def test_a_noisy_output_is_not_compared_and_the_check_passes() -> None:
    result = passes.check(_noisy(), _noisy(doubled=True))
    assert result.checked and result.ok, result.summary()
    assert result.not_compared and {e["output"] for e in result.not_compared} == {"y1"}
    assert all("differs between two runs" in e["reason"] for e in result.not_compared)
    assert "normal" in {e["set"] for e in result.not_compared}
    by_name = {o.name: o for o in result.outputs}
    assert by_name["y1"].message.startswith("not compared") and by_name["y2"].message == ""
    assert any(n.startswith("output 'y1' not compared on the seeded standard-normal inputs") for n in result.notes)
    data = result.to_json()
    assert data["ok"] is True and data["not_compared"] == result.not_compared


def test_the_deterministic_output_is_still_compared() -> None:
    """y2 wrong (Abs for Relu): the check fails on y2 only, and the locator names y2's node, not y1's."""
    result = passes.check(_noisy(), _noisy("Abs", doubled=True))
    assert result.checked and not result.ok
    assert [o.name for o in result.failures] == ["y2"], result.summary()
    assert {e["output"] for e in result.not_compared} == {"y1"}
    assert result.first_difference is not None and result.first_difference.output == "y2", result.summary()


def test_no_second_run_where_the_models_agree() -> None:
    """Same model, same draws in both sessions: nothing differs, nothing is run again or left out."""
    result = passes.check(_noisy(), _noisy())
    assert result.ok and result.not_compared == [] and result.notes == []


def test_a_set_the_original_does_not_run_again_is_not_compared() -> None:
    """When onnxruntime fails (or aborts) running the original again, that set's differing outputs are
    not compared, with the reason; the other outputs and sets keep their verdicts."""
    outputs = [OutputComparison("y1", False, message="differs"), OutputComparison("y2", True)]
    sets = [{"name": "edge", "ok": False, "outputs": [{"name": "y1", "ok": False}, {"name": "y2", "ok": False}]}]
    noise = {None: {"error": "the check's process crashed (SIGABRT)", "names": ["y1"]},
             "edge": {"noisy": {"y1": 0.5}}}  # fmt: skip
    not_compared, notes = verdict.drop_noise(outputs, sets, noise, {"edge": "edge-value"})
    assert outputs[0].ok and outputs[0].message.startswith("not compared: onnxruntime fails")
    assert [o["name"] for o in sets[0]["outputs"]] == ["y2"] and sets[0]["ok"] is False
    assert [(e["output"], e["set"]) for e in not_compared] == [("y1", "normal"), ("y1", "edge")]
    assert "SIGABRT" in notes[0] and "max abs 0.5" in notes[1]


def _in_branch(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with y1's nodes (the random draw) in the then-branch of an If on a constant true."""
    y2 = [n for n in model.graph.node if "y2" in n.output]
    branch = helper.make_graph([n for n in model.graph.node if n not in y2], "then", [],
                               [helper.make_tensor_value_info("y1", TensorProto.FLOAT, None)])  # fmt: skip
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["y1e"])], "else", [],
                              [helper.make_tensor_value_info("y1e", TensorProto.FLOAT, None)])  # fmt: skip
    graph = helper.make_graph(
        [helper.make_node("If", ["cond"], ["y1"], then_branch=branch, else_branch=other), *y2], "g",
        list(model.graph.input), list(model.graph.output),
        [*model.graph.initializer, numpy_helper.from_array(np.array(True), "cond")],
    )  # fmt: skip
    result = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    result.ir_version = 8
    return result


def test_noise_from_an_if_branch() -> None:
    result = passes.check(_in_branch(_noisy()), _in_branch(_noisy(doubled=True)))
    assert result.ok and {e["output"] for e in result.not_compared} == {"y1"}, result.summary()
    result = passes.check(_in_branch(_noisy()), _in_branch(_noisy("Abs", doubled=True)))
    assert [o.name for o in result.failures] == ["y2"] and result.first_difference.output == "y2", result.summary()


def test_a_recheck_does_not_run_the_original_again_where_it_already_did() -> None:
    """The original's agreement with itself on a set does not depend on the model compared: a
    recheck (a round of the precision search) gives the same verdicts, the noisy output left out
    and the deterministic one failing, without asking the child to run the original again."""
    from passes.verify.check import Checker

    original, candidate = _noisy(), _noisy("Abs", doubled=True)  # y1 noisy; y2 differs (Relu vs Abs)
    with Checker(original) as checker:
        asked: list[list[str]] = []
        request = checker.worker.request

        def spy(message, deadline):
            if message["op"] == "again":
                asked.append(sorted(message["names"]))
            return request(message, deadline)

        checker.worker.request = spy
        first = checker.check(candidate)
        again = len(asked)
        assert again and ["y1", "y2"] in asked, asked
        second = checker.recheck(candidate)
        assert len(asked) == again, asked  # nothing run again
        for result in (first, second):
            assert result.checked and not result.ok
            assert {e["output"] for e in result.not_compared} == {"y1"}
            assert [o.name for o in result.outputs if not o.ok] == ["y2"]
        assert first.not_compared == second.not_compared
        third = checker.check(candidate)  # a new check chooses its inputs again: it asks again
        assert len(asked) == 2 * again and third.not_compared == first.not_compared, asked
