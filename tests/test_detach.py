"""Large list attributes left in the file until read (passes.modelio.detach).

The thresholds are lowered so that small models take the path a 200 MB tree
ensemble takes; the oracle is the same run with nothing detached.
"""

from __future__ import annotations

import contextlib
import pathlib
from collections.abc import Iterator
from unittest import mock

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import passes
from passes import modelio, pipeline
from passes.errors import InputError
from passes.modelio import detach, wire

F = TensorProto.FLOAT


@contextlib.contextmanager
def detaching(min_attribute: int = 64) -> Iterator[None]:
    """Detach every list attribute record of at least ``min_attribute`` bytes, in files of any size."""
    with mock.patch.object(detach, "MIN_FILE", 0), mock.patch.object(detach, "MIN_ATTRIBUTE", min_attribute):
        yield


def _trees(n_trees: int = 12, depth: int = 3, features: int = 4, seed: int = 0) -> onnx.NodeProto:
    """A TreeEnsembleRegressor of full binary trees (ids, features, thresholds and weights at random)."""
    rng = np.random.default_rng(seed)
    per, inner = 2 ** (depth + 1) - 1, 2**depth - 1
    ids = np.arange(per)
    leaf = ids >= inner
    node = helper.make_node(
        "TreeEnsembleRegressor", ["x"], ["trees"], domain="ai.onnx.ml", n_targets=1,
        nodes_treeids=np.repeat(np.arange(n_trees), per).tolist(),
        nodes_nodeids=np.tile(ids, n_trees).tolist(),
        nodes_featureids=rng.integers(0, features, n_trees * per).tolist(),
        nodes_values=rng.standard_normal(n_trees * per).astype(np.float32).tolist(),
        nodes_modes=[b"LEAF" if is_leaf else b"BRANCH_LEQ" for is_leaf in np.tile(leaf, n_trees)],
        nodes_truenodeids=np.tile(np.where(leaf, 0, 2 * ids + 1), n_trees).tolist(),
        nodes_falsenodeids=np.tile(np.where(leaf, 0, 2 * ids + 2), n_trees).tolist(),
        target_treeids=np.repeat(np.arange(n_trees), per - inner).tolist(),
        target_nodeids=np.tile(ids[leaf], n_trees).tolist(),
        target_ids=[0] * (n_trees * (per - inner)),
        target_weights=rng.standard_normal(n_trees * (per - inner)).astype(np.float32).tolist(),
    )  # fmt: skip
    return node


def _branch(name: str, seed: int) -> onnx.GraphProto:
    trees = _trees(seed=seed)
    trees.output[0] = f"{name}_t"
    return helper.make_graph([trees], name, [], [helper.make_tensor_value_info(f"{name}_t", F, ["n", 1])])


def tree_model() -> onnx.ModelProto:
    """Trees in the main graph, in both If branches and in a function, and a long Constant list that folds."""
    ml = helper.make_opsetid("ai.onnx.ml", 3)
    inner = _trees(seed=3)
    inner.input[0], inner.output[0] = "u", "t"
    scale = helper.make_function(
        "local", "Scale", ["v", "u"], ["w"], [inner, helper.make_node("Mul", ["v", "t"], ["w"])],
        [helper.make_opsetid("", 13), ml],
    )  # fmt: skip
    nodes = [
        _trees(),
        helper.make_node("Constant", [], ["c"], value_ints=list(range(3, 43))),
        helper.make_node("Cast", ["c"], ["cf"], to=F),
        helper.make_node("ReduceSum", ["cf"], ["s"], keepdims=0),
        helper.make_node("If", ["flag"], ["b"], then_branch=_branch("then", 1), else_branch=_branch("else", 2)),
        helper.make_node("Add", ["trees", "s"], ["t1"]),
        helper.make_node("Add", ["t1", "b"], ["t2"]),
        helper.make_node("Scale", ["t2", "x"], ["y"], domain="local"),
    ]
    graph = helper.make_graph(
        nodes, "trees",
        [helper.make_tensor_value_info("x", F, ["n", 4]), helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", F, ["n", 1])],
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 13), ml, helper.make_opsetid("local", 1)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=8, functions=[scale])
    onnx.checker.check_model(model, full_check=True)
    return model


def _run(path: pathlib.Path, x: np.ndarray, flag: bool) -> np.ndarray:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x, "flag": np.array(flag)})[0]


def _detached_attrs(model: ir.Model) -> list[detach.DetachedAttr]:
    found = []
    for root in (model.graph, *model.functions.values()):
        for node in ir.traversal.RecursiveGraphIterator(root):
            found += [a for a in node.attributes.values() if isinstance(a, detach.DetachedAttr)]
    return found


