"""Transactions' administration and guards on a three-broker cluster (real ZooKeeper, broker
subprocesses): `exactly txn` reaches the right broker for every request (coordinators, leaders,
every broker), a hanging transaction is found and aborted at its partition's leader, a partition
leader that is not the coordinator verifies transactional writes with it (KIP-890), and a
transaction left open is aborted by whichever broker coordinates it, also after a failover."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from exactly.client.broker_pool import BrokerPool
from exactly.client.txn_admin import describe_one, describe_producers, describe_transactions
from exactly.client.wire import WireError
from tests.cluster.helpers import bootstrap, by_id, running_cluster, wait_for
from tests.support.broker import Broker, child_env
from tests.support.txn_helpers import (
    INVALID_TXN_STATE,
    txn_batch,
    wire_add_partitions,
    wire_end_txn,
    wire_init_producer_id,
    wire_produce,
)
from tests.support.wire import WireClient, list_offset

pytestmark = pytest.mark.timeout(240)

TOPIC = "orders"
TXN_STATE = "__transaction_state"
TRANSACTIONAL_ID_NOT_FOUND = 105


# ---------------------------------------------------------------------------- helpers
def create_topic(brokers: list[Broker], partitions: int = 3) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap(brokers)})
    wait_for(lambda: len(admin.list_topics(timeout=5).brokers) == len(brokers), what="every broker")
    topic = NewTopic(
        TOPIC, num_partitions=partitions, replication_factor=3, config={"min.insync.replicas": "2"}
    )
    admin.create_topics([topic])[TOPIC].result(timeout=30)
    wait_for(lambda: all(leader_of(brokers, TOPIC, p) >= 0 for p in range(partitions)), what="leaders")


def leader_of(brokers: list[Broker], topic: str, partition: int = 0) -> int:
    md = AdminClient({"bootstrap.servers": bootstrap(brokers)}).list_topics(topic, timeout=5)
    partitions = md.topics[topic].partitions
    return partitions[partition].leader if partition in partitions else -1


def coordinator_of(brokers: list[Broker], tid: str) -> Broker:
    """The transaction coordinator of ``tid`` (FindCoordinator at a running broker)."""
    with BrokerPool.connect(bootstrap(brokers), timeout=30) as pool:
        broker_id = pool.retrying("FindCoordinator", lambda: pool.coordinator_id(tid))
    return by_id(brokers, broker_id)


def init_at_coordinator(brokers: list[Broker], tid: str, timeout_ms: int = 60_000) -> tuple[int, int]:
    """InitProducerId at ``tid``'s coordinator (retried while it loads or aborts)."""
    answer: list[tuple[int, int]] = []

    def attempt() -> bool:
        with WireClient(coordinator_of(brokers, tid).bootstrap) as wc:
            error, pid, epoch = wire_init_producer_id(wc, tid, timeout_ms)
        answer.append((pid, epoch))
        return error == 0

    wait_for(attempt, timeout=30, what=f"InitProducerId({tid})")
    return answer[-1]


def state_of(brokers: list[Broker], tid: str) -> tuple[str, int]:
    """(state, producer epoch) of ``tid`` from its coordinator; ("", -1) while unreachable."""
    try:
        with BrokerPool.connect(bootstrap(brokers), timeout=10) as pool:
            state = describe_one(pool, tid)
    except WireError:
        return "", -1
    return state.transaction_state, state.producer_epoch


def settled(brokers: list[Broker], partition: int, expected: tuple[int, int]) -> bool:
    """The partition's current leader reports (high watermark, LSO) == ``expected``."""
    try:
        return offsets_at_leader(brokers, partition) == expected
    except Exception:  # no leader while it moves
        return False


def offsets_at_leader(brokers: list[Broker], partition: int) -> tuple[int, int]:
    """(high watermark, last stable offset) of ``orders-partition`` from its leader."""
    with WireClient(by_id(brokers, leader_of(brokers, TOPIC, partition)).bootstrap) as wc:
        return (
            _list_offset(wc, partition, isolation_level=0),
            _list_offset(wc, partition, isolation_level=1),
        )


