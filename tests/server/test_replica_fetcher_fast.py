"""The follower's Fetch responses handled in the channel's receive callback (``LeaderFetcher._on_frame``)
against the task's path, and the channel's frame handler over a real loopback connection.

The fetcher runs on real partition logs; the replica manager around it is a stand-in holding them
(the fetcher reads only ``broker.logs``, ``broker.waiters``, ``broker_id`` and ``fetch_timeout_s``).
"""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path
from typing import Any

import pytest
from tests.storage.helpers import make_batch
from tests.support.follower_stubs import Broker, Logs, Manager

from exactly.protocol.fast import FetchPartitionResult, encode_fetch_response
from exactly.protocol.fetch_response import parse_fetch_response
from exactly.replication.truncation import TruncationDecision
from exactly.server.replica_channel import ReplicaChannel
from exactly.server.replica_fetcher import FETCH_VERSION, LeaderFetcher
from exactly.server.replica_truncation import apply_truncation
from exactly.storage.config import LogConfig
from exactly.storage.partition_log import PartitionLog
from exactly.types import TopicPartition

TPS = (TopicPartition("t", 0), TopicPartition("t", 1))
EPOCH = 3


def _fetcher(directory: Path) -> LeaderFetcher:
    logs = {
        tp: PartitionLog.open(
            directory / f"{tp.topic}-{tp.partition}", tp, LogConfig(), recovery_point=0, now_ms=0
        )
        for tp in TPS
    }
    fetcher = LeaderFetcher(Manager(Broker(Logs(logs))), leader=0)  # type: ignore[arg-type]
    for tp in TPS:
        fetcher.follow(tp, EPOCH)  # an empty log: truncating to its HW first, as the task does
        apply_truncation(fetcher.partitions[tp], logs[tp], TruncationDecision(0, True))
    return fetcher


def _batch(base_offset: int, count: int) -> bytes:
    batch = make_batch(count, value_size=100)
    batch[0:8] = base_offset.to_bytes(8, "big")
    batch[12:16] = EPOCH.to_bytes(4, "big")  # partition leader epoch (outside the CRC)
    return bytes(batch)


def _frame(correlation: int, parts: list[FetchPartitionResult]) -> bytearray:
    body = encode_fetch_response(FETCH_VERSION, 0, 0, [("t", parts)])
    return bytearray(struct.pack(">i", correlation) + b"\x00" + b"".join(bytes(c) for c in body))  # type: ignore[arg-type]


def _part(index: int, records: bytes, hw: int, **kw: Any) -> FetchPartitionResult:
    return FetchPartitionResult(index, kw.get("error", 0), hw, hw, 0, None, records, kw.get("diverging"))


def _active(fetcher: LeaderFetcher) -> list[Any]:
    return [p for p in fetcher.partitions.values() if not p.failed]


def _state(fetcher: LeaderFetcher) -> list[tuple[int, int, bytes]]:
    out = []
    for tp in TPS:
        plog = fetcher.manager.broker.logs.get_partition(tp)
        assert plog is not None
        data = b"".join(p.read_bytes() for p in sorted(plog.directory.glob("*.log")))
        out.append((plog.log_end_offset, plog.high_watermark, data))
    return out


def test_plain_responses_in_the_callback_match_the_task_path(tmp_path: Path) -> None:
    fast, slow = _fetcher(tmp_path / "fast"), _fetcher(tmp_path / "slow")
    request = fast._build(_active(fast))
    assert request == slow._build(_active(slow))
    offsets = [0, 0]
    for step in range(6):
        parts = []
        for i in range(2):
            count = (step + i) % 3  # empty answers too
            records = _batch(offsets[i], count) if count else b""
            offsets[i] += count
            parts.append(_part(i, records, hw=max(offsets[i] - 1, 0)))
        frame = _frame(fast._correlation, parts)
        outcome = fast._on_frame(bytearray(frame))
        for part in parse_fetch_response(frame, FETCH_VERSION).partitions:  # the task's loop
            assert slow._handle_partition(frame, part)
        assert isinstance(outcome, bytearray)  # the next request, as the task builds it
        assert outcome == slow._build(_active(slow))
        assert _state(fast) == _state(slow)
    assert [s[0] for s in _state(fast)] == offsets
    assert fast.manager.broker.waiters.notified == slow.manager.broker.waiters.notified


