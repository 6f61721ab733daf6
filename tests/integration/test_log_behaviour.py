"""Topic/log behaviours seen through clients: delete + recreate, retention, LogAppendTime,
message size limits, fetch size rules, acks=0 and per-connection response order."""

from __future__ import annotations

import struct
import time
from typing import Any

import pytest
from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, KafkaError
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.describe_producers.v0 import request as dp
from kio.schema.types import TopicName
from kio.static.primitive import i32

from exactly.records.builder import Record, build_batch
from exactly.testing.wait import wait_until
from tests.support.broker import Broker
from tests.support.clients import admin, consume, create_topic, produce_values, producer, watermarks
from tests.support.wire import (
    WireClient,
    fetch_request,
    init_producer_id,
    list_offset,
    parse_response,
    partition_response,
    produce_request,
    simple_batch,
)
from tests.support.wire import create_topic as wire_create_topic

pytestmark = pytest.mark.timeout(60)


def test_delete_then_recreate_starts_empty(broker: Broker, topic: str) -> None:
    create_topic(broker.bootstrap, topic)
    produce_values(broker.bootstrap, topic, [b"old"] * 5)
    a = admin(broker.bootstrap)
    a.delete_topics([topic], request_timeout=15)[topic].result(15)

    def recreated() -> bool:
        try:
            create_topic(broker.bootstrap, topic)
        except Exception:  # deletion may complete asynchronously (Kafka answers before the files are gone)
            return False
        return True

    wait_until(recreated, 15, f"{topic} created again after its deletion", interval=0.2)
    assert watermarks(broker.bootstrap, topic) == (0, 0)
    assert produce_values(broker.bootstrap, topic, [b"new"]) == [0]
    assert [g.value for g in consume(broker.bootstrap, topic, 1)] == [b"new"]


def test_time_retention_deletes_old_segments(fresh_broker: Any, topic: str) -> None:
    b: Broker = fresh_broker(**{"log.retention.check.interval.ms": "200"})
    create_topic(b.bootstrap, topic, config={"segment.bytes": "2048", "retention.ms": "60000"})
    old = int(time.time() * 1000) - 3_600_000
    p = producer(b.bootstrap, linger_ms=0)
    for i in range(100):  # an hour old: every closed segment is past retention at once
        p.produce(topic, value=b"%03d" % i + b"." * 100, partition=0, timestamp=old + i)
        if i % 10 == 9:
            p.flush(10)
    assert p.flush(10) == 0
    low, high = wait_until(
        lambda: (marks := watermarks(b.bootstrap, topic))[0] > 0 and marks,
        20,
        "retention advanced the log start offset",
        interval=0.3,
        describe=lambda: watermarks(b.bootstrap, topic),
    )
    # a retention pass may have run while the records were still being produced: wait until the
    # passes that follow (every 200 ms) have nothing left to delete, so ``low`` stays put below
    while (marks := (time.sleep(0.6), watermarks(b.bootstrap, topic))[1]) != (low, high):
        low, high = marks
    assert high == 100
    # (the active segment is never deleted, but it may be a fresh empty one: low == 100 is fine)
    assert 0 < low <= 100, f"retention did not advance the log start offset (low={low})"
    with WireClient(b.bootstrap) as c:
        assert list_offset(c, topic, 0, -2) == (0, low)  # EARLIEST
        (t,) = c.send(fetch_request(topic, 0, 0)).responses
        assert t.partitions[0].error_code == 1  # OFFSET_OUT_OF_RANGE below the log start
    if low < high:
        got = consume(b.bootstrap, topic, high - low)
        assert got[0].offset == low and got[-1].offset == 99
    # recent data is kept
    assert produce_values(b.bootstrap, topic, [b"fresh"]) == [100]


def test_log_append_time(broker: Broker, topic: str) -> None:
    create_topic(broker.bootstrap, topic, config={"message.timestamp.type": "LogAppendTime"})
    before = int(time.time() * 1000)
    with WireClient(broker.bootstrap) as c:
        part = partition_response(
            c.send(produce_request(topic, 0, simple_batch([b"a", b"b"], base_timestamp=1000)))
        )
        assert part.error_code == 0
        append_time = part.log_append_time
        assert append_time is not None
        append_ms = int(append_time.timestamp() * 1000)
        assert before - 1000 <= append_ms <= int(time.time() * 1000) + 1000
    got = consume(broker.bootstrap, topic, 2)
    assert [g.timestamp_type for g in got] == [TIMESTAMP_LOG_APPEND_TIME] * 2
    assert all(abs(g.timestamp - append_ms) <= 1 for g in got)


