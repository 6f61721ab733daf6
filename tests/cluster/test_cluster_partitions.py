"""CreatePartitions on a real three-broker cluster: Kafka's ZooKeeper admin path (checks, placement,
the rewritten ``/brokers/topics/<t>``), the controller's assignment watch creating the new
partitions' states, each hosting broker creating its replica, and the new partitions produced to,
consumed from and replicated byte for byte."""

from __future__ import annotations

import datetime
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic
from kio.schema.create_partitions.v3 import request as cp_request
from kio.schema.errors import ErrorCode
from kio.schema.types import TopicName
from kio.static.primitive import i32, i32Timedelta

from exactly.cluster.zk import ClusterZk
from exactly.cluster.znodes import decode_topic_id
from exactly.controller.assignment import assign_added_partitions
from tests.cluster.helpers import bootstrap, running_cluster, wait_for
from tests.support.broker import Broker, child_env
from tests.support.wire import WireClient

TOPIC = "grown"


@pytest.fixture
def cluster(zk_connect: str, tmp_path: Path) -> Iterator[list[Broker]]:
    yield from running_cluster(zk_connect, tmp_path, **{"replica.lag.time.max.ms": "10000"})


def create(brokers: list[Broker], partitions: int, rf: int = 3) -> AdminClient:
    admin = AdminClient({"bootstrap.servers": bootstrap(brokers)})
    wait_for(lambda: len(admin.list_topics(timeout=5).brokers) == 3, what="three brokers")
    topic = NewTopic(
        TOPIC, num_partitions=partitions, replication_factor=rf, config={"min.insync.replicas": "2"}
    )
    admin.create_topics([topic])[TOPIC].result(timeout=30)
    return admin


def grow(admin: AdminClient, count: int, **kwargs: object) -> None:
    admin.create_partitions([NewPartitions(TOPIC, count, **kwargs)], request_timeout=30)[TOPIC].result(
        timeout=30
    )


def error_of(admin: AdminClient, count: int, **kwargs: object) -> KafkaError:
    with pytest.raises(KafkaException) as raised:
        grow(admin, count, **kwargs)
    error: KafkaError = raised.value.args[0]
    return error


def every_broker_sees(brokers: list[Broker], count: int) -> bool:
    """Each broker's Metadata has ``count`` partitions, all led, with a full ISR."""
    for b in brokers:
        md = AdminClient({"bootstrap.servers": b.bootstrap}).list_topics(TOPIC, timeout=5).topics[TOPIC]
        parts = md.partitions
        if sorted(parts) != list(range(count)):
            return False
        if any(p.leader < 0 or sorted(p.isrs) != sorted(p.replicas) for p in parts.values()):
            return False
    return True


def segment_bytes(broker: Broker, partition: int) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(broker.partition_dir(TOPIC, partition).glob("*.log")))


def test_added_partitions_get_kafka_placement_leaders_records_and_identical_replicas(
    cluster: list[Broker], zk_connect: str
) -> None:
    admin = create(cluster, partitions=1)
    zk = ClusterZk(zk_connect)
    zk.start()
    try:
        before = zk.topic_assignment(TOPIC)
        assert before is not None
        grow(admin, 4)
        after = zk.topic_assignment(TOPIC)
    finally:
        zk.stop()
    # The rewrite keeps the topic id and partition 0, and places the new partitions as Kafka does.
    assert after is not None and after.topic_id == before.topic_id
    assert dict(after.partitions) == {
        **before.partitions,
        **assign_added_partitions([0, 1, 2], before.partitions, 4),
    }
    wait_for(lambda: every_broker_sees(cluster, 4), what="every broker to serve four led partitions")
    md = admin.list_topics(TOPIC, timeout=5).topics[TOPIC]
    assert [tuple(md.partitions[p].replicas) for p in range(4)] == [after.partitions[p] for p in range(4)]

    producer = Producer({"bootstrap.servers": bootstrap(cluster), "enable.idempotence": True, "acks": "all"})
    errors: list[str] = []
    for partition in range(1, 4):
        for i in range(50):
            producer.produce(
                TOPIC,
                value=f"{partition}-{i}".encode(),
                partition=partition,
                on_delivery=lambda err, _msg: errors.append(str(err)) if err else None,
            )
    assert producer.flush(60) == 0 and errors == []

    consumer = Consumer(
        {"bootstrap.servers": bootstrap(cluster), "group.id": "unused", "enable.auto.commit": False}
    )
    try:
        consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(1, 4)])
        seen: dict[int, list[str]] = {p: [] for p in range(1, 4)}
        while sum(len(v) for v in seen.values()) < 150:
            msg = consumer.poll(15)
            assert msg is not None, f"only {seen} came back"
            assert msg.error() is None, msg.error()
            seen[msg.partition()].append(msg.value().decode())
    finally:
        consumer.close()
    assert seen == {p: [f"{p}-{i}" for i in range(50)] for p in range(1, 4)}

    # Every replica of every new partition holds the same bytes, under the cluster's topic id.
    for partition in range(1, 4):
        wait_for(
            lambda partition=partition: len({segment_bytes(b, partition) for b in cluster}) == 1,
            what=f"the replicas of partition {partition} to converge",
        )
        assert len(segment_bytes(cluster[0], partition)) > 0
    assert after.topic_id is not None
    for b in cluster:
        assert str(decode_topic_id(after.topic_id)) in (b.data_dir / "topics.json").read_text()


