"""Sweep: refimpl against onnxruntime on edge values, bit for bit.

For every elementwise, reduction, ArgMax/ArgMin, Gemm/MatMul/Einsum, Clip and Pow kernel refimpl
registers, random small arrays drawn from edge values (+-0, NaN, +-inf, subnormals, the float
maximum, integer extremes, empty dims; lengths up to 9 so that onnxruntime's vector loops and
their scalar tails both run) go through ``refimpl.run`` and through onnxruntime (CPU, graph
optimisations off). A kernel that raises a RefImplError declines (the node stays unfolded,
which is always safe); a kernel that returns must agree with onnxruntime:

  * same dtype and shape; integers and bools equal;
  * floats: NaN in the same places; every other element the same bits (so the sign of zero and
    infinities included). The NaN payload and sign are not compared.

Ops whose kernels evaluate transcendental functions (``approximate``), and float16 sums (which
onnxruntime accumulates in float16 in its own order), may differ from onnxruntime by rounding;
for them only a difference in the NaN/inf pattern or the sign of zero, or one over 64 ulps,
counts.

Run: ``python tests/ort_edge_sweep.py [examples per case] [seed]``; it prints every
disagreement (op, inputs, attributes, both results) and exits 1 if there was one. The hypothesis
property ``tests/test_edge_values.py`` and the sweep share :func:`same_bits` and the edge pools.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper

sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
from helpers import ort_run  # noqa: E402

import refimpl  # noqa: E402

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
FLOAT_DTYPES = (F32, F16, F64)
INT_DTYPES = tuple(np.dtype(t) for t in (np.int8, np.uint8, np.int32, np.uint32, np.int64, np.uint64, np.int16))


def edge_pool(dtype: np.dtype) -> np.ndarray:
    """The edge values of ``dtype`` (floats: +-0, NaN, +-inf, subnormals, extremes, small ints)."""
    if dtype.kind == "f":
        info = np.finfo(dtype)
        values = [0.0, -0.0, math.nan, math.inf, -math.inf, float(info.smallest_subnormal),
                  -float(info.smallest_subnormal), float(info.max), -float(info.max),
                  float(info.tiny), 1.0, -1.0, 2.0, 0.5, -0.5, 2.5, -3.0]  # fmt: skip
        return np.array(values, dtype=dtype)
    if dtype.kind == "b":
        return np.array([False, True])
    info = np.iinfo(dtype)
    values = {int(info.min), int(info.max), 0, 1, 2, 3, int(info.max) - 1, int(info.min) + 1}
    if info.min < 0:
        values |= {-1, -2, -3}
    return np.array(sorted(values), dtype=dtype)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal dtype, shape and elements; floats: NaN in the same places, other elements bit-equal."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.kind != "f":
        return bool(np.array_equal(a, b))
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    if not np.array_equal(nan_a, nan_b):
        return False
    view = {2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    return bool(np.array_equal(np.where(nan_a, 0, a.view(view)), np.where(nan_b, 0, b.view(view))))


def close_class(a: np.ndarray, b: np.ndarray, ulps: int = 64) -> bool:
    """Same NaN/inf pattern and signs (zeros included); finite elements within ``ulps``."""
    if a.dtype != b.dtype or a.shape != b.shape or a.dtype.kind != "f":
        return same_bits(a, b)
    if not np.array_equal(np.isnan(a), np.isnan(b)):
        return False
    ok = ~np.isnan(a)
    if not np.array_equal(np.signbit(a[ok]), np.signbit(b[ok])) or not np.array_equal(np.isinf(a[ok]), np.isinf(b[ok])):
        return False
    view = {2: np.int16, 4: np.int32, 8: np.int64}[a.dtype.itemsize]
    ia, ib = a[ok].view(view).astype(object), b[ok].view(view).astype(object)
    return all(abs(int(x) - int(y)) <= ulps for x, y in zip(ia.tolist(), ib.tolist()))


def ort_node(op: str, inputs: Sequence[np.ndarray | None], attrs: dict[str, Any], opset: int,
             out_dtypes: Sequence[np.dtype]) -> list[np.ndarray]:  # fmt: skip
    """Runs one node in onnxruntime with every input a graph input."""
    names, feeds, vis = [], {}, []
    for i, a in enumerate(inputs):
        if a is None:
            names.append("")
            continue
        names.append(f"in{i}")
        feeds[f"in{i}"] = a
        vis.append(helper.make_tensor_value_info(f"in{i}", helper.np_dtype_to_tensor_dtype(a.dtype), a.shape))
    outs = [helper.make_tensor_value_info(f"out{i}", helper.np_dtype_to_tensor_dtype(d), None)
            for i, d in enumerate(out_dtypes)]  # fmt: skip
    node = helper.make_node(op, names, [o.name for o in outs], **attrs)
    graph = helper.make_graph([node], "sweep", vis, outs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    return ort_run(model, feeds)


@dataclasses.dataclass(frozen=True)
class Case:
    """One op to sweep: how to draw its inputs and attributes, and its output dtypes."""

    op: str
    draw: Callable[[np.random.Generator], tuple[list[np.ndarray | None], dict[str, Any]]]
    opset: int = 21
    out: Callable[[list[Any]], list[np.dtype]] = lambda inputs: [inputs[0].dtype]
    approximate: bool = False


def _shape(rng: np.random.Generator, rank: int | None = None, empty: bool = True) -> tuple[int, ...]:
    rank = int(rng.integers(0, 4)) if rank is None else rank
    top = 9 if rank <= 1 else 4
    dims = [int(rng.integers(1, top + 1)) for _ in range(rank)]
    if empty and dims and rng.random() < 0.05:
        dims[int(rng.integers(0, rank))] = 0
    return tuple(dims)


def draw_array(rng: np.random.Generator, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """An array of ``shape`` whose elements are drawn from ``edge_pool(dtype)``."""
    pool = edge_pool(dtype)
    return rng.choice(pool, size=shape).astype(dtype)


def _sub_shape(rng: np.random.Generator, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts to ``shape`` (some dims 1, maybe fewer leading dims)."""
    dims = [d if rng.random() < 0.6 else 1 for d in shape]
    return tuple(dims[int(rng.integers(0, len(dims) + 1)):])


