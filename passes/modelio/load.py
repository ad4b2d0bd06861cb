"""Loading models: validated on every route (a file, bytes, a ModelProto), then built as IR.

The file must be an ONNX model whose text is UTF-8 and whose tensors hold
exactly the data their type and shape declare; external-data references must
stay inside the model's folder and fit in their files (only paths and ``stat``
results are inspected: nothing outside the folder is ever opened); and the
model must pass the ONNX checker, type inference included. External weights
are memory-mapped by ``onnx_ir`` rather than copied into memory.

Importing this module is cheap: onnx and onnx_ir are imported on first use.
"""

from __future__ import annotations

import functools
import logging
import os
import pathlib
import stat
from collections.abc import Callable
from typing import TYPE_CHECKING

from passes.ir.initializer_inputs import OVERRIDABLE_SINCE, constant_inputs_note, freeze_initializer_inputs
from passes.ir.notes import add_model_notes, model_notes, set_model_notes
from passes import heap
from passes.errors import InputError, first_line as _first_line, raise_interrupt_behind
from passes.lazy import lazy_module
from passes.limits import PROTOBUF_MAX
from passes.modelio.paths import check_encodable, external_locations, shown

# The command's early errors come from load_model's first lines, before any of these is needed.
if TYPE_CHECKING:
    import onnx
    import onnx_ir as ir
else:
    onnx = lazy_module("onnx")
    ir = lazy_module("onnx_ir")
_protobuf = lazy_module("google.protobuf.message")
_opaque_types = lazy_module("passes.modelio.opaque")
_validate = lazy_module("passes.modelio.validate")
_repair = lazy_module("passes.modelio.repair")
_survey = lazy_module("passes.modelio.survey")
_sparse = lazy_module("passes.modelio.sparse")
_detach = lazy_module("passes.modelio.detach")
_walk = lazy_module("passes.ir.walk")
_tensors = lazy_module("passes.ir.tensors")
_weights = lazy_module("passes.modelio.weights")
_bind = lazy_module("passes.modelio.bind")

__all__ = [
    "check_unchanged",
    "add_model_notes",
    "model_notes",
    "check_view",
    "data_files",
    "has_external_data",
    "load_model",
    "model_from_proto",
    "model_to_proto",
    "proto_from_bytes",
    "read_graph",
    "read_whole",
    "repair_in_memory",
    "validate_proto",
]

logger = logging.getLogger(__name__)


def has_external_data(model: ir.Model) -> bool:
    """Whether any initializer of the model (or its subgraphs) is stored externally."""
    for graph in _walk.graphs(model):
        for value in graph.initializers.values():
            if _weights.stored_externally(value.const_value):
                return True
    return False


