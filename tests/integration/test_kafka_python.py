"""kafka-python 3.0 (pure Python client; ApiVersions v4, Metadata v13, Produce v9, idempotent by default)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import TopicAlreadyExistsError, UnknownTopicOrPartitionError

from exactly.testing.wait import wait_until
from tests.support.broker import Broker
from tests.support.clients import consume, create_topic
from tests.support.wire import WireClient, fetch_batches

pytestmark = pytest.mark.timeout(90)


def test_admin_create_list_describe_delete(broker: Broker, topic: str) -> None:
    a = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=15000)
    try:
        a.create_topics(
            {topic: {"num_partitions": 2, "replication_factor": 1, "configs": {"retention.ms": "3600000"}}}
        )
        assert topic in a.list_topics()
        (desc,) = a.describe_topics([topic])
        assert desc["name"] == topic
        assert desc["error_code"] == 0
        assert sorted(p["partition_index"] for p in desc["partitions"]) == [0, 1]

        with pytest.raises(TopicAlreadyExistsError):
            a.create_topics({topic: {"num_partitions": 1, "replication_factor": 1}})

        a.delete_topics([topic])
        wait_until(lambda: topic not in a.list_topics(), 10, f"{topic} gone from the topic list")
        with pytest.raises(UnknownTopicOrPartitionError):
            a.delete_topics([topic])
    finally:
        a.close()


def test_default_idempotent_producer_and_assign_consumer(broker: Broker, topic: str) -> None:
    create_topic(broker.bootstrap, topic)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=5, request_timeout_ms=15000)
    n = 200
    base_ts = int(time.time() * 1000) - 10_000
    try:
        futures = [
            producer.send(
                topic,
                key=f"k{i}".encode(),
                value=f"v{i}".encode(),
                headers=[("n", str(i).encode())],
                partition=0,
                timestamp_ms=base_ts + i,
            )
            for i in range(n)
        ]
        producer.flush(30)
        offsets = [f.get(timeout=30).offset for f in futures]
    finally:
        producer.close(10)
    assert offsets == list(range(n))

    consumer = KafkaConsumer(
        bootstrap_servers=broker.bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        request_timeout_ms=15000,
    )
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        got: list[Any] = []
        deadline = time.monotonic() + 30
        while len(got) < n and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                got.extend(records)
        assert [r.offset for r in got] == list(range(n))
        for i, r in enumerate(got):
            assert r.key == f"k{i}".encode()
            assert r.value == f"v{i}".encode()
            assert list(r.headers) == [("n", str(i).encode())]
            assert r.timestamp == base_ts + i
        assert consumer.end_offsets([tp])[tp] == n
        assert consumer.beginning_offsets([tp])[tp] == 0
        (found,) = consumer.offsets_for_times({tp: base_ts + 100}).values()
        assert found is not None and found.offset == 100
    finally:
        consumer.close()

    # the default producer is idempotent: its batches carry a producer id and dense sequences
    with WireClient(broker.bootstrap) as c:
        batches = fetch_batches(c, topic)
    assert {h.producer_id for h, _ in batches} != {-1}
    assert len({h.producer_id for h, _ in batches}) == 1
    assert [h.base_sequence for h, _ in batches] == [h.base_offset for h, _ in batches]
    # librdkafka reads kafka-python's batches the same way
    assert [g.value for g in consume(broker.bootstrap, topic, n)] == [f"v{i}".encode() for i in range(n)]
