"""Truncation on fetch (Fetch v12, KIP-595's DivergingEpoch; Kafka's path since IBP 2.7): a
returning old leader with records nobody else got learns where to cut from its first fetch's
answer, without an OffsetsForLeaderEpoch round trip."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.cluster.fault_helpers import await_new_leader, leader_alone_writes_then_dies
from tests.cluster.helpers import await_replicas_identical, bootstrap, running_cluster, wait_for
from tests.support.broker import Broker

TOPIC = "diverging"


@pytest.fixture
def cluster(zk_connect: str, tmp_path: Path) -> Iterator[list[Broker]]:
    yield from running_cluster(zk_connect, tmp_path, **{"replica.lag.time.max.ms": "10000"})


def segment_bytes(broker: Broker) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(broker.partition_dir(TOPIC, 0).glob("*.log")))


def read_values(brokers: list[Broker], expected: int) -> list[bytes]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap(brokers), "group.id": "unused", "enable.auto.commit": False}
    )
    try:
        consumer.assign([TopicPartition(TOPIC, 0, 0)])
        seen: list[bytes] = []
        while len(seen) < expected:
            msg = consumer.poll(15)
            assert msg is not None, f"only {len(seen)} of {expected} records came back"
            assert msg.error() is None, msg.error()
            seen.append(msg.value())
        return seen
    finally:
        consumer.close()


@pytest.mark.slow
def test_old_leader_truncates_from_the_diverging_epoch_of_its_first_fetch(cluster: list[Broker]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap(cluster)})
    wait_for(lambda: len(admin.list_topics(timeout=5).brokers) == 3, what="three brokers")
    topic = NewTopic(TOPIC, num_partitions=1, replication_factor=3, config={"min.insync.replicas": "1"})
    admin.create_topics([topic])[TOPIC].result(timeout=30)
    wait_for(lambda: admin.list_topics(TOPIC, timeout=5).topics[TOPIC].partitions[0].leader >= 0)
    leader = admin.list_topics(TOPIC, timeout=5).topics[TOPIC].partitions[0].leader
    victim = next(b for b in cluster if b.name == f"broker-{leader}")
    followers = [b for b in cluster if b is not victim]
    producer = Producer({"bootstrap.servers": bootstrap(cluster), "acks": "all"})
    for i in range(50):
        producer.produce(TOPIC, value=b"kept-%d" % i, partition=0)
    assert producer.flush(30) == 0
    wait_for(lambda: len({segment_bytes(b) for b in cluster}) == 1, what="replicas to converge")
    leader_alone_writes_then_dies(victim, followers, TOPIC, [b"lost-1", b"lost-2"])
    await_new_leader(followers, TOPIC, leader)
    # The new leader writes in its own epoch, so the old leader's tail diverges inside the log.
    for i in range(5):
        producer.produce(TOPIC, value=b"new-%d" % i, partition=0)
    assert producer.flush(30) == 0

    since = victim.log_size()
    victim.restart()
    wait_for(
        lambda: len({segment_bytes(b) for b in cluster}) == 1, timeout=30, what="the old leader to truncate"
    )
    text = victim.log_text(since)
    assert "on fetch: diverging epoch" in text  # the cut came from the fetch answer...
    assert "asking OffsetsForLeaderEpoch" not in text  # ...and needed no OffsetsForLeaderEpoch
    values = read_values(cluster, 55)
    assert values == [b"kept-%d" % i for i in range(50)] + [b"new-%d" % i for i in range(5)]
    await_replicas_identical(bootstrap(cluster), [TOPIC])
