"""The group and transaction coordinators on a three-broker cluster (real ZooKeeper, broker
subprocesses, confluent-kafka clients): the internal topics are replicated cluster topics, the
coordinator of a key is the leader of its partition, and both coordinators survive the kill -9 of
their broker (the next leader loads the partition from its replica)."""

from __future__ import annotations

import json
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kazoo.client import KazooClient
from kio.schema.types import ProducerId, TopicName
from kio.schema.write_txn_markers.v1 import request as markers_request
from kio.static.primitive import i16, i32

from tests.cluster.helpers import bootstrap, by_id, running_cluster, wait_for
from tests.cluster.partition_view import kill_leader
from tests.support.broker import Broker
from tests.support.wire import WireClient, fetch_batches

TOPIC = "orders"
OFFSETS = "__consumer_offsets"
TXN_STATE = "__transaction_state"


@pytest.fixture
def cluster(zk_connect: str, tmp_path: Path) -> Iterator[list[Broker]]:
    yield from running_cluster(zk_connect, tmp_path, **{"replica.lag.time.max.ms": "10000"})


def create_topic(brokers: list[Broker], partitions: int = 2) -> AdminClient:
    admin = AdminClient({"bootstrap.servers": bootstrap(brokers)})
    wait_for(lambda: len(admin.list_topics(timeout=5).brokers) == 3, what="three brokers")
    topic = NewTopic(
        TOPIC, num_partitions=partitions, replication_factor=3, config={"min.insync.replicas": "2"}
    )
    admin.create_topics([topic])[TOPIC].result(timeout=30)
    return admin


def leader_of(brokers: list[Broker], topic: str, partition: int = 0) -> int:
    """The partition's leader as Metadata reports it (-1 while none)."""
    md = AdminClient({"bootstrap.servers": bootstrap(brokers)}).list_topics(topic, timeout=5)
    partitions = md.topics[topic].partitions
    return partitions[partition].leader if partition in partitions else -1


def transactional_producer(brokers: list[Broker], txn_id: str) -> Producer:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap(brokers),
            "transactional.id": txn_id,
            "transaction.timeout.ms": 60000,
            "message.timeout.ms": 60000,
        }
    )
    producer.init_transactions(60)
    return producer


def produce_txn(producer: Producer, values: range, *, commit: bool = True) -> None:
    producer.begin_transaction()
    for i in values:
        producer.produce(TOPIC, key=str(i).encode(), value=str(i).encode(), partition=i % 2)
    if commit:
        producer.commit_transaction(60)
    else:
        producer.abort_transaction(60)


