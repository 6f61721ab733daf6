"""Operations on a real 3-broker cluster: ``exactly cluster status`` and the brokers' Prometheus
replication metrics, before and after a follower is paused (SIGSTOP) and a broker is killed -9.

One cluster walks through the states an operator meets, checking the CLI and every broker's
``/metrics`` against each other at each step:

1. healthy: every broker alive, one controller (ActiveControllerCount 1 there, 0 elsewhere),
   nothing under-replicated or offline, the coordinators named; an open transaction's
   LastStableOffsetLag shows on the partition's leader only;
2. a follower paused past ``replica.lag.time.max.ms`` but within its ZooKeeper session: the
   leaders shrink their ISRs themselves (IsrShrinks), the partitions are under-replicated while
   every broker is still alive; resumed, the leaders take it back (IsrExpands);
3. the same broker killed -9: once its session expires it is gone, the partitions it led get new
   leaders (LeaderElectionRate on the controller), the others are under-replicated, the RF 1
   topic on it is offline (OfflinePartitionsCount on the controller); ``--fail-on-*`` exit 1;
4. restarted: everything healthy again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as KafkaPartition
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client.parser import text_string_to_metric_families

from exactly.client.cluster_status import ClusterStatus, read_status
from exactly.client.wire import WireError
from exactly.testing.broker import child_env
from tests.cluster.helpers import bootstrap, by_id, running_cluster, wait_for
from tests.support.broker import Broker

pytestmark = pytest.mark.timeout(300)

REPLICATED = "replicated"
SINGLE = "single"
SESSION_TIMEOUT_MS = 8_000
LAG_TIME_MS = 1_500


@pytest.fixture
def cluster(zk_connect: str, tmp_path: Path) -> Iterator[list[Broker]]:
    yield from running_cluster(
        zk_connect,
        tmp_path,
        **{
            "metrics.port": "0",
            "zookeeper.session.timeout.ms": str(SESSION_TIMEOUT_MS),
            "replica.lag.time.max.ms": str(LAG_TIME_MS),
            # the test moves leaders itself; a rebalance in between would count as elections
            "auto.leader.rebalance.enable": "false",
        },
    )


def status_of(brokers: list[Broker]) -> ClusterStatus | None:
    try:
        return read_status(bootstrap(brokers), timeout_s=5)
    except WireError:
        return None


def cli(brokers: list[Broker], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "exactly",
            "cluster",
            "status",
            "--bootstrap-server",
            bootstrap(brokers),
            *args,
        ],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
    )


def scrape(broker: Broker) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    address = (broker.data_dir / "metrics-address").read_text().strip()
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def metric(broker: Broker, name: str, **labels: str) -> float:
    return scrape(broker)[(name, tuple(sorted(labels.items())))]


def total(brokers: list[Broker], name: str) -> float:
    return sum(metric(b, name) for b in brokers)


def setup_topics(brokers: list[Broker]) -> None:
    """REPLICATED: 3 partitions, RF 3 (leaders spread over the brokers); SINGLE: 3 partitions,
    RF 1, one on each broker (AdminUtils places RF 1 partitions round-robin)."""
    admin = AdminClient({"bootstrap.servers": bootstrap(brokers)})
    wait_for(lambda: len(admin.list_topics(timeout=5).brokers) == 3, what="three brokers")
    futures = admin.create_topics(
        [
            NewTopic(REPLICATED, num_partitions=3, replication_factor=3),
            NewTopic(SINGLE, num_partitions=3, replication_factor=1),
        ]
    )
    for future in futures.values():
        future.result(timeout=30)


def healthy(status: ClusterStatus | None, *, coordinators: bool = True) -> bool:
    """Three live brokers, a controller, our topics (and the coordinators' ones) all in sync."""
    topics = {REPLICATED, SINGLE} | ({"__consumer_offsets", "__transaction_state"} if coordinators else set())
    return (
        status is not None
        and len(status.brokers) == 3
        and status.controller_id >= 0
        and not status.under_replicated
        and not status.offline
        and topics <= {p.topic for p in status.partitions}
    )


def test_status_and_metrics_through_a_pause_and_a_kill_9(cluster: list[Broker]) -> None:
    setup_topics(cluster)
    # both coordinators' topics: a transaction (left open on purpose) and a group commit
    producer = Producer({"bootstrap.servers": bootstrap(cluster), "transactional.id": "ops-txn"})
    producer.init_transactions(60)
    producer.begin_transaction()
    producer.produce(REPLICATED, value=b"open", partition=0)
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap(cluster), "group.id": "ops-group"})
    consumer.commit(offsets=[KafkaPartition(REPLICATED, 1, 0)], asynchronous=False)
    consumer.close()

    # --- 1. healthy ------------------------------------------------------------------------------
    last: list[ClusterStatus | None] = [None]

    def observe() -> ClusterStatus | None:
        last[0] = status_of(cluster)
        return last[0]

    wait_for(lambda: healthy(observe()), timeout=60, what="a healthy cluster")
    status = last[0]
    assert status is not None
    controller = status.controller_id
    # the victim: not the controller, so the controller's counters survive the kill
    victim_id = next(b for b in (0, 1, 2) if b != controller)
    victim = by_id(cluster, victim_id)
    single_on_victim = [
        p.partition for p in status.partitions if p.topic == SINGLE and p.replicas == (victim_id,)
    ]
    assert len(single_on_victim) == 1
    assert [b.broker_id for b in status.brokers] == [0, 1, 2]
    assert {b.endpoint for b in status.brokers} == {b.bootstrap for b in cluster}
    coordinators = status.coordinators()
    assert set(coordinators) == {"group", "transaction"}
    for kind, topic in (("group", "__consumer_offsets"), ("transaction", "__transaction_state")):
        leader = next(p.leader for p in status.partitions if p.topic == topic)
        assert coordinators[kind] == {0: leader}

    # DescribeCluster (what AdminClient.describe_cluster sends) agrees, from every broker
    for b in cluster:
        admin = AdminClient({"bootstrap.servers": b.bootstrap})  # kept alive until the answer
        result = admin.describe_cluster(request_timeout=10).result(timeout=30)
        assert result.controller.id == controller
        assert sorted(node.id for node in result.nodes) == [0, 1, 2]

    done = cli(cluster, "--json", "--fail-on-under-replicated", "--group", "ops-group")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["controller"] == controller
    assert doc["under_replicated_count"] == 0 and doc["offline_count"] == 0
    assert doc["coordinator_of"]["group:ops-group"] == {"partition": 0, "broker": coordinators["group"][0]}
    text = cli(cluster)
    assert text.returncode == 0, text.stderr
    assert f"controller: {controller}" in text.stdout
    assert "OFFLINE" not in text.stdout and "UNDER-REPLICATED" not in text.stdout
    assert "partitions: " in text.stdout and "under-replicated: 0, offline: 0" in text.stdout

    for b in cluster:
        assert metric(b, "exactly_active_controller_count") == (1 if b.name == f"broker-{controller}" else 0)
        assert metric(b, "exactly_under_replicated_partitions") == 0
        assert metric(b, "exactly_offline_partitions_count") == 0
    # the open transaction holds the LSO of replicated-0 back: its leader says so, followers 0
    p0_leader = next(p.leader for p in status.partitions if p.topic == REPLICATED and p.partition == 0)
    labels = {"topic": REPLICATED, "partition": "0"}
    wait_for(
        lambda: metric(by_id(cluster, p0_leader), "exactly_partition_last_stable_offset_lag", **labels) >= 1,
        what="the leader's LastStableOffsetLag",
    )
    for b in cluster:
        if b.name != f"broker-{p0_leader}":
            assert metric(b, "exactly_partition_last_stable_offset_lag", **labels) == 0
    producer.commit_transaction(60)
    wait_for(
        lambda: metric(by_id(cluster, p0_leader), "exactly_partition_last_stable_offset_lag", **labels) == 0,
        what="the LSO to catch up after the commit",
    )

    # --- 2. a follower paused: the leaders shrink and expand the ISR themselves -------------------
    others = [b for b in cluster if b is not victim]
    shrinks, expands = total(others, "exactly_isr_shrinks_total"), total(others, "exactly_isr_expands_total")
    elections = metric(by_id(cluster, controller), "exactly_leader_elections_total")
    # A follower is out of sync once it has not reached the leader's log end for the lag time
    # (one that is at the end stays in sync, however long it is silent), so keep writing.
    writer = Producer({"bootstrap.servers": bootstrap(others), "acks": 1, "linger.ms": 0})

    def shrunk() -> bool:
        for partition in range(3):
            writer.produce(REPLICATED, value=b"while paused", partition=partition)
        writer.poll(0)
        return total(others, "exactly_isr_shrinks_total") > shrinks

    os.kill(victim.pid or 0, signal.SIGSTOP)
    try:
        wait_for(
            shrunk,
            timeout=SESSION_TIMEOUT_MS / 1000,
            what="a leader to shrink the ISR of the paused follower",
        )
        paused = status_of(others)
        assert paused is not None and victim_id in {b.broker_id for b in paused.brokers}  # still alive
    finally:
        os.kill(victim.pid or 0, signal.SIGCONT)
    assert writer.flush(30) == 0
    wait_for(lambda: healthy(observe()), timeout=60, what="the resumed follower back in every ISR")
    assert total(others, "exactly_isr_expands_total") > expands

    # --- 3. killed -9: gone after its session, partitions re-led, the RF 1 topic offline ------------
    victim.kill()

    def degraded() -> bool:
        s = observe()
        # gone, and the controller's decisions seen: new leaders, ISRs without it, only the RF 1
        # partition on it offline (its state keeps the last ISR member, as Kafka's)
        return (
            s is not None
            and victim_id not in {b.broker_id for b in s.brokers}
            and [(p.topic, p.partition) for p in s.offline] == [(SINGLE, single_on_victim[0])]
            and all(victim_id not in p.isr for p in s.partitions if p.topic != SINGLE)
        )

    wait_for(degraded, timeout=SESSION_TIMEOUT_MS / 1000 + 30, what="the killed broker to be gone")
    status = last[0]
    assert status is not None
    assert status.missing_brokers == (victim_id,)
    for p in status.partitions:
        if p.topic == SINGLE:
            assert p.offline == (p.replicas == (victim_id,)) and not p.under_replicated
        else:
            assert p.leader != victim_id and p.leader in {b.broker_id for b in status.brokers}
            assert p.under_replicated and victim_id not in p.isr, p

    def described_without_victim() -> bool:
        admin = AdminClient({"bootstrap.servers": bootstrap(cluster)})
        result = admin.describe_cluster(request_timeout=10).result(timeout=30)
        return sorted(n.id for n in result.nodes) == sorted(b.broker_id for b in status.brokers)

    wait_for(described_without_victim, what="DescribeCluster without the killed broker")

    under = cli(cluster, "--fail-on-under-replicated")
    assert under.returncode == 1
    assert "OFFLINE" in under.stdout and "UNDER-REPLICATED" in under.stdout and "NOT ALIVE" in under.stdout
    assert "offline: 1" in under.stdout
    assert cli(cluster, "--fail-on-offline").returncode == 1
    problems = cli(cluster, "--problems", "--topic", SINGLE)
    assert problems.returncode == 0
    assert "OFFLINE" in problems.stdout

    def metrics_agree() -> bool:
        urp = sum(metric(b, "exactly_under_replicated_partitions") for b in others)
        return urp == len(status.under_replicated)

    wait_for(metrics_agree, what="UnderReplicatedPartitions on the leaders to match the status")
    controller_broker = by_id(cluster, controller)
    assert metric(controller_broker, "exactly_offline_partitions_count") == 1
    assert metric(controller_broker, "exactly_active_controller_count") == 1
    assert total(others, "exactly_offline_partitions_count") == 1  # only the controller counts
    # the victim led one partition of REPLICATED at least (3 partitions, leaders spread)
    assert metric(controller_broker, "exactly_leader_elections_total") > elections
    assert metric(controller_broker, "exactly_unclean_leader_elections_total") == 0

    # --- 4. restarted: healthy again ------------------------------------------------------------------
    expands = total(others, "exactly_isr_expands_total")
    victim.restart()
    wait_for(lambda: healthy(observe()), timeout=60, what="a healthy cluster after the restart")
    assert total(others, "exactly_isr_expands_total") > expands
    wait_for(
        lambda: (
            total(cluster, "exactly_under_replicated_partitions") == 0
            and metric(controller_broker, "exactly_offline_partitions_count") == 0
        ),
        what="the gauges back to zero",
    )
    assert cli(cluster, "--fail-on-under-replicated").returncode == 0


