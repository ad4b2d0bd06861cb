"""Writing external data: untouched weights are copied by the kernel, byte range by byte range.

A weight that no pass changed is still the input's :class:`onnx_ir.ExternalTensor`
(a pass that changes one replaces it with an in-memory tensor). Its bytes are
exactly the range ``[offset, offset + length)`` of the input's data file, so the
output's data file gets that range copied without Python ever holding it:

1. a reflink (``FICLONERANGE``: the two files share the blocks, nothing is
   copied) where the filesystem has them and both offsets and the length are
   block-aligned;
2. ``os.copy_file_range`` (in-kernel copy; on filesystems that support it, a
   reflink or a server-side copy by itself);
3. ``os.sendfile``;
4. a ``pread``/``pwrite`` loop of 8 MiB.

Each step falls back to the next on the errors that mean "not here"
(ENOSYS, EXDEV, EINVAL, EOPNOTSUPP, ENOTTY) and the rest of that save uses
what worked. Holes of the input (``SEEK_DATA``/``SEEK_HOLE``: blocks never
written, which read as zeros) are not copied but left as holes of the output,
as ``cp`` does by default: they read as the same zeros, and copying them would
make the kernel read and write zeros for nothing.

Each kernel call asks for the rest of the range, up to :data:`CHUNK` (Linux's
``MAX_RW_COUNT``, the most one call copies), as ``cp`` does. Smaller calls
were measured slower on ext4 (Linux 6.18, 3 GiB, the source in the page
cache, alternating runs): 64 MiB, 1 GiB and 2047 MiB calls took 2.0-2.2 s
(median), calls of ``MAX_RW_COUNT`` 1.4 s, the same as ``cp``. A signal ends
a call early with what it copied (a SIGINT 0.3 s into a 3 GiB copy stopped it
at 0.31 s), so the command's interrupt (SIGINT turned into an exception) is
still handled at once; the caller writes into a staged folder, so an
interrupted copy leaves nothing behind.

New or changed tensors are written through Python (``tofile``) as before.

Layout (:func:`plan`): tensors in the order given. A tensor written through
Python starts at a multiple of 16 bytes (every element type is then aligned in
a memory map), or of 64 KiB if it is larger than 1 MiB, which the ONNX
external-data spec recommends for memory mapping (the page size, and Windows'
allocation granularity) and which lets a reflink share whole blocks.

Untouched tensors that follow each other in the same input file, in the order
given, each after the previous one's end with less than its own alignment in
between (16 bytes, or 64 KiB over 1 MiB: the padding an aligning writer
leaves; none for ``onnx.save``), form a *run*: the run keeps the input's layout
(the same gaps, the same bytes in them) and is copied as one range, one kernel
call per 2 GiB however many tensors it holds, instead of one call (and its
``fstat``/``SEEK_DATA`` checks) per tensor. The run is placed where its large
tensors (over 1 MiB) start at a multiple of 64 KiB, and a large tensor the
input does not hold at the same offset modulo 64 KiB as the run's first one
starts a new run: the 64 KiB alignment is kept, at the cost of one more call
for at least 1 MiB copied. Small tensors keep the input's offsets modulo 16
within a run: aligned if the input had them aligned (our own output, onnx_ir's),
not re-aligned if it had not (``onnx.save`` writes them back to back), since
that would cost a call per tensor. A run's gaps hold what the input held
between its tensors, padding in every writer we know of (and at most the gap's
bound); gaps between runs and tensors written through Python are holes.

The layout depends only on the tensors' sizes, their order and, for untouched
ones, where they are in the input: a rerun writes the same bytes, and a run
on our own output keeps every offset.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import struct
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, BinaryIO

if TYPE_CHECKING:
    import onnx_ir as ir

__all__ = ["ALIGN_LARGE", "ALIGN_SMALL", "ALIGN_THRESHOLD", "Copier", "Placement", "plan", "segments", "write_external_data"]

ALIGN_SMALL = 16
ALIGN_LARGE = 64 << 10
ALIGN_THRESHOLD = 1 << 20
#: Linux's ``MAX_RW_COUNT`` with 4 KiB pages (``INT_MAX & PAGE_MASK``): the kernel copies at most this much per call.
CHUNK = 0x7FFFF000
_BUFFER = 8 << 20

#: The errors with which a copy method says it does not work for these files.
UNSUPPORTED = frozenset({errno.ENOSYS, errno.EXDEV, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOTTY})

# linux/fs.h: FICLONERANGE = _IOW(0x94, 13, struct file_clone_range {s64 src_fd; u64 src_offset,
# src_length, dest_offset}).
_FICLONERANGE = 0x4020940D


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where one tensor goes in the output's data file.

    ``source`` is the input file and offset of an untouched tensor copied from
    it (None: written through Python); ``run_start`` is True for the first
    tensor of a run copied as one range (see the module docstring).
    """

    tensor: ir.TensorProtocol
    offset: int
    length: int
    source: tuple[str, int] | None = None
    run_start: bool = True


