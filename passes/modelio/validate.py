"""Validation of a parsed model before anything trusts it (used by ``modelio.load_model``).

Two steps: :func:`check_contents` looks at every tensor and reference without
reading external data (versions, pass-through outputs, attribute references
outside functions; then the tensors, :mod:`passes.modelio.tensor_data`: inline
data against type and shape, external-data locations confined to the model's
folder and fitting their files), and
:func:`check_validity` runs the ONNX checker with type inference. Both raise
:class:`~passes.errors.InputError` with a one-line reason.
"""

from __future__ import annotations

import logging
import pathlib
import re
from collections.abc import Iterable

import onnx
import onnx.checker
import onnx.external_data_helper

from passes.errors import InputError, cut
from passes.modelio import repair as _repair, views
from passes.modelio.declared import (  # noqa: F401  ShapeConflict: part of check_validity's result
    SHAPE_CONFLICT,
    ShapeConflict,
    declared_shape_conflicts,
)
from passes.modelio.survey import Survey, survey
from passes.modelio.tensor_data import Identity, check_tensors, identity  # noqa: F401  (the loader's, named here)

__all__ = ["Identity", "ShapeConflict", "check_contents", "check_validity", "identity"]

logger = logging.getLogger(__name__)

# IR version 8 added ModelProto.functions.
_FUNCTIONS_IR_VERSION = 8


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


def _nodes(graph_nodes: Iterable[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """The nodes and those of their subgraphs, at any depth."""
    found, stack = [], list(graph_nodes)
    while stack:
        node = stack.pop()
        found.append(node)
        for attr in node.attribute:
            for subgraph in [attr.g] if attr.HasField("g") else attr.graphs:
                stack.extend(subgraph.node)
    return found


def _check_no_attribute_references(graph: onnx.GraphProto) -> None:
    """A reference to a function's attribute (``ref_attr_name``) means nothing outside a function."""
    stack = list(graph.node)  # the order of _nodes, in one look at each attribute
    while stack:
        node = stack.pop()
        for attr in node.attribute:
            if attr.HasField("g"):
                stack.extend(attr.g.node)
            elif attr.graphs:
                for subgraph in attr.graphs:
                    stack.extend(subgraph.node)
            if attr.ref_attr_name:
                raise InputError(
                    f"attribute {attr.name!r} of {node.op_type} node {node.name!r} refers to a function "
                    f"attribute ({attr.ref_attr_name!r}) outside a function"
                )


def _check_attribute_reference_types(proto: onnx.ModelProto) -> None:
    """A function's attribute has the type its body's references declare, at every call and as a default.

    The ONNX checker does not compare them: a ReduceMax in a function whose
    ``axes`` (INTS) refers to an attribute a call gives as FLOAT passes it, and
    no runtime can expand that call. Refused here, because the passes would
    carry the mismatch into ops that inference then rejects.
    """
    # (domain, name, overload) -> referenced attribute name -> (node, its referencing attribute)
    refs: dict[tuple[str, str, str], dict[str, tuple[onnx.NodeProto, onnx.AttributeProto]]] = {}
    for function in proto.functions:
        found = refs.setdefault((function.domain, function.name, function.overload), {})
        for node in _nodes(function.node):
            for attr in node.attribute:
                if attr.ref_attr_name and attr.type:
                    found.setdefault(attr.ref_attr_name, (node, attr))
        for default in function.attribute_proto:
            _same_type(found.get(default.name), default, function.name, "whose default is")
    if not any(refs.values()):
        return
    for call in _nodes([*proto.graph.node, *(n for f in proto.functions for n in f.node)]):
        found = refs.get((call.domain, call.op_type, call.overload))
        for given in call.attribute if found else ():
            _same_type(found.get(given.name), given, call.op_type, f"which node {call.name!r} gives as")


def _same_type(ref: tuple[onnx.NodeProto, onnx.AttributeProto] | None, given: onnx.AttributeProto, function: str,
               how: str) -> None:  # fmt: skip
    """Raises unless ``given`` (a call's attribute, or a default) has the type its reference ``ref`` declares."""
    if ref is None or not given.type or given.type == ref[1].type:
        return
    node, attr = ref
    raise InputError(
        f"function {function!r}: attribute {attr.name!r} of {node.op_type} node {node.name!r} refers to "
        f"{given.name!r} ({_type_name(attr.type)}), {how} {_type_name(given.type)}"
    )


def _type_name(kind: int) -> str:
    return onnx.AttributeProto.AttributeType.Name(kind) if kind else "UNDEFINED"


def _one_line(error: BaseException, limit: int = 300) -> str:
    """The error's message on one line (the checker's span several, the node's name on the second)."""
    return cut(" ".join(str(error).split()) or type(error).__name__, limit)


def _inference_view(proto: onnx.ModelProto, external: int) -> onnx.ModelProto | None:
    """A copy of ``proto`` whose external initializers are graph inputs instead (see ``views``).

    None when some external tensor is elsewhere than among the main graph's
    initializers (then only lenient inference is possible).
    """
    names = {t.name for t in proto.graph.initializer if onnx.external_data_helper.uses_external_data(t)}
    if len(names) != external:
        return None
    return views.without_initializers(proto, names)


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


def _check_in_memory(proto: onnx.ModelProto) -> list[ShapeConflict]:
    """The checker with strict type and shape inference, falling back to lenient inference.

    Strict inference also expands the function bodies of standard ops, and some
    of onnx's own bodies fail it (MeanVarianceNormalization's in onnx 1.23, for
    one): when the failing node is such an op, a model that passes the checker
    and lenient inference *with* type checking is accepted, so element types
    are still verified. A failure that is only declared shapes contradicting
    the graph (see :func:`passes.modelio.declared.declared_shape_conflicts`) is accepted too, and the
    conflicts are returned: onnxruntime runs such a model, and the optimiser's
    own output keeps the declarations the input had. Any other strict failure
    (an invalid attribute...) stands.

    Raises:
        onnx.checker.ValidationError, onnx.shape_inference.InferenceError: invalid.
    """
    try:
        _checker(proto, full_check=True)
    except onnx.shape_inference.InferenceError as strict_error:
        if SHAPE_CONFLICT in str(strict_error):
            _checker(proto)
            return declared_shape_conflicts(proto, strict_error)
        if not _fails_inside_a_function_body(str(strict_error), proto):
            raise
        _checker(proto)
        try:
            onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=False)
        except onnx.shape_inference.InferenceError:
            raise strict_error from None
        logger.info("strict shape inference failed (%s); lenient inference passed", strict_error)
    return []


def _checker(proto: onnx.ModelProto, *, full_check: bool = False) -> None:
    """``onnx.checker.check_model``, reading a main-graph input or output without a ``shape`` field as an
    unknown shape (see :mod:`passes.modelio.repair`): the structural check sees the field, strict
    inference (``full_check``) runs on the model as it is.

    Raises:
        onnx.checker.ValidationError, onnx.shape_inference.InferenceError: invalid.
    """
    if not _repair.shapeless_values(proto):
        onnx.checker.check_model(proto, full_check=full_check)
        return
    with _repair.shape_fields_present(proto):
        onnx.checker.check_model(proto)
    if full_check:
        onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=True)


