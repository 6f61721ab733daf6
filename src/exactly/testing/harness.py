"""Throw-away brokers and clusters for an application's tests: ``broker()`` and ``cluster()``.

Why
---
A team testing its own Kafka transactional code wants a real broker that starts in well under a
second, on a port nobody else uses, with its own data that vanishes afterwards, and no Docker or
JVM. These context managers give that on top of :class:`exactly.testing.broker.Broker` (the one
launcher), and the pytest plugin (:mod:`exactly.testing.pytest_plugin`) wraps them as fixtures.

Invariants: the broker (or every broker and ZooKeeper of a cluster) is stopped, killed if it does
not stop, and its temporary directory removed when the ``with`` block is left, whether it ends
normally, by an exception or by a failed start. A directory passed in by the caller is kept.
Configuration uses Kafka's broker config names (``{"num.partitions": 3}``); values are turned
into the strings ``exactly serve -o NAME=VALUE`` takes (``True`` -> ``"true"``).

A cluster that does not reach an awaited state in time (:meth:`ClusterHandle.restart`,
:meth:`ClusterHandle.wait_for_leader`, every broker listing the others at start) raises
:class:`ClusterTimeout`: both a :class:`TimeoutError`, for callers that catch that, and a
:class:`~exactly.testing.wait.WaitTimeout`, the failed expectation every other wait of the
harness reports, naming what was awaited and the last state seen.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from exactly.cluster.zookeeper import JAVA_DIR, ZooKeeperServer
from exactly.testing.broker import Broker
from exactly.testing.wait import WaitTimeout, wait_until

if TYPE_CHECKING:
    from confluent_kafka.admin._metadata import ClusterMetadata

__all__ = [
    "BrokerHandle",
    "ClusterHandle",
    "ClusterTimeout",
    "broker",
    "cluster",
    "cluster_defaults",
    "config_strings",
    "zookeeper_missing",
]

# A killed cluster broker's partitions move once ZooKeeper expires its session: short, so a test
# that kills a broker sees the failover in seconds (Kafka's default is 18 s).
CLUSTER_SESSION_TIMEOUT_MS = 2_000

# How often a cluster wait asks a live broker's metadata (a fresh AdminClient each time).
CLUSTER_POLL_S = 0.1

T = TypeVar("T")


class ClusterTimeout(WaitTimeout, TimeoutError):
    """A cluster did not reach the awaited state in time. A :class:`TimeoutError` because
    ``ClusterHandle.restart`` and ``wait_for_leader`` have always raised one and an application's
    tests may catch it; a :class:`~exactly.testing.wait.WaitTimeout` (an ``AssertionError``) like
    every other wait of the harness, so an uncaught one reads as a failed expectation."""


def _await_cluster(
    cond: Callable[[], T], timeout: float, what: str, describe: Callable[[], object] | None = None
) -> T:
    """:func:`~exactly.testing.wait.wait_until` that raises :class:`ClusterTimeout`."""
    try:
        return wait_until(cond, timeout, what, interval=CLUSTER_POLL_S, describe=describe)
    except WaitTimeout as exc:
        raise ClusterTimeout(str(exc)) from None


def config_strings(config: Mapping[str, object] | None) -> dict[str, str]:
    """Kafka config values as the broker's ``-o NAME=VALUE`` strings (booleans lower case)."""
    out: dict[str, str] = {}
    for name, value in (config or {}).items():
        out[name] = str(value).lower() if isinstance(value, bool) else str(value)
    return out


class BrokerHandle:
    """What a test gets: the address to give its clients, plus the launcher for the rest.

    ``bootstrap_servers`` is ``HOST:PORT`` of the running broker; ``restart()`` restarts it on the
    same data dir (and port), ``kill()`` crashes it (SIGKILL); ``log_text()`` is what it printed.
    """

    def __init__(self, launcher: Broker, config: Mapping[str, str]) -> None:
        self.launcher = launcher
        self.config = dict(config)

    @property
    def bootstrap_servers(self) -> str:
        return self.launcher.bootstrap

    @property
    def data_dir(self) -> Path:
        return self.launcher.data_dir

    @property
    def running(self) -> bool:
        return self.launcher.running

    def log_text(self) -> str:
        return self.launcher.log_text()

    def kill(self) -> None:
        self.launcher.kill()

    def restart(self) -> BrokerHandle:
        self.launcher.restart(same_port=True)
        return self

    def __repr__(self) -> str:
        return f"<exactly broker {self.launcher.host}:{self.launcher.port} data={self.data_dir}>"


