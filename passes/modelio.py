"""Loading and saving models safely.

Loading validates what it reads before anything trusts it: the file must be an
ONNX model whose text is UTF-8 and whose tensors hold exactly the data their
type and shape declare; external-data references must stay inside the model's
folder and fit in their files (only paths and ``stat`` results are inspected:
nothing outside the folder is ever opened); and the model must pass the ONNX
checker, type inference included. External weights are memory-mapped by
``onnx_ir`` rather than copied into memory.

Saving is atomic: everything is written into a temporary folder next to the
destination and renamed into place only when complete, so a failure or an
interrupt never leaves a partial output behind.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pathlib
import re
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator

import google.protobuf.message
import onnx
import onnx.checker
import onnx.external_data_helper
import onnx_ir as ir

from passes import _opaque_types
from passes._sparse import densify_sparse_constants
from passes.errors import InputError

__all__ = [
    "PROTOBUF_LIMIT",
    "StagedOutput",
    "data_files",
    "has_external_data",
    "load_model",
    "save_model",
    "staged_output",
]

logger = logging.getLogger(__name__)

# protobuf refuses to serialise a message of 2 GiB or more; stay clear of it.
PROTOBUF_LIMIT = 2**31 - 2**24

# IR version 8 added ModelProto.functions.
_FUNCTIONS_IR_VERSION = 8

# A model saved with external data keeps initializers up to this size inline.
_INLINE_UP_TO = 1024


def _first_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0]


def _scan(message: google.protobuf.message.Message, tensors: list[onnx.TensorProto]) -> None:
    """Collects every TensorProto inside ``message``, at any depth (initializers, sparse
    tensors, attribute values and defaults, subgraphs, functions, training info).

    Raises:
        InputError: a string field is not valid UTF-8 (protobuf hands those over as bytes,
            which nothing downstream expects).
    """
    if isinstance(message, onnx.TensorProto):
        tensors.append(message)
    for field, value in message.ListFields():
        if field.type == field.TYPE_STRING:
            values = [value] if isinstance(value, (str, bytes)) else value
            if any(isinstance(v, bytes) for v in values):
                raise InputError(f"{message.DESCRIPTOR.name}.{field.name} is not valid UTF-8 text")
        elif field.type == field.TYPE_MESSAGE:
            for item in [value] if isinstance(value, google.protobuf.message.Message) else value:
                _scan(item, tensors)


def _check_pass_through_outputs(graph: onnx.GraphProto) -> None:
    """A graph output that names a graph input must not declare another type for it.

    onnx_ir holds one value for both, so the output's declaration would become
    the input's and the optimised model would expect other inputs.
    """
    inputs = {i.name: i.type for i in graph.input}
    for output in graph.output:
        declared = inputs.get(output.name)
        if declared is None or not (output.type.HasField("tensor_type") and declared.HasField("tensor_type")):
            continue
        a, b = declared.tensor_type, output.type.tensor_type
        same = a.elem_type == b.elem_type or not (a.elem_type and b.elem_type)
        if same and a.HasField("shape") and b.HasField("shape"):
            if len(a.shape.dim) != len(b.shape.dim):
                same = False
            else:
                same = all(
                    not (x.HasField("dim_value") and y.HasField("dim_value")) or x.dim_value == y.dim_value
                    for x, y in zip(a.shape.dim, b.shape.dim)
                )
        if not same:
            raise InputError(
                f"graph output {output.name!r} is the graph input of that name but declares another type"
            )


def _check_no_attribute_references(graph: onnx.GraphProto) -> None:
    """A reference to a function's attribute (``ref_attr_name``) means nothing outside a function."""
    for node in graph.node:
        for attr in node.attribute:
            if attr.ref_attr_name:
                raise InputError(
                    f"attribute {attr.name!r} of {node.op_type} node {node.name!r} refers to a function "
                    f"attribute ({attr.ref_attr_name!r}) outside a function"
                )
            for subgraph in [attr.g] if attr.HasField("g") else attr.graphs:
                _check_no_attribute_references(subgraph)


