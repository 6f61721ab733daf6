"""Every client on a three-broker cluster (RF 3, min.insync.replicas 2): kafka-python, aiokafka
and kcat produce with acks=all (idempotent) and consume read_committed, and the partition's
leader is killed (SIGKILL) half-way. Each client must find the new leader on its own (Metadata
after NOT_LEADER_OR_FOLLOWER / FENCED_LEADER_EPOCH / a dead connection) and the result must be
every record exactly once, in order, on every surviving replica. (confluent-kafka has the same
scenario in test_cluster_replication.py.)

Then the epoch checks these clients rely on (KIP-320), on the wire against a leader: a request
carrying an older leader epoch gets FENCED_LEADER_EPOCH, a newer one UNKNOWN_LEADER_EPOCH, the
current one (or none) an answer; a follower with the current epoch says NOT_LEADER_OR_FOLLOWER.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition as AioTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KafkaTopicPartition
from kio.static.primitive import i32

from tests.cluster.helpers import bootstrap, by_id, running_cluster, wait_for
from tests.cluster.partition_view import (
    PartitionView,
    kill_leader,
    list_offsets_code,
    offsets_for_epoch,
    wait_for_view,
)
from tests.support.broker import Broker
from tests.support.wire import WireClient, fetch_request, log_end_offset, produce_request, simple_batch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

HALF = 100
NONE = 0
NOT_LEADER_OR_FOLLOWER = 6
FENCED_LEADER_EPOCH = 74
UNKNOWN_LEADER_EPOCH = 75


@pytest.fixture
def cluster(zk_connect: str, tmp_path: Path) -> Iterator[list[Broker]]:
    yield from running_cluster(zk_connect, tmp_path, **{"replica.lag.time.max.ms": "10000"})


def create_rf3(brokers: list[Broker], topic: str) -> PartitionView:
    admin = AdminClient({"bootstrap.servers": bootstrap(brokers)})
    wait_for(lambda: len(admin.list_topics(timeout=5).brokers) == 3, what="three brokers")
    new = NewTopic(topic, num_partitions=1, replication_factor=3, config={"min.insync.replicas": "2"})
    admin.create_topics([new])[topic].result(timeout=30)
    seen = wait_for_view(brokers[0], topic, lambda v: v.leader >= 0, what="a leader")
    # The leader's own answer: from then on it also serves as the leader.
    return wait_for_view(
        by_id(brokers, seen.leader),
        topic,
        lambda v: v.leader == seen.leader and len(v.isr) == 3,
        what="the leader to lead with a full ISR",
    )


def segment_bytes(broker: Broker, topic: str) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(broker.partition_dir(topic, 0).glob("*.log")))


def assert_survivors_identical(brokers: list[Broker], topic: str) -> None:
    survivors = [b for b in brokers if b.running]
    wait_for(
        lambda: len({segment_bytes(b, topic) for b in survivors}) == 1,
        timeout=30,
        what="the surviving replicas to hold the same bytes",
    )


def values(first: int, count: int) -> list[bytes]:
    return [f"v{i}".encode() for i in range(first, first + count)]


# --------------------------------------------------------------------------- kafka-python


def test_kafka_python_produces_and_consumes_across_a_leader_kill(
    cluster: list[Broker], unique_name: Callable[[str], str]
) -> None:
    topic = unique_name("kp")
    before = create_rf3(cluster, topic)
    tp = KafkaTopicPartition(topic, 0)
    producer = KafkaProducer(
        bootstrap_servers=bootstrap(cluster),
        acks="all",
        enable_idempotence=True,
        linger_ms=5,
        request_timeout_ms=10_000,
        retry_backoff_ms=100,
    )
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap(cluster),
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        request_timeout_ms=15_000,
        retry_backoff_ms=100,
    )
    got: list[tuple[int, bytes]] = []

    def read_until(count: int) -> bool:
        for records in consumer.poll(timeout_ms=200).values():
            got.extend((r.offset, r.value) for r in records)
        return len(got) >= count

    def send(batch: list[bytes]) -> list[int]:
        futures = [producer.send(topic, value=v, partition=0) for v in batch]
        producer.flush(90)
        return [f.get(timeout=90).offset for f in futures]

    try:
        consumer.assign([tp])
        assert send(values(0, HALF)) == list(range(HALF))
        wait_for(lambda: read_until(HALF), timeout=60, what="the first half consumed")
        _victim, _after = kill_leader(cluster, topic, before)
        assert send(values(HALF, HALF)) == list(range(HALF, 2 * HALF))
        wait_for(lambda: read_until(2 * HALF), timeout=90, what="the second half from the new leader")
        assert consumer.end_offsets([tp])[tp] == 2 * HALF
    finally:
        producer.close(10)
        consumer.close()
    assert got == list(enumerate(values(0, 2 * HALF)))
    assert_survivors_identical(cluster, topic)


def test_kafka_python_moves_off_a_paused_leader_that_comes_back_as_a_follower(
    cluster: list[Broker], unique_name: Callable[[str], str]
) -> None:
    """The leader is paused (SIGSTOP) past its session timeout with the clients' requests queued
    on its sockets, a new leader is elected, then the old one resumes. Whatever it reads before it
    learns its new role it serves as the leader it was (an acks=all write it appends there is
    never acknowledged: the followers have moved on), afterwards as a follower at the new epoch
    (NOT_LEADER_OR_FOLLOWER for produce, FENCED_LEADER_EPOCH for a fetch at the old epoch); it
    then truncates what it appended alone. The clients move over; every record is read exactly
    once, in order, and all three replicas end up identical."""
    topic = unique_name("kp-pause")
    before = create_rf3(cluster, topic)
    tp = KafkaTopicPartition(topic, 0)
    producer = KafkaProducer(
        bootstrap_servers=bootstrap(cluster),
        acks="all",
        enable_idempotence=True,
        linger_ms=5,
        request_timeout_ms=30_000,
        retry_backoff_ms=100,
    )
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap(cluster),
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        request_timeout_ms=30_000,
        retry_backoff_ms=100,
    )
    got: list[tuple[int, bytes]] = []

    def read_until(count: int) -> bool:
        for records in consumer.poll(timeout_ms=200).values():
            got.extend((r.offset, r.value) for r in records)
        return len(got) >= count

    paused = by_id(cluster, before.leader)
    assert paused.pid is not None
    try:
        consumer.assign([tp])
        futures = [producer.send(topic, value=v, partition=0) for v in values(0, HALF)]
        producer.flush(90)
        assert [f.get(timeout=90).offset for f in futures] == list(range(HALF))
        wait_for(lambda: read_until(HALF), timeout=60, what="the first half consumed")
        os.kill(paused.pid, signal.SIGSTOP)
        try:
            futures = [producer.send(topic, value=v, partition=0) for v in values(HALF, HALF)]
            read_until(HALF)  # a fetch now waits on the paused leader
            witness = next(b for b in cluster if b is not paused)
            after = wait_for_view(
                witness, topic, lambda v: v.leader not in (-1, before.leader), what="a new leader"
            )
        finally:
            os.kill(paused.pid, signal.SIGCONT)
        producer.flush(120)
        assert [f.get(timeout=120).offset for f in futures] == list(range(HALF, 2 * HALF))
        wait_for(lambda: read_until(2 * HALF), timeout=90, what="the second half from the new leader")
        wait_for_view(paused, topic, lambda v: v.leader == after.leader, what="the old leader to follow")
    finally:
        producer.close(10)
        consumer.close()
    assert got == list(enumerate(values(0, 2 * HALF)))
    wait_for(
        lambda: len({segment_bytes(b, topic) for b in cluster}) == 1,
        timeout=60,
        what="every replica, the resumed one too, to hold the same bytes",
    )


# --------------------------------------------------------------------------- aiokafka


async def _aiokafka_scenario(
    cluster: list[Broker], topic: str, before: PartitionView
) -> list[tuple[int, bytes]]:
    tp = AioTopicPartition(topic, 0)
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap(cluster),
        acks="all",
        enable_idempotence=True,
        linger_ms=5,
        request_timeout_ms=60_000,
        retry_backoff_ms=100,
    )
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap(cluster),
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        retry_backoff_ms=100,
    )
    got: list[tuple[int, bytes]] = []

    async def send(batch: list[bytes]) -> list[int]:
        futures = [await producer.send(topic, value=v, partition=0) for v in batch]
        return [(await f).offset for f in futures]

    async def read_until(count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(got) < count:
            assert time.monotonic() < deadline, f"only {len(got)} of {count} records consumed"
            for records in (await consumer.getmany(tp, timeout_ms=200)).values():
                got.extend((r.offset, r.value or b"") for r in records)

    await producer.start()
    await consumer.start()
    try:
        consumer.assign([tp])
        assert await send(values(0, HALF)) == list(range(HALF))
        await read_until(HALF, 60)
        # Killing and waiting for the new leader block: off the loop, so the clients keep running.
        await asyncio.get_running_loop().run_in_executor(None, kill_leader, cluster, topic, before)
        assert await send(values(HALF, HALF)) == list(range(HALF, 2 * HALF))
        await read_until(2 * HALF, 90)
        assert (await consumer.end_offsets([tp]))[tp] == 2 * HALF
    finally:
        await producer.stop()
        await consumer.stop()
    return got


def test_aiokafka_produces_and_consumes_across_a_leader_kill(
    cluster: list[Broker], unique_name: Callable[[str], str]
) -> None:
    topic = unique_name("aio")
    before = create_rf3(cluster, topic)
    got = asyncio.run(_aiokafka_scenario(cluster, topic, before))
    assert got == list(enumerate(values(0, 2 * HALF)))
    assert_survivors_identical(cluster, topic)


# --------------------------------------------------------------------------- kcat


def test_kcat_produces_and_consumes_across_a_leader_kill(
    cluster: list[Broker], unique_name: Callable[[str], str], kcat: str
) -> None:
    """kcat reads its whole stdin before producing, so each half is one ``kcat -P`` run: the
    second starts right after the kill, while the dead leader is still in every broker's metadata
    (its session has not expired), and must wait for the election. The consumer is one ``kcat -C``
    run that follows the leader change mid-way."""
    topic = unique_name("kcat")
    before = create_rf3(cluster, topic)
    common = [
        "-b",
        bootstrap(cluster),
        "-t",
        topic,
        "-p",
        "0",
        "-X",
        "topic.metadata.refresh.interval.ms=1000",
    ]
    produce = [
        kcat,
        "-P",
        *common,
        "-X",
        "acks=all",
        "-X",
        "enable.idempotence=true",
        "-X",
        "message.timeout.ms=90000",
    ]

    def run_producer(batch: list[bytes]) -> None:
        proc = subprocess.run(
            produce, input=b"".join(v + b"\n" for v in batch), capture_output=True, timeout=120
        )
        assert proc.returncode == 0, proc.stderr.decode()

    consume = [kcat, "-C", *common, "-X", "isolation.level=read_committed", "-o", "beginning"]
    consumer = subprocess.Popen(
        [*consume, "-c", str(2 * HALF), "-f", "%o %s\n"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        run_producer(values(0, HALF))
        leader = by_id(cluster, before.leader)

        def first_half_committed() -> bool:
            with WireClient(leader.bootstrap) as wire:
                return log_end_offset(wire, topic) == HALF  # ListOffsets latest: the HW

        wait_for(first_half_committed, timeout=60, what="kcat's first half acknowledged")
        leader.kill()
        run_producer(values(HALF, HALF))
        witness = next(b for b in cluster if b.running)
        after = wait_for_view(witness, topic, lambda v: v.leader >= 0, what="the new leader")
        assert after.leader != before.leader and after.leader_epoch > before.leader_epoch
        out, err = consumer.communicate(timeout=120)
        assert consumer.returncode == 0, err.decode()
    finally:
        if consumer.poll() is None:
            consumer.kill()
            consumer.wait()
    rows = [line.split(" ", 1) for line in out.decode().splitlines()]
    assert [(int(o), v.encode()) for o, v in rows] == list(enumerate(values(0, 2 * HALF)))
    assert_survivors_identical(cluster, topic)


# --------------------------------------------------------------------------- epoch checks


def fetch_code(wire: WireClient, topic: str, current_leader_epoch: int) -> int:
    """Fetch v11 from offset 0 carrying ``current_leader_epoch`` -> the partition's error code."""
    request = fetch_request(topic, 0, 0)
    (t,) = request.topics
    (p,) = t.partitions
    part = dataclasses.replace(p, current_leader_epoch=i32(current_leader_epoch))
    request = dataclasses.replace(request, topics=(dataclasses.replace(t, partitions=(part,)),))
    (rt,) = wire.send(request).responses
    (rp,) = rt.partitions
    return int(rp.error_code)


