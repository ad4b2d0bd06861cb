"""Clean-up run after the graph passes: dead nodes, unused initializers, unused opsets, and (when it
is the last step) no type stated twice for an initializer."""

from __future__ import annotations

import logging

import onnx_ir as ir

from passes.ir.dead import remove_unused_nodes
from passes.ir.types import untype_initializers
from passes.ir.walk import DEFAULT_DOMAINS, iter_scopes, normalize_domain

__all__ = ["CleanupPass", "RemoveUnusedNodesPass", "RemoveUnusedOpsetImportsPass", "UntypeInitializersPass"]

logger = logging.getLogger(__name__)


class RemoveUnusedNodesPass(ir.passes.InPlacePass):
    """Removes dead nodes and unused initializers (:func:`passes.ir.dead.remove_unused_nodes`).

    A node keeps the absent inputs (``""``) its schema needs: ``Loop(M, "")``
    stays so; ``Clip(x, min, "")`` becomes ``Clip(x, min)``.
    """

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        return ir.passes.PassResult(model, modified=remove_unused_nodes(model))


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
        if all(domain in DEFAULT_DOMAINS for owner in owners.values() for domain in owner.opset_imports):
            return ir.passes.PassResult(model, modified=False)  # only the default domain: nothing to remove
        for scope in iter_scopes(model):
            owner = scope.function if scope.function is not None else model
            domains = used.setdefault(id(owner), {""})
            domains.update(normalize_domain(d) for d in {node.domain for node in scope.body})
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


class UntypeInitializersPass(ir.passes.InPlacePass):
    """Leaves the type of each constant initializer to its tensor (:func:`passes.ir.types.untype_initializers`).

    The model's values and types are the same before and after (the tensor
    carries them): only the written form loses a ``value_info`` per weight
    that onnx_ir's load added, so this reports ``modified`` False.
    """

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        untype_initializers(model)
        return ir.passes.PassResult(model, modified=False)


class CleanupPass(ir.passes.Sequential):
    """Dead-node and unused-initializer removal, then unused opset imports, then (``untype``)
    the initializers' types left to their tensors.

    Model-local functions are never removed, even when nothing calls them:
    users may call them from other models.

    Args:
        untype: Whether to leave the initializers' types to their tensors: the last step of a run
            does (the ``types`` step, when it follows, does it after its own inference).
    """

    def __init__(self, untype: bool = True) -> None:
        steps: list[ir.passes.PassBase] = [RemoveUnusedNodesPass(), RemoveUnusedOpsetImportsPass()]
        if untype:
            steps.append(UntypeInitializersPass())
        super().__init__(*steps)