def load_model(path: str | os.PathLike[str], *, check: bool = True) -> ir.Model:
    """Loads and validates an ONNX model file.

    Args:
        path: The ``.onnx`` file. External data is resolved relative to its folder.
        check: Run the ONNX checker (recommended: passes assume a valid model).

    Returns:
        The model, with external weights memory-mapped, not copied (a Constant's
        external value is read into memory).

    Raises:
        InputError: the file is missing, not a regular file, 2 GB or more, not an
            ONNX model, truncated, has text that is not UTF-8 or a tensor whose data
            does not match its type and shape, refers to external data that is
            missing, truncated or outside its folder, or fails the checker
            (including type inference).
    """
    path = pathlib.Path(path)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise InputError(f"{shown(path)}: no such file") from None
    except (OSError, ValueError) as e:  # a name too long, a loop, a NUL...
        reason = e.strerror if isinstance(e, OSError) and e.strerror else _first_line(e)
        raise InputError(f"{shown(path)}: cannot read ({reason})") from e
    if not stat.S_ISREG(info.st_mode):
        raise InputError(f"{shown(path)}: not a regular file")
    size = info.st_size
    if size == 0:
        raise InputError(f"{shown(path)}: empty file, not an ONNX model")
    if size >= PROTOBUF_MAX:
        raise InputError(
            f"{shown(path)}: {size} bytes is over protobuf's 2 GB limit; "
            "store the weights as external data to load it"
        )
    real = pathlib.Path(os.path.realpath(path))
    try:
        view = _detach.read_view(real)
    except (_protobuf.DecodeError, RuntimeError, ValueError, UnicodeDecodeError) as e:
        raise_interrupt_behind(e)
        raise InputError(f"{shown(path)}: not a valid ONNX model ({_first_line(e)})") from e
    except OSError as e:
        raise InputError(f"{shown(path)}: cannot read ({e.strerror or _first_line(e)})") from e
    identities: dict[pathlib.Path, _validate.Identity] = {}
    if view.detached:  # read again when a pass or the save needs them: the file must stay as it is
        identities[real] = _validate.identity(real)
    try:
        whole = functools.partial(read_whole, path) if view.attributes else None
        notes: list[str] = []
        # Before validation, which reads small external tensors into the proto.
        locations = {e.value for t in view.proto.graph.initializer if t.data_location == 1  # EXTERNAL
                     for e in t.external_data if e.key == "location"}  # fmt: skip
        known, view.data = _survey.survey(view.proto, view.data), None  # (the file's bytes, parsed again in C)
        external = validate_proto(view.proto, path.parent, path=path, check=check, identities=identities,
                                  whole=whole, notes=notes, known=known)  # fmt: skip
        model = model_from_proto(view.proto, detached=view.attributes, weights=view.weights, repaired=True,
                                 plain=known.plain)  # fmt: skip
        if external:  # the files on disk the model is made of (its size on disk, in the report)
            locations |= external_locations(view.proto)
            model.meta[_FILES_KEY] = sorted({(real.parent / loc).resolve() for loc in locations})
        else:  # none: data_files() knows it without a walk
            model.meta[_FILES_KEY] = []
        del view
        set_model_notes(model, notes)  # the validation's, which include the repairs model_from_proto noted
        if identities:
            model.meta[_IDENTITY_KEY] = identities
        try:
            if external:  # (walking every node and attribute for none costs seconds on a large graph)
                _bind.bind_external_tensors(model, path.parent)
        except (OSError, ValueError) as e:  # onnx_ir refusing a file that changed since validation
            check_unchanged(model)
            reason = e.strerror if isinstance(e, OSError) and e.strerror else _first_line(e)
            raise InputError(f"cannot read external data ({reason})") from e
        check_unchanged(model)
    except InputError as e:
        raise InputError(f"{shown(path)}: {e}") from e
    return model


#: Key of the validated external-data files' identities in ``ir.Model.meta``.
_IDENTITY_KEY = "onnx_optimize.external_identity"
_FILES_KEY = "onnx_optimize.external_files"


def source_files(model: ir.Model) -> list[pathlib.Path]:
    """The external-data files the model was loaded from (read into memory or not); empty for none."""
    return list(model.meta.get(_FILES_KEY, []))


def check_unchanged(model: ir.Model) -> None:
    """Refuses a model whose external-data files are no longer the files validation looked at.

    Validation inspects paths, and onnx_ir opens the files later, by path: a file
    swapped in between (for a symlink, another file) or rewritten would be read
    instead of the validated one. Each file's device, inode, size and mtime are
    compared with those validation saw; ``load_model`` checks after reading the
    Constants' external values, and :meth:`StagedOutput.save` after the save has
    read every initializer.

    Raises:
        InputError: a file is gone or is another file now.
    """
    for path, seen in model.meta.get(_IDENTITY_KEY, {}).items():
        try:
            now = _validate.identity(path)
        except OSError:
            now = None
        if now != seen:
            raise InputError(f"external data file {shown(path)} changed after it was validated "
                             "(replaced, rewritten or removed); refusing to use it")


