"""The files onnxruntime runs for the check, and the graphs read back from them.

Either model may be given as a path, bytes, a ``ModelProto`` or an
``onnx_ir.Model``; onnxruntime runs files (in the check's child process), so
each becomes one (:func:`materialize`), and its graph is read back without
external data and with large attribute lists left in the file
(:func:`passes.modelio.read_graph`) to plan the inputs; the locator, which
builds copies that run, reads the whole graph (:func:`whole`).
"""

from __future__ import annotations

import os
import pathlib
from typing import Any

import onnx
import onnx_ir as ir

from passes import modelio  # modelio imports nothing from passes.verify
from passes.limits import PROTOBUF_LIMIT

__all__ = ["graph_only", "materialize", "runnable", "save_proto", "whole"]


def graph_only(path: pathlib.Path) -> onnx.ModelProto:
    """The graph to plan inputs and read declarations (large attributes as markers: see ``modelio.read_graph``)."""
    return modelio.read_graph(path)[0]


def whole(path: pathlib.Path) -> onnx.ModelProto:
    """The graph with every attribute, to build copies that run (external data not loaded)."""
    return modelio.read_whole(path)


def save_proto(model: onnx.ModelProto, path: pathlib.Path) -> None:
    if model.ByteSize() < PROTOBUF_LIMIT:
        path.write_bytes(model.SerializeToString())
    else:
        onnx.save_model(model, str(path), save_as_external_data=True, location=path.name + ".data")


def materialize(model: Any, folder: pathlib.Path, label: str) -> tuple[pathlib.Path, onnx.ModelProto]:
    """A file onnxruntime can load for ``model``, and its graph (external data not loaded)."""
    path = runnable(model, folder, label)
    if isinstance(model, onnx.ModelProto) and model.ByteSize() < PROTOBUF_LIMIT:
        return path, model
    if isinstance(model, bytes):
        return path, onnx.load_model_from_string(model)
    return path, graph_only(path)


def runnable(model: Any, folder: pathlib.Path, label: str) -> pathlib.Path:
    """A file onnxruntime can load for ``model`` (a path as it is: its graph is not read)."""
    if isinstance(model, (str, os.PathLike)):
        return pathlib.Path(os.path.abspath(model))  # the child runs in another folder
    target = folder / label / "model.onnx"
    target.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(model, bytes):
        target.write_bytes(model)
        return target
    if isinstance(model, onnx.ModelProto):
        save_proto(model, target)
        return target
    if isinstance(model, ir.Model):
        modelio.save_model(model, target)
        return target
    raise TypeError(f"cannot run a {type(model).__name__} in onnxruntime")
