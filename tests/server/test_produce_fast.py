"""The Produce fast path (exactly.server.produce_fast) against the generic path: the same bytes.

Two in-process brokers get the same request frames through ``dispatch``; on one the fast path is
off. Every answer, every segment file and the producer state must be identical, and the fast
path must have answered exactly the requests of its shape (and declined the rest, which the
generic path then answered: errors, duplicates, other shapes).
"""

from __future__ import annotations

import asyncio
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.fast_paths import Counting, Off

import exactly.server.dispatch as dispatch_module
import exactly.server.handlers.produce as produce_module
from exactly.protocol.primitives import write_uvarint
from exactly.records.builder import Record, build_batch
from exactly.server.broker import Broker, Endpoint
from exactly.server.config import BrokerConfig
from exactly.server.dispatch import CloseConnection, dispatch

NOW = 1_700_000_000_000
TOPIC = "orders"


def _compact(raw: bytes | None) -> bytes:
    return b"\x00" if raw is None else write_uvarint(len(raw) + 1) + raw


def produce_frame(
    topics: list[tuple[str, list[tuple[int, bytes | None]]]],
    *,
    version: int = 9,
    acks: int = -1,
    txn_id: str | None = None,
    client_id: str | None = "fast-test",
    correlation_id: int = 7,
) -> bytearray:
    """A Produce request frame (without its size prefix), written by hand as a client does."""
    flexible = version >= 9
    out = bytearray(struct.pack(">hhi", 0, version, correlation_id))
    if client_id is None:
        out += struct.pack(">h", -1)
    else:
        out += struct.pack(">h", len(client_id)) + client_id.encode()
    if flexible:
        out += b"\x00"  # header tags
        out += _compact(None if txn_id is None else txn_id.encode())
    else:
        out += struct.pack(">h", -1) if txn_id is None else struct.pack(">h", len(txn_id)) + txn_id.encode()
    out += struct.pack(">hi", acks, 30_000)
    out += write_uvarint(len(topics) + 1) if flexible else struct.pack(">i", len(topics))
    for name, parts in topics:
        out += _compact(name.encode()) if flexible else struct.pack(">h", len(name)) + name.encode()
        out += write_uvarint(len(parts) + 1) if flexible else struct.pack(">i", len(parts))
        for index, records in parts:
            out += struct.pack(">i", index)
            if flexible:
                out += _compact(records) + b"\x00"
            else:
                out += struct.pack(">i", -1) if records is None else struct.pack(">i", len(records)) + records
        if flexible:
            out += b"\x00"
    if flexible:
        out += b"\x00"
    return out


def batch(n: int = 3, *, pid: int = -1, epoch: int = -1, seq: int = -1, size: int = 100, **kw: Any) -> bytes:
    return build_batch(
        [Record(bytes([i % 251]) * size) for i in range(n)],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        base_timestamp=NOW - 5,
        **kw,
    )


def _open(data_dir: Path, fast: bool) -> Broker:
    conf = {
        "log.dirs": str(data_dir),
        "group.initial.rebalance.delay.ms": "0",
        "auto.create.topics.enable": "false",
    }
    broker = Broker.open(BrokerConfig.load(None, conf), data_dir)
    broker.advertised = Endpoint("127.0.0.1", 9092)
    broker.logs.create_topic(TOPIC, 2, {}, now_ms=NOW)
    broker.logs.create_topic("stamped", 1, {"message.timestamp.type": "LogAppendTime"}, now_ms=NOW)
    broker.logs.create_topic("tiny", 1, {"max.message.bytes": "200"}, now_ms=NOW)
    broker.fast_produce = Counting(broker.fast_produce) if fast else Off()  # type: ignore[assignment]
    return broker


@pytest.fixture
def pair(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Broker, Broker]]:
    monkeypatch.setattr(dispatch_module, "now_ms", lambda: NOW)
    monkeypatch.setattr(produce_module, "now_ms", lambda: NOW)
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        fast, generic = _open(Path(a), True), _open(Path(b), False)
        yield fast, generic
        fast.logs.close()
        generic.logs.close()


def _send(broker: Broker, frame: bytearray) -> Any:
    async def go() -> Any:
        try:
            result = await dispatch(broker, bytearray(frame), "test")
        except CloseConnection as exc:
            return ("closed", str(exc))
        return None if result is None else b"".join(bytes(c) for c in result)

    return asyncio.run(go())


def _same(pair: tuple[Broker, Broker], frame: bytearray, fast_answers: bool) -> Any:
    fast, generic = pair
    before = fast.fast_produce.taken  # type: ignore[attr-defined]
    got, want = _send(fast, frame), _send(generic, frame)
    assert got == want
    assert fast.fast_produce.taken - before == int(fast_answers)  # type: ignore[attr-defined]
    return got


def _state(broker: Broker) -> list[Any]:
    out: list[Any] = []
    for plog in broker.logs.partitions():
        files = {p.name: p.read_bytes() for p in sorted(plog.directory.iterdir()) if p.suffix != ".snapshot"}
        out.append((str(plog.tp), plog.log_end_offset, plog.high_watermark, files, plog.producers()))
    return sorted(out, key=lambda row: row[0])