def test_message_too_large(broker: Broker, topic: str) -> None:
    create_topic(broker.bootstrap, topic, config={"max.message.bytes": "2000"})
    with WireClient(broker.bootstrap) as c:
        part = partition_response(c.send(produce_request(topic, 0, simple_batch([b"x" * 5000]))))
        assert part.error_code == 10  # MESSAGE_TOO_LARGE
        part = partition_response(c.send(produce_request(topic, 0, simple_batch([b"x" * 500]))))
        assert part.error_code == 0
    p = producer(broker.bootstrap, **{"message.timeout.ms": 5000})
    errors: list[KafkaError | None] = []
    p.produce(topic, value=b"y" * 5000, partition=0, on_delivery=lambda err, msg: errors.append(err))
    p.flush(10)
    assert len(errors) == 1 and errors[0] is not None
    assert errors[0].code() == KafkaError.MSG_SIZE_TOO_LARGE


def test_fetch_returns_a_whole_batch_bigger_than_max_bytes(broker: Broker, topic: str) -> None:
    """KIP-74: the first batch is returned even when it exceeds the partition/response limit."""
    with WireClient(broker.bootstrap) as c:
        assert wire_create_topic(c, topic).error_code == 0
        big = simple_batch([b"z" * 20_000])
        assert partition_response(c.send(produce_request(topic, 0, big))).error_code == 0
        (t,) = c.send(fetch_request(topic, 0, 0, partition_max_bytes=100)).responses
        data = bytes(t.partitions[0].records or b"")
        assert len(data) >= len(big)
        assert data[8:12] == big[8:12]  # the whole first batch, length field intact


def test_acks_zero_gets_no_response_and_pipelined_responses_keep_order(broker: Broker, topic: str) -> None:
    with WireClient(broker.bootstrap) as c:
        assert wire_create_topic(c, topic).error_code == 0
        c.send(produce_request(topic, 0, simple_batch([b"fire-and-forget"]), acks=0), acks_zero=True)
        versions = c.send(ApiVersionsRequest(client_software_name="t", client_software_version="1"))
        assert versions.error_code == 0  # the next frame answers the next request, not the acks=0 one
        wait_until(lambda: list_offset(c, topic, 0, -1) == (0, 1), 5, "the acks=0 record appended")

        # a long-polling Fetch, then an ApiVersions on the same connection: Kafka answers in order
        from tests.support.wire import encode_request

        fetch = fetch_request(topic, 0, 1, max_wait_ms=600, min_bytes=1)
        c.send_frame(encode_request(fetch, 100))
        c.send_frame(
            encode_request(ApiVersionsRequest(client_software_name="t", client_software_version="1"), 101)
        )
        first = c.recv_frame()
        second = c.recv_frame()
        assert struct.unpack_from(">i", first)[0] == 100
        assert struct.unpack_from(">i", second)[0] == 101
        from kio.schema.api_versions.v3.response import ApiVersionsResponse

        assert parse_response(ApiVersionsResponse, second, header_v1=False)[0] == 101


def test_producer_state_expires(fresh_broker: Any, topic: str) -> None:
    """After producer.id.expiration.ms of silence the broker forgets the producer: any sequence goes."""
    b: Broker = fresh_broker(
        **{"producer.id.expiration.ms": "1000", "producer.id.expiration.check.interval.ms": "200"}
    )
    with WireClient(b.bootstrap) as c:
        assert wire_create_topic(c, topic).error_code == 0
        pid, epoch = init_producer_id(c)

        def send(seq: int) -> Any:
            data = build_batch(
                [Record(value=b"e")],
                producer_id=pid,
                producer_epoch=epoch,
                base_sequence=seq,
                base_timestamp=int(time.time() * 1000),
            )
            return partition_response(c.send(produce_request(topic, 0, data)))

        assert send(0).error_code == 0
        assert send(5).error_code == 45  # still known: a gap
        assert active_producers(c, topic) == [pid]
        wait_until(lambda: active_producers(c, topic) == [], 10, f"producer {pid} expired")
        part = send(5)
        assert part.error_code == 0, "expired producer should be accepted at any sequence"
        assert int(part.base_offset) == 1


def active_producers(c: WireClient, topic: str, partition: int = 0) -> list[int]:
    """The producer ids DescribeProducers (KIP-664) reports on the partition."""
    request = dp.DescribeProducersRequest(
        topics=(dp.TopicRequest(name=TopicName(topic), partition_indexes=(i32(partition),)),)
    )
    (t,) = c.send(request).topics
    (p,) = t.partitions
    assert p.error_code == 0, f"DescribeProducers error {p.error_code!r}"
    return [int(state.producer_id) for state in p.active_producers]