def _tensor_label(tensor: onnx.TensorProto) -> str:
    return f"tensor {tensor.name!r}" if tensor.name else "an unnamed tensor"


def _element_count(tensor: onnx.TensorProto) -> int:
    count = 1
    for d in tensor.dims:
        if d < 0:
            raise InputError(f"{_tensor_label(tensor)} has a negative dimension {d}")
        count *= d
    return count


def _data_type(tensor: onnx.TensorProto) -> ir.DataType:
    try:
        dtype = ir.DataType(tensor.data_type)
    except ValueError:
        dtype = ir.DataType.UNDEFINED
    if dtype == ir.DataType.UNDEFINED:
        raise InputError(f"{_tensor_label(tensor)} has an unknown data type {tensor.data_type}")
    return dtype


def _packed_nbytes(dtype: ir.DataType, count: int) -> int:
    return (dtype.bitwidth * count + 7) // 8


# The typed field that holds each data type's values when raw_data is not used (int32_data
# for every type not listed: one value per entry, or 2 or 4 values for 4- and 2-bit types).
_TYPED_FIELDS = {
    ir.DataType.FLOAT: "float_data", ir.DataType.COMPLEX64: "float_data",
    ir.DataType.DOUBLE: "double_data", ir.DataType.COMPLEX128: "double_data",
    ir.DataType.INT64: "int64_data", ir.DataType.UINT32: "uint64_data",
    ir.DataType.UINT64: "uint64_data", ir.DataType.STRING: "string_data",
}
_DATA_FIELDS = ("raw_data", "float_data", "int32_data", "string_data", "int64_data",
                "double_data", "uint64_data")


