"""Idempotent produce across leader failover, on the wire (hand-built batches, so every
producer id, epoch and sequence is the test's choice and every answer is seen as sent).

What it proves: followers keep producer state while they replicate (the 5-batch cache and the
last sequence travel with the batches, appended with the REPLICATION origin), so a new leader

* answers a retry of a batch the old leader acknowledged with the *original* base offset and
  writes nothing (stored once: read back from the leader and compared byte for byte on every
  replica);
* accepts the next sequence and refuses a gap with OUT_OF_ORDER_SEQUENCE_NUMBER;

and a broker killed with SIGKILL that comes back (producer state from log recovery, then the
missed batches replicated from the leader, snapshotted at its rolls), restarted once more cleanly
(state from the snapshot written at close), dedups the same way when it leads again.

Segments of 100 bytes (about one batch each) make every replica roll, and snapshot its producer
state, at nearly every append, leader and follower alike: the killed broker's recovery and its
later role as leader run on snapshots plus replay, not on one long replay.

The topic's replicas are assigned explicitly ([0, 1, 2]) so which broker leads after each step
is known: the controller elects the first live ISR member in assignment order.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tests.cluster.helpers import by_id, running_cluster, wait_for
from tests.cluster.partition_view import wait_for_view
from tests.support.broker import Broker
from tests.support.wire import (
    WireClient,
    fetch_records,
    init_producer_id,
    partition_response,
    produce_request,
    simple_batch,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

TOPIC = "idem-failover"
OUT_OF_ORDER_SEQUENCE_NUMBER = 45


@pytest.fixture
def cluster(zk_connect: str, tmp_path: Path) -> Iterator[list[Broker]]:
    yield from running_cluster(zk_connect, tmp_path, **{"replica.lag.time.max.ms": "10000"})


def create_topic(brokers: list[Broker]) -> None:
    admin = AdminClient({"bootstrap.servers": ",".join(b.bootstrap for b in brokers)})
    wait_for(lambda: len(admin.list_topics(timeout=5).brokers) == 3, what="three brokers")
    topic = NewTopic(
        TOPIC,
        num_partitions=1,
        replica_assignment=[[0, 1, 2]],
        config={"min.insync.replicas": "2", "segment.bytes": "100"},
    )
    admin.create_topics([topic])[TOPIC].result(timeout=30)


def produce(broker: Broker, batch: bytes, acks: int = -1) -> tuple[int, int]:
    """-> (error code, base offset) of one batch sent to ``broker``."""
    with WireClient(broker.bootstrap) as wire:
        part = partition_response(wire.send(produce_request(TOPIC, 0, batch, acks=acks)))
    return int(part.error_code), int(part.base_offset)


def values_at_leader(leader: Broker) -> list[tuple[int, bytes]]:
    with WireClient(leader.bootstrap) as wire:
        return [(r.offset, r.value or b"") for r in fetch_records(wire, TOPIC, 0, 0)]


def segment_bytes(broker: Broker) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(broker.partition_dir(TOPIC, 0).glob("*.log")))


def wait_until_identical(brokers: list[Broker]) -> None:
    wait_for(
        lambda: len({segment_bytes(b) for b in brokers}) == 1 and segment_bytes(brokers[0]) != b"",
        timeout=30,
        what=f"replicas {[b.name for b in brokers]} to hold the same bytes",
    )


def test_retry_after_kill_9_failover_is_deduplicated_by_the_new_leader(cluster: list[Broker]) -> None:
    create_topic(cluster)
    first, second, third = by_id(cluster, 0), by_id(cluster, 1), by_id(cluster, 2)
    before = wait_for_view(
        first, TOPIC, lambda v: v.leader == 0 and len(v.isr) == 3, what="leader 0, full ISR"
    )
    with WireClient(first.bootstrap) as wire:
        pid, epoch = init_producer_id(wire)

    def batch(seq: int, *values: bytes) -> bytes:
        return simple_batch(list(values), producer_id=pid, producer_epoch=epoch, base_sequence=seq)

    # Two records without a producer id first, so the idempotent batch does not start at 0.
    assert produce(first, simple_batch([b"plain-0", b"plain-1"])) == (0, 0)
    original = batch(0, b"a", b"b", b"c")
    assert produce(first, original) == (0, 2)  # acks=all: every ISR member has it

    first.kill()  # SIGKILL: the controller acts once its session expires
    after = wait_for_view(
        second,
        TOPIC,
        lambda v: v.leader == 1 and v.leader_epoch > before.leader_epoch,
        what="broker 1 to lead",
    )
    assert 0 not in after.isr

    # The producer never saw the ack (say) and retries the identical batch at the new leader.
    assert produce(second, original) == (0, 2)  # the original offset: a duplicate, not appended
    assert produce(second, batch(3, b"d", b"e")) == (0, 5)  # the next sequence is accepted
    code, _offset = produce(second, batch(10, b"gap"))
    assert code == OUT_OF_ORDER_SEQUENCE_NUMBER  # expected sequence 5

    expected = [(0, b"plain-0"), (1, b"plain-1"), (2, b"a"), (3, b"b"), (4, b"c"), (5, b"d"), (6, b"e")]
    assert values_at_leader(second) == expected
    wait_until_identical([second, third])

    # The killed broker returns: producer state from its snapshot and log replay, then the
    # batch it missed (sequences 3-4) replicated from broker 1 with the REPLICATION origin.
    first.restart()
    wait_for_view(second, TOPIC, lambda v: sorted(v.isr) == [0, 1, 2], timeout=60, what="broker 0 in the ISR")
    wait_until_identical([first, second, third])
    # Its roll before the replicated batch at offset 5 snapshotted the state it recovered.
    assert (first.partition_dir(TOPIC, 0) / f"{5:020d}.snapshot").exists()

    # A clean restart on top: its producer state now comes from the snapshot written at close.
    first.stop()
    wait_for_view(second, TOPIC, lambda v: 0 not in v.isr, what="broker 0 out of the ISR")
    first.restart()
    wait_for_view(second, TOPIC, lambda v: sorted(v.isr) == [0, 1, 2], timeout=60, what="broker 0 back")

    # Broker 1 goes away: broker 0, first live ISR member in assignment order, leads again.
    second.stop()
    wait_for_view(first, TOPIC, lambda v: v.leader == 0, what="broker 0 to lead again")
    assert produce(first, batch(3, b"d", b"e")) == (0, 5)  # learned by replication: deduplicated
    assert produce(first, original) == (0, 2)  # from before its crash: deduplicated
    assert produce(first, batch(5, b"f")) == (0, 7)
    code, _offset = produce(first, batch(7, b"gap"))
    assert code == OUT_OF_ORDER_SEQUENCE_NUMBER  # expected sequence 6
    assert values_at_leader(first) == [*expected, (7, b"f")]
    wait_until_identical([first, third])
