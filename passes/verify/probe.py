"""Which default-domain opsets onnxruntime runs: probed by loading a one-node model per opset.

Importing this module imports onnxruntime, so only what needs the real
highest opset imports it, and only then: the upgrade pass for a target above
the opsets every supported onnxruntime runs, the CLI or pipeline to tell the
user the range.
"""

from __future__ import annotations

import functools
import logging

import onnx
import onnxruntime as ort

from passes.declarations import DEFAULT_TARGET_OPSET as MIN_TARGET_OPSET
from passes.ir.schemas import min_ir_version

__all__ = ["max_supported_opset", "ort_loads"]

logger = logging.getLogger(__name__)


def ort_loads(opset: int) -> bool:
    """Whether onnxruntime (CPU) loads a model of default-domain ``opset``."""
    errors = tuple(
        getattr(ort.capi.onnxruntime_pybind11_state, name)
        for name in ("Fail", "InvalidGraph", "InvalidArgument", "NotImplemented", "RuntimeException")
        if hasattr(ort.capi.onnxruntime_pybind11_state, name)
    )
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
