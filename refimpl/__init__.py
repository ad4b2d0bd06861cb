"""refimpl: a numpy reference implementation of ONNX operators.

``refimpl.run(op_type, inputs, attributes, opset=...)`` evaluates one operator.
Kernels live in family modules and are registered with the schema versions they implement:

  * ``elementwise``: unary math, activations, IsNaN/IsInf, Not;
  * ``arithmetic``: binary arithmetic, comparison and logic, Sum/Mean/Max/Min, Pow, Clip, Where;
  * ``cast``: Cast and CastLike;
  * ``reduction``: the Reduce* family;
  * ``shape``: Identity, Shape, Size and the ops that reshape or rearrange tensors;
  * ``slicing``: Concat, Split, Slice, Pad, Trilu;
  * ``generators``: Constant, ConstantOfShape, Range, EyeLike, OneHot;
  * ``indexing``: gathers, scatters, Compress, NonZero, ArgMax/ArgMin, TopK, CumSum;
  * ``linalg``: MatMul, Gemm, Einsum;
  * ``nn``: Softmax, LogSoftmax, Dropout, LayerNormalization;
  * ``resize``: Resize with mode nearest.

``_registry`` holds the registry, ``_errors`` the exceptions, ``_dtypes`` the schema dtypes and
the conversion and rounding helpers, ``_common`` the argument helpers all families share;
``_reduction_guards`` the checks with which a float reduction declines where onnxruntime's
order decides its result, and ``_extremes`` ReduceMax/ReduceMin (``reduction``'s alone);
``_resize_coordinates`` Resize's coordinate formulas, exact and onnxruntime's (``resize``'s).
Families import those, never each other.

Errors: :class:`UnsupportedOpError` (no kernel), :class:`RefImplError` (invalid inputs or
attributes) and its subclass :class:`UndefinedResultError` (the spec leaves the result
undefined; its subclass :class:`RuntimeChoiceError`: defined up to the runtime's order or
choice of zero), and :class:`KernelBugError` (a bug in a kernel; not a RefImplError).
"""

from __future__ import annotations

from refimpl._errors import (
    KernelBugError,
    RefImplError,
    RuntimeChoiceError,
    UndefinedResultError,
    UnsupportedOpError,
)
from refimpl._registry import lookup, register, run, schema_dtypes, supported

# Importing the family modules registers their kernels.
from refimpl import (  # noqa: E402,F401  isort: skip
    arithmetic,
    cast,
    elementwise,
    generators,
    indexing,
    linalg,
    nn,
    reduction,
    resize,
    shape,
    slicing,
)

__all__ = [
    "KernelBugError",
    "RefImplError",
    "RuntimeChoiceError",
    "UndefinedResultError",
    "UnsupportedOpError",
    "lookup",
    "register",
    "run",
    "schema_dtypes",
    "supported",
]
