"""Large inline arrays written from memory into the model file, never through bytes.

``ModelProto.SerializeToString()`` of a model with a 100 MB weight held as a
numpy array needs three more copies of it: ``tobytes()``, the proto's own
``raw_data`` and the serialized string. Instead the proto is serialized with
an empty ``raw_data`` for each large main-graph initializer (a placeholder
tensor of the same name, type and shape stands for it), and
:func:`array_visitor` gives :func:`passes.modelio.wire.rewrite` the array in
that field's place: the file holds exactly the bytes ``SerializeToString()``
of the full proto gives (the tests compare the two).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from passes.modelio import wire

__all__ = ["array_visitor", "streamable_array"]

# Field numbers in onnx.proto: TensorProto.name, TensorProto.raw_data.
_NAME, _RAW_DATA = 8, 9


def streamable_array(array: object) -> np.ndarray | None:
    """The array, if writing its buffer in C order gives exactly what onnx_ir's ``tobytes()`` gives.

    That holds for arrays of whole-byte numeric types on a little-endian
    machine (onnx_ir packs 2-, 4- and 6-bit types, and swaps bytes on a
    big-endian one); anything else is left in the proto.
    """
    if sys.byteorder != "little" or not isinstance(array, np.ndarray) or array.dtype.kind in "OSUV":
        return None
    return array


def array_visitor(data: bytes, arrays: Mapping[str, np.ndarray | wire.Range]) -> wire.Visitor:
    """The visitor that fills the empty ``raw_data`` of the main graph's initializers named in ``arrays``
    (an array, or a :class:`~passes.modelio.wire.Range` of the source file: a weight left there)."""

    def visit(kind: str, start: int, end: int, above: tuple[Any, ...]) -> Any:
        if kind == "graph" and above == ("model",):
            return wire.DESCEND
        if kind != "initializer" or above != ("model", "graph"):
            return None
        found = [(f, r, v, e) for f, w, r, v, e in wire.fields(data, start, end) if f in (_NAME, _RAW_DATA) and w == 2]
        name = next((bytes(data[v:e]).decode("utf-8", "replace") for f, _, v, e in found if f == _NAME), None)
        array = arrays.get(name) if name is not None else None
        if array is None or not any(f == _RAW_DATA and v == e for f, _, v, e in found):
            return None
        pieces: list[wire.Piece] = []
        for field, _, record, value, value_end in wire.fields(data, start, end):
            if field == _RAW_DATA and value == value_end:
                pieces += [wire.tag(_RAW_DATA) + wire.encode_varint(wire.size(array)), array]
            else:
                pieces.append(memoryview(data)[record:value_end])
        return pieces

    return visit
