"""The first step of a run with static shapes: the model's inputs are declared with the sizes asked.

``--input-shape NAME:D0,...`` gives one graph input a static shape;
``--fix-dim NAME=SIZE`` replaces a symbolic dim by a size everywhere it appears
(inputs, outputs, value infos, subgraphs, functions). A dim name that an
``--input-shape`` replaced, and that no other input still carries, is replaced
everywhere too (it names the same size). Shapes the model states for
computed values that are still not static are dropped: they were written for
the dynamic model, and inference derives them again from the new inputs (the
fold/simplify loop then folds every ``Shape`` chain that became static, and
:mod:`passes.shapes.value_info` types every value at the end).

Rule: ``input: T[batch, 3, H, W]`` with ``--input-shape input:1,3,224,224`` ->
``input: T[1, 3, 224, 224]``. Nothing else in the graph changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import onnx_ir as ir

from passes import shapes
from passes.errors import InputError, cut
from passes.ir.inference import inference_error
from passes.ir.walk import iter_scopes
from passes.options import short

__all__ = ["DeclareShapesPass", "relax_static_inputs", "symbolic_dim_names"]


def _values(model: ir.Model) -> list[tuple[ir.Value, bool]]:
    """Every value of every scope, with whether a node computes it (and it is no graph output)."""
    found: dict[ir.Value, bool] = {}
    for scope in iter_scopes(model):
        body = scope.body
        outputs = set(body.outputs)
        for value in body.inputs:
            found.setdefault(value, False)
        for value in body.outputs:
            found[value] = False
        for node in body:
            for value in node.outputs:
                found.setdefault(value, value not in outputs)
    return list(found.items())


def symbolic_dim_names(model: ir.Model) -> list[str]:
    """Every symbolic dim name of the model, in order of appearance (inputs first)."""
    names: dict[str, None] = {}
    for value, _ in _values(model):
        for d in value.shape or ():
            if isinstance(d, ir.SymbolicDim) and isinstance(d.value, str) and d.value:
                names.setdefault(d.value)
    return list(names)


def relax_static_inputs(model: ir.Model) -> str:
    """Makes every static dim of the main graph's inputs symbolic (one new name per size, so that
    equal sizes stay equal); the shapes they declared (``'x' [batch, 3, 64, 64]``), "" if none.

    The declared shapes' counterfactual: the passes run on the result show whether those static
    dims are what makes a contradiction visible (see
    :func:`passes.pipeline_check.refuse_declared_shapes`). Inputs an initializer backs keep theirs.
    """
    graph = model.graph
    taken = set(symbolic_dim_names(model))
    names: dict[int, str] = {}
    relaxed = []
    for value in graph.inputs:
        if value.name in graph.initializers or value.shape is None:
            continue
        dims = list(value.shape)
        if not any(isinstance(d, int) and d >= 0 for d in dims):  # (a negative size is an unknown dim)
            continue
        shown = ", ".join(str(d) if isinstance(d, int) else (d.value if isinstance(d.value, str) and d.value else "?")
                          for d in dims)  # fmt: skip
        relaxed.append(f"{short(value.name)} [{shown}]")
        for d in dims:
            if isinstance(d, int) and d >= 0 and d not in names:
                name = f"declared_{d}"
                while name in taken:
                    name += "_"
                names[d] = name
                taken.add(name)
        value.shape = ir.Shape([names[d] if isinstance(d, int) and d >= 0 else d for d in dims])
    return ", ".join(relaxed)


class DeclareShapesPass(ir.passes.InPlacePass):
    """Declares graph inputs static (see the module docstring); refuses what the model cannot take."""

    def __init__(self, input_shapes: Mapping[str, tuple[int, ...]], fix_dims: Mapping[str, int]) -> None:
        super().__init__()
        self.input_shapes = dict(input_shapes)
        self.fix_dims = dict(fix_dims)
        self.stats: dict[str, Any] = {}

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        problem = shapes.refusal(model, self.input_shapes, self.fix_dims, symbolic_dim_names(model))
        if problem is not None:
            raise InputError(problem)
        already = None if inference_error(model) is None else True  # a model inference refuses as it is
        graph = model.graph
        replaced: dict[str, int] = dict(self.fix_dims)
        kept: set[str] = set()  # names other inputs still carry
        declared = 0
        for value in graph.inputs:
            if value.name in graph.initializers:
                continue
            shape = self.input_shapes.get(value.name)
            old = list(value.shape) if value.shape is not None else []
            if shape is None:
                kept.update(d.value for d in old if isinstance(d, ir.SymbolicDim) and d.value)
                continue
            for d, size in zip(old, shape):
                if isinstance(d, ir.SymbolicDim) and d.value:
                    replaced.setdefault(d.value, size)
            value.shape = ir.Shape(shape)
            declared += 1
        for name in kept - set(self.fix_dims):
            replaced.pop(name, None)
        fixed = dropped = 0
        for value, computed in _values(model):
            if value.shape is None:
                continue
            dims = [replaced.get(d.value, d) if isinstance(d, ir.SymbolicDim) and d.value else d
                    for d in value.shape]  # fmt: skip
            new = ir.Shape(dims)
            if computed and not all(isinstance(d, int) for d in dims):
                value.shape = None
                dropped += 1
            elif new != value.shape:
                value.shape = new
                fixed += 1
        if not already and (error := inference_error(model)) is not None:
            raise InputError(f"{shapes.requests_text(self.input_shapes, self.fix_dims)}: the model cannot run at "
                             f"these shapes ({cut(error)})")
        self.stats = {"inputs_declared": declared, "shapes_fixed": fixed, "shapes_dropped": dropped}
        return ir.passes.PassResult(model, modified=bool(declared or fixed or dropped))
