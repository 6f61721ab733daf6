"""The last in-sync replica dies and an out-of-sync one comes back: what the partition and an
idempotent producer see, with ``unclean.leader.election.enable`` false (Kafka's default) and
true. The behaviour and Kafka's reasons are written down in src/exactly/cluster/README.md
("Unclean leader election: what clients see").

The setting is the topic's override in ``/config/topics`` if it has one, else the broker's.

Setup shared by all: three brokers, a topic on brokers [0, 1] only (RF 2, min.insync.replicas
1), so broker 2 is an observer that stays up to be asked. Producer A writes sequences 0-1 while
both replicas are in sync; broker 1 is killed and leaves the ISR; A writes sequences 2-3 and a
second producer B writes sequences 0-1, both acknowledged with acks=all by the ISR {0}; then
broker 0 is killed and broker 1 restarted, holding only A's first batch.

* false: nobody eligible, so the partition stays offline (leader -1, LEADER_NOT_AVAILABLE in
  Metadata, the ISR keeps its last member), produce is refused, and when broker 0 returns it
  leads again with every acknowledged record.
* true: broker 1 leads with ISR [1]; the acknowledged tail is gone. The new leader knows A only
  up to sequence 1, so A's next batch (sequence 4) gets OUT_OF_ORDER_SEQUENCE_NUMBER and a retry
  of the lost batch is accepted as new, at the lost offset; B is unknown there, so any sequence
  is accepted (Kafka 2.5+; the producer cannot tell its records were lost). Broker 0 comes back
  as a follower and truncates its acknowledged tail away: all replicas agree on the new log.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.cluster.helpers import by_id, running_cluster, wait_for
from tests.cluster.partition_view import view, wait_for_view
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

TOPIC = "unclean"
LEADER_NOT_AVAILABLE = 5
NOT_LEADER_OR_FOLLOWER = 6
OUT_OF_ORDER_SEQUENCE_NUMBER = 45


@pytest.fixture
def cluster(zk_connect: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[list[Broker]]:
    """``request.param``: the brokers' ``unclean.leader.election.enable``."""
    yield from running_cluster(
        zk_connect,
        tmp_path,
        **{"unclean.leader.election.enable": request.param, "replica.lag.time.max.ms": "10000"},
    )


def admin(brokers: list[Broker]) -> AdminClient:
    return AdminClient({"bootstrap.servers": ",".join(b.bootstrap for b in brokers if b.running)})


def produce(broker: Broker, batch: bytes) -> tuple[int, int]:
    with WireClient(broker.bootstrap) as wire:
        part = partition_response(wire.send(produce_request(TOPIC, 0, batch, acks=-1)))
    return int(part.error_code), int(part.base_offset)


def values_at(leader: Broker) -> list[bytes]:
    with WireClient(leader.bootstrap) as wire:
        return [r.value or b"" for r in fetch_records(wire, TOPIC, 0, 0)]


def segment_bytes(broker: Broker) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(broker.partition_dir(TOPIC, 0).glob("*.log")))


class Producer:
    """An idempotent producer's identity and next sequence, batches built by hand."""

    def __init__(self, broker: Broker) -> None:
        with WireClient(broker.bootstrap) as wire:
            self.pid, self.epoch = init_producer_id(wire)

    def batch(self, seq: int, *values: bytes) -> bytes:
        return simple_batch(list(values), producer_id=self.pid, producer_epoch=self.epoch, base_sequence=seq)


def lose_the_last_isr_member(
    cluster: list[Broker],
    topic_config: dict[str, str] | None = None,
    before_losing: Callable[[], None] | None = None,
) -> tuple[Producer, Producer]:
    """Run the shared setup up to "broker 0 killed, broker 1 restarted"; returns (A, B).
    ``topic_config``: overrides the topic is created with; ``before_losing`` runs once every
    write is acknowledged, before broker 0 is killed."""
    first, second, observer = by_id(cluster, 0), by_id(cluster, 1), by_id(cluster, 2)
    client = admin(cluster)
    wait_for(lambda: len(client.list_topics(timeout=5).brokers) == 3, what="three brokers")
    topic = NewTopic(
        TOPIC,
        num_partitions=1,
        replica_assignment=[[0, 1]],
        config={"min.insync.replicas": "1", **(topic_config or {})},
    )
    client.create_topics([topic])[TOPIC].result(timeout=30)
    wait_for_view(
        first, TOPIC, lambda v: v.leader == 0 and sorted(v.isr) == [0, 1], what="leader 0, ISR [0, 1]"
    )
    a = Producer(observer)
    assert produce(first, a.batch(0, b"a0", b"a1")) == (0, 0)  # acks=all: broker 1 has it

    second.kill()
    wait_for_view(first, TOPIC, lambda v: v.isr == (0,), what="broker 1 out of the ISR")
    b = Producer(observer)
    assert produce(first, a.batch(2, b"a2", b"a3")) == (0, 2)  # acknowledged by the ISR {0}
    assert produce(first, b.batch(0, b"b0", b"b1")) == (0, 4)
    if before_losing is not None:
        before_losing()

    first.kill()
    offline = wait_for_view(observer, TOPIC, lambda v: v.leader == -1, what="the partition offline")
    assert offline.error_code == LEADER_NOT_AVAILABLE
    assert offline.isr == (0,)  # the ISR is never empty: its last member is kept
    second.restart()
    return a, b


