"""refimpl cross-checked against onnxruntime (CPU, every graph optimisation off).

Hypothesis draws dtypes, shapes, axes, attributes and values; each example runs the node through
``refimpl.run`` and through onnxruntime. Integer and bool results must be bit-exact. Float
results must lie within the ulp bound stated at each test (plus, for reductions, the rounding
slack of onnxruntime's own float32 accumulation).

Where onnxruntime disagrees with the spec, refimpl follows the spec and the case is excluded here
and pinned down by a dedicated test below. Where the spec leaves a choice, refimpl does what
onnxruntime does or declines (UndefinedResultError: the node stays unfolded); the property tests
accept a decline, and ``tests/test_edge_values.py`` checks the edge values bit for bit.
  * ReduceMean over an empty set: undefined by the spec (refimpl raises), onnxruntime returns 0.
  * Integer overflow in ReduceSum/SumSquare/L1/Prod: undefined (refimpl raises), onnxruntime
    saturates (numpy and the onnx reference wrap around).
  * Integer ReduceLogSumExp: onnxruntime truncates each exp term to an integer before summing
    ([1, 1, 0, 0, 0] -> 1 instead of trunc(2.007) = 2).
  * ReduceMax/ReduceMin with NaN: onnxruntime's result depends on its code path; refimpl
    declines.
  * float sums that cancel within onnxruntime's rounding error: refimpl declines.
  * float16 ReduceL2/ReduceMean whose intermediate overflows float16: onnxruntime holds it in
    float32 and returns a finite value; refimpl does the same (float16 ReduceLogSum declines:
    onnxruntime adds in float16 there).
  * Float -> int Cast of NaN, infinities or out-of-range values: undefined (refimpl raises),
    onnxruntime returns INT_MIN or wraps.
  * Integer Pow with results above 2**53: onnxruntime goes through double and is inexact.
  * Cast float32 -> float8e4m3fn of 480 without saturation: the spec's table gives NaN
    ([480] > 448), onnxruntime gives 448.
  * float32 ReduceL2/ReduceSumSquare of |x| < 1e-19: onnxruntime squares in float32 and
    underflows to 0; refimpl squares in float64 (inputs below 1e-6 are drawn as 0 here).
  * float16 Mish for x < -10: onnxruntime is about 1% off (a 1e-6 absolute slack here).
  * Clip-6 with min > max: onnxruntime rejects the model; refimpl returns max as Clip-11+ does.

bfloat16 is not fed to onnxruntime (its Python API rejects ml_dtypes arrays); the
narrow-float tests below check it against float64 oracles instead.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import pytest
from helpers import ort_session
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import refimpl
from refimpl import RefImplError, UndefinedResultError, UnsupportedOpError

# Overflow to inf in Mul and in sums rounded to float16 is IEEE behaviour that refimpl leaves
# numpy to warn about (silencing costs a microsecond per call); it is not a test problem.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")

BF16 = np.dtype(ml_dtypes.bfloat16)
FLOATS = (np.dtype(np.float16), BF16, np.dtype(np.float32), np.dtype(np.float64))
INTS = tuple(
    np.dtype(t)
    for t in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64)
)
BOOL = np.dtype(np.bool_)

# --- ulp arithmetic ------------------------------------------------------------------------

_INT_VIEW = {2: np.int16, 4: np.int32, 8: np.int64}


def _ordered(x: np.ndarray) -> np.ndarray:
    """Maps floats to integers that count representable values (both zeros map to 0)."""
    bits = x.view(_INT_VIEW[x.dtype.itemsize]).astype(object)
    sign = 1 << (8 * x.dtype.itemsize - 1)
    return np.where(bits < 0, -(bits + sign), bits)


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """How many representable values of their (shared) float dtype lie between a and b.

    NaN and NaN are 0 apart; a NaN and a number are infinitely far apart.
    """
    assert a.dtype == b.dtype
    a, b = np.atleast_1d(a), np.atleast_1d(b)
    dist = np.abs(_ordered(a) - _ordered(b)).astype(np.float64)
    nan_a, nan_b = np.isnan(a.astype(np.float64)), np.isnan(b.astype(np.float64))
    return np.where(nan_a & nan_b, 0.0, np.where(nan_a | nan_b, np.inf, dist))


def test_ulp_distance_helper() -> None:
    one = np.array([1.0], np.float32)
    assert ulp_distance(one, np.nextafter(one, np.float32(2))) == 1
    assert ulp_distance(np.array([-0.0], np.float32), np.array([0.0], np.float32)) == 0
    tiny = np.array([np.float32(1e-45)])
    assert ulp_distance(-tiny, tiny) == 2
    bf = np.array([1.0, 1.0078125], BF16)  # adjacent bfloat16 values
    assert ulp_distance(bf[:1], bf[1:]) == 1
    assert ulp_distance(np.array([np.nan]), np.array([1.0])) == np.inf


def assert_same(actual: np.ndarray, expected: np.ndarray, *, ulps: float = 0, slack: Any = 0.0) -> None:
    """Same dtype, shape and NaN positions; ints/bools/strings equal; floats within the bound.

    A float element passes if it is at most ``ulps`` representable values away from onnxruntime's
    or within the absolute ``slack`` (scalar or broadcastable array).
    """
    assert isinstance(actual, np.ndarray)
    assert actual.dtype == expected.dtype, f"dtype {actual.dtype} != {expected.dtype}"
    assert actual.shape == expected.shape, f"shape {actual.shape} != {expected.shape}"
    if expected.dtype not in FLOATS:
        np.testing.assert_array_equal(actual, expected)
        return
    dist = ulp_distance(actual, expected)
    with np.errstate(invalid="ignore"):  # inf - inf
        diff = np.abs(actual.astype(np.float64) - expected.astype(np.float64))
    ok = (dist <= ulps) | (np.nan_to_num(diff, nan=np.inf) <= slack)
    if not np.all(ok):
        bad = np.argwhere(~np.atleast_1d(ok))[0]
        a, e = np.atleast_1d(actual)[tuple(bad)], np.atleast_1d(expected)[tuple(bad)]
        raise AssertionError(f"at {tuple(bad)}: refimpl {a!r} vs onnxruntime {e!r} ({dist.max()} ulps)")


# --- onnxruntime -----------------------------------------------------------------------------


def _elem(dtype: np.dtype) -> int:
    return onnx.helper.np_dtype_to_tensor_dtype(dtype)


@functools.lru_cache(maxsize=None)
def _session(
    op: str,
    in_types: tuple[Any, ...],
    out_types: tuple[Any, ...],
    attrs: tuple[tuple[str, Any], ...],
    opset: int,
) -> Any:
    """A cached one-node session; ``in_types`` holds (dtype, rank) or None for omitted inputs."""
    graph_inputs, names = [], []
    for k, spec in enumerate(in_types):
        if spec is None:
            names.append("")
            continue
        dtype, rank = spec
        names.append(f"x{k}")
        dims = [f"d{k}_{i}" for i in range(rank)]
        graph_inputs.append(onnx.helper.make_tensor_value_info(f"x{k}", _elem(dtype), dims))
    outputs = [onnx.helper.make_tensor_value_info(f"y{k}", _elem(dt), None) for k, dt in enumerate(out_types)]
    node = onnx.helper.make_node(op, names, [f"y{k}" for k in range(len(out_types))], **dict(attrs))
    graph = onnx.helper.make_graph([node], "g", graph_inputs, outputs)
    model = onnx.helper.make_model(
        graph, opset_imports=[onnx.helper.make_opsetid("", opset)], ir_version=9
    )
    return ort_session(model)


def _freeze(attrs: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in attrs.items()))


def ort_eval(
    op: str,
    inputs: Sequence[np.ndarray | None],
    attrs: dict[str, Any],
    opset: int,
    out_types: Sequence[Any],
) -> list[np.ndarray]:
    """Runs one node in onnxruntime; None inputs are omitted optional inputs."""
    in_types = tuple(None if x is None else (x.dtype, x.ndim) for x in inputs)
    session = _session(op, in_types, tuple(np.dtype(t) for t in out_types), _freeze(attrs), opset)
    feeds = {f"x{k}": x for k, x in enumerate(inputs) if x is not None}
    return session.run(None, feeds)


@functools.lru_cache(maxsize=None)
def ort_supports(op: str, opset: int, dtypes: tuple[Any, ...], out: Any, attrs: tuple = ()) -> bool:
    """Whether onnxruntime has a kernel for ``op`` with these (rank-1) input dtypes."""
    try:
        _session(op, tuple((np.dtype(d), 1) for d in dtypes), (np.dtype(out),), attrs, opset)
    except Exception:  # noqa: BLE001 - any load failure means "no kernel"
        return False
    return True


def refimpl_dtypes(op: str, opset: int, param: str = "T") -> list[np.dtype]:
    """The dtypes refimpl accepts for ``op`` at ``opset`` that onnxruntime's Python API can feed.

    bfloat16 is left out: onnxruntime cannot take ml_dtypes arrays as inputs (the narrow-float
    test below and the onnx conformance cases cover it).
    """
    version = onnx.defs.get_schema(op, opset).since_version
    allowed = refimpl.schema_dtypes(op, version)[param]
    return [d for d in (*FLOATS, *INTS, BOOL) if d in allowed and d != BF16]


# --- value strategies ----------------------------------------------------------------------


def arrays(dtype: np.dtype, shape: Any, lo: float = -100, hi: float = 100) -> st.SearchStrategy:
    """Arrays of ``dtype`` with values in [lo, hi] (ints clipped to the dtype's range)."""
    if dtype == BOOL:
        return hnp.arrays(np.bool_, shape)
    if dtype in INTS:
        info = np.iinfo(dtype)
        lo_i, hi_i = max(int(lo), int(info.min)), min(int(hi), int(info.max))
        return hnp.arrays(dtype, shape, elements=st.integers(lo_i, hi_i))
    # No magnitudes below 1e-6: onnxruntime squares float32 values in float32, which underflows
    # (ReduceL2 of 1e-29 gives 0 there; refimpl gives 1e-29).
    top = float(ml_dtypes.finfo(dtype).max)
    lo, hi = max(lo, -top), min(hi, top)
    floats = st.floats(lo, hi, allow_nan=False, allow_infinity=False).map(
        lambda v: 0.0 if abs(v) < 1e-6 else v
    )
    return hnp.arrays(np.float64, shape, elements=floats).map(
        lambda a: a.astype(np.float32).astype(dtype) if dtype == BF16 else a.astype(dtype)
    )


shapes = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=4)


