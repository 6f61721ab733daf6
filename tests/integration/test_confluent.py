"""confluent-kafka (librdkafka 2.x) against the real broker: admin, idempotent producer, consumer."""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    ConfigResource,
    NewTopic,
    ResourceType,
)

from exactly.testing.wait import wait_until
from tests.support.broker import Broker
from tests.support.clients import (
    admin,
    consume,
    consumer,
    create_topic,
    produce_values,
    producer,
    watermarks,
)
from tests.support.wire import WireClient, fetch_batches

pytestmark = pytest.mark.timeout(90)


def _error(exc_info: pytest.ExceptionInfo[BaseException]) -> KafkaError:
    err = exc_info.value.args[0]
    assert isinstance(err, KafkaError), exc_info.value
    return err


# ---------------------------------------------------------------------------- admin
def test_create_list_describe_delete(broker: Broker, topic: str) -> None:
    a = admin(broker.bootstrap)
    futures = a.create_topics(
        [NewTopic(topic, num_partitions=3, replication_factor=1, config={"retention.ms": "123456789"})],
        request_timeout=15,
    )
    assert futures[topic].result(15) is None

    md = a.list_topics(timeout=10)
    assert topic in md.topics
    tmeta = md.topics[topic]
    assert tmeta.error is None
    assert sorted(tmeta.partitions) == [0, 1, 2]
    broker_ids = set(md.brokers)
    assert len(broker_ids) == 1
    for p in tmeta.partitions.values():
        assert p.leader in broker_ids
        assert list(p.replicas) == [p.leader]
        assert list(p.isrs) == [p.leader]
    (b,) = md.brokers.values()
    assert (b.host, b.port) == (broker.host, broker.port)  # type: ignore[comparison-overlap]

    resource = ConfigResource(ResourceType.TOPIC, topic)
    configs = a.describe_configs([resource], request_timeout=15)[resource].result(15)
    assert configs["retention.ms"].value == "123456789"
    assert not configs["retention.ms"].is_default
    assert "segment.bytes" in configs
    assert configs["cleanup.policy"].value == "delete"

    assert a.delete_topics([topic], request_timeout=15)[topic].result(15) is None
    wait_until(lambda: topic not in a.list_topics(timeout=10).topics, 10, f"{topic} gone from Metadata")


def test_describe_cluster(broker: Broker) -> None:
    a = admin(broker.bootstrap)
    desc = a.describe_cluster(request_timeout=10).result(15)
    (node,) = desc.nodes
    assert (node.host, node.port) == (broker.host, broker.port)
    assert desc.controller is not None and desc.controller.id == node.id
    assert desc.cluster_id


def test_create_existing_topic_fails(broker: Broker, topic: str) -> None:
    create_topic(broker.bootstrap, topic, partitions=2)
    a = admin(broker.bootstrap)
    futures = a.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)], request_timeout=15)
    with pytest.raises(KafkaException) as exc_info:
        futures[topic].result(15)
    assert _error(exc_info).code() == KafkaError.TOPIC_ALREADY_EXISTS


@pytest.mark.parametrize("name", ["bad name!", "a" * 250, ".", "..", "tab\there", "ümlaut"])
def test_create_invalid_topic_name(broker: Broker, name: str) -> None:
    a = admin(broker.bootstrap)
    futures = a.create_topics([NewTopic(name, num_partitions=1, replication_factor=1)], request_timeout=15)
    with pytest.raises(KafkaException) as exc_info:
        futures[name].result(15)
    assert _error(exc_info).code() == KafkaError.TOPIC_EXCEPTION  # INVALID_TOPIC_EXCEPTION (17)
    assert name not in a.list_topics(timeout=10).topics


def test_create_invalid_partition_count_and_config(broker: Broker, topic: str) -> None:
    a = admin(broker.bootstrap)
    futures = a.create_topics([NewTopic(topic, num_partitions=0, replication_factor=1)], request_timeout=15)
    with pytest.raises(KafkaException) as exc_info:
        futures[topic].result(15)
    assert _error(exc_info).code() == KafkaError.INVALID_PARTITIONS

    futures = a.create_topics(
        [NewTopic(topic, num_partitions=1, replication_factor=1, config={"no.such.config": "1"})],
        request_timeout=15,
    )
    with pytest.raises(KafkaException) as exc_info:
        futures[topic].result(15)
    assert _error(exc_info).code() == KafkaError.INVALID_CONFIG
    assert topic not in a.list_topics(timeout=10).topics


