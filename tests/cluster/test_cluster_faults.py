"""The cluster under faults, as Kafka's own system tests drive it: the partition leader hard-bounced
(kill -9, restart) five times under an idempotent acks=all producer (ReplicationTest), two
failovers in a row with no writes in between (the leader-epoch pitfalls), and a zombie leader
(SIGSTOP past the ZooKeeper session, then SIGCONT) that must neither acknowledge an acks=all write
alone nor keep its un-replicated tail. Every test ends with the replica verification
(``exactly.client.replica_verification``): all replicas byte-identical up to one high watermark.

Brokers run with a short ZooKeeper session (``SESSION_MS``) so a dead or frozen leader is noticed
within seconds; every wait is on an observable condition (metadata, ZooKeeper-driven roles,
socket queues), never on a guessed time.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.cluster.helpers import await_replicas_identical, running_cluster, wait_for
from tests.support.broker import Broker
from tests.support.wire import WireClient, partition_response, produce_request, simple_batch

SESSION_MS = 2_500
TOPIC = "faults"


@pytest.fixture
def cluster(zk_connect: str, tmp_path: Path) -> Iterator[list[Broker]]:
    yield from running_cluster(
        zk_connect,
        tmp_path,
        **{"zookeeper.session.timeout.ms": str(SESSION_MS), "replica.lag.time.max.ms": "10000"},
    )


def bootstrap(brokers: list[Broker]) -> str:
    return ",".join(b.bootstrap for b in brokers if b.running)


def broker_named(brokers: list[Broker], broker_id: int) -> Broker:
    return next(b for b in brokers if b.name == f"broker-{broker_id}")


def create_topic(brokers: list[Broker], partitions: int = 1, min_isr: int = 2) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap(brokers)})
    wait_for(lambda: len(admin.list_topics(timeout=5).brokers) == len(brokers), what="every broker")
    topic = NewTopic(
        TOPIC, num_partitions=partitions, replication_factor=3, config={"min.insync.replicas": str(min_isr)}
    )
    admin.create_topics([topic])[TOPIC].result(timeout=30)
    wait_for(lambda: all(p.leader >= 0 for p in partition_states(brokers).values()), what="leaders")


@dataclass(frozen=True)
class PartitionState:
    leader: int
    isr: tuple[int, ...]


def partition_states(brokers: list[Broker], via: list[Broker] | None = None) -> dict[int, PartitionState]:
    """Every partition's leader and ISR as the (running) brokers' metadata reports them."""
    admin = AdminClient({"bootstrap.servers": bootstrap(via or brokers)})
    topic = admin.list_topics(TOPIC, timeout=5).topics[TOPIC]
    return {p.id: PartitionState(p.leader, tuple(sorted(p.isrs))) for p in topic.partitions.values()}


def isr_full(brokers: list[Broker]) -> bool:
    states = partition_states(brokers)
    return bool(states) and all(s.isr == (0, 1, 2) and s.leader >= 0 for s in states.values())


def new_leader_elected(brokers: list[Broker], old: int, partition: int = 0) -> bool:
    state = partition_states(brokers).get(partition)
    return state is not None and state.leader not in (old, -1)


def wait_deregistered(brokers: list[Broker], broker_id: int) -> None:
    """Kafka's hard bounce waits for the dead broker's registration to go (its session expired)."""
    wait_for(
        lambda: broker_id not in AdminClient({"bootstrap.servers": bootstrap(brokers)}).list_topics(timeout=5).brokers,
        timeout=30,
        what=f"broker {broker_id}'s registration to expire",
    )


def read_partitions(brokers: list[Broker], partitions: int) -> dict[int, list[int]]:
    """Every record of every partition up to its high watermark (read_uncommitted), as ints."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap(brokers), "group.id": "unused", "enable.auto.commit": False}
    )
    try:
        ends = {p: consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=10)[1] for p in range(partitions)}
        consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(partitions) if ends[p] > 0])
        seen: dict[int, list[int]] = {p: [] for p in range(partitions)}
        positions = {p: 0 for p in range(partitions)}
        while any(positions[p] < ends[p] for p in range(partitions)):
            msg = consumer.poll(15)
            assert msg is not None, f"read stalled at {positions} of {ends}"
            assert msg.error() is None, msg.error()
            seen[msg.partition()].append(int(msg.value()))
            positions[msg.partition()] = msg.offset() + 1
        return seen
    finally:
        consumer.close()


