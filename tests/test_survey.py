"""The load's survey of a model (passes.modelio.survey): one parse in C that says whether every
string field is UTF-8 and whether any attribute holds a tensor, a graph or a reference.

What the survey knows lets the load skip its looks at every node, so it must never say more
than is true: each string field of onnx.proto, wherever it first occurs, is tried with bytes
that are not UTF-8; each of the seven attribute fields, in a node of the graph, of a subgraph,
of a function and in a function's default, must make the model not plain. And the checks that
the survey lets the load skip still refuse what they refused, through the load itself.
"""

from __future__ import annotations

import collections
import pathlib

import onnx
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from onnx import TensorProto, helper

from passes.errors import InputError
from passes.modelio import load_model, survey as survey_module
from passes.modelio.repair import repair
from passes.modelio.survey import NOTHING_KNOWN, Survey, survey
from passes.modelio.tensor_data import check_tensors

def _repeated(field: FieldDescriptor) -> bool:
    return field.is_repeated if hasattr(field, "is_repeated") else field.label == FieldDescriptor.LABEL_REPEATED


_MARK = b"zqzqzqzq"
_BAD = b"\xff\xfe\xff\xfe\xff\xfe\xff\xfe"  # as long as the mark: the wire format stays valid


def _string_fields() -> dict[str, list[FieldDescriptor]]:
    """Every string field of onnx.proto reachable from ModelProto, with the shortest path to it."""
    paths: dict[str, list[FieldDescriptor]] = {}
    reached = {onnx.ModelProto.DESCRIPTOR.full_name: []}
    queue: collections.deque[tuple[Descriptor, list[FieldDescriptor]]] = collections.deque(
        [(onnx.ModelProto.DESCRIPTOR, [])]
    )
    while queue:
        message, path = queue.popleft()
        for field in message.fields:
            if field.type == FieldDescriptor.TYPE_STRING:
                paths.setdefault(f"{message.name}.{field.name}", [*path, field])
            elif field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type.full_name not in reached:
                reached[field.message_type.full_name] = [*path, field]
                queue.append((field.message_type, [*path, field]))
    return paths


_STRINGS = _string_fields()


def _model_with(path: list[FieldDescriptor], value: bytes) -> onnx.ModelProto:
    """A ModelProto with the string field at the end of ``path`` set to ``value`` (bytes, any)."""
    model = onnx.ModelProto()
    message = model
    for field in path[:-1]:
        message = getattr(message, field.name).add() if _repeated(field) else getattr(message, field.name)
        message.SetInParent()
    last = path[-1]
    if _repeated(last):
        getattr(message, last.name).append(_MARK.decode())
    else:
        setattr(message, last.name, _MARK.decode())
    bad = onnx.ModelProto()
    bad.ParseFromString(model.SerializeToString().replace(_MARK, value))
    return bad


def test_every_string_field_of_onnx_proto_is_tried() -> None:
    assert len(_STRINGS) > 40  # all of onnx.proto, not a handful
    assert {"NodeProto.input", "AttributeProto.ref_attr_name", "FunctionProto.attribute", "TensorProto.name",
            "StringStringEntryProto.value", "TypeProto.denotation"} <= set(_STRINGS)  # fmt: skip


@pytest.mark.parametrize("where", sorted(_STRINGS))
def test_a_string_field_that_is_not_utf8_is_never_known_as_text(where: str) -> None:
    bad = _model_with(_STRINGS[where], _BAD)
    assert not survey(bad).text
    assert not survey(bad, _as_read(bad)).text  # the load's survey, of the file's bytes
    with pytest.raises(InputError, match=f"^{where} is not valid UTF-8 text$"):
        check_tensors(bad, pathlib.Path("."))
    good = _model_with(_STRINGS[where], _MARK)
    assert survey(good).text and survey(good, _as_read(good)).text


