"""The broker: state shared by every connection, and the asyncio listener around it.

Process model: one asyncio loop; storage, producer state and coordinators are
plain synchronous objects called from it, so appends to one partition are serialised by
construction. The loop only awaits socket I/O, long-poll waits and timers.

Lifecycle: ``Broker.open`` recovers the data directory (LogManager) -> ``start`` binds the
listener, writes ``<data-dir>/bound-address`` and starts the maintenance timer -> ``shutdown``
stops accepting, closes connections, and closes the log manager (flush, producer snapshots,
recovery checkpoint, clean-shutdown marker). In cluster mode ``shutdown`` starts with the
controlled shutdown (leaderships move away while the broker still serves), then answers what is
in flight before the connections close.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from exactly.coordinator.producer_id.manager import ProducerIdManager
from exactly.security.acl_store import ACL_FILE, AclStore, AclStoreLike
from exactly.security.authorizer import Authorizer, authorizer_from_config
from exactly.security.credentials import CredentialBackend, CredentialStore, CredentialStoreError
from exactly.security.inter_broker import InterBrokerSecurity
from exactly.security.listener_security import (
    ListenerSecurity,
    ListenerSecurityError,
    build_listener_security,
)
from exactly.security.listeners import SecurityProtocol
from exactly.security.tls import TlsConfigError
from exactly.server.clock import now_ms
from exactly.server.config import BrokerConfig, ConfigError
from exactly.server.connection import KafkaConnection
from exactly.server.delayed_fetch import AppendWaiters
from exactly.server.fetch_fast import FastFetch
from exactly.server.follower_fetch_fast import FollowerFetch
from exactly.server.group_runtime import GroupRuntime
from exactly.server.inter_broker import InterBrokerClient
from exactly.server.internal_topics import InternalTopics
from exactly.server.metrics import Metrics
from exactly.server.produce_fast import FastProduce
from exactly.server.produce_fast_cluster import ClusterFastProduce
from exactly.server.txn_runtime import TxnRuntime
from exactly.server.txn_verification import TxnVerifier
from exactly.storage.cleaner.cleaner import CleaningAbortedError
from exactly.storage.cleaner.runner import LogCleaner
from exactly.storage.cleaner.swap import SwapHook, SwapStep
from exactly.storage.cleaner.worker import FAULT_EXIT_AFTER_FIRST_GROUP
from exactly.storage.log_manager import LogManager, TopicInfo
from exactly.storage.partition_log import PartitionLog
from exactly.storage.rolled_flush import finish_rolled_flush, rolled_flush_steps
from exactly.topics import INTERNAL_TOPICS, topic_name_error
from exactly.types import TopicPartition

if TYPE_CHECKING:
    from exactly.cluster.producer_ids import ZkProducerIdManager
    from exactly.cluster.zk_acls import ZkAclStore
    from exactly.server.replica_manager import ReplicaManager

log = logging.getLogger("exactly.broker")

# Cluster mode: how long shutdown waits for connections to answer their request in flight
# (a parked fetch ends within its max wait; 500 ms for followers and librdkafka consumers).
DRAIN_TIMEOUT_S = 1.0
# A TLS client that connects and never finishes its handshake is dropped after this long
# (uvloop's default is 60 s; Kafka has no separate limit, its idle timeout applies).
TLS_HANDSHAKE_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class Endpoint:
    host: str
    port: int


class Broker:
    """One broker process's shared state; handlers receive it with every request.

    Owns: the LogManager (every partition's log and producer state), the metrics, the parked
    fetches (``waiters``), the producer-id block manager, the internal-topic window and the two
    coordinator runtimes (groups, transactions), the listening server, the set of open
    connections, and the background tasks (maintenance, idle-connection reaper, metrics
    endpoint, coordinator timers).

    Lifecycle: ``open`` (recover the data directory; nothing listens yet) -> ``start`` (load the
    coordinators from their internal topics, bind, start the tasks) -> ``shutdown`` (stop
    accepting, abort connections, cancel the tasks, close the log manager). ``shutdown`` is
    idempotent; a broker is not restarted, a new one is opened on the same directory."""

    def __init__(self, config: BrokerConfig, data_dir: Path, logs: LogManager) -> None:
        self.config = config
        self.data_dir = data_dir
        self.logs = logs
        self.node_id = config.node_id
        self.default_log_config = config.log_config()
        self.metrics = Metrics()
        self.waiters = AppendWaiters()
        self.fast_produce = FastProduce(self)  # the common single-broker Produce (produce_fast)
        self.cluster_produce = ClusterFastProduce(self)  # the same at a cluster leader (produce_fast_cluster)
        self.fast_fetch = FastFetch(self)  # the common single-broker consumer Fetch (fetch_fast)
        self.follower_fetch = FollowerFetch(self)  # a follower's Fetch at its leader (follower_fetch_fast)
        # Cluster mode (zookeeper.connect): roles, metadata and producer-id blocks from ZooKeeper.
        self.replicas: ReplicaManager | None = None
        if config.cluster_mode:
            # imported here, not at the top: the cluster mode's modules and kazoo are a tenth of a
            # single broker's start-up time, and a broker without zookeeper.connect never uses them
            from exactly.server.replica_manager import ReplicaManager

            self.replicas = ReplicaManager(self)
        self.producer_ids: ProducerIdManager | ZkProducerIdManager = (
            self.replicas.producer_ids
            if self.replicas is not None
            else ProducerIdManager(data_dir / "producer-id-block")
        )
        # Authorization: None (everything allowed) unless authorizer.class.name is set; the ACLs
        # live in <data-dir>/acls.json and changes apply to the next request.
        self.authorizer: Authorizer | None = authorizer_from_config(config.values)
        # (cluster mode: in ZooKeeper, shared by every broker; loaded and watched from start())
        self.acls: AclStoreLike | None = None
        self._zk_acls: ZkAclStore | None = None
        if self.authorizer is not None:
            if self.replicas is None:
                self.acls = AclStore(data_dir / ACL_FILE, self.authorizer)
            else:
                self.acls = self._zk_acls = self.replicas.acl_store(self.authorizer)
        # Listeners: one server socket each, with its protocol's TLS context and SASL settings.
        # ``advertised`` is the inter-broker listener's endpoint (the first listener's when the
        # inter-broker name matches none): what the cluster registers for its own traffic.
        self.listener_config = config.listeners()
        try:
            self.listeners: dict[str, ListenerSecurity] = {
                spec.name: build_listener_security(config.values, spec) for spec in self.listener_config.bind
            }
            # SCRAM credentials: the data directory's file, or ZooKeeper's /config/users in a cluster
            self.credentials: CredentialBackend = (
                self.replicas.scram if self.replicas is not None else CredentialStore.in_dir(data_dir)
            )
            # The connecting side of the brokers' own traffic: the inter-broker listener's
            # protocol with this broker's TLS client settings and SASL credentials (a single
            # broker never connects to another one: plain TCP, never used)
            self.inter_broker = InterBrokerClient(
                config.inter_broker_security(self.listener_config)
                if config.cluster_mode
                else InterBrokerSecurity(self.listener_config.inter_broker, SecurityProtocol.PLAINTEXT)
            )
        except (ListenerSecurityError, CredentialStoreError, TlsConfigError) as exc:
            raise ConfigError(str(exc)) from None
        self.bound: dict[str, Endpoint] = {}
        self.advertised_by_listener: dict[str, Endpoint] = {}
        self.advertised: Endpoint | None = None
        self.sasl_max_receive_size = config.get_int("sasl.server.max.receive.size")
        self.failed_auth_delay_s = config.get_int("connection.failed.authentication.delay.ms") / 1000
        self.max_request_size = config.get_int("socket.request.max.bytes")
        self.auto_create_topics = config.get_bool("auto.create.topics.enable")
        self.num_partitions = config.get_int("num.partitions")
        self._servers: list[asyncio.Server] = []
        self.connections: set[KafkaConnection] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False
        self.internal = InternalTopics(self)
        self.groups = GroupRuntime(self)
        self.txn = TxnRuntime(self)
        # KIP-890: transactional writes verified with the coordinator (remotely in cluster mode)
        self.txn_verification_enabled = config.get_bool("transaction.partition.verification.enable")
        self.txn_verifier = TxnVerifier(self)
        cleaner_config = config.cleaner_config()
        self.cleaner: LogCleaner | None = (
            LogCleaner(
                cleaner_config,
                logs.cleaner_manager,
                logs.compacted_logs,
                clock_ms=now_ms,
                hook=_swap_fault_hook(os.environ.get("EXACTLY_FAULT", "")),
                worker_fault=_worker_fault(os.environ.get("EXACTLY_FAULT", "")),
                # a cluster's replica floors gate tombstone and marker removal (replica_floors)
                replica_floor=None if self.replicas is None else self.replicas.floors.compaction_floor,
            )
            if cleaner_config.enable and cleaner_config.num_threads > 0
            else None
        )

    @classmethod
    def open(cls, config: BrokerConfig, data_dir: Path) -> Broker:
        data_dir.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        logs = LogManager(
            data_dir,
            config.log_config(),
            now_ms=now_ms(),
            producer_id_expiration_ms=config.get_int("producer.id.expiration.ms"),
            replicated=config.cluster_mode,
        )
        log.info(
            "loaded %d topics from %s in %.3f s", len(logs.topics()), data_dir, time.monotonic() - started
        )
        return cls(config, data_dir, logs)

    @property
    def cluster_id(self) -> str:
        """The id clients see: ZooKeeper's ``/cluster/id`` in cluster mode (one id for every
        broker; librdkafka refuses brokers that report different ones), else the data dir's."""
        return self.replicas.cluster_id if self.replicas is not None else self.logs.cluster_id

    # ---- topics -----------------------------------------------------------------------------
    def partition(self, topic: str, partition: int) -> PartitionLog | None:
        return self.logs.get_partition(TopicPartition(topic, partition))

    def auto_create(self, name: str) -> TopicInfo | None:
        """Create ``name`` with num.partitions if auto.create.topics.enable allows it."""
        if not self.auto_create_topics or topic_name_error(name) is not None:
            return None
        if name in INTERNAL_TOPICS:
            return None
        if self.replicas is not None:
            self.replicas.topics.request_auto_create(name, self.num_partitions)
            return None  # answered LEADER_NOT_AVAILABLE until the controller elected leaders
        info = self.logs.create_topic(name, self.num_partitions, {}, now_ms=now_ms())
        log.info("auto-created topic %s with %d partitions", name, self.num_partitions)
        return info

    def after_append(self, plog: PartitionLog) -> None:
        """Single broker: the high watermark follows the log end offset at once. A cluster
        partition's leader moves it by its replication rules."""
        if self.replicas is not None and self.replicas.manages(plog.tp):
            self.replicas.after_leader_append(plog)
            return
        plog.update_high_watermark(plog.log_end_offset)
        self.waiters.notify(plog.tp)

    # ---- lifecycle --------------------------------------------------------------------------
    async def start(self) -> Endpoint:
        self.groups.load()
        self.txn.load()
        loop = asyncio.get_running_loop()
        # A cluster broker binds first (its advertised port may be the bound one) but accepts
        # connections only once it joined the cluster, as Kafka's socket server starts processing
        # requests at the end of start-up: before its registration and partition roles are known
        # it would serve its partitions as a lone broker (leader epoch 0, high watermark = log
        # end) - a restarted leader whose old session has not expired yet would acknowledge
        # writes that the newly elected leader then truncates.
        for name, security in self.listeners.items():
            spec = security.spec
            server = await loop.create_server(
                functools.partial(KafkaConnection, self, security),
                spec.host or None,
                spec.port,
                reuse_address=True,
                backlog=512,
                start_serving=self.replicas is None,
                ssl=security.ssl_context,
                ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_S if security.ssl_context is not None else None,
            )
            self._servers.append(server)
            host, port = server.sockets[0].getsockname()[:2]
            self.bound[name] = Endpoint(host, port)
        for name, bound_endpoint in self.bound.items():
            adv_spec = self.listener_config.advertised_spec(name)
            if adv_spec is None:
                continue
            if self.config.get("advertised.listeners").strip():
                self.advertised_by_listener[name] = Endpoint(adv_spec.host, adv_spec.port)
            else:
                self.advertised_by_listener[name] = bound_endpoint
        first = next(iter(self.bound))
        host, port = self.bound[first].host, self.bound[first].port
        bound = self.bound[first]
        inter = self.listener_config.inter_broker
        self.advertised = self.advertised_by_listener.get(inter) or next(
            iter(self.advertised_by_listener.values())
        )
        metrics_address = self.data_dir / "metrics-address"
        metrics_address.unlink(missing_ok=True)
        if self.config.metrics_port() is not None:  # Prometheus /metrics, when metrics.port is set
            # imported here, not at the top: prometheus_client (and the http/email modules it
            # loads) costs every broker's start-up and only serves an endpoint that is off by default
            from exactly.server.prometheus import METRICS_HOST, start_metrics

            metrics = await start_metrics(self)
            if metrics is not None:
                metrics_address.write_text(f"{METRICS_HOST}:{metrics[0]}\n")
                self._tasks.append(metrics[1])
        if self.replicas is not None:
            await self.replicas.start(self.registration_endpoints())
            if self._zk_acls is not None:  # the cluster's ACLs before the first request
                await loop.run_in_executor(None, self._zk_acls.watch)
            for server in self._servers:
                await server.start_serving()
        (self.data_dir / "bound-address").write_text(f"{host}:{port}\n")
        self.logs.start_epoch_flush()  # the checkpoint rewrites recovery owes, off the start
        if self.cleaner is not None:
            self.cleaner.start(run_on_loop(loop))
        self._tasks.append(asyncio.create_task(self._maintenance_loop(), name="maintenance"))
        self._tasks.append(asyncio.create_task(self._idle_connections_loop(), name="idle-connections"))
        self._tasks.extend(self.groups.start_tasks())
        self._tasks.extend(self.txn.start_tasks())
        for name, endpoint in self.bound.items():
            adv = self.advertised_by_listener.get(name)
            log.info(
                "listener %s (%s) on %s:%d (advertised %s)",
                name,
                self.listeners[name].protocol.value,
                endpoint.host,
                endpoint.port,
                f"{adv.host}:{adv.port}" if adv is not None else "no",
            )
        if self.replicas is not None:
            log.info("inter-broker listener %s", self.inter_broker.settings.describe())
        return bound

    def advertised_for(self, listener: str) -> Endpoint | None:
        """This broker's endpoint for clients that came in on ``listener`` (None: not advertised)."""
        return self.advertised_by_listener.get(listener)

    def registration_endpoints(self) -> tuple[tuple[str, str, str, int], ...]:
        """(listener, protocol, host, port) of every advertised listener, for ``/brokers/ids``."""
        return tuple(
            (name, self.listeners[name].protocol.value, adv.host, adv.port)
            for name, adv in self.advertised_by_listener.items()
        )

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
                self.logs.run_maintenance(now_ms(), flush_rolled=False)
                await self._flush_rolled_segments()
                self.metrics.log_summary()
            except Exception:  # maintenance must never kill the broker
                log.exception("maintenance failed")

    async def _flush_rolled_segments(self) -> None:
        """Kafka's flush on roll (``storage.rolled_flush.rolled_flush_steps``, which states the
        invariants), with the fsyncs (110-620 ms each on a busy disk, stall-s20.md) in a worker
        thread so they block no connection: plan and complete on the loop, which owns the logs.
        One batch at a time, so the fsyncs stay ordered. If this task is cancelled (shutdown)
        while the thread runs, the steps are abandoned and the plans never completed: no recovery
        point moves, ``LogManager.close`` waits for the thread and its own flush fsyncs every
        in-flight segment again."""
        steps = rolled_flush_steps(self.logs.partitions(), self.logs.rolled_flush_runner.fsync)
        job = next(steps, None)
        if job is None:
            return
        try:
            fsynced: list[bool] | BaseException = await asyncio.to_thread(job)
        except asyncio.CancelledError:
            steps.close()
            raise
        except BaseException as exc:  # completed as not ok, then re-raised by finish_rolled_flush
            fsynced = exc
        finish_rolled_flush(steps, fsynced)

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
        if self.replicas is not None:
            try:
                await self.replicas.controlled_shutdown()
            except Exception:  # the broker must still close
                log.exception("controlled shutdown failed")
        for server in self._servers:
            server.close()
        if self.replicas is not None:
            self.replicas.resign_leaderships()
            draining = [asyncio.ensure_future(conn.drain()) for conn in list(self.connections)]
            if draining:
                await asyncio.wait(draining, timeout=DRAIN_TIMEOUT_S)
                for task in draining:
                    task.cancel()
        for conn in list(self.connections):
            conn.abort()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.txn.stop()
        self.txn_verifier.close()
        for server in self._servers:
            await server.wait_closed()
        if self.replicas is not None:
            try:
                await self.replicas.stop()
            except Exception:  # the session is going away anyway; the logs must still close
                log.exception("leaving the cluster failed")
        if self.cleaner is not None:
            # From an executor: a cleaner thread may be waiting for this loop to run its swap.
            await asyncio.get_running_loop().run_in_executor(None, self.cleaner.stop)
        self.logs.close()
        self.metrics.log_summary(force=True)
        log.info("shutdown complete")


