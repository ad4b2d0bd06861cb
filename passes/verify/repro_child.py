"""The check's child's side of ``--repro``: capturing values, comparing two small models.

Imported by :mod:`passes.verify.worker` in the child process (numpy,
onnxruntime and the comparison only). Requests:

``capture``: run a model (the original with extra outputs) on a set's inputs (or
given ones) and save the graph inputs (unless ``inputs`` is false), then the
named values, one ``.npy`` each: the first ``required`` ones all, the others as
many as a byte budget holds; answers each saved value's file, dtype and shape.
``regions``: run two models on the same inputs (saved values, or an ``.npz``) and
compare their outputs of the same name at the given tolerances (or one model's
outputs with saved values).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from passes.verify.ort_io import numpy_dtype, run, session

__all__ = ["capture", "load_feeds", "regions"]


def load_feeds(files: Mapping[str, Mapping[str, str]]) -> dict[str, Any]:
    """Arrays by name from ``{"name": {"path": ..., "dtype": ...}}`` (memory-mapped; a type numpy
    lacks, saved as raw bytes, viewed as its ml_dtypes type again)."""
    import numpy as np

    feeds = {}
    for name, saved in files.items():
        array = np.load(saved["path"], mmap_mode="r", allow_pickle=False)
        if array.dtype.kind == "V":
            array = array.view(numpy_dtype(saved["dtype"]))
        elif array.dtype.kind == "U":  # strings, saved as text (no pickles)
            array = array.astype(object)
        feeds[name] = array
    return feeds


def _npz_feeds(path: str, wanted: Mapping[str, str]) -> dict[str, Any]:
    """An ``.npz``'s arrays for the inputs ``wanted`` (name: onnxruntime type); raw bytes as bfloat16."""
    import numpy as np

    feeds = {}
    with np.load(path, allow_pickle=False) as archive:
        for name in wanted:
            if name not in archive.files:
                raise ValueError(f"{os.path.basename(path)} has no array {name!r}")
            array = archive[name]
            if array.dtype.kind == "V" and wanted[name] == "tensor(bfloat16)":
                array = array.view(numpy_dtype("bfloat16"))
            elif array.dtype.kind == "U":
                array = array.astype(object)
            feeds[name] = array
    return feeds


def _save(folder: str, index: int, value: Any) -> dict[str, Any]:
    import numpy as np

    path = os.path.join(folder, f"{index}.npy")
    np.save(path, np.ascontiguousarray(value.astype(str) if value.dtype.kind == "O" else value), allow_pickle=False)
    return {"path": path, "dtype": value.dtype.name, "shape": list(value.shape), "nbytes": int(value.nbytes)}


def capture(request: dict[str, Any], feeds: Mapping[str, Any], error_text: Callable[[BaseException], str] = str,
            ) -> dict[str, Any]:  # fmt: skip
    """Saves the graph inputs (``feeds``), then ``names`` in their order: the first ``required`` ones
    whatever their size, the others while they fit in ``budget`` bytes (``error_text``:
    onnxruntime's error as one line)."""
    import numpy as np

    folder, budget = request["folder"], int(request.get("budget", 1 << 28))
    os.makedirs(folder, exist_ok=True)
    saved: dict[str, Any] = {}
    total = 0
    for name, value in feeds.items() if request.get("inputs", True) else ():
        saved[name] = _save(folder, len(saved), np.asarray(value))
        total += saved[name]["nbytes"]
    try:
        model = session(request["model"])
    except Exception as e:  # noqa: BLE001  onnxruntime's exceptions share no base class
        return {"ok": False, "stage": "load", "error": error_text(e)}
    names, required = list(request["names"]), int(request.get("required", 0))
    chunk, start = 32, 0
    while start < len(names) and (total < budget or start < required):
        part = names[start : start + chunk]
        values = run(model, dict(feeds), part)
        size = 0
        for position, (name, value) in enumerate(zip(part, values), start):
            size += getattr(value, "nbytes", 0)
            if isinstance(value, np.ndarray) and (position < required or total + value.nbytes <= budget):
                saved[name] = _save(folder, len(saved), value)
                total += value.nbytes
        del values
        start += len(part)
        chunk = max(1, min(4096, int(chunk * max(budget - total, 1) / max(size, 1))))  # what the budget holds
    return {"ok": True, "values": saved, "bytes": total}


def regions(request: dict[str, Any], error_text: Callable[[BaseException], str] = str) -> dict[str, Any]:
    """Runs ``original`` and ``optimized`` on the same inputs and compares their outputs by name
    (or ``optimized``'s with ``expected``: saved values by output name).

    ``feeds``: saved values (see :func:`load_feeds`), or ``npz``: a file of arrays by input name.
    A float32 value feeds a half-type input rounded to it, and a half output is compared with a
    float32 one widened (``--precision``). ``tolerances``: (rtol, atol) by output; ``normwise``:
    see :func:`passes.verify.compare.compare`.
    """
    from passes.verify.compare import compare

    try:
        optimized = session(request["optimized"])
        original = session(request["original"]) if "original" in request else None
    except Exception as e:  # noqa: BLE001
        return {"ok": False, "stage": "load", "error": error_text(e)}
    wanted = {i.name: i.type for s in (original, optimized) if s is not None for i in s.get_inputs()}
    try:
        feeds = load_feeds(request["feeds"]) if "feeds" in request else _npz_feeds(request["npz"], wanted)
        expected = load_feeds(request["expected"]) if original is None else {}
    except (OSError, ValueError, KeyError) as e:
        return {"ok": False, "stage": "inputs", "error": str(e)}
    try:
        if original is not None:
            expected = dict(zip([o.name for o in original.get_outputs()], run(original, feeds, half_io=True)))
        actual = dict(zip([o.name for o in optimized.get_outputs()], run(optimized, feeds, half_io=True)))
    except Exception as e:  # noqa: BLE001
        return {"ok": False, "stage": "run", "error": error_text(e)}
    names = list(expected)
    tolerances = request.get("tolerances", {})
    outputs = []
    for name in names:
        if name not in actual:
            outputs.append({"name": name, "ok": False, "message": "not an output of the optimised model"})
            continue
        pair = tolerances.get(name)
        rtol, atol = (None, None) if pair is None else (float(pair[0]), float(pair[1]))
        outputs.append(compare(name, expected[name], actual[name], rtol, atol,
                               normwise=bool(request.get("normwise")), widen=True).to_json())  # fmt: skip
    return {"ok": True, "outputs": outputs, "differs": any(not o["ok"] for o in outputs)}
