"""Writing a model file whose large inline tensors go from their arrays to the file, never through bytes.

``ModelProto.SerializeToString()`` of a model with a 100 MB weight held as a
numpy array needs three more copies of it: ``tobytes()``, the proto's own
``raw_data`` and the serialized string. Here the proto is serialized with an
empty ``raw_data`` for each large main-graph initializer (a placeholder tensor
of the same name, type and shape stands for it), and the file is written
from that small serialization, with each placeholder's field and the lengths
of the messages around it re-framed, and the array's bytes written in between
in C order (a non-contiguous array, a folded Transpose, a few MiB at a time).

The bytes are exactly those ``SerializeToString()`` of the full proto gives: a
message is the concatenation of its fields' encodings, and a length-delimited
field is its tag, the varint of its length and its content, wherever it sits.
The tests compare the two.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import BinaryIO, Union

import numpy as np

__all__ = ["CHUNK", "initializer_indices", "streamable_array", "write_spliced"]

# Field numbers in onnx.proto: ModelProto.graph, GraphProto.initializer, TensorProto.raw_data.
_GRAPH, _INITIALIZER, _RAW_DATA = 7, 5, 9
_LENGTH_DELIMITED = 2

#: A non-contiguous array is written in C-order blocks of about this size.
CHUNK = 8 << 20


def streamable_array(array: object) -> np.ndarray | None:
    """The array, if writing its buffer in C order gives exactly what onnx_ir's ``tobytes()`` gives.

    That holds for arrays of whole-byte numeric types on a little-endian
    machine (onnx_ir packs 2-, 4- and 6-bit types, and swaps bytes on a
    big-endian one); anything else is left in the proto.
    """
    if sys.byteorder != "little" or not isinstance(array, np.ndarray) or array.dtype.kind in "OSUV":
        return None
    return array


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _read_varint(buf: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _fields(buf: memoryview) -> Iterator[tuple[int, int, int, int]]:
    """(field number, start, content start, end) of each field of a serialized message.

    Only ever run on what protobuf itself serialized, so every field is well formed.
    """
    pos = 0
    while pos < len(buf):
        start = pos
        key, pos = _read_varint(buf, pos)
        wire = key & 7
        if wire == 0:
            _, pos = _read_varint(buf, pos)
            content = pos
        elif wire == 1:
            content, pos = pos, pos + 8
        elif wire == 5:
            content, pos = pos, pos + 4
        elif wire == _LENGTH_DELIMITED:
            length, content = _read_varint(buf, pos)
            pos = content + length
        else:  # groups: not in onnx.proto
            raise ValueError(f"unexpected wire type {wire}")
        yield key >> 3, start, content, pos


#: A piece of the file: bytes of the serialization, or an array whose bytes go there.
Piece = Union[memoryview, np.ndarray]


def _tensor(buf: memoryview, array: np.ndarray) -> tuple[list[Piece], int]:
    """A TensorProto's pieces with its empty ``raw_data`` replaced by ``array``'s bytes."""
    pieces: list[Piece] = []
    size = 0
    for number, start, content, end in _fields(buf):
        if number == _RAW_DATA and end == content:
            head = memoryview(_varint(_RAW_DATA << 3 | _LENGTH_DELIMITED) + _varint(array.nbytes))
            pieces += [head, array]
            size += len(head) + array.nbytes
        else:
            pieces.append(buf[start:end])
            size += end - start
    return pieces, size


def _framed(number: int, pieces: list[Piece], size: int) -> tuple[list[Piece], int]:
    head = memoryview(_varint(number << 3 | _LENGTH_DELIMITED) + _varint(size))
    return [head, *pieces], len(head) + size


def _graph(buf: memoryview, arrays: Mapping[int, np.ndarray]) -> tuple[list[Piece], int]:
    pieces: list[Piece] = []
    size = index = 0
    for number, start, content, end in _fields(buf):
        if number == _INITIALIZER:
            if index in arrays:
                inner, inner_size = _framed(_INITIALIZER, *_tensor(buf[content:end], arrays[index]))
                pieces += inner
                size += inner_size
                index += 1
                continue
            index += 1
        pieces.append(buf[start:end])
        size += end - start
    return pieces, size


def _model(buf: memoryview, arrays: Mapping[int, np.ndarray]) -> list[Piece]:
    pieces: list[Piece] = []
    for number, start, content, end in _fields(buf):
        if number == _GRAPH and arrays:
            pieces += _framed(_GRAPH, *_graph(buf[content:end], arrays))[0]
        else:
            pieces.append(buf[start:end])
    return pieces


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


def write_spliced(file: BinaryIO, serialized: bytes, arrays: Mapping[int, np.ndarray]) -> None:
    """Writes ``serialized`` (a ModelProto) with the main graph's initializers at the given
    indices getting the bytes of their arrays as ``raw_data`` (each serialized with an empty one)."""
    for piece in _model(memoryview(serialized), arrays):
        if isinstance(piece, np.ndarray):
            for block in _c_order_blocks(piece):
                file.write(block)
        else:
            file.write(piece)


def initializer_indices(names: Sequence[str], wanted: Mapping[str, np.ndarray]) -> dict[int, np.ndarray]:
    """The arrays of ``wanted`` by their position among the serialized initializers' ``names``."""
    return {i: wanted[name] for i, name in enumerate(names) if name in wanted}
