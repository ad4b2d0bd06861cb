"""What each graph input of the original feeds, read from its ONNX protobuf, for the check's plan.

:func:`input_specs` gives each graph input's type and, per dynamic dimension,
its role (batch, sequence, image side or other, from its name or, unnamed, from
its position and what the input feeds: :func:`name_role` reads a name), and for
integer inputs that index a table (``Gather`` of a constant with N rows along
the axis) the range [0, N); whether the input is an index, a shape or a size
(what it feeds, see :data:`INDEX_INPUTS`), which the edge-value sets leave as
they are. The sizes tried from these roles are :mod:`passes.verify.plan`'s.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from typing import Any

import onnx

from passes.modelio.declared import declared_dims
from passes.verify.result import shown as _shown

__all__ = ["INDEX_INPUTS", "NUMPY_TYPES", "InputSpec", "input_specs", "name_role"]

#: numpy dtype names of the ONNX element types the check can generate or compare.
NUMPY_TYPES: dict[int, str] = {
    onnx.TensorProto.FLOAT: "float32",
    onnx.TensorProto.DOUBLE: "float64",
    onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.BFLOAT16: "bfloat16",
    onnx.TensorProto.FLOAT8E4M3FN: "float8_e4m3fn",
    onnx.TensorProto.FLOAT8E4M3FNUZ: "float8_e4m3fnuz",
    onnx.TensorProto.FLOAT8E5M2: "float8_e5m2",
    onnx.TensorProto.FLOAT8E5M2FNUZ: "float8_e5m2fnuz",
    onnx.TensorProto.INT8: "int8",
    onnx.TensorProto.INT16: "int16",
    onnx.TensorProto.INT32: "int32",
    onnx.TensorProto.INT64: "int64",
    onnx.TensorProto.UINT8: "uint8",
    onnx.TensorProto.UINT16: "uint16",
    onnx.TensorProto.UINT32: "uint32",
    onnx.TensorProto.UINT64: "uint64",
    onnx.TensorProto.BOOL: "bool",
    onnx.TensorProto.STRING: "str",
}


_BATCH = re.compile(r"batch|^(n|b|bs|bsz|num_images)$")
_PAST = re.compile(r"past|cache")
_SEQUENCE = re.compile(
    r"seq|len|time|frame|token|step|word|sent|position|past|total|sample|audio|^(t|l|s|sl|tgt|src)$"
)
_IMAGE = re.compile(r"height|width|side|spatial|pixel|img|image|^(h|w|x|y|in_h|in_w|ih|iw)$")

#: Ops whose inputs 2.. (after batch and channels) are spatial.
_SPATIAL_OPS = frozenset({
    "Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "MaxPool", "AveragePool", "LpPool",
    "GlobalAveragePool", "GlobalMaxPool", "Resize", "Upsample", "InstanceNormalization",
    "SpaceToDepth", "DepthToSpace", "GridSample", "DeformConv", "Col2Im",
})  # fmt: skip

#: Ops through which an input's values reach a consumer unchanged (for index ranges and roles).
_PASS_THROUGH = frozenset({
    "Identity", "Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Expand", "Transpose", "Slice",
    "Concat", "Split", "Tile", "Clip", "Abs", "Relu", "Neg", "Pad", "BatchNormalization", "Mul", "Add",
    "Sub", "Div",
})  # fmt: skip

# Ops whose values pass unchanged (for index ranges: arithmetic changes them).
_VALUE_PRESERVING = frozenset({
    "Identity", "Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Expand", "Transpose", "Slice",
    "Concat", "Split", "Tile",
})  # fmt: skip


@dataclasses.dataclass
class InputSpec:
    """A graph input to generate.

    Attributes:
        name: The input's name.
        dtype: numpy dtype name (``"str"`` for strings), or None if it cannot be generated.
        type_text: The ONNX type, for messages.
        dims: Per dimension: its static size, its name, or None (dynamic, unnamed).
        roles: Per dimension: "static", "batch", "sequence", "image" or "other".
        low: Integers: the least value generated.
        high: Integers: one past the greatest value generated.
        high_reason: Why ``high`` is what it is ("" for the default).
        index: Why the input is an index, a shape or a size ("": a value): the edge sets keep its values.
    """

    name: str
    dtype: str | None
    type_text: str
    dims: list[int | str | None]
    roles: list[str]
    low: int = 0
    high: int = 4
    high_reason: str = ""
    index: str = ""


def _type_text(type_proto: onnx.TypeProto) -> str:
    kind = type_proto.WhichOneof("value")
    if kind == "tensor_type":
        return f"tensor({onnx.TensorProto.DataType.Name(type_proto.tensor_type.elem_type).lower()})"
    return kind or "undefined"


def _consumers(graph: onnx.GraphProto) -> dict[str, list[tuple[onnx.NodeProto, int]]]:
    uses: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name:
                uses.setdefault(name, []).append((node, i))
    return uses


def _reaches(start: str, uses: Mapping[str, list[tuple[onnx.NodeProto, int]]], through: frozenset[str],
             limit: int = 64) -> Iterable[tuple[onnx.NodeProto, int]]:  # fmt: skip
    """(node, input index) of every use reachable from ``start`` through ``through`` ops."""
    seen, todo, steps = {start}, [start], 0
    while todo and steps < limit:
        name = todo.pop()
        for node, index in uses.get(name, ()):
            steps += 1
            yield node, index
            if node.op_type in through and node.domain in ("", "ai.onnx"):
                for out in node.output:
                    if out and out not in seen:
                        seen.add(out)
                        todo.append(out)


#: Inputs (by position; None: all) of default-domain ops whose values are indices, shapes,
#: sizes, axes or counts: an input that reaches one keeps the values that ran in the edge sets.
INDEX_INPUTS: dict[str, frozenset[int] | None] = {
    "Gather": frozenset({1}), "GatherElements": frozenset({1}), "GatherND": frozenset({1}),
    "Scatter": frozenset({1}), "ScatterElements": frozenset({1}), "ScatterND": frozenset({1}),
    "Slice": frozenset({1, 2, 3, 4}), "Reshape": frozenset({1}), "Expand": frozenset({1}),
    "Tile": frozenset({1}), "ConstantOfShape": None, "Range": None, "OneHot": frozenset({0, 1}),
    "TopK": frozenset({1}), "Pad": frozenset({1, 3}), "Resize": frozenset({1, 2, 3}),
    "Upsample": frozenset({1}), "Split": frozenset({1}), "Squeeze": frozenset({1}),
    "Unsqueeze": frozenset({1}), "Trilu": frozenset({1}), "CumSum": frozenset({1}),
    "NonMaxSuppression": frozenset({2}), "Loop": frozenset({0}), "ReverseSequence": frozenset({1}),
    "RoiAlign": frozenset({2}), "Col2Im": frozenset({1, 2}), "CenterCropPad": frozenset({1, 2}),
    "DFT": frozenset({1, 2}), "STFT": frozenset({1, 3}), "MaxUnpool": frozenset({2}),
    "BlackmanWindow": None, "HannWindow": None, "HammingWindow": None, "MelWeightMatrix": None,
    "SequenceAt": frozenset({1}), "SequenceInsert": frozenset({2}), "SequenceErase": frozenset({1}),
    "SplitToSequence": frozenset({1}), "AffineGrid": frozenset({1}),
    "ReduceSum": frozenset({1}), "ReduceMean": frozenset({1}), "ReduceMax": frozenset({1}),
    "ReduceMin": frozenset({1}), "ReduceProd": frozenset({1}), "ReduceL1": frozenset({1}),
    "ReduceL2": frozenset({1}), "ReduceLogSum": frozenset({1}), "ReduceLogSumExp": frozenset({1}),
    "ReduceSumSquare": frozenset({1}),
}  # fmt: skip

#: Ops through which an input's values reach an index position (arithmetic on an index is an index).
_TO_INDEX = _PASS_THROUGH | {"Min", "Max", "Mod", "Floor", "Ceil", "Round", "Sign"}


def _subgraph_names(graph: onnx.GraphProto) -> set[str]:
    """Every name a subgraph of ``graph`` (at any depth) reads."""
    names: set[str] = set()
    for node in graph.node:
        for attr in node.attribute:
            kind = attr.type  # most attributes hold no graph: one look each (10k nodes: 21 -> 10 ms)
            if kind != onnx.AttributeProto.GRAPH and kind != onnx.AttributeProto.GRAPHS:
                continue
            for sub in [attr.g] if kind == onnx.AttributeProto.GRAPH else list(attr.graphs):
                names.update(n for inner in sub.node for n in inner.input if n)
                names |= _subgraph_names(sub)
    return names


#: Index inputs of ai.onnx.ml ops (its other inputs are features, keys or labels: values).
_ML_INDEX_INPUTS: dict[str, frozenset[int]] = {"ArrayFeatureExtractor": frozenset({1})}


def _index_use(name: str, uses: Mapping[str, list[tuple[onnx.NodeProto, int]]], inner: set[str],
               integer: bool) -> str:  # fmt: skip
    """Why ``name`` is an index, a shape or a size (``""``: a value). An integer input that reaches
    an op of another domain than ai.onnx and ai.onnx.ml is taken for one: its meaning is unknown."""
    if name in inner:
        return "read inside a subgraph"
    seen = {name}
    for node, index in _reaches(name, uses, _TO_INDEX):
        seen.update(node.output)
        label = node.name or (node.output[0] if node.output else "")
        if node.domain == "ai.onnx.ml":
            if index in _ML_INDEX_INPUTS.get(node.op_type, frozenset()):
                return f"input {index} of ai.onnx.ml::{node.op_type} {_shown(label)}"
            continue
        if node.domain not in ("", "ai.onnx"):
            if integer:
                return f"feeds {node.domain}::{node.op_type} {_shown(label)}"
            continue
        positions = INDEX_INPUTS.get(node.op_type, frozenset())
        if positions is None or index in positions:
            return f"input {index} of {node.op_type} {_shown(label)}"
    if seen & inner:
        return "read inside a subgraph"
    return ""


def _static_shapes(graph: onnx.GraphProto) -> dict[str, list[int | None]]:
    """Shapes of the constants and declared values of ``graph`` (static dims as ints)."""
    shapes: dict[str, list[int | None]] = {t.name: list(t.dims) for t in graph.initializer}
    for info in [*graph.input, *graph.value_info, *graph.output]:
        if info.name in shapes or not info.type.HasField("tensor_type"):
            continue
        dims = declared_dims(info.type)
        if dims is not None:
            shapes[info.name] = [d if isinstance(d, int) else None for d in dims]
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            for attr in node.attribute:
                if attr.name == "value" and attr.HasField("t"):
                    shapes[node.output[0]] = list(attr.t.dims)
    return shapes


def _attribute(node: onnx.NodeProto, name: str, default: Any) -> Any:
    for attr in node.attribute:
        if attr.name == name:
            return onnx.helper.get_attribute_value(attr)
    return default


def _index_bound(name: str, graph: onnx.GraphProto, uses: Mapping[str, list[tuple[onnx.NodeProto, int]]],
                 shapes: Mapping[str, list[int | None]]) -> tuple[int, str] | None:  # fmt: skip
    """The least table size among the Gathers whose indices ``name`` becomes, with the reason."""
    best: tuple[int, str] | None = None
    for node, index in _reaches(name, uses, _VALUE_PRESERVING):
        if node.domain not in ("", "ai.onnx") or index != 1 or node.op_type not in ("Gather", "GatherElements"):
            continue
        data = shapes.get(node.input[0])
        if not data:
            continue
        axis = int(_attribute(node, "axis", 0))
        axis = axis + len(data) if axis < 0 else axis
        if 0 <= axis < len(data) and isinstance(data[axis], int) and data[axis] > 0:
            size = int(data[axis])
            if best is None or size < best[0]:
                best = (size, f"{node.op_type} {_shown(node.name or node.output[0])} indexes {size} rows")
    return best


def _position_role(position: int, rank: int, spatial: bool, is_int: bool) -> str:
    if position == 0 and rank >= 2:
        return "batch"
    if spatial and rank >= 3:
        if position == 1:
            return "other"
        return "image" if rank >= 4 else "sequence"
    if position == 1 and (is_int or rank == 3):
        return "sequence"
    if position >= 2 and rank >= 4:
        return "image"
    return "other"


def name_role(name: str) -> str | None:
    """The role a dim's name says (``"batch"``, ``"past"``, ``"image"``, ``"sequence"``), or None."""
    lowered = name.lower()
    for role, pattern in (("batch", _BATCH), ("past", _PAST), ("image", _IMAGE), ("sequence", _SEQUENCE)):
        if pattern.search(lowered):
            return role
    return None