def _align(length: int) -> int:
    return ALIGN_LARGE if length > ALIGN_THRESHOLD else ALIGN_SMALL


def _up_to(end: int, residue: int, modulus: int) -> int:
    """The smallest offset at or after ``end`` that is ``residue`` modulo ``modulus``."""
    return end + (residue - end) % modulus


def plan(tensors: Sequence[ir.TensorProtocol]) -> tuple[list[Placement], int]:
    """The offsets of ``tensors`` in a new data file (see the module docstring) and the file's size."""
    lengths = [t.nbytes for t in tensors]  # computed from the shape: once each
    sources = [_source(t) for t in tensors]
    mergeable = [s is not None and _mergeable(t) for t, s in zip(tensors, sources)]
    placements: list[Placement] = []
    end = 0
    i = 0
    while i < len(tensors):
        source = sources[i]
        if not mergeable[i]:
            length = lengths[i]
            offset = _up_to(end, 0, _align(length))
            placements.append(Placement(tensors[i], offset, length, source))
            end = offset + length
            i += 1
            continue
        # A run: the tensors i..j-1, at their input offsets relative to the first.
        assert source is not None
        path, first = source
        source_end = first + lengths[i]
        anchor = first if lengths[i] > ALIGN_THRESHOLD else None  # its first large tensor's input offset
        j = i + 1
        while j < len(tensors) and mergeable[j]:
            following_path, offset = sources[j]  # type: ignore[misc]
            length = lengths[j]
            if following_path != path or not source_end <= offset < source_end + _align(length):
                break
            if length > ALIGN_THRESHOLD:
                if anchor is not None and (offset - anchor) % ALIGN_LARGE:
                    break  # it would not be 64 KiB-aligned: a run of its own
                anchor = offset if anchor is None else anchor
            source_end = offset + length
            j += 1
        if anchor is not None:  # the large tensors at multiples of 64 KiB
            start = _up_to(end, first - anchor, ALIGN_LARGE)
        else:  # the small ones at the input's offsets modulo 16
            start = _up_to(end, first, ALIGN_SMALL)
        for k in range(i, j):
            offset = sources[k][1]  # type: ignore[index]
            placements.append(Placement(tensors[k], start + offset - first, lengths[k], sources[k], k == i))
        end = start + source_end - first
        i = j
    return placements, end


def _mergeable(tensor: ir.TensorProtocol) -> bool:
    """External data can share a run; a weight left in a model file cannot (protobuf's bytes lie between them)."""
    from passes.ir.tensors import InlineData

    return InlineData not in type(tensor).__mro__


