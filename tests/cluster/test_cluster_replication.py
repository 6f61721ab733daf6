"""Replication between real broker processes: follower fetchers, the leader's HW and ISR,
acks=all as a delayed produce, min.insync.replicas, and leader failover under an idempotent
producer (every acknowledged record read back exactly once, in order)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.cluster.fault_helpers import await_new_leader, leader_alone_writes_then_dies
from tests.cluster.helpers import bootstrap, running_cluster, wait_for
from tests.support.broker import Broker
from tests.support.wire import WireClient, partition_response, produce_request, simple_batch

TOPIC = "replicated"


@pytest.fixture
def cluster(zk_connect: str, tmp_path: Path) -> Iterator[list[Broker]]:
    yield from running_cluster(zk_connect, tmp_path, **{"replica.lag.time.max.ms": "10000"})


def create_rf3(brokers: list[Broker], partitions: int = 1, min_isr: int = 2) -> AdminClient:
    admin = AdminClient({"bootstrap.servers": bootstrap(brokers)})
    wait_for(lambda: len(admin.list_topics(timeout=5).brokers) == 3, what="three brokers")
    topic = NewTopic(
        TOPIC, num_partitions=partitions, replication_factor=3, config={"min.insync.replicas": str(min_isr)}
    )
    admin.create_topics([topic])[TOPIC].result(timeout=30)
    return admin


def produce_all(producer: Producer, values: range) -> list[int]:
    acked: list[int] = []
    errors: list[str] = []

    def on_delivery(err: object, msg: object) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            acked.append(int(msg.value()))  # type: ignore[attr-defined]

    for i in values:
        producer.produce(TOPIC, value=str(i).encode(), partition=0, on_delivery=on_delivery)
        producer.poll(0)
    assert producer.flush(60) == 0
    assert errors == []
    return acked


def read_all(brokers: list[Broker], expected: int) -> list[int]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap(brokers), "group.id": "unused", "enable.auto.commit": False}
    )
    try:
        consumer.assign([TopicPartition(TOPIC, 0, 0)])
        seen: list[int] = []
        while len(seen) < expected:
            msg = consumer.poll(15)
            assert msg is not None, f"only {len(seen)} of {expected} records came back"
            assert msg.error() is None, msg.error()
            seen.append(int(msg.value()))
        return seen
    finally:
        consumer.close()


def segment_bytes(broker: Broker) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(broker.partition_dir(TOPIC, 0).glob("*.log")))


def test_acks_all_replicates_to_every_replica_byte_identical(cluster: list[Broker]) -> None:
    create_rf3(cluster)
    producer = Producer({"bootstrap.servers": bootstrap(cluster), "enable.idempotence": True, "acks": "all"})
    acked = produce_all(producer, range(500))
    assert sorted(acked) == list(range(500))
    assert read_all(cluster, 500) == list(range(500))
    # After a quiet period every replica holds the same bytes (same offsets, epochs, batches).
    wait_for(lambda: len({segment_bytes(b) for b in cluster}) == 1, what="replicas to converge")
    assert len(segment_bytes(cluster[0])) > 0


def test_min_insync_replicas_with_two_of_three_down(cluster: list[Broker]) -> None:
    admin = create_rf3(cluster)
    leader = admin.list_topics(TOPIC, timeout=5).topics[TOPIC].partitions[0].leader
    for b in cluster:
        if b.name != f"broker-{leader}":
            b.kill()
    survivor = next(b for b in cluster if b.running)

    def isr_shrunk() -> bool:
        md = AdminClient({"bootstrap.servers": survivor.bootstrap}).list_topics(TOPIC, timeout=5)
        return list(md.topics[TOPIC].partitions[0].isrs) == [leader]

    wait_for(isr_shrunk, timeout=30, what="the controller to shrink the ISR to the leader")
    with WireClient(survivor.bootstrap) as wire:
        all_acks = partition_response(wire.send(produce_request(TOPIC, 0, simple_batch([b"a"]), acks=-1)))
        one_ack = partition_response(wire.send(produce_request(TOPIC, 0, simple_batch([b"b"]), acks=1)))
    assert int(all_acks.error_code) == 19  # NOT_ENOUGH_REPLICAS
    assert int(one_ack.error_code) == 0


@pytest.mark.slow
def test_leader_kill_9_producer_continues_and_acked_records_are_read_once_in_order(
    cluster: list[Broker],
) -> None:
    admin = create_rf3(cluster)
    leader = admin.list_topics(TOPIC, timeout=5).topics[TOPIC].partitions[0].leader
    producer = Producer(
        {
            "bootstrap.servers": bootstrap(cluster),
            "enable.idempotence": True,
            "acks": "all",
            "message.timeout.ms": 60000,
        }
    )
    acked = produce_all(producer, range(300))
    victim = next(b for b in cluster if b.name == f"broker-{leader}")
    assert victim.pid is not None
    victim.kill()  # SIGKILL: no controlled shutdown, its session must expire
    acked += produce_all(producer, range(300, 600))
    new_leader = (
        AdminClient({"bootstrap.servers": bootstrap(cluster)})
        .list_topics(TOPIC, timeout=5)
        .topics[TOPIC]
        .partitions[0]
        .leader
    )
    assert new_leader not in (leader, -1)
    assert sorted(acked) == list(range(600))
    assert read_all(cluster, 600) == list(range(600))
    # The old leader comes back as a follower: it truncates to the new leader's epoch boundary
    # (OffsetsForLeaderEpoch), catches up, rejoins the ISR and holds the same bytes.
    victim.restart()

    def isr_full() -> bool:
        md = AdminClient({"bootstrap.servers": bootstrap(cluster)}).list_topics(TOPIC, timeout=5)
        return sorted(md.topics[TOPIC].partitions[0].isrs) == [0, 1, 2]

    wait_for(isr_full, timeout=60, what="the old leader to rejoin the ISR")
    wait_for(lambda: len({segment_bytes(b) for b in cluster}) == 1, timeout=30, what="replicas to converge")


@pytest.mark.slow
def test_old_leader_with_unreplicated_records_truncates_when_it_returns(cluster: list[Broker]) -> None:
    """acks=1 records that only the leader had are cut away when it comes back as a follower
    (KIP-101): its log then matches the new leader's byte for byte."""
    admin = create_rf3(cluster, min_isr=1)
    leader = admin.list_topics(TOPIC, timeout=5).topics[TOPIC].partitions[0].leader
    victim = next(b for b in cluster if b.name == f"broker-{leader}")
    followers = [b for b in cluster if b is not victim]
    producer = Producer({"bootstrap.servers": bootstrap(cluster), "acks": "all"})
    produce_all(producer, range(100))
    wait_for(lambda: len({segment_bytes(b) for b in cluster}) == 1, what="replicas to converge")
    leader_alone_writes_then_dies(victim, followers, TOPIC, [b"lost-1", b"lost-2"])
    await_new_leader(followers, TOPIC, leader)
    assert len(segment_bytes(victim)) > len(segment_bytes(followers[0]))  # it holds extra records
    since = victim.log_size()
    victim.restart()
    wait_for(
        lambda: len({segment_bytes(b) for b in cluster}) == 1, timeout=30, what="the old leader to truncate"
    )
    # the line is written after the truncation, so the bytes may converge just before it
    wait_for(lambda: "truncated to" in victim.log_text(since), timeout=10, what="the truncation's log line")
    assert read_all(cluster, 100) == list(range(100))


