"""How far onnxruntime's CPU kernels of elementwise float32 ops are from refimpl's (correctly rounded) value.

fold confirms a folded value when onnxruntime's is within ``agree.ULPS`` units in the last place of
refimpl's (float64 then rounded once to float32, the correctly rounded value but for a double
rounding); an op whose kernel approximates beyond that is one whose values fold must take from
onnxruntime (``passes.fold.decide.APPROXIMATED``). Per op, over float32 inputs that cover the
whole line (every 2**k-th bit pattern, positive and negative), a dense grid of [-32, 32], ±0,
±inf, NaN, subnormals and the largest floats: the largest error in ULPs of the reference, where it
is, and the elements outside agree's bound (which fold declines as ``disagrees_with_onnxruntime``).

Then, for the ops it finds, whether the kernel's bits depend on how the tensor is cut (a tensor
evaluated whole and in parts, at several sizes and offsets: MLAS vectorises in blocks and a tail
may take a scalar path) or on the thread count (intra_op_num_threads 1, 2 and 4).

    python benchmarks/bench_kernel_ulps.py [--stride-bits 12] [--dtype float64] [--ops Sigmoid,Tanh] [--cut]
                                           [--quick] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import refimpl  # noqa: E402
from passes.fold.agree import agrees  # noqa: E402

#: Ops measured: (name, opset, attributes).
OPS: list[tuple[str, int, dict]] = [
    ("Sigmoid", 13, {}), ("Tanh", 13, {}), ("Exp", 13, {}), ("Log", 13, {}), ("Erf", 13, {}),
    ("Gelu", 20, {}), ("Gelu", 20, {"approximate": "tanh"}), ("Softplus", 18, {}), ("Softsign", 18, {}),
    ("Sin", 18, {}), ("Cos", 18, {}), ("Tan", 18, {}), ("Asin", 18, {}), ("Acos", 18, {}), ("Atan", 18, {}),
    ("Sinh", 18, {}), ("Cosh", 18, {}), ("Asinh", 18, {}), ("Acosh", 18, {}), ("Atanh", 18, {}),
    ("Elu", 18, {}), ("Selu", 18, {}), ("Celu", 18, {}), ("Mish", 18, {}), ("HardSigmoid", 18, {}),
    ("HardSwish", 18, {}), ("Sqrt", 13, {}), ("Reciprocal", 13, {}),
]  # fmt: skip


#: The dtypes measured: numpy's, onnx's, the largest finite bit pattern's successor (+inf) and its bits' type.
DTYPES = {
    "float32": (np.float32, TensorProto.FLOAT, 0x7F800000, np.uint32),
    "float64": (np.float64, TensorProto.DOUBLE, 0x7FF0000000000000, np.uint64),
    "float16": (np.float16, TensorProto.FLOAT16, 0x7C00, np.uint16),
}


def inputs(dtype: str, stride_bits: int) -> np.ndarray:
    """Floats over the whole line (every 2**k-th bit pattern), dense near 0, and the special values."""
    numpy, _, inf, bits = DTYPES[dtype]
    step = max(1, inf >> (31 - stride_bits))  # about 2**(31 - k) patterns whatever the width
    patterns = np.arange(0, inf, step, dtype=bits)
    positive = patterns.view(numpy)
    dense = np.linspace(-32, 32, 1 << 20).astype(numpy)
    info = np.finfo(numpy)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, info.smallest_subnormal, -info.smallest_subnormal,
                        info.tiny, -info.tiny, info.max, -info.max]).astype(numpy)  # fmt: skip
    return np.concatenate([positive, -positive, dense, special])


def session(op: str, opset: int, attrs: dict, threads: int = 1, elem: int = TensorProto.FLOAT) -> ort.InferenceSession:
    node = helper.make_node(op, ["x"], ["y"], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", elem, [None])],
                              [helper.make_tensor_value_info("y", elem, [None])])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


ELEM = {np.dtype(numpy): elem for numpy, elem, _, _ in DTYPES.values()}


def ulps(theirs: np.ndarray, ours: np.ndarray) -> np.ndarray:
    """|theirs - ours| in units of the last place of ours (0 where both are the same NaN/inf/zero)."""
    a, e = theirs.astype(np.float64), ours.astype(np.float64)
    with np.errstate(all="ignore"):
        spacing = np.maximum(np.spacing(np.abs(ours)).astype(np.float64), np.finfo(ours.dtype).smallest_subnormal)
        out = np.abs(a - e) / spacing
    same = (np.isnan(a) & np.isnan(e)) | (a == e)
    out[same] = 0.0
    out[np.isnan(out)] = np.inf
    return out


def measure(op: str, opset: int, attrs: dict, x: np.ndarray) -> tuple[str, float, float, np.ndarray, float]:
    """(name, largest error in ULPs, its x, the inputs outside agree's bound, the share not bit-exact)."""
    try:
        (ours,) = refimpl.run(op, [x], attrs, opset=opset)
    except refimpl.RefImplError:
        x = x[~((x < 0) & (x > -(2.0**-20)))]  # Elu/Selu/Celu decline their tiny negatives
        (ours,) = refimpl.run(op, [x], attrs, opset=opset)
    (theirs,) = session(op, opset, attrs, elem=ELEM[x.dtype]).run(None, {"x": x})
    error = ulps(theirs, ours)
    worst = int(np.argmax(error))
    a, e = theirs.astype(np.float64), ours.astype(np.float64)
    maybe = (error > 1) | (a == 0) | (e == 0) | ~np.isfinite(a) | ~np.isfinite(e)  # agree's exact places
    maybe &= ~((a == e) & (np.signbit(a) == np.signbit(e)) | np.isnan(a) & np.isnan(e))
    outside = [i for i in np.flatnonzero(maybe) if not agrees(ours[i : i + 1], theirs[i : i + 1])]
    name = op + ("(tanh)" if attrs else "")
    return name, float(error.max()), float(x[worst]), x[outside], float(np.mean(error > 0.5))


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit for bit, but any NaN equals any NaN (its payload and sign mean nothing to a model)."""
    nan = np.isnan(a)
    return bool(np.array_equal(nan, np.isnan(b))) and a[~nan].tobytes() == b[~nan].tobytes()


def cut_dependence(op: str, opset: int, attrs: dict, x: np.ndarray) -> list[str]:
    """Where the kernel's bits depend on the cut of the tensor or on the thread count."""
    found = []
    whole = {t: session(op, opset, attrs, t, ELEM[x.dtype]).run(None, {"x": x})[0] for t in (1, 2, 4)}
    for t in (2, 4):
        if not same_bits(whole[t], whole[1]):
            found.append(f"threads {t} vs 1")
    one = session(op, opset, attrs, elem=ELEM[x.dtype])
    for size in (1, 3, 7, 8, 15, 16, 17, 31, 33, 63, 65, 1000, 4097, 65537):
        for offset in (0, 1, 5, 13, 4099):
            if offset + size > x.size:
                continue
            part = one.run(None, {"x": x[offset : offset + size]})[0]
            if not same_bits(part, whole[1][offset : offset + size]):
                found.append(f"size {size} at {offset}")
    singles = np.concatenate([one.run(None, {"x": x[i : i + 1]})[0] for i in range(4096)])
    if not same_bits(singles, whole[1][:4096]):
        found.append("one at a time")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stride-bits", type=int, default=12, help="about 2**(31-k) bit patterns (default 12)")
    parser.add_argument("--quick", action="store_true", help="2**-16 of the bit patterns, the ops fold takes")
    parser.add_argument("--json", type=pathlib.Path, help="write the rows here as JSON")
    parser.add_argument("--ops", default="", help="comma-separated op names (default: all)")
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    parser.add_argument("--cut", action="store_true",
                        help="test the cut and threads on every op (default: where outside)")
    args = parser.parse_args(argv)
    wanted = set(filter(None, args.ops.split(",")))
    if args.quick:
        args.stride_bits = max(args.stride_bits, 16)
        wanted = wanted or {"Sigmoid", "Tanh", "Gelu", "HardSigmoid", "HardSwish", "Exp"}
    rows = []
    np.seterr(all="ignore")
    x = inputs(args.dtype, args.stride_bits)
    print(f"onnxruntime {ort.__version__}, {x.size} {args.dtype} inputs; agree.ULPS bound as fold's confirmation")
    print(f"{'op':<14} {'max ULPs':>14} {'at x':>14} {'outside agree':>14} {'not exact':>10}  cut/thread dependence")
    for op, opset, attrs in OPS:
        if wanted and op not in wanted:
            continue
        try:
            name, worst, at, outside, inexact = measure(op, opset, attrs, x)
        except Exception as e:  # noqa: BLE001  no kernel for this dtype
            print(f"{op:<14} {str(e).splitlines()[0][:90]}")
            rows.append({"op": op, "attributes": attrs, "error": str(e).splitlines()[0]})
            continue
        cut = []
        if outside.size or args.cut:  # where the value is onnxruntime's: the inputs outside, among the grid, shuffled
            rng = np.random.default_rng(0)
            sample = rng.choice(outside, 1 << 19) if outside.size else rng.choice(x, 1 << 19)
            grid = np.concatenate([sample, np.linspace(-40, 40, 1 << 19).astype(x.dtype)])
            cut = cut_dependence(op, opset, attrs, rng.permutation(grid))
        print(f"{name:<14} {worst:>14.4g} {at:>14.6g} {outside.size:>14} {inexact:>10.2%}  {', '.join(cut) or '-'}")
        rows.append({"op": name, "max_ulps": worst, "at": at, "outside": int(outside.size), "inexact": inexact,
                     "cut_dependence": cut})  # fmt: skip
    if args.json:
        payload = {"onnxruntime": ort.__version__, "dtype": args.dtype, "inputs": int(x.size), "rows": rows}
        args.json.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
