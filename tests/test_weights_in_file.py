"""Large inline weights left in the model file until read (passes.modelio.detach, InlineData).

A model file of at least ``detach.MIN_FILE`` bytes keeps each plain weight of
over 1 MiB in the file: the IR holds an ``InlineData`` over its bytes, saving
copies them by the kernel, and folding reads them into an array of its own
that an elementwise op overwrites block by block. ``MIN_FILE`` is lowered so
that small files take that path; the oracle is the same run with nothing left
in the file, and onnxruntime.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator
from unittest import mock

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import passes
import refimpl
from passes import modelio, pipeline
from passes.errors import InputError
from passes.fold import ConstantFoldingPass, evaluate
from passes.ir.tensors import InlineData
from passes.modelio import detach

F = TensorProto.FLOAT


@pytest.fixture
def left_in_file() -> Iterator[None]:
    """Every file is large enough for its weights to stay in it."""
    with mock.patch.object(detach, "MIN_FILE", 0):
        yield


def _model(*, fold: bool, doc: str | None = None, dtype: type = np.float32) -> onnx.ModelProto:
    """``y = x @ (w * 0.5)ᵀ`` if ``fold`` else ``x @ w``, and ``z = x @ v``: two weights over 1 MiB."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((1024, 1024)) * 0.1).astype(dtype)
    v = (rng.standard_normal((1024, 768)) * 0.1).astype(dtype)
    tensors = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(v, "v"),
               numpy_helper.from_array(np.array(0.5, dtype), "half")]  # fmt: skip
    if doc is not None:
        tensors[0].doc_string = doc
    if fold:
        nodes = [helper.make_node("Mul", ["w", "half"], ["wm"]), helper.make_node("Transpose", ["wm"], ["wt"]),
                 helper.make_node("MatMul", ["x", "wt"], ["y"])]  # fmt: skip
    else:
        nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    nodes.append(helper.make_node("MatMul", ["x", "v"], ["z"]))
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", elem, [2, 1024])],
                              [helper.make_tensor_value_info("y", elem, [2, 1024]),
                               helper.make_tensor_value_info("z", elem, [2, 768])], tensors)  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


def _run(path: pathlib.Path, x: np.ndarray) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})


def _raw(path: pathlib.Path, name: str) -> bytes:
    proto = onnx.load(str(path), load_external_data=False)
    return next(t.raw_data for t in proto.graph.initializer if t.name == name)


@pytest.mark.parametrize(("doc", "dtype"), [(None, np.float32), ("kept", np.float32), (None, np.float16)])
def test_untouched_weights_stay_in_the_file_and_come_out_the_same(
    tmp_path: pathlib.Path, left_in_file: None, doc: str | None, dtype: type
) -> None:
    src = tmp_path / "m.onnx"
    onnx.save(_model(fold=False, doc=doc, dtype=dtype), src)
    model = modelio.load_model(src)
    tensors = {name: model.graph.initializers[name].const_value for name in ("w", "v")}
    assert all(isinstance(t, InlineData) for t in tensors.values())
    assert tensors["w"].doc_string == doc and not modelio.has_external_data(model)
    plain = tmp_path / "plain.onnx"
    with mock.patch.object(detach, "MIN_FILE", 1 << 62):  # the oracle: nothing left in the file
        pipeline.optimize_file(src, plain)
    out = tmp_path / "out.onnx"
    with mock.patch("passes.ir.tensors.read_external", side_effect=AssertionError("read")):
        pipeline.optimize_file(src, out, check=pipeline.CheckOptions(enabled=False))  # no weight is read
    assert out.read_bytes() == plain.read_bytes()
    assert not (tmp_path / "out.onnx.data").exists()
    assert _raw(out, "w") == _raw(src, "w") and onnx.load(str(out)).graph.initializer[0].doc_string == (doc or "")


