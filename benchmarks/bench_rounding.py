"""Measurements behind the fusions' rounding: how much a fusion changes, and where a change is amplified.

Three tables (figures quoted in docs/exactness.md and the README):

1. **accuracy**: a primitive LayerNorm / RMSNorm (as exporters write it) and its fused op, both run in
   onnxruntime (optimisations off, one thread), against float64 from the same float32 inputs, on rows of
   several kinds (normal, ``30·N(0,1) + 5``, rows whose mean dwarfs their spread such as
   ``1000 + 0.01·N(0,1)``): the max abs error of each against float64, the max abs difference between
   them, and the output's largest magnitude.
2. **amplification**: a fused LayerNorm on x ``[batch, 197, 192]`` (the guard off, so that the fusion is
   written) and what reads its result: ArgMax and TopK (k = 1, 5, 100, 1000) of 1000 logits, ArgMax of
   saturated Sigmoid scores, ArgMin of the row, ``Greater(·, 0)``, ``Cast(100·, int32)``,
   DynamicQuantizeLinear; for each batch size, how many rows (indices) or elements (the others) differ from
   the unfused model's. An op whose results differ at some sizes and not at others is one the check's single
   draw can miss.
3. **cost**: on the committed real models and those installed packages ship, the fusions the default
   passes write with the guard and without it, and what the guard declined (by reason).

Usage::

    python benchmarks/bench_rounding.py [--quick] [--json FILE]
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import pathlib
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper, numpy_helper

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import harness  # noqa: E402
from passes.ir import amplification  # noqa: E402
from passes.simplify import SimplifyPass  # noqa: E402

ROWS: dict[str, Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]] = {
    "N(0,1)": lambda rng, shape: rng.standard_normal(shape),
    "30·N(0,1) + 5": lambda rng, shape: 30 * rng.standard_normal(shape) + 5,
    "1000 + 0.01·N(0,1)": lambda rng, shape: 1000 + 0.01 * rng.standard_normal(shape),
    "1e4 + N(0,1)": lambda rng, shape: 1e4 + rng.standard_normal(shape),
    "1e5 + 0.1·N(0,1)": lambda rng, shape: 1e5 + 0.1 * rng.standard_normal(shape),
}


def _fused(model: onnx.ModelProto, guard: bool = True) -> onnx.ModelProto:
    """``model`` after the simplify pass (its fusions), with or without the amplification guard."""
    ir_model = ir.serde.deserialize_model(model)
    if guard:
        SimplifyPass()(ir_model)
    else:
        saved = amplification.Amplified.reason
        amplification.Amplified.reason = lambda self, value: None  # type: ignore[method-assign]
        try:
            SimplifyPass()(ir_model)
        finally:
            amplification.Amplified.reason = saved  # type: ignore[method-assign]
    return ir.serde.serialize_model(ir_model)


class Graph:
    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.count = 0

    def const(self, array: Any) -> str:
        self.count += 1
        name = f"k{self.count}"
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def op(self, op_type: str, *inputs: str, outputs: int = 1, out: list[str] | None = None, **attrs: Any) -> Any:
        self.count += 1
        names = out or [f"{op_type.lower()}{self.count}_{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), names, **attrs))
        return names[0] if len(names) == 1 else names

    def norm(self, x: str, width: int, kind: str, rng: np.random.Generator) -> str:
        """A primitive LayerNorm or RMSNorm over the last axis (opset 18 ReduceMean)."""
        axes = self.const(np.array([-1], np.int64))
        d = self.op("Sub", x, self.op("ReduceMean", x, axes)) if kind == "layer_norm" else x
        var = self.op("ReduceMean", self.op("Pow", d, self.const(np.float32(2))), axes)
        n = self.op("Div", d, self.op("Sqrt", self.op("Add", var, self.const(np.float32(1e-5)))))
        scaled = self.op("Mul", n, self.const(rng.uniform(0.5, 1.5, width).astype(np.float32)))
        if kind == "rms_norm":
            return scaled
        return self.op("Add", scaled, self.const(rng.uniform(-0.5, 0.5, width).astype(np.float32)))

    def model(self, x_shape: list[Any], outputs: list[tuple[str, int, list[Any]]], opset: int) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                                  [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
                                  initializer=self.initializers)  # fmt: skip
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


# --- 1. accuracy ---------------------------------------------------------------------------------------


def accuracy(widths: tuple[int, ...]) -> list[dict[str, Any]]:
    found = []
    for kind in ("layer_norm", "rms_norm"):
        for width in widths:
            rng = np.random.default_rng(width)
            graph = Graph()
            graph.op("Identity", graph.norm("x", width, kind, rng), out=["y"])
            original = graph.model(["batch", 64, width], [("y", TensorProto.FLOAT, ["batch", 64, width])], 23)
            fused = _fused(original)
            assert any(n.op_type in ("LayerNormalization", "RMSNormalization") for n in fused.graph.node)
            constants = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in original.graph.initializer}
            vectors = [v for v in constants.values() if v.shape == (width,)]
            for rows, make in ROWS.items():
                x = make(np.random.default_rng(width + 1), (8, 64, width)).astype(np.float32)
                x64 = x.astype(np.float64)
                if kind == "layer_norm":
                    d = x64 - x64.mean(-1, keepdims=True)
                    exact = d / np.sqrt((d * d).mean(-1, keepdims=True) + np.float32(1e-5)) * vectors[0] + vectors[1]
                else:
                    exact = x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + np.float32(1e-5)) * vectors[0]
                primitive = harness.ort_session(original).run(None, {"x": x})[0].astype(np.float64)
                single = harness.ort_session(fused).run(None, {"x": x})[0].astype(np.float64)
                found.append({"op": kind, "width": width, "rows": rows,
                              "primitive_vs_float64": float(np.abs(primitive - exact).max()),
                              "fused_vs_float64": float(np.abs(single - exact).max()),
                              "fused_vs_primitive": float(np.abs(single - primitive).max()),
                              "largest_output": float(np.abs(exact).max())})  # fmt: skip
    return found


# --- 2. amplification --------------------------------------------------------------------------------


HEADS = ("argmax_1000", "top5_1000", "top100_1000", "top1000_1000", "argmax_sigmoid", "argmin_row", "greater_0",
         "cast_int32", "dynamic_quantize")  # fmt: skip


def _heads_model(width: int = 192, classes: int = 1000) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    graph = Graph()
    ln = graph.norm("x", width, "layer_norm", rng)
    logits = graph.op("MatMul", ln, graph.const((rng.standard_normal((width, classes)) / np.sqrt(width)).astype(np.float32)))
    rows = ["batch", 197, None]
    outputs = [(name, TensorProto.INT64, rows) for name in HEADS[:6]]
    graph.op("ArgMax", logits, axis=-1, out=["argmax_1000"])
    for k in (5, 100, 1000):
        graph.op("TopK", logits, graph.const(np.array([k], np.int64)), out=[f"values{k}", f"top{k}_1000"])
    graph.op("ArgMax", graph.op("Sigmoid", graph.op("Mul", logits, graph.const(np.float32(8)))), axis=-1,
             out=["argmax_sigmoid"])  # fmt: skip
    graph.op("ArgMin", ln, axis=-1, out=["argmin_row"])
    graph.op("Greater", ln, graph.const(np.float32(0)), out=["greater_0"])
    graph.op("Cast", graph.op("Mul", ln, graph.const(np.float32(100))), to=TensorProto.INT32, out=["cast_int32"])
    graph.op("DynamicQuantizeLinear", ln, out=["dynamic_quantize", "scale", "zero_point"])
    outputs += [("greater_0", TensorProto.BOOL, rows), ("cast_int32", TensorProto.INT32, rows),
                ("dynamic_quantize", TensorProto.UINT8, rows)]
    return graph.model(["batch", 197, width], outputs, 18)


def amplification_table(batches: tuple[int, ...]) -> list[dict[str, Any]]:
    original = _heads_model()
    fused = _fused(original, guard=False)
    assert any(n.op_type == "LayerNormalization" for n in fused.graph.node)
    guarded = _fused(original)
    assert not any(n.op_type == "LayerNormalization" for n in guarded.graph.node)
    sessions = harness.ort_session(original), harness.ort_session(fused)
    names = [o.name for o in sessions[0].get_outputs()]
    found = []
    for batch in batches:
        x = np.random.default_rng(batch).standard_normal((batch, 197, 192)).astype(np.float32)
        expected, actual = (dict(zip(names, s.run(None, {"x": x}))) for s in sessions)
        row = {"batch": batch, "rows": batch * 197}
        for name in HEADS:
            differs = expected[name] != actual[name]
            row[name] = int(differs.any(axis=-1).sum() if name.startswith(("arg", "top")) else differs.sum())
        found.append(row)
    return found


# --- 3. cost ------------------------------------------------------------------------------------------


def _simplify_stats(path: pathlib.Path) -> dict[str, Any]:
    """The simplify pass's stats (summed over the pass loop) of the default passes on ``path``."""
    from passes import modelio, pipeline

    runs = pipeline.optimize_model(modelio.load_model(str(path)))
    return next(r.stats for r in runs if r.name == "simplify")


