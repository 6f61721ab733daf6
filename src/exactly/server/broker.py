"""The broker: state shared by every connection, and the asyncio listener around it.

Process model (design-sketch.md): one asyncio loop; storage, producer state and coordinators are
plain synchronous objects called from it, so appends to one partition are serialised by
construction. The loop only awaits socket I/O, long-poll waits and timers.

Lifecycle: ``Broker.open`` recovers the data directory (LogManager) -> ``start`` binds the
listener, writes ``<data-dir>/bound-address`` and starts the maintenance timer -> ``shutdown``
stops accepting, closes connections, and closes the log manager (flush, producer snapshots,
recovery checkpoint, clean-shutdown marker).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from exactly.coordinator.producer_id.manager import ProducerIdManager
from exactly.server.clock import now_ms
from exactly.server.config import BrokerConfig
from exactly.server.group_runtime import GroupRuntime
from exactly.server.internal_topics import InternalTopics
from exactly.server.metrics import Metrics
from exactly.server.txn_runtime import TxnRuntime
from exactly.storage.log_manager import LogManager, TopicInfo
from exactly.storage.partition_log import PartitionLog
from exactly.types import TopicPartition

if TYPE_CHECKING:
    from exactly.server.connection import KafkaConnection

log = logging.getLogger("exactly.broker")

LEGAL_TOPIC = re.compile(r"^[a-zA-Z0-9._-]+$")
MAX_TOPIC_LENGTH = 249
INTERNAL_TOPICS = ("__consumer_offsets", "__transaction_state")


def topic_name_error(name: str) -> str | None:
    """Kafka's Topic.validate: why ``name`` is not a legal topic name, or None."""
    if not name:
        return "Topic name is illegal, it can't be empty"
    if name in (".", ".."):
        return 'Topic name cannot be "." or ".."'
    if len(name) > MAX_TOPIC_LENGTH:
        return f"Topic name is illegal, it can't be longer than {MAX_TOPIC_LENGTH} characters"
    if not LEGAL_TOPIC.match(name):
        return (
            f"Topic name {name!r} is illegal, it contains a character other than ASCII "
            "alphanumerics, '.', '_' and '-'"
        )
    return None


@dataclass(frozen=True, slots=True)
class Endpoint:
    host: str
    port: int


def parse_listener(value: str) -> Endpoint:
    """``PLAINTEXT://host:port`` or ``host:port`` -> Endpoint."""
    first = value.split(",")[0].strip()
    if "://" in first:
        first = first.split("://", 1)[1]
    host, _, port = first.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"listener must be HOST:PORT, got {value!r}")
    return Endpoint(host.strip("[]"), int(port))


class AppendWaiters:
    """Long-polling fetches park here until one of their partitions gets data.

    A parked fetch is a bare future plus one ``loop.call_at`` timer: ``asyncio.wait_for`` would
    add a Task and a second future per wait, which showed up in the 1,000 msg/s latency profile
    (every record wakes the consumer's parked Fetch). ``notify`` runs after every append, so it
    returns before hashing anything when no fetch is parked (the usual case while producing)."""

    def __init__(self) -> None:
        self._waiters: dict[TopicPartition, set[asyncio.Future[None]]] = {}

    async def wait(self, tps: Iterable[TopicPartition], timeout_s: float) -> None:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        keys = list(tps)
        waiters = self._waiters
        for tp in keys:
            parked = waiters.get(tp)
            if parked is None:
                waiters[tp] = {fut}
            else:
                parked.add(fut)
        timer = loop.call_at(loop.time() + timeout_s, _wake, fut)
        try:
            await fut
        finally:
            timer.cancel()
            for tp in keys:
                parked = waiters.get(tp)
                if parked is not None:
                    parked.discard(fut)
                    if not parked:
                        del waiters[tp]

    def notify(self, tp: TopicPartition) -> None:
        if not self._waiters:
            return
        parked = self._waiters.get(tp)
        if not parked:
            return
        for fut in parked:
            if not fut.done():
                fut.set_result(None)


def _wake(fut: asyncio.Future[None]) -> None:
    """Timer callback of a parked fetch: its max_wait is over."""
    if not fut.done():
        fut.set_result(None)


