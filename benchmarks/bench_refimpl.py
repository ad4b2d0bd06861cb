"""Per-call overhead of ``refimpl.run`` against the onnx ReferenceEvaluator and onnxruntime.

Constant folding evaluates many tiny nodes, so what matters is the fixed cost of one call on a
small input. For each case the script times, in one run:

  * ``refimpl.run(op, inputs, attributes, opset=...)``;
  * ``onnx.reference.ReferenceEvaluator(model).run(None, feeds)``, the evaluator built once;
  * ``onnxruntime.InferenceSession(model).run(None, feeds)``, the session built once
    (CPU, graph optimisations off, one thread).

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

OPSET = 18


@dataclasses.dataclass(frozen=True)
class Case:
    """One node to time: its op, inputs (name, array), attributes and output dtype."""

    name: str
    op_type: str
    inputs: Sequence[tuple[str, np.ndarray]]
    attributes: dict[str, Any]
    out_dtype: Any


def _cases() -> list[Case]:
    f32 = np.arange(4, dtype=np.float32) - 1.5
    mat = np.arange(12, dtype=np.float32).reshape(3, 4)
    return [
        Case("Add float32 (4,)", "Add", [("a", f32), ("b", f32 * 2)], {}, np.float32),
        Case("Mul int64 (4,)", "Mul", [("a", np.arange(4)), ("b", np.arange(4))], {}, np.int64),
        Case("Abs float32 (4,)", "Abs", [("x", f32)], {}, np.float32),
        Case("Cast float32->int64 (4,)", "Cast", [("x", f32)], {"to": onnx.TensorProto.INT64}, np.int64),
        Case("ReduceSum (3,4) axes=[1]", "ReduceSum", [("x", mat), ("axes", np.array([1]))], {"keepdims": 0}, np.float32),
        Case("ReduceMax (3,4) axes=[0]", "ReduceMax", [("x", mat), ("axes", np.array([0]))], {"keepdims": 1}, np.float32),
        Case("ReduceLogSumExp (3,4) all", "ReduceLogSumExp", [("x", mat)], {"keepdims": 0}, np.float32),
        Case("Where float32 (4,)", "Where", [("c", f32 > 0), ("x", f32), ("y", -f32)], {}, np.float32),
    ]


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


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


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
    """Times one case in all three engines and checks they agree."""
    model = _model(case)
    feeds = dict(case.inputs)
    arrays = [a for _, a in case.inputs]
    reference = ReferenceEvaluator(model)
    session = _session(model)
    ours = refimpl.run(case.op_type, arrays, case.attributes, opset=OPSET)[0]
    np.testing.assert_allclose(ours, session.run(None, feeds)[0], rtol=1e-6)
    np.testing.assert_allclose(ours, reference.run(None, feeds)[0], rtol=1e-6)
    engines = {
        "refimpl_us": lambda: refimpl.run(case.op_type, arrays, case.attributes, opset=OPSET),
        "reference_evaluator_us": lambda: reference.run(None, feeds),
        "onnxruntime_us": lambda: session.run(None, feeds),
    }
    times = _best_us(engines, number, repeat)
    times["reference_evaluator_ratio"] = times["reference_evaluator_us"] / times["refimpl_us"]
    times["onnxruntime_ratio"] = times["onnxruntime_us"] / times["refimpl_us"]
    return {"case": case.name, **times}


def _table(rows: Sequence[dict[str, Any]]) -> str:
    header = f"{'case':30} {'refimpl µs':>11} {'ReferenceEvaluator µs':>22} {'ratio':>7} {'onnxruntime µs':>15} {'ratio':>7}"
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r['case']:30} {r['refimpl_us']:11.2f} {r['reference_evaluator_us']:22.2f} "
            f"{r['reference_evaluator_ratio']:6.1f}x {r['onnxruntime_us']:15.2f} {r['onnxruntime_ratio']:6.1f}x"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=500, help="calls per timing run")
    parser.add_argument("--repeat", type=int, default=15, help="timing runs; the best is kept")
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