# --- reductions ----------------------------------------------------------------------------

REDUCE_OPS = [
    "ReduceSum",
    "ReduceSumSquare",
    "ReduceL1",
    "ReduceL2",
    "ReduceMean",
    "ReduceProd",
    "ReduceMax",
    "ReduceMin",
    "ReduceLogSum",
    "ReduceLogSumExp",
]

# Value ranges that keep integer results representable and float results finite.
_REDUCE_RANGE = {
    "ReduceProd": (-3, 3),
    "ReduceLogSum": (1, 50),  # log of a non-positive sum is NaN/undefined
    "ReduceLogSumExp": (-60, 60),
}


def _form(op: str, form: str) -> int:
    """The opset of the attribute form (axes attribute) or the input form of ``op``."""
    if op == "ReduceSum":
        return 11 if form == "attribute" else 13
    return 13 if form == "attribute" else 18


def _reduce_dtypes(op: str, opset: int) -> list[np.dtype]:
    out = []
    for dt in refimpl_dtypes(op, opset):
        if op == "ReduceLogSumExp" and dt in INTS:
            continue  # onnxruntime truncates the exp terms; see test_int_reduce_log_sum_exp_*
        axes_dtypes = (dt, np.int64) if opset >= 18 or (op == "ReduceSum" and opset >= 13) else (dt,)
        if ort_supports(op, opset, axes_dtypes, dt):
            out.append(dt)
    return out


def _reduce_slack(op: str, x: np.ndarray, axes: tuple[int, ...], keepdims: bool) -> Any:
    """onnxruntime accumulates in float32 (or float64 for double): n * eps * scale."""
    if x.dtype not in FLOATS:
        return 0.0
    x64 = np.abs(x.astype(np.float64))
    n = max(math.prod(x.shape[a] for a in axes), 1)
    eps = 2.0**-52 if x.dtype == np.float64 else 2.0**-23
    if op in ("ReduceSum", "ReduceMean"):
        scale = np.sum(x64, axis=axes, keepdims=keepdims) / (n if op == "ReduceMean" else 1)
    elif op in ("ReduceLogSum", "ReduceLogSumExp"):
        scale = 1.0 + np.max(x64, axis=axes, keepdims=keepdims, initial=0.0)
    else:
        scale = 0.0  # products, norms, max/min: bounded in ulps
    return 4 * n * eps * scale


@pytest.mark.parametrize("form", ["attribute", "input"])
@pytest.mark.parametrize("op", REDUCE_OPS)
@settings(max_examples=25)
@given(data=st.data())
def test_reduce_matches_ort(op: str, form: str, data: st.DataObject) -> None:
    """Reductions agree with onnxruntime; float error at most n + 2 ulps plus accumulation slack."""
    opset = _form(op, form)
    dtype = data.draw(st.sampled_from(_reduce_dtypes(op, opset)), label="dtype")
    lo, hi = _REDUCE_RANGE.get(op, (-100, 100))
    x = data.draw(arrays(dtype, shapes, lo, hi), label="x")
    rank = x.ndim
    axes = data.draw(st.lists(st.integers(0, max(rank - 1, 0)), unique=True, max_size=rank), label="axes")
    axes = [a - rank if data.draw(st.booleans()) else a for a in axes] if rank else []
    keepdims = data.draw(st.booleans(), label="keepdims")
    attrs: dict[str, Any] = {"keepdims": int(keepdims)}
    if form == "attribute":
        inputs: list[Any] = [x]
        if axes:
            attrs["axes"] = axes
        noop = False
    else:
        noop = data.draw(st.booleans(), label="noop") and not axes
        attrs["noop_with_empty_axes"] = int(noop)
        given_axes = np.array(axes, np.int64)
        inputs = [x, given_axes] if axes or data.draw(st.booleans()) else [x]
    reduced = tuple(sorted(a % rank for a in axes)) if axes else (() if noop else tuple(range(rank)))
    count = math.prod(x.shape[a] for a in reduced)

    out_size = math.prod(d for i, d in enumerate(x.shape) if i not in reduced)
    if count == 0 and out_size and (op == "ReduceMean" or (op == "ReduceLogSum" and dtype in INTS)):
        with pytest.raises(RefImplError, match=op):
            refimpl.run(op, inputs, attrs, opset=opset)
        return  # undefined by the spec (-inf is not an integer); onnxruntime returns 0 / INT_MIN
    if dtype in INTS and op in ("ReduceSum", "ReduceSumSquare", "ReduceL1", "ReduceProd"):
        exact = _exact_int_reduce(op, x, reduced)
        info = np.iinfo(dtype)
        if exact.size and (exact.min() < info.min or exact.max() > info.max):
            with pytest.raises(RefImplError, match=op):
                refimpl.run(op, inputs, attrs, opset=opset)
            return  # onnxruntime saturates
    try:
        (actual,) = refimpl.run(op, inputs, attrs, opset=opset)
    except UndefinedResultError:
        event("declined by refimpl")  # counted in the statistics: nothing compared
        return  # a choice onnxruntime makes by its code path: refimpl declines (never a wrong value)
    (expected,) = ort_eval(op, inputs, attrs, opset, [dtype])
    slack = _reduce_slack(op, x, reduced, keepdims or noop)
    assert_same(actual, expected, ulps=count + 2, slack=slack)


