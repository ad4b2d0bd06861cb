"""Saving models atomically.

Everything is written into a temporary folder next to the destination and
renamed into place only when complete (:class:`StagedOutput`), so a failure
or an interrupt never leaves a partial output behind. Weights that no pass
changed are copied from the input's data file by the kernel, never decoded
(:mod:`passes.modelio.copy`), and the model file is written once.

Importing this module is cheap: numpy and onnx_ir are imported on first use.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pathlib
import shutil
import tempfile
from collections.abc import Callable, Iterator
from typing import IO, TYPE_CHECKING

from passes.atomic import signals_deferred, temporary_file
from passes.errors import InputError, first_line as _first_line
from passes.lazy import lazy_module
from passes.limits import PROTOBUF_LIMIT
from passes.modelio.destinations import check_data_file, check_encodable, check_writable, data_file_of, shown
from passes.modelio.load import check_unchanged, model_to_proto_with_markers
from passes.modelio.weights import in_memory as _in_memory, stored_externally

if TYPE_CHECKING:
    import numpy as np
    import onnx_ir as ir
else:
    np = lazy_module("numpy")
    ir = lazy_module("onnx_ir")
_copy = lazy_module("passes.modelio.copy")
_detach = lazy_module("passes.modelio.detach")
_walk = lazy_module("passes.ir.walk")
_stream = lazy_module("passes.modelio.stream")
_wire = lazy_module("passes.modelio.wire")
_tensors = lazy_module("passes.ir.tensors")

__all__ = ["StagedOutput", "save_model", "signals_deferred", "staged_output", "weights_nbytes"]

logger = logging.getLogger(__name__)

# IR version 8 added ModelProto.functions.
_FUNCTIONS_IR_VERSION = 8

# A model saved with external data keeps initializers up to this size inline.
_INLINE_UP_TO = 1024

# A main-graph initializer held in memory over this size is written from its array (see _write_model).
_STREAM_OVER = 1 << 20


def _needs_external_data(model: ir.Model) -> bool:
    """Whether the model is written with external data: it has some (or was told to keep it),
    or its inline initializers reach the protobuf limit. One walk of the graphs (50k nodes:
    ~40 ms a walk, and the save asks twice)."""
    if model.meta.get(_tensors.KEEP_EXTERNAL):
        return True
    total = 0
    for graph in _walk.graphs(model):
        for value in graph.initializers.values():
            tensor = value.const_value
            if tensor is None:
                continue
            if stored_externally(tensor):
                return True
            total += tensor.nbytes
    return total >= PROTOBUF_LIMIT


def save_model(
    model: ir.Model,
    path: str | os.PathLike[str],
    *,
    external_data: bool | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[pathlib.Path]:
    """Saves ``model`` to ``path`` (not atomic by itself; see :func:`staged_output`).

    With external data, a weight that no pass changed (still the input's
    ``ExternalTensor``) is copied from the input's data file by the kernel,
    never read into Python; new and changed tensors are written from memory
    (see :mod:`passes.modelio.copy` for the methods and the layout). The model
    file is written once, map types restored in memory first.

    Args:
        model: The model to save. It is not modified.
        path: The ``.onnx`` destination.
        external_data: Store large initializers in ``<name>.data`` next to the
            file. ``None`` chooses: yes if the model already had external data or
            would exceed protobuf's 2 GB limit.
        progress: Called with a byte count as the weights are written (the external data,
            or the large weights of a model saved inline: see :func:`weights_nbytes`).

    Returns:
        The files written.
    """
    path = pathlib.Path(path)
    if external_data is None:
        external_data = _needs_external_data(model)
    if not external_data:
        _write_model(model, path, progress)
        return [path]
    data = path.with_name(path.name + ".data")
    inline, placed = _split_initializers(model)
    placements, size = _copy.plan([value.const_value for value in placed])
    swapped: list[tuple[ir.Value, ir.TensorProtocol]] = []
    try:
        for value in inline:  # small external weights are written inline: read them now
            swapped.append((value, value.const_value))
            value.const_value = _in_memory(value.const_value)
        if placements:
            with open(data, "wb") as f:
                methods = _copy.write_external_data(placements, size, f, progress)
            logger.info("external data: %d bytes, %s", size, methods)
        for value, p in zip(placed, placements):
            tensor = p.tensor
            swapped.append((value, tensor))
            value.const_value = ir.ExternalTensor(
                data.name, p.offset, p.length, tensor.dtype, shape=tensor.shape, name=tensor.name,
                doc_string=getattr(tensor, "doc_string", None),
                metadata_props=dict(getattr(tensor, "metadata_props", None) or {}) or None,
                base_dir=str(path.parent),
            )  # fmt: skip
        _write_model(model, path)
    finally:
        for value, tensor in reversed(swapped):
            value.const_value = tensor
    return [path, data] if placements else [path]


def weights_nbytes(model: ir.Model, *, external_data: bool | None = None) -> int:
    """How many bytes of weights :func:`save_model` writes with progress reports (0: none).

    With external data, the data file's; inline, the main graph's initializers
    written from an array or copied from the input file (see :func:`_placeholder`).
    """
    if external_data is None:
        external_data = _needs_external_data(model)
    if external_data:
        return sum(v.const_value.nbytes for v in _split_initializers(model)[1])
    return sum(v.const_value.nbytes for v in model.graph.initializers.values() if _written_as_piece(v.const_value))


def _split_initializers(model: ir.Model) -> tuple[list[ir.Value], list[ir.Value]]:
    """The initializers to store inline that are external now, and those to store externally, in order.

    Over :data:`_INLINE_UP_TO` bytes a tensor goes to the data file, except
    strings (which ONNX cannot store externally).
    """
    inline, external = [], []
    for graph in _walk.graphs(model):
        for value in graph.initializers.values():
            tensor = value.const_value
            if tensor is None:
                continue
            if tensor.nbytes > _INLINE_UP_TO and tensor.dtype != ir.DataType.STRING:
                external.append(value)
            elif stored_externally(tensor):
                inline.append(value)
    return inline, external


def _write_model(model: ir.Model, path: pathlib.Path, progress: Callable[[int], None] | None = None) -> None:
    """Writes the model file; large arrays and detached attributes go into it without a copy in Python.

    Serialising the whole proto would hold a large main-graph array three more
    times (``tobytes()``, the proto's ``raw_data``, the serialized string): a
    placeholder of the same name, type and shape stands for it while the proto
    is built, and :mod:`passes.modelio.stream` puts its bytes in its place. A
    weight still in the input file (``InlineData``) and a detached attribute
    (:mod:`passes.modelio.detach`) are copied from that file by the kernel. The
    file's bytes are those of ``model_to_proto(model).SerializeToString()``.
    """
    inline = [v.const_value for v in model.graph.initializers.values()
              if isinstance(v.const_value, _tensors.InlineData)]  # fmt: skip
    sources = {t.path for t in inline}
    if (attributes := _detach.source_file(model)) is not None:
        sources.add(attributes)
    source = next(iter(sorted(sources)), None)
    if source is not None and path.exists() and os.path.samefile(path, source):
        source = None  # the file they are copied from is about to be replaced: read them now
    arrays: dict[str, np.ndarray | _wire.Range] = {}
    swapped: list[tuple[ir.Value, ir.TensorProtocol]] = []
    try:
        for value in model.graph.initializers.values():
            placeholder, array = _placeholder(value.const_value, value.name, source)
            if placeholder is not None:
                arrays[value.name] = array
                swapped.append((value, value.const_value))
                value.const_value = placeholder
        proto, detached = model_to_proto_with_markers(model)
    finally:
        for value, tensor in reversed(swapped):
            value.const_value = tensor
    if any(s.path != source for s in detached.values()):
        _detach.materialized(proto, detached)  # not from the one file copied from (see above)
        detached = {}
    serialized = proto.SerializeToString()
    del proto
    visitors = []
    if arrays:
        visitors.append(_stream.array_visitor(serialized, arrays))
    if detached:
        visitors.append(_detach.splice_visitor(serialized, detached))
    pieces = _wire.rewrite(serialized, _wire.combine(*visitors)) if visitors else None
    _wire.write(path, [serialized] if pieces is None else pieces, source, progress)


def _written_as_piece(tensor: ir.TensorProtocol | None) -> bool:
    """Whether saving inline writes the tensor's bytes as a piece of its own (see :func:`_placeholder`)."""
    if isinstance(tensor, _tensors.InlineData):
        return True
    return (isinstance(tensor, ir.Tensor) and tensor.nbytes > _STREAM_OVER and not tensor.dtype.bitwidth % 8
            and tensor.dtype != ir.DataType.STRING)  # fmt: skip


def _placeholder(
    tensor: ir.TensorProtocol | None, name: str, source: str | None
) -> tuple[ir.Tensor | None, np.ndarray | _wire.Range | None]:
    """An empty stand-in for a large weight, and what fills its ``raw_data`` in the file.

    A weight still in ``source`` (``InlineData``): its bytes there, copied by the
    kernel. An in-memory array over :data:`_STREAM_OVER` bytes (or a weight of
    another file, read now): the array.
    """
    if not _written_as_piece(tensor):
        return None, None
    assert tensor is not None
    if isinstance(tensor, _tensors.InlineData):
        if tensor.path == source:
            piece: np.ndarray | _wire.Range = _wire.Range(int(tensor.offset or 0), int(tensor.nbytes))
        else:
            piece = _tensors.read_external(tensor)
        dtype = tensor.dtype.numpy()
    else:
        piece = _stream.streamable_array(tensor.numpy())
        if piece is None:
            return None, None
        dtype = piece.dtype
    placeholder = ir.Tensor(
        np.empty(0, dtype), dtype=tensor.dtype, shape=tensor.shape, name=name,
        doc_string=tensor.doc_string, metadata_props=dict(tensor.metadata_props) or None,
    )  # fmt: skip
    return placeholder, piece


class StagedOutput:
    """A temporary folder next to the destination; :meth:`commit` renames its files into place.

    Other files to commit with the model (the JSON report) are staged with
    :meth:`stage_file` under unique temporary names next to their own
    destinations, and renamed in the same commit, after the model.
    """

    def __init__(self, destination: pathlib.Path, *, replace_data: bool = False) -> None:
        self.destination = destination
        self.replace_data = replace_data
        self.folder = pathlib.Path(
            tempfile.mkdtemp(prefix=f".{destination.name}.", suffix=".tmp", dir=destination.parent)
        )
        self.path = self.folder / destination.name
        self.files: list[pathlib.Path] = []
        self.extra: list[tuple[pathlib.Path, pathlib.Path, str]] = []  # (temporary file, target, label)
        self.committed = False

    def save(self, model: ir.Model, *, external_data: bool | None = None,
             progress: Callable[[int], None] | None = None) -> pathlib.Path:  # fmt: skip
        """Writes the model into the temporary folder (``progress``: see :func:`save_model`).

        Raises:
            InputError: the disk is full, another error of the file system, or an
                input data file that changed since it was validated.
        """
        check_unchanged(model)  # before any read: a data file swapped for a FIFO would block the read
        try:
            self.files = save_model(model, self.path, external_data=external_data, progress=progress)
        except OSError as e:
            raise InputError(f"{shown(self.destination)}: cannot write ({e.strerror or _first_line(e)})") from e
        except ValueError:  # onnx_ir refusing to read an input data file that changed
            check_unchanged(model)
            raise
        check_unchanged(model)
        return self.path

    def stage_file(self, target: str | os.PathLike[str], write: Callable[[IO[str]], None], label: str) -> None:
        """Writes a text file to a unique temporary name next to ``target``, renamed there by :meth:`commit`.

        Raises:
            InputError: ``target`` is not a regular file or a new path, or cannot be written.
        """
        target = pathlib.Path(target)
        check_writable(target, label)
        try:
            fd = temporary_file(target, lambda tmp: self.extra.append((tmp, target, label)))
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                write(f)
        except OSError as e:
            raise InputError(f"{label}: cannot write ({e.strerror or _first_line(e)})") from e

    def commit(self, *, model: bool = True) -> list[pathlib.Path]:
        """Moves the written files to the destination folder (the model file last), then the staged files.

        Args:
            model: Commit the model; False commits only the files of :meth:`stage_file`.

        Raises:
            InputError: a destination became something other than a regular file,
                ``NAME.data`` belongs to another model (see ``check_data_file``),
                or a rename failed.
        """
        files = [f for f in self.files if f != self.path] + [self.path] if model else []
        for f in files:
            check_writable(self.destination.parent / f.name, shown(self.destination.parent / f.name))
        if model and len(files) > 1:
            check_data_file(self.destination, replace=self.replace_data)
        for _, target, label in self.extra:
            check_writable(target, label)
        moved = []
        with signals_deferred():
            try:
                for f in files:
                    target = self.destination.parent / f.name
                    os.replace(f, target)
                    moved.append(target)
            except OSError as e:
                raise InputError(f"{shown(self.destination)}: cannot write ({e.strerror or _first_line(e)})") from e
            self.committed = model
            for tmp, target, label in self.extra:
                try:
                    os.replace(tmp, target)
                except OSError as e:
                    written = f"; {shown(self.destination)} was written" if model else ""
                    raise InputError(f"{label}: cannot write ({e.strerror or _first_line(e)}){written}") from e
                moved.append(target)
            self.extra.clear()
        return moved

    def discard(self) -> None:
        """Removes the temporary folder and the staged files that were not committed.

        A signal can land while the deferral itself is being set up (the
        command's handler then raises at once and ignores any further signal):
        the files are removed all the same before it goes on.
        """
        try:
            with signals_deferred():
                self._remove()
        except BaseException:
            self._remove()
            raise

    def _remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
        for tmp, _, _ in self.extra:
            with contextlib.suppress(OSError):
                tmp.unlink()
        self.extra.clear()


@contextlib.contextmanager
def staged_output(destination: str | os.PathLike[str], *, replace_data: bool = False) -> Iterator[StagedOutput]:
    """Context manager for an atomic save; the temporary folder (and staged files) are always removed.

    Args:
        destination: The model file to write: a regular file or a new path.
        replace_data: Replace ``NAME.data`` even when it is not the existing model's own.

    Raises:
        InputError: the destination folder does not exist or is not writable, the
            destination is not a regular file or a new path, or its name is not UTF-8.
    """
    destination = pathlib.Path(destination)
    parent = destination.parent
    check_encodable(destination, shown(destination),
                    "onnx and onnxruntime take paths as UTF-8 text, so the output could not be checked")
    if not parent.is_dir():
        raise InputError(f"{shown(destination)}: folder {shown(str(parent) or '.')!r} does not exist")
    check_writable(destination, shown(destination))
    check_writable(data_file_of(destination), f"{shown(data_file_of(destination))} (the output's data file)")
    staged: StagedOutput | None = None
    try:
        try:
            with signals_deferred():  # the folder is recorded before an interrupt can land ...
                staged = StagedOutput(destination, replace_data=replace_data)
        except OSError as e:
            raise InputError(f"{shown(destination)}: cannot write here ({_first_line(e)})") from e
        yield staged
    finally:  # ... and removed here, an interrupt held by that deferral included
        if staged is not None:
            staged.discard()
