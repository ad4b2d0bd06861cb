"""Opset 1-6 models: the legacy broadcasting that opset 7 replaced, against numbers onnxruntime cannot give.

onnxruntime does not run opset-6 ops, so these originals cannot be compared
with their upgrades there. The oracles are numpy (the legacy rule written out:
B aligned with A at ``axis``; a PRelu slope of C values per channel) and the
expected outputs onnx ships with its PyTorch-exported backend cases.
"""

from __future__ import annotations

import copy
import functools
import pathlib

import numpy as np
import onnx
import onnx.numpy_helper
import onnx_ir as ir
import pytest
from helpers import ort_run
import onnxruntime as ort
from onnx import TensorProto, helper

import passes
from passes.errors import UpgradeError
from passes.upgrade import UpgradeOpsetPass

F = TensorProto.FLOAT
_LEGACY = ("Add", "Sub", "Mul", "Div", "Pow", "Greater", "Less", "Or", "Gemm", "BatchNormalization", "PRelu")
RNG = np.random.default_rng(6)
BACKEND = pathlib.Path(onnx.__file__).parent / "backend" / "test" / "data"
#: Cases whose expected outputs onnxruntime cannot give for reasons of its own.
ORT_CANNOT = {
    "simple/test_gradient_of_add": "ai.onnx.preview.training Gradient has no onnxruntime kernel",
    "simple/test_gradient_of_add_and_mul": "ai.onnx.preview.training Gradient has no onnxruntime kernel",
}


def _model(nodes, inputs, outputs, initializers=(), opset: int = 6) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "legacy", inputs, outputs, initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=3 if opset < 7 else 8)


def _io(name: str, shape, elem=F) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _upgrade(model: onnx.ModelProto, target: int = 18) -> onnx.ModelProto:
    result = UpgradeOpsetPass(target)(ir.from_proto(copy.deepcopy(model)))
    out = ir.to_proto(result.model)
    onnx.checker.check_model(out, full_check=True)
    return out


def _ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def _attr_names(model: onnx.ModelProto, ops: tuple[str, ...] = _LEGACY) -> set[str]:
    """The attribute names of the model's nodes of ``ops``."""
    return {a.name for n in model.graph.node if n.op_type in ops for a in n.attribute}


def _array(shape) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


# --- Add/Sub/Mul/Div/Pow and the comparisons: broadcast and axis --------------------------------


@pytest.mark.parametrize("b_is_constant", [False, True])
@pytest.mark.parametrize("op_type", ["Add", "Sub", "Mul", "Div"])
def test_broadcast_at_an_inner_axis_aligns_b_there(op_type: str, b_is_constant: bool) -> None:
    a, b = _array((2, 3, 4, 5)), _array((3, 4))
    node = helper.make_node(op_type, ["a", "b"], ["y"], broadcast=1, axis=1)
    inits = [onnx.numpy_helper.from_array(b, "b")] if b_is_constant else []
    inputs = [_io("a", [2, 3, 4, 5])] + ([] if b_is_constant else [_io("b", [3, 4])])
    model = _model([node], inputs, [_io("y", [2, 3, 4, 5])], inits, opset=6)
    if b_is_constant:
        model.ir_version = 4  # b is a constant, not an input a caller may override
    out = _upgrade(model)
    feeds = {"a": a} if b_is_constant else {"a": a, "b": b}
    expected = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide}[op_type](a, b[:, :, None])
    np.testing.assert_array_equal(ort_run(out, feeds)[0], expected)
    assert not {"broadcast", "axis"} & _attr_names(out)
    if b_is_constant:
        assert _ops(out) == [op_type]
        assert [list(t.dims) for t in out.graph.initializer if t.name in out.graph.node[0].input] == [[3, 4, 1]]
    else:
        assert _ops(out) == ["Shape", "Concat", "Reshape", op_type]


@pytest.mark.parametrize("attributes", [{}, {"broadcast": 1}, {"broadcast": 1, "axis": 2}, {"broadcast": 0}])
def test_broadcast_that_numpy_already_reads_the_same_way_only_loses_its_attributes(attributes) -> None:
    a = _array((2, 3, 4))
    b = a * 0.5 + 1 if not attributes.get("broadcast") else _array((4,))  # axis 2 of a rank-3 A: the last
    node = helper.make_node("Mul", ["a", "b"], ["y"], **attributes)
    model = _model([node], [_io("a", [2, 3, 4]), _io("b", list(b.shape))], [_io("y", [2, 3, 4])])
    out = _upgrade(model)
    assert _ops(out) == ["Mul"] and not _attr_names(out)
    np.testing.assert_array_equal(ort_run(out, {"a": a, "b": b})[0], a * b)


