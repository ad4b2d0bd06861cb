"""Kernel registry: maps (domain, op_type, schema version) to a numpy kernel.

A kernel is a pure function ``(inputs, attributes) -> tuple of arrays``; one registered with
``needs_num_outputs=True`` takes the node's output count as a third argument. ``register``
gives it a range of *schema* versions (the ``since_version`` of the operator definitions it
implements), which ``onnx.defs`` resolves to the versions that exist: an open range
(``until=None``) reaches the newest schema onnx defines. A :class:`Typed` factory is called
once per schema version with the dtypes that version allows.

When a node is evaluated at a model opset, the registry asks ``onnx.defs`` which schema version
applies at that opset and only uses a kernel that declares that exact schema version. A newer
schema that changes the semantics therefore never falls back to an older kernel: its kernel
has to be registered with a range that ends before it (``until``). An open range is a claim
about the future too: the schema versions a newer onnx adds are served by it, so after an onnx
upgrade the conformance cases (which run at the newest opsets) check the claim.

``run`` calls the kernel and sorts what escapes it: :class:`RefImplError` propagates (with the op
recorded); a failure while the inputs or attributes break the schema's counts (too few or too
many inputs, a required one missing) becomes a RefImplError; anything else becomes
:class:`KernelBugError`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Union

import numpy as np
import onnx
import onnx.defs

from refimpl._dtypes import DTypes, dtypes_of, schema_dtypes
from refimpl._errors import KernelBugError, RefImplError, UnsupportedOpError

__all__ = [
    "CountedKernel",
    "Kernel",
    "KernelEntry",
    "Resolved",
    "Typed",
    "lookup",
    "register",
    "run",
    "schema_dtypes",
    "supported",
]

Kernel = Callable[[Sequence[Any], Mapping[str, Any]], Sequence[Any]]
CountedKernel = Callable[[Sequence[Any], Mapping[str, Any], Union[int, None]], Sequence[Any]]
"""A kernel registered with ``needs_num_outputs=True``: ``(inputs, attributes, num_outputs)``."""
AnyKernel = Union[Kernel, CountedKernel]


@dataclasses.dataclass(frozen=True)
class Typed:
    """A kernel factory: ``make(dtypes)`` builds the kernel of one schema version.

    ``dtypes`` maps each type parameter (``T``, ``T1``...) to the dtypes that version allows,
    so the kernel can reject the others (see ``refimpl._dtypes.checked``).
    """

    make: Callable[[DTypes], AnyKernel]


@dataclasses.dataclass(frozen=True)
class KernelEntry:
    """One registration: the schema versions it covers and the kernel of each."""

    domain: str
    op_type: str
    kernels: Mapping[int, AnyKernel]
    needs_num_outputs: bool

    @property
    def since(self) -> int:
        return min(self.kernels)

    @property
    def until(self) -> int:
        return max(self.kernels)


@dataclasses.dataclass(frozen=True)
class Resolved:
    """What ``lookup`` found: the kernel for one schema version and that schema's facts.

    Attributes:
        kernel: The kernel; it takes ``num_outputs`` too if ``needs_num_outputs``.
        defaults: The schema's attribute defaults.
        since_version: The schema version that applies at the looked-up opset.
        needs_num_outputs: The kernel's third argument is the node's output count.
        input_range: The fewest and most inputs the schema takes; the fewest are also the
            leading inputs that may not be omitted (None).
        required_attributes: The attributes without a default that must be given.
    """

    kernel: AnyKernel
    defaults: Mapping[str, Any]
    since_version: int
    needs_num_outputs: bool
    input_range: tuple[int, int]
    required_attributes: tuple[str, ...]


_KERNELS: dict[tuple[str, str], list[KernelEntry]] = {}
# run()'s memo of lookup(): (op_type, opset, domain) -> the fields of Resolved it reads.
# A plain dict and a tuple unpack cost less per call than the lru_cache and attribute reads.
_Runnable = tuple[AnyKernel, Mapping[str, Any], int, bool]
_RUNNABLE: dict[tuple[str, int, str], _Runnable] = {}
_VARIADIC = 2**31 - 1  # OpSchema.max_input of a variadic input


def _normalize_domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


def _schema_history(op_type: str, domain: str) -> dict[int, onnx.defs.OpSchema]:
    """Every schema ``onnx.defs`` holds for the op, by since_version (oldest first)."""
    try:
        schema = onnx.defs.get_schema(op_type, domain=domain)
    except onnx.defs.SchemaError:
        return {}
    history = [schema]
    while schema.since_version > 1:
        try:
            schema = onnx.defs.get_schema(op_type, schema.since_version - 1, domain)
        except onnx.defs.SchemaError:
            break
        history.append(schema)
    return {s.since_version: s for s in reversed(history)}


def _versions(op_type: str, domain: str, since: int, until: int | None) -> dict[int, Any]:
    """The schemas of the versions ``since..until`` (``until=None``: the newest there is)."""
    history = _schema_history(op_type, domain)
    for bound in (since, until):
        if bound is not None and bound not in history:
            raise ValueError(
                f"{op_type} (domain {domain or 'ai.onnx'!r}) has no schema version {bound}; "
                f"onnx defines {sorted(history)}"
            )
    last = max(history) if until is None else until
    return {v: s for v, s in history.items() if since <= v <= last}


def register(
    op_type: str,
    since: int,
    until: int | None = None,
    *,
    domain: str = "",
    needs_num_outputs: bool = False,
) -> Callable[[Any], Any]:
    """Registers a kernel (or a :class:`Typed` factory) for the schema versions ``since..until``.

    Versions are ONNX *schema* versions (``OpSchema.since_version``), not model opsets:
    ``register("Softmax", 11, 11)`` covers Softmax-11, hence the model opsets 11 and 12;
    ``register("Abs", 6)`` covers Abs-6, Abs-13 and every later Abs schema ``onnx.defs`` has.
    End a range with ``until`` before a schema version whose semantics the kernel does not
    implement.

    Args:
        op_type: The operator name.
        since: The first schema version the kernel implements.
        until: The last one (inclusive); None for every later version.
        domain: The operator domain; ``""`` and ``"ai.onnx"`` are the default domain.
        needs_num_outputs: The kernel is ``(inputs, attributes, num_outputs)``: it receives the
            node's output count that the caller gave ``run`` (None if it gave none).

    Returns:
        A decorator that registers its argument and returns it unchanged.

    Raises:
        ValueError: ``since`` or ``until`` is not a schema version of the op, or the range
            overlaps one already registered.
    """
    domain = _normalize_domain(domain)

    def decorator(kernel: Any) -> Any:
        schemas = _versions(op_type, domain, since, until)
        entries = _KERNELS.setdefault((domain, op_type), [])
        for entry in entries:
            if entry.kernels.keys() & schemas.keys():
                raise ValueError(
                    f"{op_type}: kernel for versions {sorted(schemas)} overlaps "
                    f"{sorted(entry.kernels)}"
                )
        if isinstance(kernel, Typed):
            kernels = {v: kernel.make(dtypes_of(s)) for v, s in schemas.items()}
        else:
            kernels = dict.fromkeys(schemas, kernel)
        entries.append(KernelEntry(domain, op_type, kernels, needs_num_outputs))
        entries.sort(key=lambda e: e.since)
        lookup.cache_clear()
        _RUNNABLE.clear()
        return kernel

    return decorator


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
def lookup(op_type: str, opset: int, domain: str = "") -> Resolved:
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
        kernel = entry.kernels.get(version)
        if kernel is not None:
            return Resolved(
                kernel,
                _schema_defaults(schema),
                version,
                entry.needs_num_outputs,
                (schema.min_input, schema.max_input),
                tuple(name for name, a in schema.attributes.items() if a.required),
            )
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
        num_outputs: The node's output count, for ops whose result depends on it (Split
            without sizes before opset 18); kernels that do not need it ignore it.

    Returns:
        The outputs as numpy arrays, in schema order.

    Raises:
        UnsupportedOpError: no kernel implements the op at that opset.
        RefImplError: the inputs or attributes are invalid for the op.
        UndefinedResultError: the spec leaves the result undefined (a RefImplError).
        KernelBugError: the kernel failed otherwise, a bug in refimpl (not a RefImplError).
    """
    key = (op_type, opset, domain)
    runnable = _RUNNABLE.get(key)
    if runnable is None:
        r = lookup(op_type, opset, domain)
        runnable = _RUNNABLE[key] = (r.kernel, r.defaults, r.since_version, r.needs_num_outputs)
    kernel, defaults, version, counted = runnable
    attrs = {**defaults, **attributes} if attributes else dict(defaults)
    # Kernels never mutate their inputs, so a list is passed on without a copy.
    args = inputs if type(inputs) is list else list(inputs)
    try:
        outputs = kernel(args, attrs, num_outputs) if counted else kernel(args, attrs)
    except RefImplError as e:
        e.locate(op_type, version)
        raise
    except (MemoryError, UnsupportedOpError):  # the latter: a kernel without this mode (Resize's linear)
        raise
    except Exception as e:
        # A kernel fails when it reads an input or attribute the caller left out: not a bug.
        error = _schema_error(args, attrs, lookup(op_type, opset, domain))
        if error is not None:
            error.locate(op_type, version)
            raise error from e
        raise KernelBugError(op_type, version, _normalize_domain(domain), e) from e
    return list(outputs)


def _schema_error(
    inputs: list[Any], attrs: Mapping[str, Any], resolved: Resolved
) -> RefImplError | None:
    """The error for inputs or attributes that break the schema, or None if they do not.

    ``run`` asks only after a kernel failed, which keeps the common call free of these checks
    (every kernel fails when it reads a missing input or attribute): the input count, the first
    ``low`` inputs being given (not None), the required attributes being there.
    """
    low, high = resolved.input_range
    if not low <= len(inputs) <= high:
        most = "any number" if high == _VARIADIC else f"at most {high}"
        return RefImplError(f"{len(inputs)} inputs; the schema takes at least {low}, {most}")
    if any(inputs[i] is None for i in range(low)):
        return RefImplError(f"a required input (one of the first {low}) is missing")
    missing = [name for name in resolved.required_attributes if attrs.get(name) is None]
    if missing:
        return RefImplError(f"required attribute(s) {missing} missing")
    return None


def supported() -> list[tuple[str, str, int, int]]:
    """Lists ``(domain, op_type, first_version, last_version)`` for every kernel."""
    return sorted(
        (e.domain, e.op_type, e.since, e.until) for entries in _KERNELS.values() for e in entries
    )