def cost() -> list[dict[str, Any]]:
    build_real_models = harness.load_models_builder()
    paths = sorted((ROOT / "models" / "real").glob("*.onnx")) + [m.path for m in build_real_models.installed_models()]
    found = []
    for path in paths:
        guarded = _simplify_stats(path)
        saved = amplification.Amplified.reason
        amplification.Amplified.reason = lambda self, value: None  # type: ignore[method-assign]
        try:
            unguarded = _simplify_stats(path)
        finally:
            amplification.Amplified.reason = saved  # type: ignore[method-assign]
        declined = {k: v for k, v in guarded.get("declined", {}).items() if "rounding amplified" in k}
        if guarded.get("fused") or unguarded.get("fused"):
            found.append({"model": path.stem, "fused": guarded.get("fused", 0),
                          "fused_without_guard": unguarded.get("fused", 0), "declined": declined})  # fmt: skip
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer widths and batch sizes")
    parser.add_argument("--json", type=pathlib.Path, help="write the results there")
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)  # the passes' and onnx_ir's notes on the installed models
    widths = (16, 768) if args.quick else (16, 192, 768)
    batches = (1, 2, 4) if args.quick else (1, 2, 4, 16, 64)
    results: dict[str, Any] = {"accuracy": accuracy(widths)}
    print("| op | width | rows | primitive vs float64 | fused vs float64 | fused vs primitive | largest output |")
    print("|---|---|---|---|---|---|---|")
    for r in results["accuracy"]:
        print(f"| {r['op']} | {r['width']} | {r['rows']} | {r['primitive_vs_float64']:.3g} | "
              f"{r['fused_vs_float64']:.3g} | {r['fused_vs_primitive']:.3g} | {r['largest_output']:.3g} |")
    results["amplification"] = amplification_table(batches)
    print("\nrows (ArgMax/ArgMin/TopK) or elements (the others) that differ after a fused LayerNorm, unguarded:\n")
    print("| batch | rows | " + " | ".join(HEADS) + " |")
    print("|---" * (len(HEADS) + 2) + "|")
    for r in results["amplification"]:
        print(f"| {r['batch']} | {r['rows']} | " + " | ".join(str(r[h]) for h in HEADS) + " |")
    results["cost"] = cost()
    print("\nfusions written by the default passes' simplify, with the guard and without it:\n")
    print("| model | fused | without the guard | declined as amplified |")
    print("|---|---|---|---|")
    totals: collections.Counter[str] = collections.Counter()
    for r in results["cost"]:
        totals["fused"] += r["fused"]
        totals["without"] += r["fused_without_guard"]
        shown = "; ".join(f"{k} x{v}" for k, v in r["declined"].items()) or "-"
        print(f"| {r['model']} | {r['fused']} | {r['fused_without_guard']} | {shown} |")
    print(f"| total | {totals['fused']} | {totals['without']} | |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
