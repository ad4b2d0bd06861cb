"""Large list attributes left in the file as bytes until something reads them.

A tree ensemble's ``nodes_*`` lists hold tens of millions of numbers: parsed
by protobuf they cost 8 bytes an element (5.6x the file for a 217 MB model),
and onnx_ir turns each into a Python object (27 s of a 33 s run, 3.3 GB).
No pass rewrites the ops that hold them, so in a file of at least
:data:`MIN_FILE` bytes every ``INTS``/``FLOATS``/``STRINGS`` attribute record
of at least :data:`MIN_ATTRIBUTE` encoded bytes of a node outside the ONNX
domain (``ai.onnx.ml``, custom ops) is cut out of the bytes *before* protobuf
parses them, by walking the wire format (tags and lengths; the payloads are
skipped, never touched): the parsed model holds a *marker* in its place, an
attribute of the same name and type with no values and a ``doc_string`` that
names the record (:func:`read_view`). The ONNX operators' lists are left
alone: shape inference reads them (a Constant's list is its shape), and so
do the passes.

In the IR each marker becomes a :class:`DetachedAttr`, an ``ir.Attr`` whose
value is decoded from the file on first access, so a pass that does read it
gets the real value (one implementation of every pass; nothing is hidden from
them). Saving writes markers again and then copies each record from the
input file into the output by the kernel (:func:`splice_visitor`, written by
:func:`passes.modelio.wire.write`), fixing the
enclosing length prefixes: the output holds the bytes a decode and re-encode
would give, without either.

The same walk leaves large weights in the file: a main-graph initializer of
more than :data:`passes.modelio.views.LARGE` bytes of ``raw_data`` and no
field but its name, dims, type and doc string (a plain weight) is parsed as a
stand-in without its data, marked in its ``doc_string`` (:class:`Weight`
records where the bytes are); the loader gives the IR an
:class:`~passes.ir.tensors.InlineData` tensor over those bytes, read only
when a pass reads it, and saving copies them from the input file by the
kernel like a detached attribute. A 1.5 GB model whose weights no pass
changes is never read into memory.

Marker strings carry a random per-process nonce, so no input can forge one.
The checker runs on the markers; where a list's length matters to inference
and the view fails, the whole model decides (``modelio.load.check_view``).
onnxruntime's check loads the real files.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import secrets
from collections.abc import Iterator
from typing import Any

import onnx
import onnx_ir as ir

from passes.errors import InputError, first_line
from passes.modelio import views as _views
from passes.modelio import wire

__all__ = [
    "MIN_ATTRIBUTE", "MIN_FILE", "DetachedAttr", "Source", "View", "Weight", "attach", "marker_key", "materialized",
    "read_view", "source_file", "splice_visitor", "swapped", "weight_key",
]

#: Files smaller than this are parsed as they are (walking them would cost more than it saves).
MIN_FILE = 1 << 24
#: Attribute records at least this long (encoded) are detached.
MIN_ATTRIBUTE = 1 << 18

_NONCE = secrets.token_hex(8)
_PREFIX = f"onnx-optimize:detached:{_NONCE}:"
_PREFIX_BYTES = _PREFIX.encode()
# AttributeProto.AttributeType values of the lists that are detached: FLOATS, INTS, STRINGS.
_LISTS = frozenset({6, 7, 8})
# The ONNX operators' lists are read by shape inference (a Constant's length is its shape) and
# by the passes: only other domains' (``ai.onnx.ml``, custom ops) are detached.
_ONNX_DOMAINS = frozenset({b"", b"ai.onnx"})
#: ``ir.Model.meta`` key: the file the model's detached attributes are in (not serialised by onnx_ir).
_META_KEY = "onnx_optimize.detached"


@dataclasses.dataclass(frozen=True)
class Source:
    """Where a detached attribute record is: ``length`` bytes at ``offset`` of the file ``path``."""

    path: str
    offset: int
    length: int


@dataclasses.dataclass(frozen=True)
class Weight:
    """A weight left in the file: its ``raw_data`` is ``source``; the stand-in's real ``doc_string``."""

    source: Source
    doc_string: str | None


@dataclasses.dataclass
class View:
    """A model file parsed with its large lists and weights left in the file (see the module docstring)."""

    proto: onnx.ModelProto
    #: The detached attribute records, by marker key.
    attributes: dict[str, Source]
    #: The weights left in the file, by marker key (see :func:`weight_key`).
    weights: dict[str, Weight]
    #: The bytes ``proto`` was parsed from (the load's survey reads them instead of serialising it again).
    data: bytes | None = None

    @property
    def detached(self) -> bool:
        return bool(self.attributes or self.weights)


