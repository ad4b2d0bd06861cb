"""Where a mismatch starts: the first node of the original whose output differs.

After a failed check, the values both models compute the same way become
extra graph outputs of a copy of each model; the child runs both copies on the
kept inputs (a chunk of values per run, sized to a memory budget) and compares
each value with its own tolerance. The first node in the original's
topological order with a differing output is the start; its inputs' errors
say whether the node itself changed the result (all zero) or inherited it.

A value is compared when both models have it under the same name, with the same
known tensor type that onnxruntime can return, and the node making it in the
optimised model reads the same values as the original's node
(:class:`Correspondence`): a pass that rewrites a node (a fusion folding a
BatchNormalization into the Conv's weights, a MatMul and an Add into a Gemm)
gives it other inputs, so its output, although it keeps its name, now means
something else, and comparing it would blame the rewrite's node for the
difference of meaning. The node making it may be another op (a pass that
changes an op while keeping its inputs is what the locator must find), may
take more inputs (the upgrade turns attributes into inputs), and a constant
that fold wrote under the value's name is compared with what the original
computes. The nodes before the first difference that the passes rewrote or
fused away are named with it.
"""

from __future__ import annotations

import os
import pathlib
import shutil
from collections.abc import Mapping
from typing import Any

import onnx

from passes.modelio import destinations
from passes.verify import feeds, lowest as _lowest
from passes.verify.defaults import default_tolerance
from passes.verify.result import FirstDifference

__all__ = ["Correspondence", "augmented", "comparable_values", "first_difference", "link_external", "tensor_types",
           "value_tolerances", "widened"]

#: Element types onnxruntime's Python API can return (not bfloat16, float8, int4...).
_FETCHABLE = frozenset(t for t, name in feeds.NUMPY_TYPES.items() if not name.startswith(("bfloat16", "float8")))


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


class Correspondence:
    """Which values of the original the optimised model computes the same way (see the module docstring).

    ``through_casts``: the optimised model is a ``--precision`` model (or its emulation), whose
    Casts to and from the half type stand between the values it shares with the original; they
    are looked through, as Identity nodes are in both models.
    """

    def __init__(self, original: onnx.ModelProto, optimized: onnx.ModelProto, *, through_casts: bool = False) -> None:
        self.original, self.optimized = original, optimized
        self._a = {out: node for node in original.graph.node for out in node.output if out}
        self._b = {out: node for node in optimized.graph.node for out in node.output if out}
        self._b_names = set(self._b) | {t.name for t in optimized.graph.initializer}
        self._b_names |= {i.name for i in optimized.graph.input}
        self._through = ("Identity", "Cast") if through_casts else ("Identity",)
        self._origins: dict[tuple[bool, str], str] = {}

    def _origin(self, name: str, original: bool) -> str:
        """``name`` followed back through the Identity nodes (and, in the optimised model, the Casts it
        looks through) that make it; each chain walked once (cached)."""
        producers, ops = (self._a, ("Identity",)) if original else (self._b, self._through)
        chain = []
        while (original, name) not in self._origins and len(chain) <= len(producers):
            node = producers.get(name)
            if node is None or node.op_type not in ops or node.domain not in ("", "ai.onnx") or not node.input:
                self._origins[(original, name)] = name
                break
            chain.append(name)
            name = node.input[0]
        found = self._origins.get((original, name), name)
        for link in chain:
            self._origins[(original, link)] = found
        return found

    def _same_value(self, original_name: str, optimized_name: str) -> bool:
        source = self._origin(original_name, True)
        return self._origin(optimized_name, False) == self._origin(source, False)

    def same(self, name: str) -> bool:
        """Whether the optimised model's ``name`` is the original's value: a constant there, or made by a
        node that reads the same values (the original's inputs, then any more)."""
        made = self._a.get(name)
        if made is None:
            return name in self._b_names  # an initializer of the original
        node = self._b.get(name)
        while node is not None and made.op_type not in self._through and node.op_type in self._through:
            node = self._b.get(node.input[0]) if node.input else None  # the Casts a --precision model adds
        if node is None:
            return name in self._b_names  # a constant there (fold, or a converted weight)
        if len(node.input) < len(made.input):
            return False
        return all(not a or self._same_value(a, b) for a, b in zip(made.input, node.input))

    def rewritten_before(self, node: onnx.NodeProto, compared: Mapping[str, Any], limit: int = 5) -> list[dict[str, Any]]:
        """The nodes of the original before ``node`` (its inputs' producers, back to values that were
        compared) whose outputs the passes rewrote or removed: ``{"node", "op", "position", "how"}``,
        the ``limit`` nearest to it, in the original's order."""
        position = {id(n): i for i, n in enumerate(self.original.graph.node)}
        found: dict[int, onnx.NodeProto] = {}
        pending = [name for name in node.input if name]
        seen: set[str] = set()
        while pending and len(seen) < 10_000:
            name = pending.pop()
            if name in seen or name in compared:
                continue
            seen.add(name)
            producer = self._a.get(name)
            if producer is None or id(producer) in found:
                continue
            pending.extend(i for i in producer.input if i)
            outputs = [o for o in producer.output if o]
            if producer.op_type == "Identity" or all(o in self._b_names and self.same(o) for o in outputs):
                continue  # a copy (looked through), or not compared for another reason (its type)
            found[id(producer)] = producer
        nearest = sorted(found.values(), key=lambda n: position[id(n)])[-limit:]
        return [{"node": n.name, "op": _op_name(n), "position": position[id(n)],
                 "how": "rewritten" if any(o in self._b_names for o in n.output if o) else "fused away or removed"}
                for n in nearest]  # fmt: skip


