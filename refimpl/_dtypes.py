"""Schema dtypes and the conversion and rounding helpers the kernel families share.

``schema_dtypes`` lists the dtypes a schema version's type constraints allow; the registry hands
them to a :class:`~refimpl._registry.Typed` kernel factory once per schema version, so a kernel
rejects any other dtype instead of letting numpy promote it (``checked`` does that test).
``work_types`` precomputes, per allowed dtype, the dtype a kernel computes in, so a kernel checks
its input dtype and finds its work dtype with one dict lookup.

Work dtypes:
  * exact: operations that IEEE 754 rounds once run in the input type; bfloat16 and float8
    (ml_dtypes, kind "V") run in float32, which is exact for them (double rounding is
    innocuous when the wider format has at least 2p+2 bits).
  * wide: every float type runs in float64 and the result is rounded once to the input type.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import onnx.defs

from refimpl._common import SMALL, as_array
from refimpl._errors import RefImplError, UndefinedResultError

__all__ = [
    "BOOL",
    "DTypes",
    "F32",
    "F64",
    "FLOATS",
    "NARROW_INTS",
    "STRING",
    "accumulator_type",
    "as_bool",
    "as_dtype",
    "checked",
    "disallowed",
    "dtype_of_code",
    "dtypes_of",
    "exact_type",
    "float_to_int",
    "int_range",
    "overflow_limit",
    "quiet",
    "schema_dtypes",
    "to_float",
    "wide_type",
    "work_types",
]

DTypes = Mapping[str, frozenset]

F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
BOOL = np.dtype(np.bool_)
STRING = np.dtype(object)


def _onnx_type_table() -> dict[str, np.dtype]:
    """Maps schema type strings such as ``tensor(float)`` to numpy dtypes."""
    table: dict[str, np.dtype] = {}
    for name, code in onnx.TensorProto.DataType.items():
        if code == onnx.TensorProto.UNDEFINED:
            continue
        try:
            dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(code))
        except (KeyError, TypeError, ValueError):
            continue
        table[f"tensor({name.lower()})"] = dtype
    return table


_TYPE_TABLE = _onnx_type_table()
# Every float dtype refimpl may meet: numpy's and ml_dtypes' (kind "V").
FLOATS = frozenset(dt for name, dt in _TYPE_TABLE.items() if "float" in name or "double" in name)
_HALF_FLOATS = frozenset((F16, np.dtype(ml_dtypes.bfloat16)))
NARROW_INTS = frozenset(
    np.dtype(t) for t in (ml_dtypes.int4, ml_dtypes.uint4, ml_dtypes.int2, ml_dtypes.uint2)
)


def dtypes_of(schema: onnx.defs.OpSchema) -> dict[str, frozenset]:
    """The dtypes each type parameter (``T``, ``T1``...) of ``schema`` allows.

    Strings map to numpy ``object``; types numpy cannot hold (sequences, optionals) are dropped.
    """
    return {
        c.type_param_str: frozenset(_TYPE_TABLE[t] for t in c.allowed_type_strs if t in _TYPE_TABLE)
        for c in schema.type_constraints
    }


def schema_dtypes(op_type: str, version: int, domain: str = "") -> dict[str, frozenset]:
    """The dtypes each type parameter of the schema ``op_type``-``version`` allows.

    Raises:
        ValueError: ``version`` is not a schema version of ``op_type``.
    """
    try:
        schema = onnx.defs.get_schema(op_type, version, domain)
    except onnx.defs.SchemaError:
        schema = None
    if schema is None or schema.since_version != version:
        raise ValueError(f"{op_type} has no schema version {version}")
    return dtypes_of(schema)


@functools.lru_cache(maxsize=None)
def _dtype_of(code: int) -> np.dtype:
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(code))


def dtype_of_code(code: Any) -> np.dtype:
    """The numpy dtype of an ONNX ``TensorProto.DataType`` code (a ``to`` or ``dtype`` attribute).

    Raises:
        RefImplError: the code names no tensor type numpy can hold.
    """
    try:
        return _dtype_of(int(code))
    except (KeyError, TypeError, ValueError):
        raise RefImplError(f"{code!r} is not a tensor element type refimpl can hold") from None


def exact_type(dtype: np.dtype) -> np.dtype:
    """The dtype an exactly-rounded operation runs in: float32 for ml_dtypes floats."""
    return F32 if dtype.kind == "V" else dtype


def accumulator_type(dtype: np.dtype) -> np.dtype:
    """The dtype products and sums accumulate in: float32 for float16 and bfloat16."""
    return F32 if dtype in _HALF_FLOATS else dtype


def wide_type(dtype: np.dtype) -> np.dtype:
    """The dtype a transcendental function runs in: float64 for every float type."""
    return F64 if dtype in FLOATS else dtype


def work_types(allowed: frozenset, *, wide: bool = False) -> dict[np.dtype, np.dtype]:
    """Maps each allowed dtype to the dtype a kernel computes in (exact or wide)."""
    work = wide_type if wide else exact_type
    return {dtype: work(dtype) for dtype in allowed}


def disallowed(dtype: np.dtype, what: str = "input") -> RefImplError:
    """The error for a dtype the schema version does not allow."""
    return RefImplError(f"{what} dtype {dtype} is not allowed by the schema")


def checked(value: Any, allowed: frozenset, what: str = "input") -> np.ndarray:
    """``value`` as an array (see ``as_array``) whose dtype ``allowed`` holds.

    Raises:
        RefImplError: the dtype is not in ``allowed``.
    """
    x = as_array(value)
    if x.dtype not in allowed:
        raise disallowed(x.dtype, what)
    return x


@functools.lru_cache(maxsize=None)
def int_range(dtype: np.dtype) -> tuple[int, int]:
    """The smallest and largest value of an integer dtype (int4/int2 included)."""
    info = ml_dtypes.iinfo(dtype) if dtype in NARROW_INTS else np.iinfo(dtype)
    return int(info.min), int(info.max)


def as_bool(result: Any, dtype: np.dtype) -> np.ndarray:
    """The result of a test (comparison, IsNaN...) as a bool ndarray, whatever ``dtype`` was."""
    return np.asarray(result, dtype=bool)


def as_dtype(result: Any, dtype: np.dtype) -> np.ndarray:
    """``result`` as an ndarray of ``dtype`` (never a numpy scalar), floats rounded once."""
    out = result if type(result) is np.ndarray else np.asarray(result)
    if out.dtype == dtype:
        return out
    if dtype.kind == "V" and dtype in FLOATS:  # bfloat16, float8: round once via to_float
        return to_float(out, dtype)
    return out.astype(dtype)


def _round_to_odd_f32(x: np.ndarray) -> np.ndarray:
    """float64 -> float32 rounding to odd, so a second rounding to a narrower float is exact."""
    near = x.astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        overshoot = np.abs(near.astype(np.float64)) > np.abs(x)
        toward_zero = np.where(overshoot, np.nextafter(near, np.float32(0)), near)
        inexact = toward_zero.astype(np.float64) != x
    bits = toward_zero.view(np.uint32) | (inexact & np.isfinite(x)).astype(np.uint32)
    return bits.view(np.float32)


def to_float(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Rounds ``x`` to the float ``dtype`` once (round to nearest even), as ONNX Cast does.

    ml_dtypes converts float64 to bfloat16/float8 through float32 with two roundings; going
    through float32 rounded to odd keeps the result correctly rounded.
    """
    if dtype.kind == "V" and x.dtype not in (F32, F16) and x.dtype.kind != "V":
        x = _round_to_odd_f32(x.astype(np.float64))
    return x.astype(dtype)