def _check_by_path(proto: onnx.ModelProto, path: pathlib.Path | None, external: int) -> None:
    """The checker on the file (which it reads external data through); if the file fails, on the model
    as loaded (repaired, see :mod:`passes.modelio.repair`) without its external tensors, whose data
    :func:`check_contents` has checked."""
    try:
        onnx.checker.check_model(str(path))
    except onnx.checker.ValidationError:
        view = _inference_view(proto, external)
        if view is None:
            raise
        _checker(view)


def check_contents(
    proto: onnx.ModelProto, base_dir: pathlib.Path, identities: dict[pathlib.Path, Identity] | None = None,
    known: Survey | None = None,
) -> int:
    """Checks versions, structure and every tensor; returns how many tensors are external.

    ``identities`` receives each external file's :data:`Identity` (see
    :func:`passes.modelio.tensor_data.check_tensors`, which checks the tensors). ``known``: the
    model's :func:`~passes.modelio.survey.survey`, if the caller made it (made here otherwise).

    Raises:
        InputError: the first problem found.
    """
    known = survey(proto) if known is None else known
    _check_versions(proto)
    if not proto.graph.output:  # every node is dead: the output would be an empty graph onnxruntime cannot load
        raise InputError("the model's graph has no outputs: it computes nothing")
    _check_pass_through_outputs(proto.graph)
    if not known.plain:  # plain: no attribute holds a reference (nor a subgraph that could)
        _check_no_attribute_references(proto.graph)
    _check_attribute_reference_types(proto)
    return check_tensors(proto, base_dir, identities, known)


def check_validity(
    proto: onnx.ModelProto, path: pathlib.Path | None, external: int, *, log: bool = True
) -> list[ShapeConflict]:
    """The ONNX checker with type inference (see :func:`_check_in_memory`).

    The passes rely on consistent element types, so the check includes type
    inference (an int64 input to a float Add is refused), and strict inference
    also refuses invalid attributes. A model with external data is checked by
    path (the checker reads it) and inferred without its external tensors (see
    :func:`_inference_view`); an inline one is checked without its initializers
    over 1 MiB, whose data :func:`check_contents` has checked (see ``views``).

    Returns:
        The declared shapes that the graph contradicts (accepted; logged as warnings if ``log``).

    Raises:
        InputError: the model is invalid.
    """
    try:
        if external:
            _check_by_path(proto, path, external)
            view = _inference_view(proto, external)
            try:
                onnx.shape_inference.infer_shapes(view or proto, check_type=True, strict_mode=view is not None)
                conflicts = []
            except onnx.shape_inference.InferenceError as e:
                if view is None or SHAPE_CONFLICT not in str(e):
                    raise
                conflicts = declared_shape_conflicts(view, e)
        else:  # the checker does not need large weights' values (see passes.modelio.views)
            conflicts = _check_in_memory(views.without_initializers(proto, views.large_initializers(proto)))
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError, RuntimeError, ValueError) as e:
        where = _repair.locate(proto, e) if isinstance(e, onnx.checker.ValidationError) else None
        raise InputError(f"invalid model: {where + ': ' if where else ''}{_one_line(e)}") from e
    for conflict in conflicts if log else ():
        logger.warning("%s; kept as declared (onnxruntime runs the model regardless)", conflict.text())
    return conflicts
