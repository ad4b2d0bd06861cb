"""Kernel registry: maps (domain, op_type, schema version) to a numpy kernel.

A kernel is a pure function ``(inputs, attributes) -> tuple of arrays``. It is
registered for a closed range of *schema* versions (the ``since_version`` of the
operator definitions it implements). When a node is evaluated at a model opset,
the registry asks ``onnx.defs`` which schema version applies at that opset and
only uses a kernel that declares that exact schema version. A newer schema that
changes the semantics therefore never falls back to an older kernel.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnx.defs

__all__ = [
    "NUM_OUTPUTS",
    "Kernel",
    "KernelEntry",
    "RefImplError",
    "UnsupportedOpError",
    "lookup",
    "register",
    "run",
    "supported",
]

#: Reserved attribute: the number of outputs of the node being evaluated (see ``run``).
NUM_OUTPUTS = "_num_outputs"

Kernel = Callable[[Sequence[Any], Mapping[str, Any]], Sequence[np.ndarray]]


class UnsupportedOpError(LookupError):
    """refimpl has no kernel for this (domain, op_type, opset)."""


class RefImplError(ValueError):
    """A kernel rejected its inputs or attributes; the message names the op."""


@dataclasses.dataclass(frozen=True)
class KernelEntry:
    """One registered kernel and the schema versions it implements (inclusive)."""

    domain: str
    op_type: str
    since: int
    until: int
    kernel: Kernel


_KERNELS: dict[tuple[str, str], list[KernelEntry]] = {}
# run()'s memo of lookup(): (op_type, opset, domain) -> (kernel, defaults, schema version).
# A plain dict and a tuple unpack cost less per call than the lru_cache and attribute reads.
_RUNNABLE: dict[tuple[str, int, str], tuple[Kernel, Mapping[str, Any], int]] = {}


def _normalize_domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


def register(
    op_type: str, since: int, until: int | None = None, *, domain: str = ""
) -> Callable[[Kernel], Kernel]:
    """Registers a kernel for the schema versions ``since..until`` (inclusive).

    ``until`` defaults to ``since``. Versions are ONNX *schema* versions
    (``OpSchema.since_version``), not model opsets: ``register("Abs", 6, 13)``
    covers Abs-6 and Abs-13, and therefore every model opset from 6 up to the
    opset before the next Abs schema.
    """
    domain = _normalize_domain(domain)
    last = since if until is None else until

    def decorator(kernel: Kernel) -> Kernel:
        entries = _KERNELS.setdefault((domain, op_type), [])
        for entry in entries:
            if entry.since <= last and since <= entry.until:
                raise ValueError(
                    f"{op_type}: kernel for versions {since}-{last} overlaps "
                    f"{entry.since}-{entry.until}"
                )
        entries.append(KernelEntry(domain, op_type, since, last, kernel))
        entries.sort(key=lambda e: e.since)
        lookup.cache_clear()
        _RUNNABLE.clear()
        return kernel

    return decorator


@dataclasses.dataclass(frozen=True)
class _Resolved:
    kernel: Kernel
    defaults: Mapping[str, Any]
    since_version: int


def _schema_defaults(schema: onnx.defs.OpSchema) -> dict[str, Any]:
    defaults: dict[str, Any] = {}
    for name, attr in schema.attributes.items():
        proto = attr.default_value
        if proto is None or proto.type == onnx.AttributeProto.UNDEFINED:
            continue
        value = onnx.helper.get_attribute_value(proto)
        if isinstance(value, bytes):
            value = value.decode("utf-8")
        elif isinstance(value, list):
            value = [v.decode("utf-8") if isinstance(v, bytes) else v for v in value]
        defaults[name] = value
    return defaults


@functools.lru_cache(maxsize=4096)
def lookup(op_type: str, opset: int, domain: str = "") -> _Resolved:
    """Finds the kernel that applies to ``op_type`` at model opset ``opset``.

    Raises:
        UnsupportedOpError: no schema exists at that opset, or no kernel
            implements the schema version that applies there.
    """
    domain = _normalize_domain(domain)
    entries = _KERNELS.get((domain, op_type))
    if not entries:
        raise UnsupportedOpError(f"{op_type} (domain {domain or 'ai.onnx'!r}) is not implemented")
    try:
        schema = onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        raise UnsupportedOpError(
            f"{op_type} has no schema at opset {opset} (domain {domain or 'ai.onnx'!r})"
        ) from None
    version = schema.since_version
    for entry in entries:
        if entry.since <= version <= entry.until:
            return _Resolved(entry.kernel, _schema_defaults(schema), version)
    raise UnsupportedOpError(
        f"{op_type}-{version} (opset {opset}) is not implemented; refimpl has "
        + ", ".join(f"{e.since}-{e.until}" for e in entries)
    )


def run(
    op_type: str,
    inputs: Sequence[Any],
    attributes: Mapping[str, Any] | None = None,
    *,
    opset: int,
    domain: str = "",
    num_outputs: int | None = None,
) -> list[np.ndarray]:
    """Evaluates one operator at a model opset.

    Args:
        op_type: The operator name, e.g. ``"ReduceL2"``.
        inputs: The input arrays in schema order; ``None`` for an omitted optional input.
        attributes: Attribute values by name (ints, floats, strings, lists, arrays).
            Omitted attributes take the schema's defaults.
        opset: The opset version imported for ``domain`` by the model or function.
        domain: The operator domain; ``""`` and ``"ai.onnx"`` are the default domain.
        num_outputs: The node's output count, for ops whose result depends on it
            (Split without sizes before opset 18); passed to the kernel as the
            reserved attribute :data:`NUM_OUTPUTS`.

    Returns:
        The outputs as numpy arrays, in schema order.

    Raises:
        UnsupportedOpError: no kernel implements the op at that opset.
        RefImplError: the inputs or attributes are invalid for the op.
    """
    key = (op_type, opset, domain)
    runnable = _RUNNABLE.get(key)
    if runnable is None:
        resolved = lookup(op_type, opset, domain)
        runnable = _RUNNABLE[key] = (resolved.kernel, resolved.defaults, resolved.since_version)
    kernel, defaults, version = runnable
    attrs = {**defaults, **attributes} if attributes else dict(defaults)
    if num_outputs is not None:
        attrs[NUM_OUTPUTS] = num_outputs
    try:
        # Kernels never mutate their inputs, so a list is passed on without a copy.
        outputs = kernel(inputs if type(inputs) is list else list(inputs), attrs)
    except (RefImplError, UnsupportedOpError):
        raise
    except (ValueError, TypeError, IndexError, KeyError, OverflowError, ZeroDivisionError) as e:
        raise RefImplError(f"{op_type}-{version}: {e}") from e
    return list(outputs)


def supported() -> list[tuple[str, str, int, int]]:
    """Lists ``(domain, op_type, first_version, last_version)`` for every kernel."""
    return sorted(
        (e.domain, e.op_type, e.since, e.until) for entries in _KERNELS.values() for e in entries
    )