@functools.lru_cache(maxsize=None)
def overflow_limit(dtype: np.dtype) -> float:
    """The smallest magnitude that rounds to infinity in the float ``dtype`` (inf for float64).

    That is the largest finite value plus half an ulp: the tie rounds to even, away from it.
    """
    if dtype == F64 or dtype not in FLOATS:
        return math.inf
    info = ml_dtypes.finfo(dtype)
    return float(info.max) + 2.0 ** (int(info.maxexp) - 2 - int(info.nmant))


@functools.lru_cache(maxsize=None)
def _truncation_bounds(dtype: np.dtype) -> tuple[float, float]:
    """Doubles ``(below, above)`` such that ``trunc(v)`` fits ``dtype`` iff ``below < v < above``.

    Exactly, ``low - 1 < v < high + 1``; rounding those bounds outward to doubles keeps the test
    exact for every double ``v`` (none lies between a bound and its rounding) and lets Python
    compare floats with floats, which is cheaper than floats with big ints.
    """
    low, high = int_range(dtype)
    below, above = float(low - 1), float(high + 1)
    if below > low - 1:
        below = math.nextafter(below, -math.inf)
    if above < high + 1:
        above = math.nextafter(above, math.inf)
    return below, above


def _truncates_into(x: np.ndarray, dtype: np.dtype) -> bool:
    """Whether every element of float ``x`` truncates to a value of the integer ``dtype``.

    NaN and infinities fail the test. The sum of the values is NaN when one is NaN (or when
    both infinities occur, which fail anyway), and then min/max need not see the NaN.
    """
    below, above = _truncation_bounds(dtype)
    if x.size > SMALL:
        return below < float(x.min()) and float(x.max()) < above  # NaN propagates into both
    values = x.ravel().tolist()
    if not values:
        return True
    total = sum(values)
    return total == total and below < min(values) and max(values) < above


def float_to_int(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Truncates floats toward zero, as Cast and Pow on integers do.

    Raises:
        UndefinedResultError: some value is NaN, infinite or truncates out of ``dtype``'s range.
    """
    if x.dtype.kind == "V":
        x = x.astype(F32)
    if not _truncates_into(x, dtype):
        raise UndefinedResultError(
            f"converting values in [{x.min()}, {x.max()}] to {dtype} is undefined "
            "(NaN, inf or out of range)"
        )
    if dtype.kind == "V":  # int4, int2...: numpy cannot convert floats to them directly
        return x.astype(np.int64).astype(dtype)
    return x.astype(dtype)  # C conversion: truncation toward zero


def quiet(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Runs ``fn`` with numpy floating-point warnings off (inf/NaN results are intended)."""

    @functools.wraps(fn)
    def wrapper(*args: Any) -> Any:
        with np.errstate(all="ignore"):
            return fn(*args)

    return wrapper