class Copier:
    """Copies byte ranges between two open files with the best method that works for them.

    Attributes:
        methods: How many bytes each method copied (``reflink``, ``copy_file_range``,
            ``sendfile``, ``read/write``), and how many were holes left as holes (``hole``).
    """

    def __init__(self, progress: Callable[[int], None] | None = None) -> None:
        self._progress = progress
        self._broken: set[str] = set()
        self.methods: dict[str, int] = {}

    def copy(self, src: int, src_offset: int, dst: int, dst_offset: int, length: int) -> None:
        """Copies ``length`` bytes from ``src`` at ``src_offset`` to ``dst`` at ``dst_offset``.

        ``dst``'s range must read as zeros before the copy (a new file, written
        forward): the holes of ``src``'s range are skipped, and ``dst`` is extended
        to the range's end if it ends with one.

        Raises:
            OSError: a read or write failed (a full disk...), or ``src`` ended early (EIO).
        """
        short = src_offset + length - os.fstat(src).st_size
        if short > 0:
            raise OSError(errno.EIO, f"the input's data file ended {min(short, length)} bytes early")
        if "reflink" not in self._broken and self._reflink(src, src_offset, dst, dst_offset, length):
            self._count("reflink", length)
            return
        for start, size, data in segments(src, src_offset, length):
            at = dst_offset + start - src_offset
            if not data:
                self._count("hole", size)
                continue
            done = 0
            while done < size:
                copied = self._chunk(src, start + done, dst, at + done, min(CHUNK, size - done))
                if copied == 0:
                    raise OSError(errno.EIO, f"the input's data file ended {size - done} bytes early")
                done += copied
        if os.fstat(dst).st_size < dst_offset + length:  # it ended with a hole
            os.ftruncate(dst, dst_offset + length)

    def _count(self, method: str, n: int) -> None:
        self.methods[method] = self.methods.get(method, 0) + n
        if self._progress is not None:
            self._progress(n)

    def _reflink(self, src: int, src_offset: int, dst: int, dst_offset: int, length: int) -> bool:
        if not sys.platform.startswith("linux"):
            self._broken.add("reflink")
            return False
        block = os.fstatvfs(dst).f_bsize or 4096
        if src_offset % block or dst_offset % block or length % block:
            return False  # another range may be aligned: do not give up on reflinks
        import fcntl

        try:
            fcntl.ioctl(dst, _FICLONERANGE, struct.pack("qQQQ", src, src_offset, length, dst_offset))
        except OSError as e:
            if e.errno not in UNSUPPORTED and e.errno != errno.EPERM:
                raise
            self._broken.add("reflink")
            return False
        return True

    def _chunk(self, src: int, src_offset: int, dst: int, dst_offset: int, n: int) -> int:
        if "copy_file_range" not in self._broken and hasattr(os, "copy_file_range"):
            try:
                copied = os.copy_file_range(src, dst, n, src_offset, dst_offset)
            except OSError as e:
                if e.errno not in UNSUPPORTED:
                    raise
                self._broken.add("copy_file_range")
            else:
                self._count("copy_file_range", copied)
                return copied
        if "sendfile" not in self._broken and hasattr(os, "sendfile"):
            try:
                os.lseek(dst, dst_offset, os.SEEK_SET)
                copied = os.sendfile(dst, src, src_offset, n)
            except OSError as e:
                if e.errno not in UNSUPPORTED:
                    raise
                self._broken.add("sendfile")
            else:
                self._count("sendfile", copied)
                return copied
        data = os.pread(src, min(n, _BUFFER), src_offset)
        written = 0
        while written < len(data):
            written += os.pwrite(dst, data[written:], dst_offset + written)
        self._count("read/write", len(data))
        return len(data)


