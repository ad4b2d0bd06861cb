"""What a run may write to: regular files or new paths, and only its own data file.

* :func:`check_writable` (from :mod:`passes.modelio.paths`, with the other
  checks of one path): a destination that exists must be a regular file
  (a symlink is followed to see what it names). Renaming over anything else
  replaces it, and as root that includes ``/dev/null`` itself; a FIFO, a
  socket, a device or a folder is refused instead.
* :func:`check_encodable` (also from ``paths``): onnx and onnxruntime take
  paths as UTF-8 text, so a path with bytes that are not UTF-8 cannot be
  checked (or, for a data file, even named inside the model).
* :func:`check_destinations` and :func:`check_report`: nothing the run
  writes may be a file it reads (the input, its external data, ``--inputs``).
* :func:`check_data_file`: ``OUT.data`` may be replaced only when it is
  ``OUT``'s own data file, i.e. the existing ``OUT`` is a model that refers to
  it. Otherwise it may hold another model's weights (that model would then
  compute with ours), and it is refused unless the caller says to replace it.
"""

from __future__ import annotations

import os
import pathlib
import stat
from collections.abc import Iterable
from typing import TYPE_CHECKING

from passes.errors import InputError
from passes.lazy import lazy_module
from passes.limits import PROTOBUF_MAX
from passes.modelio.load import data_files, read_graph
from passes.modelio.paths import check_encodable, check_writable, data_file_of, external_locations, shown

if TYPE_CHECKING:
    import onnx_ir as ir
else:  # an early error (a missing file) must not pay for importing onnx
    _protobuf = lazy_module("google.protobuf.message")

# The path helpers (passes.modelio.paths) are named here too: the save and the check take them from here.
__all__ = ["check_data_file", "check_destinations", "check_encodable", "check_report", "check_writable",
           "data_file_of", "external_locations", "shown"]


def _refers_to(model_path: pathlib.Path, data: pathlib.Path) -> bool:
    """Whether the file at ``model_path`` is an ONNX model with external data in ``data``."""
    try:
        info = os.stat(model_path)
        if not stat.S_ISREG(info.st_mode) or not 0 < info.st_size < PROTOBUF_MAX:
            return False
        proto, _ = read_graph(model_path)
    except (OSError, ValueError, RuntimeError, UnicodeDecodeError, _protobuf.DecodeError):
        return False
    target = os.path.normpath(data.name)
    return any(os.path.normpath(location) == target for location in external_locations(proto))


def check_data_file(destination: pathlib.Path, *, replace: bool = False) -> None:
    """Refuses to replace an existing ``NAME.data`` that is not ``destination``'s own.

    Args:
        destination: The model file about to be written.
        replace: Replace the data file whoever it belongs to (``--replace-data``).

    Raises:
        InputError: the data file exists, is not a regular file, or (unless
            ``replace``) is not referred to by the model now at ``destination``.
    """
    data = data_file_of(destination)
    check_writable(data, f"{shown(data)} (the output's data file)")
    if replace or not os.path.lexists(data) or _refers_to(destination, data):
        return
    owner = "which does not exist" if not os.path.lexists(destination) else "which does not refer to it"
    raise InputError(
        f"{shown(data)}: exists and is not the data file of {shown(destination)} ({owner}); it may hold "
        "another model's weights, so it is not replaced (--replace-data replaces it)"
    )


def check_destinations(src: pathlib.Path, dst: pathlib.Path, report: str | os.PathLike[str] | None,
                        model: ir.Model, replace_data: bool = False,
                        reads: Iterable[str | os.PathLike[str]] = ()) -> None:  # fmt: skip
    """Refuses, before any work, what the run must not write.

    * OUTPUT (or its ``.data`` file, or the report) overwriting a file the run
      reads (the input's files, and ``reads``: ``--inputs FILE.npz``) other than
      by replacing the input model as a whole (``-o INPUT``);
    * OUTPUT, OUTPUT.data or the report existing as anything but a regular file
      (a device, a FIFO, a socket, a folder): only regular files and new paths
      are written;
    * OUTPUT.data that is not OUTPUT's own data file, when the model has external
      data (so the output will too), unless ``replace_data``; the commit checks
      again whatever the output turns out to need;
    * an OUTPUT path that is not UTF-8 text (onnx could not check the output).

    The report is looked at first (:func:`check_report`): when another destination is
    refused, the report of that refusal can still be written.
    """
    source = src.resolve()
    files = data_files(model)  # one walk of the graphs; non-empty exactly when the model has external data
    inputs = {source, *files}
    extra = {pathlib.Path(p).resolve() for p in reads}
    target = dst.resolve()
    # the name the save writes: next to OUTPUT as given (a symlink's own name; "" or "." has none)
    data = data_file_of(dst if dst.name else target)
    written = {target, data.resolve()}
    clashes = sorted((written & inputs) if target != source else set()) + sorted(written & extra)
    if clashes:
        kind = "the input's file" if clashes[0] in inputs else "the file of check inputs"
        raise InputError(f"{dst}: writing it would overwrite {kind} {clashes[0]}; choose another output")
    check_encodable(dst, shown(dst), "onnx and onnxruntime take paths as UTF-8 text, so the output "
                                     "could not be checked")
    check_writable(dst, shown(dst))
    if target != source and files:
        check_data_file(dst, replace=replace_data)
    else:
        check_writable(data, f"{shown(data)} (the output's data file)")


def check_report(report: str | os.PathLike[str] | None, src: pathlib.Path, dst: pathlib.Path, model: ir.Model,
                 reads: Iterable[str | os.PathLike[str]] = ()) -> None:  # fmt: skip
    """Refuses a ``--report`` path that names a file the run reads or writes (the input model, its
    external data, ``reads``, OUTPUT, OUTPUT.data), or that is not a regular file or a new path in
    an existing folder."""
    if report is None:
        return
    label = f"--report {shown(report)}"
    resolved = pathlib.Path(report).resolve()
    target = dst.resolve()
    if resolved in {src.resolve(), *data_files(model), target, data_file_of(dst if dst.name else target).resolve()}:
        raise InputError(f"{label}: that is a model file of this run; choose another name")
    if resolved in {pathlib.Path(p).resolve() for p in reads}:
        raise InputError(f"{label}: that is a file the run reads (--inputs); choose another name")
    if not resolved.parent.is_dir():
        raise InputError(f"{label}: its folder does not exist")
    check_writable(pathlib.Path(report), label)
