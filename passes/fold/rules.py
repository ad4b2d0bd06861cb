"""Op-specific rewrite rules: ``{op_type: handler}`` for default-domain ops.

The sweep calls a node's handler before anything else; a handler returns True
when it dealt with the node (folded, rewrote or recorded it, or decided that
nothing applies), False to let the node go through the generic path (its
subgraphs are swept, or it is evaluated when its inputs are constant).

* ``Constant``: records the tensor it produces as a known constant.
* ``Shape`` / ``Size``: fold when the input's shape is static (from a constant,
  the model, or shape inference), including Shape-15's ``start``/``end``.
* ``Identity(c)``: redirects the uses to ``c`` when ``c`` stays in use anyway,
  so that tied weights are not duplicated, and when ``c`` is an initializer
  read from a subgraph or function (it would be copied inline); otherwise it
  folds like any op.
* ``If`` with a constant condition: the branch it takes is inlined and swept;
  a folded condition is confirmed by onnxruntime first (``confirm``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import numpy as np
import onnx_ir as ir

from passes.ir import inference
from passes.ir.tensors import constant_tensor, read_array

if TYPE_CHECKING:
    from passes.fold.sweep import Scope, Sweep

__all__ = ["RULES"]

logger = logging.getLogger(__name__)

Handler = Callable[["Sweep", ir.Node, "Scope"], bool]


def _constant(sweep: Sweep, node: ir.Node, scope: Scope) -> bool:
    tensor = constant_tensor(node, sweep.size_limit)
    if tensor is not None:
        sweep.known[node.outputs[0]] = tensor
    return True


def _shape_or_size(sweep: Sweep, node: ir.Node, scope: Scope) -> bool:
    x = node.inputs[0] if node.inputs else None
    if x is None or not scope.can_store:
        return True
    dims = sweep.static_dims(x)
    if dims is None:
        return True
    if node.op_type == "Size":
        result = np.array(math.prod(dims), dtype=np.int64)
    else:
        result = inference.shape_slice(
            dims, node.attributes.get_int("start", 0), node.attributes.get_int("end", None)
        )
    sweep.replace(node, [result], scope)
    return True


def _identity(sweep: Sweep, node: ir.Node, scope: Scope) -> bool:
    """``Identity(c) -> c`` when ``c`` stays in use: a copy would duplicate its bytes.

    (Tied weights in torch exports reach their users through such Identity
    nodes.) An Identity producing a graph output keeps its name by folding.
    Where results become Constant nodes (subgraphs, functions), an Identity
    of an initializer never copies it: its uses are redirected to the
    initializer (subgraphs may read outer values), and one that produces a
    graph output stays, so the weight stays an initializer and external.
    """
    x = node.inputs[0] if node.inputs else None
    tensor = None if x is None else sweep.constant(x)
    if x is None or tensor is None:
        return False
    y = node.outputs[0]
    if (reason := sweep.prepacked_amplified(node)) is not None:
        sweep.refuse(node, reason)
        return True
    keep_weight = not scope.initializers and x.is_initializer()
    if y.is_graph_output():
        if not keep_weight:
            return False
        sweep.known[y] = tensor
        sweep.refuse(node, f"initializer kept: {x.name!r} would be copied into a Constant node")
        return True
    if not keep_weight and not x.is_graph_output() and all(use.node is node for use in x.uses()):
        return False  # folding moves the bytes under y's name without growth
    sweep.rewriter.redirect({y: x})
    sweep.rewriter.drop(node)
    sweep.stats.applied[node.op_type] += 1
    logger.debug("Folded Identity node %r into its constant input %r", node.name, x.name)
    return True


def _if(sweep: Sweep, node: ir.Node, scope: Scope) -> bool:
    cond = node.inputs[0] if node.inputs else None
    if cond is not None:
        sweep.settle_value(cond)  # a folded condition is confirmed before a branch is dropped
    tensor = None if cond is None else sweep.constant(cond)
    if tensor is None or tensor.dtype != ir.DataType.BOOL or tensor.size != 1:
        return False
    taken = "then_branch" if bool(read_array(cond, tensor, node).reshape(-1)[0]) else "else_branch"
    attr = node.attributes.get(taken)
    if not isinstance(attr, ir.Attr) or attr.type != ir.AttributeType.GRAPH or attr.is_ref():
        return False
    branch = attr.as_graph()
    if len(branch.outputs) != len(node.outputs):
        return False
    inlined = sweep.rewriter.inline_branch(node, branch, use_initializers=scope.initializers)
    sweep.stats.if_inlined += 1
    logger.debug("Inlined %s of If %r (%d nodes)", taken, node.name, len(inlined))
    sweep.sweep(inlined, scope)
    return True


#: The rules by op type, for the default domain.
RULES: Mapping[str, Handler] = {
    "Constant": _constant,
    "Shape": _shape_or_size,
    "Size": _shape_or_size,
    "Identity": _identity,
    "If": _if,
}