def test_checks_validate_only_and_manual_assignment(cluster: list[Broker]) -> None:
    admin = create(cluster, partitions=2)
    assert error_of(admin, 2).code() == KafkaError.INVALID_PARTITIONS
    assert error_of(admin, 1).code() == KafkaError.INVALID_PARTITIONS
    assert error_of(admin, 3, replica_assignment=[[0, 1, 7]]).code() == KafkaError.INVALID_REPLICA_ASSIGNMENT
    assert error_of(admin, 3, replica_assignment=[[0, 1]]).code() == KafkaError.INVALID_REPLICA_ASSIGNMENT
    assert error_of(admin, 4, replica_assignment=[[0, 1, 2]]).code() == KafkaError.INVALID_REPLICA_ASSIGNMENT
    with pytest.raises(KafkaException) as raised:
        admin.create_partitions([NewPartitions(TOPIC + "-nope", 3)])[TOPIC + "-nope"].result(timeout=30)
    assert raised.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART

    admin.create_partitions([NewPartitions(TOPIC, 5)], validate_only=True)[TOPIC].result(timeout=30)
    assert sorted(admin.list_topics(TOPIC, timeout=5).topics[TOPIC].partitions) == [0, 1]

    grow(admin, 3, replica_assignment=[[2, 0, 1]])
    wait_for(lambda: every_broker_sees(cluster, 3), what="the third partition everywhere")
    p2 = admin.list_topics(TOPIC, timeout=5).topics[TOPIC].partitions[2]
    assert list(p2.replicas) == [2, 0, 1] and p2.leader == 2


def test_new_replicas_go_to_live_brokers_only(cluster: list[Broker]) -> None:
    admin = create(cluster, partitions=1)
    cluster[2].stop()
    wait_for(lambda: len(admin.list_topics(timeout=5).brokers) == 2, what="two live brokers")
    too_few = error_of(admin, 2)
    assert too_few.code() == KafkaError.INVALID_REPLICATION_FACTOR
    assert too_few.str() == "Replication factor: 3 larger than available brokers: 2."
    unknown = error_of(admin, 2, replica_assignment=[[0, 2, 1]])
    assert unknown.code() == KafkaError.INVALID_REPLICA_ASSIGNMENT
    assert unknown.str() == "Unknown broker(s) in replica assignment: 2."
    cluster[2].restart()
    wait_for(lambda: len(admin.list_topics(timeout=5).brokers) == 3, what="three live brokers")
    grow(admin, 2)
    wait_for(lambda: every_broker_sees(cluster, 2), what="the new partition everywhere")


def test_exactly_topics_alter_against_the_cluster(cluster: list[Broker]) -> None:
    create(cluster, partitions=1)

    def exactly(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "exactly", "topics", *args, "--bootstrap-server", cluster[1].bootstrap],
            capture_output=True,
            text=True,
            timeout=60,
            env=child_env(),
        )

    altered = exactly("alter", TOPIC, "--partitions", "3")
    assert altered.returncode == 0, altered.stderr
    assert altered.stdout.strip() == f"Topic {TOPIC} now has 3 partitions."
    described = exactly("describe", TOPIC)
    assert described.returncode == 0, described.stderr
    assert "PartitionCount: 3\tReplicationFactor: 3" in described.stdout
    refused = exactly("alter", TOPIC, "--partitions", "2")
    assert refused.returncode != 0 and "INVALID_PARTITIONS" in refused.stderr + refused.stdout


def test_racing_requests_on_different_brokers_never_drop_partitions(cluster: list[Broker]) -> None:
    """Three brokers asked at once to grow the same topic to 3, 4 and 5 partitions: each rewrite
    is conditional, so whatever the order, the topic ends with the largest count that succeeded,
    the others answer INVALID_PARTITIONS, and every partition gets a leader everywhere."""
    create(cluster, partitions=1)
    targets = {0: 3, 1: 4, 2: 5}
    answers: dict[int, int] = {}

    def ask(broker: int) -> None:
        with WireClient(cluster[broker].bootstrap) as wire:
            response = wire.send(create_partitions_request(TOPIC, targets[broker], timeout_ms=30_000))
            answers[broker] = int(response.results[0].error_code)

    threads = [threading.Thread(target=ask, args=(b,)) for b in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert set(answers) == {0, 1, 2}
    succeeded = [targets[b] for b, code in answers.items() if code == ErrorCode.none]
    assert succeeded and all(
        code in (ErrorCode.none, ErrorCode.invalid_partitions) for code in answers.values()
    )
    assert max(targets.values()) in succeeded  # the largest can never be refused
    wait_for(lambda: every_broker_sees(cluster, 5), what="five led partitions everywhere")


def test_timeout_zero_answers_at_once_and_the_partitions_still_come(cluster: list[Broker]) -> None:
    create(cluster, partitions=1)
    with WireClient(cluster[0].bootstrap) as wire:
        response = wire.send(create_partitions_request(TOPIC, 3, timeout_ms=0))
    assert int(response.results[0].error_code) == ErrorCode.request_timed_out
    wait_for(lambda: every_broker_sees(cluster, 3), what="the partitions to come anyway")


def create_partitions_request(topic: str, count: int, *, timeout_ms: int) -> object:
    return cp_request.CreatePartitionsRequest(
        topics=(cp_request.CreatePartitionsTopic(name=TopicName(topic), count=i32(count), assignments=None),),
        timeout=i32Timedelta.parse(datetime.timedelta(milliseconds=timeout_ms)),
        validate_only=False,
    )