def test_a_folded_weight_is_written_and_the_other_copied(tmp_path: pathlib.Path, left_in_file: None) -> None:
    src, out = tmp_path / "m.onnx", tmp_path / "out.onnx"
    onnx.save(_model(fold=True), src)
    report = pipeline.optimize_file(src, out)  # with the onnxruntime check
    assert next(r for r in report.passes if r.name == "fold").stats["folded"] == 2
    assert [n.op_type for n in onnx.load(str(out)).graph.node] == ["MatMul", "MatMul"]
    assert _raw(out, "v") == _raw(src, "v")
    w = numpy_helper.to_array(next(t for t in onnx.load(str(src)).graph.initializer if t.name == "w"))
    folded = next(t for t in onnx.load(str(out)).graph.initializer if t.name != "v")
    np.testing.assert_array_equal(numpy_helper.to_array(folded), (w * np.float32(0.5)).T)
    x = np.random.default_rng(1).standard_normal((2, 1024)).astype(np.float32)
    for got, want in zip(_run(out, x), _run(src, x)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_optimizing_a_file_into_itself_copies_its_weights_first(tmp_path: pathlib.Path, left_in_file: None) -> None:
    src, expected = tmp_path / "m.onnx", tmp_path / "expected.onnx"
    onnx.save(_model(fold=True), src)
    pipeline.optimize_file(src, expected, check=pipeline.CheckOptions(enabled=False))
    pipeline.optimize_file(src, src)  # the weights are read from the file being replaced
    assert src.read_bytes() == expected.read_bytes()


def test_saving_inline_reports_the_bytes_of_its_weights(tmp_path: pathlib.Path, left_in_file: None) -> None:
    from passes.phases import Listener

    class Recorder(Listener):
        def __init__(self) -> None:
            self.lines: list[list] = []

        def start(self, message: str, total: int | None = None, unit: str = "") -> None:
            self.lines.append([message, total, unit, 0])

        def advance(self, amount: int) -> None:
            self.lines[-1][3] += amount

    src, out = tmp_path / "m.onnx", tmp_path / "out.onnx"
    onnx.save(_model(fold=True), src)  # v stays in the file, the folded w is a new array
    recorder = Recorder()
    pipeline.optimize_file(src, out, check=pipeline.CheckOptions(enabled=False), progress=recorder)
    saving = [line for line in recorder.lines if line[0].startswith("saving")]
    assert saving == [[f"saving {out}", (4 << 20) + (3 << 20), "B", (4 << 20) + (3 << 20)]], recorder.lines


def test_weights_left_in_the_file_go_to_an_external_data_file(tmp_path: pathlib.Path, left_in_file: None) -> None:
    src, out = tmp_path / "m.onnx", tmp_path / "out.onnx"
    onnx.save(_model(fold=False), src)
    model = modelio.load_model(src)
    modelio.save_model(model, out, external_data=True)
    saved = onnx.load(str(out), load_external_data=False)
    assert all(onnx.external_data_helper.uses_external_data(t) for t in saved.graph.initializer if t.name != "half")
    loaded = onnx.load(str(out))
    for name in ("w", "v"):
        assert next(t.raw_data for t in loaded.graph.initializer if t.name == name) == _raw(src, name)


def test_the_api_gets_the_values_of_weights_left_in_the_file(tmp_path: pathlib.Path, left_in_file: None) -> None:
    src = tmp_path / "m.onnx"
    onnx.save(_model(fold=False), src)
    proto = modelio.model_to_proto(modelio.load_model(src))
    assert [t.raw_data for t in proto.graph.initializer] == [t.raw_data for t in onnx.load(str(src)).graph.initializer]


def test_a_model_returned_by_the_api_holds_its_weights(tmp_path: pathlib.Path, left_in_file: None) -> None:
    src = tmp_path / "m.onnx"
    onnx.save(_model(fold=False), src)
    model = passes.optimize(src, check=False)
    assert not any(isinstance(v.const_value, InlineData) for v in model.graph.initializers.values())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    ir.save(model, elsewhere / "out.onnx")  # onnx_ir's own save: no reference to the input file
    src.unlink()
    x = np.random.default_rng(2).standard_normal((2, 1024)).astype(np.float32)
    w, v = (numpy_helper.to_array(t) for t in _model(fold=False).graph.initializer[:2])
    got = _run(elsewhere / "out.onnx", x)
    np.testing.assert_allclose(got[0], x @ w, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got[1], x @ v, rtol=1e-4, atol=1e-4)


def test_a_weight_file_changed_after_loading_is_refused(tmp_path: pathlib.Path, left_in_file: None) -> None:
    src = tmp_path / "m.onnx"
    onnx.save(_model(fold=False), src)
    model = modelio.load_model(src)
    src.write_bytes(src.read_bytes())  # the same bytes, a new modification time
    with pytest.raises(InputError, match="changed|replaced"):
        modelio.check_unchanged(model)


@pytest.mark.parametrize(
    ("mutate", "refused"),
    [
        (lambda t: t.metadata_props.add(key="k", value="v"), None),  # not a plain weight
        (lambda t: setattr(t, "data_location", TensorProto.DEFAULT), None),  # a field set, even to its default
        (lambda t: setattr(t, "doc_string", ""), None),  # an empty doc string, which onnx_ir would not write
        (lambda t: t.dims.__setitem__(0, 512), "raw_data has"),  # the wrong length: validation refuses it
    ],
    ids=["metadata", "data-location", "empty-doc", "wrong-length"],
)
def test_other_weights_are_parsed_as_before(
    tmp_path: pathlib.Path, left_in_file: None, mutate: object, refused: str | None
) -> None:
    proto = _model(fold=False)
    mutate(proto.graph.initializer[0])  # type: ignore[operator]
    src = tmp_path / "m.onnx"
    src.write_bytes(proto.SerializeToString())
    view = detach.read_view(src)
    assert [w.source.length for w in view.weights.values()] == [3 << 20]  # only v's
    if refused is not None:
        with pytest.raises(InputError, match=refused):
            modelio.load_model(src)
        return
    model = modelio.load_model(src)
    assert not isinstance(model.graph.initializers["w"].const_value, InlineData)
    assert isinstance(model.graph.initializers["v"].const_value, InlineData)


# --- folding into an array of its own ------------------------------------------------------------


def test_folding_a_weight_left_in_the_file_overwrites_its_array(tmp_path: pathlib.Path, left_in_file: None) -> None:
    src = tmp_path / "m.onnx"
    onnx.save(_model(fold=True), src)
    model = modelio.load_model(src)
    calls = []
    original = evaluate._in_place

    def spy(candidate, arrays):
        result = original(candidate, arrays)
        calls.append((candidate.op_type, result is not None and result[0] is arrays[0]))
        return result

    with mock.patch.object(evaluate, "_in_place", spy):
        ConstantFoldingPass()(model)
    assert ("Mul", True) in calls


_UNARY = ["Abs", "Neg", "Sqrt", "Exp", "Tanh", "Sigmoid", "Relu", "Floor", "Erf", "Softsign"]
_BINARY = ["Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "PRelu"]


class _Owned:
    """A stand-in candidate whose input 0 is an array it owns."""

    def __init__(self, op: str, n_inputs: int) -> None:
        self.op_type, self.domain, self.opset, self.attrs = op, "", 18, {}
        self.node = mock.Mock(outputs=[None])
        self.forgotten = False
        self.n_inputs = n_inputs

    def owns(self, index: int) -> bool:
        return index == 0

    def forget_arrays(self) -> None:
        self.forgotten = True


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    op=st.sampled_from(_UNARY + _BINARY),
    rows=st.integers(1, 40),
    cols=st.sampled_from([1, 3, 255, 4096]),
    other=st.sampled_from(["full", "row", "column", "scalar"]),
    dtype=st.sampled_from([np.float32, np.float16, np.float64]),
    seed=st.integers(0, 2**16),
)
def test_blocks_give_the_whole_evaluation_bit_for_bit(
    op: str, rows: int, cols: int, other: str, dtype: type, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, cols)) * 3).astype(dtype)
    if op in ("Sqrt", "Pow"):
        x = np.abs(x)
    arrays = [x]
    if op in _BINARY:
        shape = {"full": (rows, cols), "row": (1, cols), "column": (rows, 1), "scalar": ()}[other]
        if op == "PRelu" and other == "column":
            shape = (cols,)
        arrays.append((rng.standard_normal(shape) + 0.5).astype(dtype))
    want = refimpl.run(op, [a.copy() for a in arrays], {}, opset=18, domain="", num_outputs=1)[0]
    candidate = _Owned(op, len(arrays))
    with mock.patch.object(evaluate, "IN_PLACE_OVER", 0), mock.patch.object(evaluate, "BLOCK", 3 * x[0].nbytes):
        got = evaluate._in_place(candidate, arrays)  # type: ignore[arg-type]
    assert got is not None and got[0] is x and candidate.forgotten
    np.testing.assert_array_equal(got[0], want)
    assert got[0].dtype == want.dtype