def _list_attribute(buf: Any, fd: int, start: int, end: int) -> tuple[bytes, int] | None:
    """The name and type of the attribute record ``buf[start:end]`` if it is a list (not a reference).

    proto2 does not pack repeated fields, so a list is one field per element and
    ``type`` (field 20) comes after them: past the name, the first field tells
    whether this may be a list (``floats``, ``ints``, ``strings``: fields 7-9;
    anything else, a subgraph above all, is not parsed), and then protobuf
    parses the record (read with ``pread`` at once) as an :func:`_header`
    message, which knows only ``name``, ``type`` and ``ref_attr_name``: the
    elements stay bytes (unknown fields), never numbers, and are dropped at once.
    """
    for field, _, _, _, _ in wire.fields(buf, start, end):
        if field == 1:
            continue
        if field not in (7, 8, 9):
            return None
        break
    else:
        return None
    data = os.pread(fd, end - start, start)
    if len(data) != end - start:
        raise wire.Malformed("the file is shorter than it was")
    try:
        header = _header().FromString(data)
    except Exception as e:  # a DecodeError: protobuf's parse of the whole file reports it
        raise wire.Malformed(first_line(e)) from e
    if header.HasField("ref_attr_name") or header.type not in _LISTS:
        return None
    return header.name, header.type


@functools.cache
def _header() -> Any:
    """A protobuf message class with only AttributeProto's ``name``, ``type`` and ``ref_attr_name``."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    field = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(name="onnx_optimize_attribute_header.proto", package="onnx_optimize")
    message = file.message_type.add(name="AttributeHeader")
    message.field.add(name="name", number=1, type=field.TYPE_BYTES, label=field.LABEL_OPTIONAL)
    message.field.add(name="type", number=20, type=field.TYPE_INT64, label=field.LABEL_OPTIONAL)
    message.field.add(name="ref_attr_name", number=21, type=field.TYPE_BYTES, label=field.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("onnx_optimize.AttributeHeader"))


def _marker(name: bytes, kind: int, key: str) -> bytes:
    """An AttributeProto's content: ``name`` (field 1), ``type`` (20), ``doc_string`` (13) naming the record."""
    doc = (_PREFIX + key).encode()
    return (wire.tag(1) + wire.encode_varint(len(name)) + name + wire.tag(20, 0) + wire.encode_varint(kind)
            + wire.tag(13) + wire.encode_varint(len(doc)) + doc)  # fmt: skip


# --- reading -----------------------------------------------------------------------------------


def read_view(path: str | os.PathLike[str]) -> View:
    """The model at ``path``, parsed with its large list attributes and weights left in the file.

    Returns:
        The view (no records and no weights for a file under :data:`MIN_FILE`
        or without either: then the proto is the file as it is).

    Raises:
        OSError: the file cannot be read.
        google.protobuf.message.DecodeError: the file is not a protobuf message.
    """
    path = os.fspath(path)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < MIN_FILE:
            data = f.read()
            return View(onnx.ModelProto.FromString(data), {}, {}, data)
        buf = wire.FileBytes(f.fileno(), size)
        sources: dict[str, Source] = {}
        weights: dict[str, Weight] = {}
        names: set[bytes] = set()

        def visit(kind: str, start: int, end: int, above: tuple[object, ...]) -> object:
            if kind == "initializer":
                if end - start <= _views.LARGE or above != ("model", "graph"):
                    return None
                found = _plain_weight(buf, start, end)
                if found is None:
                    return None
                name, raw, doc, kept = found
                if name in names:  # two initializers of one name: protobuf's parse decides, checked
                    raise wire.Malformed("a repeated initializer name")
                names.add(name)
                key = str(len(weights))
                weights[key] = Weight(Source(path, *raw), doc)
                marker = (_PREFIX + _WEIGHT + key).encode()
                return [*kept, wire.tag(_TENSOR_DOC) + wire.encode_varint(len(marker)) + marker]
            if end - start < MIN_ATTRIBUTE:
                return None  # too small to hold a large attribute
            if kind != "attribute":
                return wire.DESCEND
            if above[-1] not in _ONNX_DOMAINS:
                found = _list_attribute(buf, f.fileno(), start, end)
                if found is not None:
                    key = str(len(sources))
                    sources[key] = Source(path, start, end - start)
                    return [_marker(*found, key)]
            return wire.DESCEND  # a graph attribute's subgraph may hold some

        try:
            chunks = wire.rewrite(buf, visit)
        except wire.Malformed:
            chunks = None
        if chunks is None:
            data = f.read()
            return View(onnx.ModelProto.FromString(data), {}, {}, data)
        data = b"".join(chunks)  # type: ignore[arg-type]
        del chunks
    return View(onnx.ModelProto.FromString(data), sources, weights, data)


