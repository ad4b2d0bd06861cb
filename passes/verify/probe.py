"""What onnxruntime runs: probed with one-node models, once per process (cached in memory).

* :func:`max_supported_opset`: the highest default-domain opset it loads;
* :func:`runs_op`: whether its CPU provider has a kernel for an op at an opset
  and element type (a fused op is written only where the check can run it);
* :func:`has_version_kernel`: whether its CPU provider registers a kernel for a
  version of a default-domain op (read from its kernel registry, no model built).

Importing this module imports onnxruntime, so only what needs the answer
imports it, and only then: the upgrade pass for a target above the opsets
every supported onnxruntime runs, the CLI or pipeline to tell the user the
range, the simplify fusions into standard ops once a pattern is found.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort

from passes.declarations import DEFAULT_TARGET_OPSET as MIN_TARGET_OPSET
from passes.ir.schemas import min_ir_version

__all__ = ["has_kernel", "has_version_kernel", "max_supported_opset", "ort_loads", "runs_op"]

logger = logging.getLogger(__name__)


def _errors() -> tuple[type[BaseException], ...]:
    return tuple(
        getattr(ort.capi.onnxruntime_pybind11_state, name)
        for name in ("Fail", "InvalidGraph", "InvalidArgument", "NotImplemented", "RuntimeException")
        if hasattr(ort.capi.onnxruntime_pybind11_state, name)
    )


def ort_loads(opset: int) -> bool:
    """Whether onnxruntime (CPU) loads a model of default-domain ``opset``."""
    errors = _errors()
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", ["x"], ["y"])],
        "probe",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
    )
    model = onnx.helper.make_model(
        graph, opset_imports=[onnx.helper.make_opsetid("", opset)], ir_version=min_ir_version(opset)
    )
    options = ort.SessionOptions()
    options.log_severity_level = 4
    try:
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except errors as error:
        logger.debug("onnxruntime does not load opset %s: %s", opset, error)
        return False
    return True


@functools.cache
def max_supported_opset() -> int:
    """The highest default-domain opset that both onnx and onnxruntime support (probed once).

    The probe goes down from onnx's newest opset to the upgrade's lowest target
    (:data:`passes.declarations.DEFAULT_TARGET_OPSET`); one below it when
    onnxruntime runs none of them.
    """
    for opset in range(onnx.defs.onnx_opset_version(), MIN_TARGET_OPSET - 1, -1):
        if ort_loads(opset):
            return opset
    return MIN_TARGET_OPSET - 1


@functools.cache
def runs_op(op_type: str, opset: int, dtype: int, shapes: tuple[tuple[int, ...], ...],
            attributes: tuple[tuple[str, Any], ...] = ()) -> bool:  # fmt: skip
    """Whether onnxruntime's CPU provider runs a one-node ``op_type`` model (probed once per process).

    Args:
        op_type: A default-domain op.
        opset: The model's default-domain opset.
        dtype: The element type of every input and of the output (``onnx.TensorProto.FLOAT16``).
        shapes: One shape per input (every input an initializer of ones).
        attributes: The node's attributes, as ``(name, value)`` pairs.

    The model must load (a kernel for that op, opset and type is registered) and
    run (some kernels are registered for a type they then refuse).
    """
    element, numpy_type = int(dtype), ir.DataType(int(dtype)).numpy()  # bfloat16 too (ml_dtypes)
    names = [f"input{i}" for i in range(len(shapes))]
    # The inputs are initializers: no feed to convert (onnxruntime takes no bfloat16 numpy array).
    initializers = [onnx.numpy_helper.from_array(np.ones(s, dtype=numpy_type), n) for n, s in zip(names, shapes)]
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node(op_type, names, ["output"], **dict(attributes))],
        "probe",
        [],
        [onnx.helper.make_tensor_value_info("output", element, None)],
        initializer=initializers,
    )
    model = onnx.helper.make_model(
        graph, opset_imports=[onnx.helper.make_opsetid("", opset)], ir_version=min_ir_version(opset)
    )
    options = ort.SessionOptions()
    options.log_severity_level = 4
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # the kernel runs, not folded
    try:
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        session.run_with_ort_values(None, {})  # OrtValues: no numpy type needed for the output
    except (*_errors(), ValueError, TypeError) as error:
        logger.debug("onnxruntime does not run %s-%s for %s: %s", op_type, opset,
                     onnx.TensorProto.DataType.Name(element), error)
        return False
    return True


@functools.cache
def has_kernel(op_type: str, domain: str, opset: int, input_types: tuple[int, ...], output_types: tuple[int, ...],
               attributes: bytes = b"") -> bool:  # fmt: skip
    """Whether onnxruntime's CPU provider has a kernel for a node with these element types
    (``--precision``: is there a float16 Conv?), probed once per process.

    A one-node model whose inputs are graph inputs of the given types (0: an omitted
    optional input) and of unknown shape is loaded with every graph optimisation off:
    onnxruntime resolves each node's kernel by its types when it builds the session, so a
    load that succeeds means the kernel exists. ``attributes`` is a serialized ``NodeProto``
    holding the node's attributes (subgraphs excluded).
    """
    holder = onnx.NodeProto()
    if attributes:
        holder.ParseFromString(attributes)
    inputs = [f"input{i}" if t else "" for i, t in enumerate(input_types)]
    outputs = [f"output{i}" for i in range(len(output_types))]
    node = onnx.helper.make_node(op_type, inputs, outputs, domain=domain or None)
    node.attribute.extend(holder.attribute)
    graph = onnx.helper.make_graph(
        [node], "probe",
        [onnx.helper.make_tensor_value_info(n, t, None) for n, t in zip(inputs, input_types) if t],
        [onnx.helper.make_tensor_value_info(n, t, None) for n, t in zip(outputs, output_types)],
    )  # fmt: skip
    imports = [onnx.helper.make_opsetid(domain, opset)]
    if domain:
        imports.append(onnx.helper.make_opsetid("", max_supported_opset()))
    model = onnx.helper.make_model(graph, opset_imports=imports,
                                   ir_version=min_ir_version(opset if not domain else max_supported_opset()))  # fmt: skip
    options = ort.SessionOptions()
    options.log_severity_level = 4
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except (*_errors(), ValueError, TypeError) as error:
        logger.debug("onnxruntime has no %s-%s kernel for %s -> %s: %s", op_type, opset, input_types,
                     output_types, error)  # fmt: skip
        return False
    return True


_OPEN_END = 2**31 - 1


@functools.cache
def _cpu_kernel_ranges() -> dict[str, tuple[tuple[int, int], ...]] | None:
    """The version ranges of the default-domain kernels of onnxruntime's CPU provider, by op;
    None when this onnxruntime does not list its kernels."""
    listing = getattr(ort.capi.onnxruntime_pybind11_state, "get_all_opkernel_def", None)
    if listing is None:
        return None
    ranges: dict[str, list[tuple[int, int]]] = {}
    for kernel in listing():
        if kernel.provider == "CPUExecutionProvider" and kernel.domain in ("", "ai.onnx"):
            start, end = kernel.version_range
            ranges.setdefault(kernel.op_name, []).append((int(start), int(end)))
    return {op: tuple(found) for op, found in ranges.items()}


def has_version_kernel(op_type: str, since: int) -> bool | None:
    """Whether onnxruntime's CPU provider has a kernel for the schema version ``since`` of the
    default-domain ``op_type`` (``since``: the opset that introduced that version).

    onnxruntime takes a kernel for a node whose schema version is ``since`` when the kernel
    starts at ``since``, or starts before it and ends at or after it with an end set; a kernel
    registered from 1 without an end serves version 1 only (``RandomUniform``: onnxruntime
    1.32 runs RandomUniform-1, not RandomUniform-22). None: this onnxruntime does not list its
    kernels, or the op has none and onnxruntime may run it as its schema's function body.
    """
    ranges = _cpu_kernel_ranges()
    if ranges is None:
        return None
    if any(start == since or (start < since <= end and end != _OPEN_END) for start, end in ranges.get(op_type, ())):
        return True
    schema = onnx.defs.get_schema(op_type, since, "") if onnx.defs.has(op_type, "") else None
    if schema is not None and (schema.has_function or schema.has_context_dependent_function):
        return None
    return False
