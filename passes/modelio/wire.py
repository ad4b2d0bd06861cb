"""The protobuf wire format of a model: walking it, and writing a file from pieces.

Two things are cheaper done on the bytes than on a parsed ``ModelProto``:
leaving large attribute lists out of the parse (:mod:`passes.modelio.detach`)
and writing a large array into the model file without serialising it
(:mod:`passes.modelio.stream`). Both walk the same tree of messages (the
model, its graphs, their nodes and initializers, the nodes' attributes and
the subgraphs these hold) with :func:`rewrite`, which hands every message on
the way to a *visitor* that keeps it, descends into it or replaces its content
with *pieces*; the enclosing length prefixes are fixed up. :func:`write` then
writes the pieces: bytes, :class:`Range` of a source file (copied by the
kernel, :class:`passes.modelio.copy.Copier`), or arrays (their bytes in C order,
a few MiB at a time).

A message is the concatenation of its fields' encodings, and a
length-delimited field is its tag, the varint of its length and its content,
wherever it sits: a file written from pieces holds exactly the bytes the
parsed and re-serialised message would have.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from passes.modelio.copy import Copier

__all__ = [
    "DESCEND", "FileBytes", "Malformed", "Piece", "Range", "combine", "encode_varint", "fields", "rewrite", "size",
    "span", "tag", "varint", "write",
]

#: The field numbers of onnx.proto that lead from a model to its attributes and initializers:
#: message kind -> {field number: child kind}.
CHILDREN: dict[str, dict[int, str]] = {
    "model": {7: "graph", 25: "function"},  # ModelProto.graph, .functions
    "graph": {1: "node", 5: "initializer"},  # GraphProto.node, .initializer
    "function": {7: "node"},  # FunctionProto.node
    "node": {5: "attribute"},  # NodeProto.attribute
    "attribute": {6: "graph", 11: "graph"},  # AttributeProto.g, .graphs
    "initializer": {},
}

#: A visitor's answer: look inside the message's children.
DESCEND = object()

#: A non-contiguous array is written in C-order blocks of about this size.
CHUNK = 8 << 20


class Malformed(ValueError):
    """The bytes are not well-formed protobuf (protobuf's own parse then says what is wrong)."""


@dataclasses.dataclass(frozen=True)
class Range:
    """A piece of output copied from the source file: ``length`` bytes at ``offset``."""

    offset: int
    length: int


Piece = bytes | memoryview | Range | np.ndarray


class FileBytes:
    """A file's bytes, indexed and sliced like ``bytes``, read with ``pread`` a window at a time.

    The walk of a large model file reads only tags, lengths and small fields.
    Through a memory map each of those reads would map the page cache's folio
    around it, up to 2 MiB on recent kernels: a walk touching the start of every
    4 MiB weight of a 500 MiB file took 250 MiB of resident memory. ``pread``
    copies only what is asked for.
    """

    __slots__ = ("_fd", "_size", "_start", "_window")

    WINDOW = 1 << 16

    def __init__(self, fd: int, size: int) -> None:
        self._fd, self._size = fd, size
        self._start, self._window = 0, b""

    def __len__(self) -> int:
        return self._size

    def __getitem__(self, key: int | slice) -> Any:
        if isinstance(key, slice):
            start, stop, _ = key.indices(self._size)
            return self._read(start, max(0, stop - start))
        if not 0 <= key < self._size:
            raise IndexError(key)
        offset = key - self._start
        if not 0 <= offset < len(self._window):
            self._start, self._window = key, self._read(key, self.WINDOW)
            offset = 0
        return self._window[offset]

    def _read(self, offset: int, length: int) -> bytes:
        data = os.pread(self._fd, length, offset)
        if len(data) < min(length, self._size - offset):
            raise Malformed("the file is shorter than it was")
        return data


def span(buf: Any, start: int, end: int) -> bytes | memoryview:
    """``buf[start:end]`` without a copy where ``buf`` is in memory (a :class:`FileBytes` reads it)."""
    return buf[start:end] if isinstance(buf, FileBytes) else memoryview(buf)[start:end]


def varint(buf: Any, pos: int) -> tuple[int, int]:
    """The varint at ``buf[pos]`` and the position after it."""
    result = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise Malformed("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def encode_varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def tag(field: int, wire_type: int = 2) -> bytes:
    return encode_varint(field << 3 | wire_type)


def fields(buf: Any, start: int, end: int) -> Iterator[tuple[int, int, int, int, int]]:
    """``(field, wire type, record start, value start, value end)`` of each field in ``buf[start:end]``."""
    pos = start
    while pos < end:
        record = pos
        key, pos = varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 2:
            length, pos = varint(buf, pos)
            value, pos = pos, pos + length
        elif wire == 0:
            value = pos
            _, pos = varint(buf, pos)
        elif wire == 1:
            value, pos = pos, pos + 8
        elif wire == 5:
            value, pos = pos, pos + 4
        else:  # groups: not in onnx.proto
            raise Malformed(f"wire type {wire}")
        if pos > end:
            raise Malformed("a field runs past its message")
        yield field, wire, record, value, pos


def size(piece: Piece) -> int:
    if isinstance(piece, Range):
        return piece.length
    if isinstance(piece, np.ndarray):
        return piece.nbytes
    return len(piece)


#: ``visitor(kind, start, end, path)``: the message of ``kind`` at ``buf[start:end]``, reached
#: through ``path`` (the kinds above it; a node's domain, as bytes, in place of ``"node"``)
#: -> None (keep it as it is), DESCEND, or the pieces of its new content.
Visitor = Callable[[str, int, int, tuple[Any, ...]], Any]


def rewrite(buf: Any, visitor: Visitor, start: int = 0, end: int | None = None, kind: str = "model",
            path: tuple[Any, ...] = ()) -> list[Piece] | None:  # fmt: skip
    """The content of the message ``buf[start:end]`` with what ``visitor`` replaced, as pieces (None: unchanged).

    The visitor sees every message below the model (not the model itself), and
    should answer None cheaply where nothing can change (by size, say): a
    message it keeps is skipped, never walked.

    Raises:
        Malformed: the bytes are not protobuf.
    """
    end = len(buf) if end is None else end
    answer = visitor(kind, start, end, path) if path else DESCEND
    if answer is None:
        return None
    if answer is not DESCEND:
        return list(answer)
    label: Any = kind
    if kind == "node":  # NodeProto.domain (field 7) comes after the attributes
        label = next((bytes(buf[v:e]) for f, w, _, v, e in fields(buf, start, end) if f == 7 and w == 2), b"")
    children = CHILDREN[kind]
    pieces: list[Piece] = []
    done = start
    for field, wire, record, value, value_end in fields(buf, start, end):
        child = children.get(field)
        if child is None or wire != 2:
            continue
        inner = rewrite(buf, visitor, value, value_end, child, (*path, label))
        if inner is None:
            continue
        pieces += [span(buf, done, record), tag(field) + encode_varint(sum(map(size, inner))), *inner]
        done = value_end
    if not pieces:
        return None
    pieces.append(span(buf, done, end))
    return pieces


def combine(*visitors: Visitor) -> Visitor:
    """One visitor asking each in turn: the first pieces win, then DESCEND if any descends, else None."""

    def visit(kind: str, start: int, end: int, above: tuple[Any, ...]) -> Any:
        answer = None
        for visitor in visitors:
            found = visitor(kind, start, end, above)
            if found is DESCEND:
                answer = DESCEND
            elif found is not None:
                return found
        return answer

    return visit


def _c_order_blocks(array: np.ndarray) -> Iterator[np.ndarray]:
    """The array's bytes in C order, as contiguous uint8 arrays (a view where the array is contiguous)."""
    if array.flags.c_contiguous:
        yield array.reshape(-1).view(np.uint8)
        return
    row = array[0].nbytes  # a non-contiguous array has a dimension
    if row > CHUNK and array.ndim > 1:
        for sub in array:
            yield from _c_order_blocks(sub)
        return
    rows = max(1, CHUNK // max(1, row))
    for i in range(0, len(array), rows):
        yield np.ascontiguousarray(array[i : i + rows]).reshape(-1).view(np.uint8)


def write(path: str | os.PathLike[str], pieces: Sequence[Piece], source: str | None = None,
          progress: Callable[[int], None] | None = None) -> None:  # fmt: skip
    """Writes ``pieces`` to a new file at ``path``; a :class:`Range` is copied from the file ``source``.

    ``progress`` is called with the bytes of each :class:`Range` and array written.
    """
    with open(path, "wb") as out, contextlib.ExitStack() as stack:
        src = stack.enter_context(open(source, "rb")) if source is not None else None
        fd, position = out.fileno(), 0
        copier = Copier()
        for piece in pieces:
            if isinstance(piece, Range):
                if src is None:
                    raise ValueError("a piece of a source file, and no source")
                copier.copy(src.fileno(), piece.offset, fd, position, piece.length)
                position += piece.length
                if progress is not None:
                    progress(piece.length)
                continue
            array = isinstance(piece, np.ndarray)
            for block in _c_order_blocks(piece) if array else (piece,):
                view = memoryview(block).cast("B")
                while view:
                    written = os.pwrite(fd, view, position)
                    view, position = view[written:], position + written
                if array and progress is not None:
                    progress(block.nbytes)
