"""Equal initializers become one, then CSE merges their users (passes/simplify/constants.py); the
MatMul merge onnxsim applies (a shared input, concatenated weights, a Split) is not applied: in
onnxruntime it is not exact (docs/exactness.md)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from helpers import ort_run, simplify_checked

B = TensorProto.BOOL
F = TensorProto.FLOAT


def model(nodes, inputs, outputs, initializers, ir_version=8) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializers)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=ir_version)
    onnx.checker.check_model(proto, full_check=True)
    return proto


def masks(count: int, shape=(64, 64), seed: int = 0) -> list[onnx.TensorProto]:
    """``count`` byte-identical bool masks of 4,096 elements (over onnx_ir's 1,024-element dedup limit)."""
    mask = np.random.default_rng(seed).random(shape) < 0.5
    return [numpy_helper.from_array(mask.copy(), f"mask{i}") for i in range(count)]


def reformer_like(count: int = 4, extra_masks=()) -> onnx.ModelProto:
    """The dynamo export's pattern: each equal mask in an And with the same input, each And read apart."""
    nodes, terms = [], []
    for i in range(count):
        nodes += [helper.make_node("And", ["x", f"mask{i}"], [f"a{i}"]), helper.make_node("Cast", [f"a{i}"], [f"c{i}"], to=F)]
        terms.append(f"c{i}")
    nodes.append(helper.make_node("Sum", terms, ["y"]))
    return model(nodes, [helper.make_tensor_value_info("x", B, [64, 64])], [helper.make_tensor_value_info("y", F, [64, 64])],
                 [*masks(count), *extra_masks])  # fmt: skip


def feeds(seed: int = 1) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).random((64, 64)) < 0.5}


def same_outputs(a: onnx.ModelProto, b: onnx.ModelProto, run: dict[str, np.ndarray]) -> None:
    for e, o in zip(ort_run(a, run), ort_run(b, run), strict=True):
        assert e.dtype == o.dtype and e.shape == o.shape and e.tobytes() == o.tobytes()


def ops(graph: onnx.GraphProto) -> list[str]:
    return [n.op_type for n in graph.node]


def test_four_equal_masks_become_one_and_their_ands_merge() -> None:
    original = reformer_like()
    out, stats = simplify_checked(original)
    assert [i.name for i in out.graph.initializer] == ["mask0"]  # the first name is kept
    assert ops(out.graph).count("And") == 1 and ops(out.graph).count("Cast") == 1
    assert stats["applied"]["constants/shared_initializer"] == 3
    assert stats["applied"]["cse/merged"] == 6  # three Ands, then three Casts
    same_outputs(original, out, feeds())


def test_masks_that_differ_by_one_byte_stay_apart() -> None:
    original = reformer_like()
    changed = numpy_helper.to_array(original.graph.initializer[2]).copy()
    changed[0, 0] = not changed[0, 0]
    original.graph.initializer[2].CopyFrom(numpy_helper.from_array(changed, "mask2"))
    out, stats = simplify_checked(original)
    assert sorted(i.name for i in out.graph.initializer) == ["mask0", "mask2"]
    assert ops(out.graph).count("And") == 2
    same_outputs(original, out, feeds())


def test_signed_zeros_same_dtype_other_shape_are_not_equal() -> None:
    """-0.0 is not +0.0; a float mask of the same bytes and another shape is another tensor."""
    zeros = [numpy_helper.from_array(np.zeros(8, np.float32), "p"), numpy_helper.from_array(-np.zeros(8, np.float32), "n"),
             numpy_helper.from_array(np.zeros((2, 4), np.float32), "q")]  # fmt: skip
    nodes = [helper.make_node("Div", ["x", w], [f"d{w}"]) for w in ("p", "n")]
    nodes += [helper.make_node("Reshape", ["q", "shape"], ["r"]), helper.make_node("Add", ["dp", "dn"], ["s"]),
              helper.make_node("Add", ["s", "r"], ["y"])]  # fmt: skip
    original = model(nodes, [helper.make_tensor_value_info("x", F, [8])], [helper.make_tensor_value_info("y", F, [8])],
                     [*zeros, numpy_helper.from_array(np.array([8], np.int64), "shape")])  # fmt: skip
    out, stats = simplify_checked(original)
    assert {"p", "n", "q"} <= {i.name for i in out.graph.initializer}
    assert "constants/shared_initializer" not in stats["applied"]
    same_outputs(original, out, {"x": np.array([1, -1, 0, 2, 3, -4, 5, 6], np.float32)})