def _float_dtype(rng: np.random.Generator) -> np.dtype:
    return FLOAT_DTYPES[int(rng.integers(0, len(FLOAT_DTYPES)))]


def _dtype(rng: np.random.Generator, ints: bool = True) -> np.dtype:
    if ints and rng.random() < 0.35:
        return INT_DTYPES[int(rng.integers(0, len(INT_DTYPES)))]
    return _float_dtype(rng)


def unary(op: str, attrs: Callable[[np.random.Generator], dict[str, Any]] = lambda rng: {},
          *, ints: bool = False, approximate: bool = False, opset: int = 21,
          to_bool: bool = False) -> Case:  # fmt: skip
    def draw(rng: np.random.Generator) -> tuple[list[Any], dict[str, Any]]:
        dtype = _dtype(rng, ints)
        return [draw_array(rng, dtype, _shape(rng))], attrs(rng)

    out = (lambda inputs: [np.dtype(bool)]) if to_bool else (lambda inputs: [inputs[0].dtype])
    return Case(op, draw, opset, out, approximate)


def nary(op: str, n: tuple[int, int] = (2, 2), *, ints: bool = True, to_bool: bool = False,
         attrs: Callable[[np.random.Generator], dict[str, Any]] = lambda rng: {},
         floats_only: bool = False) -> Case:  # fmt: skip
    def draw(rng: np.random.Generator) -> tuple[list[Any], dict[str, Any]]:
        dtype = _float_dtype(rng) if floats_only else _dtype(rng, ints)
        shape = _shape(rng)
        count = int(rng.integers(n[0], n[1] + 1))
        return [draw_array(rng, dtype, _sub_shape(rng, shape)) for _ in range(count)], attrs(rng)

    out = (lambda inputs: [np.dtype(bool)]) if to_bool else (lambda inputs: [inputs[0].dtype])
    return Case(op, draw, 21, out)


