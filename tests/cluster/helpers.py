"""Helpers of the ZooKeeper-backed cluster tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from kazoo.client import KazooClient

from exactly.client.replica_verification import describe, verify_replicas
from exactly.client.wire import WireError
from exactly.cluster.zk import ClusterZk
from exactly.replication.verification import PartitionVerdict
from exactly.testing.wait import wait_until
from tests.support.broker import Broker

TEST_SESSION_TIMEOUT_MS = 2_000


def wait_for(condition: Callable[[], bool], timeout: float = 15.0, what: str = "condition") -> None:
    """``exactly.testing.wait.wait_until`` at a ZooKeeper pace (20 ms)."""
    wait_until(condition, timeout, what, interval=0.02)


def expire_session(zk: ClusterZk) -> None:
    """Expire ``zk``'s session from the server side, as a pause longer than the session timeout
    would: a second client joins the same session and closes it (the standard ZooKeeper trick)."""
    session_id, password = zk.client.client_id
    twin = KazooClient(
        hosts=zk.connect, client_id=(session_id, password), timeout=TEST_SESSION_TIMEOUT_MS / 1000
    )
    twin.start(10)
    twin.stop()
    twin.close()


BROKER_SESSION_TIMEOUT_MS = 6_000  # the brokers' zookeeper.session.timeout.ms in cluster tests


def cluster_overrides(zk_connect: str, broker_id: int) -> dict[str, str]:
    return {
        "broker.id": str(broker_id),
        "zookeeper.connect": zk_connect,
        "zookeeper.session.timeout.ms": str(BROKER_SESSION_TIMEOUT_MS),
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.num.partitions": "1",
        # Kafka's test harness shortens it too (5 s by default): a SIGTERMed broker whose partners
        # are alive but out of the ISR waits at most 3 x this before it exits anyway
        "controlled.shutdown.retry.backoff.ms": "1000",
    }


def running_cluster(
    zk_connect: str, tmp_path: Path, count: int = 3, env: Mapping[str, str] | None = None, **extra: str
) -> Iterator[list[Broker]]:
    """Body of a cluster fixture (``yield from running_cluster(...)``): ``count`` brokers on
    ``zk_connect``, each with ``cluster_overrides`` plus ``extra`` (and the extra environment
    ``env``, e.g. a fault hook), stopped afterwards."""
    brokers = [
        Broker(
            tmp_path / f"broker-{i}",
            tmp_path / f"broker-{i}.log",
            overrides={**cluster_overrides(zk_connect, i), **extra},
            name=f"broker-{i}",
            env=env,
        )
        for i in range(count)
    ]
    try:
        for b in brokers:
            b.start()
        yield brokers
    finally:
        for b in brokers:
            if b.running:
                b.stop()


def await_replicas_identical(
    bootstrap: str, topics: Sequence[str] | None = None, timeout: float = 30.0
) -> list[PartitionVerdict]:
    """Wait until every replica of every partition of ``topics`` holds the same batches up to one
    common high watermark (``exactly.client.replica_verification``, Kafka's replica verification
    over the wire); fail with every partition's verdict otherwise. A quiet cluster converges within
    a follower fetch round, so the wait only covers lag, never a real difference."""
    last: list[PartitionVerdict] = []

    def identical() -> bool:
        nonlocal last
        try:
            last = verify_replicas(bootstrap, topics, timeout_s=5)
        except WireError:
            return False
        return bool(last) and all(v.in_sync for v in last)

    wait_until(
        identical, timeout, "replicas to be identical", interval=0.1, describe=lambda: "\n" + describe(last)
    )
    return last
