"""Static shapes (``--input-shape NAME:D0,D1,...``, ``--fix-dim NAME=SIZE``): the requests, validated once.

The command parses the flags, ``passes.optimize(input_shapes=..., fix_dims=...)``
takes the same values; :class:`passes.pipeline.RunSpec` validates them here,
so that every route refuses the same request with the same one-line message:

* :func:`refuse_malformed` (no model needed): a size that is not a positive
  integer or that ONNX cannot hold (2**63 and above), an empty name, an empty shape;
* :func:`refusal` (against the loaded model): an input or dim name the model
  does not have, a ``--fix-dim`` of a dim no graph input carries, a rank that
  differs from the declared one, a size that contradicts a static declared dim
  (or another request);
* :func:`check_dims`: ``--dim`` against them (a fixed dim no longer needs
  ``--dim``; one of another size is refused).

The declaration itself (:mod:`passes.shapes.declare`) and the typed values of
the output (:mod:`passes.shapes.value_info`) import onnx_ir; this module
imports nothing heavy, so an early refusal costs only Python's start-up.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from passes.errors import InputError, cut
from passes.options import short

if TYPE_CHECKING:
    import onnx_ir as ir

__all__ = ["SOLE_INPUT", "check_dims", "input_shape_text", "name_sole_input", "normalize", "refusal",
           "refuse_malformed", "requests_text"]

#: The name of a shape given without one (onnxsim's ``--input-shape 1,3,224,224``): the model's only input.
SOLE_INPUT = ""


def input_shape_text(name: str, shape: Sequence[Any]) -> str:
    """``--input-shape 'x:1,3,224,224'`` as the user wrote it (for messages)."""
    return f"--input-shape {short(f'{name}:' + ','.join(str(d) for d in shape), 60)}"


def requests_text(input_shapes: Mapping[str, Sequence[int]], fix_dims: Mapping[str, int]) -> str:
    """Every request as flags, for a message: ``--input-shape x:1,3 --fix-dim seq=128``."""
    parts = [input_shape_text(n, s) for n, s in input_shapes.items()]
    parts += [f"--fix-dim {short(f'{n}={s}')}" for n, s in fix_dims.items()]
    return cut(" ".join(parts), 160)


def _size_text(size: Any) -> str:
    return str(size) if isinstance(size, int) and not isinstance(size, bool) else short(str(size))


#: The largest dim an ONNX shape holds (``dim_value`` is an int64).
MAX_SIZE = 2**63 - 1


def _size_problem(value: Any) -> str | None:
    """Why ``value`` is not a size a static shape can declare, or None."""
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        return f"size {_size_text(value)} is not a positive integer"
    if value > MAX_SIZE:
        return f"size {_size_text(value)} is over the largest dim ONNX holds (2**63 - 1)"
    return None


def refuse_malformed(input_shapes: Mapping[str, Sequence[Any]], fix_dims: Mapping[str, Any]) -> None:
    """Raises :class:`InputError` for a request that no model could satisfy.

    Sizes must be positive integers (a static shape has no -1, 0 or ``?``) that ONNX holds (below 2**63).
    """
    for name, shape in input_shapes.items():
        shown = input_shape_text(str(name), shape if isinstance(shape, (list, tuple)) else [shape])
        if not isinstance(name, str) or not name:
            raise InputError(f"{shown}: the input name is empty")
        if not isinstance(shape, (list, tuple)) or not shape:
            raise InputError(f"{shown}: expected NAME:D0,D1,... with at least one size")
        for size in shape:
            if (problem := _size_problem(size)) is not None:
                raise InputError(f"{shown}: {problem}")
    for name, size in fix_dims.items():
        shown = f"--fix-dim {short(f'{name}={size}')}"
        if not isinstance(name, str) or not name:
            raise InputError(f"{shown}: the dim name is empty")
        if (problem := _size_problem(size)) is not None:
            raise InputError(f"{shown}: {problem}")


def normalize(input_shapes: Mapping[str, Sequence[Any]] | None,
              fix_dims: Mapping[str, Any] | None) -> tuple[dict[str, tuple[int, ...]], dict[str, int]]:  # fmt: skip
    """The requests, validated (:func:`refuse_malformed`), as plain dicts of ints."""
    shapes = dict(input_shapes or {})
    dims = dict(fix_dims or {})
    refuse_malformed(shapes, dims)
    return {k: tuple(int(d) for d in v) for k, v in shapes.items()}, {k: int(v) for k, v in dims.items()}


def name_sole_input(model: ir.Model, input_shapes: Mapping[str, Sequence[Any]]) -> dict[str, tuple[int, ...]]:
    """``input_shapes`` with the shape given without a name (:data:`SOLE_INPUT`) given the name of the
    model's only input, validated as :func:`normalize` does.

    Raises:
        InputError: the model has not exactly one input, or that input has another shape too.
    """
    named = {k: v for k, v in input_shapes.items() if k != SOLE_INPUT}
    if SOLE_INPUT not in input_shapes:
        return normalize(named, {})[0]
    shape = input_shapes[SOLE_INPUT]
    sizes = ",".join(_size_text(d) for d in shape) if isinstance(shape, (list, tuple)) else _size_text(shape)
    graph = model.graph
    inputs = [v.name for v in graph.inputs if v.name not in graph.initializers]
    if len(inputs) != 1:
        raise InputError(f"--input-shape {short(sizes, 60)}: a shape without a name is for a model with one "
                         f"input, and this one has {len(inputs)} ({_listed(inputs, 'inputs')}); give "
                         f"NAME:{short(sizes, 60)[1:-1]}")
    name = inputs[0]
    if name in named and list(named[name]) != list(shape):
        raise InputError(f"--input-shape {short(sizes, 60)} and {input_shape_text(name, named[name])}: "
                         f"{short(name)} given twice with different sizes")
    return normalize({**named, name: shape}, {})[0]


def _dim(d: Any) -> int | str | None:
    """A dim of an onnx_ir shape: its size, its name, or None (unknown: a negative size too)."""
    if isinstance(d, int):
        return d if d >= 0 else None
    value = getattr(d, "value", None)
    return value if isinstance(value, (int, str)) and value != "" else None


def _listed(names: Sequence[str], what: str) -> str:
    if not names:
        return f"it has no {what}"
    return f"its {what}: " + ", ".join(short(n) for n in names[:20]) + (", ..." if len(names) > 20 else "")


def _shape_text(dims: Sequence[int | str | None]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def refusal(model: ir.Model, input_shapes: Mapping[str, tuple[int, ...]], fix_dims: Mapping[str, int],
            dim_names: Sequence[str]) -> str | None:  # fmt: skip
    """Why ``model`` cannot take these static shapes, or None.

    A ``--fix-dim`` must name a dim a graph input carries: one that only outputs
    or computed values declare is what the graph computes (``o = Concat(x, x)``
    declared ``[M]`` is twice x's length whatever ``M`` is said to be).

    Args:
        model: The loaded model (not changed).
        input_shapes: Static shapes by graph input name.
        fix_dims: Sizes by symbolic dim name.
        dim_names: Every symbolic dim name of the model (inputs, outputs, value infos, subgraphs).
    """
    graph = model.graph
    inputs = {v.name: v for v in graph.inputs if v.name not in graph.initializers}
    carried = list(dict.fromkeys(d for v in inputs.values() for d in map(_dim, v.shape or ()) if isinstance(d, str)))
    bound: dict[str, tuple[int, str]] = {}  # dim name -> (size, the request that set it)
    for name, size in fix_dims.items():
        shown = f"--fix-dim {short(f'{name}={size}')}"
        if name not in dim_names:
            return f"{shown}: the model has no dim named {short(name)} ({_listed(list(dim_names), 'dim names')})"
        if name not in carried:  # an output's or a computed value's: the graph decides its size, not a request
            named = _listed(carried, "inputs' dim names") if carried else "no input has a named dim"
            return (f"{shown}: no graph input carries {short(name)}, only values the graph computes: their size "
                    f"is what the graph makes of its inputs ({named})")
        bound[name] = (size, shown)
    for name, shape in input_shapes.items():
        shown = input_shape_text(name, shape)
        value = inputs.get(name)
        if value is None:
            return f"{shown}: the model has no input named {short(name)} ({_listed(list(inputs), 'inputs')})"
        if value.shape is None:
            continue  # no declared rank: any shape is a declaration
        declared = [_dim(d) for d in value.shape]
        if len(declared) != len(shape):
            return f"{shown}: {short(name)} has rank {len(declared)} {_shape_text(declared)}, not {len(shape)}"
        for axis, (d, size) in enumerate(zip(declared, shape)):
            if isinstance(d, int) and d != size:
                return f"{shown}: dim {axis} of {short(name)} is {d} {_shape_text(declared)}, not {size}"
            if isinstance(d, str):
                if d in bound and bound[d][0] != size:
                    return f"{shown}: dim {axis} of {short(name)} is {short(d)}, which {bound[d][1]} sets to {bound[d][0]}"
                bound.setdefault(d, (size, shown))
    return None


def check_dims(model: ir.Model, input_shapes: Mapping[str, tuple[int, ...]], fix_dims: Mapping[str, int],
               dims: Mapping[str, int | Sequence[int]]) -> dict[str, int | Sequence[int]]:  # fmt: skip
    """The sizes of named dims for the check's generated inputs: ``--dim`` and what the static shapes fix.

    A dim fixed by ``--fix-dim`` or by an input's ``--input-shape`` needs no ``--dim``; a ``--dim`` of
    the same size is accepted, one of another size is refused.

    Raises:
        InputError: a ``--dim`` that contradicts a static shape.
    """
    graph = model.graph
    fixed: dict[str, tuple[int, str]] = {n: (s, f"--fix-dim {short(f'{n}={s}')}") for n, s in fix_dims.items()}
    for value in graph.inputs:
        shape = input_shapes.get(value.name)
        if shape is None or value.shape is None or value.name in graph.initializers:
            continue
        for d, size in zip((_dim(d) for d in value.shape), shape):
            if isinstance(d, str):
                fixed.setdefault(d, (size, input_shape_text(value.name, shape)))
    for name, sizes in dims.items():
        other = [s for s in ([sizes] if isinstance(sizes, int) else sizes) if name in fixed and s != fixed[name][0]]
        if other:
            size = other[0]
            raise InputError(f"--dim {short(f'{name}={size}')} contradicts {fixed[name][1]} "
                             f"({short(name)} is {fixed[name][0]} there)")
    return {**{n: s for n, (s, _) in fixed.items()}, **dims}