def reduce(op: str, *, ints: bool = True, approximate: bool = False) -> Case:
    def draw(rng: np.random.Generator) -> tuple[list[Any], dict[str, Any]]:
        dtype = _dtype(rng, ints)
        x = draw_array(rng, dtype, _shape(rng, int(rng.integers(1, 4))))
        axes = [a for a in range(x.ndim) if rng.random() < 0.5]
        attrs = {"keepdims": int(rng.integers(0, 2))}
        if rng.random() < 0.2:
            attrs["noop_with_empty_axes"] = 1
        return [x, np.array(axes, np.int64) if axes or rng.random() < 0.5 else None], attrs

    return Case(op, draw, 18, approximate=approximate)


def arg(op: str) -> Case:
    def draw(rng: np.random.Generator) -> tuple[list[Any], dict[str, Any]]:
        dtype = _dtype(rng)
        x = draw_array(rng, dtype, _shape(rng, int(rng.integers(1, 4)), empty=False))
        attrs = {"axis": int(rng.integers(-x.ndim, x.ndim)), "keepdims": int(rng.integers(0, 2)),
                 "select_last_index": int(rng.integers(0, 2))}  # fmt: skip
        return [x], attrs

    return Case(op, draw, 13, lambda inputs: [np.dtype(np.int64)])


def _gemm(rng: np.random.Generator) -> tuple[list[Any], dict[str, Any]]:
    dtype = FLOAT_DTYPES[int(rng.integers(0, 3))] if rng.random() < 0.8 else np.dtype(np.int64)
    if dtype == F16:
        dtype = F32  # onnxruntime has no float16 Gemm on CPU
    m, k, n = (int(rng.integers(1, 4)) for _ in range(3))
    a, b = draw_array(rng, dtype, (m, k)), draw_array(rng, dtype, (k, n))
    c = draw_array(rng, dtype, _sub_shape(rng, (m, n))) if rng.random() < 0.8 else None
    attrs: dict[str, Any] = {}
    if dtype.kind == "f":
        attrs["alpha"] = float(rng.choice([1.0, 0.0, -1.0, 0.5]))
        attrs["beta"] = float(rng.choice([1.0, 0.0, -1.0, 2.0]))
    return [a, b, c], attrs


def _matmul(rng: np.random.Generator) -> tuple[list[Any], dict[str, Any]]:
    dtype = rng.choice([F32, F64, np.dtype(np.int32), np.dtype(np.int64)])
    m, k, n = (int(rng.integers(1, 4)) for _ in range(3))
    return [draw_array(rng, dtype, (m, k)), draw_array(rng, dtype, (k, n))], {}


def _einsum(rng: np.random.Generator) -> tuple[list[Any], dict[str, Any]]:
    dtype = rng.choice([F32, F64, np.dtype(np.int32), np.dtype(np.int64)])
    n = int(rng.integers(1, 4))
    equation = str(rng.choice(["ii->", "ii->i", "ij->", "ij->i", "i,i->", "ij,jk->ik"]))
    if equation.startswith("ii") or equation.startswith("ij"):
        inputs = [draw_array(rng, dtype, (n, n))]
        if "," in equation:
            inputs.append(draw_array(rng, dtype, (n, n)))
    else:
        inputs = [draw_array(rng, dtype, (n,)), draw_array(rng, dtype, (n,))]
    return inputs, {"equation": equation}