def _list_offset(wc: WireClient, partition: int, isolation_level: int) -> int:
    mod = wc.module(2, 5)
    response = wc.call(
        2,
        5,
        replica_id=-1,
        isolation_level=isolation_level,
        topics=(
            mod.ListOffsetsTopic(
                name=TOPIC,
                partitions=(
                    mod.ListOffsetsPartition(
                        partition_index=partition, current_leader_epoch=-1, timestamp=-1
                    ),
                ),
            ),
        ),
    )
    (part,) = response.topics[0].partitions
    assert part.error_code == 0, part
    return int(part.offset)


def exactly(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "exactly", *args], capture_output=True, timeout=120, env=child_env(), input=b""
    )
    assert proc.returncode == 0, f"exactly {' '.join(args)}: {proc.stderr.decode()}"
    return proc.stdout.decode()


def table(text: str) -> list[dict[str, str]]:
    lines = [line for line in text.splitlines() if line.strip()]
    header = lines[0].split("\t")
    return [dict(zip(header, line.split("\t"), strict=True)) for line in lines[1:]]


def txn_producer(brokers: list[Broker], tid: str) -> Producer:
    producer = Producer(
        {"bootstrap.servers": bootstrap(brokers), "transactional.id": tid, "transaction.timeout.ms": 60000}
    )
    producer.init_transactions(60)
    return producer


# ---------------------------------------------------------------------------- tools
@pytest.fixture
def unverified_cluster(zk_connect: str, tmp_path: Path) -> Iterator[list[Broker]]:
    """Three transaction log partitions (so ids have different coordinators) and KIP-890
    verification off, so that a late write can start a real hanging transaction."""
    yield from running_cluster(
        zk_connect,
        tmp_path,
        **{
            "transaction.state.log.num.partitions": "3",
            "transaction.partition.verification.enable": "false",
        },
    )


def test_txn_tools_find_and_abort_a_hanging_transaction_at_its_leader(
    unverified_cluster: list[Broker],
) -> None:
    cluster = unverified_cluster
    create_topic(cluster)
    # open transactions whose ids spread over the three coordinators
    tids = [f"open-{i}" for i in range(6)]
    producers = []
    for i, tid in enumerate(tids):
        p = txn_producer(cluster, tid)
        p.begin_transaction()
        p.produce(TOPIC, value=b"open", partition=i % 3)
        assert p.flush(30) == 0
        producers.append(p)
    coordinators = {coordinator_of(cluster, tid).name for tid in tids}
    assert len(coordinators) >= 2, "the ids should not all share one coordinator"

    # a hanging transaction: committed, then a late transactional write of the same producer
    partition = 1
    leader = by_id(cluster, leader_of(cluster, TOPIC, partition))
    other = next(b for b in cluster if b is not leader)  # every tool is asked through this one
    pid, epoch = init_at_coordinator(cluster, "late")
    with WireClient(coordinator_of(cluster, "late").bootstrap) as wc:
        assert wire_add_partitions(wc, "late", pid, epoch, {TOPIC: [partition]}) == {(TOPIC, partition): 0}
    with WireClient(leader.bootstrap) as wc:
        assert wire_produce(wc, TOPIC, partition, txn_batch([b"in-txn"], pid, epoch, 0), "late")[0] == 0
    with WireClient(coordinator_of(cluster, "late").bootstrap) as wc:
        assert wire_end_txn(wc, "late", pid, epoch, commit=True) == 0
    wait_for(lambda: state_of(cluster, "late")[0] == "CompleteCommit", what="the commit")
    with WireClient(leader.bootstrap) as wc:
        error, late_offset = wire_produce(wc, TOPIC, partition, txn_batch([b"late"], pid, epoch, 1), "late")
    assert error == 0
    for p in producers:
        p.commit_transaction(30)
    wait_for(
        lambda: offsets_at_leader(cluster, partition)[1] == late_offset, what="the LSO held at the late write"
    )

    bs = ("--bootstrap-server", other.bootstrap)
    listed = {r["TransactionalId"]: r for r in table(exactly("txn", "list", *bs))}
    assert set(tids) | {"late"} <= set(listed), listed  # merged from every broker
    assert listed["late"]["ProducerId"] == str(pid)
    described = {r["TransactionalId"]: r for r in table(exactly("txn", "describe", *tids, "late", *bs))}
    assert {described[t]["TransactionState"] for t in tids} == {"CompleteCommit"}  # from each coordinator

    (hanging,) = table(exactly("txn", "find-hanging", "--max-age-ms", "0", *bs))
    assert (hanging["Topic"], hanging["Partition"]) == (TOPIC, str(partition))
    assert (hanging["ProducerId"], hanging["StartOffset"], hanging["TransactionalId"]) == (
        str(pid),
        str(late_offset),
        "late",
    )
    assert table(exactly("txn", "find-hanging", "--max-age-ms", "600000", *bs)) == []
    assert (
        table(exactly("txn", "find-hanging", "--max-age-ms", "0", "--topic", TOPIC, "--partition", "0", *bs))
        == []
    )
    (producer,) = [
        r for r in table(exactly("producers", TOPIC, str(partition), *bs)) if r["ProducerId"] == str(pid)
    ]
    assert producer["CurrentTransactionStartOffset"] == str(late_offset)
    high_before, lso_before = offsets_at_leader(cluster, partition)
    assert lso_before == late_offset < high_before

    out = exactly(
        "txn", "abort", "--topic", TOPIC, "--partition", str(partition), "--producer-id", str(pid), *bs
    )
    assert f"producer {pid}" in out, out
    assert offsets_at_leader(cluster, partition) == (high_before + 1, high_before + 1)  # + the ABORT marker
    assert table(exactly("txn", "find-hanging", "--max-age-ms", "0", *bs)) == []

    # the other abort: by transactional id, InitProducerId at its coordinator fences the producer
    fenced = txn_producer(cluster, "fence-me")
    fenced.begin_transaction()
    fenced.produce(TOPIC, value=b"doomed", partition=2)
    assert fenced.flush(30) == 0
    out = exactly("txn", "abort", "--transactional-id", "fence-me", *bs)
    assert "Aborted the Ongoing transaction of 'fence-me'" in out, out
    assert state_of(cluster, "fence-me")[1] > 0
    wait_for(lambda: len(set(offsets_at_leader(cluster, 2))) == 1, what="partition 2's LSO past the abort")


