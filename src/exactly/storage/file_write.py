"""A batch written to a segment file whole, or not at all.

Why apart from ``segment``: the same contract (all of the bytes at a position, or the file cut
back to that position so no torn batch stays behind a failed write) is what an append needs,
and the common case -- one ``pwrite`` that takes every byte -- runs once per appended batch, so
it is checked before any loop or buffer slicing is set up.
"""

from __future__ import annotations

import os


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


__all__ = ["write_whole"]
