"""KafkaConnection's receive path: frames come out whole and in order however the kernel splits
the bytes, large frames land in their own buffer, and an oversized frame closes the connection."""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass, field

import pytest

from exactly.server.connection import LARGE_FRAME, SMALL_BUFFER, KafkaConnection


@dataclass
class _Transport:
    closed: bool = False
    paused: int = 0
    resumed: int = 0

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        self.paused += 1

    def resume_reading(self) -> None:
        self.resumed += 1


@dataclass
class _Broker:
    max_request_size: int = 10 * 1024 * 1024
    connections: set = field(default_factory=set)


def _connection(max_size: int = 10 * 1024 * 1024) -> tuple[KafkaConnection, _Transport]:
    conn = KafkaConnection(_Broker(max_size))  # type: ignore[arg-type]
    transport = _Transport()
    conn.transport = transport  # type: ignore[assignment]
    return conn, transport


def _feed(conn: KafkaConnection, stream: bytes, rng: random.Random) -> None:
    pos = 0
    while pos < len(stream):
        buf = conn.get_buffer(-1)
        n = min(len(buf), len(stream) - pos, rng.choice([1, 7, 100, 4096, 70_000, 300_000]))
        buf[:n] = stream[pos : pos + n]
        conn.buffer_updated(n)
        pos += n


@pytest.mark.parametrize("seed", range(5))
def test_frames_in_order_for_any_split(seed: int) -> None:
    rng = random.Random(seed)
    sizes = [
        rng.choice([0, 1, 50, 1000, LARGE_FRAME - 1, LARGE_FRAME, SMALL_BUFFER + 5, 1_200_000])
        for _ in range(30)
    ]
    payloads = [bytes([i % 251]) * s for i, s in enumerate(sizes)]
    stream = b"".join(struct.pack(">i", len(p)) + p for p in payloads)
    conn, transport = _connection()
    _feed(conn, stream, rng)
    got = [bytes(f) for f in conn._frames]
    assert got == payloads
    assert not transport.closed
    assert all(isinstance(f, bytearray) for f in conn._frames)  # writable: produce patches in place


def test_oversized_and_negative_sizes_close_the_connection() -> None:
    conn, transport = _connection(max_size=1000)
    _feed(conn, struct.pack(">i", 1001) + b"x" * 10, random.Random(1))
    assert transport.closed and not conn._frames
    conn, transport = _connection()
    _feed(conn, struct.pack(">i", -5), random.Random(1))
    assert transport.closed


def test_read_ahead_is_bounded() -> None:
    conn, transport = _connection()
    stream = b"".join(struct.pack(">i", 3) + b"abc" for _ in range(100))
    _feed(conn, stream, random.Random(2))
    assert transport.paused == 1  # paused once the queue reached its bound
    assert len(conn._frames) == 100