def repair_in_memory(model: ir.Model) -> None:
    """The load's repairs that apply to a model built in memory (``passes.optimize(ir_model)``, whose
    copy was validated as a proto), in place, each noted: the initializers an IR < 4 model lists as
    inputs are constants, declared negative dims are unknown dims."""
    if model.ir_version < OVERRIDABLE_SINCE:
        ir_version = model.ir_version
        frozen = constant_inputs_note(freeze_initializer_inputs(model), ir_version)
        model.ir_version = max(model.ir_version, OVERRIDABLE_SINCE)
        add_model_notes(model, [frozen] if frozen else [])
    note = _repair.negative_dims_note(_repair.unknown_negative_ir_dims(model))
    if note is not None:
        add_model_notes(model, [note])


def _root_message(error: BaseException) -> str:
    """The innermost cause's first line (onnx_ir wraps the reason in SerdeErrors)."""
    while error.__cause__ is not None:
        error = error.__cause__
    return _first_line(error)


def read_graph(path: str | os.PathLike[str]) -> tuple[onnx.ModelProto, Callable[[], onnx.ModelProto] | None]:
    """The protobuf of a model file, to read and check, never to save or run.

    External data is not loaded, and a large file's large list attributes are
    markers without their values and its large weights stand-ins without
    their data (see :mod:`passes.modelio.detach`): a tree ensemble is not
    parsed into gigabytes that nothing reads.

    Returns:
        The model, and if it is such a view, how to read the whole of it (for
        :func:`check_view`: :func:`read_whole`); else None.

    Raises:
        OSError: the file cannot be read.
        google.protobuf.message.DecodeError: the file is not a protobuf message.
    """
    view = _detach.read_view(path)
    return view.proto, (functools.partial(read_whole, path) if view.attributes else None)


def read_whole(path: str | os.PathLike[str]) -> onnx.ModelProto:
    """The protobuf of a model file with every attribute (external data not loaded): to build copies that run."""
    return onnx.load_model(os.fspath(path), load_external_data=False)


def proto_from_bytes(data: bytes) -> onnx.ModelProto:
    """Parses a serialized model.

    Raises:
        InputError: the bytes are not an ONNX model.
    """
    if len(data) >= PROTOBUF_MAX:
        raise InputError(f"{len(data)} bytes is over protobuf's 2 GB limit")
    try:
        return onnx.load_model_from_string(data)
    except (_protobuf.DecodeError, RuntimeError, ValueError, UnicodeDecodeError) as e:
        raise_interrupt_behind(e)
        raise InputError(f"not a valid ONNX model ({_first_line(e)})") from e