class Broker:
    def __init__(self, config: BrokerConfig, data_dir: Path, logs: LogManager) -> None:
        self.config = config
        self.data_dir = data_dir
        self.logs = logs
        self.node_id = config.node_id
        self.default_log_config = config.log_config()
        self.metrics = Metrics()
        self.waiters = AppendWaiters()
        self.producer_ids = ProducerIdManager(data_dir / "producer-id-block")
        self.listen = parse_listener(config.get("listeners"))
        self.advertised: Endpoint | None = None
        self.max_request_size = config.get_int("socket.request.max.bytes")
        self.auto_create_topics = config.get_bool("auto.create.topics.enable")
        self.num_partitions = config.get_int("num.partitions")
        self._server: asyncio.Server | None = None
        self.connections: set[KafkaConnection] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False
        self.internal = InternalTopics(self)
        self.groups = GroupRuntime(self)
        self.txn = TxnRuntime(self)

    @classmethod
    def open(cls, config: BrokerConfig, data_dir: Path) -> Broker:
        data_dir.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        logs = LogManager(
            data_dir,
            config.log_config(),
            now_ms=now_ms(),
            producer_id_expiration_ms=config.get_int("producer.id.expiration.ms"),
        )
        log.info(
            "loaded %d topics from %s in %.3f s", len(logs.topics()), data_dir, time.monotonic() - started
        )
        return cls(config, data_dir, logs)

    # ---- topics -----------------------------------------------------------------------------
    def partition(self, topic: str, partition: int) -> PartitionLog | None:
        return self.logs.get_partition(TopicPartition(topic, partition))

    def auto_create(self, name: str) -> TopicInfo | None:
        """Create ``name`` with num.partitions if auto.create.topics.enable allows it."""
        if not self.auto_create_topics or topic_name_error(name) is not None:
            return None
        if name in INTERNAL_TOPICS:
            return None
        info = self.logs.create_topic(name, self.num_partitions, {}, now_ms=now_ms())
        log.info("auto-created topic %s with %d partitions", name, self.num_partitions)
        return info

    def after_append(self, plog: PartitionLog) -> None:
        """Single broker: the high watermark follows the log end offset at once."""
        plog.update_high_watermark(plog.log_end_offset)
        self.waiters.notify(plog.tp)

    # ---- lifecycle --------------------------------------------------------------------------
    async def start(self) -> Endpoint:
        from exactly.server.connection import KafkaConnection
        from exactly.server.prometheus import METRICS_HOST, start_metrics

        self.groups.load()
        self.txn.load()
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: KafkaConnection(self), self.listen.host, self.listen.port, reuse_address=True, backlog=512
        )
        sock = self._server.sockets[0]
        host, port = sock.getsockname()[:2]
        bound = Endpoint(host, port)
        adv = self.config.get("advertised.listeners")
        self.advertised = parse_listener(adv) if adv else bound
        metrics_address = self.data_dir / "metrics-address"
        metrics_address.unlink(missing_ok=True)
        metrics = await start_metrics(self)  # Prometheus /metrics, when metrics.port is set
        if metrics is not None:
            metrics_address.write_text(f"{METRICS_HOST}:{metrics[0]}\n")
            self._tasks.append(metrics[1])
        (self.data_dir / "bound-address").write_text(f"{host}:{port}\n")
        self._tasks.append(asyncio.create_task(self._maintenance_loop(), name="maintenance"))
        self._tasks.append(asyncio.create_task(self._idle_connections_loop(), name="idle-connections"))
        self._tasks.extend(self.groups.start_tasks())
        self._tasks.extend(self.txn.start_tasks())
        log.info(
            "listening on %s:%d (advertised %s:%d)", host, port, self.advertised.host, self.advertised.port
        )
        return bound

    async def _maintenance_loop(self) -> None:
        interval = (
            min(
                self.config.get_int("log.retention.check.interval.ms"),
                self.config.get_int("producer.id.expiration.check.interval.ms"),
                10_000,
            )
            / 1000
        )
        while True:
            await asyncio.sleep(interval)
            try:
                self.logs.run_maintenance(now_ms())
                self.metrics.log_summary()
            except Exception:  # maintenance must never kill the broker
                log.exception("maintenance failed")

    async def _idle_connections_loop(self) -> None:
        """connections.max.idle.ms (Kafka default 10 min; -1 disables): close connections that
        have been idle that long, checked at a quarter of the limit (at most every 30 s)."""
        max_idle_ms = self.config.get_int("connections.max.idle.ms")
        if max_idle_ms < 0:
            return
        max_idle = max_idle_ms / 1000
        interval = min(max(max_idle / 4, 0.05), 30.0)
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for conn in list(self.connections):
                idle = conn.idle_for(now)
                if idle > max_idle:
                    conn.close_idle(idle)

    async def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        log.info("shutting down")
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.abort()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
        self.logs.close()
        self.metrics.log_summary(force=True)
        log.info("shutdown complete")
