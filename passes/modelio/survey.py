"""What a parsed model holds, known from one parse in C of its bytes, for the load's checks.

The load's validation asks two questions of every message of a model, and answering them in
Python means a look at each node's attributes (50k nodes: 0.1-0.2 s a look, and there were four):

* ``text``: is every string field UTF-8? (protobuf hands a field that is not over as bytes, and
  onnx_ir, the checker and the save would each fail on it later, in their own way);
* ``plain``: does no attribute anywhere (the nodes of the graph, of every subgraph and of every
  function, the functions' defaults) hold a tensor, a sparse tensor, a graph or a reference to a
  function attribute? Then the model has no subgraph, no tensor but its graphs' own initializers
  and no attribute reference, and the looks for them can be skipped.

:func:`survey` answers both by parsing the model's bytes with a copy of onnx.proto declared
``proto3``, whose parser (C, upb) refuses a string field that is not UTF-8, and whose
``AttributeProto`` lacks the seven fields above: an attribute that has one keeps it as an unknown
field, so the parsed copy gets smaller when its unknown fields are discarded. A field that the
real onnx.proto does not know either makes it smaller too (nothing is then known of ``plain``:
the looks run). When the copy is not plain, the text is known from a second parse with a copy
that keeps every field. A model over :data:`SURVEYED_UP_TO` bytes is not copied (the bytes and
the copy are held for a moment): nothing is known, and the looks run, as for a protobuf that
does not take the copies.
"""

from __future__ import annotations

import dataclasses
import functools
import logging

import google.protobuf.descriptor_pb2
import google.protobuf.descriptor_pool
import google.protobuf.message
import google.protobuf.message_factory
import onnx

__all__ = ["NOTHING_KNOWN", "SURVEYED_UP_TO", "Survey", "survey"]

logger = logging.getLogger(__name__)

#: Over this serialised size nothing is surveyed: the survey holds the model's bytes and a parsed
#: copy for a moment (2x this at most); a model this large is mostly tensor data, whose few
#: messages the looks see quickly.
SURVEYED_UP_TO = 16 << 20

#: The fields of AttributeProto by which an attribute holds a tensor, a graph or a reference.
_NOT_PLAIN = frozenset({"t", "g", "sparse_tensor", "tensors", "graphs", "sparse_tensors", "ref_attr_name"})


@dataclasses.dataclass(frozen=True)
class Survey:
    """What :func:`survey` knows of a model (False: not known, the looks must run).

    Attributes:
        text: Every string field is UTF-8.
        plain: No attribute anywhere holds a tensor, a sparse tensor, a graph or a reference.
    """

    text: bool
    plain: bool


NOTHING_KNOWN = Survey(text=False, plain=False)


@functools.cache
def _copy_of_onnx_proto(without: frozenset[str]) -> type[google.protobuf.message.Message] | None:
    """ModelProto's class in a copy of onnx.proto declared ``proto3`` whose AttributeProto lacks the
    fields ``without``; None if protobuf does not take the copy.

    The copy differs otherwise only in what proto3 does not allow (defaults, ``required``,
    options), none of which changes which bytes a field holds.
    """
    try:
        file = google.protobuf.descriptor_pb2.FileDescriptorProto()
        onnx.ModelProto.DESCRIPTOR.file.CopyToProto(file)
        package = f".{file.package}."
        name = "passes_survey_plain" if without else "passes_survey_text"
        file.name, file.package, file.syntax = f"{name}/{file.name}", name, "proto3"
        pending = list(file.message_type)
        while pending:
            message = pending.pop()
            pending.extend(message.nested_type)
            if message.name == "AttributeProto" and without:
                kept = [field for field in message.field if field.name not in without]
                if len(message.field) - len(kept) != len(without):
                    return None  # an onnx.proto whose AttributeProto is not the one this module knows
                del message.field[:]
                message.field.extend(kept)
            for field in message.field:
                field.ClearField("default_value")
                field.ClearField("options")
                if field.label == field.LABEL_REQUIRED:
                    field.label = field.LABEL_OPTIONAL
                if field.type_name.startswith(package):
                    field.type_name = f".{name}." + field.type_name[len(package):]
        pool = google.protobuf.descriptor_pool.DescriptorPool()
        pool.Add(file)
        return google.protobuf.message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{name}.ModelProto"))
    except Exception:  # noqa: BLE001 - a protobuf that refuses the copy: nothing is known, the looks run
        logger.debug("no proto3 copy of onnx.proto: the model is looked at field by field", exc_info=True)
        return None


def survey(proto: onnx.ModelProto, data: bytes | None = None) -> Survey:
    """What one parse in C of ``proto``'s bytes tells (see the module docstring).

    ``data``: the bytes ``proto`` was parsed from, if at hand (the load's file): they are parsed
    instead of ``proto`` serialised again (a parse of either finds the same fields and strings).
    """
    plain_model = _copy_of_onnx_proto(_NOT_PLAIN)
    if plain_model is None or (proto.ByteSize() if data is None else len(data)) > SURVEYED_UP_TO:
        return NOTHING_KNOWN
    data = proto.SerializeToString() if data is None else data
    try:
        copy = plain_model.FromString(data)
    except google.protobuf.message.DecodeError:
        return NOTHING_KNOWN  # a string that is not UTF-8: the look at every field names it
    size = copy.ByteSize()
    copy.DiscardUnknownFields()  # recursive: every message of the copy
    if copy.ByteSize() == size:
        return Survey(text=True, plain=True)
    del copy
    text_model = _copy_of_onnx_proto(frozenset())
    if text_model is None:
        return NOTHING_KNOWN
    try:
        text_model.FromString(data)
    except google.protobuf.message.DecodeError:
        return NOTHING_KNOWN
    return Survey(text=True, plain=False)
