"""Paths a run reads or writes, each looked at on its own.

How a path is shown in a message (:func:`shown`), the data file saving a model
writes next to it (:func:`data_file_of`), whether a destination may be written
(:func:`check_writable`: absent or a regular file) and named to onnx
(:func:`check_encodable`: UTF-8 text), and the external-data locations a model
refers to (:func:`external_locations`). The loader, the save and the check use
them; :mod:`passes.modelio.destinations` adds the checks that need the whole run
(which files it reads, which it writes) and the loader.
"""

from __future__ import annotations

import os
import pathlib
import stat
from typing import TYPE_CHECKING

from passes.errors import InputError, cut
from passes.lazy import lazy_module

if TYPE_CHECKING:
    import google.protobuf.message
    import onnx
else:  # an early error (a missing file) must not pay for importing onnx
    onnx = lazy_module("onnx")
    _protobuf = lazy_module("google.protobuf.message")

__all__ = ["check_encodable", "check_writable", "data_file_of", "external_locations", "shown"]

_KINDS = (
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a folder"),
)


def shown(path: str | os.PathLike[str], limit: int = 200) -> str:
    """``path`` for a message: undecodable bytes as ``\\xNN``, at most ``limit`` characters."""
    return cut(os.fsencode(path).decode("utf-8", "backslashreplace"), limit)


def data_file_of(destination: pathlib.Path) -> pathlib.Path:
    """The external-data file that saving ``destination`` writes (``NAME.data`` next to it)."""
    return destination.with_name(destination.name + ".data")


def check_writable(path: pathlib.Path, label: str) -> None:
    """Refuses ``path`` unless it is absent (a dangling symlink counts) or names a regular file.

    Raises:
        InputError: it is a device, a FIFO, a socket or a folder, or cannot be looked at.
    """
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return
    except NotADirectoryError:
        raise InputError(f"{label}: a part of the path is not a folder") from None
    except (OSError, ValueError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise InputError(f"{label}: cannot use this path ({reason})") from e
    if stat.S_ISREG(info.st_mode):
        return
    kind = next((name for test, name in _KINDS if test(info.st_mode)), "not a regular file")
    raise InputError(f"{label}: is {kind}, not a regular file; refusing to replace it")


def check_encodable(path: pathlib.Path | str, label: str, why: str) -> None:
    """Refuses a path that is not valid UTF-8 text (bytes the file system decoding could not read).

    Raises:
        InputError: it holds such bytes; ``why`` says what needs the text.
    """
    try:
        os.fspath(path).encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(f"{label}: the path is not valid UTF-8 text; {why}") from None


def external_locations(proto: onnx.ModelProto) -> set[str]:
    """The external-data locations any tensor of ``proto`` refers to, at any depth."""
    found: set[str] = set()
    stack: list[google.protobuf.message.Message] = [proto]
    while stack:
        message = stack.pop()
        if isinstance(message, onnx.TensorProto) and message.data_location == onnx.TensorProto.EXTERNAL:
            found.update(e.value for e in message.external_data if e.key == "location")
        for field, value in message.ListFields():
            if field.type == field.TYPE_MESSAGE:
                if isinstance(value, _protobuf.Message):
                    stack.append(value)
                else:
                    stack.extend(value)
    return found