def _check_inline_data(tensor: onnx.TensorProto) -> None:
    """The data stored in the tensor itself must be exactly what its type and shape declare."""
    dtype = _data_type(tensor)
    count = _element_count(tensor)
    label = _tensor_label(tensor)
    present = [f for f in _DATA_FIELDS if (tensor.HasField(f) if f == "raw_data" else len(getattr(tensor, f)))]
    if tensor.HasField("segment"):
        raise InputError(f"{label} is segmented; segmented tensors are not supported")
    if len(present) > 1:
        raise InputError(f"{label} stores its data in several fields ({', '.join(present)})")
    if present == ["raw_data"]:
        if dtype == ir.DataType.STRING:
            raise InputError(f"{label}: a string tensor cannot use raw_data")
        expected = _packed_nbytes(dtype, count)
        if len(tensor.raw_data) != expected:
            raise InputError(
                f"{label}: raw_data has {len(tensor.raw_data)} bytes, but its shape "
                f"{list(tensor.dims)} and type {dtype.name} need {expected}"
            )
        return
    field = _TYPED_FIELDS.get(dtype, "int32_data")
    if present and present != [field]:
        raise InputError(f"{label}: a {dtype.name} tensor cannot store its data in {present[0]}")
    if dtype in (ir.DataType.COMPLEX64, ir.DataType.COMPLEX128):
        expected = 2 * count
    elif field == "int32_data" and dtype.bitwidth < 8:
        expected = -(-count // (8 // dtype.bitwidth)) if 8 % dtype.bitwidth == 0 else count
    else:
        expected = count
    actual = len(getattr(tensor, field))
    if actual != expected:
        raise InputError(
            f"{label}: {field} has {actual} values, but its shape {list(tensor.dims)} "
            f"and type {dtype.name} need {expected}"
        )


def _external_info(tensor: onnx.TensorProto) -> tuple[str, int, int | None]:
    """(location, offset, length) of an external tensor, each validated."""
    label = _tensor_label(tensor)
    entries: dict[str, str] = {}
    for entry in tensor.external_data:
        if entry.key in entries:
            raise InputError(f"{label}: external data key {entry.key!r} is given twice")
        entries[entry.key] = entry.value
    if entries.get("basepath"):
        raise InputError(f"{label}: external data 'basepath' is not supported")
    numbers: dict[str, int] = {}
    for key in ("offset", "length"):
        text = entries.get(key)
        if text is None:
            continue
        if not text.isdigit():
            raise InputError(f"{label}: external data {key} {text!r} is not a non-negative integer")
        numbers[key] = int(text)
    return entries.get("location", ""), numbers.get("offset", 0), numbers.get("length")


def _check_contents(proto: onnx.ModelProto, base_dir: pathlib.Path) -> int:
    """Validates all text and every tensor's data; returns how many tensors are stored externally.

    Inline data must match the declared type and shape exactly. An external
    location must be relative, stay inside ``base_dir`` (no ``..``, no absolute
    path, no symlink escaping it), name an existing regular file with a single
    hard link, and the declared offset and length must fit in that file and
    match the tensor's type and shape. Nothing is opened: only paths and
    ``stat`` results are inspected.
    """
    found = 0
    base = base_dir.resolve()
    tensors: list[onnx.TensorProto] = []
    _scan(proto, tensors)
    for tensor in tensors:
        if not onnx.external_data_helper.uses_external_data(tensor):
            _check_inline_data(tensor)
            continue
        found += 1
        label = _tensor_label(tensor)
        location, offset, length = _external_info(tensor)
        if not location:
            raise InputError(f"{label} uses external data without a location")
        rel = pathlib.PurePath(location)
        if "\0" in location:
            raise InputError(f"{label}: external data location {location!r} is not a valid path")
        if rel.is_absolute() or location.startswith(("/", "\\")) or ".." in rel.parts or (
            pathlib.PureWindowsPath(location).drive
        ):
            raise InputError(
                f"{label}: external data location {location!r} "
                "points outside the model's folder; refusing to read it"
            )
        path = (base / rel).resolve()
        if base not in path.parents:
            raise InputError(
                f"{label}: external data location {location!r} "
                "resolves outside the model's folder; refusing to read it"
            )
        if not path.exists():
            raise InputError(f"{label}: external data file {location!r} not found")
        stat = path.stat()
        if not path.is_file():
            raise InputError(f"{label}: external data {location!r} is not a regular file")
        if stat.st_nlink > 1:
            raise InputError(
                f"{label}: external data file {location!r} has {stat.st_nlink} hard links; "
                "refusing to read it (it may be a link to a file outside the model's folder)"
            )
        size = stat.st_size
        if length is None:
            length = size - offset
        if offset + length > size or length < 0:
            raise InputError(
                f"{label}: external data {location!r} is truncated "
                f"(needs bytes {offset}..{offset + length}, file has {size})"
            )
        dtype = _data_type(tensor)
        if dtype == ir.DataType.STRING:
            raise InputError(f"{label}: a string tensor cannot be stored externally")
        expected = _packed_nbytes(dtype, _element_count(tensor))
        if expected != length:
            raise InputError(
                f"{label}: external data length {length} does not match "
                f"its shape {list(tensor.dims)} and type {dtype.name} ({expected} bytes)"
            )
    return found


def _inference_view(proto: onnx.ModelProto, external: int) -> onnx.ModelProto | None:
    """A copy of ``proto`` whose external initializers are graph inputs instead.

    Strict shape inference fails on a value it cannot read from an external
    tensor (a Reshape's shape, say); as an input of the same type and shape the
    value is simply unknown. None when some external tensor is elsewhere than
    among the main graph's initializers (then only lenient inference is possible).
    """
    names = {t.name for t in proto.graph.initializer if onnx.external_data_helper.uses_external_data(t)}
    if len(names) != external:
        return None
    view = onnx.ModelProto()
    view.CopyFrom(proto)
    inputs = {i.name for i in view.graph.input}
    kept = [t for t in view.graph.initializer if t.name not in names]
    for tensor in view.graph.initializer:
        if tensor.name in names and tensor.name not in inputs:
            view.graph.input.append(onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, tensor.dims))
    del view.graph.initializer[:]
    view.graph.initializer.extend(kept)
    return view


def has_external_data(model: ir.Model) -> bool:
    """Whether any initializer of the model (or its subgraphs) is stored externally."""
    for graph in model.graphs():
        for value in graph.initializers.values():
            if isinstance(value.const_value, ir.ExternalTensor):
                return True
    return False