# ---------------------------------------------------------------------------- KIP-890
@pytest.fixture
def cluster(zk_connect: str, tmp_path: Path) -> Iterator[list[Broker]]:
    yield from running_cluster(zk_connect, tmp_path)


def test_non_coordinator_leader_verifies_transactional_writes_with_the_coordinator(
    cluster: list[Broker],
) -> None:
    create_topic(cluster)
    tid = "verified"
    pid, epoch = init_at_coordinator(cluster, tid)
    coordinator = coordinator_of(cluster, tid)
    partition = next(p for p in range(3) if by_id(cluster, leader_of(cluster, TOPIC, p)) is not coordinator)
    leader = by_id(cluster, leader_of(cluster, TOPIC, partition))
    with WireClient(leader.bootstrap) as at_leader, WireClient(coordinator.bootstrap) as at_coordinator:
        # not added to the transaction: refused, nothing written, no transaction started
        assert wire_produce(at_leader, TOPIC, partition, txn_batch([b"a"], pid, epoch, 0), tid) == (
            INVALID_TXN_STATE,
            -1,
        )
        assert list_offset(at_leader, TOPIC, partition, -1) == (0, 0)
        assert offsets_at_leader(cluster, partition) == (0, 0)

        assert wire_add_partitions(at_coordinator, tid, pid, epoch, {TOPIC: [partition]}) == {
            (TOPIC, partition): 0
        }
        assert wire_produce(at_leader, TOPIC, partition, txn_batch([b"a"], pid, epoch, 0), tid) == (0, 0)
        assert wire_produce(at_leader, TOPIC, partition, txn_batch([b"b"], pid, epoch, 1), tid) == (0, 1)
        assert offsets_at_leader(cluster, partition) == (2, 0)
        assert wire_end_txn(at_coordinator, tid, pid, epoch, commit=True) == 0
        wait_for(lambda: offsets_at_leader(cluster, partition) == (3, 3), what="the COMMIT marker")
        wait_for(lambda: state_of(cluster, tid)[0] == "CompleteCommit", what="CompleteCommit")

        # a write arriving after the transaction ended: refused at the leader, LSO not held
        error, _ = wire_produce(at_leader, TOPIC, partition, txn_batch([b"late"], pid, epoch, 2), tid)
        assert error == INVALID_TXN_STATE
        assert offsets_at_leader(cluster, partition) == (3, 3)


