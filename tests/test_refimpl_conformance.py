"""refimpl against the onnx backend node test cases (the expected outputs are the oracle).

Every non-expanded case whose model is a single node of an op that refimpl implements at the
case's opset is one test, named by the case. Expected failures come from
``refimpl_xfail_a.EXPECTED_FAILURES`` and ``refimpl_xfail_b.EXPECTED_FAILURES``.
"""

from __future__ import annotations

import functools
import importlib
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import onnx.backend.test.case.node as node_cases
import onnx.numpy_helper
import pytest

import refimpl
from refimpl_xfail_a import EXPECTED_FAILURES as _XFAIL_A


def _expected_failures() -> dict[str, str]:
    merged = dict(_XFAIL_A)
    try:
        other = importlib.import_module("refimpl_xfail_b")
    except ModuleNotFoundError:
        return merged
    overlap = merged.keys() & other.EXPECTED_FAILURES.keys()
    assert not overlap, f"cases listed in both xfail files: {sorted(overlap)}"
    merged.update(other.EXPECTED_FAILURES)
    return merged


EXPECTED_FAILURES = _expected_failures()


@functools.lru_cache(maxsize=1)
def _all_cases() -> tuple[Any, ...]:
    """Every onnx node test case, collected once per session (it takes ~8 s)."""
    with warnings.catch_warnings():
        # The case generators compute their expected values with numpy and warn about inf/NaN.
        warnings.simplefilter("ignore", RuntimeWarning)
        return tuple(node_cases.collect_testcases())


def _opset(model: onnx.ModelProto) -> int:
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


def _implemented(op_type: str, opset: int) -> bool:
    try:
        refimpl.lookup(op_type, opset)
    except LookupError:
        return False
    return True


@functools.lru_cache(maxsize=1)
def single_node_cases() -> dict[str, Any]:
    """Cases whose model is one default-domain node that refimpl implements, by name."""
    selected = {}
    for case in _all_cases():
        nodes = case.model.graph.node
        if case.name.endswith("_expanded") or len(nodes) != 1:
            continue
        if nodes[0].domain not in ("", "ai.onnx"):
            continue
        if _implemented(nodes[0].op_type, _opset(case.model)):
            selected[case.name] = case
    return selected


def _to_numpy(value: Any) -> Any:
    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    return value


def _attribute(attr: onnx.AttributeProto) -> Any:
    value = onnx.helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    if isinstance(value, list):
        return [v.decode("utf-8") if isinstance(v, bytes) else v for v in value]
    return value


def _node_inputs(case: Any, inputs: Sequence[Any]) -> list[Any]:
    """The node's inputs in schema order; an omitted optional input (``""``) is None."""
    by_name = {vi.name: _to_numpy(v) for vi, v in zip(case.model.graph.input, inputs)}
    node = case.model.graph.node[0]
    return [by_name[name] if name else None for name in node.input]


def _params() -> list[Any]:
    params = []
    for name, case in single_node_cases().items():
        marks = []
        if name in EXPECTED_FAILURES:
            # Only a refusal counts (a verdict on the inputs, or a mode the kernel does not
            # implement): a KernelBugError or a wrong value fails the test.
            reason = EXPECTED_FAILURES[name]
            marks.append(pytest.mark.xfail(strict=True, raises=(refimpl.RefImplError, refimpl.UnsupportedOpError),
                                           reason=reason))
        params.append(pytest.param(case, id=name, marks=marks))
    return params


def _assert_matches(actual: Any, expected: Any, rtol: float, atol: float) -> None:
    """Same dtype and shape, NaN in the same places, values within the case's tolerance."""
    if isinstance(expected, list):  # sequence-typed values compare element by element
        assert isinstance(actual, list) and len(actual) == len(expected)
        for a, e in zip(actual, expected):
            _assert_matches(a, e, rtol, atol)
        return
    expected = np.asarray(_to_numpy(expected))
    assert isinstance(actual, np.ndarray), f"output is a {type(actual).__name__}"
    assert actual.dtype == expected.dtype, f"dtype {actual.dtype} != {expected.dtype}"
    assert actual.shape == expected.shape, f"shape {actual.shape} != {expected.shape}"
    if expected.dtype == object or expected.dtype.kind in "biu":
        np.testing.assert_array_equal(actual, expected)
        return
    a = actual.astype(np.float64)
    e = expected.astype(np.float64)
    np.testing.assert_array_equal(np.isnan(a), np.isnan(e), err_msg="NaN positions differ")
    np.testing.assert_allclose(a, e, rtol=rtol, atol=atol, equal_nan=True)


@pytest.mark.parametrize("case", _params())
def test_conformance(case: Any) -> None:
    node = case.model.graph.node[0]
    opset = _opset(case.model)
    attributes = {a.name: _attribute(a) for a in node.attribute}
    for inputs, expected in case.data_sets:
        # Kernels whose output count is not implied by their inputs (Split) need num_outputs.
        outputs = refimpl.run(
            node.op_type,
            _node_inputs(case, inputs),
            attributes,
            opset=opset,
            num_outputs=len(node.output),
        )
        assert len(outputs) >= len(expected)
        for actual, want in zip(outputs, expected):
            _assert_matches(actual, want, case.rtol, case.atol)


def test_expected_failures_are_collected() -> None:
    """Every listed expected failure names a case that this module actually runs."""
    stale = sorted(set(EXPECTED_FAILURES) - set(single_node_cases()))
    assert not stale, f"expected failures that are not collected: {stale}"


def test_every_registered_op_has_a_case_when_onnx_has_one() -> None:
    """A kernel whose op has single-node onnx cases must be covered by at least one of them."""
    ops_with_cases = {
        case.model.graph.node[0].op_type
        for case in _all_cases()
        if len(case.model.graph.node) == 1 and not case.name.endswith("_expanded")
    }
    covered = {case.model.graph.node[0].op_type for case in single_node_cases().values()}
    registered = {op for domain, op, _, _ in refimpl.supported() if domain == ""}
    missing = sorted((registered & ops_with_cases) - covered)
    assert not missing, f"ops with onnx cases that no collected case exercises: {missing}"
