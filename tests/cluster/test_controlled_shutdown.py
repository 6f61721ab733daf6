"""Controlled shutdown and preferred-leader rebalance between real broker processes.

SIGTERM of a leader moves its leadership (leader epoch +1) before the process leaves ZooKeeper;
a produce parked at the leaving leader is answered NOT_LEADER_OR_FOLLOWER; Kafka's ReplicationTest
"clean bounce" (RF 3, min.insync.replicas 2, an idempotent producer writing all along while the
leader is SIGTERMed and restarted five times) loses and duplicates nothing; and the preferred
leader gets its leadership back once it returns (auto.leader.rebalance.enable)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kazoo.client import KazooClient

from exactly.cluster import znodes as zn
from exactly.cluster.zk import ClusterZk
from exactly.cluster.znodes import LeaderAndIsr
from exactly.types import TopicPartition as Tp
from tests.cluster.helpers import bootstrap, by_id, running_cluster, wait_for, watermarks
from tests.support.broker import Broker
from tests.support.wire import WireClient, partition_response, produce_request, simple_batch

TOPIC = "bounced"
P0 = Tp(TOPIC, 0)
NOT_LEADER_OR_FOLLOWER = 6


@pytest.fixture
def cluster(zk_connect: str, tmp_path: Path) -> Iterator[list[Broker]]:
    # Kafka's default back-off (the helpers shorten it): a loaded machine must not make these
    # tests fall back to the failover path
    yield from running_cluster(
        zk_connect,
        tmp_path,
        **{"replica.lag.time.max.ms": "10000", "controlled.shutdown.retry.backoff.ms": "5000"},
    )


def create_rf3(brokers: list[Broker], min_isr: int = 2) -> AdminClient:
    admin = AdminClient({"bootstrap.servers": bootstrap(brokers)})
    wait_for(lambda: len(admin.list_topics(timeout=5).brokers) == 3, what="three brokers")
    topic = NewTopic(
        TOPIC, num_partitions=1, replication_factor=3, config={"min.insync.replicas": str(min_isr)}
    )
    admin.create_topics([topic])[TOPIC].result(timeout=30)
    return admin


def partition_metadata(brokers: list[Broker]) -> Any:
    md = AdminClient({"bootstrap.servers": bootstrap(brokers)}).list_topics(TOPIC, timeout=5)
    return md.topics[TOPIC].partitions[0]


def zk_state(observer: ClusterZk) -> LeaderAndIsr:
    observed = observer.partition_state(P0)
    assert observed is not None
    return observed.state.leader_and_isr


def isr_full(brokers: list[Broker]) -> Callable[[], bool]:
    return lambda: sorted(partition_metadata(brokers).isrs) == [0, 1, 2]


def read_exactly(brokers: list[Broker], expected: int) -> list[int]:
    """The partition's records from offset 0; the log must hold exactly ``expected`` of them."""
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
        _low, high = watermarks(consumer, TOPIC, 0)  # leaders move here: asked as a client would
        assert high == expected, f"the log holds {high} records, {expected} were produced"
        return seen
    finally:
        consumer.close()


def write_at(leader: Broker, topic: str) -> None:
    """One acks=1 record written at ``leader`` (retried until it has seen its leadership: the
    topic's creation is answered once *some* broker knows the leaders)."""
    with WireClient(leader.bootstrap) as wire:

        def written() -> bool:
            request = produce_request(topic, 0, simple_batch([b"x"]), acks=1)
            return int(partition_response(wire.send(request)).error_code) == 0

        wait_for(written, what=f"a write to {topic} at its leader")


class ZkTimeline:
    """Watches the partition state and one broker's registration from the test's own ZooKeeper
    session. One session sees watch events in zxid order, so the order of this list is the order
    in which ZooKeeper applied the changes."""

    def __init__(self, zk_connect: str, broker_id: int) -> None:
        self.client = KazooClient(hosts=zk_connect, timeout=10)
        self.client.start(10)
        self.events: list[tuple[str, float, Any]] = []
        self._lock = threading.Lock()

        def on_state(data: bytes | None, _stat: Any) -> None:
            if data:
                self._add("state", LeaderAndIsr.decode(data))

        def on_registration(data: bytes | None, _stat: Any) -> None:
            self._add("registered" if data is not None else "deregistered", None)

        self.client.DataWatch(zn.partition_state_path(TOPIC, 0), on_state)
        self.client.DataWatch(zn.broker_path(broker_id), on_registration)

    def _add(self, kind: str, value: Any) -> None:
        with self._lock:
            self.events.append((kind, time.monotonic(), value))

    def first(self, predicate: Callable[[str, Any], bool]) -> int | None:
        with self._lock:
            return next((i for i, (k, _t, v) in enumerate(self.events) if predicate(k, v)), None)

    def at(self, index: int) -> float:
        with self._lock:
            return self.events[index][1]

    def close(self) -> None:
        self.client.stop()
        self.client.close()


