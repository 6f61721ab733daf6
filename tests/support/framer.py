"""Drive a ``Framer`` the way the event loop does: ask for a buffer, write what the "socket"
delivered into it (at most the buffer's length), report the count."""

from __future__ import annotations

import random
from collections.abc import Sequence

from exactly.protocol.framing import Framer

SOCKET_READS = (1, 7, 100, 4096, 70_000, 300_000)  # byte counts one recv may deliver


def feed(framer: Framer, stream: bytes, rng: random.Random, reads: Sequence[int] = SOCKET_READS) -> None:
    """Deliver ``stream`` in reads of random size; FrameError propagates."""
    pos = 0
    while pos < len(stream):
        buf = framer.get_buffer(-1)
        n = min(len(buf), len(stream) - pos, rng.choice(reads))
        buf[:n] = stream[pos : pos + n]
        framer.buffer_updated(n)
        pos += n


def feed_chunks(framer: Framer, chunks: Sequence[bytes]) -> None:
    """Deliver each chunk as the socket would (a chunk longer than the buffer takes several reads)."""
    for chunk in chunks:
        pos = 0
        while pos < len(chunk):
            buf = framer.get_buffer(-1)
            n = min(len(buf), len(chunk) - pos)
            buf[:n] = chunk[pos : pos + n]
            framer.buffer_updated(n)
            pos += n