def test_an_initializer_that_is_a_graph_input_is_not_shared() -> None:
    """IR >= 4: an initializer listed as a graph input is overridable; a caller may feed it."""
    original = reformer_like()
    original.graph.input.append(helper.make_tensor_value_info("mask1", B, [64, 64]))
    onnx.checker.check_model(original, full_check=True)
    out, _ = simplify_checked(original)
    names = sorted(i.name for i in out.graph.initializer)
    assert names == ["mask0", "mask1"]
    assert ops(out.graph).count("And") == 2
    run = feeds()
    same_outputs(original, out, run)
    run["mask1"] = np.zeros((64, 64), bool)  # overridden: the output follows the fed mask
    same_outputs(original, out, run)


def test_in_an_if_branch_its_own_initializers_are_shared_not_those_of_another_graph() -> None:
    mask = masks(1)[0]
    inner = [numpy_helper.from_array(numpy_helper.to_array(mask), f"inner{i}") for i in range(2)]
    then = helper.make_graph(
        [helper.make_node("And", ["x", "inner0"], ["t0"]), helper.make_node("And", ["x", "inner1"], ["t1"]),
         helper.make_node("Xor", ["t0", "t1"], ["t"])], "then", [],
        [helper.make_tensor_value_info("t", B, [64, 64])], inner)  # fmt: skip
    other = helper.make_graph([helper.make_node("And", ["x", "mask0"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", B, [64, 64])])  # fmt: skip
    original = model([helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
                     [helper.make_tensor_value_info("c", B, []), helper.make_tensor_value_info("x", B, [64, 64])],
                     [helper.make_tensor_value_info("y", B, [64, 64])], [numpy_helper.from_array(numpy_helper.to_array(mask), "mask0")])  # fmt: skip
    out, stats = simplify_checked(original)
    branch = next(a.g for a in out.graph.node[0].attribute if a.name == "then_branch")
    assert [i.name for i in branch.initializer] == ["inner0"]  # shared within the branch
    assert [i.name for i in out.graph.initializer] == ["mask0"]  # the main graph's stays its own
    assert ops(branch).count("And") == 1
    for c in (True, False):
        same_outputs(original, out, {"c": np.array(c), **feeds()})


def test_no_op_without_equal_initializers() -> None:
    original = reformer_like(count=1)
    out, stats = simplify_checked(original)
    assert "constants/shared_initializer" not in stats["applied"] and "cse/merged" not in stats["applied"]
    assert ops(out.graph) == ["And", "Cast"]  # a one-input Sum is a no-op
    same_outputs(original, out, feeds())


# --- the MatMul merge: not applied ----------------------------------------------------------------


def shared_input_matmuls(weights: list[np.ndarray], dtype=F) -> onnx.ModelProto:
    k = weights[0].shape[0]
    nodes = [helper.make_node("MatMul", ["a", f"w{i}"], [f"y{i}"]) for i in range(len(weights))]
    return model(nodes, [helper.make_tensor_value_info("a", dtype, [5, k])],
                 [helper.make_tensor_value_info(f"y{i}", dtype, [5, w.shape[1]]) for i, w in enumerate(weights)],
                 [numpy_helper.from_array(w, f"w{i}") for i, w in enumerate(weights)])  # fmt: skip


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matmuls_sharing_their_input_stay_apart(dtype) -> None:
    """onnxsim concatenates the weights and splits the product; onnxruntime's double MatMul then
    sums in another order (benchmarks/matmul_merge.py measures it), so the merge is not made."""
    rng = np.random.default_rng(0)
    weights = [rng.standard_normal((768, n)).astype(dtype) for n in (16, 16, 16, 16)]
    original = shared_input_matmuls(weights, TensorProto.FLOAT if dtype == np.float32 else TensorProto.DOUBLE)
    out, _ = simplify_checked(original)
    assert ops(out.graph) == ["MatMul"] * 4 and "Split" not in ops(out.graph)
    same_outputs(original, out, {"a": rng.standard_normal((5, 768)).astype(dtype)})


def test_masks_equal_where_the_key_samples_them_are_compared_whole() -> None:
    """The key samples a few bytes (first, last, strided); masks 1 and 3 equal there but differ at a byte
    no sample reads: 1 stays apart from 0, and 3, equal to 1, still merges with 1, not with 0."""
    original = reformer_like()
    base = numpy_helper.to_array(original.graph.initializer[0]).copy()
    changed = base.copy()
    changed[31, 37] = not changed[31, 37]  # byte 2021: not in the first or last 256, not on the 64-byte stride
    assert (31 * 64 + 37) % 64 and 256 <= 31 * 64 + 37 < 4096 - 256
    for i in (1, 3):
        original.graph.initializer[i].CopyFrom(numpy_helper.from_array(changed, f"mask{i}"))
    out, stats = simplify_checked(original)
    assert sorted(i.name for i in out.graph.initializer) == ["mask0", "mask1"]
    assert ops(out.graph).count("And") == 2 and stats["applied"]["constants/shared_initializer"] == 2
    same_outputs(original, out, feeds())


def test_equal_conv_weights_are_shared_only_after_their_fusions() -> None:
    """Two Conv -> BatchNormalization -> Mul chains with equal weights and BN parameters, each Mul
    its own per-channel scale. Sharing the BN-fused weights before the rules settle would give the
    weight two users (and CSE one Conv) and block both Mul fusions: 4 nodes where 3 are right (the
    light zoo's fills: 34 Mul/Add pairs left on Inception v2)."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    bn = [rng.uniform(0.5, 2, 4), rng.standard_normal(4), rng.standard_normal(4), rng.uniform(0.5, 2, 4)]
    inits, nodes = [], []
    for i in range(2):
        inits.append(numpy_helper.from_array(w.copy(), f"w{i}"))
        inits += [numpy_helper.from_array(a.astype(np.float32), f"{n}{i}") for n, a in zip("gbmv", bn)]
        inits.append(numpy_helper.from_array(rng.uniform(0.5, 2, (1, 4, 1, 1)).astype(np.float32), f"s{i}"))
        nodes += [helper.make_node("Conv", ["x", f"w{i}"], [f"c{i}"]),
                  helper.make_node("BatchNormalization", [f"c{i}", f"g{i}", f"b{i}", f"m{i}", f"v{i}"], [f"n{i}"]),
                  helper.make_node("Mul", [f"n{i}", f"s{i}"], [f"p{i}"])]  # fmt: skip
    nodes.append(helper.make_node("Add", ["p0", "p1"], ["y"]))
    original = model(nodes, [helper.make_tensor_value_info("x", F, [1, 3, 8, 8])],
                     [helper.make_tensor_value_info("y", F, [1, 4, 6, 6])], inits)  # fmt: skip
    out, stats = simplify_checked(original)
    assert ops(out.graph) == ["Conv", "Conv", "Add"]
    assert stats["applied"]["fusions/mul_into_conv"] == 2
    run = {"x": np.random.default_rng(4).standard_normal((1, 3, 8, 8)).astype(np.float32)}
    np.testing.assert_allclose(ort_run(out, run)[0], ort_run(original, run)[0], rtol=1e-5, atol=1e-5)


def test_equal_weights_of_the_same_conv_input_merge_once_the_fusions_are_done() -> None:
    """Two Convs of one input with equal weights and no fusion to make: shared, then one Conv (CSE)."""
    w = np.random.default_rng(5).standard_normal((4, 3, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"]), helper.make_node("Conv", ["x", "w1"], ["c1"]),
             helper.make_node("Sub", ["c0", "c1"], ["y"])]  # fmt: skip
    original = model(nodes, [helper.make_tensor_value_info("x", F, [1, 3, 8, 8])],
                     [helper.make_tensor_value_info("y", F, [1, 4, 6, 6])],
                     [numpy_helper.from_array(w, "w0"), numpy_helper.from_array(w.copy(), "w1")])  # fmt: skip
    out, stats = simplify_checked(original)
    assert ops(out.graph) == ["Conv", "Sub"] and [i.name for i in out.graph.initializer] == ["w0"]
    run = {"x": np.random.default_rng(6).standard_normal((1, 3, 8, 8)).astype(np.float32)}
    same_outputs(original, out, run)


def test_a_sharing_that_merges_nothing_ends_the_call_without_another_sweep() -> None:
    """Once the rules settle, equal weights shared with no CSE merge after it change nothing a rule
    reads: the call ends there (one sweep, not two), and a fresh call on its result finds nothing."""
    import onnx_ir as ir

    from passes.simplify import SimplifyPass

    nodes = [helper.make_node("And", ["x", "mask0"], ["a"]), helper.make_node("Or", ["x", "mask1"], ["o"])]
    original = model(nodes, [helper.make_tensor_value_info("x", B, [64, 64])],
                     [helper.make_tensor_value_info(n, B, [64, 64]) for n in ("a", "o")], masks(2))  # fmt: skip
    out, stats = simplify_checked(original)
    assert [i.name for i in out.graph.initializer] == ["mask0"]
    assert [list(n.input) for n in out.graph.node] == [["x", "mask0"], ["x", "mask0"]]
    assert stats["applied"] == {"constants/shared_initializer": 1}
    assert stats["rounds"] == 1
    again = SimplifyPass()
    result = again(ir.serde.deserialize_model(out))
    assert not result.modified and again.stats["rounds"] == 1 and again.settled
    same_outputs(original, out, feeds())


def test_a_sharing_that_lets_cse_merge_is_followed_by_another_sweep() -> None:
    """The counterpart: the Ands of equal masks merge once the masks are one, and a merge can bring a
    rule's match, so the call sweeps the graph again."""
    original = reformer_like(count=2)
    out, stats = simplify_checked(original)
    assert stats["applied"]["constants/shared_initializer"] == 1 and stats["applied"]["cse/merged"] == 2
    assert stats["rounds"] == 2
    same_outputs(original, out, feeds())
