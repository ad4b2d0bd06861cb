"""The onnxruntime before/after check.

Runs the original and the optimised model in onnxruntime (CPU, every graph
optimisation disabled so that onnxruntime's own rewrites cannot hide a bug) on
the same inputs and compares every output by name: same dtype and shape,
integers and booleans exactly equal, floats equal within a dtype-aware
tolerance with NaN in the same places and infinities equal.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import tempfile
from collections.abc import Iterator, Mapping
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort

from passes.errors import first_line as _first_line
from passes.limits import PROTOBUF_LIMIT
from passes.verify.compare import compare
from passes.verify.result import (
    DEFAULT_DIM,
    MAX_GENERATED_BYTES,
    TOLERANCES,
    CheckResult,
    OutputComparison,
)

__all__ = ["DEFAULT_DIM", "TOLERANCES", "CheckResult", "OutputComparison", "check", "make_inputs"]

_ORT_TYPES: dict[str, Any] = {
    "tensor(float)": np.float32,
    "tensor(double)": np.float64,
    "tensor(float16)": np.float16,
    "tensor(bfloat16)": ml_dtypes.bfloat16,
    "tensor(int8)": np.int8,
    "tensor(int16)": np.int16,
    "tensor(int32)": np.int32,
    "tensor(int64)": np.int64,
    "tensor(uint8)": np.uint8,
    "tensor(uint16)": np.uint16,
    "tensor(uint32)": np.uint32,
    "tensor(uint64)": np.uint64,
    "tensor(bool)": np.bool_,
    "tensor(string)": np.str_,
}

@contextlib.contextmanager
def _ort_source(model: Any) -> Iterator[str | bytes]:
    """What ``ort.InferenceSession`` accepts for ``model``: a path or serialized bytes."""
    if isinstance(model, (str, os.PathLike)):
        yield os.fspath(model)
        return
    if isinstance(model, bytes):
        yield model
        return
    if isinstance(model, ir.Model):
        from passes import modelio  # local import: modelio imports nothing from here

        with tempfile.TemporaryDirectory(prefix="optimize-check-") as tmp:
            path = pathlib.Path(tmp) / "model.onnx"
            modelio.save_model(model, path)
            yield str(path)
        return
    if isinstance(model, onnx.ModelProto):
        if model.ByteSize() < PROTOBUF_LIMIT:
            yield model.SerializeToString()
            return
        with tempfile.TemporaryDirectory(prefix="optimize-check-") as tmp:
            path = pathlib.Path(tmp) / "model.onnx"
            onnx.save_model(model, str(path), save_as_external_data=True, location="model.onnx.data")
            yield str(path)
        return
    raise TypeError(f"cannot run a {type(model).__name__} in onnxruntime")


def _session(source: str | bytes) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4  # fatal only: its errors are reported as our one line
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def _run_options() -> ort.RunOptions:
    options = ort.RunOptions()
    options.log_severity_level = 4  # a failing kernel is reported once, in the check's result
    return options


def make_inputs(
    session: ort.InferenceSession,
    *,
    dims: Mapping[str, int] | None = None,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Generates seeded inputs for every graph input of ``session``.

    Floats are standard normal, integers uniform in [0, 4) so that index-like
    inputs stay valid, booleans fair coins. A dynamic dimension takes its size
    from ``dims`` by name, else :data:`DEFAULT_DIM`.

    Raises:
        ValueError: an input has a type that cannot be generated (sequence, map...).
    """
    dims = dict(dims or {})
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    total = 0
    for arg in session.get_inputs():
        dtype = _ORT_TYPES.get(arg.type)
        if dtype is None:
            raise ValueError(f"cannot generate input {arg.name!r} of type {arg.type}; pass --inputs")
        shape = []
        for d in arg.shape:
            if isinstance(d, int) and d >= 0:
                shape.append(d)
            elif isinstance(d, str) and d in dims:
                shape.append(int(dims[d]))
            else:
                shape.append(DEFAULT_DIM)
        total += int(np.prod(shape, dtype=np.float64)) * (8 if dtype is np.str_ else np.dtype(dtype).itemsize)
        if total > MAX_GENERATED_BYTES:
            raise ValueError(
                f"generating input {arg.name!r} of shape {shape} would exceed "
                f"{MAX_GENERATED_BYTES >> 20} MiB; pass --inputs or smaller --dim sizes"
            )
        if dtype is np.bool_:
            value = rng.random(shape) < 0.5
        elif dtype is np.str_:
            value = rng.choice(np.array(["a", "bc", "def"], dtype=object), size=shape)
        elif np.issubdtype(np.dtype(dtype), np.integer):
            value = rng.integers(0, 4, size=shape).astype(dtype)
        else:
            value = rng.standard_normal(shape).astype(np.float32).astype(dtype)
        feeds[arg.name] = np.asarray(value)
    return feeds


