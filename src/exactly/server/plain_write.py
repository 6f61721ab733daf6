"""Writing responses to a plaintext connection: one ``writelines`` for the chunks, except that a
Fetch answer's records may be a ``FileSlice`` of a segment file, sent with ``os.sendfile`` (page
cache to socket, no copy in user space). The TLS counterpart is ``tls_write`` (the kernel cannot
encrypt a sendfile, so the dispatcher hands TLS connections no slices).

An answer with a slice is written corked (``TCP_CORK``, what nginx's ``tcp_nopush`` does around
sendfile): its chunks before the slice (the response and partition headers), the slice and the
chunks after it (the closing tagged fields, 3 bytes at Fetch v12) are three system calls, and on
a socket with ``TCP_NODELAY`` (every broker socket) each would leave as its own segment. The
reader then woke for the 72-byte header, again for the records and again for the last 3 bytes
(measured on a follower: three event-loop wake-ups per replicated 1 MB batch). Corked, the kernel
holds the pieces and sends full segments: the follower's first wake-up finds the header with most
of the records, a second one the rest. Uncorking pushes what is held at once, so nothing waits
for the cork's 200 ms ceiling.
"""

from __future__ import annotations

import asyncio
import os
import socket
from typing import Any

from exactly.storage.file_slice import FileSlice

_CORK = getattr(socket, "TCP_CORK", None)  # Linux only; elsewhere the pieces go uncorked


def write_plain(transport: asyncio.Transport, chunks: list[Any]) -> None:
    """``writelines``, except that a ``FileSlice`` chunk (a Fetch answer's records) is sent from
    its segment file (``send_slice``), the whole answer corked (module docstring)."""
    start = 0
    corked: socket.socket | None = None
    try:
        for i, chunk in enumerate(chunks):
            if type(chunk) is FileSlice:
                if corked is None:
                    corked = _cork(transport)
                if i > start:
                    transport.writelines(chunks[start:i])
                send_slice(transport, chunk)
                start = i + 1
        if start == 0:
            transport.writelines(chunks)
        elif start < len(chunks):
            transport.writelines(chunks[start:])
    finally:
        if corked is not None:
            _uncork(corked)


def _cork(transport: asyncio.Transport) -> socket.socket | None:
    """Set TCP_CORK on the transport's socket; the socket when it was set (to uncork), None when
    there is nothing to cork (not TCP, not Linux, closing)."""
    sock = transport.get_extra_info("socket")
    if _CORK is None or sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return None
    try:
        sock.setsockopt(socket.IPPROTO_TCP, _CORK, 1)
    except OSError:
        return None
    return sock  # type: ignore[no-any-return]


def _uncork(sock: socket.socket) -> None:
    """Send what the cork holds now. Whatever the transport still buffers (a socket that was
    full) is written later by the transport itself, uncorked."""
    try:
        sock.setsockopt(socket.IPPROTO_TCP, _CORK, 0)  # type: ignore[arg-type]
    except OSError:
        pass  # a connection already broken: the transport reports it


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
        if sent == piece.size:
            return  # all of it went (no read of nothing)
        rest = piece.read(sent)
        if len(rest) != piece.size - sent:
            raise ConnectionError("a segment file was truncated under a Fetch answer being sent")
        if rest:
            transport.write(rest)
    finally:
        piece.close()