def test_an_op_changing_the_dtype_is_evaluated_whole() -> None:
    x = np.ones((8, 4), np.float32)
    with mock.patch.object(evaluate, "IN_PLACE_OVER", 0):
        assert evaluate._in_place(_Owned("Less", 2), [x, np.float32(2)]) is None  # type: ignore[arg-type]
    np.testing.assert_array_equal(x, 1)  # untouched


# --- differential fuzzing of the walk ----------------------------------------------------------------


@pytest.fixture(scope="module")
def seed_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, list[tuple[int, int]]]:
    """A model with two weights of just over 1 MiB left in the file, and where their data is (not worth
    mutating: the walk does not read it)."""
    rng = np.random.default_rng(3)
    w, v = (numpy_helper.from_array(rng.standard_normal((520, 520)).astype(np.float32), n) for n in "wv")
    nodes = [helper.make_node("Mul", ["w", "half"], ["wm"]), helper.make_node("MatMul", ["x", "wm"], ["y"]),
             helper.make_node("MatMul", ["x", "v"], ["z"])]  # fmt: skip
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [1, 520])],
                              [helper.make_tensor_value_info("y", F, [1, 520]),
                               helper.make_tensor_value_info("z", F, [1, 520])],
                              [w, v, numpy_helper.from_array(np.array(0.5, np.float32), "half")])  # fmt: skip
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8).SerializeToString()
    path = tmp_path_factory.mktemp("seed") / "m.onnx"
    path.write_bytes(data)
    with mock.patch.object(detach, "MIN_FILE", 0):
        view = detach.read_view(path)
    return data, [(w.source.offset, w.source.offset + w.source.length) for w in view.weights.values()]


