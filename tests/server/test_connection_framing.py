"""KafkaConnection's receive path: the socket's bytes go through the framer, whole frames are
queued in order, read-ahead is bounded, and a frame size Kafka refuses closes the connection
with a log line."""

from __future__ import annotations

import logging
import random
import struct
from dataclasses import dataclass, field

import pytest

from exactly.protocol.framing import LARGE_FRAME, SMALL_BUFFER, frame
from exactly.server.connection import KafkaConnection
from exactly.server.request_task import MAX_QUEUED_FRAMES


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
    replicas: None = None  # single broker: no cluster replica manager


def _connection(max_size: int = 10 * 1024 * 1024) -> tuple[KafkaConnection, _Transport]:
    conn = KafkaConnection(_Broker(max_size))  # type: ignore[arg-type]
    transport = _Transport()
    conn.transport = transport  # type: ignore[assignment]
    return conn, transport


def _feed(conn: KafkaConnection, stream: bytes, rng: random.Random) -> None:
    pos = 0
    while pos < len(stream) and not conn._closing:
        buf = conn.get_buffer(-1)
        n = min(len(buf), len(stream) - pos, rng.choice([1, 7, 100, 4096, 70_000, 300_000]))
        buf[:n] = stream[pos : pos + n]
        conn.buffer_updated(n)
        pos += n


@pytest.mark.parametrize("seed", range(3))
def test_frames_in_order_for_any_split(seed: int) -> None:
    rng = random.Random(seed)
    sizes = [rng.choice([0, 1, 50, 1000, LARGE_FRAME, SMALL_BUFFER + 5, 1_200_000]) for _ in range(20)]
    payloads = [bytes([i % 251]) * s for i, s in enumerate(sizes)]
    conn, transport = _connection()
    _feed(conn, b"".join(frame(p) for p in payloads), rng)
    assert [bytes(f) for f in conn._frames] == payloads
    assert not transport.closed


def test_oversized_and_negative_sizes_close_the_connection(caplog: pytest.LogCaptureFixture) -> None:
    conn, transport = _connection(max_size=1000)
    with caplog.at_level(logging.WARNING, logger="exactly.connection"):
        _feed(conn, frame(b"ok") + struct.pack(">i", 1001) + b"x" * 10, random.Random(1))
    assert transport.closed and conn._closing
    assert "frame size 1001 outside [0, 1000]" in caplog.text
    conn, transport = _connection()
    _feed(conn, struct.pack(">i", -5), random.Random(1))
    assert transport.closed


def test_read_ahead_is_bounded() -> None:
    conn, transport = _connection()
    stream = b"".join(frame(b"abc") for _ in range(100))
    _feed(conn, stream, random.Random(2))
    assert transport.paused == 1  # paused once the queue reached its bound
    assert len(conn._frames) == 100 >= MAX_QUEUED_FRAMES


def test_a_partly_received_large_frame_is_not_idle() -> None:
    conn, _ = _connection()
    data = frame(b"x" * (LARGE_FRAME * 2))
    conn.get_buffer(-1)[:1000] = data[:1000]
    conn.buffer_updated(1000)
    assert conn.idle_for(conn.last_active + 100) == 0.0
