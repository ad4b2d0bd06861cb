"""One output against another, chunk by chunk; and the report's strict JSON."""

from __future__ import annotations

import json

import numpy as np
import pytest

from passes.verify import compare as compare_module
from passes.verify.compare import compare
from passes.verify.result import CheckResult, OutputComparison, json_safe


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compare_module, "CHUNK", 7)  # every case spans several chunks


def test_floats_within_and_beyond_tolerance_across_chunks() -> None:
    e = np.linspace(-3, 3, 50, dtype=np.float32)
    assert compare("y", e, e.copy(), 1e-4, 1e-5).ok
    a = e.copy()
    a[45] += np.float32(1e-3)  # in the seventh chunk
    result = compare("y", e, a, 1e-4, 1e-5)
    assert not result.ok and result.mismatches == 1
    assert result.max_abs_error == pytest.approx(1e-3, rel=1e-2)
    assert "1 of 50 element(s) differ beyond rtol=0.0001" in result.message
    assert compare("y", e, a, 1e-2, 1e-2).ok


def test_nan_and_inf_must_be_in_the_same_places() -> None:
    e = np.array([1.0, np.nan, np.inf, -np.inf, 0.0] * 3, np.float32)
    assert compare("y", e, e.copy(), 1e-4, 1e-5).ok
    for i, value in [(1, 0.0), (2, 1e30), (3, np.inf), (4, np.nan)]:
        a = e.copy()
        a[i] = value
        assert not compare("y", e, a, 1e-4, 1e-5).ok, (i, value)


def test_exact_types_compare_in_their_own_dtype() -> None:
    e = np.arange(30, dtype=np.int64) * (1 << 40)
    a = e.copy()
    a[20] += 1  # a difference float64 would round away
    result = compare("i", e, a, None, None)
    assert not result.ok and result.mismatches == 1 and result.rtol is None
    strings = np.array(["a", "bc"] * 10, dtype=object)
    changed = strings.copy()
    changed[13] = "x"
    assert compare("s", strings, strings.copy(), None, None).ok
    assert compare("s", strings, changed, None, None).mismatches == 1
    # A float output without a tolerance is compared exactly, NaN equal to NaN.
    f = np.array([np.nan, 1.0] * 5, np.float16)
    assert compare("f", f, f.copy(), None, None).ok


def test_dtype_and_shape_must_match() -> None:
    e = np.zeros((2, 3), np.float32)
    assert "dtype float64" in compare("y", e, e.astype(np.float64), 1e-4, 1e-5).message
    assert "shape (3, 2)" in compare("y", e, e.reshape(3, 2), 1e-4, 1e-5).message


def test_sequences_and_maps_compare_their_leaves() -> None:
    e = [{"a": 0.5, "b": 1.5}, {"a": 2.0, "b": 0.0}]
    assert compare("m", e, [{"a": 0.5, "b": 1.5}, {"a": 2.0, "b": 0.0}], 1e-4, 1e-5).ok
    assert not compare("m", e, [{"a": 0.5, "b": 1.6}, {"a": 2.0, "b": 0.0}], 1e-4, 1e-5).ok
    assert "structure" in compare("m", e, [{"a": 0.5}], 1e-4, 1e-5).message


def test_an_infinite_error_is_strict_json() -> None:
    e = np.zeros(4, np.float32)
    result = compare("y", e, np.full(4, 10.0, np.float32), 1e-4, 1e-5)
    assert result.max_rel_error == float("inf")
    data = CheckResult(False, outputs=[result]).to_json()

    def refuse(name: str) -> None:
        raise AssertionError(name)

    text = json.dumps(data, allow_nan=False)
    assert json.loads(text, parse_constant=refuse)["outputs"][0]["max_rel_error"] == "inf"
    assert json_safe([float("nan"), -float("inf"), 1.5]) == ["nan", "-inf", 1.5]
    assert OutputComparison.from_json(result.to_json()).shape == (4,)


def test_the_sign_of_zero_must_match_where_both_are_zero() -> None:
    """-0 and +0 are different results (behind a Reciprocal: -inf and +inf), within a tolerance or not."""
    import ml_dtypes

    for dtype in (np.float32, np.float64, np.float16, ml_dtypes.bfloat16):
        e = np.array([0.0, -0.0, 1.0, np.nan] * 4, dtype)
        assert compare("y", e, e.copy(), 1e-4, 1e-5).ok and compare("y", e, e.copy(), None, None).ok
        a = e.copy()
        a[5] = 0.0  # -0 became +0
        for rtol, atol in ((1e-4, 1e-5), (None, None)):
            result = compare("y", e, a, rtol, atol)
            assert not result.ok and result.mismatches == 1, (dtype, result)
            assert "sign of zero" in result.message and result.max_abs_error == 0
    # A NaN's sign bit is not a difference.
    e = np.array([np.nan, 1.0], np.float32)
    assert compare("y", e, -e, 1e-4, 1e-5).ok is False  # 1 vs -1 differs
    assert compare("y", e[:1], -e[:1], 1e-4, 1e-5).ok and compare("y", e[:1], -e[:1], None, None).ok


def test_normwise_lets_a_cancelled_sum_of_huge_terms_round_but_not_nan_inf_or_zero_signs() -> None:
    """The edge-value sets: 1e30 * w1 - 1e30 * w2 rounds by ~1e23 wherever it lands, however small
    the result; within rtol of the output's largest magnitude it matches. NaN/inf and -0 stay exact."""
    e = np.array([1e30, 4.2e27, 1.0, -0.0, np.inf], np.float32)
    a = e.copy()
    a[1] += np.float32(4.5e23)  # rel error 1.07e-4 of its own value, 4.5e-7 of the largest
    assert not compare("y", e, a, 1e-4, 1e-5).ok
    result = compare("y", e, a, 1e-4, 1e-5, normwise=True)
    assert result.ok and result.within_scale == 1, result
    for i, value in [(3, 0.0), (4, -np.inf), (2, np.nan), (2, 1e27)]:
        b = e.copy()
        b[i] = value
        assert not compare("y", e, b, 1e-4, 1e-5, normwise=True).ok, (i, value)