def test_sigterm_moves_leadership_before_the_leader_leaves(
    cluster: list[Broker], zk_connect: str, cluster_zk: Callable[[], ClusterZk]
) -> None:
    create_rf3(cluster)
    observer = cluster_zk()
    wait_for(isr_full(cluster), what="a full ISR")
    before = zk_state(observer)
    victim = by_id(cluster, before.leader)
    survivors = [b for b in cluster if b is not victim]
    timeline = ZkTimeline(zk_connect, before.leader)
    try:
        wait_for(lambda: timeline.first(lambda k, _v: k == "registered") is not None, what="the watches")
        since = victim.log_size()
        sigterm_at = time.monotonic()
        assert victim.pid is not None
        os.kill(victim.pid, signal.SIGTERM)

        def moved(kind: str, value: Any) -> bool:
            return kind == "state" and value.leader not in (before.leader, -1)

        wait_for(lambda: timeline.first(moved) is not None, what="the new leader in ZooKeeper")
        # The leader named by the answer that ended the wait, not by a second request: that one
        # may go to the other survivor, whose watch may not have delivered the change yet (each
        # broker's metadata follows ZooKeeper on its own, as Kafka's follows UpdateMetadata).
        answers: list[int] = []

        def survivors_name_a_new_leader() -> bool:
            answers.append(partition_metadata(survivors).leader)
            return answers[-1] not in (before.leader, -1)

        wait_for(survivors_name_a_new_leader, what="the new leader in the survivors' Metadata")
        metadata_s = time.monotonic() - sigterm_at
        new_leader = answers[-1]
        victim.stop()
        wait_for(lambda: timeline.first(lambda k, _v: k == "deregistered") is not None, what="deregistration")
        moved_at = timeline.first(moved)
        gone_at = timeline.first(lambda k, _v: k == "deregistered")
        assert moved_at is not None and gone_at is not None
        print(
            f"\nSIGTERM -> new leader in ZooKeeper {1000 * (timeline.at(moved_at) - sigterm_at):.0f} ms, "
            f"in Metadata {1000 * metadata_s:.0f} ms, "
            f"old leader deregistered {1000 * (timeline.at(gone_at) - sigterm_at):.0f} ms"
        )
    finally:
        timeline.close()
    # Leadership moved while the old leader was still registered: a controlled move, not the
    # failover after its death. (One ZooKeeper session sees changes in zxid order, so this order
    # is ZooKeeper's; the survivors' Metadata follows the same changes through their watches.)
    assert moved_at < gone_at
    after = zk_state(observer)
    assert after.leader == new_leader and after.leader != before.leader
    assert after.leader_epoch == before.leader_epoch + 1
    assert before.leader not in after.isr
    assert "controlled shutdown succeeded" in victim.log_text(since)


def test_parked_acks_all_produce_is_answered_when_leadership_moves(
    cluster: list[Broker], cluster_zk: Callable[[], ClusterZk]
) -> None:
    admin = create_rf3(cluster)
    observer = cluster_zk()
    wait_for(isr_full(cluster), what="a full ISR")
    leader_id = zk_state(observer).leader
    controller_id = admin.list_topics(timeout=5).controller_id
    leader = by_id(cluster, leader_id)
    # A frozen follower that stays in the ISR keeps the HW, so an acks=all produce stays parked.
    # Neither the leader nor the controller: the controller must act while it is frozen.
    frozen = next(b for b in cluster if b.name not in (f"broker-{leader_id}", f"broker-{controller_id}"))
    assert frozen.pid is not None and leader.pid is not None
    write_at(leader, TOPIC)  # the leader knows it leads
    size = sum(p.stat().st_size for p in leader.partition_dir(TOPIC, 0).glob("*.log"))
    answers: list[Any] = []
    wire = WireClient(leader.bootstrap, timeout=20)
    os.kill(frozen.pid, signal.SIGSTOP)
    try:
        sender = threading.Thread(
            target=lambda: answers.append(
                wire.send(produce_request(TOPIC, 0, simple_batch([b"parked"]), acks=-1, timeout_ms=30_000))
            )
        )
        sender.start()
        wait_for(
            lambda: sum(p.stat().st_size for p in leader.partition_dir(TOPIC, 0).glob("*.log")) > size,
            what="the leader's append",
        )
        assert answers == []  # parked: the frozen ISR member has not fetched it
        os.kill(leader.pid, signal.SIGTERM)
        sender.join(15)
        assert not sender.is_alive(), "the parked produce was not answered"
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
        wire.close()
    assert int(partition_response(answers[0]).error_code) == NOT_LEADER_OR_FOLLOWER
    leader.stop()


