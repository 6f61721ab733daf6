"""A restarted replica's high watermark comes from ``replication-offset-checkpoint`` (Kafka's
HighwaterMarkCheckpoint), not from its log end: records it holds beyond the ISR's HW stay
invisible until the leader says they are replicated."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from exactly.client.replica_verification import read_replica
from exactly.client.wire import WireError
from exactly.storage.checkpoint import read_offset_checkpoint
from exactly.storage.log_checkpoints import REPLICATION_OFFSET_CHECKPOINT
from exactly.types import TopicPartition
from tests.cluster.helpers import running_cluster, wait_for
from tests.support.broker import Broker
from tests.support.wire import WireClient, partition_response, produce_request, simple_batch

TOPIC = "hw-restart"
TP = TopicPartition(TOPIC, 0)


@pytest.fixture
def cluster(zk_connect: str, tmp_path: Path) -> Iterator[list[Broker]]:
    # A frozen ISR member must hold the HW for the whole test (no shrink, no session expiry),
    # and the periodic checkpoint must be observable quickly.
    yield from running_cluster(
        zk_connect,
        tmp_path,
        **{
            "replica.lag.time.max.ms": "120000",
            "zookeeper.session.timeout.ms": "30000",
            "replica.high.watermark.checkpoint.interval.ms": "200",
        },
    )


def replica_high_watermark(broker: Broker) -> int | None:
    """The HW ``broker``'s replica serves debug reads (replica_id -2) up to; None while it cannot."""
    try:
        with WireClient(broker.bootstrap) as wire:
            replica = read_replica(wire, TP, int(broker.name.rsplit("-", 1)[1]))
    except (WireError, OSError):
        return None
    assert all(b.last_offset < replica.high_watermark for b in replica.batches)
    return replica.high_watermark


def checkpointed(broker: Broker) -> int | None:
    return (read_offset_checkpoint(broker.data_dir / REPLICATION_OFFSET_CHECKPOINT) or {}).get(TP)


def segment_bytes(broker: Broker) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(broker.partition_dir(TOPIC, 0).glob("*.log")))


def test_restarted_follower_serves_only_up_to_its_checkpointed_high_watermark(cluster: list[Broker]) -> None:
    admin = AdminClient({"bootstrap.servers": ",".join(b.bootstrap for b in cluster)})
    wait_for(lambda: len(admin.list_topics(timeout=5).brokers) == 3, what="three brokers")
    topic = NewTopic(TOPIC, num_partitions=1, replication_factor=3, config={"min.insync.replicas": "1"})
    admin.create_topics([topic])[TOPIC].result(timeout=30)
    wait_for(lambda: admin.list_topics(TOPIC, timeout=5).topics[TOPIC].partitions[0].leader >= 0)
    leader_id = admin.list_topics(TOPIC, timeout=5).topics[TOPIC].partitions[0].leader
    leader = next(b for b in cluster if b.name == f"broker-{leader_id}")
    follower, frozen = (b for b in cluster if b is not leader)

    producer = Producer({"bootstrap.servers": ",".join(b.bootstrap for b in cluster), "acks": "all"})
    for i in range(10):
        producer.produce(TOPIC, value=str(i).encode(), partition=0)
    assert producer.flush(30) == 0
    wait_for(lambda: replica_high_watermark(follower) == 10, what="the follower's HW at 10")
    # The periodic checkpoint (every 200 ms here) records it while the broker runs.
    wait_for(lambda: checkpointed(follower) == 10, what="the follower's HW checkpoint at 10")

    assert leader.pid is not None and frozen.pid is not None
    os.kill(frozen.pid, signal.SIGSTOP)  # an ISR member that never fetches: the HW stays at 10
    try:
        with WireClient(leader.bootstrap) as wire:
            batch = simple_batch([b"beyond-1", b"beyond-2", b"beyond-3"])
            response = wire.send(produce_request(TOPIC, 0, batch, acks=1))
            assert int(partition_response(response).error_code) == 0
        wait_for(lambda: segment_bytes(follower) == segment_bytes(leader), what="the follower to replicate")
        assert replica_high_watermark(follower) == 10  # it holds 13 records, 10 acknowledged

        follower.stop()  # clean: the checkpoint is written at close too
        assert checkpointed(follower) == 10
        # The leader must not tell the restarted follower its HW: only the checkpoint can.
        os.kill(leader.pid, signal.SIGSTOP)
        try:
            follower.start()
            wait_for(lambda: replica_high_watermark(follower) is not None, what="the follower to serve")
            assert replica_high_watermark(follower) == 10  # not its log end (13)
        finally:
            os.kill(leader.pid, signal.SIGCONT)
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
    wait_for(lambda: replica_high_watermark(follower) == 13, timeout=30, what="the HW to reach 13")
