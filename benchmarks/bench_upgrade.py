"""Benchmark of the opset upgrade (load + convert + save) against the other converters.

Tools, each in its own fresh subprocess (clean peak RSS):

* ``optimize``: the command, ``optimize IN -o OUT --passes upgrade --no-check`` (its own
  load with validation and the ONNX checker both ways, the upgrade, its save);
* ``ours``: the pass alone, ``ir.load`` -> ``UpgradeOpsetPass(18)`` -> ``ir.save`` (external data kept external);
* ``onnx``: ``onnx.load`` -> ``onnx.version_converter.convert_version`` -> ``onnx.save_model``;
* ``onnxscript``: ``ir.load`` -> ``onnxscript.version_converter.convert_version(fallback=True)`` -> ``ir.save``.

Cases (opset 13): chains of 1k / 10k / 50k / 100k reduce nodes, and a model
with 500 MiB of weights stored inline and as external data. Each output is
then checked (``onnx.checker`` full check, and loading in onnxruntime).

Usage::

    python benchmarks/bench_upgrade.py [--quick] [--tools ours,onnx,onnxscript] [--json out.json]
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile

import numpy as np
import onnx
import onnx.helper as oh

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from harness import check_model_file, format_table, measure, save_json  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
TARGET = 18
sys.path.insert(0, str(ROOT))
from passes.upgrade.schemas import reduce_ops_by_axes_version  # noqa: E402

REDUCE_OPS = reduce_ops_by_axes_version()[18]  # axes attributes at opset 13

_PRELUDE = f"""
import json, sys, time
sys.path.insert(0, {str(ROOT)!r})
src, dst, external = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
"""

TOOLS = {
    # The command as users run it: its load (with validation and the ONNX checker), the upgrade
    # and the clean-up, its save (streamed arrays, kernel copies of external data), the checker on
    # the output; no onnxruntime check (the other tools have none).
    "optimize": _PRELUDE
    + f"""
import passes.cli, passes.pipeline, passes.upgrade, passes.modelio.load, passes.modelio.validate
start = time.perf_counter()
code = passes.cli.main([src, "-o", dst, "--passes", "upgrade", "--target-opset", "{TARGET}", "--no-check", "-q"])
if code:
    sys.exit(code)
print(json.dumps({{"seconds": time.perf_counter() - start}}))
""",
    "ours": _PRELUDE
    + f"""
import onnx_ir as ir
from passes.upgrade import UpgradeOpsetPass
start = time.perf_counter()
model = ir.load(src)
loaded = time.perf_counter()
UpgradeOpsetPass({TARGET})(model)
converted = time.perf_counter()
ir.save(model, dst, external_data="out.data" if external else None)
end = time.perf_counter()
print(json.dumps({{"seconds": end - start, "load": loaded - start, "convert": converted - loaded,
                  "save": end - converted}}))
""",
    "onnx": _PRELUDE
    + f"""
import onnx, onnx.version_converter
start = time.perf_counter()
model = onnx.load(src)
loaded = time.perf_counter()
model = onnx.version_converter.convert_version(model, {TARGET})
converted = time.perf_counter()
onnx.save_model(model, dst, save_as_external_data=external, all_tensors_to_one_file=True, location="out.data")
end = time.perf_counter()
print(json.dumps({{"seconds": end - start, "load": loaded - start, "convert": converted - loaded,
                  "save": end - converted}}))
""",
    "onnxscript": _PRELUDE
    + f"""
import onnx_ir as ir
from onnxscript import version_converter
start = time.perf_counter()
model = ir.load(src)
loaded = time.perf_counter()
version_converter.convert_version(model, target_version={TARGET}, fallback=True)
converted = time.perf_counter()
ir.save(model, dst, external_data="out.data" if external else None)
end = time.perf_counter()
print(json.dumps({{"seconds": end - start, "load": loaded - start, "convert": converted - loaded,
                  "save": end - converted}}))