@pytest.fixture
def src(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "trees.onnx"
    onnx.save_model(tree_model(), str(path))
    return path


def test_the_output_is_the_one_a_full_decode_gives(src: pathlib.Path, tmp_path: pathlib.Path) -> None:
    plain, spliced = tmp_path / "plain.onnx", tmp_path / "spliced.onnx"
    passes.optimize(src, output=plain)
    with detaching():
        report = pipeline.optimize_file(src, spliced)  # the onnxruntime check included
    assert spliced.read_bytes() == plain.read_bytes()
    fold = next(run for run in report.passes if run.name == "fold")
    assert fold.stats["folded"] > 0  # the Constant lists were read and folded
    x = np.random.default_rng(1).standard_normal((5, 4)).astype(np.float32)
    for flag in (True, False):
        np.testing.assert_array_equal(_run(spliced, x, flag), _run(src, x, flag))
    ops = [n.op_type for n in onnx.load(str(spliced)).graph.node]
    assert "TreeEnsembleRegressor" in ops and "Cast" not in ops and "ReduceSum" not in ops


def test_attributes_no_pass_reads_are_never_decoded(src: pathlib.Path) -> None:
    with detaching():
        model = modelio.load_model(src)
        found = _detached_attrs(model)
        # Every list of the four ensembles (main graph, both branches, the function); not the ONNX
        # operators' (the Constant's list, which shape inference and folding read).
        assert len(found) == 4 * 11 and "value_ints" not in {a.name for a in found}
        pipeline.optimize_model(model)
    trees = next(n for n in model.graph if n.op_type == "TreeEnsembleRegressor")
    lazy = [a for a in trees.attributes.values() if isinstance(a, detach.DetachedAttr)]
    assert len(lazy) >= 10 and not any(a.loaded for a in lazy)
    assert trees.attributes["nodes_modes"].value[:2] == ("BRANCH_LEQ", "BRANCH_LEQ")  # read when asked, exactly
    assert trees.attributes["nodes_nodeids"].value == tuple(onnx.helper.get_attribute_value(
        next(a for a in tree_model().graph.node[0].attribute if a.name == "nodes_nodeids")))  # fmt: skip


def test_nothing_is_detached_from_a_small_file(src: pathlib.Path) -> None:
    view = detach.read_view(src)
    assert view.attributes == {} and view.weights == {} and view.proto == tree_model()


def test_a_model_file_changed_after_loading_is_refused(src: pathlib.Path, tmp_path: pathlib.Path) -> None:
    with detaching():
        model = modelio.load_model(src)
        data = bytearray(src.read_bytes())
        data[-1] ^= 0  # the same bytes, but a new modification time: another file, as far as anyone knows
        src.write_bytes(bytes(data))
        out = tmp_path / "out.onnx"
        with pytest.raises(InputError, match="changed after it was validated"), modelio.staged_output(out) as staged:
            staged.save(model)
    assert not out.exists() and list(tmp_path.iterdir()) == [src]


def test_a_forged_marker_is_an_ordinary_attribute(tmp_path: pathlib.Path) -> None:
    model = tree_model()
    forged = next(a for a in model.graph.node[1].attribute if a.name == "value_ints")
    forged.doc_string = "onnx-optimize:detached:0000000000000000:0"
    path, out = tmp_path / "forged.onnx", tmp_path / "out.onnx"
    onnx.save_model(model, str(path))
    with detaching(min_attribute=1 << 30):  # the walk runs, nothing is large enough to detach
        loaded = modelio.load_model(path)
    assert _detached_attrs(loaded) == []
    value = next(n for n in loaded.graph if n.op_type == "Constant").attributes["value_ints"]
    assert value.value == tuple(range(3, 43))
    passes.optimize(path, output=out)


def test_a_truncated_large_file_is_refused_cleanly(src: pathlib.Path, tmp_path: pathlib.Path) -> None:
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(src.read_bytes()[:-300])
    with detaching(), pytest.raises(InputError, match="not a valid ONNX model"):
        modelio.load_model(cut)


def test_a_detached_list_that_cannot_be_decoded_is_a_clean_error_when_read(tmp_path: pathlib.Path) -> None:
    model = tree_model()
    modes = next(a for a in model.graph.node[0].attribute if a.name == "nodes_modes")
    modes.strings[0] = b"\xff\xfe not UTF-8"
    path = tmp_path / "bad.onnx"
    onnx.save_model(model, str(path))
    with detaching():
        loaded = modelio.load_model(path, check=False)
    trees = next(n for n in loaded.graph if n.op_type == "TreeEnsembleRegressor")
    with pytest.raises(InputError, match="'nodes_modes': cannot read it from the model file"):
        _ = trees.attributes["nodes_modes"].value
    with pytest.raises(InputError, match="cannot read the model"):  # without detaching, at load
        modelio.load_model(path, check=False)


# --- the splice against a full decode and re-encode, over many shapes of model ------------------------

_lists = st.one_of(
    st.lists(st.integers(-(2**63), 2**63 - 1), max_size=40).map(lambda v: ("ints", v)),
    st.lists(st.floats(width=32, allow_nan=False), max_size=40).map(lambda v: ("floats", v)),
    st.lists(st.text(max_size=6), max_size=40).map(lambda v: ("strings", [s.encode() for s in v])),
)


def _custom_node(index: int, lists: list[tuple[str, list]], doc: str) -> onnx.NodeProto:
    node = helper.make_node("Opaque", [], [f"o{index}"], domain="custom", doc_string=doc)
    for k, (kind, values) in enumerate(lists):
        attr = onnx.AttributeProto(name=f"a{k}", type={"ints": 7, "floats": 6, "strings": 8}[kind])
        getattr(attr, kind).extend(values)
        node.attribute.append(attr)
    return node


@settings(max_examples=60, deadline=None)
@given(
    layout=st.lists(st.lists(_lists, max_size=3), min_size=1, max_size=4),
    nested=st.booleans(),
    threshold=st.sampled_from([1, 16, 64, 200]),
    doc=st.text(max_size=8),
)
def test_the_splice_equals_a_full_decode(tmp_path_factory, layout, nested, threshold, doc) -> None:
    nodes = [_custom_node(i, lists, doc) for i, lists in enumerate(layout)]
    outputs = [n.output[0] for n in nodes]
    if nested:  # the same nodes again inside an If branch
        inner = [_custom_node(100 + i, lists, doc) for i, lists in enumerate(layout)]
        branch = helper.make_graph(inner, "branch", [], [helper.make_value_info(n.output[0], onnx.TypeProto())
                                                         for n in inner[:1]])  # fmt: skip
        nodes.append(helper.make_node("If", ["flag"], ["z"], then_branch=branch, else_branch=branch))
        outputs.append("z")
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
                              [helper.make_value_info(name, onnx.TypeProto()) for name in outputs])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("custom", 1)])
    folder = tmp_path_factory.mktemp("splice")
    path = folder / "m.onnx"
    path.write_bytes(model.SerializeToString())
    expected = ir.serde.serialize_model(ir.serde.deserialize_model(model)).SerializeToString()
    with detaching(threshold):
        view = detach.read_view(path)
    sources = view.attributes
    loaded = ir.serde.deserialize_model(view.proto)
    detach.attach(loaded, sources)
    with detach.swapped(loaded) as found:
        data = ir.serde.serialize_model(loaded).SerializeToString()
    assert len(found) == len(sources)
    pieces = wire.rewrite(data, detach.splice_visitor(data, found))
    wire.write(folder / "out.onnx", pieces or [data], str(path))
    assert (folder / "out.onnx").read_bytes() == expected
    whole, _ = modelio.model_to_proto_with_markers(loaded)
    detach.materialized(whole, found)
    assert whole.SerializeToString() == expected