def _outcome(path: pathlib.Path, min_file: int) -> bytes | str:
    """The saved bytes of the loaded model, or the error: what the user would get."""
    with mock.patch.object(detach, "MIN_FILE", min_file):
        try:
            model = modelio.load_model(path)
        except InputError as e:
            return str(e)
        out = path.with_name(f"out{min_file}.onnx")
        modelio.save_model(model, out)
        return out.read_bytes()


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_the_walk_and_a_full_parse_agree_on_mutated_headers(
    tmp_path: pathlib.Path, seed_model: tuple[bytes, list[tuple[int, int]]], data: st.DataObject
) -> None:
    raw, payloads = seed_model
    buf = bytearray(raw)
    bounds = [0, *(x for payload in sorted(payloads) for x in payload), len(buf)]
    outside = list(zip(bounds[::2], bounds[1::2]))  # the bytes the walk reads: all but the weights' data
    for _ in range(data.draw(st.integers(1, 3), label="edits")):
        start, end = data.draw(st.sampled_from([o for o in outside if o[0] < min(o[1], len(buf))]), label="part")
        at = data.draw(st.integers(start, min(end, len(buf)) - 1), label="at")
        kind = data.draw(st.sampled_from(["flip", "set", "delete"]), label="edit")
        if kind == "flip":
            buf[at] ^= 1 << data.draw(st.integers(0, 7), label="bit")
        elif kind == "set":
            buf[at] = data.draw(st.integers(0, 255), label="byte")
        else:
            del buf[at]  # (later parts shift by one: close enough for choosing where to edit)
    path = tmp_path / f"m{data.draw(st.integers(0, 10**9), label='name')}.onnx"
    path.write_bytes(bytes(buf))
    try:
        walked, parsed = _outcome(path, 0), _outcome(path, 1 << 62)
    finally:  # 120 examples of 2 MB each, and their outputs
        for leftover in tmp_path.glob(f"{path.stem}*"):
            leftover.unlink()
        for leftover in tmp_path.glob("out*.onnx"):
            leftover.unlink()
    event("refused" if isinstance(parsed, str) else "loaded")
    if isinstance(parsed, str):
        assert isinstance(walked, str), "the walk accepted a model the full parse refuses"
    else:
        assert walked == parsed
