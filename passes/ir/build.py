"""Building default-domain nodes with fresh names, in the form the scope's opset wants.

:class:`Builder` creates nodes named ``<prefix>/<tag>`` whose outputs have
fresh names, and collects them in order for the caller to insert. Ops that
take ``axes`` (Reduce*, Squeeze, Unsqueeze) get them as an attribute or as an
int64 input, whichever the op's schema at the scope's opset says
(:func:`passes.ir.schemas.input_since`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import onnx_ir as ir

from passes.ir.names import Names
from passes.ir.schemas import input_since, kept_input_count

__all__ = ["Builder", "attribute", "axes_are_input"]


def axes_are_input(op_type: str, opset: int) -> bool:
    """Whether ``op_type`` takes ``axes`` as an input (not an attribute) at ``opset``."""
    since = input_since(op_type, "axes")
    return since is not None and opset >= since


#: The attribute each exact Python type makes (``ir.convenience.convert_attribute``'s choice for it).
_ATTRIBUTES: dict[type, Any] = {int: ir.AttrInt64, float: ir.AttrFloat32, str: ir.AttrString, ir.Tensor: ir.AttrTensor}


def attribute(name: str, value: Any) -> ir.Attr:
    """``ir.convenience.convert_attribute(name, value)``, without its type inference (a chain of
    ``isinstance`` checks, runtime protocols among them) for an int, float, str, ``ir.Tensor``
    or a non-empty list of ints."""
    make = _ATTRIBUTES.get(type(value))
    if make is not None:
        return make(name, value)
    if type(value) is list and value and all(type(v) is int for v in value):
        return ir.AttrInt64s(name, value)
    return ir.convenience.convert_attribute(name, value)


@dataclasses.dataclass
class Builder:
    """Creates default-domain nodes named ``<prefix>/<tag>``, in order (see the module docstring).

    Attributes:
        prefix: Base of the node names (usually the name of the node being replaced).
        names: The model's name allocator.
        opset: The default-domain opset of the scope the nodes go into.
        nodes: The nodes created so far, in order.
    """

    prefix: str
    names: Names
    opset: int
    nodes: list[ir.Node] = dataclasses.field(default_factory=list)

    def op(self, op_type: str, inputs: list[ir.Value | None], dtype: ir.DataType | None, tag: str,
           **attributes: Any) -> ir.Value:  # fmt: skip
        """A node ``op_type(inputs, **attributes)`` with one output of element type ``dtype``."""
        name = self.names.node(f"{self.prefix}/{tag}")
        output = ir.val(self.names.value(f"{name}_output"), dtype)
        inputs = inputs[: kept_input_count(inputs, op_type, self.opset)]  # absent ones at the end, where optional
        attrs = [attribute(key, value) for key, value in attributes.items() if value is not None]
        self.nodes.append(ir.Node("", op_type, inputs, attrs, name=name, outputs=[output]))  # as ir.node makes it
        return output

    def constant(self, array: np.ndarray, tag: str) -> ir.Value:
        """A ``Constant`` node holding ``array``.

        ``ir.Tensor`` is what ``ir.tensor`` makes of an array, without its checks of the argument's
        kind (a runtime protocol check, ~40 us: a decomposed node makes several constants).
        """
        return self.op("Constant", [], ir.DataType.from_numpy(array.dtype), tag, value=ir.Tensor(array))

    def with_axes(
        self,
        op_type: str,
        data: ir.Value,
        axes: tuple[int, ...] | ir.Value | None,
        dtype: ir.DataType | None,
        tag: str,
        **attributes: int,
    ) -> ir.Value:
        """``op_type(data)`` with ``axes`` (ints, a value or None) in the op's form at this opset.

        Raises:
            ir.passes.PassError: ``axes`` is a value where the op takes an attribute.
        """
        if axes_are_input(op_type, self.opset):
            if isinstance(axes, tuple):
                axes = self.constant(np.array(axes, dtype=np.int64), f"{tag}_axes")
            return self.op(op_type, [data, axes], dtype, tag, **attributes)
        if isinstance(axes, ir.Value):
            raise ir.passes.PassError(f"{op_type} at opset {self.opset} cannot take axes {axes.name!r} as an input")
        with_attribute: dict[str, int | list[int]] = dict(attributes)
        if axes is not None:
            with_attribute["axes"] = list(axes)
        return self.op(op_type, [data], dtype, tag, **with_attribute)