""",
}


def reduce_chain(count: int) -> onnx.ModelProto:
    """``count`` reduce nodes in a chain, axes as attributes (opset 13)."""
    nodes, previous = [], "x"
    for index in range(count):
        op_type = REDUCE_OPS[index % len(REDUCE_OPS)]
        axes = [(index % 3) - 1] if index % 4 else [0, 1]
        nodes.append(oh.make_node(op_type, [previous], [f"v{index}"], name=f"n{index}", axes=axes, keepdims=1))
        previous = f"v{index}"
    graph = oh.make_graph(
        nodes,
        "chain",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4, 8])],
        [oh.make_tensor_value_info(previous, onnx.TensorProto.FLOAT, [1, 1])],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 13)], ir_version=7)


def weights_model(mib: int) -> onnx.ModelProto:
    """MatMul layers holding ``mib`` MiB of float32 weights, with reduce ops between them."""
    width = 1024
    layers = max(1, mib * 2**20 // (width * width * 4))
    base = np.random.default_rng(0).standard_normal((width, width)).astype(np.float32) / width
    nodes, initializers, previous = [], [], "x"
    for index in range(layers):
        initializers.append(onnx.numpy_helper.from_array(base + np.float32(index), f"w{index}"))
        nodes += [
            oh.make_node("MatMul", [previous, f"w{index}"], [f"h{index}"]),
            oh.make_node("ReduceMax", [f"h{index}"], [f"m{index}"], axes=[-1], keepdims=1),
            oh.make_node("Sub", [f"h{index}", f"m{index}"], [f"s{index}"]),
        ]
        previous = f"s{index}"
    graph = oh.make_graph(
        nodes,
        "weights",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, width])],
        [oh.make_tensor_value_info(previous, onnx.TensorProto.FLOAT, [1, width])],
        initializers,
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 13)], ir_version=7)


def build_cases(workdir: pathlib.Path, quick: bool, only: str = "") -> list[tuple[str, pathlib.Path, bool]]:
    """Writes the input models; returns (case name, path, stored as external data).

    ``only``: a comma-separated subset, ``chain`` and ``weights`` for all of a kind
    (``chain_1000``, ``weights_inline``... for one).
    """
    chains = [100, 1000] if quick else [1000, 10_000, 50_000, 100_000]
    mib = 20 if quick else 500
    wanted = {w for w in only.split(",") if w}

    def chosen(name: str) -> bool:
        return not wanted or name in wanted or name.split("_")[0] in wanted

    cases = []
    for count in chains:
        if not chosen(f"chain_{count}"):
            continue
        path = workdir / f"chain_{count}" / "model.onnx"
        path.parent.mkdir()
        onnx.save_model(reduce_chain(count), path)
        cases.append((f"chain {count} reduce", path, False))
    model = None
    for external in (False, True):
        if not chosen(f"weights_{'external' if external else 'inline'}"):
            continue
        model = model or weights_model(mib)
        path = workdir / f"weights_{'external' if external else 'inline'}" / "model.onnx"
        path.parent.mkdir()
        onnx.save_model(
            model, path, save_as_external_data=external, all_tensors_to_one_file=True, location="in.data"
        )
        cases.append((f"{mib} MiB weights {'external' if external else 'inline'}", path, external))
    return cases


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    parser.add_argument("--tools", default=",".join(TOOLS), help="comma-separated subset of %(default)s")
    parser.add_argument("--cases", default="", help="comma-separated subset: chain, weights, chain_1000, "
                                                    "weights_inline... (default: all)")
    parser.add_argument("--json", type=pathlib.Path, default=None, help="where to save the measurements")
    parser.add_argument("--workdir", type=pathlib.Path, default=None, help="where to write the models")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per tool run (default %(default)s)")
    args = parser.parse_args(argv)
    tools = [t for t in args.tools.split(",") if t]
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        workdir = pathlib.Path(tmp)
        results = []
        for case, path, external in build_cases(workdir, args.quick, args.cases):
            for tool in tools:
                out_dir = path.parent / tool
                out_dir.mkdir()
                output = out_dir / "model.onnx"
                result = measure(tool, case, TOOLS[tool], [path, output, "1" if external else "0"], args.timeout)
                if not result.ok and result.wall_seconds >= args.timeout:
                    result.error = f"timeout after {args.timeout:.0f} s"
                if result.ok:
                    result.extra.update(check_model_file(output))
                results.append(result)
                print(f"{case} / {tool}: {result.seconds} s, {result.peak_rss_mib:.0f} MiB {result.error}",
                      flush=True)
    print()
    print(format_table(results, reference="onnx"))
    if args.json is not None:
        meta = {"target_opset": TARGET, "quick": args.quick, "python": sys.version.split()[0]}
        save_json(args.json, results, meta)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