@contextlib.contextmanager
def _scratch(directory: Path | None, prefix: str) -> Iterator[Path]:
    """``directory`` as given (kept), or a fresh temporary one (removed afterwards)."""
    if directory is not None:
        directory.mkdir(parents=True, exist_ok=True)
        yield directory
        return
    created = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield created
    finally:
        shutil.rmtree(created, ignore_errors=True)


@contextlib.contextmanager
def broker(
    config: Mapping[str, object] | None = None,
    *,
    directory: Path | None = None,
    host: str = "127.0.0.1",
    start_timeout: float = 30.0,
) -> Iterator[BrokerHandle]:
    """A running broker on a free ``host`` port with its own data dir, for the ``with`` block.

    >>> with broker({"num.partitions": 3}) as b:  # doctest: +SKIP
    ...     Producer({"bootstrap.servers": b.bootstrap_servers})
    """
    overrides = config_strings(config)
    with _scratch(directory, "exactly-broker-") as root:
        launcher = Broker(root / "data", root / "broker.log", overrides=overrides, host=host)
        try:
            launcher.start(timeout=start_timeout)
            yield BrokerHandle(launcher, overrides)
        finally:
            launcher.close()


class ClusterHandle:
    """ZooKeeper (``D/zookeeper``) and N brokers (ids 0..N-1, ``D/broker-<id>``) on the chroot
    ``/exactly``, the layout of ``exactly cluster``. ``kill(i)`` crashes broker ``i`` (SIGKILL),
    ``restart(i)`` brings it back on its port once the others no longer list it, ``stop(i)`` is
    a clean shutdown; ``leader(topic, partition)`` asks a live broker's metadata."""

    def __init__(self, root: Path, count: int, overrides: Mapping[str, str]) -> None:
        self.config = dict(overrides)
        (root / "zookeeper").mkdir(parents=True, exist_ok=True)
        self.zookeeper = ZooKeeperServer(root / "zookeeper", 0)
        self.launchers: list[Broker] = []
        self._root = root
        self._count = count

    def start(self, timeout: float) -> ClusterHandle:
        connect = f"{self.zookeeper.start().connect}/exactly"
        self.launchers = [
            Broker(
                self._root / f"broker-{i}",
                self._root / f"broker-{i}.log",
                overrides={**self.config, "broker.id": str(i), "zookeeper.connect": connect},
                name=f"broker-{i}",
            )
            for i in range(self._count)
        ]
        for launcher in self.launchers:
            launcher.start(timeout=timeout)
        self._await_every_broker_seen(timeout)
        return self

    def _await_every_broker_seen(self, timeout: float) -> None:
        """Until every broker's Metadata lists all of them. A broker answers as soon as it
        listens, but learns of the others from ZooKeeper watches a moment later: a test that
        creates a replication-factor-N topic at once would otherwise get INVALID_REPLICATION_FACTOR
        from a broker that has not seen the last one register."""

        def sees_all(admin: AdminClient) -> bool:
            try:
                return len(admin.list_topics(timeout=5).brokers) >= self._count
            except KafkaException:
                return False

        for launcher in self.launchers:
            admin = AdminClient({"bootstrap.servers": launcher.bootstrap})
            _await_cluster(
                functools.partial(sees_all, admin),
                timeout,
                f"{launcher.name} to list all {self._count} brokers",
            )

    def close(self) -> None:
        """Brokers first (SIGTERM: controlled shutdowns; SIGKILL if one hangs), then ZooKeeper."""
        try:
            for launcher in self.launchers:
                launcher.close()
        finally:
            self.zookeeper.stop()

    @property
    def bootstrap_servers(self) -> str:
        """Every broker's address, stopped ones included: clients skip those and retry."""
        return ",".join(f"{b.host}:{b.port}" for b in self.launchers if b.port is not None)

    @property
    def brokers(self) -> list[BrokerHandle]:
        return [BrokerHandle(b, b.overrides) for b in self.launchers]

    def broker(self, broker_id: int) -> BrokerHandle:
        return BrokerHandle(self.launchers[broker_id], self.launchers[broker_id].overrides)

    def live_bootstrap(self) -> str:
        """The addresses of the brokers whose process runs."""
        return ",".join(b.bootstrap for b in self.launchers if b.running)

    def kill(self, broker_id: int) -> None:
        self.launchers[broker_id].kill()

    def stop(self, broker_id: int) -> None:
        self.launchers[broker_id].stop()

    def _metadata(self, topic: str | None = None) -> ClusterMetadata | None:
        bootstrap = self.live_bootstrap()
        if not bootstrap:
            return None
        admin = AdminClient({"bootstrap.servers": bootstrap})
        try:
            return admin.list_topics(topic, timeout=5)
        except KafkaException:
            return None

    def live_broker_ids(self) -> set[int] | None:
        """The brokers a live broker's metadata lists (None: no broker answered)."""
        metadata = self._metadata()
        return None if metadata is None else set(metadata.brokers)

    def restart(self, broker_id: int, timeout: float = 60.0) -> None:
        """Start a killed or stopped broker again on its data dir and port, once the others no
        longer list it (ZooKeeper expired its session: Kafka refuses to register a broker id
        whose ephemeral znode still exists); returns once the metadata lists it again. Both waits
        share ``timeout``, the start has a ``timeout`` of its own; a wait that runs out raises
        :class:`ClusterTimeout` (a :class:`TimeoutError`)."""
        launcher = self.launchers[broker_id]
        if launcher.running:
            raise RuntimeError(f"broker {broker_id} is running: kill() or stop() it first")
        deadline = time.monotonic() + timeout

        def gone() -> bool:
            live = self.live_broker_ids()
            return live is not None and broker_id not in live

        _await_cluster(
            gone,
            timeout,
            f"broker {broker_id} to be unregistered after it went down",
            describe=self.live_broker_ids,
        )
        launcher.start(port=launcher.port or 0, timeout=timeout)
        _await_cluster(
            lambda: broker_id in (self.live_broker_ids() or ()),
            max(deadline - time.monotonic(), 0.0),
            f"broker {broker_id} to be registered again after its restart",
            describe=self.live_broker_ids,
        )

    def leader(self, topic: str, partition: int = 0) -> int | None:
        """The partition's leader id in a live broker's metadata (None: no leader, or the topic
        is not known yet)."""
        metadata = self._metadata(topic)
        if metadata is None or topic not in metadata.topics:
            return None
        found = metadata.topics[topic].partitions.get(partition)
        if found is None or found.leader < 0:
            return None
        return int(found.leader)

    def wait_for_leader(
        self, topic: str, partition: int = 0, *, not_on: int | None = None, timeout: float = 60.0
    ) -> int:
        """Wait until the partition has a leader (other than ``not_on``) and return its id;
        :class:`ClusterTimeout` (a :class:`TimeoutError`) if it has none after ``timeout``."""

        def elected() -> tuple[int] | None:  # a tuple: leader 0 is a valid, falsy, answer
            found = self.leader(topic, partition)
            return (found,) if found is not None and found != not_on else None

        other = "" if not_on is None else f" other than {not_on}"
        found = _await_cluster(
            elected,
            timeout,
            f"a leader of {topic}-{partition}{other}",
            describe=lambda: f"leader {self.leader(topic, partition)}",
        )
        assert found is not None  # wait_until returns only a truthy value
        return found[0]

    def __repr__(self) -> str:
        return f"<exactly cluster {self.bootstrap_servers}>"


