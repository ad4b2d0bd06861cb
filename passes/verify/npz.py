"""Reading ``--inputs FILE.npz`` without trusting it: the zip directory and each array's header first.

An ``.npz`` is a zip of ``.npy`` members. Nothing is decompressed beyond the
headers until every member names a graph input, declares a dtype and a shape
that input accepts, holds the bytes its header declares, and the total fits
:data:`~passes.verify.defaults.MAX_GENERATED_BYTES`: a small file that expands
to gigabytes is refused before it is read. Loading then reads each member's
declared bytes only (numpy reads exactly the header's element count).

numpy saves an array of a type it lacks (ml_dtypes' ``bfloat16``) as raw
bytes (``|V2``): such a member is taken as the input's type when the input
takes ``bfloat16`` and loaded as a view of those bytes.
"""

from __future__ import annotations

import dataclasses
import math
import os
import pathlib
import zipfile
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from passes.verify.defaults import MAX_GENERATED_BYTES
from passes.verify.result import shown, shown_names

__all__ = ["Member", "given", "inspect", "load"]


@dataclasses.dataclass(frozen=True)
class Member:
    """One array of the file, as its header declares it."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    #: Stored as raw bytes of the dtype's size (numpy's form of an ml_dtypes array): load views them.
    raw: bool = False


def _header(stream: zipfile.ZipExtFile) -> tuple[tuple[int, ...], bool, np.dtype]:
    version = np.lib.format.read_magic(stream)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(stream)
    if version == (2, 0):
        return np.lib.format.read_array_header_2_0(stream)
    return np.lib.format._read_array_header(stream, version)  # 3.0: utf-8 field names  # noqa: SLF001


def _size(nbytes: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes / (1 << shift):.1f} {unit}"
    return f"{nbytes} bytes"


def _fits(declared: Sequence[int | str | None], shape: tuple[int, ...]) -> bool:
    if len(declared) != len(shape):
        return False
    return all(not isinstance(d, int) or d == s for d, s in zip(declared, shape))


def inspect(
    path: str,
    inputs: Mapping[str, tuple[str | None, Sequence[int | str | None] | None]],
    *,
    limit: int = MAX_GENERATED_BYTES,
) -> list[Member]:
    """Validates the file against the graph inputs without loading any array.

    Args:
        path: The ``.npz`` file.
        inputs: Each graph input's numpy dtype name and declared dims (None: unknown).
        limit: Most bytes the arrays may hold together.

    Returns:
        The members, one per input they name.

    Raises:
        ValueError: not a zip of ``.npy`` arrays, a member that names no input, an
            object array, a dtype or shape the input does not take, a member
            shorter than its header says, or more than ``limit`` bytes in total.
    """
    members: list[Member] = []
    total = 0
    try:
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as e:
        raise ValueError(f"cannot read inputs (not an .npz archive of arrays by input name: {e})") from e
    with archive:
        for info in archive.infolist():
            if info.is_dir():
                continue
            if not info.filename.endswith(".npy"):
                raise ValueError(f"cannot read inputs (member {shown(info.filename)} is not a .npy array)")
            name = info.filename[: -len(".npy")]
            if name not in inputs:
                known = shown_names(list(inputs)) or "none"
                raise ValueError(f"{shown(name)} is not an input of the model (inputs: {known})")
            try:
                with archive.open(info) as stream:
                    shape, _, dtype = _header(stream)
                    header_bytes = stream.tell()
            except (ValueError, OSError, EOFError, zipfile.BadZipFile, SyntaxError) as e:
                why = " ".join(str(e).split())[:200] or type(e).__name__  # numpy's header errors span lines
                raise ValueError(
                    f"cannot read inputs (member {shown(name)} is not a readable .npy array: {why})") from e
            if any(d < 0 for d in shape):
                raise ValueError(f"cannot read inputs (member {shown(name)} declares the shape {list(shape)}: "
                                 "a negative dimension)")  # fmt: skip
            if dtype.hasobject:
                raise ValueError(
                    f"cannot read inputs (member {shown(name)} holds Python objects; only arrays are read)")
            nbytes = math.prod(shape) * dtype.itemsize
            if header_bytes + nbytes > info.file_size:
                raise ValueError(
                    f"cannot read inputs (member {shown(name)} declares {_size(nbytes)} of data but holds "
                    f"{_size(max(info.file_size - header_bytes, 0))})"
                )
            total += nbytes
            if total > limit:
                raise ValueError(
                    f"cannot read inputs (member {shown(name)}, {list(shape)} {dtype}, brings them to "
                    f"{_size(total)}, over the check's limit of {_size(limit)})"
                )
            want_dtype, want_dims = inputs[name]
            raw = want_dtype in _RAW_TYPES and dtype == np.dtype(f"V{_RAW_TYPES[want_dtype]}")
            if raw:
                dtype = np.dtype(_raw_type(want_dtype))
            if want_dtype is not None and want_dtype != "str" and str(dtype) != want_dtype:
                raise ValueError(f"input {shown(name)} takes {want_dtype}; the file holds {dtype}")
            if want_dims is not None and not _fits(want_dims, tuple(shape)):
                declared = [d if d is not None else "?" for d in want_dims]
                raise ValueError(f"input {shown(name)} is declared {declared}; the file holds {list(shape)}")
            members.append(Member(name, str(dtype), tuple(int(d) for d in shape), nbytes, raw))
    return members


#: Types numpy lacks that the check takes, by item size (their arrays are saved as ``|V<size>``).
_RAW_TYPES = {"bfloat16": 2}


def _raw_type(name: str) -> np.dtype:
    import ml_dtypes  # slow to import: only for a file that needs it

    return np.dtype(getattr(ml_dtypes, name))


def load(path: str, names: Sequence[str], raw: Mapping[str, str] | None = None) -> dict[str, np.ndarray]:
    """Loads the named members (already inspected): each read up to its header's size.

    ``raw`` maps the members stored as raw bytes (``Member.raw``) to the type they hold.
    """
    raw = raw or {}
    with np.load(path, allow_pickle=False) as data:
        arrays = {name: data[name] for name in names}
    return {name: a.view(_raw_type(raw[name])) if name in raw else a for name, a in arrays.items()}


def given(folder: pathlib.Path, inputs: Mapping[str, Any], inputs_file: str | None,
          specs: Sequence[Any]) -> tuple[dict[str, Any] | None, str | None]:  # fmt: skip
    """The check's given inputs (``inputs`` arrays, saved into ``folder``, or ``inputs_file``) as an
    inspected ``.npz`` against the graph inputs ``specs`` (:class:`passes.verify.feeds.InputSpec`):
    its path, names, shapes and raw members, or why they are refused; (None, None) for none."""
    path = os.path.abspath(inputs_file) if inputs_file is not None else None
    if inputs:
        path = str(folder / "given.npz")
        np.savez(path, **{k: np.asarray(v) for k, v in inputs.items()})
    if path is None:
        return None, None
    declared = {s.name: (s.dtype, s.dims if s.dtype is not None else None) for s in specs}
    try:
        members = inspect(path, declared)
    except ValueError as e:
        return None, str(e)
    return {"path": path, "names": [m.name for m in members], "shapes": {m.name: m.shape for m in members},
            "raw": {m.name: m.dtype for m in members if m.raw}}, None