@pytest.fixture
def fast_shrinking_cluster(zk_connect: str, tmp_path: Path) -> Iterator[list[Broker]]:
    yield from running_cluster(
        zk_connect,
        tmp_path,
        **{
            "replica.lag.time.max.ms": "2000",
            "zookeeper.session.timeout.ms": "10000",  # frozen followers stay registered
            "controlled.shutdown.retry.backoff.ms": "500",
        },
    )


def test_leader_alone_in_the_isr_gives_up_after_its_retries(
    fast_shrinking_cluster: list[Broker], cluster_zk: Callable[[], ClusterZk]
) -> None:
    """Followers alive but out of the ISR could catch up and take over, so the leaving leader
    retries (Kafka: the controller answers with the partitions it still leads), but only
    ``controlled.shutdown.max.retries`` times; then it exits anyway (Kafka's "unclean shutdown")."""
    cluster = fast_shrinking_cluster
    create_rf3(cluster, min_isr=1)
    observer = cluster_zk()
    wait_for(isr_full(cluster), what="a full ISR")
    leader = by_id(cluster, zk_state(observer).leader)
    followers = [b for b in cluster if b is not leader]
    for b in followers:
        assert b.pid is not None
        os.kill(b.pid, signal.SIGSTOP)
    try:
        # a write the frozen followers do not fetch makes them lag (an idle follower at the log
        # end counts as caught up), so the leader shrinks the ISR to itself
        write_at(leader, TOPIC)
        wait_for(lambda: zk_state(observer).isr == (int(leader.name[-1]),), what="the ISR to shrink")
        since = leader.log_size()
        leader.stop()
    finally:
        for b in followers:
            assert b.pid is not None
            os.kill(b.pid, signal.SIGCONT)
    text = leader.log_text(since)
    assert text.count("remaining partitions to move") == 3  # controlled.shutdown.max.retries
    assert "proceeding to do an unclean shutdown" in text
    assert zk_state(observer).leader in (-1, int(leader.name[-1]))  # nobody else could lead


def test_a_leaving_follower_is_not_taken_back_into_the_isr(
    fast_shrinking_cluster: list[Broker], zk_connect: str, cluster_zk: Callable[[], ClusterZk]
) -> None:
    """The leaving broker keeps following the partition it led while it waits for another one
    that cannot move yet; the new leader sees it catch up but must not add it back to the ISR
    (KAFKA-14140), or the partition would depend on a broker about to vanish."""
    cluster = fast_shrinking_cluster
    admin = create_rf3(cluster, min_isr=1)
    observer = cluster_zk()
    wait_for(isr_full(cluster), what="a full ISR")
    leader_id = zk_state(observer).leader
    controller_id = admin.list_topics(timeout=5).controller_id
    frozen_id = next(b for b in (0, 1, 2) if b not in (leader_id, controller_id))
    # "pinned" lives on the leader and the broker about to freeze only: once the frozen one is out
    # of its ISR, nobody can take it over, so the leader retries (and follows) for a while
    pinned = NewTopic("pinned", num_partitions=1, replica_assignment=[[leader_id, frozen_id]])
    admin.create_topics([pinned])["pinned"].result(timeout=30)
    leader, frozen = by_id(cluster, leader_id), by_id(cluster, frozen_id)
    assert frozen.pid is not None
    os.kill(frozen.pid, signal.SIGSTOP)
    timeline: ZkTimeline | None = None
    try:
        # writes the frozen broker misses make it lag
        for topic in (TOPIC, "pinned"):
            write_at(leader, topic)

        def shrunk() -> bool:
            pinned_state = observer.partition_state(Tp("pinned", 0))
            return (
                frozen_id not in zk_state(observer).isr
                and pinned_state is not None
                and pinned_state.state.leader_and_isr.isr == (leader_id,)
            )

        wait_for(shrunk, what="the frozen broker out of both ISRs")
        timeline = ZkTimeline(zk_connect, leader_id)
        wait_for(lambda: timeline.first(lambda k, _v: k == "registered") is not None, what="the watches")
        since = leader.log_size()
        leader.stop()
        wait_for(lambda: timeline.first(lambda k, _v: k == "deregistered") is not None, what="deregistration")
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
        if timeline is not None:
            timeline.close()
    states = [(k, v) for k, _t, v in timeline.events[: timeline.first(lambda k, _v: k == "deregistered")]]
    moved = next(i for i, (k, v) in enumerate(states) if k == "state" and v.leader not in (leader_id, -1))
    assert [v.isr for k, v in states[moved:] if k == "state" and leader_id in v.isr] == []
    # it did wait (for "pinned", following the moved partition meanwhile), so there was time
    assert "remaining partitions to move ['pinned-0']" in leader.log_text(since)