def _rounds_to_inf(x: np.ndarray, dtype: Any) -> np.ndarray:
    """Where float64 ``x`` rounds to +-inf in ``dtype``: from its largest value plus half an ulp."""
    info = ml_dtypes.finfo(dtype)
    return np.abs(x) >= float(info.max) + 2.0 ** (int(info.maxexp) - 2 - int(info.nmant))


def _held_intermediate(op: str, x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray | None:
    """The tensor the op's definition holds in the input type before its last step, if any."""
    if x.dtype not in FLOATS or op not in ("ReduceL2", "ReduceLogSum", "ReduceMean"):
        return None
    wide = x.astype(np.float64)
    return np.sum(wide * wide if op == "ReduceL2" else wide, axis=axes)


def _exact_int_reduce(op: str, x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """The exact (Python int) value of an integer reduction, as the overflow oracle."""
    obj = x.astype(object)
    if op == "ReduceSumSquare":
        obj = obj * obj
    elif op == "ReduceL1":
        obj = np.abs(obj)
    ufunc = np.multiply if op == "ReduceProd" else np.add
    return np.asarray(ufunc.reduce(obj, axis=axes, keepdims=True), dtype=object)


@pytest.mark.parametrize(
    ("op", "x", "disagreement"),
    [
        ("ReduceSum", np.array([2**31 - 1, 1], np.int32), "onnxruntime saturates to 2**31-1"),
        ("ReduceProd", np.array([2**20, 2**20, 3], np.int32), "onnxruntime saturates"),
        ("ReduceSumSquare", np.array([50000, 50000], np.int32), "onnxruntime saturates"),
        ("ReduceL1", np.array([-(2**31), 1], np.int32), "onnxruntime saturates"),
        ("ReduceSum", np.array([2**63 - 1, 1], np.int64), "onnxruntime saturates"),
    ],
)
def test_integer_reduction_overflow_is_refused(op: str, x: np.ndarray, disagreement: str) -> None:
    """Overflow is undefined by the spec and runtimes disagree: no value to fold."""
    with pytest.raises(RefImplError, match=op):
        refimpl.run(op, [x, np.array([0])], {}, opset=18)


@pytest.mark.parametrize("form", ["attribute", "input"])
@pytest.mark.parametrize(
    ("op", "values"),
    [
        ("ReduceL2", [3e19, 4e19]),  # the sum of squares, 2.5e39, overflows float32: inf, not 5e19
        ("ReduceL2", [-2e38, 2e38]),
        ("ReduceLogSum", [3e38, 3e38]),  # log(inf), not 89.29
        ("ReduceLogSum", [-3e38, -3e38]),  # log(-inf) = NaN
        ("ReduceMean", [3e38, 3e38]),  # the sum overflows: inf, not 3e38
        ("ReduceMean", [-3e38, -3e38]),
        ("ReduceSumSquare", [3e19, 4e19]),
        ("ReduceL1", [3e38, 3e38]),
        ("ReduceLogSumExp", [3e38, 3e38]),  # the max shift keeps it finite, in onnxruntime too
        ("ReduceL2", [3e18, 4e18]),  # no overflow: float64 accuracy stays
    ],
)
def test_float32_intermediate_overflow_matches_ort(op: str, values: list[float], form: str) -> None:
    """An intermediate the op holds in float32 that overflows there gives what inf gives."""
    x = np.array([values, values[::-1]], np.float32)
    opset = _form(op, form)
    inputs: list[Any] = [x] if form == "attribute" else [x, np.array([1])]
    attrs: dict[str, Any] = {"keepdims": 0, **({"axes": [1]} if form == "attribute" else {})}
    (actual,) = refimpl.run(op, inputs, attrs, opset=opset)
    (expected,) = ort_eval(op, inputs, attrs, opset, [np.float32])
    assert_same(actual, expected, ulps=1)


def test_reduce_l2_of_3e19_4e19_is_inf() -> None:
    """The tracker's case: onnxruntime, the onnx reference and the function body give inf."""
    x = np.array([3e19, 4e19], np.float32)
    (out,) = refimpl.run("ReduceL2", [x], {"keepdims": 0}, opset=18)
    assert out.dtype == np.float32 and np.isposinf(out)


@pytest.mark.parametrize(
    ("op", "x"),
    [
        ("ReduceL2", np.array([200, 300], np.float16)),  # squares overflow float16, not float32
        ("ReduceL2", np.array([181, 181], np.float16)),
        ("ReduceMean", np.array([40000, 40000], np.float16)),
        ("ReduceLogSumExp", np.zeros(70000, np.float16)),  # 70000 terms of exp(0)
    ],
)
def test_float16_intermediate_is_held_in_float32_as_ort(op: str, x: np.ndarray) -> None:
    """The spec's function body holds it in float16 (inf); onnxruntime in float32, and so does
    refimpl (the spec does not fix the accumulation type)."""
    (out,) = refimpl.run(op, [x, np.array([0])], {"keepdims": 0}, opset=18)
    (theirs,) = ort_eval(op, [x, np.array([0])], {"keepdims": 0}, 18, [np.float16])
    assert out.dtype == np.float16 and np.isfinite(out)
    assert_same(out, theirs, ulps=1)


def test_float16_log_sum_declines() -> None:
    """onnxruntime adds float16 ReduceLogSum in float16 (its ReduceSum in float32)."""
    with pytest.raises(UndefinedResultError, match="ReduceLogSum"):
        refimpl.run("ReduceLogSum", [np.array([40000, 40000], np.float16), np.array([0])], {}, opset=18)


def test_reduce_mean_empty_set_is_undefined() -> None:
    """Spec: "Reduction over an empty set of values yields undefined" (onnxruntime gives 0)."""
    with pytest.raises(RefImplError, match="ReduceMean"):
        refimpl.run("ReduceMean", [np.zeros((2, 0), np.float32), np.array([1])], {}, opset=18)


def test_reduce_max_min_over_nan_declines() -> None:
    """onnxruntime drops a NaN that is not first in its loop, but not in its vectorised path."""
    x = np.array([[1.0, np.nan, 2.0], [np.nan, 1.0, 2.0], [1.0, 2.0, 3.0]], np.float32)
    for op in ("ReduceMax", "ReduceMin"):
        with pytest.raises(UndefinedResultError, match=op):
            refimpl.run(op, [x, np.array([1])], {"keepdims": 0}, opset=18)
    ort_out = ort_eval("ReduceMax", [x, np.array([1])], {"keepdims": 0}, 18, [np.float32])[0]
    assert not np.isnan(ort_out[0])  # the disagreement with NaN propagation


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint32, np.uint64])
@settings(max_examples=30)
@given(data=st.data())
def test_int_reduce_log_sum_exp_is_the_truncated_real_result(dtype: Any, data: st.DataObject) -> None:
    """Integer ReduceLogSumExp = trunc(log(sum(exp(x)))) computed exactly in float64.

    onnxruntime truncates each exp term first ([1, 1, 0, 0, 0] gives 1, not 2), so the oracle
    is math here, not onnxruntime.
    """
    lo = 0 if np.dtype(dtype).kind == "u" else -40
    x = data.draw(arrays(np.dtype(dtype), hnp.array_shapes(min_dims=1, max_dims=3, max_side=4), lo, 40))
    axis = data.draw(st.integers(0, x.ndim - 1))
    (out,) = refimpl.run("ReduceLogSumExp", [x, np.array([axis])], {"keepdims": 0}, opset=18)
    real = np.log(np.sum(np.exp(x.astype(np.float64)), axis=axis))
    assume(np.all(np.abs(real - np.round(real)) > 1e-9))  # away from integer boundaries
    assert out.dtype == dtype
    np.testing.assert_array_equal(out, np.trunc(real).astype(dtype))


