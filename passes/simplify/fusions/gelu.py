"""The GELU activations exporters write as primitive ops, into ``Gelu`` (opset 20).

* ``x · 0.5 · (1 + Erf(x / √2))`` -> ``Gelu(x, approximate="none")``, the
  division written ``Div(x, √2)`` or ``Mul(x, 1/√2)``;
* ``0.5 · x · (1 + Tanh(√(2/π) · (x + 0.044715 · x³)))`` ->
  ``Gelu(x, approximate="tanh")``, the cube written ``Pow(x, 3)`` or ``x · x · x``.

The products may be associated in any order and their operands in any order
(the Mul nodes of a product are read as one product of its factors); one form
never becomes the other. Where it applies:

* every constant is the exact value at the type's rounding (``√2``, ``1/√2``,
  ``0.5``, ``1``, ``0.044715``, ``√(2/π)`` and ``3`` rounded to float16 or float):
  a ``Div`` by 1.5 before the Erf is not a Gelu;
* ``x`` is the same value everywhere, every intermediate value is used by the
  pattern alone, in the same graph, and is not a graph output;
* the model's opset is 20 or later (below it the pattern is counted as
  fusable at a higher opset), and onnxruntime's CPU provider runs Gelu at that
  opset, type and ``approximate`` (probed once a pattern is found); ``x`` is
  float or float16 (onnxruntime has no double ``approximate="none"`` kernel,
  and its double tanh one is ~6e-9 away from the primitive ops, beyond the
  check's float64 tolerance).

Elementwise, it also applies in function bodies (where ``x``'s type is read
from the constant 0.5: a Mul takes one type), where its constants are of rank 0:
a body has no shapes, and a ``[1, 1]`` constant on a rank-1 ``x`` would make the
pattern's output ``[1, 8]`` where Gelu's is ``[8]`` (:mod:`.accept` checks it for
every fusion).
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from passes.simplify.fusions._common import AtHigherOpset, inner, operands, ort_runs, replace_output
from passes.simplify.fusions.accept import Fusion
from passes.simplify.rules import Context, Outcome, rule, sole_user

__all__: list[str] = []


def _factors(ctx: Context, value: ir.Value, graph: ir.Graph | ir.Function | None, root: bool,
             limit: int = 4) -> list[ir.Value]:  # fmt: skip
    """The factors of the product ``value`` is (through its Mul nodes used by the product alone), in
    order, else ``[value]``; at most ``limit + 1`` of them (a longer product is no pattern here, and
    a chain of thousands of Muls is not walked from each of them)."""
    factors: list[ir.Value] = []
    pending = [(value, root)]
    while pending and len(factors) + len(pending) <= limit + 1:
        current, top = pending.pop()
        node = ctx.producer(current, "Mul")
        if (node is None or node.graph is not graph or len(node.inputs) != 2 or any(v is None for v in node.inputs)
                or (not top and not sole_user(current))):  # fmt: skip
            factors.append(current)
            continue
        pending += [(node.inputs[1], False), (node.inputs[0], False)]  # type: ignore[list-item]
    return factors + [v for v, _ in pending][: max(0, limit + 1 - len(factors))]


def _is(ctx: Context, value: ir.Value | None, exact: float, dtype: ir.DataType) -> bool:
    """Whether ``value`` is a one-element constant equal to ``exact`` rounded to ``dtype``."""
    array = ctx.constant(value)
    if array is None or array.size != 1:
        return False
    rounded = np.asarray(exact, dtype=np.float64).astype(dtype.numpy())
    return bool(array.reshape(-1)[0] == rounded)


@rule("Mul", family="fuse")
def gelu(node: ir.Node, ctx: Context) -> Outcome:
    """``x · 0.5 · (1 + Erf(x/√2))`` or ``0.5 · x · (1 + Tanh(√(2/π)(x + 0.044715 x³)))`` -> ``Gelu(x)``."""
    factors = _factors(ctx, node.outputs[0], node.graph, root=True)
    if len(factors) != 3:
        return "not a product of three factors (x, 0.5 and 1 + Erf or Tanh)"
    reason = "no factor is 1 + Erf(...) or 1 + Tanh(...)"
    for index, value in enumerate(factors):
        plus = inner(ctx, value, "Add", node.graph)
        if plus is None:
            continue
        others = factors[:index] + factors[index + 1 :]
        for kind, approximate in (("Erf", "none"), ("Tanh", "tanh")):
            for function, one in operands(plus, ctx, kind):
                found = _gelu(node, ctx, others, function, one, approximate)
                if callable(found) or isinstance(found, AtHigherOpset):
                    return found
                reason = found
    return reason


def _gelu(node: ir.Node, ctx: Context, others: list[ir.Value], function: ir.Node, one: ir.Value,
          approximate: str) -> Outcome:  # fmt: skip
    """The Gelu of ``others = [x, 0.5]`` (either order) times ``one + function(...)``."""
    half = next((v for v in others if ctx.constant(v) is not None), None)
    x = next((v for v in others if v is not half), None)
    if half is None or x is None:
        return "the other factors are not x and a constant"
    dtype = ctx.dtype(x)
    if dtype is None:  # a function body has no types: the 0.5 has x's (the Mul's one type)
        dtype = ir.DataType.from_numpy(ctx.constant(half).dtype)  # type: ignore[union-attr]
    if dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16):
        # double: onnxruntime has no approximate="none" kernel, and its tanh one differs from the
        # primitive ops by ~6e-9 on x * 30 + 5, beyond the check's float64 tolerance
        return f"x is {dtype.name if dtype else 'of an unknown type'} (Gelu is fused for float and float16)"
    if not _is(ctx, half, 0.5, dtype):
        return "the constant factor is not 0.5"
    if not _is(ctx, one, 1.0, dtype):
        return f"the {function.op_type} is not added to 1"
    argument = function.inputs[0] if function.inputs else None
    found = _erf_argument(ctx, argument, x, dtype, node.graph) if approximate == "none" else (
        _tanh_argument(ctx, argument, x, dtype, node.graph))  # fmt: skip
    if found is not None:
        return found
    if ctx.opset < 20:
        return AtHigherOpset("Gelu", 20, ctx.opset)
    if not ort_runs("Gelu", ctx.opset, dtype, [(2, 4)], [("approximate", approximate)]):
        return f"onnxruntime's CPU provider has no Gelu-{ctx.opset} kernel for {dtype.name} (approximate={approximate})"

    def rewrite() -> None:
        fused = ir.Node("", "Gelu", [x], [ir.AttrString("approximate", approximate)],
                        name=ctx.names().node(f"{node.name or 'Mul'}_gelu"))  # fmt: skip
        replace_output(node, ctx, fused)

    return Fusion(rewrite, x)


def _erf_argument(ctx: Context, value: ir.Value | None, x: ir.Value, dtype: ir.DataType,
                  graph: ir.Graph | ir.Function | None) -> str | None:  # fmt: skip
    """None if ``value`` is ``x / √2`` or ``x · (1/√2)``, else why not."""
    division = inner(ctx, value, "Div", graph)
    if division is not None and len(division.inputs) == 2:
        if division.inputs[0] is not x:
            return "the Erf's argument is not x / √2"
        return None if _is(ctx, division.inputs[1], math.sqrt(2.0), dtype) else "the Erf's argument is not x / √2"
    product = inner(ctx, value, "Mul", graph)
    if product is not None and len(product.inputs) == 2 and x in product.inputs:
        other = product.inputs[1] if product.inputs[0] is x else product.inputs[0]
        if _is(ctx, other, 1.0 / math.sqrt(2.0), dtype):
            return None
    return "the Erf's argument is not x / √2 or x · (1/√2)"


def _tanh_argument(ctx: Context, value: ir.Value | None, x: ir.Value, dtype: ir.DataType,
                   graph: ir.Graph | ir.Function | None) -> str | None:  # fmt: skip
    """None if ``value`` is ``√(2/π) · (x + 0.044715 · x³)``, else why not."""
    if value is None:
        return "the Tanh has no input"
    outer = _factors(ctx, value, graph, root=False)
    if len(outer) != 2:
        return "the Tanh's argument is not √(2/π) times a sum"
    scale = next((f for f in outer if _is(ctx, f, math.sqrt(2.0 / math.pi), dtype)), None)
    if scale is None:
        return "the Tanh's argument is not √(2/π) times a sum"
    total = inner(ctx, outer[1] if outer[0] is scale else outer[0], "Add", graph)
    if total is None or len(total.inputs) != 2 or x not in total.inputs:
        return "the Tanh's argument is not √(2/π) · (x + ...)"
    term = total.inputs[1] if total.inputs[0] is x else total.inputs[0]
    if term is None or not sole_user(term):
        return "the cubic term is used elsewhere"
    pieces = _factors(ctx, term, graph, root=False)
    coefficient = next((p for p in pieces if _is(ctx, p, 0.044715, dtype)), None)
    if coefficient is None:
        return "the cubic term's coefficient is not 0.044715"
    rest = [p for p in pieces if p is not coefficient]
    if len(rest) == 3 and all(p is x for p in rest):
        return None
    if len(rest) == 1:
        power = inner(ctx, rest[0], "Pow", graph)
        cube = power is not None and len(power.inputs) == 2 and power.inputs[0] is x
        if cube and _exactly(ctx, power.inputs[1], 3.0):  # type: ignore[union-attr]
            return None
    return "the cubic term is not 0.044715 · x³"


def _exactly(ctx: Context, value: ir.Value | None, number: float) -> bool:
    array = ctx.constant(value)
    return array is not None and array.size == 1 and float(array.reshape(-1)[0]) == number
