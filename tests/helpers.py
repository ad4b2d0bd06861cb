"""Shared test helpers: the spec examples, onnxruntime runs, model building."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort

SPEC_DIR = pathlib.Path(__file__).parent / "spec"

# The spec's Abs page lists two examples that Abs cannot produce (see spec/README.md).
SPEC_ERRATA = {
    "test_cc_shape_inference_if_symbolic_shapes": "erratum of the Abs page: bool input, outputs of another op",
    "test_cc_shape_inference_slice_symbolic_end": "erratum of the Abs page: output shape differs from input",
}

_DTYPES = {
    "float32": np.float32,
    "float64": np.float64,
    "float16": np.float16,
    "bfloat16": ml_dtypes.bfloat16,
    "int8": np.int8,
    "int16": np.int16,
    "int32": np.int32,
    "int64": np.int64,
    "uint8": np.uint8,
    "uint16": np.uint16,
    "uint32": np.uint32,
    "uint64": np.uint64,
    "bool": np.bool_,
}


@dataclasses.dataclass
class SpecExample:
    """One example from a spec page: a single node with its inputs and expected outputs."""

    name: str
    op_type: str
    opset: int
    input_names: list[str]
    output_names: list[str]
    attributes: dict[str, Any]
    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]

    def input_list(self) -> list[np.ndarray]:
        return [self.inputs[n] for n in self.input_names]

    def output_list(self) -> list[np.ndarray]:
        return [self.outputs[n] for n in self.output_names]


_HEADER = re.compile(r"^\s*(\w+): shape=\(([\d, ]*)\), dtype=(\w+)\s*$")
_NODE = re.compile(r"^\s*(\w+)\((.*)\) -> \((.*)\)\s*$")


def _parse_array(text: str, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    tokens = [t for t in re.split(r"[\s,\[\]]+", text) if t]
    np_dtype = _DTYPES[dtype]
    if dtype == "bool":
        values = np.array([t == "True" for t in tokens], dtype=np.bool_)
    elif np.issubdtype(np.dtype(np_dtype), np.integer):
        values = np.array([int(t) for t in tokens], dtype=np_dtype)
    else:
        values = np.array([float(t) for t in tokens], dtype=np.float64).astype(np_dtype)
    return values.reshape(shape)


def _parse_page(path: pathlib.Path) -> list[SpecExample]:
    text = path.read_text(encoding="utf-8")
    opset = int(re.search(r"-(\d+)\.txt$", path.name).group(1))
    lines = text.splitlines()
    examples: list[SpecExample] = []
    i = 0
    while i < len(lines):
        name = lines[i].strip().rstrip("#")
        if not re.fullmatch(r"test_\w+", name):
            i += 1
            continue
        ex = SpecExample(name, "", opset, [], [], {}, {}, {})
        i += 1
        section = None
        current: tuple[str, tuple[int, ...], str, list[str]] | None = None

        def flush() -> None:
            nonlocal current
            if current is not None:
                vname, shape, dtype, body = current
                target = ex.inputs if section == "Inputs" else ex.outputs
                target[vname] = _parse_array(" ".join(body), shape, dtype)
                current = None

        while i < len(lines):
            line = lines[i]
            stripped = line.strip()
            if re.fullmatch(r"test_\w+#?", stripped) or stripped.startswith("Differences"):
                break
            if stripped in ("Node:", "Attributes:", "Inputs:", "Outputs:"):
                flush()
                section = stripped[:-1]
            elif section == "Node" and (m := _NODE.match(line)):
                ex.op_type = m.group(1)
                ex.input_names = [s.strip() for s in m.group(2).split(",") if s.strip()]
                ex.output_names = [s.strip() for s in m.group(3).split(",") if s.strip()]
            elif section == "Attributes" and "=" in stripped:
                key, value = (s.strip() for s in stripped.split("=", 1))
                ex.attributes[key] = int(value) if re.fullmatch(r"-?\d+", value) else value
            elif section in ("Inputs", "Outputs") and (m := _HEADER.match(line)):
                flush()
                shape = tuple(int(d) for d in m.group(2).replace(" ", "").split(",") if d)
                current = (m.group(1), shape, m.group(3), [])
            elif section in ("Inputs", "Outputs") and current is not None and stripped:
                current[3].append(stripped)
            i += 1
        flush()
        examples.append(ex)
    return examples


def spec_examples(pattern: str = "*") -> list[SpecExample]:
    """All examples of the spec pages matching ``pattern`` (e.g. ``"ReduceL2-*"``)."""
    out: list[SpecExample] = []
    for path in sorted(SPEC_DIR.glob(f"{pattern}.txt")):
        out.extend(_parse_page(path))
    return out


# --- onnxruntime ---------------------------------------------------------------------------


def ort_session(model: onnx.ModelProto | bytes | str) -> ort.InferenceSession:
    """An onnxruntime CPU session with every graph optimisation disabled."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    if isinstance(model, onnx.ModelProto):
        model = model.SerializeToString()
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def ort_run(model: onnx.ModelProto | bytes | str, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Runs ``model`` in onnxruntime (optimisations disabled) and returns all outputs."""
    return ort_session(model).run(None, dict(feeds))


def node_model(
    op_type: str,
    inputs: Sequence[tuple[str, np.ndarray | None]],
    outputs: Sequence[tuple[str, np.dtype | Any]],
    attributes: Mapping[str, Any] | None = None,
    *,
    opset: int,
    ir_version: int = 8,
) -> onnx.ModelProto:
    """A one-node model whose non-None inputs are graph inputs with the given arrays' types."""
    graph_inputs = []
    node_inputs = []
    for name, arr in inputs:
        if arr is None:
            node_inputs.append("")
            continue
        node_inputs.append(name)
        elem = onnx.helper.np_dtype_to_tensor_dtype(np.asarray(arr).dtype)
        graph_inputs.append(onnx.helper.make_tensor_value_info(name, elem, np.asarray(arr).shape))
    graph_outputs = [
        onnx.helper.make_tensor_value_info(name, onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dt)), None)
        for name, dt in outputs
    ]
    node = onnx.helper.make_node(op_type, node_inputs, [n for n, _ in outputs], **dict(attributes or {}))
    graph = onnx.helper.make_graph([node], "g", graph_inputs, graph_outputs)
    return onnx.helper.make_model(
        graph, opset_imports=[onnx.helper.make_opsetid("", opset)], ir_version=ir_version
    )