@dataclass
class ContinuousProducer:
    """An idempotent acks=all producer writing ``i`` to partition ``i % partitions`` until stopped
    (Kafka's VerifiableProducer in ReplicationTest); ``acked`` per partition in ack order."""

    brokers: list[Broker]
    partitions: int
    acked: dict[int, list[int]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> ContinuousProducer:
        self.acked = {p: [] for p in range(self.partitions)}
        self._thread = threading.Thread(target=self._run, name="continuous-producer", daemon=True)
        self._thread.start()
        return self

    def count(self) -> int:
        with self._lock:
            return sum(len(v) for v in self.acked.values())

    def _on_delivery(self, err: KafkaError | None, msg: object) -> None:
        with self._lock:
            if err is not None:
                self.errors.append(str(err))
            else:
                self.acked[msg.partition()].append(int(msg.value()))  # type: ignore[attr-defined]

    def _run(self) -> None:
        producer = Producer(
            {
                "bootstrap.servers": bootstrap(self.brokers),
                "enable.idempotence": True,
                "acks": "all",
                "max.in.flight.requests.per.connection": 5,
                "message.timeout.ms": 120_000,
                "linger.ms": 5,
            }
        )
        i = 0
        while not self._stop.is_set():
            if len(producer) < 200:
                producer.produce(TOPIC, value=str(i).encode(), partition=i % self.partitions, on_delivery=self._on_delivery)
                i += 1
            producer.poll(0.005)
        remaining = producer.flush(120)
        if remaining:
            self.errors.append(f"{remaining} records never delivered")

    def stop(self) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(150)
        assert not self._thread.is_alive(), "the producer did not finish"


# ---------------------------------------------------------------------------- ReplicationTest


@pytest.mark.slow
def test_leader_hard_bounced_five_times_under_idempotent_producer(cluster: list[Broker]) -> None:
    """ReplicationTest's hard_bounce: RF 3, min.insync.replicas 2, three partitions; the leader of
    partition 0 is killed with SIGKILL, its registration awaited gone, restarted, five times, while
    an idempotent acks=all producer (5 in flight) writes. Every acknowledged record is then read
    exactly once and in order per partition, and the replicas are byte-identical."""
    partitions = 3
    create_topic(cluster, partitions)
    producer = ContinuousProducer(cluster, partitions).start()
    try:
        wait_for(lambda: producer.count() >= 200, timeout=30, what="the producer to get going")
        for bounce in range(5):
            wait_for(lambda: isr_full(cluster), timeout=60, what=f"a full ISR before bounce {bounce}")
            leader = partition_states(cluster)[0].leader
            victim = broker_named(cluster, leader)
            victim.kill()
            wait_deregistered(cluster, leader)
            wait_for(lambda: new_leader_elected(cluster, leader), timeout=30, what="a new leader of partition 0")
            acked_before = producer.count()
            wait_for(lambda: producer.count() > acked_before + 50, timeout=60, what="writes to go on without it")
            victim.start()
        wait_for(lambda: isr_full(cluster), timeout=60, what="a full ISR after the last bounce")
        acked_before = producer.count()
        wait_for(lambda: producer.count() > acked_before + 100, timeout=60, what="writes after the bounces")
    finally:
        producer.stop()
    assert producer.errors == []
    seen = read_partitions(cluster, partitions)
    for p in range(partitions):
        assert seen[p] == producer.acked[p], f"partition {p}: read differs from what was acknowledged"
        assert seen[p] == sorted(seen[p])
    assert sum(len(v) for v in seen.values()) == producer.count()
    verdicts = await_replicas_identical(bootstrap(cluster), [TOPIC])
    assert [v.compared_up_to for v in verdicts] == [len(seen[p]) for p in range(partitions)]
