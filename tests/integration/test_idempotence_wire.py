"""Idempotent-producer rules at the wire level (KIP-98/KIP-360), with hand-built batches.

InitProducerId (non-transactional) gives a producer id and epoch; Produce batches carry
(producer id, epoch, base sequence). The broker must:
* ack a resend of any of the last 5 batches with its ORIGINAL base offset and store nothing;
* answer OUT_OF_ORDER_SEQUENCE_NUMBER (45) to a gap, or to a new epoch not starting at 0;
* answer INVALID_PRODUCER_EPOCH (47) to an epoch older than one already written;
* accept any sequence from a producer it has no state for;
* keep all of that across kill -9 and clean restarts.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from exactly.records.builder import Record, build_batch
from tests.support.broker import Broker
from tests.support.wire import (
    WireClient,
    create_topic,
    fetch_records,
    init_producer_id,
    log_end_offset,
    partition_response,
    produce_request,
)

pytestmark = pytest.mark.timeout(60)

OUT_OF_ORDER_SEQUENCE_NUMBER = 45
INVALID_PRODUCER_EPOCH = 47


def batch(pid: int, epoch: int, seq: int, n: int, tag: str = "r") -> bytes:
    ts = int(time.time() * 1000)
    return build_batch(
        [Record(value=f"{tag}-{seq + i}".encode(), key=f"k{seq + i}".encode()) for i in range(n)],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        base_timestamp=ts,
    )


def produce(c: WireClient, topic: str, data: bytes, version: int = 8) -> Any:
    return partition_response(c.send(produce_request(topic, 0, data, version=version)))


def ok_offset(c: WireClient, topic: str, data: bytes, version: int = 8) -> int:
    part = produce(c, topic, data, version)
    assert part.error_code == 0, f"produce failed: {part.error_code!r}"
    return int(part.base_offset)


@pytest.fixture
def conn(broker: Broker, topic: str) -> Any:
    with WireClient(broker.bootstrap) as c:
        assert create_topic(c, topic).error_code == 0
        yield c


def test_init_producer_id_hands_out_distinct_ids(conn: WireClient) -> None:
    ids = {init_producer_id(conn)[0] for _ in range(5)}
    assert len(ids) == 5
    assert all(pid >= 0 for pid in ids)
    _pid, epoch = init_producer_id(conn)
    assert epoch >= 0


@pytest.mark.parametrize("version", [3, 8])
def test_resend_returns_original_offset_and_stores_nothing(
    conn: WireClient, topic: str, version: int
) -> None:
    pid, epoch = init_producer_id(conn)
    b0 = batch(pid, epoch, 0, 3)
    b1 = batch(pid, epoch, 3, 2)
    assert ok_offset(conn, topic, b0, version) == 0
    assert ok_offset(conn, topic, b1, version) == 3
    assert log_end_offset(conn, topic) == 5

    assert ok_offset(conn, topic, b1, version) == 3
    assert ok_offset(conn, topic, b0, version) == 0
    assert ok_offset(conn, topic, b1, version) == 3
    assert log_end_offset(conn, topic) == 5
    values = [r.value for r in fetch_records(conn, topic)]
    assert values == [f"r-{i}".encode() for i in range(5)]


def test_any_of_last_five_batches_is_deduplicated(conn: WireClient, topic: str) -> None:
    pid, epoch = init_producer_id(conn)
    batches = [batch(pid, epoch, 2 * i, 2) for i in range(7)]
    offsets = [ok_offset(conn, topic, b) for b in batches]
    assert offsets == [2 * i for i in range(7)]
    for i in range(2, 7):  # the last five
        assert ok_offset(conn, topic, batches[i]) == offsets[i]
    assert log_end_offset(conn, topic) == 14
    # older than the cached five: Kafka cannot tell, and answers out-of-order
    part = produce(conn, topic, batches[0])
    assert part.error_code == OUT_OF_ORDER_SEQUENCE_NUMBER
    assert log_end_offset(conn, topic) == 14


def test_sequence_gap_is_out_of_order(conn: WireClient, topic: str) -> None:
    pid, epoch = init_producer_id(conn)
    assert ok_offset(conn, topic, batch(pid, epoch, 0, 5)) == 0
    part = produce(conn, topic, batch(pid, epoch, 6, 1))  # 5 is missing
    assert part.error_code == OUT_OF_ORDER_SEQUENCE_NUMBER
    assert log_end_offset(conn, topic) == 5
    # a batch that overlaps the last one without matching it exactly is not a duplicate either
    part = produce(conn, topic, batch(pid, epoch, 3, 2))
    assert part.error_code == OUT_OF_ORDER_SEQUENCE_NUMBER
    assert log_end_offset(conn, topic) == 5
    assert ok_offset(conn, topic, batch(pid, epoch, 5, 1)) == 5


def test_stale_epoch_is_fenced(conn: WireClient, topic: str) -> None:
    pid, epoch = init_producer_id(conn)
    assert ok_offset(conn, topic, batch(pid, epoch, 0, 3)) == 0
    # the producer moves to the next epoch, starting again at sequence 0
    assert ok_offset(conn, topic, batch(pid, epoch + 1, 0, 2, tag="e1")) == 3
    part = produce(conn, topic, batch(pid, epoch, 3, 1))
    assert part.error_code == INVALID_PRODUCER_EPOCH
    assert log_end_offset(conn, topic) == 5
    # a newer epoch must start at sequence 0
    part = produce(conn, topic, batch(pid, epoch + 2, 7, 1))
    assert part.error_code == OUT_OF_ORDER_SEQUENCE_NUMBER
    assert log_end_offset(conn, topic) == 5
    assert ok_offset(conn, topic, batch(pid, epoch + 1, 2, 1, tag="e1")) == 5


def test_unknown_producer_accepted_at_any_sequence(conn: WireClient, topic: str) -> None:
    pid, epoch = init_producer_id(conn)
    assert ok_offset(conn, topic, batch(pid, epoch, 42, 3)) == 0
    assert ok_offset(conn, topic, batch(pid, epoch, 45, 1)) == 3
    assert ok_offset(conn, topic, batch(pid, epoch, 42, 3)) == 0  # and deduplicated from there


def test_producers_are_independent(conn: WireClient, topic: str) -> None:
    p1, e1 = init_producer_id(conn)
    p2, e2 = init_producer_id(conn)
    a0 = batch(p1, e1, 0, 2, tag="a")
    b0 = batch(p2, e2, 0, 2, tag="b")
    assert ok_offset(conn, topic, a0) == 0
    assert ok_offset(conn, topic, b0) == 2
    assert ok_offset(conn, topic, a0) == 0
    assert ok_offset(conn, topic, batch(p2, e2, 2, 1, tag="b")) == 4
    assert ok_offset(conn, topic, b0) == 2
    assert log_end_offset(conn, topic) == 5


def test_non_idempotent_batches_are_never_deduplicated(conn: WireClient, topic: str) -> None:
    plain = batch(-1, -1, -1, 2)
    assert ok_offset(conn, topic, plain) == 0
    assert ok_offset(conn, topic, plain) == 2
    assert log_end_offset(conn, topic) == 4


@pytest.mark.parametrize("crash", [True, False], ids=["kill-9", "clean"])
def test_dedup_survives_restart(fresh_broker: Any, topic: str, crash: bool) -> None:
    b: Broker = fresh_broker()
    with WireClient(b.bootstrap) as c:
        assert create_topic(c, topic).error_code == 0
        pid, epoch = init_producer_id(c)
        batches = [batch(pid, epoch, 3 * i, 3) for i in range(4)]
        offsets = [ok_offset(c, topic, x) for x in batches]
    assert offsets == [0, 3, 6, 9]
    if crash:
        b.kill()
        b.start()
    else:
        assert b.stop() == 0
        b.start()
    with WireClient(b.bootstrap) as c:
        assert log_end_offset(c, topic) == 12
        for x, off in zip(batches, offsets):
            assert ok_offset(c, topic, x) == off
        assert log_end_offset(c, topic) == 12
        assert produce(c, topic, batch(pid, epoch, 13, 1)).error_code == OUT_OF_ORDER_SEQUENCE_NUMBER
        assert ok_offset(c, topic, batch(pid, epoch, 12, 1)) == 12
        assert ok_offset(c, topic, batch(pid, epoch + 1, 0, 1, tag="e1")) == 13
        assert produce(c, topic, batch(pid, epoch, 13, 1)).error_code == INVALID_PRODUCER_EPOCH
        # a new producer id after restart does not collide with the old one
        pid2, _ = init_producer_id(c)
        assert pid2 != pid
        values = [r.value for r in fetch_records(c, topic)]
        assert values[:12] == [f"r-{i}".encode() for i in range(12)]


def test_dedup_across_segment_rolls_after_crash(fresh_broker: Any, topic: str) -> None:
    """Small segments: producer state comes from snapshots taken at rolls plus log replay."""
    b: Broker = fresh_broker(**{"log.segment.bytes": "1024"})
    with WireClient(b.bootstrap) as c:
        assert create_topic(c, topic).error_code == 0
        pid, epoch = init_producer_id(c)
        batches = [batch(pid, epoch, 4 * i, 4, tag="x" * 40) for i in range(20)]
        offsets = [ok_offset(c, topic, x) for x in batches]
    assert offsets == [4 * i for i in range(20)]
    segments = sorted(b.partition_dir(topic).glob("*.log"))
    assert len(segments) > 3, f"expected several segments, found {segments}"
    b.kill()
    b.start()
    with WireClient(b.bootstrap) as c:
        for i in range(15, 20):
            assert ok_offset(c, topic, batches[i]) == offsets[i]
        assert log_end_offset(c, topic) == 80
        assert ok_offset(c, topic, batch(pid, epoch, 80, 1)) == 80