# TensorProto's fields: dims, data_type, name, raw_data, doc_string.
_DIMS, _DATA_TYPE, _TENSOR_NAME, _RAW_DATA, _TENSOR_DOC = 1, 2, 8, 9, 12
#: Marks a weight's key (after the prefix) apart from an attribute record's.
_WEIGHT = "w"


def _plain_weight(buf: Any, start: int, end: int) -> tuple[bytes, tuple[int, int], str | None, list[Any]] | None:
    """``(name, (raw data offset, length), doc_string, the other fields' bytes)`` of a plain weight record.

    Plain: a name (UTF-8, not empty), dims, a numeric type of whole bytes, and
    ``raw_data`` of exactly the bytes they declare (:mod:`passes.modelio.validate`
    would refuse anything else, so such a record is left for it to see), each
    field once, a doc string only if not empty (onnx_ir would not write an empty
    one back), and nothing else. Only tags, lengths and the small fields are
    read. None for any other record.
    """
    dims: list[int] = []
    seen: dict[int, tuple[int, int]] = {}
    kept: list[Any] = []
    for field, wire_type, record, value, value_end in wire.fields(buf, start, end):
        if field == _DIMS and wire_type == 0:
            dims.append(wire.varint(buf, value)[0])
        elif field == _DIMS and wire_type == 2:
            pos = value
            while pos < value_end:
                dim, pos = wire.varint(buf, pos)
                dims.append(dim)
        elif field in seen or field not in (_DATA_TYPE, _TENSOR_NAME, _RAW_DATA, _TENSOR_DOC) or (
            wire_type != (0 if field == _DATA_TYPE else 2)
        ):
            return None
        else:
            seen[field] = (value, value_end)
        if field not in (_RAW_DATA, _TENSOR_DOC):
            kept.append(wire.span(buf, record, value_end))
    if _RAW_DATA not in seen or _TENSOR_NAME not in seen or _DATA_TYPE not in seen:
        return None
    if _TENSOR_DOC in seen and seen[_TENSOR_DOC][0] == seen[_TENSOR_DOC][1]:
        return None
    try:
        dtype = ir.DataType(wire.varint(buf, seen[_DATA_TYPE][0])[0])
        name = bytes(buf[slice(*seen[_TENSOR_NAME])])
        name.decode()
        doc = bytes(buf[slice(*seen[_TENSOR_DOC])]).decode() if _TENSOR_DOC in seen else None
    except (ValueError, UnicodeDecodeError):
        return None
    if not name or dtype in (ir.DataType.UNDEFINED, ir.DataType.STRING) or dtype.bitwidth % 8:
        return None
    count = 1
    for dim in dims:
        if dim >= 1 << 63:  # a negative dimension
            return None
        count *= dim
    raw_start, raw_end = seen[_RAW_DATA]
    if count * dtype.bitwidth // 8 != raw_end - raw_start or raw_end - raw_start <= _views.LARGE:
        return None  # (the checker's view leaves out exactly the weights over LARGE: see views)
    return name, (raw_start, raw_end - raw_start), doc, kept


def weight_key(doc_string: str | None) -> str | None:
    """The key of a weight's stand-in marker (None: not a stand-in of this process)."""
    key = marker_key(doc_string)
    return key[len(_WEIGHT):] if key is not None and key.startswith(_WEIGHT) else None


def source_file(model: ir.Model) -> str | None:
    """The file the model's detached attributes are read from (None: it has none)."""
    return model.meta.get(_META_KEY) or None


def marker_key(doc_string: str | None) -> str | None:
    """The key of a marker's ``doc_string`` (None: not a marker of this process)."""
    if doc_string and doc_string.startswith(_PREFIX):
        return doc_string[len(_PREFIX):]
    return None


class DetachedAttr(ir.Attr):
    """An attribute whose value stays in the input file until it is read (then decoded once)."""

    __slots__ = ("source",)

    def __init__(self, name: str, type: ir.AttributeType, source: Source) -> None:
        super().__init__(name, type, None)
        self.source = source

    @property
    def value(self) -> Any:
        if self._value is None:
            self._value, self.doc_string = _decode(self.source, self.name, self.type)
        return self._value

    @property
    def loaded(self) -> bool:
        return self._value is not None


