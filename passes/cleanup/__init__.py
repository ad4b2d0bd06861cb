"""Clean-up run after the graph passes: dead nodes, unused initializers, unused opsets."""

from __future__ import annotations

import logging

import onnx_ir as ir
import onnx_ir.passes.common as common_passes

from passes.ir.walk import DEFAULT_DOMAINS, iter_scopes, normalize_domain

__all__ = ["CleanupPass", "RemoveUnusedOpsetImportsPass"]

logger = logging.getLogger(__name__)


class RemoveUnusedOpsetImportsPass(ir.passes.InPlacePass):
    """Removes opset imports that no node uses, from the model and from each function.

    The default domain is always kept (under whichever spelling, ``""`` or
    ``"ai.onnx"``, the model uses), and so are the domains of model-local
    functions, which nodes of the main graph call. Unlike onnx_ir's
    ``RemoveUnusedOpsetsPass`` this treats ``"ai.onnx"`` as the default domain
    instead of deleting it.
    """

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        used: dict[int, set[str]] = {}
        owners: dict[int, ir.Model | ir.Function] = {id(model): model}
        for function in model.functions.values():
            owners[id(function)] = function
        for scope in iter_scopes(model):
            owner = scope.function if scope.function is not None else model
            domains = used.setdefault(id(owner), {""})
            for node in scope.body:
                domains.add(normalize_domain(node.domain))
        used.setdefault(id(model), {""}).update(f.domain for f in model.functions.values())
        modified = False
        for key, owner in owners.items():
            keep = used.get(key, {""})
            for domain in list(owner.opset_imports):
                if domain in DEFAULT_DOMAINS:
                    continue
                if domain not in keep:
                    del owner.opset_imports[domain]
                    logger.debug("removed unused opset import %s", domain)
                    modified = True
        return ir.passes.PassResult(model, modified=modified)


class CleanupPass(ir.passes.Sequential):
    """Dead-node and unused-initializer removal, then unused opset imports.

    Model-local functions are never removed, even when nothing calls them:
    users may call them from other models.
    """

    def __init__(self) -> None:
        super().__init__(common_passes.RemoveUnusedNodesPass(), RemoveUnusedOpsetImportsPass())