# ---------------------------------------------------------------------------- timeouts
EXPIRATION_MS = 3_000


@pytest.fixture
def expiring_cluster(zk_connect: str, tmp_path: Path) -> Iterator[list[Broker]]:
    """Timeouts checked every 500 ms; idle producer ids and finished transactional ids expire
    after 3 s (checked every 500 ms)."""
    yield from running_cluster(
        zk_connect,
        tmp_path,
        **{
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": "500",
            "transactional.id.expiration.ms": str(EXPIRATION_MS),
            "transaction.remove.expired.transaction.cleanup.interval.ms": "500",
            "producer.id.expiration.ms": str(EXPIRATION_MS),
            "producer.id.expiration.check.interval.ms": "500",
        },
    )


def producer_ids_at_leader(brokers: list[Broker], partition: int) -> set[int]:
    with BrokerPool.connect(bootstrap(brokers), timeout=10) as pool:
        return {p.producer_id for p in describe_producers(pool, TOPIC, partition)}


def test_open_transactions_time_out_at_the_coordinator_also_after_a_failover(
    expiring_cluster: list[Broker],
) -> None:
    cluster = expiring_cluster
    create_topic(cluster, partitions=1)
    leader = by_id(cluster, leader_of(cluster, TOPIC, 0))

    def open_txn(tid: str, first_sequence: int = 0) -> tuple[int, int]:
        pid, epoch = init_at_coordinator(cluster, tid, timeout_ms=2_000)
        with WireClient(coordinator_of(cluster, tid).bootstrap) as wc:
            assert wire_add_partitions(wc, tid, pid, epoch, {TOPIC: [0]}) == {(TOPIC, 0): 0}
        with WireClient(leader.bootstrap) as wc:
            error, offset = wire_produce(
                wc, TOPIC, 0, txn_batch([tid.encode()], pid, epoch, first_sequence), tid
            )
        assert error == 0
        return pid, offset

    def aborted(tid: str) -> bool:
        state, epoch = state_of(cluster, tid)
        return state == "CompleteAbort" and epoch > 0  # a timeout abort bumps the epoch

    # 1. the first coordinator times the transaction out and aborts it (epoch bumped)
    pid, offset = open_txn("forgotten")
    assert offsets_at_leader(cluster, 0)[1] == offset
    wait_for(lambda: aborted("forgotten"), timeout=30, what="the timeout abort")
    wait_for(lambda: settled(cluster, 0, (offset + 2, offset + 2)), what="the ABORT marker")
    # then, idle, both expire: the producer id at the partition's leader (never while its
    # transaction was open), the transactional id at its coordinator (tombstoned)
    wait_for(lambda: pid not in producer_ids_at_leader(cluster, 0), what="the producer id to expire")
    with BrokerPool.connect(bootstrap(cluster), timeout=10) as pool:
        wait_for(
            lambda: describe_transactions(pool, ["forgotten"])[0].error_code == TRANSACTIONAL_ID_NOT_FOUND,
            what="the transactional id to expire",
        )

    # 2. open another one, kill -9 its coordinator at once: the next coordinator loads the
    #    Ongoing transaction (with its start time) from its replica and times it out
    _pid, offset = open_txn("orphaned")
    coordinator = coordinator_of(cluster, "orphaned")
    coordinator.kill()
    wait_for(
        lambda: coordinator_of(cluster, "orphaned") is not coordinator, timeout=30, what="a new coordinator"
    )
    wait_for(lambda: aborted("orphaned"), timeout=30, what="the new coordinator's timeout abort")
    # (the data partition's leader may have moved too: asked wherever it is now)
    wait_for(lambda: settled(cluster, 0, (offset + 2, offset + 2)), timeout=30, what="the ABORT marker")
