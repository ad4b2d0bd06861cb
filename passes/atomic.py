"""Writes that an interrupt cannot leave half-done (a leaf: no onnx, no numpy).

* :func:`signals_deferred`: SIGINT and SIGTERM are held while a block runs,
  then delivered (a commit's renames, a clean-up, a temporary file being
  created and recorded).
* :func:`write_text`: a text file written to a unique temporary name next to
  its destination, then renamed over it; the temporary file is removed
  whatever happens, an interrupt included.

A temporary file is always recorded under the deferral that creates it: an
interrupt handled in between (Python runs signal handlers as soon as a call
returns, ``mkstemp``'s own calls included) would leave a file that nothing
knows about.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator

__all__ = ["signals_deferred", "temporary_file", "write_text"]


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Holds SIGINT and SIGTERM until the block ends, then delivers them.

    A commit (several renames) or a clean-up must not be cut in half by an
    interrupt. Only the main thread can install signal handlers; elsewhere this
    does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    # A handler installed outside Python (getsignal() is None) could not be restored: leave it.
    signums = [s for s in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(s) is not None]
    previous = {s: signal.signal(s, lambda signum, frame: received.append(signum)) for s in signums}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if received:
            signal.raise_signal(received[0])


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def temporary_file(target: pathlib.Path, record: Callable[[pathlib.Path], None]) -> int:
    """A new file named ``.TARGET.*.tmp`` next to ``target``, passed to ``record`` before any
    interrupt can land; returns its descriptor, open for writing, with the mode an ordinary new file
    gets (not ``mkstemp``'s 0600).

    An interrupt held meanwhile is raised on return, the file recorded (and its descriptor closed).
    """
    fd = -1
    try:
        with signals_deferred():
            fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
            record(pathlib.Path(name))
        os.fchmod(fd, 0o666 & ~_umask())
    except BaseException:
        if fd >= 0:
            os.close(fd)
        raise
    return fd


def write_text(path: str | os.PathLike[str], text: str) -> None:
    """Writes ``text`` (UTF-8) to ``path`` through a temporary file next to it, renamed in one step.

    Raises:
        OSError: the file cannot be written (the temporary file is removed).
    """
    target = pathlib.Path(path)
    created: list[pathlib.Path] = []
    try:
        fd = temporary_file(target, created.append)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        with signals_deferred():  # renamed and forgotten together
            os.replace(created[0], target)
            created.clear()
    finally:
        for tmp in created:
            tmp.unlink(missing_ok=True)