def _pow(rng: np.random.Generator) -> tuple[list[Any], dict[str, Any]]:
    dtype = _dtype(rng)
    if dtype in (np.dtype(np.uint8), np.dtype(np.int8), np.dtype(np.uint16), np.dtype(np.int16)):
        dtype = np.dtype(np.int32)
    shape = _shape(rng)
    base = draw_array(rng, dtype, _sub_shape(rng, shape))
    if dtype.kind in "iu":
        small = np.array([0, 1, 2, 3, 5, 20, 31, 40, 62, 63, 64], dtype=dtype)
        exponent = rng.choice(small, size=_sub_shape(rng, shape)).astype(dtype)
        if rng.random() < 0.3:
            exponent = exponent.astype(np.float32)
        base = rng.choice(np.array([0, 1, 2, 3, 7, -1, -2, -3] if dtype.kind == "i" else [0, 1, 2, 3, 7],
                                   dtype=dtype), size=base.shape).astype(dtype)  # fmt: skip
    else:
        exponent = draw_array(rng, dtype, _sub_shape(rng, shape))
    return [base, exponent], {}


def _clip(rng: np.random.Generator) -> tuple[list[Any], dict[str, Any]]:
    dtype = _dtype(rng)
    if dtype in (np.dtype(np.int16), np.dtype(np.uint16)):
        dtype = np.dtype(np.int32)
    x = draw_array(rng, dtype, _shape(rng))
    lo = draw_array(rng, dtype, ()) if rng.random() < 0.7 else None
    hi = draw_array(rng, dtype, ()) if rng.random() < 0.7 else None
    return [x, lo, hi], {}


def _where(rng: np.random.Generator) -> tuple[list[Any], dict[str, Any]]:
    dtype = _dtype(rng)
    shape = _shape(rng)
    cond = rng.random(_sub_shape(rng, shape)) < 0.5
    return [np.asarray(cond), draw_array(rng, dtype, _sub_shape(rng, shape)),
            draw_array(rng, dtype, _sub_shape(rng, shape))], {}  # fmt: skip


def _cast(rng: np.random.Generator) -> tuple[list[Any], dict[str, Any]]:
    src = _float_dtype(rng)
    to = int(rng.choice([onnx.TensorProto.INT8, onnx.TensorProto.UINT8, onnx.TensorProto.INT32,
                         onnx.TensorProto.INT64, onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT,
                         onnx.TensorProto.DOUBLE]))  # fmt: skip
    pool = np.concatenate([edge_pool(src), np.array([1.5, -1.5, 127.5, 255.5, -128.5, 300.0], src)])
    return [rng.choice(pool, size=_shape(rng)).astype(src)], {"to": to}


def _f(name: str, *values: float) -> Callable[[np.random.Generator], dict[str, Any]]:
    return lambda rng: {name: float(rng.choice(values))}


