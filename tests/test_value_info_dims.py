"""The value_info step names inference's fresh dims (``unk__N``) by what the main graph proves (#25).

onnx shape inference gives a fresh symbol to the dims it cannot compute;
:mod:`passes.shapes.symbols` renames each to the int or the input's symbol that
``passes.simplify.dims.derive`` proves it equal to, keeps the others, and
renames apart a fresh symbol that a name the model states already uses.
Every case is checked against the shapes onnxruntime computes, at two sizes.
"""

from __future__ import annotations

import pathlib

import helpers
import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

import passes
from passes.ir.inference import infer_all
from passes.shapes import symbols
from passes.shapes.value_info import TypeValuesPass

REPO = pathlib.Path(__file__).resolve().parent.parent
RNG = np.random.default_rng(0)


def _init(name: str, array: np.ndarray) -> onnx.TensorProto:
    return onnx.numpy_helper.from_array(array, name)


def _model(nodes, inputs, outputs, inits=(), opset: int = 17) -> onnx.ModelProto:  # noqa: ANN001
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _embeddings() -> onnx.ModelProto:
    """BERT's embeddings: positions by Range and by a Slice of a 32-row buffer, a mask Expanded to
    [batch, 1, seq, seq]; onnx inference gives most of these dims fresh symbols."""
    nodes = [
        helper.make_node("Shape", ["ids"], ["shape"]),
        helper.make_node("Gather", ["shape", "one"], ["seq_len"], axis=0),
        helper.make_node("Gather", ["shape", "zero"], ["batch_len"], axis=0),
        helper.make_node("Unsqueeze", ["seq_len", "axes0"], ["seq_1d"]),
        helper.make_node("Unsqueeze", ["batch_len", "axes0"], ["batch_1d"]),
        # positions: Range(0, seq) gathered from the table, and a Slice of the position-id buffer
        helper.make_node("Range", ["zero", "seq_len", "one"], ["positions"]),
        helper.make_node("Gather", ["pos_table", "positions"], ["pos_emb"], axis=0),
        helper.make_node("Slice", ["pos_ids", "zero_1d", "seq_1d", "one_1d"], ["sliced_ids"]),
        helper.make_node("Gather", ["type_table", "sliced_ids"], ["type_emb"], axis=0),
        helper.make_node("Gather", ["tok_table", "ids"], ["tok_emb"], axis=0),
        helper.make_node("Add", ["tok_emb", "pos_emb"], ["sum1"]),
        helper.make_node("Shape", ["tok_emb"], ["tok_shape"]),
        helper.make_node("Expand", ["type_emb", "tok_shape"], ["type_full"]),
        helper.make_node("Add", ["sum1", "type_full"], ["sum2"]),
        # the attention mask, Expanded to a shape of shape arithmetic
        helper.make_node("Unsqueeze", ["mask", "axes12"], ["mask4"]),
        helper.make_node("Concat", ["batch_1d", "one_1d", "seq_1d", "seq_1d"], ["mask_shape"], axis=0),
        helper.make_node("Expand", ["mask4", "mask_shape"], ["mask_full"]),
        helper.make_node("Cast", ["mask_full"], ["mask_f"], to=TensorProto.FLOAT),
        helper.make_node("ReduceSum", ["mask_f", "axes3"], ["mask_sum"], keepdims=0),
        helper.make_node("Transpose", ["sum2"], ["hidden_t"], perm=[0, 2, 1]),
        helper.make_node("Transpose", ["mask_sum"], ["mask_sum_t"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["hidden_t", "mask_sum_t"], ["pooled"]),
    ]
    inits = [
        _init("zero", np.array(0, np.int64)), _init("one", np.array(1, np.int64)),
        _init("zero_1d", np.array([0], np.int64)), _init("one_1d", np.array([1], np.int64)),
        _init("axes0", np.array([0], np.int64)), _init("axes12", np.array([1, 2], np.int64)),
        _init("axes3", np.array([3], np.int64)),
        _init("pos_table", RNG.standard_normal((32, 8)).astype(np.float32)),
        _init("pos_ids", np.zeros((1, 32), np.int64)),
        _init("type_table", RNG.standard_normal((2, 8)).astype(np.float32)),
        _init("tok_table", RNG.standard_normal((50, 8)).astype(np.float32)),
    ]  # fmt: skip
    return _model(
        nodes,
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"]),
         helper.make_tensor_value_info("mask", TensorProto.BOOL, ["batch", "seq"])],
        [helper.make_tensor_value_info("sum2", TensorProto.FLOAT, ["batch", "seq", 8]),
         helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["batch", 8, 1])],
        inits,
    )  # fmt: skip