@pytest.mark.parametrize("cluster", ["false"], indirect=True)
def test_without_unclean_election_the_partition_stays_offline_until_an_isr_member_returns(
    cluster: list[Broker],
) -> None:
    first, second, observer = by_id(cluster, 0), by_id(cluster, 1), by_id(cluster, 2)
    a, _b = lose_the_last_isr_member(cluster)
    # The controller handles events in order: once a topic created after broker 1's return has
    # its leaders, broker 1's start-up (where an election would have happened) is behind us.
    barrier = NewTopic("after-restart", num_partitions=1, replication_factor=1)
    client = admin(cluster)
    client.create_topics([barrier])["after-restart"].result(timeout=30)
    for broker in (observer, second):
        wait_for_view(
            broker, "after-restart", lambda v: v.leader >= 0, what=f"{broker.name} to see the barrier"
        )
        still = view(broker, TOPIC)
        assert still is not None
        assert (still.leader, still.error_code, still.isr) == (-1, LEADER_NOT_AVAILABLE, (0,))
    code, _offset = produce(second, a.batch(4, b"a4"))
    assert code == NOT_LEADER_OR_FOLLOWER

    first.restart()
    wait_for_view(first, TOPIC, lambda v: v.leader == 0, what="broker 0, the ISR member, to lead")
    assert values_at(first) == [b"a0", b"a1", b"a2", b"a3", b"b0", b"b1"]  # nothing acknowledged lost
    assert produce(first, a.batch(4, b"a4")) == (0, 6)
    wait_for_view(
        observer, TOPIC, lambda v: sorted(v.isr) == [0, 1], timeout=60, what="broker 1 back in sync"
    )
    wait_for(lambda: segment_bytes(first) == segment_bytes(second), what="replicas to agree")


@pytest.mark.parametrize(
    ("cluster", "topic_config"),
    [("true", {}), ("false", {"unclean.leader.election.enable": "true"})],
    indirect=["cluster"],
    ids=["broker-setting", "topic-override"],
)
def test_unclean_election_loses_the_acked_tail_and_the_producer_sees_out_of_order_sequence(
    cluster: list[Broker], topic_config: dict[str, str]
) -> None:
    first, second, observer = by_id(cluster, 0), by_id(cluster, 1), by_id(cluster, 2)
    a, b = lose_the_last_isr_member(cluster, topic_config)
    elected = wait_for_view(second, TOPIC, lambda v: v.leader == 1, what="broker 1 elected uncleanly")
    assert (elected.error_code, elected.isr) == (0, (1,))
    assert values_at(second) == [b"a0", b"a1"]  # a2, a3, b0, b1 were acknowledged and are gone

    # A continues with sequence 4: the new leader's last sequence for A is 1.
    code, _offset = produce(second, a.batch(4, b"a4"))
    assert code == OUT_OF_ORDER_SEQUENCE_NUMBER
    # Its retry of the lost batch is next in sequence there: accepted as new, at the lost offset.
    assert produce(second, a.batch(2, b"a2-again", b"a3-again")) == (0, 2)
    assert produce(second, a.batch(4, b"a4")) == (0, 4)
    # B has no state on the new leader: any sequence is accepted, the loss goes unnoticed.
    assert produce(second, b.batch(2, b"b2")) == (0, 5)
    assert values_at(second) == [b"a0", b"a1", b"a2-again", b"a3-again", b"a4", b"b2"]

    # The old leader returns as a follower and cuts its acknowledged tail (offsets 2-5) away.
    first.restart()
    wait_for_view(
        observer, TOPIC, lambda v: sorted(v.isr) == [0, 1], timeout=60, what="broker 0 back in sync"
    )
    wait_for(lambda: segment_bytes(first) == segment_bytes(second), what="replicas to agree")
    assert b"b0" not in segment_bytes(first)


@pytest.mark.parametrize("cluster", ["true"], indirect=True)
def test_a_librdkafka_consumer_past_the_lost_tail_moves_back_to_where_its_epoch_ends(
    cluster: list[Broker],
) -> None:
    """KIP-320 from the consumer's side: a consumer that had read the acknowledged tail (offsets
    2-5) validates its position with OffsetsForLeaderEpoch (v2, librdkafka's version) on the
    uncleanly elected leader, learns that its epoch ends at 2 there and fetches on from 2. A
    broker without v2 makes librdkafka skip that check: it fetches at 6, past the new log end,
    gets OFFSET_OUT_OF_RANGE and resets to the earliest offset, reading a0 and a1 again."""
    second, observer = by_id(cluster, 1), by_id(cluster, 2)
    consumer = Consumer(
        {
            "bootstrap.servers": observer.bootstrap,
            "group.id": "kip-320",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "topic.metadata.refresh.interval.ms": 500,
            "fetch.wait.max.ms": 100,
        }
    )
    read: list[tuple[int, bytes]] = []

    def has_read(count: int) -> bool:
        for m in consumer.consume(num_messages=10, timeout=0.2):
            if m.error() is None:
                read.append((int(m.offset() or 0), m.value() or b""))
        return len(read) >= count

    def read_the_tail() -> None:
        consumer.assign([TopicPartition(TOPIC, 0, OFFSET_BEGINNING)])
        wait_for(lambda: has_read(6), what="the consumer to read offsets 0-5")
        assert [o for o, _ in read] == [0, 1, 2, 3, 4, 5]

    try:
        a, _b = lose_the_last_isr_member(cluster, before_losing=read_the_tail)
        wait_for_view(second, TOPIC, lambda v: v.leader == 1, what="broker 1 elected uncleanly")
        del read[:]
        # The new log ends at 4 (< the consumer's position 6), whatever the consumer did so far.
        assert produce(second, a.batch(2, b"a2-again", b"a3-again")) == (0, 2)
        wait_for(lambda: has_read(2), timeout=60, what="the consumer to read on")
        assert read[:2] == [(2, b"a2-again"), (3, b"a3-again")]
    finally:
        consumer.close()
