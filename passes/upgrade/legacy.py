"""Adapters of the steps out of opsets 1-6: legacy broadcasting, renamed and meaningless attributes.

Registered into :data:`passes.upgrade.registry.ADAPTERS` after the adapters of
:mod:`passes.upgrade.adapters` (:mod:`passes.upgrade` imports this one last), so the steps that only drop
``consumed_inputs`` are found among those no other adapter handles. onnxruntime
runs no opset-6 op, so ``tests/test_upgrade_legacy.py`` compares with numpy, with
the same node written at opset 7 and with the outputs onnx ships with its
PyTorch-exported backend cases.
"""

from __future__ import annotations

import numpy as np
import onnx.defs
import onnx_ir as ir

from passes.upgrade.attributes import AttributeToInput, int_attr
from passes.upgrade.draft import ConstInput, Draft, Edits
from passes.upgrade.plan import Adapter, PlanContext
from passes.upgrade.registry import ADAPTERS, add, constant_array, register

__all__: list[str] = []


# --- opset 7: numpy broadcasting replaces the legacy broadcast/axis attributes ----------------

#: Ops whose opset-1/6 schema broadcast B to A only with ``broadcast=1``, aligned at ``axis``.
_LEGACY_BROADCAST = ("Add", "Sub", "Mul", "Div", "Pow", "And", "Or", "Xor", "Equal", "Greater", "Less")


@register(_LEGACY_BROADCAST, 7, "legacy broadcast -> numpy broadcast",
           change="B is broadcast by numpy's rules instead of 'broadcast'/'axis'")
def _broadcast_7(draft: Draft, ctx: PlanContext) -> str | None:
    """Up to opset 6, ``broadcast=1`` broadcasts B to A's shape with B's dims at A's ``axis``.

    Without ``broadcast`` the shapes are equal, and B's dims aligned with A's last ones
    (no ``axis``, or ``axis = rank(A) - rank(B)``) are numpy's rule: the attributes just
    go. With any other ``axis``, B gains trailing 1s so that numpy aligns it there: a
    constant B is reshaped, any other B goes through ``Reshape(B, Concat(Shape(B), 1s))``.
    """
    broadcast = int_attr(draft, "broadcast", 0)
    axis = int_attr(draft, "axis", -1)
    if broadcast is None or axis is None:
        return "attribute 'broadcast' or 'axis' is a reference"
    draft.attributes.pop("broadcast", None)
    given_axis = draft.attributes.pop("axis", None) is not None
    if not broadcast or not given_axis:
        return None
    a, b = draft.input(0), draft.input(1)
    a_rank = ctx.rank_of(a) if isinstance(a, ir.Value) else None
    b_array = constant_array(b)
    b_rank = b_array.ndim if b_array is not None else ctx.rank_of(b) if isinstance(b, ir.Value) else None
    if a_rank is None or b_rank is None:
        return "broadcast at an axis needs the ranks of both inputs, which are unknown"
    axis = axis + a_rank if axis < 0 else axis
    trailing = a_rank - axis - b_rank
    if axis < 0 or trailing < 0:
        return f"axis {axis} does not fit a rank-{b_rank} B into a rank-{a_rank} A"
    _pad_rank(draft, b_array, trailing)
    return None


def _pad_rank(draft: Draft, array: np.ndarray | None, trailing: int) -> None:
    """Input 1 gains ``trailing`` dims of size 1, so that numpy's rule aligns it further left.

    A constant (``array``) is reshaped; any other value goes through
    ``Reshape(B, Concat(Shape(B), 1s))``, valid at every opset from 5.
    """
    if trailing == 0:
        return
    if array is not None:
        draft.set_input(1, ConstInput(array.reshape(array.shape + (1,) * trailing), f"{draft.op_type.lower()}_b"))
        return

    def reshape(node: ir.Node, rw: Edits) -> None:
        b = node.inputs[1]
        base = node.name or node.op_type
        shape = rw.add_node("Shape", [b], base_name=f"{base}_b_shape", before=node)
        ones = rw.const(np.ones(trailing, np.int64), "ones")
        target = rw.add_node("Concat", [shape.outputs[0], ones], [ir.AttrInt64("axis", 0)],
                             base_name=f"{base}_b_target", before=node)  # fmt: skip
        node.replace_input_with(1, rw.add_node("Reshape", [b, target.outputs[0]], base_name=f"{base}_b",
                                               before=node).outputs[0])  # fmt: skip

    draft.hooks.append(reshape)


@register("PRelu", 7, "per-channel slope -> numpy broadcast",
           change="a slope of C values applies along axis 1 up to opset 6, by numpy's rule from opset 7")