def read_committed(brokers: list[Broker], expected: int) -> list[int]:
    """Every committed value of TOPIC (both partitions), read until ``expected`` came back and
    then until both partitions' ends (so anything extra would show)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap(brokers),
            "group.id": "reader",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        consumer.assign([TopicPartition(TOPIC, p, 0) for p in (0, 1)])
        seen: list[int] = []
        at_end: set[int] = set()
        while len(seen) < expected or len(at_end) < 2:
            msg = consumer.poll(15)
            assert msg is not None, f"only {len(seen)} of {expected} records came back"
            if msg.error() is not None:
                assert msg.error().code() == -191, msg.error()  # _PARTITION_EOF
                # librdkafka reports a partition's end once, until a record comes after it: one
                # that reached its end before the other's records arrived is not reported again
                at_end.add(msg.partition())
                continue
            at_end.discard(msg.partition())
            seen.append(int(msg.value()))
        return sorted(seen)
    finally:
        consumer.close()


def test_internal_topics_are_replicated_cluster_topics(cluster: list[Broker], zk_connect: str) -> None:
    """Created through ZooKeeper on first use with Kafka's replication factors (3) and, for the
    transaction log, min.insync.replicas = transaction.state.log.min.isr (2)."""
    create_topic(cluster)
    producer = transactional_producer(cluster, "txn-topics")  # FindCoordinator(transaction)
    produce_txn(producer, range(4))
    consumer = Consumer({"bootstrap.servers": bootstrap(cluster), "group.id": "g"})  # ... (group)
    consumer.commit(offsets=[TopicPartition(TOPIC, 0, 1)], asynchronous=False)
    consumer.close()
    zk = KazooClient(hosts=zk_connect)
    zk.start(10)
    try:
        for topic in (OFFSETS, TXN_STATE):
            data, _ = zk.get(f"/brokers/topics/{topic}")
            replicas = json.loads(data)["partitions"]
            assert list(replicas) == ["0"]  # offsets/transaction.state.log.num.partitions = 1
            assert sorted(replicas["0"]) == [0, 1, 2]
        config = json.loads(zk.get(f"/config/topics/{TXN_STATE}")[0])["config"]
        assert config["min.insync.replicas"] == "2"
        assert config["cleanup.policy"] == "compact"
    finally:
        zk.stop()
        zk.close()
    # every broker hosts a replica of the transaction log: the followers caught up with the leader
    wait_for(
        lambda: (
            len(
                {
                    b.partition_dir(TXN_STATE, 0).joinpath("00000000000000000000.log").stat().st_size
                    for b in cluster
                }
            )
            == 1
        ),
        what="transaction log replicas to converge",
    )


def test_find_coordinator_answers_the_partition_leader_on_every_broker(cluster: list[Broker]) -> None:
    create_topic(cluster)
    producer = transactional_producer(cluster, "txn-find")
    produce_txn(producer, range(2))
    leader = leader_of(cluster, TXN_STATE)
    assert leader in (0, 1, 2)
    for broker in cluster:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        # librdkafka's describe_consumer_groups asks FindCoordinator first; the answer names
        # the group's coordinator, which must be the leader of __consumer_offsets-0 wherever asked
        consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "probe"})
        consumer.subscribe([TOPIC])
        consumer.poll(1)
        wait_for(lambda: leader_of(cluster, OFFSETS) >= 0, what="an offsets leader")
        described = admin.describe_consumer_groups(["probe"])["probe"].result(timeout=30)
        assert described.coordinator.id == leader_of(cluster, OFFSETS)
        consumer.close()


def test_transactions_on_the_cluster_read_committed_sees_only_committed(cluster: list[Broker]) -> None:
    create_topic(cluster)
    producer = transactional_producer(cluster, "txn-basic")
    produce_txn(producer, range(0, 50))
    produce_txn(producer, range(50, 100), commit=False)
    produce_txn(producer, range(100, 150))
    assert read_committed(cluster, 100) == [*range(50), *range(100, 150)]


def test_committed_offsets_survive_the_group_coordinators_kill_9(cluster: list[Broker]) -> None:
    create_topic(cluster)
    producer = Producer({"bootstrap.servers": bootstrap(cluster), "acks": "all"})
    for i in range(20):
        producer.produce(TOPIC, value=str(i).encode(), partition=i % 2)
    assert producer.flush(30) == 0
    config = {
        "bootstrap.servers": bootstrap(cluster),
        "group.id": "survivors",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
    }
    consumer = Consumer(config)
    consumer.assign([TopicPartition(TOPIC, 0, 0), TopicPartition(TOPIC, 1, 0)])
    consumer.commit(offsets=[TopicPartition(TOPIC, 0, 7), TopicPartition(TOPIC, 1, 3)], asynchronous=False)
    consumer.close()
    kill_leader(cluster, OFFSETS)  # the group coordinator's broker
    survivors = [b for b in cluster if b.running]
    consumer = Consumer({**config, "bootstrap.servers": bootstrap(survivors)})
    try:
        committed = consumer.committed([TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)], timeout=30)
        assert sorted((tp.partition, tp.offset) for tp in committed) == [(0, 7), (1, 3)]
    finally:
        consumer.close()


def test_transaction_after_the_transaction_coordinators_kill_9(cluster: list[Broker]) -> None:
    """The same producer goes on after its coordinator's broker died between two transactions:
    the next leader of __transaction_state-0 loaded the id (producer id and epoch) from its
    replica, so the commit succeeds and read_committed sees both transactions exactly once."""
    create_topic(cluster)
    producer = transactional_producer(cluster, "txn-failover")
    produce_txn(producer, range(0, 40))
    # the cluster answers EndTxn once PrepareCommit is replicated and writes the markers after:
    # wait until they are in (the LSO passed them), so the first COMMIT carries epoch 0
    assert read_committed(cluster, 40) == list(range(40))
    kill_leader(cluster, TXN_STATE)  # the transaction coordinator's broker
    survivors = [b for b in cluster if b.running]
    produce_txn(producer, range(40, 80))  # librdkafka finds the new coordinator by itself
    assert read_committed(survivors, 80) == list(range(80))
    # The markers carry the coordinator epoch = the transaction log partition's leader epoch:
    # 0 from the first coordinator, higher from the next. The data partition's leader refuses a
    # marker of the older coordinator epoch now, and a non-leader refuses any marker.
    leader = by_id(cluster, leader_of(survivors, TOPIC, 0))
    with WireClient(leader.bootstrap) as client:
        markers = [(h, recs) for h, recs in fetch_batches(client, TOPIC, 0) if h.is_control]
        epochs = [struct.unpack(">hi", recs[0].value)[1] for _h, recs in markers]
        # (the first transaction's COMMIT may come twice: when its CompleteCommit had not reached
        # the next leader yet, that one finds PrepareCommit and sends the markers again; harmless)
        assert epochs[0] == 0 and epochs[-1] >= 1 and epochs == sorted(epochs), epochs
        last = markers[-1][0]
        assert write_marker(client, last.producer_id, last.producer_epoch, 0) == 52  # COORDINATOR_FENCED
    follower = next(b for b in survivors if b is not leader)
    with WireClient(follower.bootstrap) as client:
        assert write_marker(client, last.producer_id, last.producer_epoch, epochs[-1]) == 6  # NOT_LEADER


def write_marker(client: WireClient, producer_id: int, producer_epoch: int, coordinator_epoch: int) -> int:
    """One COMMIT marker for orders-0 by WriteTxnMarkers v1; its partition error code."""
    request = markers_request.WriteTxnMarkersRequest(
        markers=(
            markers_request.WritableTxnMarker(
                producer_id=ProducerId(producer_id),
                producer_epoch=i16(producer_epoch),
                transaction_result=True,
                topics=(
                    markers_request.WritableTxnMarkerTopic(
                        name=TopicName(TOPIC), partition_indexes=(i32(0),)
                    ),
                ),
                coordinator_epoch=i32(coordinator_epoch),
            ),
        )
    )
    ((topic,),) = (m.topics for m in client.send(request).markers)
    (partition,) = topic.partitions
    return int(partition.error_code)


def test_transactional_copier_commits_offsets_through_the_group_coordinator(cluster: list[Broker]) -> None:
    """consume -> produce -> send_offsets_to_transaction -> commit with a subscribed consumer
    group: TxnOffsetCommit goes to the group coordinator (wherever __consumer_offsets-0 is led)
    and the COMMIT marker that reaches that partition's leader makes the offsets visible; an
    aborted transaction's offsets are dropped there."""
    admin = create_topic(cluster)
    out = "copied"
    admin.create_topics([NewTopic(out, num_partitions=1, replication_factor=3)])[out].result(timeout=30)
    source = Producer({"bootstrap.servers": bootstrap(cluster), "acks": "all"})
    for i in range(20):
        source.produce(TOPIC, value=str(i).encode(), partition=i % 2)
    assert source.flush(30) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap(cluster),
            "group.id": "copier",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    consumer.subscribe([TOPIC])
    producer = transactional_producer(cluster, "copier-txn")
    producer.begin_transaction()
    copied = 0
    while copied < 20:
        msg = consumer.poll(15)
        assert msg is not None, f"only {copied} of 20 records consumed"
        assert msg.error() is None, msg.error()
        producer.produce(out, value=msg.value(), partition=0)
        copied += 1
    producer.send_offsets_to_transaction(
        consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), 60
    )
    producer.commit_transaction(60)
    # an aborted transaction's offsets are dropped where the ABORT marker lands
    producer.begin_transaction()
    producer.produce(out, value=b"junk", partition=0)
    producer.send_offsets_to_transaction(
        [TopicPartition(TOPIC, 0, 15), TopicPartition(TOPIC, 1, 15)], consumer.consumer_group_metadata(), 60
    )
    producer.abort_transaction(60)
    consumer.close()
    check = Consumer({"bootstrap.servers": bootstrap(cluster), "group.id": "copier"})
    try:
        committed = check.committed([TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)], timeout=30)
        assert sorted((tp.partition, tp.offset) for tp in committed) == [(0, 10), (1, 10)]
    finally:
        check.close()