def test_comparisons_and_logic_ops_lose_legacy_broadcast_too() -> None:
    a, b = _array((2, 3, 4)), _array((3,))
    nodes = [helper.make_node("Greater", ["a", "b"], ["g"], broadcast=1, axis=1),
             helper.make_node("Less", ["a", "b"], ["l"], broadcast=1, axis=1),
             helper.make_node("Or", ["g", "l"], ["y"])]  # fmt: skip
    model = _model(nodes, [_io("a", [2, 3, 4]), _io("b", [3])], [_io("y", [2, 3, 4], TensorProto.BOOL)], opset=6)
    out = _upgrade(model)
    np.testing.assert_array_equal(ort_run(out, {"a": a, "b": b})[0], (a > b[:, None]) | (a < b[:, None]))
    assert not {"broadcast", "axis"} & _attr_names(out)


def test_pow_of_opset_1_with_an_axis() -> None:
    a, b = np.abs(_array((2, 3, 4))) + 0.5, _array((2,))
    model = _model([helper.make_node("Pow", ["a", "b"], ["y"], broadcast=1, axis=0)],
                   [_io("a", [2, 3, 4]), _io("b", [2])], [_io("y", [2, 3, 4])], opset=1)  # fmt: skip
    out = _upgrade(model)
    np.testing.assert_allclose(ort_run(out, {"a": a, "b": b})[0], a ** b[:, None, None], rtol=1e-6)


def test_broadcast_at_an_axis_with_an_unknown_rank_is_refused() -> None:
    node = helper.make_node("Add", ["a", "b"], ["y"], broadcast=1, axis=1)
    model = _model([node], [_io("a", None), _io("b", [3])], [_io("y", None)])
    with pytest.raises(UpgradeError, match="Add-7: broadcast at an axis needs the ranks"):
        _upgrade(model)


def test_broadcast_at_an_axis_past_the_rank_is_refused() -> None:
    node = helper.make_node("Add", ["a", "b"], ["y"], broadcast=1, axis=2)
    model = _model([node], [_io("a", [2, 3]), _io("b", [3])], [_io("y", [2, 3])])
    with pytest.raises(UpgradeError, match="does not fit"):
        _upgrade(model)


# --- Gemm, BatchNormalization, PRelu ----------------------------------------------------------


@pytest.mark.parametrize("broadcast", [0, 1])
def test_gemm_drops_broadcast(broadcast: int) -> None:
    a, b = _array((4, 5)), _array((6, 5))
    c = _array((4, 6)) if broadcast == 0 else _array((6,))
    node = helper.make_node("Gemm", ["a", "b", "c"], ["y"], transB=1, broadcast=broadcast, alpha=0.5)
    model = _model([node], [_io("a", [4, 5]), _io("b", [6, 5]), _io("c", list(c.shape))], [_io("y", [4, 6])])
    out = _upgrade(model)
    assert _ops(out) == ["Gemm"] and "broadcast" not in _attr_names(out)
    np.testing.assert_allclose(ort_run(out, {"a": a, "b": b, "c": c})[0], 0.5 * a @ b.T + c, rtol=1e-5, atol=1e-6)


def test_batchnorm_in_test_mode_drops_is_test() -> None:
    x = _array((2, 3, 4, 4))
    scale, bias, mean, var = _array(3), _array(3), _array(3), np.abs(_array(3)) + 0.5
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], is_test=1, epsilon=1e-3)
    inits = [onnx.numpy_helper.from_array(a, n) for a, n in ((scale, "s"), (bias, "b"), (mean, "m"), (var, "v"))]
    model = _model([node], [_io("x", [2, 3, 4, 4])], [_io("y", [2, 3, 4, 4])], inits)
    model.ir_version = 4
    out = _upgrade(model)
    assert _ops(out) == ["BatchNormalization"] and "is_test" not in _attr_names(out)
    c = (slice(None), None, None)
    expected = (x - mean[c]) / np.sqrt(var[c] + 1e-3) * scale[c] + bias[c]
    np.testing.assert_allclose(ort_run(out, {"x": x})[0], expected, rtol=1e-5, atol=1e-5)


