"""The registry of the upgrade's adapters, which :mod:`~passes.upgrade.adapters` and
:mod:`~passes.upgrade.legacy` fill (in that order: :mod:`passes.upgrade` imports them),
and the helpers both use.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import onnx_ir as ir

from passes.ir import tensors
from passes.upgrade.draft import ConstInput, Draft, DraftInput
from passes.upgrade.plan import Adapter, PlanContext

__all__ = ["ADAPTERS", "REFUSED_CHANGES", "add", "constant_array", "register", "semantic_changes"]

#: Changes of meaning that the schemas do not show and that no adapter handles:
#: the upgrade refuses such a step with this description. (The changes that
#: adapters handle are described by the adapters, see SEMANTIC_CHANGES.)
REFUSED_CHANGES: Mapping[tuple[str, int], str] = {
    ("Scan", 9): "the batch axis and the sequence_lens input were removed",
}

ADAPTERS: dict[tuple[str, int], Adapter] = {}


def add(adapter: Adapter) -> None:
    key = (adapter.op_type, adapter.since)
    if key in ADAPTERS:
        raise ValueError(f"two adapters for {key[0]}-{key[1]}")
    ADAPTERS[key] = adapter


def register(op_types: str | Sequence[str], since: int, name: str, *, change: str | None = None):
    def decorate(plan: Callable[[Draft, PlanContext], str | None]):
        for op_type in (op_types,) if isinstance(op_types, str) else op_types:
            add(Adapter(op_type, since, name, plan, change))
        return plan

    return decorate


def constant_array(value: DraftInput) -> np.ndarray | None:
    """The value of an input known at conversion time, or None."""
    if isinstance(value, ConstInput):
        return None if value.ref is not None else value.array
    if value is None:
        return None
    if value.const_value is not None and not value.is_graph_input():
        return tensors.read_tensor(value.const_value, repr(value.name))  # checked reads: no SIGBUS
    producer = value.producer()
    if producer is not None and producer.op_type == "Constant" and producer.domain == "":
        attr = producer.attributes.get("value")
        if attr is not None and not attr.is_ref() and attr.type == ir.AttributeType.TENSOR:
            return tensors.read_tensor(attr.as_tensor(), repr(value.name))
    return None



def semantic_changes() -> Mapping[tuple[str, int], str]:
    """Every change of meaning that the schemas do not show (a new attribute whose default
    differs from the old behaviour, a reinterpreted attribute, a renamed enum value...), by
    step: those the registered adapters handle (their ``change``) and :data:`REFUSED_CHANGES`."""
    return types.MappingProxyType(
        {key: a.change for key, a in ADAPTERS.items() if a.change is not None} | dict(REFUSED_CHANGES)
    )