def validate_proto(
    proto: onnx.ModelProto, base_dir: pathlib.Path | None = None, *, path: pathlib.Path | None = None,
    check: bool = True, identities: dict[pathlib.Path, _validate.Identity] | None = None,
    whole: Callable[[], onnx.ModelProto] | None = None, notes: list[str] | None = None,
    known: _survey.Survey | None = None,
) -> int:
    """The load-time validation of :func:`load_model`, for a model already in memory.

    Args:
        proto: The model; an IR < 4 model is read as IR 4 with the initializers it lists
            as inputs taken out of the inputs (constants, as onnxruntime runs them; changed
            in place, noted), as at load.
        base_dir: The folder external data is relative to; a model in memory
            that refers to external data needs one.
        path: The model's file, if it has one (the checker reads external data through it).
        check: Also run the ONNX checker with type inference.
        identities: Receives the identity of each external-data file (see :func:`check_unchanged`).
        whole: ``proto`` is a view with detached attributes (see :func:`passes.modelio.detach.read_view`)
            and this reads the whole model, for the checker (see :func:`check_view`).
        notes: Receives a note per lossless repair of ``proto`` (made in place, see
            :mod:`passes.modelio.repair`): nodes sorted, graphs named, shapeless inputs and outputs.
        known: ``proto``'s :func:`passes.modelio.survey.survey`, if the caller made it (made here otherwise).

    Returns:
        How many tensors are stored externally.

    Raises:
        InputError: the model is invalid (see :func:`load_model`).
    """
    frozen: str | None = None
    if 0 < proto.ir_version < OVERRIDABLE_SINCE:
        # IR 3 requires every initializer to also be a graph input, and onnxruntime runs them as
        # constants there (no caller can feed them); IR 4 reads initializers the same way and drops
        # that rule. So an IR 3 model is read as IR 4 with its initializers out of the inputs: the
        # same constants, which the upgrade to a later IR does not make overridable. (Exporters of
        # the time also broke the rule, as onnxruntime's own datasets/mul_1.onnx does.)
        frozen = constant_inputs_note(_repair.constant_initializer_inputs(proto), proto.ir_version)
        proto.ir_version = OVERRIDABLE_SINCE
    known = _survey.survey(proto) if known is None else known  # what the looks at every node would find
    repaired = [*([frozen] if frozen else []), *_repair.repair(proto, plain=known.plain)]
    if notes is not None:
        notes.extend(repaired)
    if whole is not None and repaired:
        read = whole
        whole = lambda: _repaired(read())  # noqa: E731
    external = _validate.check_contents(proto, base_dir or pathlib.Path.cwd(), identities, known)
    if external and (base_dir is None or (check and path is None)):
        raise InputError("the model refers to external data; load it from its file instead")
    if external and check and path is not None:
        check_encodable(path, "its path", "onnx and onnxruntime read external data by a path given as UTF-8 "
                                          "text; rename or move it")  # fmt: skip
    if check:
        check_view(proto, path, external, whole)
    return external


def _repaired(proto: onnx.ModelProto) -> onnx.ModelProto:
    _repair.repair(proto)
    return proto


def check_view(
    proto: onnx.ModelProto, path: pathlib.Path | None, external: int,
    whole: Callable[[], onnx.ModelProto] | None, *, log: bool = True,
) -> list[_validate.ShapeConflict]:
    """The checker (``validate.check_validity``) on ``proto``, which may be a view with detached attributes.

    A view's lists are empty, and shape inference reads some lists' lengths (a
    ``LinearClassifier``'s ``intercepts`` make its output's width): when the
    view fails or contradicts a declared shape, the whole model (``whole()``)
    decides. A view that passes is not read again.

    Raises:
        InputError: the model is invalid.
    """
    if whole is None:
        return _validate.check_validity(proto, path, external, log=log)
    try:
        if not _validate.check_validity(proto, path, external, log=False):
            return []
    except InputError:
        pass
    logger.info("the checker on the model with detached attributes did not pass; checking the whole model")
    return _validate.check_validity(whole(), path, external, log=log)


def model_from_proto(
    proto: onnx.ModelProto, *, validate: bool = False, detached: dict[str, _detach.Source] | None = None,
    weights: dict[str, _detach.Weight] | None = None, repaired: bool = False, plain: bool = False,
) -> ir.Model:
    """Builds the IR of ``proto`` (changed in place: sparse Constants and map types stashed).

    Large weights are moved out of the proto into arrays of their own (see
    :func:`passes.modelio.weights.move_out_large`; the stashing then edits a light copy).
    onnx_ir represents neither sparse tensor attributes nor map types; see
    ``passes.modelio.sparse`` and ``passes.modelio.opaque``. :func:`model_to_proto` and
    :func:`save_model` put the stashed nodes and types back. ``detached`` and ``weights``:
    the attribute records and weights :func:`passes.modelio.detach.read_view` left in
    the file, read when used. ``repaired``: :func:`validate_proto` has repaired ``proto``
    already (a second repair, a walk of every node, would find nothing). ``plain``: no attribute holds a
    sparse tensor (the survey's ``plain``): none to stash, no walk.

    Raises:
        InputError: with ``validate``, the model is invalid (see :func:`validate_proto`);
            or onnx_ir cannot represent it.
    """
    notes: list[str] = []
    if validate:
        validate_proto(proto, notes=notes)
    elif not repaired:
        notes = _repair.repair(proto)  # the IR needs sorted nodes
    proto, moved = _weights.move_out_large(proto)
    _one_default_domain(proto)
    sparse = {} if plain else _sparse.stash(proto)
    stashed = _opaque_types.stash(proto)
    try:
        model = ir.serde.deserialize_model(proto)
    except (ValueError, TypeError, KeyError, RuntimeError, NotImplementedError) as e:
        raise InputError(f"cannot read the model ({_root_message(e)})") from e
    for name, tensor in moved.items():
        model.graph.initializers[name].const_value = tensor
    if weights:
        _weights.attach(model, weights)
    _detach.attach(model, detached or {})
    if stashed:
        model.meta[_opaque_types.STASH_KEY] = stashed
    if sparse:
        model.meta[_sparse.STASH_KEY] = sparse
        _sparse.attach_types(model)
    set_model_notes(model, notes)
    return model


