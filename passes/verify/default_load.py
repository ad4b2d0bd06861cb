"""Whether onnxruntime builds a session for a model with its default graph optimisations.

The check's sessions run with every graph optimisation off (``ORT_DISABLE_ALL``: the kernels are
compared, not onnxruntime's rewrites of them); a user's session runs them all (``ORT_ENABLE_ALL``,
the default). onnxruntime's optimisers meet in a ``--precision`` model half-type graphs its float32
original never had, and 1.32 dies on one of them while building the session: a float16
``Transpose(perm=[1, 0, 2])`` feeding a ``MatMul`` with a constant weight (SIGSEGV; a GRU's or
LSTM's output before its head). :func:`failure` builds such a session in the check's child, once
the check is done with it, so a crash there is an answer (the child is started again for the next
request), not the end of this process. Nothing here imports onnxruntime.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from passes.verify.child import WorkerCrashed, WorkerTimeout

__all__ = ["failure"]

logger = logging.getLogger(__name__)

_WHAT = "building a session with its default graph optimisations (ORT_ENABLE_ALL)"


def failure(worker: Any, path: str | os.PathLike[str], deadline: float) -> str | None:
    """Why onnxruntime cannot build a session for the model at ``path`` with its default graph
    optimisations, in ``worker`` (:class:`passes.verify.child.Worker`): the crash, or its error; None
    when it builds one, or when that does not end by ``deadline`` (``time.monotonic()``; no answer: logged)."""
    try:
        answer = worker.request({"op": "default_load", "model": os.fspath(path)}, deadline)
    except WorkerCrashed as e:
        return f"{e} {_WHAT}"
    except WorkerTimeout:
        logger.info("onnxruntime's default session for %s did not finish in time: not known whether it loads", path)
        return None
    if answer.get("ok"):
        return None
    return f"onnxruntime fails {_WHAT}: {answer.get('error', '')}"
