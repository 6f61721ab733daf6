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
full disk a reservation is space other files cannot have (at most ``segment``'s
PREALLOCATE_AHEAD per active segment taking bulk appends); a refused one only means the write
goes ahead without it, and fails or not exactly as it would have.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Callable

_FALLOC_FL_KEEP_SIZE = 1


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


__all__ = ["preallocate", "write_whole"]
