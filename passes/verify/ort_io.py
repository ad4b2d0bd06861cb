"""The check's child's side of onnxruntime: sessions, runs, inputs made from a description, outputs.

Imported by :mod:`passes.verify.worker` (it runs in the child process), and by
:mod:`passes.verify.check` for :func:`make_inputs` (in the caller's process):
nothing here imports onnx or the passes, and numpy, onnxruntime and ml_dtypes
are imported at first use. onnxruntime's Python API has no numpy array of
bfloat16 or the float8 types: bfloat16 inputs go as OrtValues of their bytes
(:func:`feed`) and such outputs are read from their bytes (:func:`tensor`).
"""

from __future__ import annotations

import os
import re
from typing import Any

__all__ = ["as_declared", "constants", "default_session", "describe", "error_line", "feed", "generate",
           "make_inputs", "numpy_dtype", "run", "session", "spill", "tensor"]


#: Output types onnxruntime's Python API gives no numpy array of: read from the OrtValue's bytes as
#: ml_dtypes' type of the same bits (:func:`tensor`).
BYTES_OUTPUTS = {"tensor(bfloat16)": "bfloat16", "tensor(float8e4m3fn)": "float8_e4m3fn",
                 "tensor(float8e4m3fnuz)": "float8_e4m3fnuz", "tensor(float8e5m2)": "float8_e5m2",
                 "tensor(float8e5m2fnuz)": "float8_e5m2fnuz", "tensor(float8e8m0)": "float8_e8m0fnu"}


def numpy_dtype(name: str) -> Any:
    import numpy as np

    if name == "bfloat16" or name.startswith("float8"):
        import ml_dtypes  # slow to import: only for the types numpy lacks

        return getattr(ml_dtypes, name)
    if name == "str":
        return object
    return np.dtype(name)