def _op_name(node: onnx.NodeProto) -> str:
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"


def comparable_values(original: onnx.ModelProto, optimized: onnx.ModelProto,
                      correspondence: Correspondence | None = None, *,
                      by_name: bool = False) -> tuple[list[str], dict[str, int]]:  # fmt: skip
    """Values of the original (node outputs and initializers, in topological order) that the
    optimised model has under the same name with the same element type and computes the same way
    (:class:`Correspondence`), and those types.

    ``by_name``: every value both models name with the same element type, whether or not the
    passes changed how it is computed (``--repro`` tests what a value stands for by running it)."""
    same = (lambda name: True) if by_name else (correspondence or Correspondence(original, optimized)).same
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
        if a.get(name) is not None and a.get(name) == b.get(name) and a[name] in _FETCHABLE and same(name):
            names.append(name)
    return names, a


def value_tolerances(
    original: onnx.ModelProto, names: list[str], rtol: float | None, atol: float | None,
    precision: str | None = None, precision_tolerance: tuple[float, float | None] | None = None,
) -> dict[str, tuple[float, float] | None]:
    """Each value's tolerance, from the lowest-precision float type it depends on (and
    ``precision``, the half type an optimised model computes in, for a float value, at
    ``precision_tolerance`` if given: see :func:`passes.verify.defaults.default_tolerance`)."""
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


def first_difference(original: onnx.ModelProto, values: Mapping[str, Mapping[str, Any]],
                     correspondence: Correspondence | None = None) -> FirstDifference:  # fmt: skip
    """The first node of ``original`` (in its node order, which is topological) whose output differs;
    with ``correspondence``, the nodes before it that the passes rewrote or fused away."""
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
            rewritten = correspondence.rewritten_before(node, values) if correspondence is not None else []
            return FirstDifference(
                node=node.name, op=_op_name(node), position=position, output=output,
                max_abs_error=float(found["max_abs_error"]), inputs=described, compared=len(values),
                rewritten=rewritten,
            )  # fmt: skip
    outputs = onnx.helper.make_node("Outputs", [o.name for o in original.graph.output], [])
    return FirstDifference(
        compared=len(values),
        message=f"none of the {len(values)} values both models compute the same way differs beyond tolerance; "
        "the difference arises in values the passes rewrote",
        rewritten=correspondence.rewritten_before(outputs, values) if correspondence is not None else [],
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