@pytest.mark.parametrize(
    "case", ["error", "diverging", "unknown partition", "correlation", "truncating", "older epoch"]
)
def test_unusual_responses_are_declined_before_any_change(tmp_path: Path, case: str) -> None:
    fetcher = _fetcher(tmp_path)
    fetcher._build(_active(fetcher))
    correlation = fetcher._correlation
    good = _part(0, _batch(0, 2), hw=1)
    other: FetchPartitionResult = _part(1, _batch(0, 1), hw=0)
    if case == "error":
        other = _part(1, b"", hw=0, error=6)  # NOT_LEADER_OR_FOLLOWER
    elif case == "diverging":
        other = _part(1, b"", hw=0, diverging=(EPOCH - 1, 0))
    elif case == "unknown partition":
        fetcher.unfollow(TPS[1])
    elif case == "correlation":
        correlation += 1
    elif case == "truncating":
        fetcher.follow(TPS[1], EPOCH + 1)  # a new epoch: truncating again
    elif case == "older epoch":
        fetcher._sent_epochs[TPS[1]] = EPOCH - 1
    before = _state(fetcher)
    sent = fetcher._correlation
    assert fetcher._on_frame(_frame(correlation, [good, other])) is False
    assert _state(fetcher) == before  # the first, plain partition was not appended either
    assert fetcher._correlation == sent  # no next request built
    assert fetcher.manager.broker.waiters.notified == []


def test_a_stopped_partition_hands_control_back(tmp_path: Path) -> None:
    """Only plain partitions are taken, but the task must still run when one needs a back-off or
    the partitions changed under the request: True, not a next request."""
    fetcher = _fetcher(tmp_path)
    fetcher._build(_active(fetcher))
    fetcher.partitions[TPS[1]].failed = True
    outcome = fetcher._on_frame(_frame(fetcher._correlation, [_part(0, _batch(0, 1), hw=0)]))
    assert isinstance(outcome, bytearray)
    fetcher.follow(TPS[1], EPOCH + 1)  # back, truncating in the new epoch
    outcome = fetcher._on_frame(_frame(fetcher._correlation, [_part(0, _batch(1, 1), hw=1)]))
    assert outcome is True
    assert _state(fetcher)[0][:2] == (2, 1)


# ---- the channel --------------------------------------------------------------------------------


class _Leader(asyncio.Protocol):
    """Answers each size-prefixed request with ``b'r' + its body`` until ``silent_after`` answers."""

    def __init__(self, received: list[bytes], silent_after: int) -> None:
        self.received = received
        self.silent_after = silent_after
        self.buf = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while len(self.buf) >= 4 and len(self.buf) >= 4 + int.from_bytes(self.buf[:4], "big"):
            size = int.from_bytes(self.buf[:4], "big")
            body, self.buf = self.buf[4 : 4 + size], self.buf[4 + size :]
            self.received.append(body)
            if len(self.received) <= self.silent_after:
                answer = b"r" + body
                self.transport.write(len(answer).to_bytes(4, "big") + answer)  # type: ignore[attr-defined]


def _request(n: int) -> bytes:
    body = b"q%d" % n
    return len(body).to_bytes(4, "big") + body


async def _with_channel(silent_after: int, run: Any) -> list[bytes]:
    received: list[bytes] = []
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Leader(received, silent_after), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    channel = await ReplicaChannel.open("127.0.0.1", port)
    try:
        await run(channel)
    finally:
        channel.close()
        server.close()
    return received


def test_channel_frame_handler_sends_the_next_request_in_the_callback() -> None:
    seen: list[bytes] = []

    def on_frame(frame: bytearray) -> bytes | bytearray | bool:
        seen.append(bytes(frame))
        if len(seen) < 5:
            return _request(len(seen))
        return len(seen) == 5

    async def run(channel: ReplicaChannel) -> None:
        assert await channel.call(_request(0), 5.0, on_frame) is None  # taken, control back
        frame = await channel.call(_request(5), 5.0, on_frame)  # declined: the caller gets it
        assert frame == b"rq5"
        assert await channel.call(_request(6), 5.0) == b"rq6"  # no handler: as before

    received = asyncio.run(_with_channel(100, run))
    assert received == [b"q%d" % i for i in range(7)]
    assert seen == [b"rq%d" % i for i in range(6)]


def test_channel_raises_what_the_handler_raised_and_times_out_after_its_requests() -> None:
    def failing(frame: bytearray) -> bytes | bytearray | bool:
        raise ValueError("bad frame")

    answered: list[bytes] = []

    def chain(frame: bytearray) -> bytes | bytearray | bool:
        answered.append(bytes(frame))
        return _request(len(answered))

    async def fail(channel: ReplicaChannel) -> None:
        with pytest.raises(ValueError, match="bad frame"):
            await channel.call(_request(0), 5.0, failing)
        with pytest.raises(ConnectionError):  # the stream is not trusted any more
            await channel.call(_request(1), 5.0)

    async def time_out(channel: ReplicaChannel) -> None:
        with pytest.raises(TimeoutError):  # two answers, then the leader goes silent
            await channel.call(_request(0), 0.3, chain)

    assert asyncio.run(_with_channel(3, fail)) == [b"q0"]
    received = asyncio.run(_with_channel(2, time_out))
    assert answered == [b"rq0", b"rq1"]
    assert received == [b"q0", b"q1", b"q2"]
