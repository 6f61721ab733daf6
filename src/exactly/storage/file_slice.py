"""A byte range of a segment file handed to the network layer instead of a copy of its bytes.

Why: a Fetch answer of whole batches is a byte range of one segment. Read with ``os.pread`` it is
copied from the page cache into a ``bytes``, then again when the transport joins a response's
chunks; the connection can instead ``os.sendfile`` the range from the file to the socket (Kafka's
FileRecords.writeTo / transferTo), and only the part the socket does not take at once is read.

The slice owns a duplicate of the segment's descriptor (``os.dup``), taken when the read
happens: the segment may be closed, deleted by retention or rolled before the answer is written
(the answer waits behind earlier ones on its connection), and the duplicate keeps the file's
data reachable under the same inode. A truncation of that same file in between (a leader that
became a follower) makes the file shorter than the slice: ``read`` then returns fewer bytes than
``len()`` and the writer must drop the connection, since the response's size is already framed.

Lifecycle: created by ``LogSegment.slice`` -> written once by the connection -> ``close`` (also on
garbage collection, for an answer dropped with its connection).
"""

from __future__ import annotations

import os


class FileSlice:
    """``size`` bytes at ``offset`` of the file behind ``fd`` (a private duplicate)."""

    __slots__ = ("_fd", "offset", "size")

    def __init__(self, fd: int, offset: int, size: int) -> None:
        self._fd = os.dup(fd)
        self.offset = offset
        self.size = size

    def __len__(self) -> int:
        return self.size

    def fileno(self) -> int:
        return self._fd

    def read(self, start: int = 0) -> bytes:
        """The bytes from ``start`` (relative to the slice) to its end; fewer when the file was
        truncated meanwhile."""
        return os.pread(self._fd, self.size - start, self.offset + start)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        self.close()
