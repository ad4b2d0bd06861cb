"""Value types onnx_ir cannot represent (maps, e.g. ZipMap's ``seq(map(int64, float))``).

onnx_ir refuses to deserialize a model that declares a map type anywhere, and
scikit-learn classifiers converted by skl2onnx end in ZipMap, whose output is
a sequence of maps. The passes never need those types (no pass rewrites the
``ai.onnx.ml`` ops that produce them), so the loader takes the declarations
out of the protobuf before building the IR (:func:`stash`) and the saver puts
them back on the saved protobuf (:func:`restore`): the value itself, its name
and the nodes around it are untouched.
"""

from __future__ import annotations

from collections.abc import Iterator

import onnx

__all__ = ["STASH_KEY", "restore", "stash"]

#: Key of the stashed declarations in ``ir.Model.meta`` (not serialised by onnx_ir).
STASH_KEY = "onnx_optimize.opaque_types"


def _has_map(type_proto: onnx.TypeProto) -> bool:
    kind = type_proto.WhichOneof("value")
    if kind == "map_type":
        return True
    if kind == "sequence_type":
        return _has_map(type_proto.sequence_type.elem_type)
    if kind == "optional_type":
        return _has_map(type_proto.optional_type.elem_type)
    return False


def _declarations(graph: onnx.GraphProto) -> Iterator[tuple[str, onnx.ValueInfoProto]]:
    for field in ("input", "output", "value_info"):
        for info in getattr(graph, field):
            yield field, info


def stash(proto: onnx.ModelProto) -> dict[str, dict[str, bytes]]:
    """Removes the main graph's map-typed declarations; returns them by field and value name.

    Map types inside subgraphs or functions are left in place (onnx_ir then
    refuses the model, which the loader reports as unreadable).
    """
    stashed: dict[str, dict[str, bytes]] = {}
    for field, info in _declarations(proto.graph):
        if info.HasField("type") and _has_map(info.type):
            stashed.setdefault(field, {})[info.name] = info.type.SerializeToString()
            info.ClearField("type")
    return stashed


def restore(proto: onnx.ModelProto, stashed: dict[str, dict[str, bytes]]) -> None:
    """Puts stashed declarations back on ``proto`` (a serialisation of the same model).

    A graph input or output gets its type back by name. A ``value_info`` entry is
    restored if the value is still produced by a node (onnx_ir drops untyped ones).
    """
    if not stashed:
        return
    for field, info in list(_declarations(proto.graph)):
        data = stashed.get(field, {}).get(info.name)
        if data is not None:
            info.type.ParseFromString(data)
    present = {info.name for info in proto.graph.value_info}
    produced = {name for node in proto.graph.node for name in node.output}
    for name, data in stashed.get("value_info", {}).items():
        if name not in present and name in produced:
            info = proto.graph.value_info.add(name=name)
            info.type.ParseFromString(data)