def _check_versions(proto: onnx.ModelProto) -> None:
    """A graph, an ir_version and opsets this onnx knows, each domain imported once."""
    if not proto.HasField("graph") or proto.ir_version <= 0:
        raise InputError("not an ONNX model (no graph or no ir_version)")
    if proto.ir_version > onnx.IR_VERSION:
        raise InputError(
            f"ir_version {proto.ir_version} is newer than the installed onnx supports ({onnx.IR_VERSION})"
        )
    if proto.functions and proto.ir_version < _FUNCTIONS_IR_VERSION:
        # The checker ignores the functions of such a model, so nothing would validate them.
        raise InputError(
            f"model-local functions need ir_version {_FUNCTIONS_IR_VERSION} or later "
            f"(the model has {proto.ir_version})"
        )
    max_opset = onnx.defs.onnx_opset_version()
    for owner in [proto, *proto.functions]:
        versions: dict[str, int] = {}
        for opset in owner.opset_import:
            domain = "" if opset.domain in ("", "ai.onnx") else opset.domain
            if domain == "" and opset.version > max_opset:
                raise InputError(f"opset {opset.version} is newer than the installed onnx supports ({max_opset})")
            if versions.setdefault(domain, opset.version) != opset.version:
                raise InputError(
                    f"domain {domain or 'ai.onnx'!r} is imported twice, at opsets {versions[domain]} "
                    f"and {opset.version}"
                )


def _fails_inside_a_function_body(message: str, proto: onnx.ModelProto) -> bool:
    """Whether strict inference failed in the function body of a standard op (onnx's own)."""
    match = re.search(r"\(op_type:(\w+)\)", message)
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)
    if match is None or opset is None:
        return False
    try:
        schema = onnx.defs.get_schema(match.group(1), opset)
    except onnx.defs.SchemaError:
        return False
    return bool(schema.has_function or schema.has_context_dependent_function)


def _check_in_memory(proto: onnx.ModelProto) -> None:
    """The checker with strict type and shape inference, falling back to lenient inference.

    Strict inference also expands the function bodies of standard ops, and some
    of onnx's own bodies fail it (MeanVarianceNormalization's in onnx 1.23, for
    one): when the failing node is such an op, a model that passes the checker
    and lenient inference *with* type checking is accepted, so element types
    are still verified. Any other strict failure (an invalid attribute...) stands.

    Raises:
        onnx.checker.ValidationError, onnx.shape_inference.InferenceError: invalid.
    """
    try:
        onnx.checker.check_model(proto, full_check=True)
    except onnx.shape_inference.InferenceError as strict_error:
        if not _fails_inside_a_function_body(str(strict_error), proto):
            raise
        onnx.checker.check_model(proto)
        try:
            onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=False)
        except onnx.shape_inference.InferenceError:
            raise strict_error from None
        logger.info("strict shape inference failed (%s); lenient inference passed", strict_error)


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
    if 0 < proto.ir_version < 4:
        # IR 3 requires every initializer to also be a graph input; IR 4 reads initializers
        # the same way and only drops that rule. Exporters of the time broke it (onnxruntime's
        # own datasets/mul_1.onnx does) and onnxruntime runs such models, so they are read
        # as IR 4 (the upgrade raises the version further anyway).
        proto.ir_version = 4
    try:
        _check_versions(proto)
        _check_pass_through_outputs(proto.graph)
        _check_no_attribute_references(proto.graph)
        external = _check_contents(proto, path.parent)
    except InputError as e:
        raise InputError(f"{path}: {e}") from None
    if check:
        try:
            # The passes rely on consistent element types, so the check includes
            # type inference (an int64 input to a float Add is refused here), and
            # strict inference also refuses invalid attributes. A model with
            # external data is checked by path (the checker reads it), and
            # inferred without its external tensors (see _inference_view).
            if external:
                onnx.checker.check_model(str(path))
                view = _inference_view(proto, external)
                onnx.shape_inference.infer_shapes(view or proto, check_type=True, strict_mode=view is not None)
            else:
                _check_in_memory(proto)
        except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
            raise InputError(f"{path}: invalid model: {_first_line(e)}") from e
        except (RuntimeError, ValueError) as e:
            raise InputError(f"{path}: invalid model: {_first_line(e)}") from e
    try:
        model = model_from_proto(proto)
    except (ValueError, TypeError, KeyError, RuntimeError, NotImplementedError) as e:
        raise InputError(f"{path}: cannot read the model ({_root_message(e)})") from e
    _bind_external_tensors(model, path.parent)
    return model