def test_batchnorm_training_mode_with_one_output_is_refused() -> None:
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], is_test=0)
    model = _model([node], [_io(n, [2, 3, 4, 4] if n == "x" else [3]) for n in "xsbmv"], [_io("y", [2, 3, 4, 4])])
    with pytest.raises(UpgradeError, match="is_test=0 .training mode. with 1 outputs has no equivalent"):
        _upgrade(model)


@pytest.mark.parametrize("slope_is_constant", [False, True])
@pytest.mark.parametrize("x_shape", [(2, 3), (2, 3, 3), (2, 3, 4, 5)])
def test_prelu_slope_of_c_values_stays_per_channel(x_shape, slope_is_constant: bool) -> None:
    x, slope = _array(x_shape), np.abs(_array((3,))) + 0.1
    inits = [onnx.numpy_helper.from_array(slope, "s")] if slope_is_constant else []
    inputs = [_io("x", list(x_shape))] + ([] if slope_is_constant else [_io("s", [3])])
    model = _model([helper.make_node("PRelu", ["x", "s"], ["y"])], inputs, [_io("y", list(x_shape))], inits)
    if slope_is_constant:
        model.ir_version = 4
    out = _upgrade(model)
    per_channel = slope.reshape((3,) + (1,) * (len(x_shape) - 2))
    feeds = {"x": x} if slope_is_constant else {"x": x, "s": slope}
    # (2, 3, 3): numpy's rule would silently use the slope along the last axis.
    np.testing.assert_array_equal(ort_run(out, feeds)[0], np.where(x < 0, per_channel * x, x))


def test_prelu_slope_of_another_rank_is_refused() -> None:
    model = _model([helper.make_node("PRelu", ["x", "s"], ["y"])], [_io("x", [2, 3, 4, 5]), _io("s", [3, 4])],
                   [_io("y", [2, 3, 4, 5])])  # fmt: skip
    with pytest.raises(UpgradeError, match="PRelu-7: a rank-2 slope"):
        _upgrade(model)


def test_a_model_at_opset_7_is_not_touched_by_the_legacy_adapters() -> None:
    x, slope = _array((2, 3, 3)), _array((3,))
    model = _model([helper.make_node("PRelu", ["x", "s"], ["y"])], [_io("x", [2, 3, 3]), _io("s", [3])],
                   [_io("y", [2, 3, 3])], opset=7)  # fmt: skip
    out = _upgrade(model)
    assert _ops(out) == ["PRelu"] and len(out.graph.node[0].input) == 2 and out.graph.node[0].input[1] == "s"
    np.testing.assert_array_equal(ort_run(out, {"x": x, "s": slope})[0], ort_run(model, {"x": x, "s": slope})[0])


# --- onnx's PyTorch-exported backend cases ----------------------------------------------------


def _backend_cases() -> list[pathlib.Path]:
    return [d for kind in ("pytorch-converted", "pytorch-operator", "simple")
            for d in sorted((BACKEND / kind).iterdir()) if (d / "model.onnx").exists()]  # fmt: skip


@functools.cache
def _string_normalizer_locale_error(case_change_action: str | None, locale: str | None) -> str | None:
    """Why onnxruntime cannot build a StringNormalizer with these attributes here (None: it can).

    onnxruntime constructs the C++ locale (``en_US.UTF-8`` when the attribute is
    absent) at session creation when the node changes case, and fails where the
    machine lacks it; a node that changes no case needs no locale and runs.
    """
    attrs = {k: v for k, v in (("case_change_action", case_change_action), ("locale", locale)) if v is not None}
    node = helper.make_node("StringNormalizer", ["x"], ["y"], **attrs)
    graph = helper.make_graph([node], "probe", [_io("x", [1], TensorProto.STRING)], [_io("y", None, TensorProto.STRING)])
    probe = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 10)], ir_version=5)
    options = ort.SessionOptions()
    options.log_severity_level = 4
    try:
        session = ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
        session.run(None, {"x": np.array(["A"], dtype=object)})
    except Exception as error:  # onnxruntime raises its own Fail type
        message = str(error).splitlines()[0]
        return message[message.find("Failed"):][:120] if "Failed" in message else message[-120:]
    return None


def _string_attribute(node: onnx.NodeProto, name: str) -> str | None:
    return next((helper.get_attribute_value(a).decode() for a in node.attribute if a.name == name), None)


def _case_id(path: pathlib.Path) -> str:
    return f"{path.parent.name}/{path.name}"


def _tensors(folder: pathlib.Path, prefix: str) -> list[np.ndarray]:
    files = sorted(folder.glob(f"{prefix}_*.pb"), key=lambda p: int(p.stem.split("_")[1]))
    return [onnx.numpy_helper.to_array(onnx.load_tensor(str(f))) for f in files]