CASES: list[Case] = [
    *(unary(op, ints=op in ("Abs", "Neg", "Sign")) for op in
      ("Abs", "Neg", "Floor", "Ceil", "Round", "Sign", "Relu", "Sqrt", "Reciprocal")),
    *(unary(op, approximate=True) for op in
      ("Exp", "Log", "Tanh", "Sigmoid", "Erf", "Sin", "Cos", "Atan", "Sinh", "Cosh", "Asinh",
       "Softplus", "Softsign", "HardSwish", "Mish")),
    unary("LeakyRelu", _f("alpha", 0.01, 0.0, -1.0), approximate=True),
    unary("HardSigmoid", lambda rng: {"alpha": float(rng.choice([0.2, 0.0])), "beta": float(rng.choice([0.5, 0.0]))},
          approximate=True),
    unary("Elu", _f("alpha", 1.0, 0.5), approximate=True),
    unary("Selu", approximate=True),
    unary("Celu", _f("alpha", 1.0, 2.0), approximate=True),
    unary("ThresholdedRelu", _f("alpha", 1.0, 0.0, -1.0), approximate=True),
    unary("IsNaN", to_bool=True),
    unary("IsInf", to_bool=True),
    *(nary(op) for op in ("Add", "Sub", "Mul")),
    nary("Div"),
    nary("Mod", attrs=lambda rng: {"fmod": 1}),
    nary("Mod", attrs=lambda rng: {"fmod": 0}),
    nary("PRelu", floats_only=True),
    *(nary(op, to_bool=True) for op in ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual")),
    *(nary(op, (1, 4)) for op in ("Max", "Min")),
    *(nary(op, (1, 3), floats_only=True) for op in ("Sum", "Mean")),
    *(reduce(op) for op in ("ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceSumSquare")),
    reduce("ReduceMean", ints=False),
    *(reduce(op, ints=False, approximate=True) for op in ("ReduceL2", "ReduceLogSum", "ReduceLogSumExp")),
    arg("ArgMax"),
    arg("ArgMin"),
    Case("Gemm", _gemm, 13),
    Case("MatMul", _matmul, 13),
    Case("Einsum", _einsum, 13),
    Case("Pow", _pow, 15),
    Case("Clip", _clip, 13),
    Case("Where", _where, 16, lambda inputs: [inputs[1].dtype]),
    Case("Cast", _cast, 21, lambda inputs: []),
]


def _cast_out(attrs: dict[str, Any]) -> list[np.dtype]:
    return [np.dtype(helper.tensor_dtype_to_np_dtype(attrs["to"]))]


def run_case(case: Case, rng: np.random.Generator) -> str | None:
    """One example; a description of the disagreement, or None (agreement or a decline)."""
    inputs, attrs = case.draw(rng)
    try:
        ours = refimpl.run(case.op, list(inputs), attrs, opset=case.opset)
    except (refimpl.RefImplError, refimpl.UnsupportedOpError):
        return None
    out = _cast_out(attrs) if case.op == "Cast" else case.out(inputs)
    while len(inputs) > 1 and inputs[-1] is None:
        inputs = inputs[:-1]
    try:
        theirs = ort_node(case.op, inputs, attrs, case.opset, out)
    except Exception as e:  # noqa: BLE001  onnxruntime refuses what refimpl computed
        if "NOT_IMPLEMENTED" in str(e):
            return None  # onnxruntime has no kernel for this type: the original cannot run either
        return f"{case.op} {attrs} {[None if a is None else a.tolist() for a in inputs]}: onnxruntime fails: {e}"[:600]
    # float16 sums: onnxruntime accumulates in float16 in its own order, not correctly rounded.
    half_sum = case.op.startswith("Reduce") and case.op not in ("ReduceMax", "ReduceMin") and inputs[0].dtype == F16
    agree = close_class if case.approximate or half_sum else same_bits
    for a, b in zip(ours, theirs):
        if not agree(np.asarray(a), np.asarray(b)):
            shown = [None if x is None else (x.dtype.name, x.tolist()) for x in inputs]
            return f"{case.op} {attrs} {shown}\n    refimpl     {np.asarray(a).tolist()}\n    onnxruntime {np.asarray(b).tolist()}"
    return None


def sweep(examples: int = 200, seed: int = 0, ops: Sequence[str] | None = None) -> dict[str, list[str]]:
    """Runs every case ``examples`` times; the disagreements by op."""
    found: dict[str, list[str]] = {}
    with np.errstate(all="ignore"):
        for index, case in enumerate(CASES):
            if ops and case.op not in ops:
                continue
            rng = np.random.default_rng([seed, index])
            for _ in range(examples):
                problem = run_case(case, rng)
                if problem:
                    found.setdefault(case.op, []).append(problem)
    return found


def main(argv: Sequence[str]) -> int:
    examples = int(argv[1]) if len(argv) > 1 else 200
    seed = int(argv[2]) if len(argv) > 2 else 0
    ops = argv[3].split(",") if len(argv) > 3 else None
    found = sweep(examples, seed, ops)
    for op, problems in found.items():
        print(f"== {op}: {len(problems)} disagreements")
        for p in problems[:3]:
            print("  ", p)
    return 1 if found else 0


if __name__ == "__main__":
    import warnings

    warnings.simplefilter("ignore")
    sys.exit(main(sys.argv))
