"""refimpl: a numpy reference implementation of ONNX operators.

``refimpl.run(op_type, inputs, attributes, opset=...)`` evaluates one operator.
Kernels live in family modules (reduction, elementwise, shape, ...) and are
registered with the schema versions they implement.
"""

from __future__ import annotations

from refimpl._registry import (
    RefImplError,
    UnsupportedOpError,
    lookup,
    register,
    run,
    supported,
)

# Importing the family modules registers their kernels.
from refimpl import elementwise, indexing, misc, reduction, shape  # noqa: E402,F401  isort: skip

__all__ = ["RefImplError", "UnsupportedOpError", "lookup", "register", "run", "supported"]
