"""onnxruntime's chain, not refimpl's bytes, through the byte-moving folds of a batch.

The sweep of real exports found it: a Falcon (or Gemma) export at a static shape
(``--input-shape``) folds its rotary tables, Cos and Sin of the positions, then
the Unsqueeze of each. refimpl's Cos is correctly rounded, onnxruntime's is not
everywhere (within agree's ULPs): the confirmation wrote onnxruntime's bits for
the Cos, but the Unsqueeze, an exempt fold of the same batch, had already copied
refimpl's, and those were the bits written: logits one ULP off, where folding
promises the original's values bit for bit. SigLIP's attention-pooling probe
(MatMul, Add, Reshape, Transpose, then a Mul) had the same through a computing
op after the byte-moving ones: the Mul was confirmed from the Transpose's refimpl
bytes. An exempt fold that reads a value onnxruntime computes for the batch is
now computed in the extracted model too. Each case compares onnxruntime before
and after bit for bit.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from test_fold_confirm import F32, fold, make_model, same_in_ort

# Over [0, 100] onnxruntime's float32 Cos is one ULP from the correctly rounded value at hundreds of points.
ANGLES = np.linspace(0, 100, 4096, dtype=np.float32).reshape(64, 64)


def _const(name: str, array: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(array), name))


def _rotary_table(chain: str) -> tuple[list[onnx.NodeProto], str]:
    """Cos of the angles, then the byte-moving ops of ``chain`` ("" for none): the nodes and the last value."""
    nodes = [_const("angles", ANGLES), helper.make_node("Cos", ["angles"], ["cos"])]
    last = "cos"
    if "unsqueeze" in chain:
        nodes += [_const("ax", np.array([0], np.int64)), helper.make_node("Unsqueeze", [last, "ax"], ["u"])]
        last = "u"
    if "transpose" in chain:
        nodes.append(helper.make_node("Transpose", [last], ["t"], perm=[0, 2, 1]))
        last = "t"
    if "concat" in chain:
        nodes += [_const("other", np.full((1, 64, 64), 0.5, np.float32)), _const("one", np.array([1], np.int64)),
                  helper.make_node("Concat", [last, "other"], ["c"], axis=0),
                  helper.make_node("Slice", ["c", "ax", "one", "ax"], ["s"])]
        last = "s"
    return nodes, last


def _model(chain: str) -> onnx.ModelProto:
    nodes, last = _rotary_table(chain)
    shape = [64, 64] if chain == "" else [1, 64, 64]
    nodes.append(helper.make_node("Mul", [last, "x"], ["y"]))
    return make_model(nodes, [helper.make_tensor_value_info("x", F32, shape)],
                      [helper.make_tensor_value_info("y", F32, shape)])


def ops(graph: onnx.GraphProto) -> list[str]:
    """The computing nodes (fold leaves its results in Constant nodes where it found them)."""
    return [n.op_type for n in graph.node if n.op_type != "Constant"]


def _ones(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return {"x": np.ones(dims, np.float32)}


def test_the_cos_alone_is_written_with_onnxruntime_bits() -> None:
    proto = _model("")
    out, fold_pass, _ = fold(proto)
    assert ops(out.graph) == ["Mul"] and fold_pass.stats["onnxruntime_rounding"] == 1, fold_pass.stats
    same_in_ort(proto, out, _ones(proto))


def test_an_unsqueeze_of_the_cos_carries_onnxruntime_bits() -> None:
    proto = _model("unsqueeze")
    out, fold_pass, _ = fold(proto)
    assert ops(out.graph) == ["Mul"], ops(out.graph)
    assert fold_pass.stats["applied"] == {"Cos": 1, "Unsqueeze": 1}, fold_pass.stats
    same_in_ort(proto, out, _ones(proto))


def test_a_chain_of_byte_moving_folds_carries_them_to_the_written_value() -> None:
    proto = _model("unsqueeze transpose concat")
    out, fold_pass, _ = fold(proto)
    assert ops(out.graph) == ["Mul"], ops(out.graph)
    assert {"Cos", "Unsqueeze", "Transpose", "Concat", "Slice"} <= set(fold_pass.stats["applied"]), fold_pass.stats
    same_in_ort(proto, out, _ones(proto))


def test_inside_an_if_branch() -> None:
    nodes, last = _rotary_table("unsqueeze transpose")
    nodes.append(helper.make_node("Mul", [last, "x"], ["ty"]))
    then = helper.make_graph(nodes, "then", [], [helper.make_tensor_value_info("ty", F32, [1, 64, 64])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["ey"])], "else", [],
                              [helper.make_tensor_value_info("ey", F32, [1, 64, 64])])
    proto = make_model([helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other)],
                       [helper.make_tensor_value_info("x", F32, [1, 64, 64]),
                        helper.make_tensor_value_info("cond", onnx.TensorProto.BOOL, [])],
                       [helper.make_tensor_value_info("y", F32, [1, 64, 64])])
    out, _, _ = fold(proto)
    branch = next(a.g for a in out.graph.node[-1].attribute if a.name == "then_branch")
    assert ops(branch) == ["Mul"], ops(branch)
    for cond in (True, False):
        same_in_ort(proto, out, {"x": np.ones((1, 64, 64), np.float32), "cond": np.array(cond)})


def test_values_refimpl_computes_bit_for_bit_are_not_touched() -> None:
    """Neg is exact: nothing is adopted, the Unsqueeze's fold is written as computed."""
    nodes = [_const("k", np.array([[0.0, -0.0, 1.5, np.inf]], np.float32)), helper.make_node("Neg", ["k"], ["n"]),
             _const("ax", np.array([0], np.int64)), helper.make_node("Unsqueeze", ["n", "ax"], ["u"]),
             helper.make_node("Add", ["u", "x"], ["y"])]
    proto = make_model(nodes, [helper.make_tensor_value_info("x", F32, [1, 1, 4])],
                       [helper.make_tensor_value_info("y", F32, [1, 1, 4])])
    out, fold_pass, _ = fold(proto)
    assert ops(out.graph) == ["Add"] and fold_pass.stats["onnxruntime_rounding"] == 0, fold_pass.stats
    same_in_ort(proto, out, {"x": np.zeros((1, 1, 4), np.float32)})


def test_a_computing_fold_after_the_byte_moving_ones_gets_onnxruntime_bits() -> None:
    """Cos -> Unsqueeze -> Neg, all constant: Neg is written; the original computes it from onnxruntime's Cos."""
    nodes, last = _rotary_table("unsqueeze")
    nodes += [helper.make_node("Neg", [last], ["n"]), helper.make_node("Add", ["n", "x"], ["y"])]
    proto = make_model(nodes, [helper.make_tensor_value_info("x", F32, [1, 64, 64])],
                       [helper.make_tensor_value_info("y", F32, [1, 64, 64])])
    out, _, _ = fold(proto)
    assert ops(out.graph) == ["Add"], ops(out.graph)
    same_in_ort(proto, out, _ones(proto))
