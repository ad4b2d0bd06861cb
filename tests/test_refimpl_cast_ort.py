"""Cast between strings and numbers, cross-checked with onnxruntime (graph optimisations off).

The spec fixes string -> number for decimal literals and the reserved ``INF``/``+INF``/``-INF``/
``NaN`` (case-insensitive) and calls every other text undefined; number -> string only asks for
"plain" notation. refimpl reads literals and prints numbers as onnxruntime does and refuses the
rest:

  * text onnxruntime refuses ("", "abc", "1e400", "1e-310") raises RefImplError;
  * text onnxruntime reads by a prefix or a C extension while the spec leaves it undefined
    ("1.5abc" -> 1.5, "0x10" -> 16, "Infinity", "1.5" -> int 1, "300" -> uint8 44) raises
    UndefinedResultError (a RefImplError).

String tensors reach refimpl as object arrays of ``bytes`` (``numpy_helper.to_array`` of a
constant) or ``str``; both are read as UTF-8. onnxruntime's Python API takes ``str`` only.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import onnx_ir as ir
import pytest
from helpers import ort_session
from onnx import TensorProto, helper, numpy_helper

import refimpl
from refimpl import RefImplError, UndefinedResultError

_FLOAT_TARGETS = [TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16]
_INT_TARGETS = [TensorProto.INT8, TensorProto.UINT8, TensorProto.INT32, TensorProto.INT64]

# Decimal literals and reserved words the spec defines, with white space around some.
_FLOAT_TEXTS = [
    "1.5",
    " 2",
    "2 ",
    "\t3\n",
    "-0",
    "+0",
    "0.0",
    "-0.0",
    "inf",
    "-inf",
    "INF",
    "+INF",
    "-INF",
    "+inf",
    "NaN",
    "nan",
    "1e-5",
    "1E8",
    ".5",
    "5.",
    "0001.25",
    "100.5",
    "3.4028235e38",
    "3.40282357e38",
    "1e39",
    "-1e39",
    "1e-46",
    "1e-39",
    "65504",
    "65520",
    "0e-400",
    "1.000488282181322574615478515625",  # float32 rounds first: float16 gives 1.0, not 1.001
    "1.7976931348623157e308",
]
_INT_TEXTS = ["12", " -3", "+5", "007", "-0", " 7 ", "127", "-128", "0"]


def _cast_session(src: int, to: int, constant: np.ndarray | None = None) -> Any:
    """A Cast node from a graph input of type ``src``, or from ``constant`` as an initializer."""
    inputs = [] if constant is not None else [helper.make_tensor_value_info("x", src, None)]
    inits = [] if constant is None else [numpy_helper.from_array(constant, "x")]
    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["y"], to=to)],
        "g",
        inputs,
        [helper.make_tensor_value_info("y", to, None)],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)
    return ort_session(model)


def _ort_from_strings(texts: list[str], to: int) -> np.ndarray:
    x = np.array(texts, dtype=object)
    return _cast_session(TensorProto.STRING, to).run(None, {"x": x})[0]


def _refimpl(x: np.ndarray, to: int) -> np.ndarray:
    (out,) = refimpl.run("Cast", [x], {"to": to}, opset=19)
    return out


def _assert_bits_equal(actual: np.ndarray, expected: np.ndarray) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    same = actual.view(f"u{actual.dtype.itemsize}") == expected.view(f"u{expected.dtype.itemsize}")
    both_nan = np.isnan(actual.astype(np.float64)) & np.isnan(expected.astype(np.float64))
    assert np.all(same | both_nan), (actual, expected)


@pytest.mark.parametrize("to", _FLOAT_TARGETS, ids=TensorProto.DataType.Name)
@pytest.mark.parametrize("kind", [str, bytes], ids=["str", "bytes"])
def test_string_to_float_matches_ort(to: int, kind: type) -> None:
    """Bit for bit, including the double rounding (text -> double -> float32 -> float16)."""
    expected = _ort_from_strings(_FLOAT_TEXTS, to)
    items = [t.encode() if kind is bytes else t for t in _FLOAT_TEXTS]
    _assert_bits_equal(_refimpl(np.array(items, dtype=object), to), expected)


def test_string_to_bfloat16_and_float8_round_through_float32() -> None:
    """onnxruntime rounds the double to float32 first (its output types cannot reach Python)."""
    texts = np.array(["1.0039062500000002", "1000", "1e39", "-2.5"], dtype=object)
    (bf16,) = refimpl.run("Cast", [texts], {"to": TensorProto.BFLOAT16}, opset=19)
    assert bf16.astype(np.float64).tolist() == [1.0, 1000.0, np.inf, -2.5]  # direct: 1.0078125
    (e4m3,) = refimpl.run("Cast", [texts], {"to": TensorProto.FLOAT8E4M3FN}, opset=19)
    assert e4m3.astype(np.float64).tolist() == [1.0, 448.0, 448.0, -2.5]  # saturate=1 (default)


@pytest.mark.parametrize("to", _INT_TARGETS, ids=TensorProto.DataType.Name)
@pytest.mark.parametrize("kind", [str, bytes], ids=["str", "bytes"])
def test_string_to_int_matches_ort(to: int, kind: type) -> None:
    texts = [t for t in _INT_TEXTS if to != TensorProto.UINT8 or "-" not in t.replace("-0", "")]
    expected = _ort_from_strings(texts, to)
    items = [t.encode() if kind is bytes else t for t in texts]
    actual = _refimpl(np.array(items, dtype=object), to)
    assert actual.dtype == expected.dtype
    np.testing.assert_array_equal(actual, expected)


@pytest.mark.parametrize(
    ("text", "to"),
    [
        ("", TensorProto.FLOAT),
        (" ", TensorProto.FLOAT),
        ("abc", TensorProto.FLOAT),
        ("true", TensorProto.FLOAT),
        ("\u0661\u0662", TensorProto.FLOAT),  # Arabic-Indic digits: Python's float() reads them
        ("1e400", TensorProto.FLOAT),
        ("-1.8e308", TensorProto.DOUBLE),
        ("1e-400", TensorProto.DOUBLE),  # underflow to zero
        ("1e-310", TensorProto.FLOAT),  # a double subnormal: stod reports ERANGE
        ("abc", TensorProto.INT64),
        ("", TensorProto.INT32),
        ("nan", TensorProto.INT32),
        ("9223372036854775808", TensorProto.INT64),
    ],
)
def test_string_refused_where_ort_errors(text: str, to: int) -> None:
    with pytest.raises(Exception):  # noqa: B017 - onnxruntime raises its own RuntimeException
        _ort_from_strings([text], to)
    with pytest.raises(RefImplError, match="^Cast"):
        _refimpl(np.array([text], dtype=object), to)


@pytest.mark.parametrize(
    ("text", "to", "ort_value"),
    [
        ("1.5abc", TensorProto.FLOAT, 1.5),  # std::stod stops at the first bad character
        ("1,5", TensorProto.FLOAT, 1.0),
        ("1_000", TensorProto.FLOAT, 1.0),  # Python's float() would read 1000
        ("0x10", TensorProto.FLOAT, 16.0),  # C hex floats are not in the spec
        ("Infinity", TensorProto.FLOAT, np.inf),
        ("-nan", TensorProto.FLOAT, np.nan),
        ("1.5", TensorProto.INT32, 1),  # "undefined" by the spec's own example
        ("1e3", TensorProto.INT64, 1),
        ("300", TensorProto.UINT8, 44),  # wraps around
        ("-1", TensorProto.UINT8, 255),
        ("2147483648", TensorProto.INT32, -(2**31)),
    ],
)
def test_string_undefined_by_the_spec_is_refused(text: str, to: int, ort_value: Any) -> None:
    """onnxruntime returns a value for these; the spec leaves them undefined."""
    np.testing.assert_array_equal(_ort_from_strings([text], to), [ort_value])
    with pytest.raises(UndefinedResultError, match="^Cast"):
        _refimpl(np.array([text], dtype=object), to)


def test_string_to_bool_is_refused() -> None:
    """The spec defines no string -> bool conversion (onnxruntime reads "0.5" as False)."""
    with pytest.raises(UndefinedResultError, match="^Cast"):
        _refimpl(np.array(["1"], dtype=object), TensorProto.BOOL)


def test_invalid_utf8_is_refused() -> None:
    with pytest.raises(RefImplError, match="UTF-8"):
        _refimpl(np.array([b"\xff1"], dtype=object), TensorProto.FLOAT)


_NUMBERS = [
    0.0,
    -0.0,
    1.0,
    -1.5,
    0.1,
    1 / 3,
    2 / 3,
    1e-5,
    1e-4,
    1e20,
    1e16,
    123456789.0,
    12345678.0,
    123456785.0,
    12345678.5,
    1e-45,
    3.4028235e38,
    100.0,
    1e7,
    1e8,
    0.5,
    np.pi,
    2.5e-8,
    np.inf,
    -np.inf,
    np.nan,
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16], ids=str)
def test_float_to_string_matches_ort(dtype: Any) -> None:
    """%.8g, as onnxruntime prints every float type; NaN, INF and -INF spelled its way."""
    with np.errstate(over="ignore"):
        x = np.array(_NUMBERS, dtype)
    code = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    expected = _cast_session(code, TensorProto.STRING).run(None, {"x": x})[0]
    assert _refimpl(x, TensorProto.STRING).tolist() == expected.tolist()


@pytest.mark.parametrize(
    "x",
    [
        np.array([1.5, 0.1, np.inf, -np.inf, np.nan, -0.0, 3.0e38, 1e-40], ml_dtypes.bfloat16),
        np.array([1.5, 448, np.nan, -0.0, 0.0137], ml_dtypes.float8_e4m3fn),
        np.array([12, -3, 127, -128, 0], np.int8),
        np.array([0, 2**64 - 1], np.uint64),
        np.array([-(2**63), 2**63 - 1], np.int64),
        np.array([True, False]),
    ],
    ids=["bfloat16", "float8e4m3fn", "int8", "uint64", "int64", "bool"],
)
def test_constant_to_string_matches_ort(x: np.ndarray) -> None:
    """Types onnxruntime's Python API cannot feed go in as an initializer."""
    code = helper.np_dtype_to_tensor_dtype(x.dtype)
    expected = _cast_session(code, TensorProto.STRING, constant=x).run(None, {})[0]
    assert _refimpl(x, TensorProto.STRING).tolist() == expected.tolist()