def test_list_offsets_offsets_for_leader_epoch_and_fetch_check_the_leader_epoch(
    cluster: list[Broker], unique_name: Callable[[str], str]
) -> None:
    topic = unique_name("epochs")
    first = create_rf3(cluster, topic)
    old_leader = by_id(cluster, first.leader)
    with WireClient(old_leader.bootstrap) as wire:
        for i in range(3):
            response = wire.send(produce_request(topic, 0, simple_batch([f"r{i}".encode()]), acks=-1))
            assert int(response.responses[0].partition_responses[0].error_code) == NONE
    # A clean stop closes the leader's session at once: a quick election at a newer epoch.
    old_leader.stop()
    witness = next(b for b in cluster if b.running)
    now = wait_for_view(
        witness,
        topic,
        lambda v: v.leader not in (-1, first.leader) and v.leader_epoch > first.leader_epoch,
        what="a new leader",
    )
    leader = by_id(cluster, now.leader)
    follower = next(b for b in cluster if b.running and b is not leader)
    epoch = now.leader_epoch
    wait_for_view(follower, topic, lambda v: v.leader_epoch == epoch, what="the follower to see the epoch")
    with WireClient(leader.bootstrap) as wire:
        wait_for(lambda: list_offsets_code(wire, topic, epoch)[:2] == (NONE, 3), what="the new leader's HW")
        assert list_offsets_code(wire, topic, epoch) == (NONE, 3, epoch)
        assert list_offsets_code(wire, topic, -1) == (NONE, 3, epoch)  # no epoch: no check
        assert list_offsets_code(wire, topic, epoch - 1)[0] == FENCED_LEADER_EPOCH
        assert list_offsets_code(wire, topic, epoch + 1)[0] == UNKNOWN_LEADER_EPOCH

        # Where did the old epoch end? At the new epoch's start (3): KIP-320's position check.
        assert offsets_for_epoch(wire, topic, epoch, first.leader_epoch) == (NONE, first.leader_epoch, 3)
        assert offsets_for_epoch(wire, topic, epoch, epoch) == (NONE, epoch, 3)
        assert offsets_for_epoch(wire, topic, epoch - 1, first.leader_epoch)[0] == FENCED_LEADER_EPOCH
        assert offsets_for_epoch(wire, topic, epoch + 1, first.leader_epoch)[0] == UNKNOWN_LEADER_EPOCH
        # v2, librdkafka's only version: the same answers (a broker without it makes librdkafka
        # skip the check after every leader change)
        assert offsets_for_epoch(wire, topic, epoch, first.leader_epoch, version=2) == (
            NONE,
            first.leader_epoch,
            3,
        )
        assert (
            offsets_for_epoch(wire, topic, epoch - 1, first.leader_epoch, version=2)[0] == FENCED_LEADER_EPOCH
        )

        assert fetch_code(wire, topic, epoch) == NONE
        assert fetch_code(wire, topic, epoch - 1) == FENCED_LEADER_EPOCH
        assert fetch_code(wire, topic, epoch + 1) == UNKNOWN_LEADER_EPOCH
    with WireClient(follower.bootstrap) as wire:
        # The epoch is checked first, then leadership (Kafka's Partition.getLocalLog order).
        assert list_offsets_code(wire, topic, epoch)[0] == NOT_LEADER_OR_FOLLOWER
        assert list_offsets_code(wire, topic, epoch - 1)[0] == FENCED_LEADER_EPOCH
        assert offsets_for_epoch(wire, topic, epoch, epoch)[0] == NOT_LEADER_OR_FOLLOWER
        assert fetch_code(wire, topic, epoch) == NOT_LEADER_OR_FOLLOWER
        assert fetch_code(wire, topic, epoch + 1) == UNKNOWN_LEADER_EPOCH