def simplify_checked(proto: onnx.ModelProto, full_check: bool = True,
                     **options: Any) -> tuple[onnx.ModelProto, dict[str, Any]]:  # fmt: skip
    """``SimplifyPass(**options)`` on ``proto``; the result (which must pass the ONNX check, with
    inference unless ``full_check`` is False) and the pass's stats."""
    import onnx_ir as ir

    from passes.simplify import SimplifyPass

    model = ir.serde.deserialize_model(proto)
    pass_ = SimplifyPass(**options)
    pass_(model)
    result = ir.serde.serialize_model(model)
    onnx.checker.check_model(result, full_check=full_check)
    return result, pass_.stats


def ops_recursive(model: onnx.ModelProto) -> list[str]:
    """The op types of the main graph, its If/Loop/Scan bodies (nested) and its functions."""
    ops: list[str] = []

    def walk(graph: onnx.GraphProto) -> None:
        for node in graph.node:
            ops.append(node.op_type)
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    walk(attr.g)

    walk(model.graph)
    for function in model.functions:
        ops.extend(node.op_type for node in function.node)
    return ops


# --- value_info against what onnxruntime computes ------------------------------------------------


def dims_of(info: onnx.ValueInfoProto) -> list[int | str | None]:
    """A value_info's dims: ints, symbol names, None for an unnamed dim."""
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
            for d in info.type.tensor_type.shape.dim]  # fmt: skip


