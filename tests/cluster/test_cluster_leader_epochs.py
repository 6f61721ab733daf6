"""Leader-epoch changes a leader lives through without losing its leadership, and the reads of
a leader whose high watermark has not caught up with its own epoch yet.

* The controller removes a dead follower from the ISR with a leader-epoch bump while the leader
  stays. An acks=all produce parked on that follower then completes with its offset once the
  smaller ISR has the records, as Kafka answers (the leader's ``Partition`` keeps its delayed
  produces across its own re-election); it must not fail with NOT_LEADER_OR_FOLLOWER, which
  would make a non-idempotent producer write the records twice.
* A new leader whose high watermark is below the start of its epoch (its followers have not
  fetched from it yet) answers ListOffsets "latest", and a timestamp with no answer below the
  HW, with OFFSET_NOT_AVAILABLE until the HW catches up (Kafka's
  ``Partition.fetchOffsetForTimestamp``); answers carry Kafka's leader epochs (current one for
  latest, the first cached epoch for earliest, the batch's for a timestamp).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tests.cluster.helpers import by_id, running_cluster, wait_for
from tests.cluster.partition_view import list_offsets_code, wait_for_view
from tests.support.broker import Broker
from tests.support.wire import WireClient, fetch_records, partition_response, produce_request, simple_batch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

TOPIC = "epochs"


@pytest.fixture
def cluster(zk_connect: str, tmp_path: Path) -> Iterator[list[Broker]]:
    # A long replica lag: only the controller (on the follower's session expiry) shrinks the ISR.
    yield from running_cluster(zk_connect, tmp_path, **{"replica.lag.time.max.ms": "60000"})


def create_topic(brokers: list[Broker]) -> None:
    admin = AdminClient({"bootstrap.servers": ",".join(b.bootstrap for b in brokers)})
    wait_for(lambda: len(admin.list_topics(timeout=5).brokers) == 3, what="three brokers")
    topic = NewTopic(
        TOPIC, num_partitions=1, replica_assignment=[[0, 1, 2]], config={"min.insync.replicas": "2"}
    )
    admin.create_topics([topic])[TOPIC].result(timeout=30)


def test_acks_all_parked_on_a_dead_follower_completes_after_the_controller_shrinks_the_isr(
    cluster: list[Broker],
) -> None:
    create_topic(cluster)
    leader, follower, dead = by_id(cluster, 0), by_id(cluster, 1), by_id(cluster, 2)
    before = wait_for_view(leader, TOPIC, lambda v: v.leader == 0 and len(v.isr) == 3, what="full ISR")
    with WireClient(leader.bootstrap) as wire:
        first = partition_response(wire.send(produce_request(TOPIC, 0, simple_batch([b"before"]), acks=-1)))
    assert (int(first.error_code), int(first.base_offset)) == (0, 0)

    dead.kill()
    # Broker 2 is still in the ISR until its session expires: this produce parks on it.
    answer: list[tuple[int, int]] = []

    def produce() -> None:
        with WireClient(leader.bootstrap, timeout=60) as wire:
            request = produce_request(TOPIC, 0, simple_batch([b"parked"]), acks=-1, timeout_ms=45_000)
            part = partition_response(wire.send(request))
            answer.append((int(part.error_code), int(part.base_offset)))

    sender = threading.Thread(target=produce)
    sender.start()
    shrunk = wait_for_view(
        follower, TOPIC, lambda v: sorted(v.isr) == [0, 1], timeout=60, what="the controller to drop broker 2"
    )
    sender.join(60)
    assert shrunk.leader == 0 and shrunk.leader_epoch > before.leader_epoch  # same leader, new epoch
    assert answer == [(0, 1)]
    with WireClient(leader.bootstrap) as wire:
        assert [r.value for r in fetch_records(wire, TOPIC, 0, 0)] == [b"before", b"parked"]


LEADER_NOT_AVAILABLE = 5  # what ListOffsets v4 and older answer instead of OFFSET_NOT_AVAILABLE
OFFSET_NOT_AVAILABLE = 78


def list_offsets_at(broker: Broker, epoch: int, timestamp: int, version: int = 5) -> tuple[int, int, int]:
    with WireClient(broker.bootstrap) as wire:
        return list_offsets_code(wire, TOPIC, epoch, timestamp=timestamp, isolation=0, version=version)


@pytest.fixture
def slow_sessions_cluster(zk_connect: str, tmp_path: Path) -> Iterator[list[Broker]]:
    # Sessions outlive a frozen broker: it stays registered and in the ISR while SIGSTOPped.
    yield from running_cluster(
        zk_connect, tmp_path, **{"zookeeper.session.timeout.ms": "30000", "replica.lag.time.max.ms": "60000"}
    )


def test_new_leader_answers_offset_not_available_until_its_high_watermark_reaches_its_epoch(
    slow_sessions_cluster: list[Broker],
) -> None:
    cluster = slow_sessions_cluster
    admin = AdminClient({"bootstrap.servers": ",".join(b.bootstrap for b in cluster)})
    wait_for(lambda: len(admin.list_topics(timeout=5).brokers) == 3, what="three brokers")
    controller = admin.list_topics(timeout=5).controller_id
    # The broker to freeze must not be the controller: a frozen controller elects nobody.
    frozen_id = next(i for i in (2, 1, 0) if i != controller)
    first_id, next_id = (i for i in (0, 1, 2) if i != frozen_id)
    topic = NewTopic(TOPIC, num_partitions=1, replica_assignment=[[first_id, next_id, frozen_id]])
    admin.create_topics([topic])[TOPIC].result(timeout=30)
    first, successor, frozen = by_id(cluster, first_id), by_id(cluster, next_id), by_id(cluster, frozen_id)
    wait_for_view(first, TOPIC, lambda v: v.leader == first_id and len(v.isr) == 3, what="full ISR")
    with WireClient(first.bootstrap) as wire:
        part = partition_response(
            wire.send(produce_request(TOPIC, 0, simple_batch([b"r0"], base_timestamp=1000)))
        )
        assert int(part.error_code) == 0

    assert frozen.pid is not None
    os.kill(frozen.pid, signal.SIGSTOP)
    try:
        # acks=1: the leader and the successor get r1, r2; the HW stays at 1 (the frozen ISR
        # member never fetches them), and so does the successor's.
        with WireClient(first.bootstrap) as wire:
            batch = simple_batch([b"r1", b"r2"], base_timestamp=2000)
            assert (
                int(partition_response(wire.send(produce_request(TOPIC, 0, batch, acks=1))).error_code) == 0
            )
        wait_for(lambda: segment_bytes(successor) == segment_bytes(first), what="the successor to replicate")
        before = wait_for_view(successor, TOPIC, lambda v: v.leader == first_id, what="the old state")
        first.stop()
        now = wait_for_view(
            successor,
            TOPIC,
            lambda v: v.leader == next_id and v.leader_epoch > before.leader_epoch,
            what="the successor to lead",
        )
        epoch = now.leader_epoch
        # Its epoch starts at 3; its HW (1) waits for the frozen ISR member.
        assert list_offsets_at(successor, epoch, -1) == (OFFSET_NOT_AVAILABLE, -1, -1)
        assert list_offsets_at(successor, epoch, -1, version=4) == (LEADER_NOT_AVAILABLE, -1, -1)
        assert list_offsets_at(successor, epoch, 1500) == (OFFSET_NOT_AVAILABLE, -1, -1)  # r1: above the HW
        assert list_offsets_at(successor, epoch, 500) == (0, 0, 0)  # r0, below the HW, epoch 0
        assert list_offsets_at(successor, epoch, -2) == (0, 0, 0)  # earliest: the first epoch
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
    wait_for(lambda: list_offsets_at(successor, epoch, -1) == (0, 3, epoch), what="the HW to reach the epoch")
    assert list_offsets_at(successor, epoch, 1500) == (0, 1, 0)  # r1, written in epoch 0


def segment_bytes(broker: Broker) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(broker.partition_dir(TOPIC, 0).glob("*.log")))