@pytest.mark.parametrize("as_object", [True, False], ids=["object", "bytes_"])
def test_constant_string_tensor_round_trips(as_object: bool) -> None:
    """A string initializer as constant folding reads it (onnx_ir: bytes) casts to numbers."""
    proto = helper.make_tensor("s", TensorProto.STRING, [3], [b"1.5", b" -2", b"NaN"])
    x = ir.serde.deserialize_tensor(proto).numpy()
    assert x.dtype.kind == "S"
    if as_object:  # what passes.fold hands to refimpl
        x = np.asarray(x, dtype=object)
        assert isinstance(x.ravel()[0], bytes)
    out = _refimpl(x, TensorProto.FLOAT)
    np.testing.assert_array_equal(out, np.array([1.5, -2.0, np.nan], np.float32))
    text = _refimpl(out, TensorProto.STRING)
    assert text.tolist() == ["1.5", "-2", "NaN"]
    (like,) = refimpl.run("CastLike", [x, np.zeros(0, np.float64)], opset=19)
    np.testing.assert_array_equal(like, np.array([1.5, -2.0, np.nan]))


def test_cast_strings() -> None:
    """String <-> number where the spec fixes the result (moved from test_refimpl_ort.py)."""
    s = np.array(["1.5", "INF", "-INF", "NaN", "+INF", "1e-5"], dtype=object)
    _assert_bits_equal(
        _refimpl(s, TensorProto.FLOAT), _ort_from_strings(list(s), TensorProto.FLOAT)
    )
    n = np.array([12, -3], np.int64)
    assert _refimpl(n, TensorProto.STRING).tolist() == ["12", "-3"]
    assert _refimpl(np.array([0.1], np.float32), TensorProto.STRING).tolist() == ["0.1"]