def _assert_gradient_kept(model: onnx.ModelProto, out: onnx.ModelProto) -> None:
    """``Gradient`` (ai.onnx.preview.training) names the values it differentiates in its ``xs`` and
    ``y`` attributes: onnxruntime has no kernel to run it, so the test checks that the node is kept as
    it was and that every value it names is still in the graph under that name."""
    onnx.checker.check_model(out, full_check=True)
    (before,) = [n for n in model.graph.node if n.op_type == "Gradient"]
    (after,) = [n for n in out.graph.node if n.op_type == "Gradient"]
    assert list(after.input) == list(before.input) and list(after.output) == list(before.output)
    assert {a.name: helper.get_attribute_value(a) for a in after.attribute} == {
        a.name: helper.get_attribute_value(a) for a in before.attribute}
    named = {*(x.decode() for a in after.attribute if a.name == "xs" for x in a.strings),
             *(a.s.decode() for a in after.attribute if a.name == "y")}
    present = {i.name for i in out.graph.input} | {o for n in out.graph.node for o in n.output}
    assert named <= present, named - present


@pytest.mark.parametrize("case", _backend_cases(), ids=_case_id)
def test_backend_case_after_optimize_gives_its_expected_outputs(case: pathlib.Path) -> None:
    model = onnx.load(case / "model.onnx")
    if _case_id(case) in ORT_CANNOT:  # no kernel: the Gradient node and the names it refers to must survive
        _assert_gradient_kept(model, passes.optimize(model, check=False))
        return
    for node in model.graph.node:
        if node.op_type == "StringNormalizer" and (error := _string_normalizer_locale_error(
                _string_attribute(node, "case_change_action"), _string_attribute(node, "locale"))):
            pytest.skip(f"onnxruntime cannot build StringNormalizer's locale on this machine: {error}")
    out = passes.optimize(model, check=False)  # onnxruntime cannot run the opset-6 originals
    onnx.checker.check_model(out, full_check=True)
    initializers = {t.name for t in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in initializers]
    data = case / "test_data_set_0"
    got = ort_run(out, dict(zip(names, _tensors(data, "input"))))
    expected = _tensors(data, "output")
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.shape == e.shape and g.dtype == e.dtype
        if e.dtype.kind == "f":
            np.testing.assert_allclose(g, e, rtol=1e-3, atol=1e-5, equal_nan=True)
        else:
            np.testing.assert_array_equal(g, e)


def test_an_opset_1_model_loses_consumed_inputs_and_its_reshape_attribute() -> None:
    """Opsets 1-5: ``consumed_inputs`` was an in-place hint; Reshape-1 took its shape as an attribute."""
    x = _array((2, 12))
    scale, bias, mean, var = _array(3), _array(3), _array(3), np.abs(_array(3)) + 0.5
    nodes = [helper.make_node("Reshape", ["x"], ["r"], shape=[2, 3, 4], consumed_inputs=[1]),
             helper.make_node("Relu", ["r"], ["a"], consumed_inputs=[1]),
             helper.make_node("BatchNormalization", ["a", "s", "b", "m", "v"], ["n"], is_test=1, epsilon=1e-3,
                              consumed_inputs=[0, 0, 0, 1, 1]),
             helper.make_node("Add", ["n", "b"], ["y"], broadcast=1, axis=1, consumed_inputs=[0, 0])]  # fmt: skip
    inits = [onnx.numpy_helper.from_array(a, n) for a, n in ((scale, "s"), (bias, "b"), (mean, "m"), (var, "v"))]
    model = _model(nodes, [_io("x", [2, 12])], [_io("y", [2, 3, 4])], inits, opset=1)
    model.ir_version = 4
    model.graph.value_info.append(_io("n", [2, 3, 4]))  # onnx infers no shape through Reshape-1
    out = _upgrade(model)
    assert _ops(out) == ["Reshape", "Relu", "BatchNormalization", "Add"]
    assert not {"consumed_inputs", "shape", "is_test", "broadcast", "axis"} & {
        a.name for n in out.graph.node for a in n.attribute}
    c = (slice(None), None)
    a = np.maximum(x.reshape(2, 3, 4), 0)
    expected = (a - mean[c]) / np.sqrt(var[c] + 1e-3) * scale[c] + bias[c] + bias[c]
    np.testing.assert_allclose(ort_run(out, {"x": x})[0], expected, rtol=1e-5, atol=1e-5)


