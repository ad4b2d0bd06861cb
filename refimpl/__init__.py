"""refimpl: a numpy reference implementation of ONNX operators.

``refimpl.run(op_type, inputs, attributes, opset=...)`` evaluates one operator.
Kernels live in family modules and are registered with the schema versions they implement:

  * ``elementwise``: unary math, activations, IsNaN/IsInf, Not;
  * ``arithmetic``: binary arithmetic, comparison and logic, Sum/Mean/Max/Min, Pow, Clip, Where;
  * ``cast``: Cast and CastLike;
  * ``reduction``: the Reduce* family;
  * ``shape``: ops that reshape, slice, pad or rearrange tensors;
  * ``generators``: Constant, ConstantOfShape, Range, EyeLike, OneHot;
  * ``indexing``: gathers, scatters, NonZero, ArgMax/ArgMin, TopK, CumSum;
  * ``misc``: MatMul, Gemm, Einsum, Softmax, Dropout, Compress.

``_registry`` holds the registry, ``_dtypes`` the schema dtypes and rounding helpers of the
numeric families, ``_common`` the argument helpers all families share.
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
from refimpl import (  # noqa: E402,F401  isort: skip
    arithmetic,
    cast,
    elementwise,
    generators,
    indexing,
    misc,
    reduction,
    shape,
)

__all__ = ["RefImplError", "UnsupportedOpError", "lookup", "register", "run", "supported"]