def _root_message(error: BaseException) -> str:
    """The innermost cause's first line (onnx_ir wraps the reason in SerdeErrors)."""
    while error.__cause__ is not None:
        error = error.__cause__
    return _first_line(error)


def model_from_proto(proto: onnx.ModelProto) -> ir.Model:
    """Builds the IR of ``proto`` (changed in place: sparse Constants densified, map types stashed).

    onnx_ir represents neither sparse tensor attributes nor map types; see
    ``passes._sparse`` and ``passes._opaque_types``. :func:`model_to_proto` and
    :func:`save_model` put the stashed types back.
    """
    densify_sparse_constants(proto)
    stashed = _opaque_types.stash(proto)
    model = ir.serde.deserialize_model(proto)
    if stashed:
        model.meta[_opaque_types.STASH_KEY] = stashed
    return model


def model_to_proto(model: ir.Model) -> onnx.ModelProto:
    """Serialises ``model`` (tensors in memory) with the declarations :func:`model_from_proto` stashed."""
    proto = ir.serde.serialize_model(model)
    _opaque_types.restore(proto, model.meta.get(_opaque_types.STASH_KEY, {}))
    return proto


def _restore_opaque_types(model: ir.Model, path: pathlib.Path) -> None:
    stashed = model.meta.get(_opaque_types.STASH_KEY)
    if stashed:
        proto = onnx.load_model(str(path), load_external_data=False)
        _opaque_types.restore(proto, stashed)
        onnx.save_model(proto, str(path))


def _bind_external_tensors(model: ir.Model, base_dir: pathlib.Path) -> None:
    """Resolves every external tensor against the model's folder.

    Initializers stay memory-mapped (saving keeps them external). A tensor held
    by a node attribute (a Constant's value, in any graph or function) is read
    into memory now: onnx_ir only writes initializers to external data, and
    would otherwise save a reference to the input's data file, or resolve a
    function's tensor against the working directory.
    """
    ir.external_data.set_base_dir(model.graph, str(base_dir))
    for root in (model.graph, *model.functions.values()):
        for node in ir.traversal.RecursiveGraphIterator(root):
            for attr in node.attributes.values():
                if attr.is_ref():
                    continue
                if attr.type == ir.AttributeType.TENSOR and isinstance(attr.value, ir.ExternalTensor):
                    node.attributes[attr.name] = ir.AttrTensor(attr.name, _in_memory(attr.value, base_dir))
                elif attr.type == ir.AttributeType.TENSORS and any(
                    isinstance(t, ir.ExternalTensor) for t in attr.value
                ):
                    tensors = [_in_memory(t, base_dir) for t in attr.value]
                    node.attributes[attr.name] = ir.AttrTensors(attr.name, tensors)
                elif attr.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) and (
                    root is not model.graph  # functions' subgraphs are not saved as external data
                ):
                    for graph in attr.value if attr.type == ir.AttributeType.GRAPHS else [attr.value]:
                        for value in graph.initializers.values():
                            value.const_value = _in_memory(value.const_value, base_dir)


def _in_memory(
    tensor: ir.TensorProtocol | None, base_dir: pathlib.Path | None = None
) -> ir.TensorProtocol | None:
    """An external tensor read (from ``base_dir`` if given) into memory; any other tensor as it is.

    Unlike onnx_ir's own conversion, this leaves the tensor's memory map open:
    closing it fails (BufferError) while a pass still holds an array viewing it.
    """
    if not isinstance(tensor, ir.ExternalTensor):
        return tensor
    if base_dir is not None:
        tensor.base_dir = str(base_dir)
    return ir.Tensor(tensor.numpy().copy(), dtype=tensor.dtype, name=tensor.name)