def _value_info(model: onnx.ModelProto | onnx.GraphProto) -> dict[str, list[int | str | None]]:
    graph = model.graph if isinstance(model, onnx.ModelProto) else model
    return {v.name: helpers.dims_of(v) for v in graph.value_info}


def _fresh(dims: dict[str, list[int | str | None]]) -> dict[str, list[int | str | None]]:
    return {k: v for k, v in dims.items() if any(isinstance(d, str) and d.startswith("unk__") for d in v)}


def _ids(sizes: list[tuple[int, int]]) -> list[dict[str, np.ndarray]]:
    return [{"ids": RNG.integers(0, 50, (b, s)), "mask": RNG.random((b, s)) > 0.5} for b, s in sizes]


def test_range_slice_and_expand_dims_get_the_inputs_names() -> None:
    model = _embeddings()
    inferred = _value_info(onnx.shape_inference.infer_shapes(model, data_prop=True))
    assert {k: inferred[k] for k in ("positions", "sliced_ids", "sum1", "type_full")} == {
        "positions": ["unk__0"], "sliced_ids": ["unk__1", "unk__2"], "sum1": ["batch", "unk__3", 8],
        "type_full": ["unk__4", "unk__5", 8]}  # fmt: skip
    result = passes.optimize(model)
    dims = _value_info(result)
    assert {k: dims[k] for k in ("positions", "pos_emb", "sliced_ids", "sum1", "type_full")} == {
        "positions": ["seq"], "pos_emb": ["seq", 8], "sliced_ids": [1, "unk__2"], "sum1": ["batch", "seq", 8],
        "type_full": ["batch", "seq", 8]}  # fmt: skip
    # the one left is min(seq, 32): no input's dim, no int
    assert _fresh(dims) == {"sliced_ids": [1, "unk__2"], "type_emb": [1, "unk__2", 8]}
    assert helpers.value_info_against_onnxruntime(result, _ids([(2, 5), (3, 32), (1, 1)])) > 100


def test_the_plan_names_each_symbol_by_its_proof_and_the_step_counts_them() -> None:
    model = ir.serde.deserialize_model(_embeddings())
    renaming = symbols.plan(model, infer_all(model))
    # Range's length, a Slice's kept axis, the broadcasts and the Expand; unk__2 is min(seq, 32)
    assert renaming.main == {"unk__0": "seq", "unk__1": 1, "unk__3": "seq", "unk__4": "batch", "unk__5": "seq",
                             "unk__6": "batch", "unk__7": "seq", "unk__8": "batch"}  # fmt: skip
    assert renaming.sub == renaming.main and renaming.apart == 0
    step = TypeValuesPass()
    assert step(model).modified
    assert step.stats["symbols_named"] == 8 and step.stats["symbols_renamed_apart"] == 0
    assert not TypeValuesPass()(model).modified  # idempotent: every value is typed now


