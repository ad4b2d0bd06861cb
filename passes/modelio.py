"""Loading and saving models safely.

Loading validates what it reads before anything trusts it: the file must be an
ONNX model, external-data references must stay inside the model's folder and
fit in their files, and the model must pass the ONNX checker. External weights
are memory-mapped by ``onnx_ir`` rather than copied into memory.

Saving is atomic: everything is written into a temporary folder next to the
destination and renamed into place only when complete, so a failure or an
interrupt never leaves a partial output behind.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pathlib
import shutil
import tempfile
from collections.abc import Iterator

import google.protobuf.message
import onnx
import onnx.checker
import onnx.external_data_helper
import onnx_ir as ir

from passes.errors import InputError

__all__ = [
    "PROTOBUF_LIMIT",
    "StagedOutput",
    "has_external_data",
    "load_model",
    "save_model",
    "staged_output",
]

logger = logging.getLogger(__name__)

# protobuf refuses to serialise a message of 2 GiB or more; stay clear of it.
PROTOBUF_LIMIT = 2**31 - 2**24


def _first_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0]


def _check_external_data(proto: onnx.ModelProto, base_dir: pathlib.Path) -> bool:
    """Validates every external-data reference; returns whether there are any.

    A location must be relative, stay inside ``base_dir`` (no ``..``, no absolute
    path, no symlink escaping it), name an existing file, and the declared
    offset and length must fit in that file.
    """
    found = False
    base = base_dir.resolve()
    for tensor in onnx.external_data_helper._get_all_tensors(proto):  # noqa: SLF001
        if not onnx.external_data_helper.uses_external_data(tensor):
            continue
        found = True
        info = onnx.external_data_helper.ExternalDataInfo(tensor)
        location = info.location
        if not location:
            raise InputError(f"initializer {tensor.name!r} uses external data without a location")
        rel = pathlib.PurePath(location)
        if rel.is_absolute() or location.startswith(("/", "\\")) or ".." in rel.parts:
            raise InputError(
                f"initializer {tensor.name!r}: external data location {location!r} "
                "points outside the model's folder; refusing to read it"
            )
        path = (base / rel).resolve()
        if base not in path.parents:
            raise InputError(
                f"initializer {tensor.name!r}: external data location {location!r} "
                "resolves outside the model's folder; refusing to read it"
            )
        if not path.is_file():
            raise InputError(
                f"initializer {tensor.name!r}: external data file {location!r} not found"
            )
        size = path.stat().st_size
        offset = int(info.offset or 0)
        length = info.length
        if length is None:
            length = size - offset
        if offset < 0 or length < 0 or offset + int(length) > size:
            raise InputError(
                f"initializer {tensor.name!r}: external data {location!r} is truncated "
                f"(needs bytes {offset}..{offset + int(length)}, file has {size})"
            )
        expected = _expected_nbytes(tensor)
        if expected is not None and expected != int(length):
            raise InputError(
                f"initializer {tensor.name!r}: external data length {length} does not match "
                f"its shape and type ({expected} bytes)"
            )
    return found


def _expected_nbytes(tensor: onnx.TensorProto) -> int | None:
    try:
        dtype = ir.DataType(tensor.data_type)
        count = 1
        for d in tensor.dims:
            count *= int(d)
        if dtype == ir.DataType.STRING:
            return None
        return dtype.itemsize * count if dtype.bitwidth % 8 == 0 else (dtype.bitwidth * count + 7) // 8
    except (ValueError, TypeError):
        return None


def has_external_data(model: ir.Model) -> bool:
    """Whether any initializer of the model (or its subgraphs) is stored externally."""
    for graph in model.graphs():
        for value in graph.initializers.values():
            if isinstance(value.const_value, ir.ExternalTensor):
                return True
    return False


def load_model(path: str | os.PathLike[str], *, check: bool = True) -> ir.Model:
    """Loads and validates an ONNX model file.

    Args:
        path: The ``.onnx`` file. External data is resolved relative to its folder.
        check: Run the ONNX checker (recommended: passes assume a valid model).

    Returns:
        The model, with external weights memory-mapped, not copied.

    Raises:
        InputError: the file is missing, not an ONNX model, truncated, refers to
            external data that is missing or outside its folder, or fails the checker.
    """
    path = pathlib.Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such file")
    if not path.is_file():
        raise InputError(f"{path}: not a regular file")
    size = path.stat().st_size
    if size == 0:
        raise InputError(f"{path}: empty file, not an ONNX model")
    if size >= 2**31:
        raise InputError(
            f"{path}: {size} bytes is over protobuf's 2 GB limit; "
            "store the weights as external data to load it"
        )
    try:
        proto = onnx.load_model(str(path), load_external_data=False)
    except (google.protobuf.message.DecodeError, RuntimeError, ValueError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: not a valid ONNX model ({_first_line(e)})") from e
    except OSError as e:
        raise InputError(f"{path}: cannot read ({_first_line(e)})") from e
    if not proto.HasField("graph") or proto.ir_version <= 0:
        raise InputError(f"{path}: not an ONNX model (no graph or no ir_version)")
    if proto.ir_version > onnx.IR_VERSION:
        raise InputError(
            f"{path}: ir_version {proto.ir_version} is newer than the installed onnx "
            f"supports ({onnx.IR_VERSION})"
        )
    max_opset = onnx.defs.onnx_opset_version()
    for opset in proto.opset_import:
        if opset.domain in ("", "ai.onnx") and opset.version > max_opset:
            raise InputError(
                f"{path}: opset {opset.version} is newer than the installed onnx supports ({max_opset})"
            )
    external = _check_external_data(proto, path.parent)
    if check:
        try:
            # The checker must read external data by path; a model without it is
            # checked in memory rather than parsed a second time.
            onnx.checker.check_model(str(path) if external else proto)
        except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
            raise InputError(f"{path}: invalid model: {_first_line(e)}") from e
        except (RuntimeError, ValueError) as e:
            raise InputError(f"{path}: invalid model: {_first_line(e)}") from e
    try:
        model = ir.serde.deserialize_model(proto)
    except (ValueError, TypeError, KeyError, RuntimeError) as e:
        raise InputError(f"{path}: cannot read the model ({_first_line(e)})") from e
    ir.external_data.set_base_dir(model.graph, str(path.parent))
    return model


def _inline_nbytes(model: ir.Model) -> int:
    total = 0
    for graph in model.graphs():
        for value in graph.initializers.values():
            tensor = value.const_value
            if tensor is not None and not isinstance(tensor, ir.ExternalTensor):
                total += tensor.nbytes
    return total


def save_model(
    model: ir.Model,
    path: str | os.PathLike[str],
    *,
    external_data: bool | None = None,
) -> list[pathlib.Path]:
    """Saves ``model`` to ``path`` (not atomic by itself; see :func:`staged_output`).

    Args:
        model: The model to save. It is not modified.
        path: The ``.onnx`` destination.
        external_data: Store large initializers in ``<name>.data`` next to the
            file. ``None`` chooses: yes if the model already had external data or
            would exceed protobuf's 2 GB limit.

    Returns:
        The files written.
    """
    path = pathlib.Path(path)
    if external_data is None:
        external_data = has_external_data(model) or _inline_nbytes(model) >= PROTOBUF_LIMIT
    if external_data:
        data_name = path.name + ".data"
        ir.save(model, path, external_data=data_name, size_threshold_bytes=1024)
        written = [path]
        if (path.parent / data_name).exists():
            written.append(path.parent / data_name)
        return written
    ir.save(model, path)
    return [path]


class StagedOutput:
    """A temporary folder next to the destination; :meth:`commit` renames its files into place."""

    def __init__(self, destination: pathlib.Path) -> None:
        self.destination = destination
        self.folder = pathlib.Path(
            tempfile.mkdtemp(prefix=f".{destination.name}.", suffix=".tmp", dir=destination.parent)
        )
        self.path = self.folder / destination.name
        self.files: list[pathlib.Path] = []

    def save(self, model: ir.Model, *, external_data: bool | None = None) -> pathlib.Path:
        self.files = save_model(model, self.path, external_data=external_data)
        return self.path

    def commit(self) -> list[pathlib.Path]:
        """Moves the written files to the destination folder; the model file last."""
        moved = []
        others = [f for f in self.files if f != self.path]
        for f in [*others, self.path]:
            target = self.destination.parent / f.name
            os.replace(f, target)
            moved.append(target)
        return moved

    def discard(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


@contextlib.contextmanager
def staged_output(destination: str | os.PathLike[str]) -> Iterator[StagedOutput]:
    """Context manager for an atomic save; the temporary folder is always removed.

    Raises:
        InputError: the destination folder does not exist or is not writable.
    """
    destination = pathlib.Path(destination)
    parent = destination.parent
    if not parent.is_dir():
        raise InputError(f"{destination}: folder {str(parent) or '.'!r} does not exist")
    if destination.is_dir():
        raise InputError(f"{destination}: is a folder")
    try:
        staged = StagedOutput(destination)
    except OSError as e:
        raise InputError(f"{destination}: cannot write here ({_first_line(e)})") from e
    try:
        yield staged
    finally:
        staged.discard()