@pytest.mark.slow
def test_clean_bounces_of_the_leader_lose_and_duplicate_nothing(cluster: list[Broker]) -> None:
    """Kafka's ReplicationTest, clean_bounce: the current leader is SIGTERMed and restarted five
    times while an idempotent producer (acks=all, 5 in flight) keeps writing; every record is
    acknowledged, and read back exactly once, in order."""
    create_rf3(cluster)
    wait_for(isr_full(cluster), what="a full ISR")
    producer = Producer(
        {
            "bootstrap.servers": bootstrap(cluster),
            "enable.idempotence": True,
            "acks": "all",
            "max.in.flight.requests.per.connection": 5,
            "linger.ms": 5,
            "message.timeout.ms": 120_000,
        }
    )
    acked: list[int] = []
    errors: list[str] = []
    produced = [0]
    stop = threading.Event()

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            acked.append(int(msg.value()))

    def produce_until_stopped() -> None:
        while not stop.is_set():
            try:
                producer.produce(TOPIC, value=str(produced[0]).encode(), partition=0, on_delivery=on_delivery)
                produced[0] += 1
            except BufferError:
                pass
            producer.poll(0.002)
        producer.flush(120)

    writer = threading.Thread(target=produce_until_stopped, name="producer")
    writer.start()
    try:
        wait_for(lambda: len(acked) >= 200, what="first acknowledgements")
        for bounce in range(5):
            leader_id = partition_metadata(cluster).leader
            victim = by_id(cluster, leader_id)
            port = victim.port
            started = time.monotonic()
            victim.stop()
            stopped_s = time.monotonic() - started
            survivors = [b for b in cluster if b.running]
            wait_for(
                lambda s=survivors, gone=leader_id: partition_metadata(s).leader not in (gone, -1),
                what="a new leader",
            )
            victim.start(port=port or 0)
            wait_for(isr_full(cluster), timeout=60, what="the bounced broker back in the ISR")
            count = len(acked)
            wait_for(
                lambda c=count: len(acked) >= c + 100, timeout=60, what="acknowledgements after the bounce"
            )
            print(f"\nbounce {bounce + 1}: broker {leader_id} took {stopped_s:.2f} s from SIGTERM to exit")
    finally:
        stop.set()
        writer.join(150)
    assert not writer.is_alive()
    assert errors == []
    total = produced[0]
    print(f"\n{total} records produced and acknowledged across 5 clean bounces of the leader")
    assert sorted(acked) == list(range(total))
    assert read_exactly(cluster, total) == list(range(total))


@pytest.fixture
def rebalancing_cluster(zk_connect: str, tmp_path: Path) -> Iterator[list[Broker]]:
    yield from running_cluster(
        zk_connect,
        tmp_path,
        **{
            "replica.lag.time.max.ms": "10000",
            "leader.imbalance.check.interval.seconds": "1",
            "controlled.shutdown.retry.backoff.ms": "5000",
        },
    )


def test_preferred_leader_returns_after_its_broker_comes_back(
    rebalancing_cluster: list[Broker], cluster_zk: Callable[[], ClusterZk]
) -> None:
    cluster = rebalancing_cluster
    create_rf3(cluster)
    observer = cluster_zk()
    wait_for(isr_full(cluster), what="a full ISR")
    preferred = partition_metadata(cluster).replicas[0]
    first = zk_state(observer)
    assert first.leader == preferred
    victim = by_id(cluster, preferred)
    port = victim.port
    victim.stop()
    wait_for(lambda: zk_state(observer).leader not in (preferred, -1), what="another leader")
    moved = zk_state(observer)
    victim.start(port=port or 0)

    def preferred_leads() -> bool:
        state = zk_state(observer)
        return state.leader == preferred and preferred in state.isr

    wait_for(preferred_leads, timeout=60, what="the preferred replica to lead again")
    back = zk_state(observer)
    assert back.leader_epoch > moved.leader_epoch
    # brokers learn the election from their ZooKeeper watches, each at its own moment (Kafka's
    # metadata is not promised to agree across brokers at once): clients are told within a wait
    wait_for(
        lambda: partition_metadata(cluster).leader == preferred,
        what="Metadata naming the preferred leader",
    )
