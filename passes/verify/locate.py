"""Where a mismatch starts: the first node of the original whose output differs.

After a failed check, the values that exist under the same name in both
models, with a known tensor type that onnxruntime can return, become extra
graph outputs of a copy of each model; the child runs both copies on the kept
inputs (a chunk of values per run, sized to a memory budget) and compares
each value with its own tolerance. The first node in the original's
topological order with a differing output is the start; its inputs' errors
say whether the node itself changed the result (all zero) or inherited it.
"""

from __future__ import annotations

import os
import pathlib
import shutil
from collections.abc import Mapping
from typing import Any

import onnx

from passes.modelio import destinations
from passes.verify import lowest as _lowest, plan
from passes.verify.result import FirstDifference, default_tolerance

__all__ = ["augmented", "comparable_values", "first_difference", "link_external", "tensor_types", "value_tolerances",
           "widened"]

#: Element types onnxruntime's Python API can return (not bfloat16, float8, int4...).
_FETCHABLE = frozenset(t for t, name in plan.NUMPY_TYPES.items() if name != "bfloat16")


def tensor_types(proto: onnx.ModelProto) -> dict[str, int]:
    """Element type of every main-graph value whose type is known (after lenient inference)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, check_type=False, strict_mode=False)
    except Exception:  # noqa: BLE001  inference is a help here: declared types remain
        inferred = proto
    graph = inferred.graph
    types: dict[str, int] = {t.name: t.data_type for t in graph.initializer}
    for info in [*graph.input, *graph.value_info, *graph.output]:
        if info.type.HasField("tensor_type") and info.type.tensor_type.elem_type:
            types.setdefault(info.name, info.type.tensor_type.elem_type)
    return types


def comparable_values(original: onnx.ModelProto, optimized: onnx.ModelProto) -> tuple[list[str], dict[str, int]]:
    """Values of the original (node outputs and initializers, in topological order) that the
    optimised model has under the same name with the same element type, and those types."""
    a, b = tensor_types(original), tensor_types(optimized)
    inputs = {i.name for i in original.graph.input}
    names: list[str] = []
    seen: set[str] = set()
    candidates = [t.name for t in original.graph.initializer]
    candidates += [name for node in original.graph.node for name in node.output if name]
    for name in candidates:
        if name in seen or name in inputs:
            continue
        seen.add(name)
        if a.get(name) is not None and a.get(name) == b.get(name) and a[name] in _FETCHABLE:
            names.append(name)
    return names, a


def value_tolerances(
    original: onnx.ModelProto, names: list[str], rtol: float | None, atol: float | None,
    precision: str | None = None, precision_tolerance: tuple[float, float | None] | None = None,
) -> dict[str, tuple[float, float] | None]:
    """Each value's tolerance, from the lowest-precision float type it depends on (and
    ``precision``, the half type an optimised model computes in, for a float value, at
    ``precision_tolerance`` if given: see :func:`passes.verify.result.default_tolerance`)."""
    lowest = _lowest.float_dependencies(original.graph)
    result: dict[str, tuple[float, float] | None] = {}
    for name in names:
        found = lowest.get(name)
        if found is None:
            result[name] = None
            continue
        if precision is not None:
            found = _lowest.lower(found, (precision, name))
        default_rtol, default_atol = default_tolerance(found[0], precision, precision_tolerance)
        result[name] = (default_rtol if rtol is None else rtol, default_atol if atol is None else atol)
    return result


def link_external(proto: onnx.ModelProto, source: pathlib.Path, folder: pathlib.Path) -> None:
    """Makes the external data files ``proto``'s tensors name (at any depth; relative to
    ``source``, its folder) appear in ``folder`` too, where a copy of it is saved to run
    (onnxruntime refuses data outside the model's folder): hard links where the file system
    allows, copies otherwise; a file already there is kept."""
    folder.mkdir(parents=True, exist_ok=True)
    for location in sorted(destinations.external_locations(proto)):
        target = folder / location
        if target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        origin = source / location
        try:
            os.link(origin, target)
        except OSError:
            shutil.copyfile(origin, target)


def augmented(
    proto: onnx.ModelProto, source: pathlib.Path, names: list[str], types: Mapping[str, int], folder: pathlib.Path
) -> pathlib.Path:
    """A copy of the model with ``names`` as extra graph outputs, saved in ``folder``.

    Args:
        proto: The model, external data not loaded.
        source: Its file (external data is relative to its folder).
        names: Values to add as outputs.
        types: Their element types.
        folder: An empty folder: the copy and its external data go there
            (onnxruntime refuses data outside the model's folder): hard links
            where the file system allows, copies otherwise.
    """
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    present = {o.name for o in copy.graph.output}
    for name in names:
        if name not in present:
            copy.graph.output.append(onnx.helper.make_tensor_value_info(name, types[name], None))
    link_external(proto, source.parent, folder)
    path = folder / "model.onnx"
    onnx.save_model(copy, str(path))
    return path


def first_difference(original: onnx.ModelProto, values: Mapping[str, Mapping[str, Any]]) -> FirstDifference:
    """The first node of ``original`` (in its node order, which is topological) whose output differs."""
    initializers = {t.name for t in original.graph.initializer}
    inputs = {i.name for i in original.graph.input} - initializers
    for position, node in enumerate(original.graph.node):
        for output in node.output:
            found = values.get(output)
            if not found or found.get("ok", True) or "error" in found:
                continue
            described = []
            for name in node.input:
                if not name:
                    continue
                kind = "input" if name in inputs else "initializer" if name in initializers else "value"
                compared = values.get(name)
                if kind == "input":
                    error: float | None = 0.0
                elif compared is None or "error" in compared:
                    error = None
                else:
                    error = float(compared["max_abs_error"])
                described.append({"name": name, "kind": kind, "max_abs_error": error,
                                  "ok": kind == "input" or bool(compared and compared.get("ok", False))})  # fmt: skip
            op = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"
            return FirstDifference(
                node=node.name, op=op, position=position, output=output,
                max_abs_error=float(found["max_abs_error"]), inputs=described, compared=len(values),
            )  # fmt: skip
    return FirstDifference(
        compared=len(values),
        message=f"none of the {len(values)} values both models have differs beyond tolerance; "
        "the difference arises in values only one of them has",
    )


_HALF = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)


def widened(original: onnx.ModelProto, optimized: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``optimized`` in which each main-graph value that the original computes in
    float32 and ``optimized`` in a half type (``--precision``) keeps its name as float32: the
    half value is renamed and a Cast back to float32 takes its name, so the locator compares
    them (and onnxruntime returns bfloat16 values this way). A graph output of the half type
    (``--precision-io``) is widened alike: the output keeps its name, as float32."""
    a, b = tensor_types(original), tensor_types(optimized)
    targets = [n for node in optimized.graph.node for n in node.output
               if n and b.get(n) in _HALF and a.get(n) == onnx.TensorProto.FLOAT]
    copy = onnx.ModelProto()
    copy.CopyFrom(optimized)
    if not targets:
        return copy
    used = set(a) | set(b)
    rename = {}
    for name in targets:
        new, k = f"{name}__half", 1
        while new in used:
            new, k = f"{name}__half{k}", k + 1
        used.add(new)
        rename[name] = new

    def renamed(graph: onnx.GraphProto) -> None:
        for node in graph.node:
            node.input[:] = [rename.get(n, n) for n in node.input]
            node.output[:] = [rename.get(n, n) for n in node.output]
            for attr in node.attribute:
                for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
                    renamed(sub)

    renamed(copy.graph)
    kept = [info for info in copy.graph.value_info if info.name not in rename]
    del copy.graph.value_info[:]
    copy.graph.value_info.extend(kept)
    for name, new in rename.items():
        copy.graph.node.append(onnx.helper.make_node("Cast", [new], [name], to=onnx.TensorProto.FLOAT,
                                                     name=f"{new}__to_float"))  # fmt: skip
    for output in copy.graph.output:  # the Cast's output now
        if output.name in rename and output.type.HasField("tensor_type"):
            output.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    return copy
