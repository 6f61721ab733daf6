"""A batch written to a segment file whole, or not at all.

Why apart from ``segment``: the same contract (all of the bytes at a position, or the file cut
back to that position so no torn batch stays behind a failed write) is what an append needs,
and the common case -- one ``pwrite`` that takes every byte -- runs once per appended batch, so
it is checked before any loop or buffer slicing is set up.

``preallocate`` reserves disk blocks past the end of a file without changing its size (Linux
``fallocate`` with FALLOC_FL_KEEP_SIZE). Profiled at 100 B-record produce, the segment ``pwrite``
was a quarter of the broker's CPU and a third of that was ext4's delayed-allocation bookkeeping
per 4 KB page (block reservation, quota, extent-status entries); into preallocated blocks the
same 700 KB write costs ~25% less (measured 197 -> 148 µs; the fsync that follows costs the
same). The file's size, and so everything that reads or recovers the log, is unchanged: blocks
past the end are invisible, ``ftruncate`` to the size frees them, and deleting the file frees
them too. Kafka's ``log.preallocate`` is a different thing (it sets the file length up front
and trims it at roll); this keeps the "file length = log end" invariant of ``segment``. Near a
full disk a reservation is space other files cannot have (at most PREALLOCATE_AHEAD per active
segment taking bulk appends); a refused one only means the write goes ahead without it, and
fails or not exactly as it would have. ``BlockReserve`` is one file's reservation: when to ask
for more, and freeing what is left at roll, close and truncation.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Callable

_FALLOC_FL_KEEP_SIZE = 1
PREALLOCATE_MIN_WRITE = 256 * 1024  # a write this big (a bulk append) reserves blocks first
PREALLOCATE_AHEAD = 16 * 1024 * 1024  # reserved past the end of such a write


def write_whole(fd: int, data: bytes | bytearray | memoryview, position: int) -> None:
    """Write all of ``data`` at ``position`` of ``fd``; on any failure truncate the file back to
    ``position`` (what was there before the call) and re-raise."""
    try:
        written = os.pwrite(fd, data, position)
        if written == len(data):  # nearly always: a regular file takes the whole write
            return
        with memoryview(data) as view:  # a short write (signal, full disk): write the rest
            rest = view[written:]
            while rest:
                n = os.pwrite(fd, rest, position + written)
                rest = rest[n:]
                written += n
    except BaseException:
        os.ftruncate(fd, position)  # never leave a torn batch behind a failed write
        raise


def _fallocate() -> Callable[[int, int, int, int], int] | None:
    """libc's ``fallocate`` (Linux only; Python's ``os.posix_fallocate`` cannot keep the size)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        func = ctypes.CDLL(None, use_errno=True).fallocate
    except (OSError, AttributeError):
        return None
    func.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    func.restype = ctypes.c_int
    return func


_FALLOCATE = _fallocate()


def preallocate(fd: int, offset: int, length: int) -> bool:
    """Reserve blocks for ``[offset, offset + length)`` of ``fd`` without changing its size.
    False when the platform or file system cannot (the caller stops asking); never raises:
    this only makes later writes cheaper."""
    if _FALLOCATE is None:
        return False
    return bool(_FALLOCATE(fd, _FALLOC_FL_KEEP_SIZE, offset, length) == 0)


class BlockReserve:
    """The blocks reserved past the end of one growing file (``preallocate``). Invariant:
    ``_upto`` is 0 when nothing is reserved, the end of the reservation otherwise (for a file
    opened again, where its blocks end: ``of_existing``), and -1 once the file system refused
    (then it is never asked again)."""

    __slots__ = ("_upto",)

    def __init__(self, upto: int = 0) -> None:
        self._upto = upto

    @classmethod
    def of_existing(cls, st: os.stat_result) -> BlockReserve:
        """The reservation of a file opened again, from its ``fstat``: blocks held well past its
        size (more than PREALLOCATE_MIN_WRITE: not the file system's own metadata) were reserved
        by a process killed before it freed them (kill -9 between a bulk write and roll/close).
        They count as reserved up to where they end, so the next roll or close frees them as it
        frees its own; a fresh reserve would free them only if a bulk write came first."""
        held = st.st_blocks * 512
        return cls(held if held > st.st_size + PREALLOCATE_MIN_WRITE else 0)

    def before_write(self, fd: int, position: int, length: int) -> None:
        """A bulk write of ``length`` bytes at ``position`` past the reservation reserves
        PREALLOCATE_AHEAD more beyond it first."""
        end = position + length
        if end > self._upto >= 0 and length >= PREALLOCATE_MIN_WRITE:
            ok = preallocate(fd, position, length + PREALLOCATE_AHEAD)
            self._upto = end + PREALLOCATE_AHEAD if ok else -1

    def release(self, fd: int, size: int) -> None:
        """Free what is reserved past ``size`` (the file's size, unchanged)."""
        if self._upto > size:
            os.ftruncate(fd, size)  # the same size: only the reserved blocks go
            self._upto = 0

    def truncated(self) -> None:
        """The file was cut back with ``ftruncate``, which freed the reservation too."""
        self._upto = min(self._upto, 0)


__all__ = ["PREALLOCATE_AHEAD", "PREALLOCATE_MIN_WRITE", "BlockReserve", "preallocate", "write_whole"]
