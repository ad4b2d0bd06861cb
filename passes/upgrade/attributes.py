"""Attributes that become inputs: the commonest breaking step, and the reading of attributes.

* :func:`attr_input`: the constant input (:class:`~passes.upgrade.draft.ConstInput`)
  that replaces an attribute: its value, or, for a reference to an attribute
  of the enclosing function, a ``Constant`` that references it.
* :func:`typed_scalar`: a FLOAT attribute as a scalar input of another input's type.
* :class:`AttributeToInput`: one row of the attribute -> input table of
  ``passes.upgrade.adapters`` and the one body that carries it out;
  :func:`as_adapters` turns the rows into adapters.
* :func:`int_attr`, :func:`string_attr`: an attribute's value or its default.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import onnx_ir as ir

from passes.upgrade.draft import ConstInput, Draft, DraftInput, dtype_of
from passes.upgrade.plan import Adapter, PlanContext

__all__ = ["AttributeToInput", "as_adapters", "attr_input", "int_attr", "string_attr", "typed_scalar"]


def int_attr(draft: Draft, name: str, default: int) -> int | None:
    """The attribute's int value, its default when absent, None when it is a reference."""
    attr = draft.attributes.get(name)
    if attr is None:
        return default
    return None if attr.is_ref() else attr.as_int()


def string_attr(draft: Draft, name: str, default: str) -> str | None:
    """The attribute's string value, its default when absent, None when it is a reference."""
    attr = draft.attributes.get(name)
    if attr is None:
        return default
    return None if attr.is_ref() else attr.as_string()


def _ref_reason(attr: ir.Attr, ctx: PlanContext) -> str | None:
    if ctx.function is None:
        return f"attribute '{attr.name}' references '{attr.ref_attr_name}' outside a function"
    if not ctx.ref_attr_is_set(attr.ref_attr_name):
        return (
            f"attribute '{attr.name}' references function attribute '{attr.ref_attr_name}', "
            "which has no default and is not set by every call site"
        )
    return None


_REF_KINDS = {
    ir.AttributeType.INTS: ("value_ints", np.zeros(0, np.int64)),
    ir.AttributeType.INT: ("value_int", np.zeros((), np.int64)),
    ir.AttributeType.FLOATS: ("value_floats", np.zeros(0, np.float32)),
    ir.AttributeType.FLOAT: ("value_float", np.zeros((), np.float32)),
}


def attr_input(attr: ir.Attr, ctx: PlanContext, base_name: str, *, scalar_to_1d: bool = False) -> ConstInput | str:
    """The constant input that replaces an attribute, or why there cannot be one.

    INTS become a 1-D int64 tensor, INT a scalar int64 (1-D of size 1 with
    ``scalar_to_1d``), FLOATS a 1-D float32 tensor and FLOAT a scalar float32,
    which is what ``Constant``'s ``value_*`` attributes produce for references.
    """
    if attr.is_ref():
        if reason := _ref_reason(attr, ctx):
            return reason
        kind, example = _REF_KINDS.get(attr.type, (None, None))
        if kind is None or (scalar_to_1d and attr.type == ir.AttributeType.INT):
            return (
                f"attribute '{attr.name}' is a reference of type {attr.type.name},"
                " which a Constant cannot turn into this input"
            )
        return ConstInput(example, base_name, ref=attr, ref_kind=kind)
    if attr.type in _INT_KINDS:
        return _int_input(attr.type, attr.value, base_name, scalar_to_1d)
    if attr.type == ir.AttributeType.FLOATS:
        array = np.asarray(attr.as_floats(), dtype=np.float32)
    elif attr.type == ir.AttributeType.FLOAT:
        array = np.asarray(attr.as_float(), dtype=np.float32)
    else:
        return f"attribute '{attr.name}' has unexpected type {attr.type.name}"
    return ConstInput(array, base_name)


_INT_KINDS = frozenset({ir.AttributeType.INTS, ir.AttributeType.INT})

#: The INT and INTS inputs :func:`_int_input` made, by value: a model's nodes share a few (50k
#: reduce nodes, a handful of axes lists), and a shared one is one array and one constant of the
#: rewrite. Short lists only; emptied when full.
_INT_INPUTS: dict[tuple[object, ...], ConstInput] = {}
_INT_INPUTS_UP_TO = 4096
_SHARED_LENGTH = 64