@pytest.mark.slow
def test_transactions_go_on_while_the_coordinators_broker_is_killed_mid_stream(cluster: list[Broker]) -> None:
    """Back-to-back transactions (every third aborted) while the broker leading
    __transaction_state-0 is killed -9 after a few: every commit either succeeds or is aborted
    and redone, and read_committed reads exactly the committed values, each once."""
    create_topic(cluster)
    producer = transactional_producer(cluster, "txn-stream")
    committed: list[int] = []
    next_value = 0
    txn = 0
    killer: threading.Timer | None = None
    while len(committed) < 400:
        values = range(next_value, next_value + 20)
        next_value += 20
        txn += 1
        if txn == 4:  # the kill lands somewhere inside this transaction or the next ones
            killer = threading.Timer(0.05, by_id(cluster, leader_of(cluster, TXN_STATE)).kill)
            killer.start()
        try:
            produce_txn(producer, values, commit=txn % 3 != 0)
        except KafkaException as exc:
            error = exc.args[0]
            assert error.txn_requires_abort() or error.retriable(), error
            producer.abort_transaction(60)
            continue
        if txn % 3 != 0:
            committed.extend(values)
    assert killer is not None
    killer.join()
    survivors = [b for b in cluster if b.running]
    assert len(survivors) == 2
    assert read_committed(survivors, len(committed)) == sorted(committed)


