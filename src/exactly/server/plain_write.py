"""Writing responses to a plaintext connection: one ``writelines`` for the chunks, except that a
Fetch answer's records may be a ``FileSlice`` of a segment file, sent with ``os.sendfile`` (page
cache to socket, no copy in user space). The TLS counterpart is ``tls_write`` (the kernel cannot
encrypt a sendfile, so the dispatcher hands TLS connections no slices)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from exactly.storage.file_slice import FileSlice


def write_plain(transport: asyncio.Transport, chunks: list[Any]) -> None:
    """``writelines``, except that a ``FileSlice`` chunk (a Fetch answer's records) is sent from
    its segment file (``send_slice``)."""
    start = 0
    for i, chunk in enumerate(chunks):
        if type(chunk) is FileSlice:
            if i > start:
                transport.writelines(chunks[start:i])
            send_slice(transport, chunk)
            start = i + 1
    if start == 0:
        transport.writelines(chunks)
    elif start < len(chunks):
        transport.writelines(chunks[start:])


def send_slice(transport: asyncio.Transport, piece: FileSlice) -> None:
    """As much of ``piece`` as the socket takes now goes with ``os.sendfile`` (page cache to
    socket, no copy in user space), the rest as a copy through the transport. Only when the
    transport holds nothing unsent, or the bytes would overtake it; then all of it is copied.
    Raises ConnectionError when the file shrank under the slice (the answer's size is framed
    already, so the connection cannot go on)."""
    sent = 0
    try:
        sock = transport.get_extra_info("socket")
        if sock is not None and transport.get_write_buffer_size() == 0 and not transport.is_closing():
            out, src = sock.fileno(), piece.fileno()
            try:
                while sent < piece.size:
                    n = os.sendfile(out, src, piece.offset + sent, piece.size - sent)
                    if n == 0:  # end of file: the copy below finds out how short
                        break
                    sent += n
            except (BlockingIOError, InterruptedError):
                pass  # the socket is full: the transport queues the rest
            except OSError:
                pass  # a broken connection: the transport's own write reports it
        rest = piece.read(sent)
        if len(rest) != piece.size - sent:
            raise ConnectionError("a segment file was truncated under a Fetch answer being sent")
        if rest:
            transport.write(rest)
    finally:
        piece.close()
