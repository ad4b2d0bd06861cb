"""Exact algebraic identities: ``x*1``, ``x/1``, ``x-(+0)``, ``x+(-0)``, ``And(x, true)``, ``Or(x, false)``.

In IEEE arithmetic ``x*1``, ``x/1``, ``x - (+0)`` and ``x + (-0)`` are ``x`` for
every x, -0, infinities and NaN included; ``x + (+0)`` is not (``-0 + 0 = +0``,
so ``1/x`` would flip from -inf to +inf) and neither is ``x - (-0)``. For
integers any zero is the identity of Add and Sub. The constant is compared
exactly (``1.000001`` is not 1, a ``1e-12`` is not 0), and the rewrite only
applies when the output has the input's shape and type (the constant does not
broadcast the input to a larger shape).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from passes.simplify.rules import Context, Outcome, rule

__all__: list[str] = []


def _is_identity(op_type: str, constant: np.ndarray, swapped: bool) -> bool:
    """Whether ``op(x, c)`` (``op(c, x)`` if ``swapped``) is ``x`` for every x, bit for bit."""
    if constant.size == 0:
        return False
    kind = constant.dtype.kind
    if op_type == "Mul":
        return bool(np.all(constant == 1))
    if op_type == "Div":
        return not swapped and bool(np.all(constant == 1))
    if op_type in ("And", "Or"):
        return kind == "b" and bool(np.all(constant == (op_type == "And")))
    if op_type not in ("Add", "Sub") or (op_type == "Sub" and swapped):
        return False
    if kind in "iu":
        return bool(np.all(constant == 0))
    if kind != "f" and constant.dtype.name not in ("bfloat16",):
        return False
    values = constant.astype(np.float32)
    negative = np.signbit(values)
    # x + (-0) == x; x - (+0) == x.
    wanted = negative if op_type == "Add" else ~negative
    return bool(np.all(values == 0) and np.all(wanted))


@rule("Mul", "Div", "Add", "Sub", "And", "Or", family="algebra", name="identity_element")
def identity_element(node: ir.Node, ctx: Context) -> Outcome:
    if len(node.inputs) != 2:
        return "not two inputs"
    for index in (1, 0):
        constant = ctx.constant(node.inputs[index])
        x = node.inputs[1 - index]
        if constant is None or x is None:
            continue
        if not _is_identity(node.op_type, constant, swapped=index == 0):
            continue
        dims_x, dims_y = ctx.dims(x), ctx.dims(node.outputs[0])
        if dims_x is None or dims_x != dims_y or None in dims_x:
            return "the output's shape is not proved equal to the input's"
        if ctx.dtype(x) != ctx.dtype(node.outputs[0]):
            return "the output's type differs"
        return ctx.bypass(node, x)
    return "no constant identity element"