def segments(fd: int, offset: int, length: int) -> Iterator[tuple[int, int, bool]]:
    """The ``(start, size, is_data)`` runs of ``fd``'s range, its holes found by ``SEEK_DATA``/``SEEK_HOLE``.

    Where the file system cannot tell (no ``SEEK_DATA``, or EINVAL), the whole range is data.
    """
    end = offset + length
    seek_data, seek_hole = getattr(os, "SEEK_DATA", None), getattr(os, "SEEK_HOLE", None)
    if seek_data is None or seek_hole is None:
        yield offset, length, True
        return
    position = offset
    while position < end:
        try:
            data = os.lseek(fd, position, seek_data)
            hole = os.lseek(fd, data, seek_hole) if data < end else end
        except OSError as e:
            if e.errno != errno.ENXIO:  # the file system cannot tell: all data
                yield position, end - position, True
                return
            data = hole = end  # ENXIO: no data after position, the rest is a hole
        data, hole = min(data, end), min(hole, end)
        if data > position:
            yield position, data - position, False
        if hole > data:
            yield data, hole - data, True
        position = hole


def _source(tensor: ir.TensorProtocol) -> tuple[str, int] | None:
    """The input file and offset holding ``tensor``'s bytes, if it is an untouched external tensor."""
    import onnx_ir as ir

    # Not isinstance: ExternalTensor derives from a Protocol, whose isinstance costs microseconds.
    if ir.ExternalTensor not in type(tensor).__mro__ or not tensor.valid():  # type: ignore[attr-defined]
        return None
    return tensor.path, tensor.offset or 0


def write_external_data(
    placements: Sequence[Placement], size: int, file: BinaryIO,
    progress: Callable[[int], None] | None = None,
) -> dict[str, int]:  # fmt: skip
    """Writes each placed tensor into ``file`` (opened for writing, empty); returns bytes per method.

    Untouched external tensors are copied by :class:`Copier` from their input
    file, a run of them (see :func:`plan`) as one range, gaps included; the
    others are written with ``tofile`` (or ``tobytes``). ``progress`` is told
    the tensors' bytes (a run's gaps are not counted).

    Raises:
        OSError: a read or write failed.
    """
    reported = _Reported(progress)
    copier = Copier(reported if progress is not None else None)
    sources: dict[str, int] = {}
    written_by_python = 0
    try:
        i = 0
        while i < len(placements):
            p = placements[i]
            if p.source is None:
                file.seek(p.offset)
                if hasattr(p.tensor, "tofile"):
                    p.tensor.tofile(file)
                else:
                    file.write(p.tensor.tobytes())
                written_by_python += p.length
                if progress is not None:
                    progress(p.length)
                i += 1
                continue
            j = i + 1
            while j < len(placements) and not placements[j].run_start:
                j += 1
            last = placements[j - 1]
            path, offset = p.source
            if path not in sources:
                sources[path] = _open_source(path)
            file.flush()
            reported.allow(sum(q.length for q in placements[i:j]))
            copier.copy(sources[path], offset, file.fileno(), p.offset, last.offset + last.length - p.offset)
            reported.finish()
            i = j
        file.flush()
        os.ftruncate(file.fileno(), size)  # a no-op once the last tensor is in; the plan says the size
    finally:
        for fd in sources.values():
            os.close(fd)
    methods = dict(copier.methods)
    if written_by_python:
        methods["python"] = written_by_python
    return methods


def _open_source(path: str) -> int:
    """Opens an input file for the copies; it is read front to back, as ``cp`` tells the kernel."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    if hasattr(os, "posix_fadvise"):
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        except OSError:
            pass  # advice only
    return fd


class _Reported:
    """Passes a run's copied bytes on to ``progress``, up to its tensors' bytes (its gaps are not weights)."""

    def __init__(self, progress: Callable[[int], None] | None) -> None:
        self._progress = progress
        self._left = 0

    def allow(self, n: int) -> None:
        self._left = n

    def __call__(self, n: int) -> None:
        n = min(n, self._left)
        self._left -= n
        if n and self._progress is not None:
            self._progress(n)

    def finish(self) -> None:
        """The run is copied: what is left of its tensors' bytes (a hole the copier skipped counts as copied)."""
        self(self._left)