def _as_read(model: onnx.ModelProto) -> bytes:
    """Bytes a file may hold for ``model`` that are not its serialisation: ``ir_version`` written twice
    (the last one counts), so that a survey of the bytes cannot lean on ``model``'s own."""
    data = model.SerializeToString() + bytes([0x08, 0x07])  # field 1 (ir_version), varint 7
    parsed = onnx.ModelProto.FromString(data)
    assert parsed.ir_version == 7 and data != parsed.SerializeToString()
    return data


def _if_body(attr: onnx.AttributeProto | None) -> onnx.GraphProto:
    node = helper.make_node("Identity", ["x"], ["y"])
    if attr is not None:
        node.attribute.append(attr)
    return helper.make_graph([node], "body", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])


def _attribute(field: str) -> onnx.AttributeProto:
    tensor = helper.make_tensor("t", TensorProto.FLOAT, [1], [1.0])
    sparse = helper.make_sparse_tensor(tensor, helper.make_tensor("i", TensorProto.INT64, [1], [0]), [2])
    graph = _if_body(None)
    attr = onnx.AttributeProto(name="a")
    one = {"t": tensor, "g": graph, "sparse_tensor": sparse}
    many = {"tensors": tensor, "graphs": graph, "sparse_tensors": sparse}
    if field in one:
        getattr(attr, field).CopyFrom(one[field])
    elif field in many:
        getattr(attr, field).append(many[field])
    else:
        attr.ref_attr_name = "r"
    return attr


def _model(attr: onnx.AttributeProto | None, where: str) -> onnx.ModelProto:
    node = helper.make_node("Custom", ["x"], ["y"], domain="dom", alpha=[1, 2])
    branch = helper.make_node("If", ["c"], ["z"], then_branch=_if_body(attr if where == "subgraph" else None),
                              else_branch=_if_body(None)) if where == "subgraph" else None  # fmt: skip
    if attr is not None and where == "graph":
        node.attribute.append(attr)
    body = helper.make_node("Neg", ["a"], ["b"])
    if attr is not None and where == "function":
        body.attribute.append(attr)
    function = helper.make_function("dom", "F", ["a"], ["b"], [body], [helper.make_opsetid("", 18)])
    if attr is not None and where == "function default":
        function.attribute_proto.append(attr)
    graph = helper.make_graph([node] + ([branch] if branch is not None else []), "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])  # fmt: skip
    return helper.make_model(graph, functions=[function])


_HOLDERS = ["t", "g", "sparse_tensor", "tensors", "graphs", "sparse_tensors", "ref_attr_name"]


@pytest.mark.parametrize("where", ["graph", "subgraph", "function", "function default"])
@pytest.mark.parametrize("field", _HOLDERS)
def test_an_attribute_that_holds_a_tensor_graph_or_reference_is_never_plain(field: str, where: str) -> None:
    assert survey(_model(None, where)) == Survey(text=True, plain=where != "subgraph")  # the If's bodies
    assert survey(_model(_attribute(field), where)) == Survey(text=True, plain=False)
    model = _model(_attribute(field), where)
    model.ir_version = 7
    assert survey(model, _as_read(model)) == Survey(text=True, plain=False)


def test_a_field_onnx_proto_does_not_know_makes_nothing_plain() -> None:
    model = _model(None, "graph")
    unknown = model.SerializeToString() + bytes([0xF8, 0x7F, 0x01])  # field 2047, varint 1
    parsed = onnx.ModelProto.FromString(unknown)
    assert survey(parsed) == Survey(text=True, plain=False)


def test_a_model_over_the_limit_is_not_surveyed(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model(None, "graph")
    monkeypatch.setattr(survey_module, "SURVEYED_UP_TO", model.ByteSize() - 1)
    assert survey(model) is NOTHING_KNOWN


def _save(model: onnx.ModelProto, tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def test_what_a_survey_lets_the_load_skip_is_still_refused(tmp_path: pathlib.Path) -> None:
    """Through the load: a reference outside a function in a subgraph, a bad tensor in a Constant
    of a function, a subgraph out of order (sorted), each in a model that is not plain."""
    ref = helper.make_node("Constant", [], ["y"], value_float=1.0)
    ref.attribute[0].ref_attr_name = "r"
    ref.attribute[0].ClearField("f")
    then = helper.make_graph([ref], "then", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])])
    branch = helper.make_node("If", ["c"], ["z"], then_branch=then, else_branch=then)
    graph = helper.make_graph([branch], "g", [helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [])])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(InputError, match="refers to a function attribute \\('r'\\) outside a function"):
        load_model(_save(model, tmp_path))

    tensor = helper.make_tensor("bad", TensorProto.FLOAT, [2], [1.0, 2.0])
    tensor.ClearField("float_data")
    tensor.raw_data = b"\0" * 4
    body = helper.make_node("Constant", [], ["b"], value=tensor)
    function = helper.make_function("dom", "F", [], ["b"], [body], [helper.make_opsetid("", 18)])
    call = helper.make_node("F", [], ["y"], domain="dom")
    graph = helper.make_graph([call], "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, functions=[function], opset_imports=[helper.make_opsetid("", 18),
                                                                          helper.make_opsetid("dom", 1)])  # fmt: skip
    with pytest.raises(InputError, match="tensor 'bad': raw_data has 4 bytes"):
        load_model(_save(model, tmp_path))

    unsorted = helper.make_graph([helper.make_node("Neg", ["t"], ["u"]), helper.make_node("Neg", ["x"], ["t"])],
                                 "then", [], [helper.make_tensor_value_info("u", TensorProto.FLOAT, [1])])  # fmt: skip
    branch = helper.make_node("If", ["c"], ["z"], then_branch=unsorted, else_branch=unsorted)
    graph = helper.make_graph([branch], "g", [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                                              helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1])])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    assert not survey(model).plain
    notes = repair(model, plain=survey(model).plain)
    assert "the nodes of subgraph 'then' were not in topological order: sorted (stable)" in notes
    assert [n.output[0] for n in model.graph.node[0].attribute[0].g.node] == ["t", "u"]