def input_specs(model: onnx.ModelProto) -> list[InputSpec]:
    """The graph inputs to feed (those that are not initializers), in order, with hints."""
    graph = model.graph
    initializers = {t.name for t in graph.initializer}
    uses = _consumers(graph)
    shapes = _static_shapes(graph)
    inner = _subgraph_names(graph)
    specs = []
    for info in graph.input:
        if info.name in initializers:
            continue
        type_proto = info.type
        if not type_proto.HasField("tensor_type"):
            specs.append(InputSpec(info.name, None, _type_text(type_proto), [], []))
            continue
        tensor = type_proto.tensor_type
        dtype = NUMPY_TYPES.get(tensor.elem_type)
        dims: list[int | str | None] = list(declared_dims(type_proto) or ())
        is_int = dtype is not None and dtype.startswith(("int", "uint"))
        spatial = any(node.op_type in _SPATIAL_OPS and index == 0
                      for node, index in _reaches(info.name, uses, _PASS_THROUGH))  # fmt: skip
        roles = []
        for position, d in enumerate(dims):
            if isinstance(d, int):
                roles.append("static")
            else:
                named = name_role(d) if d else None
                roles.append(named or _position_role(position, len(dims), spatial, is_int))
        spec = InputSpec(info.name, dtype, _type_text(type_proto), dims, roles)
        spec.index = _index_use(info.name, uses, inner, is_int)
        if is_int:
            bound = _index_bound(info.name, graph, uses, shapes)
            if bound is not None:
                spec.high, spec.high_reason = bound
        specs.append(spec)
    return specs