def _one_default_domain(proto: onnx.ModelProto) -> None:
    """Imports of ``ai.onnx`` become imports of ``""``, the same domain, in place.

    onnx_ir keys opset imports by the domain's spelling, so a model importing
    both (at the same opset: validation refuses two) would keep ``ai.onnx`` at
    the old opset after an upgrade raised ``""``, and be invalid.
    """
    for owner in (proto, *proto.functions):
        imports = list(owner.opset_import)
        if not any(o.domain == "ai.onnx" for o in imports):
            continue
        default = next((o.version for o in imports if o.domain in ("", "ai.onnx")), None)
        del owner.opset_import[:]
        owner.opset_import.extend(o for o in imports if o.domain not in ("", "ai.onnx"))
        owner.opset_import.add(domain="", version=default)


def model_to_proto(model: ir.Model) -> onnx.ModelProto:
    """Serialises ``model`` (tensors in memory) with what :func:`model_from_proto` stashed put back."""
    proto, detached = model_to_proto_with_markers(model)
    _detach.materialized(proto, detached)
    return proto


def model_to_proto_with_markers(model: ir.Model) -> tuple[onnx.ModelProto, dict[str, _detach.Source]]:
    """:func:`model_to_proto` with detached attributes left as markers, and the records they stand for.

    Weights left in the model file (``InlineData``) are read for the proto
    (:func:`passes.modelio.save_model` swaps them out first, and copies them).
    """
    swapped = []
    try:
        for value in model.graph.initializers.values():
            if isinstance(value.const_value, _tensors.InlineData):
                swapped.append((value, value.const_value))
                value.const_value = _weights.in_memory(value.const_value)
        with _detach.swapped(model) as detached, heap.paused():  # a proto per node and attribute, no garbage
            proto = ir.serde.serialize_model(model)
    finally:
        for value, tensor in swapped:
            value.const_value = tensor
    _restore_stashed(model, proto)
    return proto, detached


def _restore_stashed(model: ir.Model, proto: onnx.ModelProto) -> None:
    _opaque_types.restore(proto, model.meta.get(_opaque_types.STASH_KEY, {}))
    _sparse.restore(proto, model.meta.get(_sparse.STASH_KEY, {}))


def data_files(model: ir.Model) -> set[pathlib.Path]:
    """The resolved paths of the external-data files the model's initializers refer to.

    None for a model :func:`load_model` read without external data, known without a walk of
    every graph (no pass makes a tensor stored externally; the save's are its own, undone).
    """
    if model.meta.get(_FILES_KEY) == []:
        return set()
    files = set()
    for graph in _walk.graphs(model):
        for value in graph.initializers.values():
            if _weights.stored_externally(value.const_value):
                files.add(pathlib.Path(value.const_value.path).resolve())
    return files
