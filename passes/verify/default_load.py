"""Whether onnxruntime builds a session for a model with its default graph optimisations.

The check's sessions run with every graph optimisation off (``ORT_DISABLE_ALL``: the kernels are
compared, not onnxruntime's rewrites of them); a user's session runs them all (``ORT_ENABLE_ALL``,
the default). onnxruntime's optimisers meet in a ``--precision`` model half-type graphs its float32
original never had, and 1.32 dies on one of them while building the session: a float16
``Transpose(perm=[1, 0, 2])`` feeding a ``MatMul`` with a constant weight (SIGSEGV; a GRU's or
LSTM's output before its head). :func:`failure` builds such a session in a process of its own, so a
crash there is an answer, not the end of this one. Nothing here imports onnxruntime.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys

__all__ = ["failure"]

logger = logging.getLogger(__name__)

#: The child: a session with onnxruntime's default options (its CPU provider, as the check's), nothing run.
_CODE = (
    "import sys\n"
    "del sys.path[0]  # the current folder ``-c`` puts first: the caller's, not ours\n"
    "import resource\n"
    "limit = int(sys.argv[2])\n"
    "if limit > 0:\n"
    "    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))\n"
    "import onnxruntime as ort\n"
    "options = ort.SessionOptions(); options.log_severity_level = 4\n"
    "try:\n"
    "    ort.InferenceSession(sys.argv[1], options, providers=['CPUExecutionProvider'])\n"
    "except Exception as error:\n"
    "    print(' '.join(str(error).split())[:300], file=sys.stderr); sys.exit(1)\n"
)


def failure(path: str | os.PathLike[str], timeout: float, memory_limit: int = 0) -> str | None:
    """Why onnxruntime cannot build a session for the model at ``path`` with its default graph
    optimisations (``ORT_ENABLE_ALL``): the signal that killed it, or its error; None when it builds
    one, or when that takes longer than ``timeout`` seconds (no answer: logged). ``memory_limit``:
    the process's address-space bound in bytes, as the check's child has (0: none)."""
    try:
        done = subprocess.run([sys.executable, "-c", _CODE, os.fspath(path), str(memory_limit)],
                              capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)  # fmt: skip
    except subprocess.TimeoutExpired:
        logger.info("onnxruntime's default session for %s took over %g s: not known whether it loads", path, timeout)
        return None
    if done.returncode == 0:
        return None
    if done.returncode < 0:
        try:
            name = signal.Signals(-done.returncode).name
        except ValueError:
            name = f"signal {-done.returncode}"
        return f"onnxruntime crashes ({name}) building a session with its default graph optimisations (ORT_ENABLE_ALL)"
    lines = done.stderr.strip().splitlines()
    return ("onnxruntime cannot build a session with its default graph optimisations (ORT_ENABLE_ALL): "
            + (lines[-1] if lines else f"exit {done.returncode}"))  # fmt: skip
