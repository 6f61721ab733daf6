"""KafkaConnection reuses an answered large frame's buffer for the next large frame, and only when
nothing else references it (a produce request's records are memoryviews into its frame): the
resized spare must come out whole, byte for byte, whatever the size sequence."""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass, field

from exactly.server.connection import LARGE_FRAME, KafkaConnection


@dataclass
class _Transport:
    closed: bool = False

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


@dataclass
class _Broker:
    max_request_size: int = 10 * 1024 * 1024
    connections: set = field(default_factory=set)


def _feed(conn: KafkaConnection, stream: bytes, rng: random.Random) -> None:
    pos = 0
    while pos < len(stream):
        buf = conn.get_buffer(-1)
        n = min(len(buf), len(stream) - pos, rng.choice([1, 100, 4096, 70_000, 300_000]))
        buf[:n] = stream[pos : pos + n]
        conn.buffer_updated(n)
        pos += n


def _frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def test_spare_buffer_is_resized_and_filled_whole() -> None:
    rng = random.Random(3)
    conn = KafkaConnection(_Broker())  # type: ignore[arg-type]
    conn.transport = _Transport()  # type: ignore[assignment]
    sizes = [1_000_000, 990_000, 1_050_000, LARGE_FRAME, 1_000_000, 3_000_000, 200_000]
    for i, size in enumerate(sizes):
        payload = bytes([(i * 37 + j) % 251 for j in range(251)]) * (size // 251) + b"x" * (size % 251)
        _feed(conn, _frame(payload), rng)
        got = conn._frames.popleft()
        assert isinstance(got, bytearray) and bytes(got) == payload
        conn._release(got)  # as _process does once the request is answered and unreferenced
        del got
