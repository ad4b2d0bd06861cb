"""Loading and saving models safely.

Loading validates what it reads before anything trusts it: the file must be an
ONNX model whose text is UTF-8 and whose tensors hold exactly the data their
type and shape declare; external-data references must stay inside the model's
folder and fit in their files (only paths and ``stat`` results are inspected:
nothing outside the folder is ever opened); and the model must pass the ONNX
checker, type inference included. External weights are memory-mapped by
``onnx_ir`` rather than copied into memory.

Saving is atomic (:mod:`passes.modelio.save`): everything is written into a
temporary folder next to the destination and renamed into place only when
complete, so a failure or an interrupt never leaves a partial output behind.

This module is the package's face: it only names what the modules below it
provide. Importing it is cheap: onnx and onnx_ir are imported on first use.
"""

from __future__ import annotations

from passes.modelio.load import (
    check_unchanged,
    check_view,
    data_files,
    has_external_data,
    load_model,
    add_model_notes,
    model_notes,
    model_from_proto,
    model_to_proto,
    model_to_proto_with_markers,
    proto_from_bytes,
    read_graph,
    read_whole,
    repair_in_memory,
    source_files,
    validate_proto,
)
from passes.limits import PROTOBUF_LIMIT
from passes.modelio.save import StagedOutput, save_model, signals_deferred, staged_output, weights_nbytes
from passes.modelio.weights import read_weights_in_file

__all__ = [
    "PROTOBUF_LIMIT",
    "StagedOutput",
    "check_unchanged",
    "check_view",
    "data_files",
    "source_files",
    "weights_nbytes",
    "has_external_data",
    "load_model",
    "add_model_notes",
    "model_notes",
    "model_from_proto",
    "model_to_proto",
    "model_to_proto_with_markers",
    "proto_from_bytes",
    "read_graph",
    "read_weights_in_file",
    "read_whole",
    "repair_in_memory",
    "save_model",
    "signals_deferred",
    "staged_output",
    "validate_proto",
]