def _int_input(kind: ir.AttributeType, value: int | tuple[int, ...], base_name: str, scalar_to_1d: bool) -> ConstInput:
    """An INT or INTS attribute's value as an int64 input (see :func:`attr_input`): read only, and
    shared by the drafts of equal values."""
    key = (kind, value, base_name, scalar_to_1d)
    shared = kind == ir.AttributeType.INT or (type(value) is tuple and len(value) <= _SHARED_LENGTH)
    if shared and (const := _INT_INPUTS.get(key)) is not None:
        return const
    array = np.asarray([value] if kind == ir.AttributeType.INT and scalar_to_1d else value, dtype=np.int64)
    array.setflags(write=False)
    const = ConstInput(array, base_name)
    if shared:
        if len(_INT_INPUTS) >= _INT_INPUTS_UP_TO:
            _INT_INPUTS.clear()
        _INT_INPUTS[key] = const
    return const


def typed_scalar(attr: ir.Attr, ctx: PlanContext, like: DraftInput, base_name: str) -> ConstInput | str:
    """A FLOAT attribute as a scalar of the element type of ``like``.

    The float32 attribute value is converted to that type; when the type is not
    known statically (or the attribute is a function reference, which a
    ``Constant`` can only produce as float32), a ``CastLike`` does it at run time.
    """
    const = attr_input(attr, ctx, base_name)
    if isinstance(const, str):
        return const
    dtype = dtype_of(like)
    if dtype == ir.DataType.FLOAT:
        return const
    if const.ref is None and dtype is not None and dtype.is_floating_point():
        return dataclasses.replace(const, array=const.array.astype(dtype.numpy()))
    if not isinstance(like, ir.Value):
        return f"cannot tell the element type for attribute '{attr.name}'"
    if ctx.target < _CASTLIKE:
        return (f"cannot tell the element type for attribute '{attr.name}' without CastLike"
                f" (opset {_CASTLIKE}): choose --target-opset {_CASTLIKE} or higher")
    return dataclasses.replace(const, like=like)


#: The opset that has CastLike.
_CASTLIKE = 15


@dataclasses.dataclass(frozen=True)
class AttributeToInput:
    """At opset ``since``, attribute ``attribute`` of ``op_types`` became input ``index``.

    :meth:`move` does it on a draft: the attribute is removed and its value
    (:func:`attr_input`) becomes the input; an absent attribute stays absent.

    Attributes:
        op_types: The operators whose schemas changed so.
        since: The opset version of the change.
        attribute: The attribute's name.
        index: The position of the input that replaces it.
        keep_empty: False when an empty list means the same as no attribute
            (reduce over every axis, squeeze every size-1 axis, split evenly):
            it is then dropped instead of becoming an empty input.
        scalar_to_1d: An INT becomes a 1-D tensor of one value (TopK's ``k``),
            not a scalar.
        required: A node without the attribute is refused (the old schema
            requires it, so the node is invalid).
        old_default: When the attribute is absent, the input still gets this
            value, the old schema's default, because the new default differs.
        base_name: Base of the new constant's name; the attribute's name if empty.
        change: The change of meaning that the schemas do not show, if any.
    """

    op_types: tuple[str, ...]
    since: int
    attribute: str
    index: int
    keep_empty: bool = True
    scalar_to_1d: bool = False
    required: bool = False
    old_default: int | None = None
    base_name: str = ""
    change: str | None = None

    def move(self, draft: Draft, ctx: PlanContext) -> str | None:
        """Moves the attribute of ``draft`` to its input; returns why it cannot, or None."""
        attr = draft.attributes.pop(self.attribute, None)
        if attr is None:
            if self.required:
                return f"attribute '{self.attribute}' is missing"
            if self.old_default is None:
                return None
            attr = ir.AttrInt64(self.attribute, self.old_default)
        if not self.keep_empty and not attr.is_ref() and not attr.as_ints():
            return None
        const = attr_input(attr, ctx, self.base_name or self.attribute, scalar_to_1d=self.scalar_to_1d)
        if isinstance(const, str):
            return const
        draft.set_input(self.index, const)
        return None


def _moves(rows: Sequence[AttributeToInput]) -> Callable[[Draft, PlanContext], str | None]:
    def plan(draft: Draft, ctx: PlanContext) -> str | None:
        for row in rows:
            if reason := row.move(draft, ctx):
                return reason
        return None

    return plan


def as_adapters(rows: Iterable[AttributeToInput]) -> list[Adapter]:
    """One adapter per (op, version) of the rows, which moves that step's attributes in order.

    Its name, which the statistics show, lists them: ``axes attribute -> input``,
    ``starts/ends/axes attributes -> inputs``.
    """
    by_step: dict[tuple[str, int], list[AttributeToInput]] = {}
    for row in rows:
        for op_type in row.op_types:
            by_step.setdefault((op_type, row.since), []).append(row)
    adapters = []
    for (op_type, since), group in by_step.items():
        plural = "s" if len(group) > 1 else ""
        name = f"{'/'.join(row.attribute for row in group)} attribute{plural} -> input{plural}"
        change = "; ".join(row.change for row in group if row.change) or None
        adapters.append(Adapter(op_type, since, name, _moves(group), change))
    return adapters