def _unprovable() -> onnx.ModelProto:
    """A broadcast of two unrelated dims and a NonZero: nothing proves what their sizes are."""
    return _model(
        [helper.make_node("Add", ["x", "y"], ["s"]), helper.make_node("Relu", ["s"], ["r"]),
         helper.make_node("NonZero", ["r"], ["nz"]), helper.make_node("Cast", ["nz"], ["out"], to=TensorProto.FLOAT)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["a"]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b"])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, "count"])],
    )  # fmt: skip


def _without_renaming(monkeypatch: pytest.MonkeyPatch, model: onnx.ModelProto) -> onnx.ModelProto:
    with monkeypatch.context() as patch:
        patch.setattr(symbols, "plan", lambda *_: symbols.Renaming())
        return passes.optimize(model)


def test_nothing_proved_keeps_the_fresh_symbols_and_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    result = passes.optimize(_unprovable())
    assert _value_info(result) == {"s": ["unk__0"], "r": ["unk__0"], "nz": [1, "unk__1"]}
    assert result.SerializeToString() == _without_renaming(monkeypatch, _unprovable()).SerializeToString()
    feeds = [{"x": RNG.standard_normal(a).astype(np.float32), "y": RNG.standard_normal(b).astype(np.float32)}
             for a, b in ((1, 6), (4, 4), (3, 1))]  # fmt: skip
    assert helpers.value_info_against_onnxruntime(result, feeds) > 0


def test_a_static_model_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    model = onnx.load(str(REPO / "models" / "real" / "small_cnn_opset13.onnx"))
    static = passes.optimize(model, input_shapes={"pixels": (2, 3, 16, 16)})
    assert all(isinstance(d, int) for dims in _value_info(static).values() for d in dims)
    with monkeypatch.context() as patch:
        patch.setattr(symbols, "plan", lambda *_: symbols.Renaming())
        plain = passes.optimize(model, input_shapes={"pixels": (2, 3, 16, 16)})
    assert static.SerializeToString() == plain.SerializeToString()
    loaded = ir.serde.deserialize_model(static)
    assert symbols.plan(loaded, infer_all(loaded)) == symbols.Renaming()


@pytest.mark.parametrize("name", ["tiny_bert_opset17", "tiny_bert_opset11", "tiny_bert_opset14_nofold"])
def test_a_real_bert_matches_onnxruntime_at_two_sizes(name: str) -> None:
    source = onnx.load(str(REPO / "models" / "real" / f"{name}.onnx"))
    before = _value_info(onnx.shape_inference.infer_shapes(source, data_prop=True))
    result = passes.optimize(source)
    dims = _value_info(result)
    assert len(_fresh(before)) > 20 and len(dims) > 90
    # only the slice of the 32-row position buffer up to seq is left: min(seq, 32)
    assert len(_fresh(dims)) == 2, _fresh(dims)
    assert sum(d == "seq" for v in dims.values() for d in v) > 80
    feeds = [{"input_ids": RNG.integers(0, 256, (b, s)), "attention_mask": np.ones((b, s), np.int64)}
             for b, s in ((1, 5), (3, 17), (2, 32))]  # fmt: skip
    assert helpers.value_info_against_onnxruntime(result, feeds) > 800


def _branching() -> onnx.ModelProto:
    """Positions by Range (a fresh symbol proved ``seq`` in the main graph), read by both branches of an If."""

    def branch(name: str, op: str) -> onnx.GraphProto:
        return helper.make_graph(
            [helper.make_node("Cast", ["positions"], [f"{name}_f"], to=TensorProto.FLOAT),
             helper.make_node(op, [f"{name}_f"], [f"{name}_g"]),
             helper.make_node("Unsqueeze", [f"{name}_g", "axes0"], [f"{name}_out"])],
            name, [], [helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, None)],
        )  # fmt: skip

    return _model(
        [helper.make_node("Shape", ["x"], ["shape"]), helper.make_node("Gather", ["shape", "one"], ["seq_len"], axis=0),
         helper.make_node("Range", ["zero", "seq_len", "one"], ["positions"]),
         helper.make_node("If", ["cond"], ["y"], then_branch=branch("then", "Relu"), else_branch=branch("else", "Neg")),
         helper.make_node("Add", ["y", "x"], ["z"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq"]),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch", "seq"])],
        [_init("zero", np.array(0, np.int64)), _init("one", np.array(1, np.int64)),
         _init("axes0", np.array([0], np.int64))],
    )  # fmt: skip


def test_subgraph_values_take_the_main_graphs_equalities() -> None:
    model = _branching()
    inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    if_node = next(n for n in inferred.graph.node if n.op_type == "If")
    then = next(a.g for a in if_node.attribute if a.name == "then_branch")
    assert _value_info(then) == {"then_f": ["unk__0"], "then_g": ["unk__0"]}
    result = passes.optimize(model)
    assert _value_info(result)["positions"] == ["seq"]
    if_node = next(n for n in result.graph.node if n.op_type == "If")
    for attr in if_node.attribute:
        name = attr.g.name
        assert _value_info(attr.g) == {f"{name}_f": ["seq"], f"{name}_g": ["seq"]}, name
    feeds = [{"x": RNG.standard_normal((b, s)).astype(np.float32), "cond": np.array(c)}
             for b, s in ((2, 3), (1, 7)) for c in (True, False)]  # fmt: skip
    assert helpers.value_info_against_onnxruntime(result, feeds) > 0