def test_delete_unknown_topic(broker: Broker, topic: str) -> None:
    a = admin(broker.bootstrap)
    with pytest.raises(KafkaException) as exc_info:
        a.delete_topics([topic], request_timeout=15)[topic].result(15)
    assert _error(exc_info).code() == KafkaError.UNKNOWN_TOPIC_OR_PART


def test_metadata_for_unknown_topic_without_auto_create(broker: Broker, topic: str) -> None:
    c = consumer(broker.bootstrap)  # consumers do not ask for auto creation
    try:
        md = c.list_topics(topic=topic, timeout=10)
    finally:
        c.close()
    tmeta = md.topics[topic]
    assert tmeta.error is not None
    assert tmeta.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    assert topic not in admin(broker.bootstrap).list_topics(timeout=10).topics


# ---------------------------------------------------------------------------- produce / consume
def test_idempotent_produce_and_read_back_everything(broker: Broker, topic: str) -> None:
    create_topic(broker.bootstrap, topic, partitions=2)
    n = 300
    base_ts = int(time.time() * 1000) - 60_000
    p = producer(broker.bootstrap, **{"enable.idempotence": True, "acks": "all", "max.in.flight": 5})
    delivered: list[tuple[int, int, bytes]] = []
    errors: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            errors.append(err)
        else:
            delivered.append((msg.partition(), msg.offset(), msg.value()))

    for i in range(n):
        headers: list[tuple[str, str | bytes | None]] = [
            ("i", str(i).encode()),
            ("kind", b"even" if i % 2 == 0 else b"odd"),
        ]
        if i % 7 == 0:
            headers.append(("nullable", None))
        p.produce(
            topic,
            key=None if i % 10 == 0 else f"key-{i}".encode(),
            value=b"" if i % 13 == 0 else f"value-{i}".encode() * (1 + i % 5),
            headers=headers,
            partition=i % 2,
            timestamp=base_ts + i,
            on_delivery=on_delivery,
        )
        p.poll(0)
    assert p.flush(30) == 0
    assert not errors
    assert len(delivered) == n
    for part in (0, 1):
        offs = [o for pp, o, _ in delivered if pp == part]
        assert sorted(offs) == list(range(n // 2)), f"partition {part} offsets not dense from 0"

    got = consume(broker.bootstrap, topic, n, partitions=(0, 1))
    assert len(got) == n
    for part in (0, 1):
        records = [g for g in got if g.partition == part]
        assert [g.offset for g in records] == list(range(n // 2))
        for j, g in enumerate(records):
            i = 2 * j + part
            assert g.key == (None if i % 10 == 0 else f"key-{i}".encode())
            assert g.value == (b"" if i % 13 == 0 else f"value-{i}".encode() * (1 + i % 5))
            expected_headers: list[tuple[str, bytes | None]] = [
                ("i", str(i).encode()),
                ("kind", b"even" if i % 2 == 0 else b"odd"),
            ]
            if i % 7 == 0:
                expected_headers.append(("nullable", None))
            assert list(g.headers) == expected_headers
            assert g.timestamp_type == TIMESTAMP_CREATE_TIME
            assert g.timestamp == base_ts + i
    assert watermarks(broker.bootstrap, topic, 0) == (0, n // 2)
    with WireClient(broker.bootstrap) as c:  # idempotent batches: one producer id, dense sequences
        batches = fetch_batches(c, topic, 0)
    assert len({h.producer_id for h, _ in batches}) == 1 and batches[0][0].producer_id >= 0
    assert [h.base_sequence for h, _ in batches] == [h.base_offset for h, _ in batches]


def test_consume_from_middle_and_end(broker: Broker, topic: str) -> None:
    create_topic(broker.bootstrap, topic)
    produce_values(broker.bootstrap, topic, [f"m{i}".encode() for i in range(50)])
    got = consume(broker.bootstrap, topic, 30, start=20)
    assert [g.offset for g in got] == list(range(20, 50))
    assert [g.value for g in got] == [f"m{i}".encode() for i in range(20, 50)]


def test_long_poll_delivers_records_produced_later(broker: Broker, topic: str) -> None:
    create_topic(broker.bootstrap, topic)
    c = consumer(broker.bootstrap, **{"fetch.wait.max.ms": 20_000})
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        assert c.poll(1.0) is None  # a 20 s long-poll Fetch is now parked at the broker
        produce_values(broker.bootstrap, topic, [b"late"])
        t0 = time.monotonic()
        msg = None
        while msg is None and time.monotonic() - t0 < 25:
            msg = c.poll(0.5)
        assert msg is not None and msg.error() is None
        assert msg.value() == b"late"
        # The parked Fetch must be woken by the append, not wait out its 20 s.
        assert time.monotonic() - t0 < 8.0
    finally:
        c.close()


def test_get_watermark_offsets(broker: Broker, topic: str) -> None:
    create_topic(broker.bootstrap, topic)
    assert watermarks(broker.bootstrap, topic) == (0, 0)
    produce_values(broker.bootstrap, topic, [b"x"] * 17)
    assert watermarks(broker.bootstrap, topic) == (0, 17)


def test_offsets_for_times(broker: Broker, topic: str) -> None:
    create_topic(broker.bootstrap, topic)
    base = int(time.time() * 1000) - 3_600_000
    p = producer(broker.bootstrap)
    for i in range(10):  # record i has timestamp base + 1000 * i, one batch each
        p.produce(topic, value=f"v{i}".encode(), partition=0, timestamp=base + 1000 * i)
        p.flush(10)
    c = consumer(broker.bootstrap)
    try:

        def lookup(ts: int) -> int:
            (res,) = c.offsets_for_times([TopicPartition(topic, 0, ts)], timeout=10)
            assert res.error is None, res.error
            return int(res.offset)

        assert lookup(base - 1) == 0
        assert lookup(base) == 0
        assert lookup(base + 1) == 1
        assert lookup(base + 4000) == 4
        assert lookup(base + 4500) == 5
        assert lookup(base + 9000) == 9
        assert lookup(base + 9001) == -1  # no record at or after: Kafka answers offset -1
    finally:
        c.close()


def test_auto_topic_creation_on_produce(fresh_broker: Any, topic: str) -> None:
    b: Broker = fresh_broker(**{"num.partitions": "3"})
    p = producer(b.bootstrap)
    results: list[Any] = []
    p.produce(topic, value=b"hello", key=b"k", on_delivery=lambda err, msg: results.append((err, msg)))
    assert p.flush(30) == 0
    ((err, msg),) = results
    assert err is None
    md = admin(b.bootstrap).list_topics(timeout=10)
    assert sorted(md.topics[topic].partitions) == [0, 1, 2]
    got = consume(b.bootstrap, topic, 1, partitions=(msg.partition(),))
    assert [(g.key, g.value) for g in got] == [(b"k", b"hello")]


def test_auto_topic_creation_disabled(fresh_broker: Any, topic: str) -> None:
    b: Broker = fresh_broker(**{"auto.create.topics.enable": "false"})
    p = producer(b.bootstrap, **{"message.timeout.ms": 1500})
    results: list[Any] = []
    p.produce(topic, value=b"nowhere", on_delivery=lambda err, msg: results.append(err))
    p.flush(15)
    assert len(results) == 1 and results[0] is not None, results
    assert results[0].code() in (
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._MSG_TIMED_OUT,
        KafkaError._UNKNOWN_TOPIC,
    )
    assert topic not in admin(b.bootstrap).list_topics(timeout=10).topics


def test_produce_to_unknown_partition_fails(broker: Broker, topic: str) -> None:
    create_topic(broker.bootstrap, topic, partitions=1)
    p = producer(broker.bootstrap, **{"message.timeout.ms": 5000})
    results: list[Any] = []
    p.produce(topic, value=b"x", partition=5, on_delivery=lambda err, msg: results.append(err))
    p.flush(15)
    assert len(results) == 1 and results[0] is not None
    assert results[0].code() in (KafkaError._UNKNOWN_PARTITION, KafkaError.UNKNOWN_TOPIC_OR_PART)


def test_large_and_compressed_batches(broker: Broker, topic: str) -> None:
    create_topic(broker.bootstrap, topic)
    values = [bytes([i % 256]) * (100_000 + i) for i in range(8)]
    offsets = produce_values(broker.bootstrap, topic, values, compression_type="gzip")
    assert offsets == list(range(8))
    small = [f"s{i}".encode() * 20 for i in range(500)]
    produce_values(broker.bootstrap, topic, small, compression_type="lz4", linger_ms=50)
    got = consume(broker.bootstrap, topic, 508)
    assert [g.value for g in got] == values + small
    assert [g.offset for g in got] == list(range(508))


def test_large_fetches_come_back_intact(broker: Broker, topic: str) -> None:
    """Batches of hundreds of KB are answered from the segment file (sendfile) when a fetch
    reads them: every value must come back byte for byte, in order."""
    create_topic(broker.bootstrap, topic)
    values = [i.to_bytes(4, "big") + bytes([i % 251]) * 2000 for i in range(600)]
    produce_values(broker.bootstrap, topic, values, linger_ms=200, batch_size=1_000_000)
    got = consume(broker.bootstrap, topic, len(values))
    assert [g.value for g in got] == values
