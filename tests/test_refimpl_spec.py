"""refimpl against the examples of the operator pages in ``tests/spec``.

Each example runs through ``refimpl.run`` at the page's opset; the reduce pages' examples also
run at opset 13 in the attribute form (``axes`` as an attribute) wherever that form can say the
same thing (opset 13 has no ``noop_with_empty_axes``). The pages print about 8 significant
digits, hence the tight relative tolerance.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import refimpl
from helpers import SPEC_ERRATA, SpecExample, spec_examples

RTOL = 1e-6
ATOL = 1e-7


def _attribute_form(example: SpecExample) -> tuple[list[Any], dict[str, Any]] | None:
    """The opset-13 (axes attribute) spelling of an opset-18 reduce example, if it has one."""
    attributes = {k: v for k, v in example.attributes.items() if k != "noop_with_empty_axes"}
    inputs = example.input_list()
    if len(inputs) > 1:
        axes = inputs[1].ravel().tolist()
        if not axes and example.attributes.get("noop_with_empty_axes", 0):
            return None  # opset 13 cannot express a reduction over no axes
        if axes:
            attributes["axes"] = axes
    return inputs[:1], attributes


def _cases() -> list[Any]:
    params = []
    for ex in spec_examples():
        marks = []
        if ex.name in SPEC_ERRATA:
            marks.append(pytest.mark.xfail(reason=SPEC_ERRATA[ex.name], strict=True))  # the page's error still fails
        params.append(
            pytest.param(ex, ex.opset, ex.input_list(), ex.attributes, id=ex.name, marks=marks)
        )
        if ex.op_type.startswith("Reduce") and ex.opset >= 18:
            form = _attribute_form(ex)
            if form is not None:
                params.append(pytest.param(ex, 13, *form, id=f"{ex.name}-opset13-attr"))
    return params


def _assert_close(actual: np.ndarray, expected: np.ndarray) -> None:
    assert actual.dtype == expected.dtype
    assert actual.shape == expected.shape
    if expected.dtype.kind in "biu":
        np.testing.assert_array_equal(actual, expected)
    else:
        np.testing.assert_allclose(
            actual.astype(np.float64), expected.astype(np.float64), rtol=RTOL, atol=ATOL
        )


@pytest.mark.parametrize(("example", "opset", "inputs", "attributes"), _cases())
def test_spec_example(
    example: SpecExample, opset: int, inputs: list[Any], attributes: dict[str, Any]
) -> None:
    outputs = refimpl.run(example.op_type, inputs, attributes, opset=opset)
    expected = example.output_list()
    assert len(outputs) == len(expected)
    for actual, want in zip(outputs, expected):
        _assert_close(actual, want)


def test_spec_pages_have_examples() -> None:
    """The parser found the pages: a silent empty parametrisation would test nothing."""
    ops = {ex.op_type for ex in spec_examples()}
    assert {"Abs", "ReduceL2", "ReduceLogSumExp"} <= ops
    assert len(spec_examples()) >= 40


# --- the pages' prose, where the examples do not reach ----------------------------------------

F32 = np.float32


@pytest.mark.parametrize("opset", [13, 18])
def test_reduce_log_sum_exp_prose_empty_set_is_minus_infinity(opset: int) -> None:
    """"Reduction over an empty set of values yields minus infinity"."""
    data = np.zeros((0, 3), F32)
    if opset >= 18:
        (out,) = refimpl.run("ReduceLogSumExp", [data, np.array([0])], {"keepdims": 0}, opset=opset)
    else:
        (out,) = refimpl.run("ReduceLogSumExp", [data], {"axes": [0], "keepdims": 0}, opset=opset)
    assert out.dtype == F32 and out.shape == (3,)
    assert np.all(np.isneginf(out))


def test_reduce_log_sum_exp_is_stable_for_large_values() -> None:
    """log(e^x + e^x) = x + log 2 must not overflow to inf for x = 1e4 or 3e38 in float32."""
    data = np.array([[1e4, 1e4], [3e38, 3e38]], F32)
    (out,) = refimpl.run("ReduceLogSumExp", [data, np.array([1])], {"keepdims": 0}, opset=18)
    assert out.dtype == F32
    assert out[0] == F32(1e4 + np.log(2.0))
    assert out[1] == F32(3e38)


def test_reduce_log_sum_exp_infinities_and_nan() -> None:
    """All -inf gives -inf, any +inf gives +inf, NaN propagates, -inf entries add nothing."""
    inf = np.inf
    data = np.array(
        [[-inf, -inf, -inf], [1.0, inf, 2.0], [1.0, np.nan, 2.0], [-inf, 0.0, 0.0], [inf, -inf, 0]],
        F32,
    )
    (out,) = refimpl.run("ReduceLogSumExp", [data, np.array([-1])], {"keepdims": 0}, opset=18)
    assert np.isneginf(out[0])
    assert np.isposinf(out[1])
    assert np.isnan(out[2])
    assert out[3] == F32(np.log(2.0))
    assert np.isposinf(out[4])


@pytest.mark.parametrize(
    ("op", "expected"),
    [("ReduceL2", [[1.0, 2.0], [3.0, 4.0]]), ("ReduceLogSumExp", [[1.0, -2.0], [3.0, -4.0]])],
)
def test_noop_with_empty_axes_keeps_elementwise_steps(op: str, expected: list[Any]) -> None:
    """noop_with_empty_axes=1 with empty axes reduces over no axis: L2 of one value is |x|."""
    data = np.array([[1.0, -2.0], [3.0, -4.0]], F32)
    (out,) = refimpl.run(op, [data, np.array([], np.int64)], {"noop_with_empty_axes": 1}, opset=18)
    np.testing.assert_array_equal(out, np.array(expected, F32))