def _looping() -> onnx.ModelProto:
    """A Loop whose body makes up a symbol (the length of a Concat of a carried value), stacked as a
    scan output that a MatMul proves ``n`` in the main graph."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Concat", ["v_in", "one_f"], ["v_out"], axis=0),
         helper.make_node("Relu", ["v_out"], ["v_relu"]), helper.make_node("Neg", ["v_relu"], ["v_scan"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [None])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("v_scan", TensorProto.FLOAT, None)],
    )  # fmt: skip
    return _model(
        [helper.make_node("Loop", ["trips", "", "start"], ["final", "stacked"], body=body),
         helper.make_node("MatMul", ["stacked", "w"], ["y"])],
        [helper.make_tensor_value_info("trips", TensorProto.INT64, []),
         helper.make_tensor_value_info("start", TensorProto.FLOAT, ["m"]),
         helper.make_tensor_value_info("w", TensorProto.FLOAT, ["n", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("final", TensorProto.FLOAT, None)],
        [_init("one_f", np.ones(1, np.float32))],
    )  # fmt: skip


def test_a_symbol_made_up_in_a_loop_body_is_named_in_the_main_graph_only() -> None:
    """A carried value may grow at each iteration: a body's symbol is not one size per run, so a
    main-graph fact about the size the Loop returned does not name it inside the body."""
    result = passes.optimize(_looping(), check=False)  # the check's generated trip counts make the carried value grow
    loop = next(n for n in result.graph.node if n.op_type == "Loop")
    assert _value_info(result)["stacked"][1] == "n"
    inside = _value_info(loop.attribute[0].g)
    assert list(inside) == ["v_relu"] and inside["v_relu"][0].startswith("unk__"), inside
    feeds = [{"trips": np.array(1), "start": np.ones(m, np.float32), "w": np.ones((m + 1, 3), np.float32)}
             for m in (1, 4)]  # fmt: skip
    assert helpers.value_info_against_onnxruntime(result, feeds) > 0


def _colliding() -> onnx.ModelProto:
    """A user's input dim named ``unk__0`` and a declared output dim named ``unk__1`` (as a model
    that went through onnx inference before has), beside a broadcast inference gives a fresh symbol."""
    return _model(
        [helper.make_node("Add", ["x", "y"], ["s"]), helper.make_node("Relu", ["s"], ["t"]),
         helper.make_node("Neg", ["z"], ["o"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["unk__0"]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b"]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, ["c"])],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, ["d"]),
         helper.make_tensor_value_info("o", TensorProto.FLOAT, ["unk__1"])],
    )  # fmt: skip


def test_a_fresh_symbol_never_takes_a_name_the_model_uses() -> None:
    model = _colliding()
    loaded = ir.serde.deserialize_model(model)
    inferred = {v.name: list(shape) for v, (_, shape) in infer_all(loaded).items()}
    assert inferred["s"] == ["unk__1"]  # inference forgets the declared output shapes, so cannot avoid their names
    assert symbols.plan(loaded, infer_all(loaded)).main == {"unk__1": "unk__2"}
    result = passes.optimize(model)
    (name,) = _value_info(result)["s"]
    assert name.startswith("unk__") and name not in ("unk__0", "unk__1"), name
    assert [helpers.dims_of(o) for o in result.graph.output] == [["d"], ["unk__1"]]
    feeds = [{"x": RNG.standard_normal(a).astype(np.float32), "y": RNG.standard_normal(b).astype(np.float32),
              "z": RNG.standard_normal(c).astype(np.float32)} for a, b, c in ((1, 4, 3), (5, 5, 2))]  # fmt: skip
    assert helpers.value_info_against_onnxruntime(result, feeds) > 0