def test_common_produce_is_answered_by_the_fast_path_with_the_generic_bytes(
    pair: tuple[Broker, Broker],
) -> None:
    for seq in range(0, 30, 3):  # idempotent, acks=all
        _same(pair, produce_frame([(TOPIC, [(0, batch(pid=1000, epoch=0, seq=seq))])]), True)
    for version in (9, 10, 11):  # plain producer, acks=1, every flexible version
        _same(pair, produce_frame([(TOPIC, [(1, batch(5))])], version=version, acks=1), True)
    _same(pair, produce_frame([(TOPIC, [(1, batch(1))])], client_id=None), True)
    _same(pair, produce_frame([(TOPIC, [(1, batch(1))])], client_id="c" * 300), True)
    _same(pair, produce_frame([(TOPIC, [(0, batch(3000, pid=1000, epoch=0, seq=30))])]), True)  # 330 KB
    _same(pair, produce_frame([(TOPIC, [(0, batch(2, pid=1000, epoch=1, seq=0))])]), True)  # epoch bump
    _same(pair, produce_frame([(TOPIC, [(0, batch(2, pid=2000, epoch=3, seq=17))])]), True)  # new producer
    assert _state(pair[0]) == _state(pair[1])


@pytest.mark.parametrize(
    "frame",
    [
        pytest.param(produce_frame([(TOPIC, [(0, batch(3, pid=1000, epoch=0, seq=0))])]), id="duplicate"),
        pytest.param(produce_frame([(TOPIC, [(0, batch(3, pid=1000, epoch=0, seq=7))])]), id="out-of-order"),
        pytest.param(
            produce_frame([(TOPIC, [(0, batch(3, pid=1000, epoch=1, seq=4))])]), id="new-epoch-not-0"
        ),
        pytest.param(produce_frame([(TOPIC, [(0, batch(3, pid=1000, epoch=-2, seq=0))])]), id="bad-epoch"),
        pytest.param(produce_frame([(TOPIC, [(0, batch(3), *())])], acks=0), id="acks-0"),
        pytest.param(produce_frame([(TOPIC, [(0, batch(3))])], acks=2), id="acks-2"),
        pytest.param(produce_frame([(TOPIC, [(0, batch(3)), (1, batch(2))])]), id="two-partitions"),
        pytest.param(
            produce_frame([(TOPIC, [(0, batch(3))]), ("stamped", [(0, batch(1))])]), id="two-topics"
        ),
        pytest.param(produce_frame([(TOPIC, [(0, batch(3))])], txn_id="t1"), id="transactional-id"),
        pytest.param(
            produce_frame(
                [(TOPIC, [(0, batch(3, pid=1000, epoch=0, seq=3, transactional=True))])], txn_id="t1"
            ),
            id="transactional-batch",
        ),
        pytest.param(produce_frame([(TOPIC, [(0, batch(3, control=True))])]), id="control-batch"),
        pytest.param(produce_frame([("stamped", [(0, batch(2))])]), id="log-append-time"),
        pytest.param(produce_frame([("tiny", [(0, batch(3))])]), id="max-message-bytes"),
        pytest.param(produce_frame([("missing", [(0, batch(3))])]), id="unknown-topic"),
        pytest.param(produce_frame([(TOPIC, [(7, batch(3))])]), id="unknown-partition"),
        pytest.param(produce_frame([("__consumer_offsets", [(0, batch(3))])]), id="internal-topic"),
        pytest.param(produce_frame([(TOPIC, [(0, None)])]), id="null-records"),
        pytest.param(produce_frame([(TOPIC, [(0, batch(3) + batch(2))])]), id="two-batches"),
        pytest.param(produce_frame([(TOPIC, [(0, batch(3)[:-1])])]), id="truncated-batch"),
        pytest.param(produce_frame([(TOPIC, [(0, batch(3), *())])], version=8), id="v8"),
        pytest.param(produce_frame([(TOPIC, [(0, batch(3))])])[:-2], id="truncated-frame"),
        pytest.param(produce_frame([(TOPIC, [(0, batch(3))])]) + b"\x00", id="trailing-byte"),
    ],
)
def test_other_requests_fall_back_to_the_generic_path(pair: tuple[Broker, Broker], frame: bytearray) -> None:
    _same(pair, produce_frame([(TOPIC, [(0, batch(3, pid=1000, epoch=0, seq=0))])]), True)
    _same(pair, frame, False)
    assert _state(pair[0]) == _state(pair[1])


def test_bad_crc_falls_back_and_gets_corrupt_message(pair: tuple[Broker, Broker]) -> None:
    raw = bytearray(batch(3))
    raw[-1] ^= 0xFF
    answer = _same(pair, produce_frame([(TOPIC, [(0, bytes(raw))])]), False)
    assert struct.unpack_from(">h", answer, 4 + 4 + 1 + 1 + 1 + len(TOPIC) + 1 + 4)[0] == 2  # CORRUPT_MESSAGE
    assert _state(pair[0]) == _state(pair[1])


def test_a_deleted_and_recreated_topic_is_looked_up_again(pair: tuple[Broker, Broker]) -> None:
    frame = produce_frame([(TOPIC, [(0, batch(2))])])
    _same(pair, frame, True)
    for broker in pair:
        broker.logs.delete_topic(TOPIC)
    _same(pair, frame, False)  # unknown topic: the generic path answers
    for broker in pair:
        broker.logs.create_topic(TOPIC, 2, {}, now_ms=NOW)
    _same(pair, frame, True)
    assert _state(pair[0]) == _state(pair[1])