def run_on_loop(loop: asyncio.AbstractEventLoop) -> Callable[[Callable[[], None]], None]:
    """For the log cleaner's threads: run ``fn`` on the broker's event loop (which owns every
    log) and wait for it; its exception is raised in the calling thread."""

    def run(fn: Callable[[], None]) -> None:
        done: concurrent.futures.Future[None] = concurrent.futures.Future()

        def call() -> None:
            if not done.set_running_or_notify_cancel():
                return
            try:
                fn()
            except BaseException as exc:  # handed to the waiting thread
                done.set_exception(exc)
            else:
                done.set_result(None)

        try:
            loop.call_soon_threadsafe(call)
        except RuntimeError:  # the loop is closed: the broker is stopping
            raise CleaningAbortedError("the event loop is closed") from None
        done.result()

    return run


def _worker_fault(fault: str) -> str:
    """``EXACTLY_FAULT=cleaner-worker-exit`` (tests only): every cleaner worker process exits
    abruptly after writing its first cleaned segment, to show the broker survives it."""
    return FAULT_EXIT_AFTER_FIRST_GROUP if fault == "cleaner-worker-exit" else ""


def _swap_fault_hook(fault: str) -> SwapHook | None:
    """``EXACTLY_FAULT=cleaner-crash-at-<step>`` (tests only): SIGKILL the broker when a cleaner
    swap reaches ``<step>`` (a ``SwapStep`` value), to show a kill -9 there loses nothing."""
    prefix = "cleaner-crash-at-"
    if not fault.startswith(prefix):
        return None
    target = SwapStep(fault[len(prefix) :])

    def hook(step: SwapStep) -> None:
        if step is target:
            log.error("EXACTLY_FAULT=%s: killing the broker in a cleaner swap", fault)
            os.kill(os.getpid(), signal.SIGKILL)

    return hook
