"""What the check needs to know about the original graph, read from its ONNX protobuf.

* :func:`input_specs`: each graph input's type and, per dynamic dimension, its
  role (batch, sequence, image side or other, from its name or, unnamed, from
  its position and what the input feeds), and for integer inputs that index a
  table (``Gather`` of a constant with N rows along the axis) the range [0, N);
  whether the input is an index, a shape or a size (what it feeds, see
  :data:`INDEX_INPUTS`), which the edge-value sets leave as they are.
* :func:`size_tries`: up to :data:`~passes.verify.result.MAX_TRIES` sets of
  sizes, small first: the check runs the original on each until one runs.
  A named dimension has one size everywhere it appears; a name that is an
  expression of others (``past_sequence_length + 1``, dynamo's ``s0 + s1``)
  is computed from theirs. A key/value cache (``past``, ``cache``) is empty
  in the first tries, so that a mask of length ``past + sequence`` fits.
* :func:`zero_sizes`: the sizes of one more set in which every dynamic
  dimension the caller did not fix is 0.

The lowest-precision float type each value depends on, which chooses its
tolerance, is :mod:`passes.verify.lowest`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import onnx

from passes.modelio.declared import declared_dims
from passes.verify.dim_expressions import evaluate as _evaluate
from passes.verify.dim_expressions import expression as _expression
from passes.verify.result import MAX_GENERATED_BYTES, MAX_TRIES
from passes.verify.result import shown as _shown

__all__ = [
    "InputSpec",
    "declared_output_shapes",
    "input_specs",
    "size_tries",
    "zero_sizes",
]

#: numpy dtype names of the ONNX element types the check can generate or compare.
NUMPY_TYPES: dict[int, str] = {
    onnx.TensorProto.FLOAT: "float32",
    onnx.TensorProto.DOUBLE: "float64",
    onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.BFLOAT16: "bfloat16",
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

_ITEMSIZE = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int8": 1, "int16": 2, "int32": 4,
             "int64": 8, "uint8": 1, "uint16": 2, "uint32": 4, "uint64": 8, "bool": 1, "str": 8}  # fmt: skip

#: Sizes tried for a dynamic dimension, per role: try k uses entry k.
LADDERS: dict[str, tuple[int, ...]] = {
    "batch": (1, 1, 1, 2),
    "past": (0, 0, 16, 32),  # an empty cache first: the first step of generation
    "sequence": (16, 32, 64, 128),
    "image": (32, 64, 128, 224),
    "other": (4, 16, 32, 64),
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
            for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
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


def _name_role(name: str) -> str | None:
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
                named = _name_role(d) if d else None
                roles.append(named or _position_role(position, len(dims), spatial, is_int))
        spec = InputSpec(info.name, dtype, _type_text(type_proto), dims, roles)
        spec.index = _index_use(info.name, uses, inner, is_int)
        if is_int:
            bound = _index_bound(info.name, graph, uses, shapes)
            if bound is not None:
                spec.high, spec.high_reason = bound
        specs.append(spec)
    return specs


def pin_shapes(specs: list[InputSpec], shapes: Mapping[str, Sequence[int]]) -> dict[str, int]:
    """Gives the inputs in ``shapes`` those static shapes (``--input-shape``), in place; returns the
    sizes their named dims take, which the other inputs carrying those names follow."""
    fixed: dict[str, int] = {}
    for spec in specs:
        shape = shapes.get(spec.name)
        if shape is None:
            continue
        for d, size in zip(spec.dims, shape):
            if isinstance(d, str):
                fixed.setdefault(d, int(size))
        spec.dims = [int(size) for size in shape]
        spec.roles = ["static"] * len(shape)
    return fixed


def _nbytes(dtype: str, shape: list[int]) -> int:
    count = 1
    for d in shape:
        count *= d
    return count * _ITEMSIZE.get(dtype, 8)


def size_tries(
    specs: list[InputSpec],
    *,
    dims: Mapping[str, int] | None = None,
    given: Mapping[str, tuple[int, ...]] | None = None,
    tries: int = MAX_TRIES,
) -> tuple[list[dict[str, Any]], list[str]]:
    """The sets of sizes to try, smallest first, and why any were left out.

    Args:
        specs: From :func:`input_specs`.
        dims: Sizes of named dimensions the caller fixed (``--dim``).
        given: Shapes of the inputs the caller gave: they fix the names of their dims too.
        tries: At most this many sets.

    Returns:
        Each try: ``{"dims": {name: size}, "inputs": {input: {"dtype", "shape", "low", "high"}}}``
        for the inputs not given; and the reasons tries were dropped (too large).
    """
    fixed, name_roles, named, expressions = _names(specs, dims, given)
    result: list[dict[str, Any]] = []
    dropped: list[str] = []
    for k in range(tries):
        sizes: dict[str, int] = {}
        for d in sorted(named - expressions.keys()):  # the plain names first: expressions use them
            sizes[d] = fixed[d] if d in fixed else _rung(LADDERS[name_roles[d]], k)
        for d, tree in expressions.items():
            value = _evaluate(tree, sizes)
            sizes[d] = value if value is not None and value >= 0 else _rung(LADDERS[name_roles[d]], k)
        inputs: dict[str, dict[str, Any]] = {}
        total = 0
        for spec in specs:
            if given and spec.name in given:
                continue
            shape = []
            for d, role in zip(spec.dims, spec.roles):
                if isinstance(d, int):
                    shape.append(d)
                elif isinstance(d, str):
                    shape.append(sizes[d])
                else:
                    shape.append(_rung(LADDERS[role], k))
            total += _nbytes(spec.dtype or "", shape)
            inputs[spec.name] = {"dtype": spec.dtype, "shape": shape, "low": spec.low, "high": spec.high}
        entry = {"dims": sizes, "inputs": inputs}
        if total > MAX_GENERATED_BYTES:
            shapes = ", ".join(f"{_shown(n)}{v['shape']}" for n, v in inputs.items())
            dropped.append(f"generating inputs {shapes} would exceed {MAX_GENERATED_BYTES >> 20} MiB")
            continue
        if result and result[-1]["inputs"] == inputs:
            continue
        result.append(entry)
    return result, dropped


def _names(
    specs: list[InputSpec], dims: Mapping[str, int] | None, given: Mapping[str, tuple[int, ...]] | None
) -> tuple[dict[str, int], dict[str, str], set[str], dict[str, Any]]:
    """The dim names' fixed sizes (``--dim``, given inputs), roles, all names, and those that are
    expressions of others."""
    fixed: dict[str, int] = {}
    for spec in specs:
        shape = (given or {}).get(spec.name)
        if shape is None:
            continue
        for d, size in zip(spec.dims, shape):
            if isinstance(d, str):
                fixed.setdefault(d, int(size))
    fixed.update(dims or {})
    # One role per dimension name: where the name says one, else its first position's.
    name_roles: dict[str, str] = {}
    for spec in specs:
        for d, role in zip(spec.dims, spec.roles):
            if isinstance(d, str):
                named = _name_role(d)
                name_roles.setdefault(d, named or role)
    named = {d for spec in specs for d in spec.dims if isinstance(d, str)}
    expressions = {d: tree for d in named if d not in fixed and (tree := _expression(d, named)) is not None}
    return fixed, name_roles, named, expressions


def zero_sizes(
    specs: list[InputSpec],
    *,
    dims: Mapping[str, int] | None = None,
    given: Mapping[str, tuple[int, ...]] | None = None,
    base: Mapping[str, Any] | None = None,
) -> dict[str, Any] | None:
    """One more set of sizes: every dynamic dimension 0 unless the caller fixed it (``--dim``, a
    given input's shape); with ``base`` (a try that ran), only the first such dimension 0 and
    the others as in ``base``. None when no generated input would have a 0-sized dimension.

    Returns:
        Like one try of :func:`size_tries`.
    """
    fixed, _, named, expressions = _names(specs, dims, given)
    first: Any = None  # a dim name, or (input, position) of an unnamed dim
    if base is not None:
        for spec in specs:
            if given and spec.name in given:
                continue
            for position, d in enumerate(spec.dims):
                if d is None or (isinstance(d, str) and d not in fixed and d not in expressions):
                    first = d if d is not None else (spec.name, position)
                    break
            if first is not None:
                break
        if first is None:
            return None

    def plain(d: str) -> int:
        if d in fixed:
            return fixed[d]
        return 0 if base is None or d == first else int(base["dims"].get(d, 0))

    sizes = {d: plain(d) for d in sorted(named - expressions.keys())}
    for d, tree in expressions.items():
        value = _evaluate(tree, sizes)
        sizes[d] = value if value is not None and value >= 0 else 0
    inputs: dict[str, dict[str, Any]] = {}
    zeroed = False
    for spec in specs:
        if given and spec.name in given:
            continue
        shape = []
        for position, d in enumerate(spec.dims):
            if isinstance(d, int):
                shape.append(d)
            elif isinstance(d, str):
                shape.append(sizes[d])
            elif base is None or first == (spec.name, position):
                shape.append(0)
            else:
                shape.append(int(base["inputs"][spec.name]["shape"][position]))
        inputs[spec.name] = {"dtype": spec.dtype, "shape": shape, "low": spec.low, "high": spec.high}
        zeroed |= any(not isinstance(d, int) and size == 0 for d, size in zip(spec.dims, shape))
    if not zeroed:
        return None
    return {"dims": sizes, "inputs": inputs}


def _rung(ladder: tuple[int, ...], k: int) -> int:
    return ladder[min(k, len(ladder) - 1)]


def declared_output_shapes(model: onnx.ModelProto) -> dict[str, list[int | str | None]]:
    """Each graph output's declared shape (static dims as ints, names as strings, None unknown)."""
    shapes = {}
    for info in model.graph.output:
        dims = declared_dims(info.type)
        if dims is not None:
            shapes[info.name] = list(dims)
    return shapes