def test_pad_1_paddings_become_pads() -> None:
    x = _array((2, 3))
    model = _model([helper.make_node("Pad", ["x"], ["y"], paddings=[0, 1, 1, 2], value=0.5)],
                   [_io("x", [2, 3])], [_io("y", [3, 6])], opset=1)  # fmt: skip
    out = _upgrade(model)
    np.testing.assert_array_equal(ort_run(out, {"x": x})[0], np.pad(x, [(0, 1), (1, 2)], constant_values=0.5))


def test_dropout_6_in_test_mode_copies_and_training_mode_is_refused() -> None:
    x = _array((2, 3))
    model = _model([helper.make_node("Dropout", ["x"], ["y"], is_test=1, ratio=0.3)], [_io("x", [2, 3])],
                   [_io("y", [2, 3])])  # fmt: skip
    np.testing.assert_array_equal(ort_run(_upgrade(model), {"x": x})[0], x)
    model.graph.node[0].attribute[0].i = 0
    with pytest.raises(UpgradeError, match="Dropout-7: is_test=0 .a random dropout."):
        _upgrade(model)


@pytest.mark.parametrize("op_type", ["RNN", "GRU", "LSTM"])
def test_recurrent_ops_lose_output_sequence(op_type: str) -> None:
    """The upgraded opset-1/3 node computes what the same node written at opset 7 computes."""
    gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[op_type]
    hidden, size = 4, 3
    x = _array((5, 2, size))
    w, r = _array((1, gates * hidden, size)) * 0.5, _array((1, gates * hidden, hidden)) * 0.5
    inits = [onnx.numpy_helper.from_array(w, "w"), onnx.numpy_helper.from_array(r, "r")]
    outputs = ["y", "y_h"] + (["y_c"] if op_type == "LSTM" else [])
    infos = [_io("y", [5, 1, 2, hidden])] + [_io(name, [1, 2, hidden]) for name in outputs[1:]]

    def build(opset: int, **extra) -> onnx.ModelProto:
        node = helper.make_node(op_type, ["x", "w", "r"], outputs, hidden_size=hidden, **extra)
        built = _model([node], [_io("x", [5, 2, size])], infos, inits, opset=opset)
        built.ir_version = 4
        return built

    old = build(3 if op_type == "GRU" else 1, output_sequence=1)
    reference = build(7)
    got, want = ort_run(_upgrade(old), {"x": x}), ort_run(reference, {"x": x})
    assert "output_sequence" not in {a.name for n in _upgrade(old).graph.node for a in n.attribute}
    for g, e in zip(got, want):
        np.testing.assert_array_equal(g, e)


def _scan_8() -> onnx.ModelProto:
    """A Scan-8 running sum (batch axis first, the empty ``sequence_lens``): no adapter to Scan-9."""
    body = helper.make_graph(
        [helper.make_node("Add", ["sum_in", "next"], ["sum_out"]),
         helper.make_node("Identity", ["sum_out"], ["scan_out"])],
        "body", [_io("sum_in", [2]), _io("next", [2])], [_io("sum_out", [2]), _io("scan_out", [2])],
    )  # fmt: skip
    scan = helper.make_node("Scan", ["", "initial", "x"], ["y", "z"], body=body, num_scan_inputs=1)
    return _model([scan], [_io("initial", [1, 2]), _io("x", [1, 3, 2])], [_io("y", [1, 2]), _io("z", [1, 3, 2])],
                  opset=8)  # fmt: skip


def test_a_refused_upgrade_names_the_way_to_keep_the_opset(tmp_path: pathlib.Path, capsys) -> None:
    from passes import cli

    src, out = tmp_path / "scan8.onnx", tmp_path / "out.onnx"
    onnx.save(_scan_8(), src)
    assert cli.main([str(src), "-o", str(out), "-q"]) == 2 and not out.exists()
    err = capsys.readouterr().err
    assert "cannot upgrade Scan node" in err and "--skip upgrade keeps opset 8" in err, err
    assert len(err.strip().splitlines()) == 1
    # What the hint says works: the model stays at opset 8 and computes the same.
    assert cli.main([str(src), "-o", str(out), "-q", "--skip", "upgrade"]) == 0
    written = onnx.load(out)
    assert {o.domain: o.version for o in written.opset_import}[""] == 8
    feeds = {"initial": _array((1, 2)), "x": _array((1, 3, 2))}
    for a, b in zip(ort_run(_scan_8(), feeds), ort_run(written, feeds), strict=True):
        np.testing.assert_array_equal(a, b)