def _compare(
    name: str, expected: Any, actual: Any, rtol: float | None, atol: float | None
) -> OutputComparison:
    """Compares with the tolerance of the output's dtype (unless given), exactly for other types."""
    kind = str(expected.dtype) if isinstance(expected, np.ndarray) else "float32"  # ZipMap's floats
    if kind not in TOLERANCES:
        return compare(name, expected, actual, None, None)
    default_rtol, default_atol = TOLERANCES[kind]
    return compare(name, expected, actual, default_rtol if rtol is None else rtol,
                   default_atol if atol is None else atol)  # fmt: skip


def check(
    original: Any,
    optimized: Any,
    *,
    inputs: Mapping[str, np.ndarray] | None = None,
    dims: Mapping[str, int] | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    seed: int = 0,
) -> CheckResult:
    """Runs both models in onnxruntime on the same inputs and compares every output.

    Args:
        original: The reference model: a path, serialized bytes, an ``onnx.ModelProto``
            or an ``onnx_ir.Model``.
        optimized: The model to check, in any of the same forms.
        inputs: Input arrays by name; missing ones are generated (see :func:`make_inputs`).
        dims: Sizes for named dynamic dimensions of generated inputs.
        rtol: Relative tolerance for float outputs; default per dtype (:data:`TOLERANCES`).
        atol: Absolute tolerance for float outputs; default per dtype.
        seed: Seed of the generated inputs.

    Returns:
        A :class:`CheckResult`; ``ok`` is False if any output differs or the
        optimised model fails to run where the original ran.
    """
    # onnxruntime raises its own exception types (Fail, InvalidGraph,
    # NotImplemented, ...) that share no base class but Exception; at this
    # boundary any of them means "this model does not run", which is reported.
    with _ort_source(original) as source:
        try:
            session = _session(source)
        except Exception as e:  # noqa: BLE001
            return CheckResult(True, skipped=f"the original model does not load in onnxruntime: {_first_line(e)}")
        try:
            feeds = make_inputs(session, dims=dims, seed=seed)
        except ValueError as e:
            if not inputs:
                return CheckResult(True, skipped=str(e))
            feeds = {}
        if inputs:
            feeds.update({k: np.asarray(v) for k, v in inputs.items()})
        expected_names = [o.name for o in session.get_outputs()]
        try:
            expected = session.run(None, feeds, _run_options())
        except Exception as e:  # noqa: BLE001
            given = " on the given inputs" if inputs else ""
            return CheckResult(
                True,
                skipped=f"the original model does not run in onnxruntime{given}: {_first_line(e)}",
                inputs_rejected=bool(inputs),
            )
        del session
    with _ort_source(optimized) as source:
        try:
            opt_session = _session(source)
            opt_names = [o.name for o in opt_session.get_outputs()]
            wanted = {i.name for i in opt_session.get_inputs()}
            actual = opt_session.run(None, {k: v for k, v in feeds.items() if k in wanted}, _run_options())
        except Exception as e:  # noqa: BLE001
            return CheckResult(False, error=_first_line(e))
    by_name = dict(zip(opt_names, actual))
    comparisons = []
    for name, value in zip(expected_names, expected):
        if name not in by_name:
            comparisons.append(OutputComparison(name, False, message="missing from the optimised model"))
            continue
        comparisons.append(_compare(name, value, by_name[name], rtol, atol))
    for name in opt_names:
        if name not in expected_names:
            comparisons.append(OutputComparison(name, False, message="not an output of the original model"))
    return CheckResult(all(c.ok for c in comparisons), outputs=comparisons)