def _prelu_7(draft: Draft, ctx: PlanContext) -> str | None:
    """Up to opset 6 a slope of several values is per channel (axis 1); from 7 it broadcasts.

    A single value, or a slope of X's rank, means the same under both; a slope of C values
    gains trailing 1s (``[C, 1, 1]`` for NCHW). onnx's backend cases exported from PyTorch
    (``test_PReLU_2d_multiparam``) expect that reading.
    """
    x, slope = draft.input(0), draft.input(1)
    array = constant_array(slope)
    x_rank = ctx.rank_of(x) if isinstance(x, ir.Value) else None
    slope_rank = array.ndim if array is not None else ctx.rank_of(slope) if isinstance(slope, ir.Value) else None
    if array is not None and array.size == 1:
        return None
    if x_rank is None or slope_rank is None:
        return "the ranks of X and slope are unknown, so the slope's channel axis cannot be placed"
    if slope_rank == x_rank or (slope_rank == 1 and x_rank <= 2):
        return None
    if slope_rank != 1:
        return f"a rank-{slope_rank} slope for a rank-{x_rank} X has no documented legacy meaning"
    _pad_rank(draft, array, x_rank - 2)
    return None


@register("Gemm", 7, "drop broadcast")
def _gemm_7(draft: Draft, ctx: PlanContext) -> str | None:
    """Gemm-6 broadcast C to (M, N) only with ``broadcast=1``; otherwise C was (M, N) already.

    Gemm-7 always broadcasts C that way, so the attribute goes either way.
    """
    if int_attr(draft, "broadcast", 0) is None:
        return "attribute 'broadcast' is a reference"
    draft.attributes.pop("broadcast", None)
    return None


def _drop_is_test(draft: Draft, test_mode: bool, refusal: str) -> str | None:
    """Drops ``is_test`` when it says ``test_mode``; else the refusal, with ``{is_test}`` filled in."""
    is_test = int_attr(draft, "is_test", 0)
    if is_test is None:
        return "attribute 'is_test' is a reference"
    if bool(is_test) != test_mode:
        return refusal.format(is_test=is_test, mode="test" if is_test else "training")
    draft.attributes.pop("is_test", None)
    return None


@register("BatchNormalization", 7, "drop is_test")
def _batchnorm_7(draft: Draft, ctx: PlanContext) -> str | None:
    """Opset 6 set test mode with ``is_test=1``; opset 7 by having only the output Y."""
    return _drop_is_test(draft, draft.num_outputs == 1,
                         f"is_test={{is_test}} ({{mode}} mode) with {draft.num_outputs} outputs has no equivalent")


# --- opsets 2 and 7: renamed and implied attributes -------------------------------------------


@register("Pad", 2, "paddings -> pads")
def _pad_2(draft: Draft, ctx: PlanContext) -> str | None:
    """Pad-1's ``paddings`` is Pad-2's ``pads``: same layout (all begins, then all ends)."""
    paddings = draft.attributes.pop("paddings", None)
    if paddings is not None:
        if paddings.is_ref():
            return "attribute 'paddings' is a reference"
        draft.attributes["pads"] = ir.AttrInt64s("pads", list(paddings.as_ints()))
    return None


@register(("RNN", "GRU", "LSTM"), 7, "drop output_sequence")
def _recurrent_7(draft: Draft, ctx: PlanContext) -> str | None:
    """``output_sequence=0`` only made the Y output optional; from opset 7 every output is."""
    draft.attributes.pop("output_sequence", None)
    return None


@register("Dropout", 7, "drop is_test=1")
def _dropout_7(draft: Draft, ctx: PlanContext) -> str | None:
    """Dropout-6 with ``is_test=1`` copies its input, as Dropout-7 does at inference."""
    return _drop_is_test(draft, True, "is_test=0 (a random dropout) has no equivalent at inference")


# --- opsets 5 and 6: the in-place hint consumed_inputs goes ------------------------------------


def _drop_consumed_inputs(draft: Draft, ctx: PlanContext) -> str | None:
    """``consumed_inputs`` (opsets 1-5) told a runtime which inputs it may overwrite: no meaning."""
    draft.attributes.pop("consumed_inputs", None)
    return None


_RESHAPE_SHAPE = AttributeToInput(("Reshape",), 5, "shape", 1, required=True)


@register("Reshape", 5, "shape attribute -> input")
def _reshape_5(draft: Draft, ctx: PlanContext) -> str | None:
    _drop_consumed_inputs(draft, ctx)
    return _RESHAPE_SHAPE.move(draft, ctx)


def _steps_dropping(attribute: str) -> list[tuple[str, int]]:
    """The default-domain steps (op, since) whose schema no longer has ``attribute``."""
    history: dict[str, list[onnx.defs.OpSchema]] = {}
    for schema in onnx.defs.get_all_schemas_with_history():
        if schema.domain == "":
            history.setdefault(schema.name, []).append(schema)
    steps = []
    for op_type, versions in sorted(history.items()):
        versions.sort(key=lambda schema: schema.since_version)
        for old, new in zip(versions, versions[1:]):
            if attribute in old.attributes and attribute not in new.attributes:
                steps.append((op_type, new.since_version))
    return steps


# Registered last: a step with an adapter of its own (Reshape-5) drops the hint there.
for _op_type, _since in _steps_dropping("consumed_inputs"):
    if (_op_type, _since) not in ADAPTERS:
        add(Adapter(_op_type, _since, "drop consumed_inputs", _drop_consumed_inputs))