def test_saving_over_the_file_the_lists_are_read_from_reads_them_first(src: pathlib.Path, tmp_path: pathlib.Path) -> None:
    expected = tmp_path / "expected.onnx"
    with detaching():
        model = modelio.load_model(src)
        modelio.save_model(model, expected)
        modelio.save_model(model, src)  # the same file: the records are read before it is rewritten
    assert src.read_bytes() == expected.read_bytes()


def test_a_list_whose_length_inference_reads_is_checked_on_the_whole_model(tmp_path: pathlib.Path, caplog) -> None:
    """A LinearClassifier's output width is its intercepts' length: on the view (empty lists) the checker
    sees a contradiction, so the whole model decides, and it is valid; the lists stay detached."""
    node = helper.make_node("LinearClassifier", ["x"], ["label", "scores"], domain="ai.onnx.ml",
                            coefficients=[0.25 + i / 64 for i in range(120)], intercepts=[0.5 + i for i in range(30)],
                            classlabels_ints=list(range(30)))  # fmt: skip
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", F, ["n", 4])],
        [helper.make_tensor_value_info("label", TensorProto.INT64, ["n"]),
         helper.make_tensor_value_info("scores", F, ["n", 30])],
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 13), helper.make_opsetid("ai.onnx.ml", 1)]
    path, out = tmp_path / "linear.onnx", tmp_path / "out.onnx"
    onnx.save_model(helper.make_model(graph, opset_imports=opsets, ir_version=8), str(path))
    with detaching(), caplog.at_level("INFO"):
        model = modelio.load_model(path)
        assert {a.name for a in _detached_attrs(model)} == {"coefficients", "intercepts", "classlabels_ints"}
        passes.optimize(path, output=out)
    assert any("checking the whole model" in r.getMessage() for r in caplog.records)  # the view misled it
    assert not [r for r in caplog.records if r.levelno >= 30], caplog.records  # no warning: it was right
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    run = [ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(None, {"x": x}) for p in (path, out)]
    np.testing.assert_array_equal(run[0][1], run[1][1])
