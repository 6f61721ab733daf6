"""KIP-939 on the three-broker cluster: a prepared (2PC) transaction outlives a kill -9 of its
coordinator's broker. The next coordinator loads it from its replica of ``__transaction_state``
with the 2PC mark and the holder's epoch, does not time it out, and commits it for the holder."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from exactly.client.broker_pool import BrokerPool
from exactly.client.two_phase import adopt_prepared, end_prepared
from exactly.client.txn_admin import describe_one
from exactly.client.wire import WireError
from exactly.coordinator.txn.log import partition_for
from tests.cluster.helpers import bootstrap, by_id, running_cluster, wait_for
from tests.support.broker import Broker

pytestmark = pytest.mark.timeout(240)

TOPIC = "prepared-orders"
TXN_PARTITIONS = 3


@pytest.fixture
def two_pc_cluster(zk_connect: str, tmp_path: Path) -> Iterator[list[Broker]]:
    yield from running_cluster(
        zk_connect,
        tmp_path,
        **{
            "transaction.two.phase.commit.enable": "true",
            "transaction.state.log.num.partitions": str(TXN_PARTITIONS),
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": "500",
        },
    )


def _coordinator(brokers: list[Broker], tid: str) -> Broker:
    with BrokerPool.connect(bootstrap(brokers), timeout=30) as pool:
        return by_id(brokers, pool.retrying("FindCoordinator", lambda: pool.coordinator_id(tid)))


def _state(brokers: list[Broker], tid: str) -> tuple[str, int]:
    try:
        with BrokerPool.connect(bootstrap(brokers), timeout=10) as pool:
            state = describe_one(pool, tid)
    except WireError:
        return "", -1
    return state.transaction_state, state.producer_epoch


def _open_txn(brokers: list[Broker], tid: str, timeout_ms: int, n: int) -> None:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap(brokers),
            "transactional.id": tid,
            "transaction.timeout.ms": timeout_ms,
            "message.timeout.ms": timeout_ms,
            "log_level": 3,
        }
    )
    producer.init_transactions(60)
    producer.begin_transaction()
    for i in range(n):
        producer.produce(TOPIC, value=f"{tid}-{i}".encode(), partition=i % 3)
    assert producer.flush(30) == 0


def _committed(brokers: list[Broker]) -> list[bytes]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap(brokers),
            "group.id": "two-pc-reader",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "log_level": 3,
        }
    )
    try:
        consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(3)])
        got: list[bytes] = []
        eof: set[int] = set()
        while len(eof) < 3:
            for m in consumer.consume(100, timeout=1.0):
                if m.error() is None:
                    got.append(m.value() or b"")
                else:
                    eof.add(int(m.partition() or 0))
        return sorted(got)
    finally:
        consumer.close()


def test_prepared_transaction_survives_its_coordinators_kill_9(two_pc_cluster: list[Broker]) -> None:
    cluster = two_pc_cluster
    admin = AdminClient({"bootstrap.servers": bootstrap(cluster)})
    wait_for(lambda: len(admin.list_topics(timeout=5).brokers) == 3, what="every broker")
    admin.create_topics(
        [NewTopic(TOPIC, num_partitions=3, replication_factor=3, config={"min.insync.replicas": "2"})]
    )[TOPIC].result(timeout=30)

    tid = "prepared-on-the-cluster"
    # a plain transaction on the same coordinator partition: its timeout abort shows that the
    # new coordinator's timeout scans ran over the prepared one too
    control = next(
        f"control-{i}"
        for i in range(1000)
        if partition_for(f"control-{i}", TXN_PARTITIONS) == partition_for(tid, TXN_PARTITIONS)
    )
    _open_txn(cluster, tid, 60_000, 12)
    with BrokerPool.connect(bootstrap(cluster), timeout=30) as pool:
        adopted = adopt_prepared(pool, tid, timeout_s=30)
    assert adopted.kept
    coordinator = _coordinator(cluster, tid)
    coordinator.kill()
    wait_for(lambda: _coordinator(cluster, tid) is not coordinator, timeout=60, what="a new coordinator")
    _open_txn(cluster, control, 2_000, 2)
    wait_for(lambda: _state(cluster, control)[0] == "CompleteAbort", timeout=60, what="the control timed out")
    assert _state(cluster, tid) == ("Ongoing", adopted.holder.producer_epoch)
    assert _committed(cluster) == []

    with BrokerPool.connect(bootstrap(cluster), timeout=30) as pool:
        end_prepared(pool, adopted.holder, commit=True, timeout_s=60)
    assert _committed(cluster) == sorted(f"{tid}-{i}".encode() for i in range(12))
