"""The check's child's side of onnxruntime: sessions, runs, inputs made from a description, outputs.

Imported by :mod:`passes.verify.worker` only (it runs in the child process):
nothing here imports onnx or the passes, and numpy, onnxruntime and ml_dtypes
are imported at first use. onnxruntime's Python API has no numpy array of
bfloat16: such inputs go as OrtValues of their bytes (:func:`feed`) and such
outputs are read from their bytes (:func:`tensor`).
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["as_declared", "describe", "feed", "generate", "numpy_dtype", "run", "session", "spill", "tensor"]


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


def session(path: str) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
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
    if not any(outputs.get(n) == "tensor(bfloat16)" for n in fetched) or not all(
        outputs.get(n, "").startswith("tensor(") for n in fetched
    ):
        return session.run(names, feeds, options)
    # onnxruntime gives no numpy array of bfloat16: such outputs are read from the OrtValue's bytes
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
    """An onnxruntime tensor (CPU) as numpy; bfloat16 as ml_dtypes' type, from its bytes."""
    if value.data_type() != "tensor(bfloat16)":
        return value.numpy()
    import ctypes

    import numpy as np

    data = ctypes.string_at(value.data_ptr(), value.tensor_size_in_bytes()) if value.tensor_size_in_bytes() else b""
    return np.frombuffer(data, np.uint16).view(numpy_dtype("bfloat16")).reshape(value.shape())


def feed(value: Any) -> Any:
    """``value`` as onnxruntime takes it: it reads ml_dtypes' bfloat16 arrays as strings, so
    those go as an OrtValue of their bytes."""
    if getattr(value, "dtype", None) is not None and value.dtype.name == "bfloat16":
        import numpy as np
        import onnxruntime as ort

        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
            np.ascontiguousarray(value).view(np.uint16), 16)  # 16: TensorProto.BFLOAT16
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