def test_a_plain_chain_is_plain_and_its_initializers_are_still_checked() -> None:
    bad = helper.make_tensor("w", TensorProto.FLOAT, [2], [1.0, 2.0])
    bad.ClearField("float_data")
    bad.raw_data = b"\0" * 4
    nodes = [helper.make_node("ReduceSum", ["x", "w"], ["y"], keepdims=1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=[bad])  # fmt: skip
    model = helper.make_model(graph)
    assert survey(model) == Survey(text=True, plain=True)
    with pytest.raises(InputError, match="tensor 'w': raw_data has 4 bytes"):
        check_tensors(model, pathlib.Path("."))


def test_the_load_stashes_no_sparse_constant_of_a_plain_model(tmp_path: pathlib.Path, monkeypatch) -> None:
    """A plain model (its survey of the file's bytes says so) has no sparse Constant: the stash's walk
    of every node is skipped; a model with one is not plain, and its sparse Constant is stashed."""
    from passes.modelio import sparse

    calls = []
    monkeypatch.setattr(sparse, "stash", lambda proto, stash=sparse.stash: calls.append(1) or stash(proto))
    nodes = [helper.make_node("Neg", ["x"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    assert [n.op_type for n in load_model(_save(model, tmp_path)).graph] == ["Neg"] and calls == []

    values = helper.make_tensor("v", TensorProto.FLOAT, [2], [1.0, 2.0])
    indices = helper.make_tensor("i", TensorProto.INT64, [2], [0, 1 << 20])
    big = helper.make_sparse_tensor(values, indices, [1 << 21])  # over the size made dense at load
    graph = helper.make_graph([helper.make_node("Constant", [], ["c"], sparse_value=big)], "g", [],
                              [helper.make_tensor_value_info("c", TensorProto.FLOAT, [1 << 21])])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    loaded = load_model(_save(model, tmp_path))
    assert calls == [1] and [n.domain for n in loaded.graph] == [sparse.DOMAIN]