@pytest.fixture
def crashing_cluster(zk_connect: str, tmp_path: Path) -> Iterator[list[Broker]]:
    """Every broker SIGKILLs itself right after a PrepareCommit/PrepareAbort it wrote for a
    client's EndTxn is acknowledged by the ISR, before any marker (never for the transactions a
    load hands back, so the next coordinator completes them instead of dying too)."""
    yield from running_cluster(
        zk_connect,
        tmp_path,
        env={"EXACTLY_FAULT": "crash-after-prepare"},
        **{"replica.lag.time.max.ms": "10000"},
    )


def test_commit_completed_by_the_next_coordinator_after_a_crash_after_prepare(
    crashing_cluster: list[Broker],
) -> None:
    """Kill the transaction coordinator's broker right after PrepareCommit is logged: the next
    leader of __transaction_state-0 finds PrepareCommit, sends the markers to every partition's
    leader and writes CompleteCommit; the producer's retried commit succeeds; read_committed
    reads the transaction exactly once and both partitions' LSO moved past it."""
    cluster = crashing_cluster
    create_topic(cluster)
    producer = transactional_producer(cluster, "txn-crash")
    coordinator = leader_of(cluster, TXN_STATE)
    assert coordinator in (0, 1, 2)
    produce_txn(producer, range(0, 30))  # the coordinator dies inside this commit
    victim = by_id(cluster, coordinator)
    wait_for(lambda: not victim.running, timeout=10, what="the coordinator to crash after PrepareCommit")
    assert "crash-after-prepare" in victim.log_text()
    survivors = [b for b in cluster if b.running]
    assert len(survivors) == 2
    assert read_committed(survivors, 30) == list(range(30))