def _expose_branches(model: onnx.ModelProto) -> list[tuple[str, str, onnx.ValueInfoProto]]:
    """Adds the value_info values of the main graph's If branches as outputs, in place.

    Each branch returns its own values and an empty tensor of the same type where the other
    branch has one; the If returns them all, and its condition is a graph output too.
    Returns (If output, condition, the value's value_info with its branch's attribute name in
    ``doc_string``) for each value exposed.
    """
    exposed = []
    for node in list(model.graph.node):
        if node.op_type != "If":
            continue
        branches = {a.name: a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH}
        infos = {name: [i for i in g.value_info if i.type.tensor_type.elem_type] for name, g in branches.items()}
        for owner in ("then_branch", "else_branch"):
            for info in infos[owner]:
                elem = info.type.tensor_type.elem_type
                for name, graph in branches.items():
                    returned = info.name
                    if name != owner:  # an empty tensor of the same type where the other branch has the value
                        returned = f"{info.name}__exposed_dummy"
                        empty = onnx.helper.make_tensor(returned, elem, [0], [])
                        graph.node.append(onnx.helper.make_node("Constant", [], [returned], value=empty))
                    graph.output.append(onnx.helper.make_tensor_value_info(returned, elem, None))
                out = f"{info.name}__exposed_{node.name or id(node)}"
                node.output.append(out)
                model.graph.output.append(onnx.helper.make_tensor_value_info(out, elem, None))
                copy = onnx.ValueInfoProto()
                copy.CopyFrom(info)
                copy.doc_string = owner
                exposed.append((out, node.input[0], copy))
        cond = node.input[0]
        if cond not in {o.name for o in model.graph.output} | {i.name for i in model.graph.input}:
            model.graph.output.append(onnx.helper.make_tensor_value_info(cond, onnx.TensorProto.BOOL, None))
    return exposed


def value_info_against_onnxruntime(
    model: onnx.ModelProto | str, feeds_by_size: Sequence[Mapping[str, np.ndarray]]
) -> int:
    """Checks every value_info and graph output shape against what onnxruntime computes, at each set of inputs.

    Static dims must equal the computed ones; a symbolic name is one size within a run, across
    the main graph's value_info, its outputs and the value_info of the branches of its If nodes
    (exposed as outputs), and the main graph's inputs' names are their sizes. Returns the number
    of dims checked.
    """
    model = onnx.load(model) if isinstance(model, str) else model
    exposed_model = onnx.ModelProto()
    exposed_model.CopyFrom(model)
    declared = [*model.graph.output, *model.graph.value_info]
    exposed_model.graph.output.extend(model.graph.value_info)
    branches = _expose_branches(exposed_model)
    names = [o.name for o in exposed_model.graph.output]
    checked = 0
    for feeds in feeds_by_size:
        sizes: dict[str, int] = {}
        for info in model.graph.input:
            if info.name in feeds:
                for d, n in zip(dims_of(info), np.shape(feeds[info.name])):
                    if isinstance(d, str):
                        sizes[d] = n
        results = dict(zip(names, ort_session(exposed_model).run(names, dict(feeds))))
        pairs = [(info, results[info.name]) for info in declared]
        for out, cond, info in branches:
            if bool(feeds[cond] if cond in feeds else results[cond]) == (info.doc_string == "then_branch"):
                pairs.append((info, results[out]))
        for info, array in pairs:
            dims = dims_of(info)
            if not info.type.tensor_type.HasField("shape"):
                continue
            assert onnx.helper.tensor_dtype_to_np_dtype(info.type.tensor_type.elem_type) == array.dtype, info.name
            assert len(dims) == array.ndim, (info.name, dims, array.shape)
            for d, n in zip(dims, array.shape):
                if isinstance(d, int):
                    assert d == n, (info.name, dims, array.shape)
                elif isinstance(d, str):
                    assert sizes.setdefault(d, n) == n, (info.name, d, sizes[d], array.shape)
                checked += 1
    return checked


_REPO = pathlib.Path(__file__).resolve().parent.parent


def optimize_command(*args: str, cwd: pathlib.Path) -> subprocess.CompletedProcess[str]:
    """``optimize ARGS`` as a user types it in ``cwd`` (this checkout's command), its output as text."""
    return subprocess.run([sys.executable, "-m", "passes", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(_REPO)}, timeout=600)  # fmt: skip


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The one line a refused command printed (exit 2, nothing else on stderr)."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("optimize: error: "), proc.stderr
    return lines[0]


def run_cli(args: list[str], capsys: Any) -> tuple[int, str, str]:
    """``optimize ARGS`` in this process: the exit code (a usage error's too), stdout and stderr."""
    from passes.cli import command

    try:
        code = command.main(args)
    except SystemExit as e:  # a usage error, from argparse
        code = int(e.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err