def data_files(model: ir.Model) -> set[pathlib.Path]:
    """The resolved paths of the external-data files the model's initializers refer to."""
    files = set()
    for graph in model.graphs():
        for value in graph.initializers.values():
            if isinstance(value.const_value, ir.ExternalTensor):
                files.add(pathlib.Path(value.const_value.path).resolve())
    return files


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
        with _small_external_tensors_in_memory(model, _INLINE_UP_TO):
            ir.save(model, path, external_data=data_name, size_threshold_bytes=_INLINE_UP_TO)
        written = [path]
        data = path.parent / data_name
        if data.exists() and data.stat().st_size == 0:
            data.unlink()  # every initializer was small enough to stay inline
        elif data.exists():
            written.append(data)
        _restore_opaque_types(model, path)
        return written
    ir.save(model, path)
    _restore_opaque_types(model, path)
    return [path]


@contextlib.contextmanager
def _small_external_tensors_in_memory(model: ir.Model, threshold: int) -> Iterator[None]:
    """For the duration of a save, external initializers that the save writes inline are in memory.

    onnx_ir reads them itself, then closes their memory map, which fails while
    an array viewing it is alive (a pass may hold one); see :func:`_in_memory`.
    """
    swapped = []
    for graph in model.graphs():
        for value in graph.initializers.values():
            tensor = value.const_value
            if isinstance(tensor, ir.ExternalTensor) and tensor.nbytes <= threshold:
                swapped.append((value, tensor))
                value.const_value = _in_memory(tensor)
    try:
        yield
    finally:
        for value, tensor in swapped:
            value.const_value = tensor


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """Holds SIGINT and SIGTERM until the block ends, then delivers them.

    A commit (several renames) or a clean-up must not be cut in half by an
    interrupt. Only the main thread can install signal handlers; elsewhere this
    does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    # A handler installed outside Python (getsignal() is None) could not be restored: leave it.
    signums = [s for s in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(s) is not None]
    previous = {s: signal.signal(s, lambda signum, frame: received.append(signum)) for s in signums}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if received:
            signal.raise_signal(received[0])


class StagedOutput:
    """A temporary folder next to the destination; :meth:`commit` renames its files into place."""

    def __init__(self, destination: pathlib.Path) -> None:
        self.destination = destination
        self.folder = pathlib.Path(
            tempfile.mkdtemp(prefix=f".{destination.name}.", suffix=".tmp", dir=destination.parent)
        )
        self.path = self.folder / destination.name
        self.files: list[pathlib.Path] = []
        self.committed = False

    def save(self, model: ir.Model, *, external_data: bool | None = None) -> pathlib.Path:
        """Writes the model into the temporary folder.

        Raises:
            InputError: the disk is full, or another error of the file system.
        """
        try:
            self.files = save_model(model, self.path, external_data=external_data)
        except OSError as e:
            raise InputError(f"{self.destination}: cannot write ({e.strerror or _first_line(e)})") from e
        return self.path

    def commit(self) -> list[pathlib.Path]:
        """Moves the written files to the destination folder; the model file last."""
        moved = []
        others = [f for f in self.files if f != self.path]
        with _signals_deferred():
            try:
                for f in [*others, self.path]:
                    target = self.destination.parent / f.name
                    os.replace(f, target)
                    moved.append(target)
            except OSError as e:
                raise InputError(f"{self.destination}: cannot write ({e.strerror or _first_line(e)})") from e
            self.committed = True
        return moved

    def discard(self) -> None:
        with _signals_deferred():
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
        with _signals_deferred():  # an interrupt must not leave the folder behind
            staged = StagedOutput(destination)
    except OSError as e:
        raise InputError(f"{destination}: cannot write here ({_first_line(e)})") from e
    try:
        yield staged
    finally:
        staged.discard()