def cluster_defaults(brokers: int) -> dict[str, str]:
    """Those of ``exactly cluster``: the coordinators' internal topics and topics created with
    the broker default replicated 3 ways with min ISR 2 (capped at ``brokers``); plus a 2 s
    ZooKeeper session, so a killed broker's partitions move in seconds."""
    return {
        "offsets.topic.replication.factor": str(min(3, brokers)),
        "transaction.state.log.replication.factor": str(min(3, brokers)),
        "transaction.state.log.min.isr": str(min(2, brokers)),
        "default.replication.factor": str(min(3, brokers)),
        "min.insync.replicas": str(min(2, brokers)),
        "zookeeper.session.timeout.ms": str(CLUSTER_SESSION_TIMEOUT_MS),
        # a SIGTERMed broker whose partners are out of the ISR waits at most 3 x this to exit
        "controlled.shutdown.retry.backoff.ms": "1000",
    }


def zookeeper_missing() -> str | None:
    """Why a cluster cannot start here (no Java, or no ZooKeeper jars), or None."""
    if shutil.which("java") is None:
        return "java is not installed (the cluster mode runs a real ZooKeeper)"
    if not (JAVA_DIR / "zookeeper.jar").exists():
        return f"ZooKeeper is not installed ({JAVA_DIR / 'zookeeper.jar'} is missing: Debian's zookeeper package)"
    return None


@contextlib.contextmanager
def cluster(
    config: Mapping[str, object] | None = None,
    *,
    brokers: int = 3,
    directory: Path | None = None,
    start_timeout: float = 60.0,
) -> Iterator[ClusterHandle]:
    """ZooKeeper and ``brokers`` brokers on loopback with :func:`cluster_defaults`, which
    ``config`` overrides. Raises ``ZooKeeperError`` when ZooKeeper or Java is missing."""
    overrides = {**cluster_defaults(brokers), **config_strings(config)}
    with _scratch(directory, "exactly-cluster-") as root:
        handle = ClusterHandle(root, brokers, overrides)
        try:
            yield handle.start(start_timeout)
        finally:
            handle.close()