def test_int_reduce_log_sum_exp_disagrees_with_ort_as_documented() -> None:
    x = np.array([1, 1, 0, 0, 0], np.int32)
    (out,) = refimpl.run("ReduceLogSumExp", [x, np.array([0])], {"keepdims": 0}, opset=18)
    assert out == 2  # trunc(1 + log(2 + 3/e)) = trunc(2.0069)
    assert ort_eval("ReduceLogSumExp", [x, np.array([0])], {"keepdims": 0}, 18, [np.int32])[0] == 1


# --- float16 / bfloat16 accumulation --------------------------------------------------------

_ORACLES: dict[str, Callable[[np.ndarray, int], np.ndarray]] = {
    "ReduceSum": lambda x, ax: np.sum(x, axis=ax),
    "ReduceMean": lambda x, ax: np.mean(x, axis=ax),
    "ReduceSumSquare": lambda x, ax: np.sum(x * x, axis=ax),
    "ReduceL1": lambda x, ax: np.sum(np.abs(x), axis=ax),
    "ReduceL2": lambda x, ax: np.sqrt(np.sum(x * x, axis=ax)),
    "ReduceLogSumExp": lambda x, ax: np.logaddexp.reduce(x, axis=ax),
}


def _neighbours(out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The representable values just below and above each element of ``out`` (as float64)."""
    itype = _INT_VIEW[out.dtype.itemsize]
    ordered = _ordered(out)
    result = []
    for step in (-1, 1):
        o = ordered + step
        sign = 1 << (8 * out.dtype.itemsize - 1)
        bits = np.where(o < 0, -o - sign, o).astype(np.int64).astype(itype)
        result.append(bits.view(out.dtype).astype(np.float64))
    return result[0], result[1]


@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("op", sorted(_ORACLES))
@settings(max_examples=40)
@given(data=st.data())
def test_narrow_float_reductions_round_the_float64_result_once(
    op: str, dtype: Any, data: st.DataObject
) -> None:
    """float16/bfloat16 reductions are the float64 result correctly rounded (<= 0.5 ulp).

    Values mix magnitudes to provoke cancellation (e.g. [65504, 2**-14, -65504] in float16,
    where float32 accumulation is 256 ulps off): there refimpl declines, since onnxruntime's
    value depends on its order. Intermediates are held in float32, as onnxruntime holds them.
    """
    big = 60000.0 if dtype == np.float16 else 1e4
    lo_hi = (-10.0, 10.0) if op == "ReduceLogSumExp" else (-big, big)
    magnitudes = st.sampled_from([1.0, 2.0**-6, 2.0**-10, 1e3, lo_hi[1]])
    element = st.builds(
        lambda m, f: float(np.clip(m * f, *lo_hi)), magnitudes, st.floats(-1, 1)
    )
    x = data.draw(hnp.arrays(np.float64, hnp.array_shapes(min_dims=1, max_dims=2, max_side=6), elements=element))
    x = x.astype(np.float32).astype(dtype)
    axis = data.draw(st.integers(0, x.ndim - 1))
    try:
        (out,) = refimpl.run(op, [x, np.array([axis])], {"keepdims": 0}, opset=18)
    except UndefinedResultError:
        event("declined by refimpl")  # counted in the statistics: nothing compared
        return  # cancellation within onnxruntime's rounding error (or float16 ReduceLogSum)
    assert out.dtype == np.dtype(dtype)
    exact = _ORACLES[op](x.astype(np.float64), axis)
    got = out.astype(np.float64)
    below, above = _neighbours(out)
    finite = np.isfinite(got)
    # Only a result beyond the type's largest value may round to infinity, or one whose
    # intermediate overflows the type (ReduceL2's sum of squares, ReduceMean's sum): that one must.
    held = _held_intermediate(op, x, (axis,))
    held_overflows = np.zeros(got.shape, bool) if held is None else _rounds_to_inf(held, np.float32)
    assert np.all(finite | (np.abs(exact) > float(ml_dtypes.finfo(dtype).max)) | held_overflows)
    assert not np.any(finite & held_overflows)
    with np.errstate(invalid="ignore"):  # inf - inf next to the overflow threshold
        err = np.abs(got - exact)
        assert np.all(~finite | (err <= np.abs(below - exact) * (1 + 1e-12)))
        assert np.all(~finite | (err <= np.abs(above - exact) * (1 + 1e-12)))


_UNARY_ORACLES: dict[str, tuple[Callable[[np.ndarray], np.ndarray], float, float]] = {
    # op -> (float64 oracle, value range)
    "Exp": (np.exp, -20, 10),
    "Log": (np.log, 1e-3, 1e3),
    "Tanh": (np.tanh, -5, 5),
    "Sigmoid": (lambda x: 1 / (1 + np.exp(-x)), -20, 20),
    "Erf": (np.vectorize(math.erf, otypes=[np.float64]), -4, 4),
    "Sqrt": (np.sqrt, 0, 1e3),
    "Sin": (np.sin, -10, 10),
    "Reciprocal": (lambda x: 1 / x, 0.01, 100),
    "Softplus": (lambda x: np.log1p(np.exp(x)), -20, 10),
}


@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("op", sorted(_UNARY_ORACLES))
@settings(max_examples=15)
@given(data=st.data())
def test_narrow_float_unary_is_correctly_rounded(op: str, dtype: Any, data: st.DataObject) -> None:
    """float16/bfloat16 transcendental results are the float64 value rounded once (<= 0.5 ulp)."""
    oracle, lo, hi = _UNARY_ORACLES[op]
    x = data.draw(hnp.arrays(np.float64, (8,), elements=st.floats(lo, hi)))
    x = x.astype(np.float32).astype(dtype)
    (out,) = refimpl.run(op, [x], opset=22)
    assert out.dtype == np.dtype(dtype)
    exact = oracle(x.astype(np.float64))
    below, above = _neighbours(out)
    err = np.abs(out.astype(np.float64) - exact)
    with np.errstate(invalid="ignore"):
        assert np.all(err <= np.abs(below - exact) * (1 + 1e-12))
        assert np.all(err <= np.abs(above - exact) * (1 + 1e-12))


@settings(max_examples=30)
@given(data=st.data())
def test_bfloat16_elementwise_ops(data: st.DataObject) -> None:
    """bfloat16 arithmetic rounds the exact result once; comparisons, Where, Clip are exact."""
    a = data.draw(hnp.arrays(np.float32, (6,), elements=st.floats(-1e3, 1e3, width=32))).astype(BF16)
    b = data.draw(hnp.arrays(np.float32, (6,), elements=st.floats(1, 1e3, width=32))).astype(BF16)
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    for op, want in [
        ("Add", a32 + b32), ("Sub", a32 - b32), ("Mul", a32 * b32), ("Div", a32 / b32),
        ("Max", np.maximum(a32, b32)), ("Min", np.minimum(a32, b32)), ("Abs", np.abs(a32)),
        ("Neg", -a32), ("Floor", np.floor(a32)), ("Ceil", np.ceil(a32)),
    ]:
        inputs = [a] if op in ("Abs", "Neg", "Floor", "Ceil") else [a, b]
        zero_tie = (a32 == 0) & (b32 == 0) & (np.signbit(a32) != np.signbit(b32))
        if op in ("Max", "Min") and a.size > 1 and zero_tie.any():
            with pytest.raises(UndefinedResultError, match=op):  # onnxruntime's choice, by position
                refimpl.run(op, inputs, opset=22)
            continue
        (out,) = refimpl.run(op, inputs, opset=22)
        assert out.dtype == BF16, op
        # float32 holds these results exactly or rounds them innocuously (24 >= 2*8 + 2).
        np.testing.assert_array_equal(out.view(np.int16), want.astype(BF16).view(np.int16), err_msg=op)
    (less,) = refimpl.run("Less", [a, b], opset=22)
    np.testing.assert_array_equal(less, a32 < b32)
    selected = np.where(a32 < b32, a32, b32)
    if np.any((selected == 0) & np.signbit(selected)):
        with pytest.raises(UndefinedResultError, match="Where"):  # onnxruntime may give +0
            refimpl.run("Where", [less, a, b], opset=22)
    else:
        (where,) = refimpl.run("Where", [less, a, b], opset=22)
        np.testing.assert_array_equal(where.view(np.int16), np.where(a32 < b32, a, b).view(np.int16))
    lo, hi = np.array(-5, BF16), np.array(5, BF16)
    (clipped,) = refimpl.run("Clip", [a, lo, hi], opset=22)
    np.testing.assert_array_equal(clipped.astype(np.float32), np.clip(a32, -5, 5))


def test_float16_sum_with_cancellation_declines() -> None:
    """The exact sum is 2**-14; onnxruntime (float32 accumulation, its order) returns 0."""
    x = np.array([65504, 2**-14, -65504], np.float16)
    with pytest.raises(UndefinedResultError, match="ReduceSum"):
        refimpl.run("ReduceSum", [x, np.array([0])], {"keepdims": 0}, opset=13)
    x = np.array([65504, 32, -65504], np.float16)  # every partial sum exact: folded
    (out,) = refimpl.run("ReduceSum", [x, np.array([0])], {"keepdims": 0}, opset=13)
    assert out == 32


def test_a_cancelling_sum_exact_up_to_the_accumulator_bound_is_folded() -> None:
    """[-2, 0, 2] in float32: the terms are multiples of q = ulp(2) = 2**-22 and sum|x| = 4 is exactly
    2**24 * q, which float32 holds, so every partial sum is exact in any order and the sum is +0, as
    onnxruntime gives (the field case of the random fold chains; the bound was strict before)."""
    import onnxruntime as ort

    x = np.array([[-3, -2], [-1, 0], [1, 2]], np.float32)
    (out,) = refimpl.run("ReduceSum", [x, np.array([0])], {"keepdims": 1}, opset=13)
    model = onnx.helper.make_model(onnx.helper.make_graph(
        [onnx.helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=1)], "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3, 2])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(np.array([0], np.int64), "axes")]),
        opset_imports=[onnx.helper.make_opsetid("", 13)], ir_version=8)  # fmt: skip
    (theirs,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_array_equal(out.view(np.uint32), theirs.view(np.uint32))  # bit for bit: +0, not -0


# --- unary elementwise ---------------------------------------------------------------------

# op -> (value range, ulp bound, absolute slack, attributes). Exactly rounded ops must match
# bit for bit; onnxruntime's float32 transcendental approximations get a few ulps, and an
# absolute slack near zero crossings (sin(pi), log(1)).
UNARY: dict[str, tuple[tuple[float, float], int, float, dict[str, Any]]] = {
    "Abs": ((-100, 100), 0, 0.0, {}),
    "Neg": ((-100, 100), 0, 0.0, {}),
    "Floor": ((-100, 100), 0, 0.0, {}),
    "Ceil": ((-100, 100), 0, 0.0, {}),
    "Round": ((-100, 100), 0, 0.0, {}),
    "Sign": ((-100, 100), 0, 0.0, {}),
    "Relu": ((-100, 100), 0, 0.0, {}),
    "Sqrt": ((0, 1e4), 0, 0.0, {}),
    "Reciprocal": ((0.01, 100), 0, 0.0, {}),
    "Exp": ((-80, 80), 4, 0.0, {}),
    "Log": ((1e-3, 1e4), 4, 1e-7, {}),
    "Tanh": ((-20, 20), 4, 2e-7, {}),
    "Sigmoid": ((-80, 80), 4, 2e-7, {}),
    "Erf": ((-6, 6), 4, 2e-7, {}),
    "Sin": ((-10, 10), 4, 2e-7, {}),
    "Cos": ((-10, 10), 4, 2e-7, {}),
    "Tan": ((-1.5, 1.5), 4, 2e-7, {}),
    "Asin": ((-1, 1), 4, 2e-7, {}),
    "Acos": ((-1, 1), 4, 2e-7, {}),
    "Atan": ((-100, 100), 4, 2e-7, {}),
    "Sinh": ((-20, 20), 4, 2e-7, {}),
    "Cosh": ((-20, 20), 4, 0.0, {}),
    "Asinh": ((-100, 100), 4, 2e-7, {}),
    "Acosh": ((1, 100), 4, 2e-7, {}),
    "Atanh": ((-0.99, 0.99), 4, 2e-7, {}),
    "Softplus": ((-30, 30), 4, 2e-7, {}),
    "Softsign": ((-100, 100), 2, 0.0, {}),
    "LeakyRelu": ((-100, 100), 1, 0.0, {"alpha": 0.1}),
    "HardSigmoid": ((-10, 10), 2, 2e-7, {"alpha": 0.3, "beta": 0.4}),
    "HardSwish": ((-10, 10), 2, 2e-7, {}),
    "Elu": ((-20, 20), 4, 2e-7, {"alpha": 0.7}),
    "Selu": ((-20, 20), 4, 2e-7, {}),
    "Celu": ((-20, 20), 4, 2e-7, {"alpha": 1.5}),
    "ThresholdedRelu": ((-5, 5), 0, 0.0, {"alpha": 0.5}),
    "Mish": ((-20, 20), 4, 2e-7, {}),
    "Gelu": ((-10, 10), 4, 2e-7, {}),
}


# onnxruntime's float16 Mish is about 1% off for x < -10 (mish(-12) = -7.373e-05, onnxruntime
# -7.44e-05) and flushes results below ~2e-6 to -0 (mish(-16.64) = -1.01e-06, a float16
# subnormal, onnxruntime -0.0); refimpl is the float64 value rounded once.
_FLOAT16_SLACK = {"Mish": 2e-6}


def _unary_opset(op: str) -> int:
    return 20 if op == "Gelu" else 18


@functools.lru_cache(maxsize=None)
def _unary_dtypes(op: str) -> list[np.dtype]:
    opset = _unary_opset(op)
    attrs = _freeze(UNARY[op][3])
    return [d for d in refimpl_dtypes(op, opset) if ort_supports(op, opset, (d,), d, attrs)]


@pytest.mark.parametrize("op", sorted(UNARY))
@settings(max_examples=20)
@given(data=st.data())
def test_unary_matches_ort(op: str, data: st.DataObject) -> None:
    (lo, hi), ulps, slack, attrs = UNARY[op]
    dtype = data.draw(st.sampled_from(_unary_dtypes(op)), label="dtype")
    if dtype in INTS and np.iinfo(dtype).min < 0:
        lo, hi = np.iinfo(dtype).min, np.iinfo(dtype).max  # includes INT_MIN (Abs/Neg wrap)
    x = data.draw(arrays(dtype, shapes, lo, hi), label="x")
    opset = _unary_opset(op)
    (actual,) = refimpl.run(op, [x], attrs, opset=opset)
    (expected,) = ort_eval(op, [x], attrs, opset, [dtype])
    # float16 results go through float32 in onnxruntime: allow one rounding step more.
    extra = 1 if ulps and dtype == np.float16 else 0
    slack = max(slack, _FLOAT16_SLACK.get(op, 0.0)) if dtype == np.float16 else slack
    assert_same(actual, expected, ulps=ulps + extra, slack=slack)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_predicates_and_not_match_ort(dtype: Any) -> None:
    x = np.array([0.0, -0.0, 1.5, -np.inf, np.inf, np.nan, -2.0], dtype)
    for op, attrs in [
        ("IsNaN", {}),
        ("IsInf", {}),
        ("IsInf", {"detect_negative": 0}),
        ("IsInf", {"detect_positive": 0}),
    ]:
        (actual,) = refimpl.run(op, [x], attrs, opset=20)
        assert_same(actual, ort_eval(op, [x], attrs, 20, [BOOL])[0])
    b = np.array([[True, False], [False, True]])
    assert_same(refimpl.run("Not", [b], opset=18)[0], ort_eval("Not", [b], {}, 18, [BOOL])[0])


# --- binary and variadic -------------------------------------------------------------------

# op -> (value range, output is bool, ulp bound)
BINARY: dict[str, tuple[tuple[float, float], bool, int]] = {
    "Add": ((-1e4, 1e4), False, 0),
    "Sub": ((-1e4, 1e4), False, 0),
    "Mul": ((-1e4, 1e4), False, 0),
    "Div": ((-1e4, 1e4), False, 0),
    "Equal": ((-3, 3), True, 0),
    "Less": ((-3, 3), True, 0),
    "LessOrEqual": ((-3, 3), True, 0),
    "Greater": ((-3, 3), True, 0),
    "GreaterOrEqual": ((-3, 3), True, 0),
    "And": ((0, 1), True, 0),
    "Or": ((0, 1), True, 0),
    "Xor": ((0, 1), True, 0),
    "BitwiseAnd": ((-1e9, 1e9), False, 0),
    "BitwiseOr": ((-1e9, 1e9), False, 0),
    "BitwiseXor": ((-1e9, 1e9), False, 0),
    "PRelu": ((-100, 100), False, 0),
}


@functools.lru_cache(maxsize=None)
def _binary_dtypes(op: str) -> list[np.dtype]:
    out_bool = BINARY[op][1]
    return [
        d
        for d in refimpl_dtypes(op, 18)
        if ort_supports(op, 18, (d, d), BOOL if out_bool else d)
    ]


def _full_range(dtype: np.dtype, lo: float, hi: float) -> tuple[float, float]:
    if dtype in INTS:  # integers use their whole range to exercise wraparound
        return np.iinfo(dtype).min, np.iinfo(dtype).max
    return lo, hi


@pytest.mark.parametrize("op", sorted(BINARY))
@settings(max_examples=20)
@given(data=st.data())
def test_binary_matches_ort(op: str, data: st.DataObject) -> None:
    """Exactly rounded arithmetic and comparisons are bit-exact, with broadcasting."""
    (lo, hi), out_bool, ulps = BINARY[op]
    dtype = data.draw(st.sampled_from(_binary_dtypes(op)), label="dtype")
    if op == "PRelu":  # slope broadcasts to X only (unidirectional)
        x_shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, max_side=4))
        s_shape = x_shape[data.draw(st.integers(0, len(x_shape))):]
        shape_a, shape_b = x_shape, s_shape
    else:
        shape_a, shape_b = data.draw(hnp.mutually_broadcastable_shapes(num_shapes=2, max_side=4)).input_shapes
    lo_a, hi_a = _full_range(dtype, lo, hi) if op not in ("PRelu",) else (lo, hi)
    a = data.draw(arrays(dtype, shape_a, lo_a, hi_a), label="a")
    b = data.draw(arrays(dtype, shape_b, lo_a, hi_a), label="b")
    if op == "Div" and dtype in INTS:
        b = np.where(b == 0, 1, b).astype(dtype)
        if dtype.kind == "i":  # INT_MIN / -1 traps in C
            b = np.where(b == -1, 2, b).astype(dtype)
    (actual,) = refimpl.run(op, [a, b], opset=18)
    (expected,) = ort_eval(op, [a, b], {}, 18, [BOOL if out_bool else dtype])
    assert_same(actual, expected, ulps=ulps)


@pytest.mark.parametrize("fmod", [0, 1])
@settings(max_examples=30)
@given(data=st.data())
def test_mod_matches_ort(fmod: int, data: st.DataObject) -> None:
    """Mod: fmod=0 floors the quotient (sign of the divisor), fmod=1 truncates (C fmod)."""
    choices = [d for d in INTS if ort_supports("Mod", 18, (d, d), d, (("fmod", fmod),))]
    if fmod:
        choices += [d for d in FLOATS if ort_supports("Mod", 18, (d, d), d, (("fmod", 1),))]
    dtype = data.draw(st.sampled_from(choices), label="dtype")
    shape_a, shape_b = data.draw(hnp.mutually_broadcastable_shapes(num_shapes=2, max_side=4)).input_shapes
    a = data.draw(arrays(dtype, shape_a, -1000, 1000))
    b = data.draw(arrays(dtype, shape_b, -50, 50))
    b = np.where(b == 0, 7, b).astype(dtype)
    (actual,) = refimpl.run("Mod", [a, b], {"fmod": fmod}, opset=18)
    assert_same(actual, ort_eval("Mod", [a, b], {"fmod": fmod}, 18, [dtype])[0])


@settings(max_examples=40)
@given(data=st.data())
def test_pow_matches_ort(data: st.DataObject) -> None:
    """Pow with mixed base/exponent types; float bases within 2 ulps (float16: 3).

    Integer results stay below 2**53, where onnxruntime's detour through double is exact.
    """
    base_types = [np.dtype(t) for t in (np.float16, np.float32, np.float64, np.int32, np.int64)]
    exp_types = [np.dtype(t) for t in (np.float32, np.float64, np.int32, np.int64)]
    bt = data.draw(st.sampled_from(base_types), label="base")
    et = data.draw(st.sampled_from(exp_types), label="exponent")
    assume(ort_supports("Pow", 15, (bt, et), bt))
    shape_a, shape_b = data.draw(hnp.mutually_broadcastable_shapes(num_shapes=2, max_side=3)).input_shapes
    x = data.draw(arrays(bt, shape_a, 0.5 if bt in FLOATS else -9, 9))
    y = data.draw(arrays(et, shape_b, -4 if bt in FLOATS else 0, 4))
    if bt in INTS and et in FLOATS:
        y = np.asarray(np.abs(np.round(y)), dtype=et)  # integer powers: no NaN/undefined truncation
    (actual,) = refimpl.run("Pow", [x, y], opset=15)
    (expected,) = ort_eval("Pow", [x, y], {}, 15, [bt])
    assert_same(actual, expected, ulps=3 if bt == np.float16 else 2)


@pytest.mark.parametrize("op", ["Sum", "Mean", "Max", "Min"])
@settings(max_examples=20)
@given(data=st.data())
def test_variadic_matches_ort(op: str, data: st.DataObject) -> None:
    """1-4 broadcast inputs; Max/Min exact, Sum/Mean within 2 ulps (onnxruntime adds pairwise)."""
    dtypes = [d for d in refimpl_dtypes(op, 13) if ort_supports(op, 13, (d, d), d)]
    dtype = data.draw(st.sampled_from(dtypes), label="dtype")
    n = data.draw(st.integers(1, 4), label="n")
    shapes_ = data.draw(hnp.mutually_broadcastable_shapes(num_shapes=n, max_side=3)).input_shapes
    lo, hi = _full_range(dtype, -1e3, 1e3)
    xs = [data.draw(arrays(dtype, s, lo, hi)) for s in shapes_]
    try:
        (actual,) = refimpl.run(op, xs, opset=13)
    except UndefinedResultError:
        assert op in ("Max", "Min")  # +0 against -0: onnxruntime's choice depends on the position
        return
    (expected,) = ort_eval(op, xs, {}, 13, [dtype])
    slack = 0.0 if op in ("Max", "Min") else 4 * 2.0**-23 * sum(float(np.max(np.abs(x.astype(np.float64)), initial=0)) for x in xs)
    assert_same(actual, expected, ulps=0 if op in ("Max", "Min") else 2, slack=slack)


def test_max_min_propagate_nan_like_ort() -> None:
    a = np.array([1.0, np.nan, np.nan], np.float32)
    b = np.array([np.nan, 2.0, np.nan], np.float32)
    for op in ("Max", "Min"):
        assert_same(refimpl.run(op, [a, b], opset=13)[0], ort_eval(op, [a, b], {}, 13, [np.float32])[0])


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@settings(max_examples=20)
@given(data=st.data())
def test_bitshift_matches_ort(direction: str, data: st.DataObject) -> None:
    unsigned = [d for d in INTS if d.kind == "u"]
    dtype = data.draw(st.sampled_from(unsigned))
    bits = dtype.itemsize * 8
    x = data.draw(arrays(dtype, (5,), 0, 2**bits - 1))
    y = data.draw(arrays(dtype, (5,), 0, bits - 1))  # shifts >= width are undefined before 28
    attrs = {"direction": direction}
    assert_same(refimpl.run("BitShift", [x, y], attrs, opset=18)[0], ort_eval("BitShift", [x, y], attrs, 18, [dtype])[0])


# --- Clip, Where, Cast ---------------------------------------------------------------------


@settings(max_examples=30)
@given(data=st.data())
def test_clip_matches_ort(data: st.DataObject) -> None:
    """Clip-13 with either bound omitted (and min > max), and Clip-6 with attributes."""
    dtypes = [d for d in refimpl_dtypes("Clip", 13) if ort_supports("Clip", 13, (d, d, d), d)]
    dtype = data.draw(st.sampled_from(dtypes), label="dtype")
    x = data.draw(arrays(dtype, shapes, -100, 100), label="x")
    lo = data.draw(st.none() | arrays(dtype, (), -100, 100), label="min")
    hi = data.draw(st.none() | arrays(dtype, (), -100, 100), label="max")
    inputs = [x, lo, hi]
    (actual,) = refimpl.run("Clip", inputs, opset=13)
    assert_same(actual, ort_eval("Clip", inputs, {}, 13, [dtype])[0])
    if dtype == np.float32 and lo is not None and hi is not None:
        # onnxruntime implements Clip-6 for float32 only and rejects min > max there.
        attrs = {"min": float(min(lo, hi)), "max": float(max(lo, hi))}
        (actual6,) = refimpl.run("Clip", [x], attrs, opset=6)
        assert_same(actual6, ort_eval("Clip", [x], attrs, 6, [dtype])[0])


@settings(max_examples=20)
@given(data=st.data())
def test_where_matches_ort(data: st.DataObject) -> None:
    dtypes = [d for d in refimpl_dtypes("Where", 16) if ort_supports("Where", 16, (BOOL, d, d), d)]
    dtype = data.draw(st.sampled_from(dtypes), label="dtype")
    sc, sx, sy = data.draw(hnp.mutually_broadcastable_shapes(num_shapes=3, max_side=3)).input_shapes
    c = data.draw(arrays(BOOL, sc))
    x, y = data.draw(arrays(dtype, sx)), data.draw(arrays(dtype, sy))
    try:
        (actual,) = refimpl.run("Where", [c, x, y], opset=16)
    except UndefinedResultError:
        selected = np.where(c, x, y)
        assert np.any((selected == 0) & np.signbit(selected))  # a -0: onnxruntime may give +0
        return
    assert_same(actual, ort_eval("Where", [c, x, y], {}, 16, [dtype])[0])


_CAST_TYPES = tuple(d for d in (*FLOATS, *INTS, BOOL) if d != BF16)


@pytest.mark.parametrize("src", _CAST_TYPES, ids=str)
@settings(max_examples=10)
@given(data=st.data())
def test_cast_matches_ort(src: np.dtype, data: st.DataObject) -> None:
    """Numeric casts agree bit for bit where the spec defines them (in-range floats to ints)."""
    to = data.draw(st.sampled_from(_CAST_TYPES), label="to")
    attrs = {"to": _elem(to)}
    assume(ort_supports("Cast", 19, (src,), to, _freeze(attrs)))
    lo, hi = (-1e6, 1e6)
    if src in FLOATS and to in INTS:  # keep float -> int in range (otherwise undefined)
        info = np.iinfo(to)
        lo, hi = max(lo, float(info.min)), min(hi, float(info.max))
    x = data.draw(arrays(src, shapes, lo, hi), label="x")
    if src in FLOATS and to in INTS:  # the bound itself may round out of range (32767 -> 32768 in float16)
        assume(np.all((x.astype(np.float64) > info.min - 1) & (x.astype(np.float64) < info.max + 1)))
    (actual,) = refimpl.run("Cast", [x], attrs, opset=19)
    assert_same(actual, ort_eval("Cast", [x], attrs, 19, [to])[0])
    like = np.zeros((0,), to)
    (actual_like,) = refimpl.run("CastLike", [x, like], opset=19)
    assert_same(actual_like, actual)


@pytest.mark.parametrize("saturate", [0, 1])
def test_cast_float8_e4m3fn_matches_ort(saturate: int) -> None:
    x = np.array([2.5, -2.5, 448, 449, 464, 1e6, -1e6, 57344, np.inf, -np.inf, np.nan, 1e-9], np.float32)
    attrs = {"to": onnx.TensorProto.FLOAT8E4M3FN, "saturate": saturate}
    (actual,) = refimpl.run("Cast", [x], attrs, opset=19)
    (expected,) = ort_eval("Cast", [x], attrs, 19, [ml_dtypes.float8_e4m3fn])
    np.testing.assert_array_equal(actual.view(np.uint8), expected.view(np.uint8))


@pytest.mark.parametrize(
    ("to", "top", "overflow"),
    [
        (ml_dtypes.float8_e4m3fn, 448.0, np.nan),
        (ml_dtypes.float8_e4m3fnuz, 240.0, np.nan),
        (ml_dtypes.float8_e5m2, 57344.0, np.inf),
        (ml_dtypes.float8_e5m2fnuz, 57344.0, np.nan),
    ],
    ids=["e4m3fn", "e4m3fnuz", "e5m2", "e5m2fnuz"],
)
def test_cast_float8_follows_the_spec_tables(to: Any, top: float, overflow: float) -> None:
    """Saturate: +-inf and [x] > FLT_MAX -> +-FLT_MAX; otherwise NaN (inf for E5M2).

    480 rounds (at e4m3fn's mantissa width) to 480 > 448, so without saturation it is NaN;
    onnxruntime returns 448 there, against the spec's table.
    """
    x = np.array([np.inf, -np.inf, 1e6, 480.0, np.nan], np.float32)
    code = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(to))
    (sat,) = refimpl.run("Cast", [x], {"to": code, "saturate": 1}, opset=19)
    np.testing.assert_array_equal(sat.astype(np.float64)[:3], [top, -top, top])
    assert np.isnan(sat.astype(np.float64)[4])
    (raw,) = refimpl.run("Cast", [x], {"to": code, "saturate": 0}, opset=19)
    raw = raw.astype(np.float64)
    if np.isnan(overflow):
        assert np.all(np.isnan(raw[[0, 1, 2, 4]]))
    else:
        np.testing.assert_array_equal(raw[:3], [np.inf, -np.inf, np.inf])
    if to == ml_dtypes.float8_e4m3fn:
        assert np.isnan(raw[3])


def test_cast_double_to_bfloat16_rounds_once() -> None:
    """2**24 + 2**16 + 1 rounds up to 2**24 + 2**17; rounding via float32 first gives 2**24."""
    x = np.array([2.0**24 + 2.0**16 + 1.0, -(2.0**24 + 2.0**16 + 1.0)], np.float64)
    (out,) = refimpl.run("Cast", [x], {"to": onnx.TensorProto.BFLOAT16}, opset=19)
    np.testing.assert_array_equal(out.astype(np.float64), [2.0**24 + 2.0**17, -(2.0**24 + 2.0**17)])


@pytest.mark.parametrize(
    ("x", "to"),
    [
        (np.array([np.nan], np.float32), onnx.TensorProto.INT32),
        (np.array([np.inf], np.float32), onnx.TensorProto.INT64),
        (np.array([3e9], np.float32), onnx.TensorProto.INT32),
        (np.array([-1.0], np.float32), onnx.TensorProto.UINT8),
    ],
)
def test_cast_undefined_float_to_int_is_refused(x: np.ndarray, to: int) -> None:
    with pytest.raises(RefImplError, match="Cast"):
        refimpl.run("Cast", [x], {"to": to}, opset=19)


# --- errors --------------------------------------------------------------------------------


def test_unsupported_op_or_version_raises_lookup_error() -> None:
    with pytest.raises(UnsupportedOpError):
        refimpl.run("NoSuchOp", [np.zeros(1)], opset=18)
    with pytest.raises(LookupError):  # Cast-1 (opset 5) took a string 'to'; not implemented
        refimpl.run("Cast", [np.zeros(1)], {"to": "FLOAT"}, opset=5)
    with pytest.raises(UnsupportedOpError):  # ReduceSum has no schema at opset 0
        refimpl.run("ReduceSum", [np.zeros(1)], opset=0)


@pytest.mark.parametrize(
    ("op", "inputs", "attrs", "opset"),
    [
        ("ReduceSum", [np.zeros((2, 3), np.float32), np.array([2])], {}, 18),
        ("ReduceMax", [np.zeros((2, 3), np.float32), np.array([-3])], {}, 18),
        ("ReduceL2", [np.zeros((2, 3), np.float32)], {"axes": [5]}, 13),
        ("ReduceMean", [np.zeros((2, 3), np.float32), np.array([1, -1])], {}, 18),
        ("Add", [np.zeros(2, np.float32), np.zeros(2, np.float64)], {}, 18),
        ("Add", [np.zeros(2, np.float32), np.zeros(3, np.float32)], {}, 18),
        ("Sqrt", [np.zeros(2, np.int32)], {}, 18),
        ("Div", [np.ones(2, np.int32), np.array([1, 0], np.int32)], {}, 18),
        ("Mod", [np.ones(2, np.float32), np.ones(2, np.float32)], {"fmod": 0}, 18),
        ("Clip", [np.ones(2, np.float32), np.ones(2, np.float32)], {}, 13),
        ("Cast", [np.ones(2, np.float32)], {}, 19),
        ("Cast", [np.ones(2, np.float32)], {"to": 12345}, 19),  # no such type
        ("Where", [np.ones(2, bool), np.zeros(3, np.float32), np.zeros(2, np.float32)], {}, 16),
        ("Sum", [np.zeros(2), np.zeros(3)], {}, 13),
        ("Pow", [np.zeros(2, np.float32), np.zeros(3, np.float32)], {}, 15),
    ],
)
def test_bad_input_raises_refimpl_error_naming_the_op(
    op: str, inputs: list[Any], attrs: dict[str, Any], opset: int
) -> None:
    with pytest.raises(RefImplError, match=op):
        refimpl.run(op, inputs, attrs, opset=opset)


def test_outputs_are_arrays_of_the_input_dtype_even_for_scalars() -> None:
    """0-d inputs give 0-d ndarrays (not numpy scalars) and numpy promotion never leaks."""
    a, b = np.array(127, np.int8), np.array(1, np.int8)
    (out,) = refimpl.run("Add", [a, b], opset=18)
    assert isinstance(out, np.ndarray) and out.dtype == np.int8 and out == -128
    (out,) = refimpl.run("ReduceSum", [np.array(2.5, np.float16)], {"keepdims": 0}, opset=18)
    assert isinstance(out, np.ndarray) and out.dtype == np.float16 and out.shape == ()