def test_status_of_an_unreachable_cluster_is_one_line_and_exit_1() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "exactly", "cluster", "status", "--bootstrap-server", "127.0.0.1:1"],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stderr.startswith("exactly cluster status: cannot connect")
    assert len(done.stderr.strip().splitlines()) == 1


def test_the_controller_killed_9_moves_active_controller_count(cluster: list[Broker]) -> None:
    """ActiveControllerCount moves with the controller: after a kill -9 of its broker exactly one
    survivor reports 1, it counts the partitions left without a leader (the RF 1 one on the dead
    broker) and the leaders it elected for the replicated partitions the dead broker led."""
    setup_topics(cluster)
    last: list[ClusterStatus | None] = [None]

    def observe() -> ClusterStatus | None:
        last[0] = status_of(cluster)
        return last[0]

    wait_for(lambda: healthy(observe(), coordinators=False), timeout=60, what="a healthy cluster")
    assert last[0] is not None
    old = last[0].controller_id
    led = [p.partition for p in last[0].partitions if p.topic == REPLICATED and p.leader == old]
    assert led  # RF 3 over 3 brokers, 3 partitions: AdminUtils gives each broker one leadership
    by_id(cluster, old).kill()
    survivors = [b for b in cluster if b.running]

    def new_controller() -> bool:
        s = observe()
        return (
            s is not None
            and s.controller_id not in (old, -1)
            and old not in {b.broker_id for b in s.brokers}
            and len(s.offline) == 1
            and all(p.leader != old for p in s.partitions if p.topic == REPLICATED)
        )

    wait_for(new_controller, timeout=SESSION_TIMEOUT_MS / 1000 + 30, what="a new controller")
    assert last[0] is not None
    new = by_id(cluster, last[0].controller_id)
    wait_for(
        lambda: (
            [metric(b, "exactly_active_controller_count") for b in survivors].count(1) == 1
            and metric(new, "exactly_active_controller_count") == 1
        ),
        what="ActiveControllerCount on the new controller only",
    )
    assert metric(new, "exactly_offline_partitions_count") == 1
    assert metric(new, "exactly_leader_elections_total") >= len(led)
    done = cli(cluster, "--fail-on-offline", "--json")
    assert done.returncode == 1
    assert json.loads(done.stdout)["controller"] == last[0].controller_id
