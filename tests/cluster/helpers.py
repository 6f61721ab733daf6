"""Helpers of the ZooKeeper-backed cluster tests."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaPartition
from kazoo.client import KazooClient

from exactly.client.replica_verification import METADATA_MAX_VERSION, describe, verify_replicas
from exactly.client.wire import ApiKey, WireClient, WireError
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


def broker_id(broker: Broker) -> int:
    """``running_cluster`` names broker ``i`` ``broker-i`` and gives it ``broker.id=i``."""
    return int(broker.overrides["broker.id"])


def by_id(brokers: Sequence[Broker], wanted: int) -> Broker:
    return next(b for b in brokers if broker_id(b) == wanted)


def bootstrap(brokers: Sequence[Broker]) -> str:
    """The running brokers' addresses (a killed broker's would only cost a client a connect error)."""
    return ",".join(b.bootstrap for b in brokers if b.running)


def metadata_broker_ids(broker: Broker, client_config: Mapping[str, str] | None = None) -> set[int]:
    """The live brokers in ``broker``'s own Metadata answer (one connection to it, no client-side
    cache that might have asked another broker): what its CreateTopics would place replicas on.
    ``client_config``: the security settings (librdkafka's names) of a secured first listener."""
    with WireClient.connect(
        broker.bootstrap, timeout=5, client_id="cluster-test", config=client_config
    ) as wire:
        version = wire.version_for(ApiKey.METADATA, METADATA_MAX_VERSION)
        response = wire.call(ApiKey.METADATA, version, topics=(), allow_auto_topic_creation=False)
    return {int(b.node_id) for b in response.brokers}


def await_registered(
    brokers: Sequence[Broker], timeout: float = 30.0, client_config: Mapping[str, str] | None = None
) -> None:
    """Until every running broker's Metadata lists every running broker.

    A broker's listening line comes before its registration in ZooKeeper and before the watches
    that fill its metadata cache have fired; a topic created in between is placed on the brokers
    that broker knows of (Kafka: INVALID_REPLICATION_FACTOR "3 larger than available brokers: 2").
    Kafka's own test harness waits the same way (``TestUtils.waitUntilBrokerMetadataIsPropagated``)."""
    running = [b for b in brokers if b.running]
    wanted = {broker_id(b) for b in running}
    seen: dict[str, set[int]] = {}

    def everyone_sees_everyone() -> bool:
        for b in running:
            try:
                seen[b.name] = metadata_broker_ids(b, client_config)
            except (OSError, WireError):
                return False
        return all(ids >= wanted for ids in seen.values())

    wait_until(
        everyone_sees_everyone,
        timeout,
        f"brokers {sorted(wanted)} registered and in every broker's Metadata",
        interval=0.05,
        describe=lambda: f" (seen: {seen})",
    )


# Kafka's retriable answers to a ListOffsets that a client handles by refreshing its metadata and
# asking again (the leader moved: a preferred or failover election between the client's last
# Metadata and its request).
LEADER_MOVED = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
    }
)


def watermarks(consumer: Consumer, topic: str, partition: int, timeout: float = 30.0) -> tuple[int, int]:
    """(log start, high watermark) from the partition's leader, as a Kafka client gets them across
    a leader change: on a retriable error it refreshes its metadata and asks the new leader.
    Anything else (or no answer within ``timeout``) is raised."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            low, high = consumer.get_watermark_offsets(
                KafkaPartition(topic, partition), timeout=10, cached=False
            )
            return int(low), int(high)
        except KafkaException as exc:
            if exc.args[0].code() not in LEADER_MOVED or time.monotonic() > deadline:
                raise
        consumer.list_topics(topic, timeout=10)  # librdkafka's metadata refresh: the new leader
        time.sleep(0.05)


def running_cluster(
    zk_connect: str,
    tmp_path: Path,
    count: int = 3,
    env: Mapping[str, str] | None = None,
    client_config: Mapping[str, str] | None = None,
    **extra: str,
) -> Iterator[list[Broker]]:
    """Body of a cluster fixture (``yield from running_cluster(...)``): ``count`` brokers on
    ``zk_connect``, each with ``cluster_overrides`` plus ``extra`` (and the extra environment
    ``env``, e.g. a fault hook), stopped afterwards. ``client_config`` is what the registration
    wait connects with when the brokers' first listener is secured (librdkafka's names)."""
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
        await_registered(brokers, client_config=client_config)
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