def _decode(source: Source, name: str, kind: ir.AttributeType) -> tuple[Any, str | None]:
    try:
        fd = os.open(source.path, os.O_RDONLY)
        try:
            data = os.pread(fd, source.length, source.offset)
        finally:
            os.close(fd)
        if len(data) != source.length:
            raise ValueError("the file is shorter than it was")
        attr = ir.serde.deserialize_attribute(onnx.AttributeProto.FromString(data))
    except (OSError, ValueError, RuntimeError) as e:  # a DecodeError, invalid UTF-8...
        raise InputError(f"attribute {name!r}: cannot read it from the model file ({first_line(e)})") from e
    if attr.name != name or attr.type != kind:
        raise InputError(f"attribute {name!r}: the model file changed since it was loaded")
    return attr.value, attr.doc_string


def attach(model: ir.Model, sources: dict[str, Source]) -> None:
    """Replaces each marker attribute of ``model`` (built from :func:`read_view`'s proto) by a :class:`DetachedAttr`."""
    if not sources:
        return
    model.meta[_META_KEY] = next(iter(sources.values())).path  # one read_view's: one file
    for root in (model.graph, *model.functions.values()):
        for node in ir.traversal.RecursiveGraphIterator(root):
            for name, attr in list(node.attributes.items()):
                key = marker_key(attr.doc_string) if isinstance(attr, ir.Attr) else None
                if key is not None and key in sources:
                    node.attributes[name] = DetachedAttr(name, attr.type, sources[key])


# --- writing -----------------------------------------------------------------------------------


@contextlib.contextmanager
def swapped(model: ir.Model) -> Iterator[dict[str, Source]]:
    """Within the block, every :class:`DetachedAttr` of ``model`` is a marker again; yields their sources.

    Serialising the model in the block gives markers that :func:`splice_visitor`
    (or :func:`materialized`) replaces by the records. The attributes are put
    back when the block ends.
    """
    sources: dict[str, Source] = {}
    swaps: list[tuple[ir.Node, str, ir.Attr]] = []
    if not model.meta.get(_META_KEY):  # the common case: nothing was detached, nothing to walk
        yield sources
        return
    try:
        for root in (model.graph, *model.functions.values()):
            for node in ir.traversal.RecursiveGraphIterator(root):
                for name, attr in list(node.attributes.items()):
                    if isinstance(attr, DetachedAttr):
                        key = str(len(sources))
                        sources[key] = attr.source
                        swaps.append((node, name, attr))
                        node.attributes[name] = ir.Attr(name, attr.type, (), doc_string=_PREFIX + key)
        yield sources
    finally:
        for node, name, attr in swaps:
            node.attributes[name] = attr


def materialized(proto: onnx.ModelProto, sources: dict[str, Source]) -> None:
    """Replaces the markers in ``proto`` by the records they stand for (read now), in place."""
    if not sources:
        return
    stack: list[Any] = [proto.graph, *proto.functions]
    while stack:
        body = stack.pop()
        for node in body.node:
            for attr in node.attribute:
                key = marker_key(attr.doc_string)
                if key is not None and key in sources:
                    source = sources[key]
                    with open(source.path, "rb") as f:
                        f.seek(source.offset)
                        attr.ParseFromString(f.read(source.length))
                elif attr.type == onnx.AttributeProto.GRAPH:
                    stack.append(attr.g)
                elif attr.type == onnx.AttributeProto.GRAPHS:
                    stack.extend(attr.graphs)


def splice_visitor(data: bytes, sources: dict[str, Source]) -> wire.Visitor:
    """The visitor that puts back, in the serialised model ``data``, the record of each marker of ``sources``.

    Only messages holding the marker prefix are walked (a search in C), and only
    markers this process wrote (the nonce) with a key of ``sources`` are replaced.
    """

    def visit(kind: str, start: int, end: int, above: tuple[object, ...]) -> object:
        if data.find(_PREFIX_BYTES, start, end) < 0:
            return None
        if kind != "attribute":
            return wire.DESCEND
        for field, wire_type, _, value, value_end in wire.fields(data, start, end):
            if field == 13 and wire_type == 2:  # AttributeProto.doc_string
                key = marker_key(bytes(data[value:value_end]).decode("utf-8", "replace"))
                if key is not None and key in sources:
                    source = sources[key]
                    return [wire.Range(source.offset, source.length)]
        return wire.DESCEND

    return visit