def generate(spec: dict[str, Any], rng: Any) -> Any:
    import numpy as np

    shape = spec["shape"]
    dtype = spec["dtype"]
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype == "str":
        return rng.choice(np.array(["a", "bc", "def"], dtype=object), size=shape)
    if dtype.startswith(("int", "uint")):
        low, high = int(spec.get("low", 0)), int(spec.get("high", 4))
        return rng.integers(low, max(high, low + 1), size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(np.float32).astype(numpy_dtype(dtype))


def session(path: str, *, ordered: bool = False, optimised: bool = False) -> Any:
    """An onnxruntime CPU session of the model at ``path``, every graph optimisation disabled (with
    ``optimised``, onnxruntime's defaults: a user's session); ``ordered``: the nodes run in the
    model's order where it allows (onnxruntime's priority-based order: its default may run a
    value's consumers late and hold many values at once)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if not optimised:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if ordered and hasattr(ort.ExecutionOrder, "PRIORITY_BASED"):
        options.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    options.log_severity_level = 4  # fatal only: its errors are reported as our one line
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def run(session: Any, feeds: dict[str, Any], names: list[str] | None = None, half_io: bool = False) -> list[Any]:
    """The session's outputs (``names``, or all) on ``feeds``; with ``half_io`` (``--precision-io``), a
    float32 feed of an input the session declares float16 or bfloat16 is rounded to that type."""
    import onnxruntime as ort

    options = ort.RunOptions()
    options.log_severity_level = 4
    wanted = {i.name: i.type for i in session.get_inputs()}
    feeds = {k: feed(as_declared(v, wanted[k]) if half_io else v) for k, v in feeds.items() if k in wanted}
    outputs = {o.name: o.type for o in session.get_outputs()}
    fetched = list(outputs) if names is None else names
    if not any(outputs.get(n) in BYTES_OUTPUTS for n in fetched) or not all(
        outputs.get(n, "").startswith("tensor(") for n in fetched
    ):
        return session.run(names, feeds, options)
    # onnxruntime gives no numpy array of bfloat16 or float8: such outputs are read from the OrtValue's bytes
    # (run_with_ort_values takes OrtValues only).
    import numpy as np

    values = {k: v if isinstance(v, ort.OrtValue) else ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(v))
              for k, v in feeds.items()}  # fmt: skip
    return [tensor(v) for v in session.run_with_ort_values(fetched, values, options)]


HALF_INPUTS = {"tensor(float16)": "float16", "tensor(bfloat16)": "bfloat16"}


def as_declared(value: Any, declared: str) -> Any:
    """A float32 array rounded to the half type an input is declared as (``--precision-io``: the
    converted model takes the original's inputs in its type); any other value as it is."""
    name = HALF_INPUTS.get(declared)
    if name is None or getattr(value, "dtype", None) is None or value.dtype.name != "float32":
        return value
    return value.astype(numpy_dtype(name))


def tensor(value: Any) -> Any:
    """An onnxruntime tensor (CPU) as numpy; bfloat16 and float8 (:data:`BYTES_OUTPUTS`) as
    ml_dtypes' type, from its bytes."""
    name = BYTES_OUTPUTS.get(value.data_type())
    if name is None:
        return value.numpy()
    import ctypes

    import numpy as np

    dtype = np.dtype(numpy_dtype(name))
    data = ctypes.string_at(value.data_ptr(), value.tensor_size_in_bytes()) if value.tensor_size_in_bytes() else b""
    return np.frombuffer(data, np.uint8 if dtype.itemsize == 1 else np.uint16).view(dtype).reshape(value.shape())


#: ml_dtypes' types onnxruntime reads as strings, by the ONNX element type their bytes go as (:func:`feed`).
BYTES_INPUTS = {"bfloat16": 16, "float8_e4m3fn": 17, "float8_e4m3fnuz": 18, "float8_e5m2": 19, "float8_e5m2fnuz": 20}


def feed(value: Any) -> Any:
    """``value`` as onnxruntime takes it: it reads ml_dtypes' bfloat16 and float8 arrays as strings,
    so those go as an OrtValue of their bytes."""
    onnx_type = BYTES_INPUTS.get(getattr(getattr(value, "dtype", None), "name", ""))
    if onnx_type is not None:
        import numpy as np
        import onnxruntime as ort

        array = np.ascontiguousarray(value)
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
            array.view(np.uint8 if array.dtype.itemsize == 1 else np.uint16), onnx_type)
    return value


def describe(value: Any) -> dict[str, Any]:
    import numpy as np

    if isinstance(value, np.ndarray):
        return {"kind": "tensor", "dtype": str(value.dtype), "shape": list(value.shape)}
    return {"kind": type(value).__name__}


def spill(values: dict[str, Any], folder: str, threshold: int, prefix: str = "expected") -> dict[str, Any]:
    """Large numeric outputs go to disk and come back memory-mapped, so two sessions' outputs
    are not in memory at once."""
    import numpy as np

    # Types of numpy's own only: np.save writes ml_dtypes' bfloat16 as raw bytes (|V2).
    arrays = {k: v for k, v in values.items() if isinstance(v, np.ndarray) and v.dtype.kind in "biufc"}
    if not folder or sum(v.nbytes for v in arrays.values()) <= threshold:
        return values
    result = dict(values)
    for i, (name, array) in enumerate(arrays.items()):
        path = os.path.join(folder, f"{prefix}-{i}.npy")
        np.save(path, array)
        result[name] = np.load(path, mmap_mode="r")
    return result


# onnxruntime's run errors: "[ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while
# running Reshape node. Name:'r' Status Message: /onnxruntime_src/...h:84 onnxruntime::Reshape...(
# ...) size != 0 && ... was false. The input tensor cannot be reshaped ..." -> "Reshape node 'r':
# The input tensor cannot be reshaped ..." (the source path, function and condition say nothing
# to a user; the op, the node and ORT's own sentence do). A node of a subgraph fails inside its
# If/Loop/Scan node's message: "Reshape node 'r' (in If node 'i'): The input tensor ...".
_ORT_NODE_ERROR = re.compile(
    r"^Non-zero status code returned while running (?P<op>\S+) node\. "
    r"Name:'(?P<name>[^']*)' Status Message: (?:\S+:\d+ [^ ]+\(.*?\) .*? was false\. )?(?P<message>.*)$")
_ORT_PREFIX = re.compile(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ")


def error_line(error: BaseException) -> str:
    """onnxruntime's error in one line: the op, the node and its own sentence (see the comment above)."""
    text = str(error).strip()
    if not text:
        return type(error).__name__
    line = text.splitlines()[0]
    message = _ORT_PREFIX.sub("", line)
    nodes = []
    while run := _ORT_NODE_ERROR.match(message):
        nodes.append(f"{run['op']} node {run['name']!r}")
        message = run["message"]
    if nodes:
        outer = f" (in {' in '.join(reversed(nodes[:-1]))})" if len(nodes) > 1 else ""
        line = f"{nodes[-1]}{outer}: {message}"
    elif message != line:
        line = f"onnxruntime: {message}"
    return line[:500]


def default_session(request: dict[str, Any], phase: Any) -> dict[str, Any]:
    """Builds (and drops) a session of ``request["model"]`` with onnxruntime's default graph
    optimisations (``ORT_ENABLE_ALL``), nothing run; a crash there ends the child, and the parent
    says so (:mod:`passes.verify.default_load`)."""
    phase("building a session with onnxruntime's default graph optimisations")
    try:
        session(request["model"], optimised=True)
    except Exception as e:  # noqa: BLE001
        return {"ok": False, "error": error_line(e)}
    return {"ok": True}


def constants(request: dict[str, Any], phase: Any) -> dict[str, Any]:
    """Runs a model of constants and saves the requested outputs' bytes one after the other in
    ``folder/outputs.bin`` (answering each one's offset, dtype and shape; a string output as
    ``folder/N.npy``). Its large constants are inputs, read here from the files ``raw`` names
    (path, offset, dtype, shape). ``phase`` tells the parent what is about to happen."""
    import numpy as np

    phase("loading the folded constants' model")
    try:
        loaded = session(request["model"])
        names = list(request["names"])
        phase("reading the large constants")
        feeds = {}
        for name, raw in request.get("raw", {}).items():  # read here, not by the parent
            shape = [int(d) for d in raw["shape"]]
            count = int(np.prod(shape, dtype=np.int64))
            array = np.fromfile(raw["path"], dtype=numpy_dtype(raw["dtype"]), count=count, offset=int(raw["offset"]))
            feeds[name] = array.reshape(shape)
        phase("computing the folded constants")
        values = run(loaded, feeds, names)
    except Exception as e:  # noqa: BLE001
        return {"ok": False, "stage": "run", "error": error_line(e)}
    del loaded
    saved: dict[str, Any] = {}
    data = os.path.join(request["folder"], "outputs.bin")
    with open(data, "wb") as f:  # one file for all outputs: a sweep may confirm thousands
        for i, (name, value) in enumerate(zip(names, values)):
            if not isinstance(value, np.ndarray):
                saved[name] = {"error": f"a {type(value).__name__}, not a tensor"}
                continue
            if value.dtype.kind in "OSU":
                path = os.path.join(request["folder"], f"{i}.npy")
                np.save(path, value.astype(str), allow_pickle=False)
                saved[name] = {"path": path, "dtype": "str"}
                continue
            saved[name] = {"path": data, "offset": f.tell(), "dtype": value.dtype.name, "shape": list(value.shape)}
            np.ascontiguousarray(value).tofile(f)
    return {"ok": True, "values": saved}


def make_inputs(session: Any, *, dims: Any = None, seed: int = 0) -> dict[str, Any]:
    """Seeded inputs for every graph input of an onnxruntime ``session``, in this process.

    Floats are standard normal, integers uniform in [0, 4), booleans fair coins;
    a dynamic dimension takes its size from ``dims`` by name, else
    :data:`DEFAULT_DIM`. (The check itself chooses sizes that make the model
    run and index ranges from the graph; see :mod:`passes.verify.plan`.)

    Raises:
        ValueError: an input has a type that cannot be generated (sequence, map...).
    """
    import numpy as np

    from passes.verify.defaults import DEFAULT_DIM
    from passes.verify.result import shown

    rng = np.random.default_rng(seed)
    names = {
        "tensor(float)": "float32", "tensor(double)": "float64", "tensor(float16)": "float16",
        "tensor(bfloat16)": "bfloat16", "tensor(bool)": "bool", "tensor(string)": "str",
    }  # fmt: skip
    feeds = {}
    for arg in session.get_inputs():
        dtype = names.get(arg.type) or (arg.type[len("tensor("):-1] if arg.type.startswith("tensor(int")
                                        or arg.type.startswith("tensor(uint") else None)  # fmt: skip
        if dtype is None:
            raise ValueError(f"cannot generate input {shown(arg.name)} of type {arg.type}; pass --inputs")
        shape = [d if isinstance(d, int) and d >= 0 else int((dims or {}).get(d, DEFAULT_DIM)) for d in arg.shape]
        feeds[arg.name] = np.asarray(generate({"dtype": dtype, "shape": shape}, rng))
    return feeds
