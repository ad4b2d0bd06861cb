"""The sizes the check generates inputs at, from the roles :mod:`passes.verify.feeds` reads.

* :func:`size_tries`: up to :data:`~passes.verify.defaults.MAX_TRIES` sets of
  sizes, small first: the check runs the original on each until one runs.
  A named dimension has one size everywhere it appears; a name that is an
  expression of others (``past_sequence_length + 1``, dynamo's ``s0 + s1``)
  is computed from theirs. A key/value cache (``past``, ``cache``) is empty
  in the first tries, so that a mask of length ``past + sequence`` fits.
* :func:`larger_sizes`: the sizes of a set after the one that ran, at which each
  dynamic dimension the caller did not fix takes a larger size by its role
  (:data:`LARGER`; ``--precision``: a sequence-like one each of :data:`LONG_SEQUENCE`),
  or the next of the sizes ``--dim NAME=A,B,...`` lists for it.
* :func:`zero_sizes`: the sizes of one more set in which every dynamic
  dimension the caller did not fix is 0.
* :func:`dim_sizes`: the size each dynamic dimension has in a set, for the report.

The lowest-precision float type each value depends on, which chooses its
tolerance, is :mod:`passes.verify.lowest`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import onnx

from passes.modelio.declared import declared_dims
from passes.verify.dim_expressions import evaluate as _evaluate
from passes.verify.dim_expressions import expression as _expression
from passes.verify.feeds import InputSpec, input_specs, name_role
from passes.verify.defaults import MAX_GENERATED_BYTES, MAX_TRIES
from passes.verify.result import shown as _shown

__all__ = [
    "LARGER",
    "LADDERS",
    "LONG_SEQUENCE",
    "InputSpec",
    "declared_output_shapes",
    "dim_sizes",
    "input_bytes",
    "input_specs",
    "larger_sizes",
    "outputs_bytes",
    "pin_shapes",
    "size_tries",
    "sizes_checked",
    "zero_sizes",
]

_ITEMSIZE = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int8": 1, "int16": 2, "int32": 4,
             "int64": 8, "uint8": 1, "uint16": 2, "uint32": 4, "uint64": 8, "bool": 1, "str": 8,
             "float8_e4m3fn": 1, "float8_e4m3fnuz": 1, "float8_e5m2": 1, "float8_e5m2fnuz": 1}  # fmt: skip

#: Sizes tried for a dynamic dimension, per role: try k uses entry k.
LADDERS: dict[str, tuple[int, ...]] = {
    "batch": (1, 1, 1, 2),
    "past": (0, 0, 16, 32),  # an empty cache first: the first step of generation
    "sequence": (16, 32, 64, 128),
    "image": (32, 64, 128, 224),
    "other": (4, 16, 32, 64),
}

#: The larger size a dynamic dimension is also checked at, per role, after the size that ran
#: (a dimension that already ran at this size or more keeps its size).
LARGER: dict[str, int] = {"batch": 3, "past": 16, "sequence": 256, "image": 128, "other": 16}

#: ``--precision``: the long sizes a sequence-like dimension is proven at, shortest first: each after
#: the first only while the measured runs predict it within the check's budget (:mod:`passes.verify.sets`).
LONG_SEQUENCE: tuple[int, ...] = (1024, 2048, 4096)

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


def _count(shape: Sequence[int]) -> int:
    count = 1
    for d in shape:
        count *= int(d)
    return count


def _nbytes(dtype: str, shape: list[int]) -> int:
    return _count(shape) * _ITEMSIZE.get(dtype, 8)


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
                named = name_role(d)
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


def larger_sizes(
    specs: list[InputSpec],
    base: Mapping[str, Any],
    *,
    step: int = 1,
    dims: Mapping[str, int] | None = None,
    lists: Mapping[str, Sequence[int]] | None = None,
    given: Mapping[str, tuple[int, ...]] | None = None,
    sequence: int | None = None,
    modest: bool = False,
) -> dict[str, Any] | None:
    """The sizes of the ``step``-th set after ``base`` (the try that ran): a name ``lists`` gives
    (``--dim NAME=A,B,...``) takes its entry ``step`` (its last when shorter); one the caller fixed
    otherwise (``dims``, a given input's shape) keeps its size; every other dynamic dimension takes
    (at every step) :data:`LARGER` by its role (``sequence`` instead for a sequence-like one), or keeps its size
    from ``base`` where that is larger. None when no size changes.

    Returns:
        Like one try of :func:`size_tries`.
    """
    fixed, name_roles, named, expressions = _names(specs, dims, given)

    def larger(role: str, size: int) -> int:
        target = sequence if sequence is not None and role == "sequence" else LARGER.get(role, LARGER["other"])
        if modest:  # a model that does not run at the larger sizes (a table of 32 positions) may at these
            target = min(target, max(2 * size, 2))
        return max(size, target)

    sizes: dict[str, int] = {}
    for d in sorted(named - expressions.keys()):
        chosen = int(base["dims"].get(d, 0))
        if lists and d in lists and lists[d]:
            sizes[d] = int(lists[d][min(step, len(lists[d]) - 1)])
        elif d in fixed:
            sizes[d] = fixed[d]
        else:
            sizes[d] = larger(name_roles[d], chosen)
    for d, tree in expressions.items():
        value = _evaluate(tree, sizes)
        sizes[d] = value if value is not None and value >= 0 else int(base["dims"].get(d, 0))
    inputs: dict[str, dict[str, Any]] = {}
    for spec in specs:
        if (given and spec.name in given) or spec.name not in base["inputs"]:
            continue
        shape = []
        for d, role, was in zip(spec.dims, spec.roles, base["inputs"][spec.name]["shape"]):
            if isinstance(d, int):
                shape.append(d)
            elif isinstance(d, str):
                shape.append(sizes[d])
            else:
                shape.append(larger(role, int(was)))
        inputs[spec.name] = {**base["inputs"][spec.name], "shape": shape}
    if inputs == base["inputs"]:
        return None
    return {"dims": sizes, "inputs": inputs}


def input_bytes(entry: Mapping[str, Any]) -> int:
    """The bytes of the generated inputs of a try (or a set made like one)."""
    return sum(_nbytes(v["dtype"] or "", list(v["shape"])) for v in entry["inputs"].values())


def dim_sizes(specs: list[InputSpec], shapes: Mapping[str, Sequence[int]]) -> dict[str, int]:
    """The size of each dynamic dimension in inputs of these ``shapes``: a named one by its name,
    an unnamed one as ``input[axis]``."""
    found: dict[str, int] = {}
    for spec in specs:
        shape = shapes.get(spec.name)
        if shape is None or len(shape) != len(spec.dims):
            continue
        for axis, (d, role, size) in enumerate(zip(spec.dims, spec.roles, shape)):
            if role == "static" or isinstance(d, int):
                continue
            found.setdefault(d if isinstance(d, str) else f"{spec.name}[{axis}]", int(size))
    return found


def outputs_bytes(outputs: Mapping[str, Any]) -> int:
    """The bytes of the outputs the child described (``{"dtype", "shape"}``)."""
    total = 0
    for described in outputs.values():
        if described.get("kind") == "tensor":
            count = int(_count(described["shape"]))
            total += count * _ITEMSIZE.get(described["dtype"], 8)
    return total


def sizes_checked(specs: list[InputSpec], chosen: Mapping[str, Any],
                   records: list[dict[str, Any]]) -> dict[str, list[int]]:  # fmt: skip
    """Each dynamic dimension's sizes over the sets that ran: the chosen inputs' first."""
    found: dict[str, list[int]] = {}
    shapes = [chosen, *(r["shapes"] for r in records if r.get("ran") and r.get("shapes"))]
    for shape in shapes:
        for key, size in dim_sizes(specs, shape).items():
            if size not in found.setdefault(key, []):
                found[key].append(size)
    return found


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
