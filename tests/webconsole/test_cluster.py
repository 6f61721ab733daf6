"""The console's snapshot and abort on a three-broker cluster (ZooKeeper mode): requests go to
each partition's leader and each transactional id's coordinator, and ListTransactions is merged
from every broker, so what a single broker shows for free must hold when it is spread out."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic

from exactly.testing.harness import ClusterHandle
from exactly.testing.wait import wait_until
from exactly.webconsole import model
from exactly.webconsole.gather import Gatherer
from tests.support.clients import admin

pytestmark = pytest.mark.timeout(240)
TOPIC = "spread"


@pytest.fixture
def exactly_cluster_config() -> dict[str, object]:
    # three transaction log partitions: the ids below get different coordinators
    return {"transaction.state.log.num.partitions": 3, "group.initial.rebalance.delay.ms": 0}


@pytest.fixture
def open_transactions(exactly_cluster: ClusterHandle) -> Iterator[list[Producer]]:
    bs = exactly_cluster.bootstrap_servers
    client = admin(bs)  # keep a reference: a collected AdminClient fails its futures
    client.create_topics([NewTopic(TOPIC, num_partitions=3, replication_factor=3)])[TOPIC].result(30)
    producers = []
    for i in range(6):
        p = Producer({"bootstrap.servers": bs, "transactional.id": f"spread-{i}", "log_level": 0})
        p.init_transactions(60)
        p.begin_transaction()
        p.produce(TOPIC, value=b"v", partition=i % 3)
        assert p.flush(30) == 0
        producers.append(p)
    yield producers
    for p in producers:
        p.purge()
        p.flush(0)


def test_snapshot_and_abort_on_three_brokers(
    exactly_cluster: ClusterHandle, open_transactions: list[Producer]
) -> None:
    g = Gatherer(
        exactly_cluster.bootstrap_servers, timeout_s=15, hanging_after_ms=model.DEFAULT_HANGING_AFTER_MS
    )
    try:
        snap = g.snapshot()
        assert snap.errors == ()
        assert sorted(b.broker_id for b in snap.brokers) == [0, 1, 2]
        assert [b.broker_id for b in snap.brokers if b.is_controller] == [snap.controller_id]
        parts = [p for p in snap.partitions if p.topic == TOPIC]
        assert len(parts) == 3 and all(len(p.replicas) == 3 for p in parts)
        # two open transactions per partition, first offsets 0 and 1: LSO 0, high watermark 2
        assert [(p.high_watermark, p.lso) for p in parts] == [(2, 0)] * 3
        assert all(sorted(q.txn_start_offset for q in p.producers) == [0, 1] for p in parts)
        txns = {t.transactional_id: t for t in snap.transactions}
        assert {f"spread-{i}" for i in range(6)} <= set(txns)  # merged from every coordinator
        assert all(txns[f"spread-{i}"].partitions == ((TOPIC, i % 3),) for i in range(6))
        assert all(txns[f"spread-{i}"].state == "Ongoing" for i in range(6))
        assert snap.hanging_count == 0

        assert g.abort_transactional_id("spread-0").startswith(
            "Aborted the Ongoing transaction of 'spread-0'"
        )

        def aborted() -> model.Snapshot | None:
            s = g.snapshot()
            return None if {t.transactional_id: t for t in s.transactions}["spread-0"].is_open else s

        after = wait_until(aborted, 60, "spread-0 aborted")
        (p0,) = [p for p in after.partitions if p.topic == TOPIC and p.partition == 0]
        assert (p0.high_watermark, p0.lso) == (3, 1)  # + the ABORT marker; spread-3's is still open
        assert after.errors == ()
    finally:
        g.close()
