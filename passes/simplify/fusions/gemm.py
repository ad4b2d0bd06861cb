"""``Add(MatMul(A, B), C)`` into ``Gemm(A, B, C)`` for proved matrices."""

from __future__ import annotations

import onnx_ir as ir

from passes.ir import schemas
from passes.ir.types import type_string
from passes.simplify.fusions.accept import Fusion
from passes.simplify.rules import Context, Outcome, rule, sole_user

__all__: list[str] = []


# --- MatMul and Add into Gemm -------------------------------------------------------------------------


@rule("Add", family="fuse")
def matmul_add_into_gemm(node: ir.Node, ctx: Context) -> Outcome:
    """``Add(MatMul(A, B), C)`` or ``Add(C, MatMul(A, B))`` -> ``Gemm(A, B, C)`` for proven matrices."""
    if len(node.inputs) != 2 or any(v is None for v in node.inputs):
        return "not two inputs"
    reason = "neither input is a MatMul"
    for index in (0, 1):
        matmul = ctx.producer(node.inputs[index], "MatMul")
        c = node.inputs[1 - index]
        if matmul is None or c is None:
            continue
        found = _matmul_add(node, ctx, matmul, c)
        if not isinstance(found, str):
            return found
        reason = found
    return reason


def _matmul_add(node: ir.Node, ctx: Context, matmul: ir.Node, c: ir.Value) -> Outcome:
    opset = ctx.opset
    if opset < 11:
        return f"opset {opset} is before 11 (Gemm-11: C optional, unidirectionally broadcast to [M, N])"
    if matmul.graph is not node.graph:
        return "the MatMul is in another graph"
    if not sole_user(matmul.outputs[0]):
        return "the MatMul's output has other users (or is a graph output)"
    if len(matmul.inputs) != 2 or any(v is None for v in matmul.inputs):
        return "the MatMul has not two inputs"
    a, b = matmul.inputs
    matrices = []
    for label, value in (("A", a), ("B", b)):
        dims = ctx.dims(value)
        if dims is None:
            return f"the rank of the MatMul's {label} is not known (Gemm takes matrices only)"
        if len(dims) != 2:
            return f"the MatMul's {label} has rank {len(dims)} (Gemm takes matrices only)"
        matrices.append(dims)
    result = (matrices[0][0], matrices[1][1])  # [M, N]; a dim may be a symbol or None
    c_dims = ctx.static_dims(c)
    if c_dims is None:
        return "C's shape is not known statically"
    if len(c_dims) > 2:
        return f"C has rank {len(c_dims)}: the Add broadcasts the MatMul's result"
    padded = (1,) * (2 - len(c_dims)) + c_dims
    if any(d != 1 and d != want for d, want in zip(padded, result)):
        shown = ["?" if d is None else d for d in result]
        return f"C of shape {list(c_dims)} is not proven to broadcast to the MatMul's {shown} (it may broadcast it)"
    dtypes = {ctx.dtype(v) for v in (a, b, c)}
    dtype = dtypes.pop() if len(dtypes) == 1 else None
    if dtype is None:
        return "the element types of A, B and C are not known (or differ)"
    schema = schemas.schema_at("Gemm", opset)
    allowed = {t for constraint in schema.type_constraints for t in constraint.allowed_type_strs} if schema else ()
    if type_string(dtype) not in allowed:
        return f"{dtype.name} is not a Gemm type at opset {opset}"
    if not dtype.is_floating_point():
        return f"{dtype.name}: onnxruntime has no integer Gemm kernel (it has integer MatMul and Add ones)"
    return Fusion(lambda: _write_gemm(node, ctx, matmul, c), matmul.outputs[0], dims=result)


def _write_gemm(node: ir.Node, ctx: Context, matmul: ir.Node, c: ir.Value) -> None:
    """A ``Gemm(A, B, c)`` before the Add, taking the Add's output's place and name."""
    old = node.outputs[0]
    names = ctx.names()
    gemm = ir.Node("", "Gemm", [*matmul.inputs, c], name=names.node(f"{matmul.name or 'MatMul'}_gemm"))
    new = gemm.outputs[0]
    new.type, new.shape = old.type, old.shape  # what the model declared of the Add's output, if anything
    assert node.graph is not None
    node.graph.insert_before(node, gemm)  # A and B come before the MatMul, C before the Add
    if old.is_graph_output():
        ctx.take_place(old, new)()
        return
    name = old.name or names.value("gemm")
    old.name = names.value(f"{name}_replaced")
    new.name = name  # its users read the name they read before
    old.replace_all_uses_with(new)
