"""Hostile and broken models never crash the tool, never corrupt a file, never lose data.

Every malformed input ends in exit 2 with one ``optimize: error:`` line, no
traceback, no output and the input unchanged; external data outside the
model's folder is refused without being opened; a valid model a pass cannot
handle is left as it is (fold) or refused (upgrade); output is deterministic
and idempotent; an interrupt at any time leaves no partial output.

``test_cli.py`` already covers: a missing file, a text file, an empty file,
truncated models, missing and truncated external data, ``../`` and absolute
external locations, a missing output folder, an opset newer than onnx knows
and an undefined input. This file covers the rest.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time
import types
from collections.abc import Callable

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import helpers
from passes import cli, modelio, pipeline

REPO = pathlib.Path(__file__).resolve().parent.parent
DEMO = REPO / "models" / "demo.onnx"
OPSET = 13

X = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
Y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])


def make_model(
    nodes: list[onnx.NodeProto],
    *,
    inputs: list[onnx.ValueInfoProto] | None = None,
    outputs: list[onnx.ValueInfoProto] | None = None,
    initializers: list[onnx.TensorProto] = (),
    opset: int | None = OPSET,
    ir_version: int = 8,
    functions: list[onnx.FunctionProto] = (),
    extra_opsets: dict[str, int] | None = None,
) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs or [X], outputs or [Y], initializer=list(initializers))
    opsets = [helper.make_opsetid("", opset)] if opset is not None else []
    opsets += [helper.make_opsetid(d, v) for d, v in (extra_opsets or {}).items()]
    return helper.make_model(graph, opset_imports=opsets, ir_version=ir_version, functions=list(functions))


def add_w(w: onnx.TensorProto, **kwargs) -> onnx.ModelProto:
    """y = x + w."""
    return make_model([helper.make_node("Add", ["x", w.name], ["y"], name="add")], initializers=[w], **kwargs)


def weights(values: np.ndarray | None = None, name: str = "w") -> onnx.TensorProto:
    return numpy_helper.from_array(np.arange(4, dtype=np.float32) if values is None else values, name)


def external(tensor: onnx.TensorProto, location: str, **keys: str) -> onnx.TensorProto:
    """``tensor`` with its data moved to ``location`` (the caller writes the file)."""
    tensor.ClearField("raw_data")
    tensor.ClearField("float_data")
    tensor.data_location = TensorProto.EXTERNAL
    tensor.external_data.add(key="location", value=location)
    for key, value in keys.items():
        tensor.external_data.add(key=key, value=value)
    return tensor


# --- running the command and checking the invariants --------------------------------------------


def snapshot(folder: pathlib.Path) -> dict[str, bytes]:
    """Every regular file under ``folder`` (symlinks and FIFOs are not read)."""
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not p.is_symlink() and p.stat().st_size < 2**30
    }


def leftovers(folder: pathlib.Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def one_error_line(err: str) -> str:
    assert "Traceback" not in err, err
    assert "internal error" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("optimize: error:")]
    assert len(errors) == 1, err
    return errors[0]


def expect_refusal(
    capfd: pytest.CaptureFixture[str], src: pathlib.Path, *extra: str, needle: str,
    out: pathlib.Path | None = None,
) -> str:
    """Runs the command in-process; asserts exit 2, one error line containing ``needle``,
    no output, no temporary folder and the input folder unchanged."""
    folder = src.parent
    out = out or folder / "out.onnx"
    before = snapshot(folder)
    code = cli.main([str(src), "-o", str(out), *extra])
    line = one_error_line(capfd.readouterr().err)
    assert code == 2, line
    assert needle.lower() in line.lower(), line
    assert not out.exists() or out.name in before
    assert snapshot(folder) == before
    assert leftovers(folder) == []
    return line


# --- malformed inputs -------------------------------------------------------------------------


def _cycle() -> onnx.ModelProto:
    return make_model([
        helper.make_node("Add", ["x", "b"], ["a"], name="n1"),
        helper.make_node("Relu", ["a"], ["b"], name="n2"),
        helper.make_node("Relu", ["a"], ["y"], name="n3"),
    ])


def _function(body: list[onnx.NodeProto], *, opset: int = OPSET, name: str = "F") -> onnx.FunctionProto:
    return helper.make_function("local", name, ["a"], ["b"], body,
                                [helper.make_opsetid("", opset), helper.make_opsetid("local", 1)])


def _calling(function: onnx.FunctionProto, *more: onnx.FunctionProto) -> onnx.ModelProto:
    return make_model([helper.make_node(function.name, ["x"], ["y"], domain="local")],
                      functions=[function, *more], extra_opsets={"local": 1})


def _axes_from(alpha: onnx.AttributeProto | None, default: onnx.AttributeProto | None = None) -> onnx.ModelProto:
    """A function whose ReduceMax takes ``axes`` (INTS) from its attribute ``alpha``, called with
    ``alpha`` (the field fuzzer's case: a FLOAT given where the reference says INTS), or by default."""
    reduce = helper.make_node("ReduceMax", ["a"], ["b"], name="rmax", keepdims=1)
    reduce.attribute.append(helper.make_attribute_ref("axes", onnx.AttributeProto.INTS))
    reduce.attribute[-1].ref_attr_name = "alpha"
    function = helper.make_function("local", "Act", ["a"], ["b"], [reduce], [helper.make_opsetid("", 13)],
                                    attributes=[] if default else ["alpha"],
                                    attribute_protos=[default] if default else None)  # fmt: skip
    call = helper.make_node("Act", ["x"], ["y"], name="act", domain="local")
    if alpha is not None:
        call.attribute.append(alpha)
    return make_model([call], functions=[function], extra_opsets={"local": 1}, opset=13)


def _if_model(then_nodes: list[onnx.NodeProto], then_inits: list[onnx.TensorProto] = ()) -> onnx.ModelProto:
    then_graph = helper.make_graph(then_nodes, "then", [], [helper.make_tensor_value_info("t", TensorProto.FLOAT, [4])],
                                   initializer=list(then_inits))
    else_graph = helper.make_graph([helper.make_node("Relu", ["x"], ["e"])], "else", [],
                                   [helper.make_tensor_value_info("e", TensorProto.FLOAT, [4])])
    cond = helper.make_tensor_value_info("cond", TensorProto.BOOL, [])
    return make_model([helper.make_node("If", ["cond"], ["y"], then_branch=then_graph, else_branch=else_graph)],
                      inputs=[X, cond])


def _if_model_with_ref() -> onnx.ModelProto:
    model = _if_model([helper.make_node("Relu", ["x"], ["t"])])
    model.graph.node[0].attribute[0].ref_attr_name = "alpha"  # only meaningful inside a function
    return model


def _with_ir(model: onnx.ModelProto, ir_version: int) -> onnx.ModelProto:
    model.ir_version = ir_version
    return model


def _raw(data: bytes) -> onnx.TensorProto:
    w = weights()
    w.raw_data = data
    return w


def _typed(field: str, values: list, data_type: int = TensorProto.FLOAT) -> onnx.TensorProto:
    w = helper.make_tensor("w", data_type, [4], np.zeros(4))
    w.ClearField("raw_data")
    for f in ("float_data", "int32_data", "int64_data", "double_data"):
        w.ClearField(f)
    getattr(w, field).extend(values)
    return w


def _with(tensor: onnx.TensorProto, **fields) -> onnx.TensorProto:
    for key, value in fields.items():
        if key == "dims":
            tensor.dims[:] = value
        else:
            setattr(tensor, key, value)
    return tensor


def _extended(tensor: onnx.TensorProto, field: str, values: list) -> onnx.TensorProto:
    getattr(tensor, field).extend(values)
    return tensor


def _constant_with(tensor: onnx.TensorProto) -> onnx.ModelProto:
    return make_model([helper.make_node("Constant", [], ["c"], value=tensor),
                       helper.make_node("Add", ["x", "c"], ["y"])])


def _bytes_of(message) -> Callable[[], bytes]:
    return lambda: message().SerializeToString()


def _invalid_utf8_producer() -> bytes:
    data = bytearray(make_model([helper.make_node("Relu", ["x"], ["y"])], ).SerializeToString())
    model = onnx.ModelProto()
    model.ParseFromString(bytes(data))
    model.producer_name = "optimize-test"
    data = bytearray(model.SerializeToString())
    at = data.index(b"optimize-test")
    data[at] = 0xEF  # the first byte of a three-byte UTF-8 sequence, not followed by one
    return bytes(data)


MALFORMED: dict[str, tuple[Callable[[], bytes], str]] = {
    # not a model
    "random_bytes": (lambda: np.random.default_rng(0).bytes(4096), "not"),
    "serialized_tensor_proto": (lambda: weights().SerializeToString(), "not"),
    "serialized_graph_proto": (lambda: add_w(weights()).graph.SerializeToString(), "not an onnx model"),
    "one_byte_short": (lambda: add_w(weights()).SerializeToString()[:-1], "not a valid onnx model"),
    "invalid_utf8_text": (_invalid_utf8_producer, "utf-8"),
    # graph structure
    "node_cycle": (_bytes_of(_cycle), "topologically sorted"),
    "undefined_input_in_subgraph": (_bytes_of(lambda: _if_model([helper.make_node("Relu", ["nope"], ["t"])])),
                                    "nope"),
    "two_nodes_same_output": (_bytes_of(lambda: make_model([
        helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Abs", ["x"], ["y"])])), "single static"),
    "node_output_shadows_initializer": (_bytes_of(lambda: make_model(
        [helper.make_node("Relu", ["x"], ["w"]), helper.make_node("Add", ["x", "w"], ["y"])],
        initializers=[weights()])), "single static"),
    "duplicate_initializer": (_bytes_of(lambda: make_model(
        [helper.make_node("Add", ["x", "w"], ["y"])], initializers=[weights(), weights()])), "not unique"),
    "output_not_produced": (_bytes_of(lambda: make_model([helper.make_node("Relu", ["x"], ["z"])])), "'y'"),
    # found by the field fuzzer: the output declaration would become the input's (one value in onnx_ir)
    "pass_through_output_with_another_shape": (_bytes_of(lambda: make_model(
        [helper.make_node("Relu", ["x"], ["z"])],
        outputs=[helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 1])])), "declares another type"),
    "recursive_function": (_bytes_of(lambda: _calling(_function(
        [helper.make_node("F", ["a"], ["b"], domain="local")]))), "recursive"),
    "attribute_reference_outside_a_function": (_bytes_of(lambda: _if_model_with_ref()), "outside a function"),
    # found by the field fuzzer: the passes carried the mismatch into ops inference rejects (exit 1)
    "function_attribute_given_another_type": (_bytes_of(lambda: _axes_from(helper.make_attribute("alpha", 0.1))),
                                              "which node 'act' gives as FLOAT"),
    "function_attribute_default_of_another_type": (_bytes_of(lambda: _axes_from(
        None, helper.make_attribute("alpha", 0.5))), "whose default is FLOAT"),
    # ops and versions
    "unknown_op_default_domain": (_bytes_of(lambda: make_model([helper.make_node("FooBar", ["x"], ["y"])])),
                                  "FooBar"),
    "unknown_op_in_function": (_bytes_of(lambda: _calling(_function([helper.make_node("FooBar", ["a"], ["b"])]))),
                               "FooBar"),
    "opset_import_0": (_bytes_of(lambda: make_model([helper.make_node("Relu", ["x"], ["y"])], opset=0)),
                       "domain_version of 0"),
    "op_older_than_its_first_version": (_bytes_of(lambda: make_model([helper.make_node("Gelu", ["x"], ["y"])])),
                                        "Gelu"),
    "default_domain_imported_twice": (_bytes_of(lambda: make_model([helper.make_node("Relu", ["x"], ["y"])],
                                                                   extra_opsets={"ai.onnx": 7})), "imported twice"),
    "no_default_opset_import": (_bytes_of(lambda: make_model([helper.make_node("Relu", ["x"], ["y"])], opset=None)),
                                "opset_import"),
    "ir_version_newer_than_onnx": (_bytes_of(lambda: make_model([helper.make_node("Relu", ["x"], ["y"])],
                                                                ir_version=onnx.IR_VERSION + 1)), "ir_version"),
    "function_in_an_ir_version_without_functions": (_bytes_of(lambda: _with_ir(_calling(_function(
        [helper.make_node("Relu", ["a"], ["b"], alpha=0.5)])), 7)), "ir_version 8"),
    "function_opset_newer_than_onnx": (_bytes_of(lambda: _calling(_function(
        [helper.make_node("Relu", ["a"], ["b"])], opset=onnx.defs.onnx_opset_version() + 1))), "opset"),
    "inconsistent_types": (_bytes_of(lambda: make_model(
        [helper.make_node("Add", ["x", "i"], ["y"])],
        inputs=[X, helper.make_tensor_value_info("i", TensorProto.INT64, [4])])), "inconsistent type"),
    "invalid_attribute_value": (_bytes_of(lambda: make_model([helper.make_node("Transpose", ["x"], ["y"], perm=[3])])),
                                "perm"),
    "attribute_of_the_wrong_type": (_bytes_of(lambda: make_model(
        [helper.make_node("LeakyRelu", ["x"], ["y"], alpha="high")])), "attribute type"),
    # tensors whose data does not match their type and shape
    "raw_data_too_short": (_bytes_of(lambda: add_w(_raw(b"\0" * 15))), "raw_data has 15 bytes"),
    "raw_data_too_long": (_bytes_of(lambda: add_w(_raw(b"\0" * 17))), "raw_data has 17 bytes"),
    "float_data_too_few": (_bytes_of(lambda: add_w(_typed("float_data", [1.0, 2.0, 3.0]))), "float_data has 3"),
    "float_data_too_many": (_bytes_of(lambda: add_w(_typed("float_data", [1.0] * 5))), "float_data has 5"),
    "int64_data_too_many": (_bytes_of(lambda: make_model(
        [helper.make_node("Reshape", ["x", "s"], ["y"])],
        initializers=[_extended(helper.make_tensor("s", TensorProto.INT64, [1], [4]), "int64_data", [1])])),
        "int64_data has 2"),
    "data_in_two_fields": (_bytes_of(lambda: add_w(_with(_typed("float_data", [1.0] * 4), raw_data=b"\0" * 16))),
                           "several fields"),
    "data_in_the_wrong_field": (_bytes_of(lambda: add_w(_typed("int64_data", [1] * 4))), "int64_data"),
    "negative_dimension": (_bytes_of(lambda: add_w(_with(weights(), dims=[-4]))), "negative dimension"),
    "unknown_data_type": (_bytes_of(lambda: add_w(_with(weights(), data_type=99))), "data type 99"),
    "constant_value_too_long": (_bytes_of(lambda: _constant_with(_raw(b"\0" * 20))), "raw_data has 20 bytes"),
    "subgraph_initializer_too_short": (_bytes_of(lambda: _if_model(
        [helper.make_node("Add", ["x", "tw"], ["t"])], [_with(weights(name="tw"), raw_data=b"\0" * 8)])),
        "raw_data has 8 bytes"),
    "string_tensor_in_raw_data": (_bytes_of(lambda: make_model(
        [helper.make_node("Identity", ["s"], ["y"])],
        outputs=[helper.make_tensor_value_info("y", TensorProto.STRING, [1])],
        initializers=[_with(helper.make_tensor("s", TensorProto.STRING, [1], [b"abc"]), raw_data=b"abc")])),
        "string"),
    "huge_declared_shape_without_data": (_bytes_of(lambda: add_w(_with(_typed("float_data", []), dims=[2**40]))),
                                         "float_data has 0"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_model_is_refused(case: str, tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str]) -> None:
    build, needle = MALFORMED[case]
    src = tmp_path / "model.onnx"
    src.write_bytes(build())
    expect_refusal(capfd, src, needle=needle)
    expect_refusal(capfd, src, "--no-check", "--passes", "", needle=needle)


def test_input_that_is_not_a_regular_file(tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "m"
    (folder / "model.onnx").mkdir(parents=True)
    expect_refusal(capfd, folder / "model.onnx", needle="not a regular file", out=folder / "out.onnx")
    fifo = tmp_path / "model.onnx"
    os.mkfifo(fifo)  # opening it would block: the tool must refuse it without opening
    expect_refusal(capfd, fifo, needle="not a regular file")


def _bytes_read() -> int:
    """Bytes this process has read through read-like system calls (``rchar`` of ``/proc/self/io``)."""
    for line in pathlib.Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


def test_two_gigabyte_model_is_refused_by_its_size(tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "huge.onnx"
    with open(src, "wb") as f:
        f.truncate(2**31 + 10)  # a sparse file: no disk used, nothing worth reading
    before = src.stat()
    expect_refusal(capfd, src, needle="2 GB")  # the first run imports what a refusal needs (~17 MB of reads)
    read_before = _bytes_read()
    line = expect_refusal(capfd, src, needle="2 GB")
    read = _bytes_read() - read_before
    assert "external data" in line
    assert read < 1 << 20, f"the size guard must not read the file ({read} bytes read)"
    assert src.stat().st_size == before.st_size and src.stat().st_mtime == before.st_mtime


BAD_OPTIONS: dict[str, tuple[list[str], str]] = {
    "inputs_not_a_zip": (["--inputs", "{folder}/bad.npz"], "cannot read inputs"),
    "inputs_empty_file": (["--inputs", "{folder}/empty.npz"], "cannot read inputs"),
    "inputs_a_single_npy": (["--inputs", "{folder}/one.npy"], "not an .npz archive"),
    "inputs_with_objects": (["--inputs", "{folder}/objects.npz"], "cannot read inputs"),
    "negative_seed": (["--seed", "-1"], "--seed"),
    "negative_rtol": (["--rtol", "-1"], "--rtol"),
    "nan_atol": (["--atol", "nan"], "--atol"),
    "report_in_a_missing_folder": (["--report", "{folder}/no/such/report.json"], "--report"),
    "malformed_size": (["--fold-size-limit", "1.5.5M"], "invalid size"),
}


@pytest.mark.parametrize("case", sorted(BAD_OPTIONS))
def test_bad_option_values_are_refused(case: str, tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bad.npz").write_bytes(b"PK\x03\x04 not really a zip")
    (tmp_path / "empty.npz").write_bytes(b"")
    np.save(tmp_path / "one.npy", np.ones((2, 4, 8), np.float32))
    np.savez(tmp_path / "objects.npz", x=np.array([{}], dtype=object))
    src = tmp_path / "model.onnx"
    src.write_bytes(DEMO.read_bytes())
    args, needle = BAD_OPTIONS[case]
    try:
        expect_refusal(capfd, src, *[a.format(folder=tmp_path) for a in args], needle=needle)
    except SystemExit as e:  # argparse's own refusal: still exit 2 and one error line
        assert e.code == 2
        assert needle in one_error_line(capfd.readouterr().err)


# --- external data ------------------------------------------------------------------------------


EXTERNAL_CASES: dict[str, tuple[Callable[[], onnx.TensorProto], str]] = {
    # The model folder holds w.bin (the 16 bytes of w), a folder "sub", link.bin (a symlink to
    # ../secret.bin) and hard.bin (a hard link to it); see test_bad_external_data_is_refused.
    "length_too_short": (lambda: external(weights(), "w.bin", length="8"), "length 8 does not match"),
    "length_too_long": (lambda: external(weights(), "w.bin", length="32"), "truncated"),
    "length_shorter_than_file": (lambda: external(weights(), "w.bin"), "does not match"),
    "offset_negative": (lambda: external(weights(), "w.bin", offset="-4"), "offset '-4'"),
    "offset_not_a_number": (lambda: external(weights(), "w.bin", offset="4k"), "offset '4k'"),
    "location_given_twice": (lambda: _extended(external(weights(), "w.bin"), "external_data", [
        onnx.StringStringEntryProto(key="location", value="../secret.bin")]), "given twice"),
    "location_empty": (lambda: external(weights(), ""), "without a location"),
    "location_is_a_folder": (lambda: external(weights(), "sub"), "not a regular file"),
    "location_with_nul": (lambda: external(weights(), "w.bin\0../../secret.bin"), "not a valid path"),
    "location_with_drive": (lambda: external(weights(), "C:secret.bin"), "outside"),
    "basepath_key": (lambda: external(weights(), "w.bin", basepath=".."), "basepath"),
    "symlink_to_outside": (lambda: external(weights(), "link.bin"), "outside"),
    "hard_link": (lambda: external(weights(), "hard.bin"), "hard links"),
    "string_tensor": (lambda: external(helper.make_tensor("w", TensorProto.STRING, [1], [b"abc"]), "w.bin"),
                      "string"),
    # A valid external tensor next to an invalid attribute: strict inference must still run.
    "invalid_attribute_next_to_external_weights": (lambda: external(weights(), "w.bin"), "Cast"),
}


@pytest.mark.parametrize("case", sorted(EXTERNAL_CASES))
def test_bad_external_data_is_refused(case: str, tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    data = np.arange(4, dtype=np.float32).tobytes()
    (folder / "w.bin").write_bytes(data + data if case == "length_shorter_than_file" else data)
    (tmp_path / "secret.bin").write_bytes(data)
    (folder / "sub").mkdir()
    os.symlink(tmp_path / "secret.bin", folder / "link.bin")
    os.link(tmp_path / "secret.bin", folder / "hard.bin")
    build, needle = EXTERNAL_CASES[case]
    model = add_w(build())
    if case == "invalid_attribute_next_to_external_weights":
        model.graph.node[0].output[0] = "sum"
        model.graph.node.append(helper.make_node("Cast", ["sum"], ["y"], to=2**31))
    (folder / "model.onnx").write_bytes(model.SerializeToString())
    expect_refusal(capfd, folder / "model.onnx", needle=needle)


def _escaping_models(folder: pathlib.Path, target: pathlib.Path) -> dict[str, onnx.ModelProto]:
    """Models whose external data points at ``target`` (outside ``folder``) in every way and place."""
    os.symlink(target, folder / "link.bin")
    (folder / "sub").mkdir()
    os.symlink(target.parent, folder / "sub" / "dirlink")
    sparse = helper.make_sparse_tensor(
        external(weights(np.ones(1, np.float32), "sv"), "../" + target.name),
        numpy_helper.from_array(np.array([1], np.int64), "si"), [4])
    sparse_model = add_w(weights())
    sparse_model.graph.ClearField("initializer")
    sparse_model.graph.sparse_initializer.append(sparse)
    sparse.values.name = "w"
    in_function = _calling(_function([
        helper.make_node("Constant", [], ["k"], value=external(weights(name="k"), "../" + target.name)),
        helper.make_node("Add", ["a", "k"], ["b"])]))
    return {
        "dotdot": add_w(external(weights(), "../" + target.name)),
        "absolute": add_w(external(weights(), str(target))),
        "symlink": add_w(external(weights(), "link.bin")),
        "symlinked_folder": add_w(external(weights(), "sub/dirlink/" + target.name)),
        "sparse_initializer": sparse_model,
        "constant_in_function": in_function,
        "constant_in_subgraph": _if_model([helper.make_node(
            "Constant", [], ["t"], value=external(weights(name="tv"), "../" + target.name))]),
    }


ESCAPES = ["dotdot", "absolute", "symlink", "symlinked_folder", "sparse_initializer", "constant_in_function",
           "constant_in_subgraph"]


@pytest.mark.parametrize("case", ESCAPES)
def test_external_data_outside_the_folder_is_refused(
    case: str, tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    secret = tmp_path / "secret.bin"
    secret.write_bytes(np.arange(4, dtype=np.float32).tobytes())
    (folder / "model.onnx").write_bytes(_escaping_models(folder, secret)[case].SerializeToString())
    expect_refusal(capfd, folder / "model.onnx", needle="outside")


_OPENS_NOTHING = """
import sys
from passes.cli import command as cli
codes = [cli.main([path, "-o", path + ".out.onnx", "-q"]) for path in sys.argv[1:]]
print(" ".join(map(str, codes)))
"""


def test_escaping_external_data_is_never_opened(tmp_path: pathlib.Path) -> None:
    """The outside target is a FIFO: opening it to read (or mmap) would block until the timeout."""
    folder = tmp_path / "m"
    folder.mkdir()
    fifo = tmp_path / "secret.fifo"
    os.mkfifo(fifo)
    models = _escaping_models(folder, fifo)
    inside_fifo = folder / "inside.fifo"
    os.mkfifo(inside_fifo)  # inside the folder but not a regular file: refused, not opened
    models["fifo_inside"] = add_w(external(weights(), "inside.fifo"))
    paths = []
    for name, model in models.items():
        path = folder / f"{name}.onnx"
        path.write_bytes(model.SerializeToString())
        paths.append(str(path))
    proc = subprocess.run([sys.executable, "-c", _OPENS_NOTHING, *paths], capture_output=True, text=True, timeout=120)
    assert proc.stdout.split() == ["2"] * len(paths), proc.stderr
    assert proc.stderr.count("optimize: error:") == len(paths) and "Traceback" not in proc.stderr
    assert not [p for p in folder.iterdir() if p.name.endswith(".out.onnx")]


def test_external_constants_are_read_from_the_model_folder(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """A Constant's external value (main graph or function) is read relative to the model, not the
    working directory, and the output does not point back at the input's data file."""
    folder = tmp_path / "m"
    folder.mkdir()
    values = np.array([1, 2, 3, 4], np.float32)
    (folder / "k.bin").write_bytes(values.tobytes())
    decoy = tmp_path / "cwd"
    decoy.mkdir()
    (decoy / "k.bin").write_bytes((values * 100).tobytes())
    monkeypatch.chdir(decoy)
    model = _calling(_function([
        helper.make_node("Constant", [], ["k"], value=external(weights(name="k"), "k.bin")),
        helper.make_node("Add", ["a", "k"], ["b"])]))
    (folder / "model.onnx").write_bytes(model.SerializeToString())
    out = tmp_path / "out" / "out.onnx"
    out.parent.mkdir()
    assert cli.main([str(folder / "model.onnx"), "-o", str(out), "-q"]) == 0, capfd.readouterr().err
    x = np.zeros(4, np.float32)
    np.testing.assert_array_equal(helpers.ort_run(str(out), {"x": x})[0], values)
    assert sorted(p.name for p in out.parent.iterdir()) == ["out.onnx"]


class _HoldingPass:
    """Test-only pass: keeps arrays viewing every initializer (a cache in a real pass might)."""

    held: list[np.ndarray] = []

    def __call__(self, model):
        import onnx_ir as ir

        for graph in model.graphs():
            self.held.extend(v.const_value.numpy() for v in graph.initializers.values())
        return ir.passes.PassResult(model, modified=False)


def test_saving_while_a_pass_holds_views_of_external_weights(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """Small external initializers are written inline; onnx_ir closing their memory map while an
    array views it used to fail with BufferError ("internal error")."""
    folder = tmp_path / "m"
    folder.mkdir()
    small = add_w(weights())  # 16 bytes: external in the input, inline in the output
    onnx.save_model(small, str(folder / "model.onnx"), save_as_external_data=True, location="w.bin", size_threshold=0)
    monkeypatch.setitem(pipeline.PASSES, "hold", pipeline.PassSpec("hold", "test only", lambda o: _HoldingPass()))
    out = tmp_path / "out.onnx"
    try:
        assert cli.main([str(folder / "model.onnx"), "-o", str(out), "--passes", "hold", "-q"]) == 0, (
            capfd.readouterr().err)
    finally:
        _HoldingPass.held.clear()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m", "out.onnx"]  # no empty out.onnx.data
    np.testing.assert_array_equal(helpers.ort_run(str(out), {"x": np.zeros(4, np.float32)})[0],
                                  np.arange(4, dtype=np.float32))


# --- outputs that would overwrite part of the input ----------------------------------------------


def test_output_must_not_overwrite_the_inputs_data(tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "model.onnx"
    onnx.save_model(add_w(weights(np.arange(64, dtype=np.float32).reshape(16, 4)[0])), str(src),
                    save_as_external_data=True, location="other.onnx.data", size_threshold=0)
    # OUTPUT.data would be the input's data file ...
    expect_refusal(capfd, src, out=tmp_path / "other.onnx", needle="overwrite the input's file")
    # ... or OUTPUT itself would be.
    expect_refusal(capfd, src, out=tmp_path / "other.onnx.data", needle="overwrite the input's file")
    # The report must not overwrite a model file either.
    expect_refusal(capfd, src, "--report", str(src), needle="--report")
    # Replacing the whole input model in place is allowed.
    assert cli.main([str(src), "-o", str(src), "-q"]) == 0, capfd.readouterr().err
    onnx.checker.check_model(str(src), full_check=True)


def test_a_full_disk_is_a_clear_error(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    src = _externalized_demo(tmp_path / "in")

    def full_disk(model, path, **kwargs):
        pathlib.Path(path).write_bytes(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(modelio.save, "save_model", full_disk)
    line = expect_refusal(capfd, src, out=tmp_path / "out.onnx", needle="No space left on device")
    assert "cannot write" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


# --- valid models a pass cannot handle ---------------------------------------------------------


def _requires_pass(name: str) -> None:
    if name not in pipeline.PASSES:
        pytest.skip(f"the {name!r} pass is not registered in pipeline.PASSES yet")


def test_fold_leaves_an_op_refimpl_lacks_and_reports_it(
    tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str]
) -> None:
    _requires_pass("fold")
    refimpl = pytest.importorskip("refimpl")
    candidates = ["Det", "Hardmax", "LpNormalization", "MeanVarianceNormalization"]
    op = next((c for c in candidates if not _has_kernel(refimpl, c)), None)
    if op is None:
        pytest.skip(f"refimpl implements every candidate op ({candidates})")
    square = numpy_helper.from_array(np.array([[2, 1, 0, 0], [1, 3, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]],
                                              np.float32), "sq")
    node_out = "d" if op == "Det" else "h"
    nodes = [helper.make_node(op, ["sq"], [node_out], name="unsupported")]
    if op == "Det":
        nodes.append(helper.make_node("Mul", ["x", "d"], ["y"], name="scale"))
    else:
        nodes += [helper.make_node("ReduceSum", [node_out], ["hs"], keepdims=0, name="rs"),
                  helper.make_node("Mul", ["x", "hs"], ["y"], name="scale")]
    src = tmp_path / "model.onnx"
    onnx.save_model(make_model(nodes, initializers=[square]), str(src))
    out, report = tmp_path / "out.onnx", tmp_path / "report.json"
    code = cli.main([str(src), "-o", str(out), "--passes", "fold", "--report", str(report), "-q"])
    assert code == 0, capfd.readouterr().err
    assert op in [n.op_type for n in onnx.load(str(out)).graph.node]
    fold = next(p for p in json.loads(report.read_text())["passes"] if p["name"] == "fold")
    assert op in json.dumps(fold["stats"]), fold


def _has_kernel(refimpl, op: str) -> bool:
    try:
        refimpl.lookup(op, OPSET)
    except refimpl.UnsupportedOpError:
        return False
    return True


def test_upgrade_without_an_adapter_is_refused(tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str]) -> None:
    """Resize-11's 'tf_half_pixel_for_nn' mode was removed in Resize-13 and has no equivalent."""
    _requires_pass("upgrade")
    model = make_model(
        [helper.make_node("Resize", ["x", "roi", "scales"], ["y"], name="resize", mode="nearest",
                          coordinate_transformation_mode="tf_half_pixel_for_nn")],
        inputs=[helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2])],
        outputs=[helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 4, 4])],
        initializers=[numpy_helper.from_array(np.array([], np.float32), "roi"),
                      numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")],
        opset=11, ir_version=6)
    src = tmp_path / "model.onnx"
    onnx.save_model(model, str(src))
    line = expect_refusal(capfd, src, "--passes", "upgrade", needle="Resize")
    assert "tf_half_pixel_for_nn" in line and "opset" in line
    expect_refusal(capfd, src, needle="Resize")  # in the default pipeline too


# --- determinism and idempotence ----------------------------------------------------------------


def _externalized_demo(folder: pathlib.Path) -> pathlib.Path:
    folder.mkdir()
    src = folder / "model.onnx"
    big = make_model(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        inputs=[helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
        outputs=[helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])],
        initializers=[numpy_helper.from_array(
            np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32), "w")])
    onnx.save_model(big, str(src), save_as_external_data=True, location="model.weights", size_threshold=0)
    return src


def _optimise(src: pathlib.Path, out: pathlib.Path, capfd: pytest.CaptureFixture[str]) -> dict[str, bytes]:
    out.parent.mkdir(exist_ok=True)
    assert cli.main([str(src), "-o", str(out), "-q"]) == 0, capfd.readouterr().err
    return {p.name: p.read_bytes() for p in sorted(out.parent.iterdir())}


@pytest.mark.parametrize("kind", ["demo", "external_data"])
def test_output_is_deterministic_and_idempotent(
    kind: str, tmp_path: pathlib.Path, capfd: pytest.CaptureFixture[str]
) -> None:
    if kind == "demo":
        (tmp_path / "in").mkdir()
        src = tmp_path / "in" / "model.onnx"
        src.write_bytes(DEMO.read_bytes())
    else:
        src = _externalized_demo(tmp_path / "in")
    first = _optimise(src, tmp_path / "a" / "opt.onnx", capfd)
    second = _optimise(src, tmp_path / "b" / "opt.onnx", capfd)
    assert first == second
    # Another process (fresh hash seeds, fresh imports) writes the same bytes.
    (tmp_path / "c").mkdir()
    env = dict(os.environ, PYTHONHASHSEED="12345")
    proc = subprocess.run([sys.executable, "-m", "passes", str(src), "-o", str(tmp_path / "c" / "opt.onnx"), "-q"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    assert {p.name: p.read_bytes() for p in sorted((tmp_path / "c").iterdir())} == first
    # Optimising the optimised model changes nothing.
    again = _optimise(tmp_path / "a" / "opt.onnx", tmp_path / "d" / "opt.onnx", capfd)
    assert again == first


# --- interrupts ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def slow_model_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """A model that takes the command a second or two: a chain of 5000 nodes, and 4 MB of
    external weights, so that the output is two files."""
    half = numpy_helper.from_array(np.full(16, 0.5, np.float32), "half")
    big = numpy_helper.from_array(np.random.default_rng(0).standard_normal((16, 65536)).astype(np.float32), "big")
    nodes, prev = [], "x"
    for i in range(5000):
        nodes.append(helper.make_node("Add" if i % 2 else "Mul", [prev, "half"], [f"v{i}"], name=f"n{i}"))
        prev = f"v{i}"
    nodes.append(helper.make_node("MatMul", [prev, "big"], ["y"], name="mm"))
    model = make_model(
        nodes,
        inputs=[helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
        outputs=[helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 65536])],
        initializers=[half, big])
    folder = tmp_path_factory.mktemp("slow")
    onnx.save_model(model, str(folder / "slow.onnx"), save_as_external_data=True, location="slow.onnx.data",
                    size_threshold=1024)
    return snapshot(folder)


@pytest.fixture()
def slow_model(tmp_path: pathlib.Path, slow_model_files: dict[str, bytes]) -> pathlib.Path:
    for name, data in slow_model_files.items():
        (tmp_path / name).write_bytes(data)
    return tmp_path / "slow.onnx"


# Starts the command after its imports and says so, so that a delay is measured from main().
# Says "ready" once main() has installed its handlers and starts the run, so that a delay is
# measured from there (start-up is test_interrupt_during_start_up_leaves_nothing's business).
# After main() returns, signals are ignored: the test is about main(), not the interpreter's exit.
# The extension modules are loaded before "ready", as the command loads them before its run with
# handlers that exit at once (cli.command._import_extensions): an exception raised inside onnx's
# nanobind initialisation does not unwind, and under load a signal 0.2 s after "ready" landed
# there (the process died of SIGSEGV, exit -11).
_READY = """
import signal, sys
import numpy, onnx, onnx_ir
from passes.cli import command as cli
run = cli._run
def announced_run(*args):
    print("ready", file=sys.stderr, flush=True)
    return run(*args)
cli._run = announced_run
code = cli.main(sys.argv[1:])
for s in (signal.SIGINT, signal.SIGTERM):
    signal.signal(s, signal.SIG_IGN)
sys.exit(code)
"""


def _interrupt(src: pathlib.Path, out: pathlib.Path, signum: int, delay: float) -> tuple[int, str]:
    proc = subprocess.Popen([sys.executable, "-c", _READY, str(src), "-o", str(out), "-q"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr.readline().strip() == "ready"
    time.sleep(delay)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


def _assert_clean_after_interrupt(folder: pathlib.Path, out: pathlib.Path, before: dict[str, bytes],
                                  code: int, err: str, signum: int) -> None:
    assert "Traceback" not in err, err
    assert leftovers(folder) == []
    assert {k: v for k, v in snapshot(folder).items() if k in before} == before
    if out.exists():  # finished, or interrupted after the atomic rename
        assert code == 0 or "already written" in err, err
        onnx.checker.check_model(str(out), full_check=True)
        assert (folder / (out.name + ".data")).exists()
    else:
        assert code == 128 + signum, err
        assert one_error_line(err) == "optimize: error: interrupted; no output written"
        assert not out.exists() and not (folder / (out.name + ".data")).exists()


@pytest.mark.parametrize(("signum", "delay"), [
    (signal.SIGINT, 0.0), (signal.SIGTERM, 0.2), (signal.SIGINT, 0.5), (signal.SIGTERM, 0.9), (signal.SIGINT, 1.4),
], ids=lambda v: v.name if isinstance(v, signal.Signals) else f"{v}s")
def test_interrupt_at_any_time_leaves_no_partial_output(
    tmp_path: pathlib.Path, slow_model: pathlib.Path, signum: int, delay: float
) -> None:
    src = slow_model
    before = snapshot(tmp_path)
    out = tmp_path / "out.onnx"
    code, err = _interrupt(src, out, signum, delay)
    _assert_clean_after_interrupt(tmp_path, out, before, code, err, signum)


def test_sigint_and_sigterm_give_the_same_message(tmp_path: pathlib.Path, slow_model: pathlib.Path) -> None:
    src = slow_model
    lines = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        code, err = _interrupt(src, tmp_path / "out.onnx", signum, 0.2)
        assert code == 128 + signum, err
        lines[signum] = one_error_line(err)
    assert lines[signal.SIGINT] == lines[signal.SIGTERM] == "optimize: error: interrupted; no output written"


def test_interrupt_during_start_up_leaves_nothing(tmp_path: pathlib.Path, slow_model: pathlib.Path) -> None:
    """Before main() runs (interpreter start, imports) the files are safe; the message is not yet ours.

    A SIGINT that lands in the interpreter's own start-up, before any line of
    ours runs, gets Python's KeyboardInterrupt traceback (or kills the process
    before Python installs its handler): no code of ours can be on that
    traceback. Once ``passes/__main__.py`` runs, the one line is asserted by
    ``test_interrupt_while_importing_gives_the_one_line``.
    """
    src = slow_model
    before = snapshot(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "passes", str(src), "-o", str(tmp_path / "out.onnx")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    if proc.returncode == 0:
        # CPython itself dropped the signal: its KeyboardInterrupt landed in the import system's
        # module-lock clean-up (a weakref callback) while the interpreter started, before any line
        # of ours ran, and was printed as "Exception ignored" (seen once in CI under load). The run
        # then went on as if there had been no signal: the output must be whole.
        assert "Exception ignored" in err and "KeyboardInterrupt" in err, err
        assert not [line for line in err.splitlines() if "/passes/" in line or "/refimpl/" in line], err
        onnx.checker.check_model(str(tmp_path / "out.onnx"), full_check=True)
        assert leftovers(tmp_path) == []
        return
    assert snapshot(tmp_path) == before and leftovers(tmp_path) == [], err
    if "Traceback" in err:  # Python's own start-up: none of our frames, and only its KeyboardInterrupt
        frames = [line for line in err.splitlines() if line.lstrip().startswith("File ")]
        ours = [f for f in frames if "/passes/" in f or "/refimpl/" in f]
        assert ours == [] and err.rstrip().endswith("KeyboardInterrupt"), err
    else:
        assert err == "" or one_error_line(err) == "optimize: error: interrupted; no output written", err


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupt_while_importing_gives_the_one_line(tmp_path: pathlib.Path, slow_model: pathlib.Path,
                                                      signum: int) -> None:
    """passes/__main__.py installs its handlers before the heavy imports (onnx, onnxruntime)."""
    src = slow_model
    before = snapshot(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "passes", str(src), "-o", str(tmp_path / "out.onnx")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.6)  # inside main(): the start-up handler is installed, the CLI may still be importing
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signum, err
    assert one_error_line(err).startswith("optimize: error: interrupted")
    assert snapshot(tmp_path) == before and leftovers(tmp_path) == []


# In-process: a signal delivered at an exact point of the run (the handlers are the CLI's own).


def _raise_signal_during(monkeypatch: pytest.MonkeyPatch, target: object, name: str, signum: int,
                         *, after: bool = False, times: int = 1) -> None:
    real = getattr(target, name)
    calls = {"n": 0}

    def wrapper(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] <= times and not after:
            signal.raise_signal(signum)
        result = real(*args, **kwargs)
        if calls["n"] <= times and after:
            signal.raise_signal(signum)
        return result

    monkeypatch.setattr(target, name, wrapper)


def _small_external(tmp_path: pathlib.Path) -> tuple[pathlib.Path, dict[str, bytes]]:
    src = _externalized_demo(tmp_path / "in")
    return src, snapshot(src.parent)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
def test_signal_while_saving(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
                             capfd: pytest.CaptureFixture[str], signum: int) -> None:
    src, before = _small_external(tmp_path)
    _raise_signal_during(monkeypatch, modelio.save, "save_model", signum, after=True)
    out = tmp_path / "out.onnx"
    code = cli.main([str(src), "-o", str(out), "-q"])
    assert code == 128 + signum
    assert one_error_line(capfd.readouterr().err) == "optimize: error: interrupted; no output written"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]
    assert snapshot(src.parent) == before
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL or signum == signal.SIGINT


def test_signal_during_the_commit_lets_it_complete(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """The commit renames OUTPUT.data then OUTPUT: an interrupt between them must not split them."""
    src, before = _small_external(tmp_path)
    modelio_os = types.SimpleNamespace(**vars(os))  # modelio's own view of os, so onnx_ir's renames are untouched
    monkeypatch.setattr(modelio.save, "os", modelio_os)
    _raise_signal_during(monkeypatch, modelio_os, "replace", signal.SIGTERM, after=True)
    out = tmp_path / "out.onnx"
    code = cli.main([str(src), "-o", str(out), "-q"])
    assert code == 128 + signal.SIGTERM
    assert one_error_line(capfd.readouterr().err) == "optimize: error: interrupted; the output was already written"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "out.onnx", "out.onnx.data"]
    onnx.checker.check_model(str(out), full_check=True)
    assert snapshot(src.parent) == before


def test_a_second_signal_does_not_interrupt_the_clean_up(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    src, before = _small_external(tmp_path)
    _raise_signal_during(monkeypatch, modelio.save, "save_model", signal.SIGINT, after=True)
    _raise_signal_during(monkeypatch, modelio.StagedOutput, "discard", signal.SIGTERM, times=2)
    code = cli.main([str(src), "-o", str(tmp_path / "out.onnx"), "-q"])
    assert code == 128 + signal.SIGINT
    assert one_error_line(capfd.readouterr().err) == "optimize: error: interrupted; no output written"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]
    assert snapshot(src.parent) == before


@pytest.mark.parametrize(("maker", "prefix"), [("mkdtemp", ".out.onnx."), ("mkstemp", ".r.json.")],
                         ids=["the staged model's folder", "the staged report"])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
def test_a_signal_as_a_temporary_file_is_made_leaves_none(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str],
    maker: str, prefix: str, signum: int,
) -> None:
    """The signal comes the moment the file exists, before its maker has returned (under load a
    signal arriving during the call is handled there): the run still knows the file and removes it.
    The deferral that held it delivered the signal before the model's clean-up was set up, and
    the staged model's folder (``.out.onnx.*.tmp``) stayed behind."""
    import tempfile

    src, before = _small_external(tmp_path)
    real = getattr(tempfile, maker)

    def make_then_signal(*args, **kwargs):
        result = real(*args, **kwargs)
        if str(kwargs.get("prefix", "")).startswith(prefix):
            signal.raise_signal(signum)
        return result

    monkeypatch.setattr(tempfile, maker, make_then_signal)
    code = cli.main([str(src), "-o", str(tmp_path / "out.onnx"), "--report", str(tmp_path / "r.json"), "-q"])
    assert code == 128 + signum
    assert one_error_line(capfd.readouterr().err) == "optimize: error: interrupted; no output written"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]
    assert snapshot(src.parent) == before


def test_a_signal_as_the_report_of_a_refused_run_is_made_leaves_no_temporary_file(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """A run refused after the load still writes its report (not staged with an output): the same."""
    import tempfile

    src, before = _small_external(tmp_path)
    real = tempfile.mkstemp

    def make_then_signal(*args, **kwargs):
        result = real(*args, **kwargs)
        if str(kwargs.get("prefix", "")).startswith(".r.json."):
            signal.raise_signal(signal.SIGTERM)
        return result

    monkeypatch.setattr(tempfile, "mkstemp", make_then_signal)
    args = [str(src), "-o", str(tmp_path / "out.onnx"), "--report", str(tmp_path / "r.json"), "-q",
            "--input-shape", "nosuchinput:1"]  # fmt: skip
    code = cli.main(args)
    err = capfd.readouterr().err
    assert code == 128 + signal.SIGTERM, err
    assert one_error_line(err) == "optimize: error: interrupted; no output written"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]
    assert snapshot(src.parent) == before


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupt_inside_a_weakref_callback_still_ends_the_run(tmp_path: pathlib.Path, signum: int) -> None:
    """A signal handled while Python runs a weakref callback (the import system's module-lock
    clean-up, seen under load) used to be printed as "Exception ignored" and lost: the run went on
    and wrote its output with exit 0. Here the signal lands in such a callback on purpose."""
    out = tmp_path / "out.onnx"
    script = f"""
import os, signal, sys, weakref
sys.argv = ["optimize", {str(DEMO)!r}, "-o", {str(out)!r}]
from passes import pipeline
from passes.cli import command
real = pipeline.optimize_file

class Holder:
    pass

def callback(_):
    os.kill(os.getpid(), {int(signum)})
    for _ in range(1000):  # bytecode after the kill: the handler runs here, inside the callback
        pass

def optimize_file(*args, **kwargs):
    holder = Holder()
    ref = weakref.ref(holder, callback)
    del holder  # the callback runs now
    return real(*args, **kwargs)

pipeline.optimize_file = optimize_file
command.run()
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(REPO)), cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 128 + signum, proc.stderr
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr
    assert one_error_line(proc.stderr) == "optimize: error: interrupted; no output written", proc.stderr
    assert not out.exists() and leftovers(tmp_path) == []


def test_an_interrupt_python_wrapped_is_still_an_interrupt(tmp_path: pathlib.Path, capsys) -> None:
    """A signal raised while a class is created in an import (a dataclass field's ``__set_name__``)
    reaches the load as ``RuntimeError("Error calling __set_name__ ...")``; it used to be reported
    as "not a valid ONNX model" (exit 2). It is the interrupt it wraps: exit 130, nothing written."""
    from passes.modelio import detach

    def wrapped_interrupt(path: object) -> object:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as e:
            raise RuntimeError("Error calling __set_name__ on 'Field' instance 'dim' in 'SimpleShardedDim'") from e

    out = tmp_path / "o.onnx"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(detach, "read_view", wrapped_interrupt)
        with pytest.raises(KeyboardInterrupt):
            pipeline.optimize_file(DEMO, out)  # the API raises the interrupt, not an InputError
        assert cli.main([str(DEMO), "-o", str(out)]) == 130
    assert one_error_line(capsys.readouterr().err) == "optimize: error: interrupted; no output written"
    assert not out.exists()
