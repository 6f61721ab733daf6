"""Real broker processes in cluster mode (``zookeeper.connect``) on the session's ZooKeeper.

What these prove end to end: brokers register and elect a controller, the metadata every broker
serves comes from ZooKeeper (all live brokers, leaders, replicas, ISR, epochs), CreateTopics takes
Kafka's admin path and answers once leaders exist, only a partition's leader serves it
(NOT_LEADER_OR_FOLLOWER elsewhere), and an idempotent producer with acks=all writes to leaders
spread over the brokers with every record read back exactly once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.cluster.helpers import running_cluster, wait_for
from tests.support.broker import Broker
from tests.support.wire import WireClient, list_offset, partition_response, produce_request, simple_batch


@pytest.fixture
def cluster(zk_connect: str, tmp_path: Path) -> Iterator[list[Broker]]:
    yield from running_cluster(zk_connect, tmp_path)


def admin(brokers: list[Broker]) -> AdminClient:
    return AdminClient({"bootstrap.servers": ",".join(b.bootstrap for b in brokers)})


def test_brokers_form_a_cluster_and_every_broker_serves_the_same_metadata(cluster: list[Broker]) -> None:
    for b in cluster:
        client = AdminClient({"bootstrap.servers": b.bootstrap})

        def sees_all(client: AdminClient = client) -> bool:
            md = client.list_topics(timeout=5)
            return set(md.brokers) == {0, 1, 2} and md.controller_id in (0, 1, 2)

        wait_for(sees_all, what=f"{b.name} to see three brokers and a controller")
    controllers = {
        AdminClient({"bootstrap.servers": b.bootstrap}).list_topics(timeout=5).controller_id for b in cluster
    }
    assert len(controllers) == 1


def test_create_topic_rf3_reports_leaders_replicas_and_isr(
    cluster: list[Broker], unique_name: Callable[[str], str]
) -> None:
    topic = unique_name("rf3")
    client = admin(cluster)
    wait_for(lambda: len(client.list_topics(timeout=5).brokers) == 3, what="three brokers")
    futures = client.create_topics([NewTopic(topic, num_partitions=3, replication_factor=3)])
    futures[topic].result(timeout=30)
    md = client.list_topics(topic, timeout=5).topics[topic]
    assert md.error is None
    assert sorted(md.partitions) == [0, 1, 2]
    leaders = set()
    for p in md.partitions.values():
        assert sorted(p.replicas) == [0, 1, 2]
        assert sorted(p.isrs) == [0, 1, 2]
        assert p.leader == p.replicas[0]  # the preferred replica leads a new partition
        leaders.add(p.leader)
    assert leaders == {0, 1, 2}  # Kafka's placement spreads leaders over the brokers
    # Too large a replication factor is refused with Kafka's error.
    too_big = unique_name("rf4")
    futures = client.create_topics([NewTopic(too_big, num_partitions=1, replication_factor=4)])
    with pytest.raises(Exception, match=r"INVALID_REPLICATION_FACTOR|[Rr]eplication factor"):
        futures[too_big].result(timeout=30)


def test_only_the_leader_serves_a_partition(cluster: list[Broker], unique_name: Callable[[str], str]) -> None:
    topic = unique_name("lead")
    client = admin(cluster)
    wait_for(lambda: len(client.list_topics(timeout=5).brokers) == 3, what="three brokers")
    client.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(timeout=30)
    leader = client.list_topics(topic, timeout=5).topics[topic].partitions[0].leader
    for b in cluster:
        broker_id = int(b.name.rsplit("-", 1)[1])
        with WireClient(b.bootstrap) as wire:
            response = wire.send(produce_request(topic, 0, simple_batch([b"x"]), acks=1))
            code = int(partition_response(response).error_code)
            list_code, _offset = list_offset(wire, topic, 0, -1)
        if broker_id == leader:
            assert code == 0
            assert list_code == 0
        else:
            assert code == 6  # NOT_LEADER_OR_FOLLOWER
            assert list_code == 6


def test_idempotent_acks_all_producer_writes_to_leaders_on_every_broker(
    cluster: list[Broker], unique_name: Callable[[str], str]
) -> None:
    topic = unique_name("idem")
    bootstrap = ",".join(b.bootstrap for b in cluster)
    client = admin(cluster)
    wait_for(lambda: len(client.list_topics(timeout=5).brokers) == 3, what="three brokers")
    client.create_topics([NewTopic(topic, num_partitions=3, replication_factor=1)])[topic].result(timeout=30)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})
    delivered: list[tuple[int, int]] = []
    errors: list[str] = []

    def on_delivery(err: object, msg: object) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            delivered.append((msg.partition(), msg.offset()))  # type: ignore[attr-defined]

    sent = 300
    for i in range(sent):
        producer.produce(topic, value=str(i).encode(), partition=i % 3, on_delivery=on_delivery)
    assert producer.flush(30) == 0
    assert errors == []
    assert len(delivered) == sent
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(3)])
        seen: list[int] = []
        while len(seen) < sent:
            msg = consumer.poll(10)
            assert msg is not None, f"only {len(seen)} of {sent} records came back"
            assert msg.error() is None, msg.error()
            seen.append(int(msg.value()))
        assert sorted(seen) == list(range(sent))
        per_partition: dict[int, list[int]] = {}
        for value in seen:
            per_partition.setdefault(value % 3, []).append(value)
        for values in per_partition.values():
            assert values == sorted(values)  # each partition in produce order
    finally:
        consumer.close()


def test_delete_topic_removes_it_from_zookeeper_metadata_and_every_replica(
    cluster: list[Broker], unique_name: Callable[[str], str]
) -> None:
    topic = unique_name("gone")
    client = admin(cluster)
    wait_for(lambda: len(client.list_topics(timeout=5).brokers) == 3, what="three brokers")
    client.create_topics([NewTopic(topic, num_partitions=2, replication_factor=3)])[topic].result(timeout=30)
    wait_for(
        lambda: all(b.partition_dir(topic, 0).exists() for b in cluster), what="replicas on every broker"
    )
    client.delete_topics([topic])[topic].result(timeout=30)
    for b in cluster:
        other = AdminClient({"bootstrap.servers": b.bootstrap})
        wait_for(
            lambda other=other: topic not in other.list_topics(timeout=5).topics,
            what=f"{b.name} to forget it",
        )
    wait_for(
        lambda: not any(b.partition_dir(topic, p).exists() for b in cluster for p in (0, 1)),
        what="every broker to delete its replicas",
    )
    # The name can be used again.
    client.create_topics([NewTopic(topic, num_partitions=1, replication_factor=3)])[topic].result(timeout=30)
    assert len(client.list_topics(topic, timeout=5).topics[topic].partitions) == 1


def test_every_broker_reports_the_cluster_id_from_zookeeper(cluster: list[Broker]) -> None:
    ids = {AdminClient({"bootstrap.servers": b.bootstrap}).list_topics(timeout=5).cluster_id for b in cluster}
    assert len(ids) == 1 and None not in ids