def test_log_append_time_topic_replicas_keep_the_leaders_timestamps(cluster: list[Broker]) -> None:
    """Followers append the leader's batches unchanged: a LogAppendTime topic's timestamps are
    the leader's clock on every replica, so the replicas stay byte-identical."""
    admin = AdminClient({"bootstrap.servers": bootstrap(cluster)})
    wait_for(lambda: len(admin.list_topics(timeout=5).brokers) == 3, what="three brokers")
    topic = NewTopic(
        TOPIC, num_partitions=1, replication_factor=3, config={"message.timestamp.type": "LogAppendTime"}
    )
    admin.create_topics([topic])[TOPIC].result(timeout=30)
    producer = Producer({"bootstrap.servers": bootstrap(cluster), "acks": "all", "linger.ms": 0})
    for i in range(20):  # one batch each, appended by the followers at their own (later) moments
        producer.produce(TOPIC, value=str(i).encode(), partition=0, timestamp=1)
        assert producer.flush(30) == 0
    wait_for(lambda: len({segment_bytes(b) for b in cluster}) == 1, what="replicas to converge")
    consumer = Consumer(
        {"bootstrap.servers": bootstrap(cluster), "group.id": "unused", "enable.auto.commit": False}
    )
    try:
        consumer.assign([TopicPartition(TOPIC, 0, 0)])
        for i in range(20):
            msg = consumer.poll(15)
            assert msg is not None and msg.error() is None
            kind, timestamp = msg.timestamp()
            assert int(msg.value()) == i and kind == TIMESTAMP_LOG_APPEND_TIME and timestamp > 1
    finally:
        consumer.close()
