"""``python -m passes`` and the ``optimize`` console script.

Start-up imports only what the run needs: ``--help`` and an early error (a
missing file, a bad flag) import neither numpy nor onnx nor onnx_ir (the
parser reads the passes' declarations from :mod:`passes.declarations`), a run
imports the passes it runs (refimpl with ``fold``) and onnxruntime only to check. Those imports still take a second or
more; a SIGINT or SIGTERM in that time must end in one line and no traceback,
so a minimal handler goes in first and the CLI is imported after; nothing has
been written yet, so it can exit at once.
"""

from __future__ import annotations

import os
import signal
import sys

TYPE_CHECKING = False  # typing is not imported before the handlers are in (5 ms of start-up)
if TYPE_CHECKING:
    from typing import Any, NoReturn


def _interrupted_during_start_up(signum: int, frame: Any) -> NoReturn:
    sys.stderr.write("optimize: error: interrupted; no output written\n")
    sys.stderr.flush()
    os._exit(128 + signum)


def main() -> NoReturn:
    """Installs the start-up signal handlers, then runs the command as a process.

    :func:`passes.cli.command.run` ends the process itself (see there why), so
    this returns only if it is replaced.
    """
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, _interrupted_during_start_up)
    from passes.cli.command import run

    run()


if __name__ == "__main__":
    sys.exit(main())
