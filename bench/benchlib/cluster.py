"""A replicated exactly cluster under test: one standalone ZooKeeper plus N brokers on 127.0.0.1.

Started the way ``exactly cluster`` and the cluster tests start it (``exactly.cluster.zookeeper``'s
``ZooKeeperServer``, ``exactly.testing.broker``'s ``Broker`` with ``broker.id`` and
``zookeeper.connect`` on a ``/exactly`` chroot), but kept in-process so a workload can kill one
broker, watch ZooKeeper and sum CPU over the broker processes.

``Cluster`` looks enough like a ``BrokerProcess`` (``bootstrap``, ``alive()``, ``cpu_seconds()``,
``info``, ``name``) for ``Meter`` and ``Context.count_records``: its CPU is the *sum over the broker
processes* (the figure issue #9 asks for); ZooKeeper's CPU is kept apart (``zk_cpu_seconds``), since a
real deployment runs ZooKeeper on other machines and shares it between clusters.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient, NewTopic

from benchlib import kafka, procstat
from exactly.client.replica_verification import METADATA_MAX_VERSION
from exactly.client.wire import ApiKey, WireClient, WireError
from exactly.cluster.zookeeper import ZooKeeperServer
from exactly.testing.broker import Broker

CHROOT = "/exactly"
DEFAULT_SESSION_TIMEOUT_MS = 18_000  # Kafka's zookeeper.session.timeout.ms default


class Cluster:
    """ZooKeeper + ``count`` brokers (ids 0..count-1), each with ``overrides``."""

    name = "exactly-cluster"

    def __init__(
        self,
        work: Path,
        count: int = 3,
        session_timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS,
        overrides: dict[str, str] | None = None,
        src: Path | None = None,
    ) -> None:
        self.work = work
        self.count = count
        self.session_timeout_ms = session_timeout_ms
        self.extra = dict(overrides or {})
        self.src = src
        self.zk = ZooKeeperServer(work / "zookeeper", 0)
        self.brokers: list[Broker] = []
        self.info: dict[str, str] = {}
        self.ready_s = 0.0

    # ------------------------------------------------------------------ lifecycle
    def start(self, timeout: float = 120.0) -> Cluster:
        t0 = time.monotonic()
        (self.work / "zookeeper").mkdir(parents=True, exist_ok=True)
        address = self.zk.start()
        self.zk_connect = f"{address.connect}{CHROOT}"
        for i in range(self.count):
            overrides = {
                "broker.id": str(i),
                "zookeeper.connect": self.zk_connect,
                "zookeeper.session.timeout.ms": str(self.session_timeout_ms),
                # the internal topics' znodes are read at start-up; keep them small as the tests do
                "offsets.topic.num.partitions": "1",
                "transaction.state.log.num.partitions": "1",
                **self.extra,
            }
            self.brokers.append(
                Broker(
                    self.work / f"broker-{i}",
                    self.work / f"broker-{i}.log",
                    overrides=overrides,
                    name=f"broker-{i}",
                    src=self.src,
                )
            )
        try:
            for b in self.brokers:
                b.start(timeout=timeout)
            kafka.wait_ready(self.bootstrap, time.monotonic() + timeout)
            self.wait_brokers(self.count, timeout)
        except BaseException:
            self.stop()
            raise
        self.ready_s = time.monotonic() - t0
        self.info = {
            "cmd": " ".join(self.brokers[0].command()),
            "session_timeout_ms": str(self.session_timeout_ms),
        }
        return self

    def stop(self) -> None:
        for b in self.brokers:
            b.close()
        self.zk.stop()

    # ------------------------------------------------------------------ state
    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers if b.running)

    def alive(self) -> bool:
        return any(b.running for b in self.brokers)

    def running(self) -> list[Broker]:
        return [b for b in self.brokers if b.running]

    def cpu_seconds(self) -> float:
        """CPU-s so far summed over the running broker processes (a killed broker's CPU is lost: the
        workloads that kill brokers do not report CPU)."""
        total = 0.0
        for b in self.running():
            pid = b.pid
            if pid is not None:
                try:
                    total += procstat.cpu_seconds(pid)
                except ProcessLookupError:
                    pass
        return total

    def broker_cpu(self) -> dict[int, float]:
        out: dict[int, float] = {}
        for i, b in enumerate(self.brokers):
            if b.running and b.pid is not None:
                try:
                    out[i] = procstat.cpu_seconds(b.pid)
                except ProcessLookupError:
                    pass
        return out

    def zk_cpu_seconds(self) -> float:
        proc = self.zk.process
        if proc is None or proc.poll() is not None:
            return 0.0
        return procstat.cpu_seconds(proc.pid)

    def pids(self) -> list[int]:
        return [b.pid for b in self.running() if b.pid is not None]

    def rss_mb(self) -> tuple[float, float]:
        cur = peak = 0.0
        for pid in self.pids():
            c, p = procstat.rss_mb(pid)
            cur, peak = cur + c, peak + p
        return cur, peak

    def admin(self) -> AdminClient:
        return kafka.admin(self.bootstrap)

    def wait_brokers(self, n: int, timeout: float = 60.0) -> None:
        """Until every running broker's own Metadata answer lists ``n`` live brokers: a broker prints its
        listening line before it registers, and a topic created through a broker whose cache lacks a
        peer is placed without it (INVALID_REPLICATION_FACTOR for RF 3)."""
        deadline = time.monotonic() + timeout
        seen: dict[str, int] = {}
        for _ in range(100_000):
            for b in self.running():
                try:
                    with WireClient.connect(b.bootstrap, timeout=5, client_id="bench-cluster") as c:
                        version = c.version_for(ApiKey.METADATA, METADATA_MAX_VERSION)
                        md = c.call(ApiKey.METADATA, version, topics=(), allow_auto_topic_creation=False)
                    seen[b.name] = len(md.brokers)
                except WireError:
                    seen[b.name] = 0
            if seen and all(count >= n for count in seen.values()):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"brokers list {seen} live brokers, expected {n} each")
            time.sleep(0.05)

    def partition(self, topic: str, partition: int = 0) -> tuple[int, list[int], list[int], int]:
        """(leader, replicas, isr, controller id) from Metadata."""
        md = self.admin().list_topics(topic=topic, timeout=10)
        p = md.topics[topic].partitions[partition]
        return p.leader, list(p.replicas), list(p.isrs), md.controller_id

    def create_topic(
        self,
        prefix: str,
        partitions: int = 1,
        replication_factor: int = 3,
        config: dict[str, str] | None = None,
        timeout: float = 60.0,
    ) -> str:
        """A fresh topic; returns once every partition has a leader and a full ISR."""
        topic = f"{prefix}-{uuid.uuid4().hex[:6]}"
        a = self.admin()
        futs = a.create_topics(
            [NewTopic(topic, partitions, replication_factor, config=dict(config or {}))],
            operation_timeout=timeout,
            request_timeout=timeout,
        )
        futs[topic].result(timeout=timeout)
        self.wait_full_isr(topic, partitions, replication_factor, timeout)
        return topic

    def wait_full_isr(self, topic: str, partitions: int, replicas: int, timeout: float = 120.0) -> float:
        """Until every partition of ``topic`` has a leader and ``replicas`` ISR members; seconds waited."""
        t0 = time.monotonic()
        a = self.admin()
        for _ in range(1_000_000):
            try:
                md = a.list_topics(topic=topic, timeout=5)
                t = md.topics.get(topic)
                if (
                    t is not None
                    and t.error is None
                    and len(t.partitions) == partitions
                    and all(
                        p.leader >= 0 and p.error is None and len(p.isrs) >= replicas
                        for p in t.partitions.values()
                    )
                ):
                    return time.monotonic() - t0
            except Exception:
                pass
            if time.monotonic() - t0 > timeout:
                raise RuntimeError(f"{topic}: no leader / full ISR ({replicas}) after {timeout}s")
            time.sleep(0.05)
        return time.monotonic() - t0

    def rejoin(self, victim: Any, topic: str) -> float:
        """Restart a killed broker and wait until it is back in the ISR of ``topic``'s single partition
        (RF 3): the seconds from the restart, the *rejoin* column of the failover tables."""
        t0 = time.monotonic()
        victim.start(timeout=120)
        self.wait_full_isr(topic, 1, 3, timeout=180)
        return time.monotonic() - t0

    def delete_topic(self, topic: str) -> None:
        kafka.delete_topic(self.bootstrap, topic)

    def describe(self) -> dict[str, Any]:
        return {"brokers": self.count, "session_timeout_ms": self.session_timeout_ms, **self.info}
