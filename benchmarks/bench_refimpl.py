"""Per-call overhead of ``refimpl.run`` against the onnx ReferenceEvaluator and onnxruntime.

Constant folding evaluates many tiny nodes, so what matters is the fixed cost of one call on a
small input. For each case the script times, in one run:

  * ``refimpl.run(op, inputs, attributes, opset=...)``;
  * ``onnx.reference.ReferenceEvaluator(model).run(None, feeds)``, the evaluator built once;
  * ``onnxruntime.InferenceSession(model).run(None, feeds)``, the session built once
    (CPU, graph optimisations off, one thread);
  * the numpy floor: the bare numpy call(s) that compute the result, which any numpy
    implementation has to make. ``RefEval / floor`` bounds the ratio refimpl can reach.

Usage:
    python benchmarks/bench_refimpl.py [--number N] [--repeat R] [--json PATH]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys
import timeit
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx.reference import ReferenceEvaluator

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import refimpl  # noqa: E402
import harness  # noqa: E402  (this folder)

OPSET = 18
Arrays = Sequence[np.ndarray]


@dataclasses.dataclass(frozen=True)
class Case:
    """One node to time: its op, inputs (name, array), attributes, output dtype and numpy floor."""

    name: str
    op_type: str
    inputs: Sequence[tuple[str, np.ndarray]]
    attributes: dict[str, Any]
    out_dtype: Any
    floor: Callable[[Arrays], Any]


def _log_sum_exp(x: np.ndarray) -> np.ndarray:
    wide = x.astype(np.float64)
    shift = np.maximum.reduce(wide, None, None, None, True)
    return (np.log(np.add.reduce(np.exp(wide - shift), None)) + shift.reshape(())).astype(x.dtype)


def _cases() -> list[Case]:
    f32 = np.arange(4, dtype=np.float32) - 1.5
    mat = np.arange(12, dtype=np.float32).reshape(3, 4)
    shape = np.array([2, 3, 4], np.int64)
    to_int64 = {"to": onnx.TensorProto.INT64}
    # fmt: off
    return [
        Case("Add float32 (4,)", "Add", [("a", f32), ("b", f32 * 2)], {}, np.float32,
             lambda a: np.add(a[0], a[1])),
        Case("Mul int64 (4,)", "Mul", [("a", np.arange(4)), ("b", np.arange(4))], {}, np.int64,
             lambda a: np.multiply(a[0], a[1])),
        Case("Abs float32 (4,)", "Abs", [("x", f32)], {}, np.float32, lambda a: np.abs(a[0])),
        Case("Cast float32->int64 (4,)", "Cast", [("x", f32)], to_int64, np.int64,
             lambda a: a[0].astype(np.int64)),
        Case("ReduceSum (3,4) axes=[1]", "ReduceSum", [("x", mat), ("axes", np.array([1]))],
             {"keepdims": 0}, np.float32, lambda a: np.add.reduce(a[0], 1)),
        Case("ReduceMax (3,4) axes=[0]", "ReduceMax", [("x", mat), ("axes", np.array([0]))],
             {"keepdims": 1}, np.float32, lambda a: np.maximum.reduce(a[0], 0, None, None, True)),
        Case("ReduceLogSumExp (3,4) all", "ReduceLogSumExp", [("x", mat)], {"keepdims": 0},
             np.float32, lambda a: _log_sum_exp(a[0])),
        Case("Where float32 (4,)", "Where", [("c", f32 > 0), ("x", f32), ("y", -f32)], {},
             np.float32, lambda a: np.where(a[0], a[1], a[2])),
        Case("Shape (2,3,4)", "Shape", [("x", np.zeros((2, 3, 4), np.float32))], {}, np.int64,
             lambda a: np.array(a[0].shape, np.int64)),
        Case("Gather int64 (3,) scalar index", "Gather", [("x", shape), ("i", np.array(1))],
             {"axis": 0}, np.int64, lambda a: a[0][a[1]]),
        Case("Concat int64 3x(1,)", "Concat",
             [("a", shape[:1]), ("b", shape[1:2]), ("c", np.array([-1]))], {"axis": 0}, np.int64,
             lambda a: np.concatenate(a, 0)),
        Case("Unsqueeze int64 () axes=[0]", "Unsqueeze", [("x", np.array(7)), ("axes", np.array([0]))],
             {}, np.int64, lambda a: a[0].reshape(1)),
        Case("Reshape float32 (2,3,4)->(6,-1)", "Reshape",
             [("x", np.zeros((2, 3, 4), np.float32)), ("shape", np.array([6, -1]))], {}, np.float32,
             lambda a: a[0].reshape(6, -1)),
    ]
    # fmt: on


def _model(case: Case) -> onnx.ModelProto:
    inputs = [
        onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
        for n, a in case.inputs
    ]
    output = onnx.helper.make_tensor_value_info(
        "out", onnx.helper.np_dtype_to_tensor_dtype(np.dtype(case.out_dtype)), None
    )
    node = onnx.helper.make_node(case.op_type, [n for n, _ in case.inputs], ["out"], **case.attributes)
    graph = onnx.helper.make_graph([node], "bench", inputs, [output])
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", OPSET)])


def _best_us(engines: dict[str, Callable[[], Any]], number: int, repeat: int) -> dict[str, float]:
    """Microseconds per call: the best of ``repeat`` runs of ``number`` calls for each engine.

    The engines take turns within every round, so a burst of load on the machine hits all of
    them alike instead of skewing one column.
    """
    best = dict.fromkeys(engines, float("inf"))
    for _ in range(repeat):
        for name, fn in engines.items():
            best[name] = min(best[name], timeit.timeit(fn, number=number) / number * 1e6)
    return best


def measure(case: Case, number: int, repeat: int) -> dict[str, Any]:
    """Times one case in all three engines and the numpy floor, and checks they agree."""
    model = _model(case)
    feeds = dict(case.inputs)
    arrays = [a for _, a in case.inputs]
    reference = ReferenceEvaluator(model)
    session = harness.ort_session(model)
    ours = refimpl.run(case.op_type, arrays, case.attributes, opset=OPSET)[0]
    for other in (session.run(None, feeds)[0], reference.run(None, feeds)[0], case.floor(arrays)):
        np.testing.assert_allclose(ours, other, rtol=1e-6)
    engines = {
        "refimpl_us": lambda: refimpl.run(case.op_type, arrays, case.attributes, opset=OPSET),
        "reference_evaluator_us": lambda: reference.run(None, feeds),
        "onnxruntime_us": lambda: session.run(None, feeds),
        "numpy_floor_us": lambda: case.floor(arrays),
    }
    times = _best_us(engines, number, repeat)
    times["reference_evaluator_ratio"] = times["reference_evaluator_us"] / times["refimpl_us"]
    times["onnxruntime_ratio"] = times["onnxruntime_us"] / times["refimpl_us"]
    times["reference_evaluator_ratio_bound"] = times["reference_evaluator_us"] / times["numpy_floor_us"]
    return {"case": case.name, **times}


def _table(rows: Sequence[dict[str, Any]]) -> str:
    header = (
        f"{'case':34} {'refimpl µs':>10} {'RefEval µs':>10} {'ratio':>7} {'ORT µs':>8} "
        f"{'ratio':>7} {'numpy floor µs':>14} {'bound':>7}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r['case']:34} {r['refimpl_us']:10.2f} {r['reference_evaluator_us']:10.2f} "
            f"{r['reference_evaluator_ratio']:6.1f}x {r['onnxruntime_us']:8.2f} "
            f"{r['onnxruntime_ratio']:6.1f}x {r['numpy_floor_us']:14.2f} "
            f"{r['reference_evaluator_ratio_bound']:6.1f}x"
        )
    lines.append("ratio: engine µs / refimpl µs; bound: RefEval µs / numpy floor µs, the best ratio")
    lines.append("any implementation reaches that makes those numpy calls (see the module docstring).")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=200, help="calls per timing run")
    parser.add_argument("--repeat", type=int, default=40, help="timing runs; the best is kept")
    parser.add_argument("--json", type=pathlib.Path, help="also write the numbers to this file")
    args = parser.parse_args(argv)
    rows = [measure(case, args.number, args.repeat) for case in _cases()]
    print(_table(rows))  # the script's report
    if args.json:
        payload = {"numpy": np.__version__, "onnx": onnx.__version__, "onnxruntime": ort.__version__, "rows": rows}
        args.json.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
