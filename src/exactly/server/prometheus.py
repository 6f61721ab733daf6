"""Prometheus endpoint: ``GET /metrics`` on 127.0.0.1:<metrics.port> (``exactly serve --metrics-port``).

Off unless ``metrics.port`` is set; 0 picks a free port. The bound address is logged and written
to ``<data-dir>/metrics-address`` (``127.0.0.1:PORT``).

Nothing is recorded per request for this: a custom collector reads the broker's existing state when
Prometheus scrapes. The HTTP server is a tiny asyncio server on the broker's own event loop, so a
scrape reads partitions, producer state and the transaction coordinator between two requests,
never concurrently with them (they are plain objects owned by the loop, see broker.py).

Series:

* ``exactly_partition_log_end_offset``, ``exactly_partition_high_watermark`` and
  ``exactly_partition_last_stable_offset_lag`` (high watermark - last stable offset, Kafka's
  LastStableOffsetLag: grows while a transaction stays open) per ``{topic,partition}``;
* ``exactly_ongoing_producer_transactions{topic,partition}``: producers with an open transaction
  on the partition (from its producer state);
* ``exactly_open_transactions``: transactional ids in Ongoing/Prepare* at the coordinator;
* ``exactly_requests_total{api}``, ``exactly_errors_total{api,error}`` (Kafka names, as in
  ``kafka.network:type=RequestMetrics``), ``exactly_duplicate_batches_total``,
  ``exactly_messages_in_total``, ``exactly_bytes_in_total``, ``exactly_bytes_out_total``;
* ``exactly_offsets_expired_total``, ``exactly_groups_removed_total``: offset retention's work;
* ``exactly_authorization_denied_total{resource_type,operation}``: checks the ACL authorizer
  denied (each is also an ``exactly.audit`` log line);
* ``exactly_successful_authentication_total{listener,mechanism}``,
  ``exactly_failed_authentication_total{listener,mechanism}``: Kafka's
  successful-/failed-authentication-total (SASL, and SSL for client certificates);
* the cluster's health, Kafka's replication metrics under the same snake-case rule
  (``kafka.server:type=ReplicaManager,name=UnderReplicatedPartitions`` ->
  ``exactly_under_replicated_partitions``; a ``...PerSec`` / ``...Rate`` meter is a counter, its
  Count, named for what it counts):

  - ``exactly_under_replicated_partitions``: partitions this broker leads whose ISR is smaller
    than their replica set (Kafka's UnderReplicatedPartitions), and per partition
    ``exactly_partition_under_replicated{topic,partition}`` (1/0, 0 where this broker does not lead);
  - ``exactly_offline_partitions_count``: partitions without a live leader, on the active
    controller only, 0 elsewhere (Kafka's OfflinePartitionsCount); read from the controller
    broker's metadata cache, which the same ZooKeeper watches fill;
  - ``exactly_active_controller_count``: 1 on the controller, 0 elsewhere (a single broker is its
    own controller: 1);
  - ``exactly_isr_shrinks_total`` / ``exactly_isr_expands_total``: ISR changes this broker wrote as
    a leader and saw commit (IsrShrinksPerSec / IsrExpandsPerSec). As in Kafka, the controller
    removing a dead broker from an ISR is not a shrink by the leader;
  - ``exactly_leader_elections_total`` / ``exactly_unclean_leader_elections_total``: leaders the
    controller elected (after a failure, unclean, at a controlled shutdown, preferred) while this
    broker was the controller (LeaderElectionRateAndTimeMs / UncleanLeaderElectionsPerSec; Kafka's
    timer counts the controller's broker-change events instead, this counts the elections
    themselves; a new partition's first leader is not an election in either);
  - ``exactly_partition_last_stable_offset_lag`` is reported by the partition's leader; followers
    report 0, as Kafka's gauge does.

  The counters are bumped by the shell where a decision's write committed (the replica
  manager's ISR writer, the controller's worker); the gauges are computed here at scrape time, so
  the produce and fetch paths pay nothing for them;
* the log cleaner's (Kafka's ``kafka.log:type=LogCleaner`` / ``LogCleanerManager`` metrics, same
  snake-case rule), read from the cleaner's counters at scrape time:
  ``exactly_log_cleaner_passes_total``, ``exactly_log_cleaner_bytes_read_total`` /
  ``..._bytes_written_total`` (bytes cleaned), ``exactly_log_cleaner_recopy_percent`` (written / read
  of the last pass), ``exactly_log_cleaner_max_clean_time_seconds``,
  ``exactly_log_cleaner_max_dirty_percent`` (the dirtiest compacted log's ratio at the last
  check), ``exactly_log_cleaner_max_compaction_delay_seconds``,
  ``exactly_log_cleaner_uncleanable_partitions_count`` and ``exactly_log_cleaner_dead_thread_count``;
  ``exactly_partition_dirty_ratio{topic,partition}`` per compacted partition (cleanable / total
  bytes, as the cleaner computes it);
* the standard ``process_*`` series.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from exactly.server.clock import now_ms
from exactly.server.config import BrokerConfig
from exactly.server.metrics import Metrics, api_name, error_name
from exactly.types import TopicPartition

if TYPE_CHECKING:
    from exactly.server.broker import Broker

log = logging.getLogger("exactly.prometheus")

METRICS_HOST = "127.0.0.1"
OPEN_TXN_STATES = ("Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence")
_READ_TIMEOUT_S = 10.0
_MAX_HEADER_LINES = 100


def metrics_port(config: BrokerConfig) -> int | None:
    """``metrics.port``: None when unset (no endpoint), else 0-65535 (0 = any free port)."""
    return config.metrics_port()


class BrokerCollector(Collector):
    """Reads the broker's state at scrape time."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def collect(self) -> Iterator[Metric]:
        broker = self.broker
        labels = ["topic", "partition"]
        leo = GaugeMetricFamily("exactly_partition_log_end_offset", "Log end offset.", labels=labels)
        hw = GaugeMetricFamily("exactly_partition_high_watermark", "High watermark.", labels=labels)
        lso_lag = GaugeMetricFamily(
            "exactly_partition_last_stable_offset_lag",
            "High watermark minus last stable offset (Kafka's LastStableOffsetLag).",
            labels=labels,
        )
        ongoing = GaugeMetricFamily(
            "exactly_ongoing_producer_transactions",
            "Producers with an open transaction on the partition.",
            labels=labels,
        )
        under = GaugeMetricFamily(
            "exactly_partition_under_replicated",
            "1 if this broker leads the partition and its ISR is smaller than its replica set.",
            labels=labels,
        )
        replicas = broker.replicas
        leaders = replicas.leaders if replicas is not None else None
        under_replicated = 0
        for plog in sorted(broker.logs.partitions(), key=lambda p: (p.tp.topic, p.tp.partition)):
            key = [plog.tp.topic, str(plog.tp.partition)]
            high = plog.high_watermark
            leo.add_metric(key, plog.log_end_offset)
            hw.add_metric(key, high)
            led = leaders is None or plog.tp in leaders
            lso_lag.add_metric(key, max(high - plog.last_stable_offset, 0) if led else 0)
            ongoing.add_metric(key, len(plog.producer_state.ongoing_transactions()))
            leader = leaders.get(plog.tp) if leaders is not None else None
            short = leader is not None and len(leader.isr) < len(leader.replicas)
            under_replicated += short
            under.add_metric(key, int(short))
        yield from (leo, hw, lso_lag, ongoing, under)
        yield from _cluster_health(broker, under_replicated)
        yield from _log_cleaner(broker)

        open_txns = GaugeMetricFamily(
            "exactly_open_transactions",
            "Transactional ids in Ongoing, PrepareCommit, PrepareAbort or PrepareEpochFence.",
        )
        result = broker.txn.coordinator.list_transactions(now_ms=now_ms(), state_filters=OPEN_TXN_STATES)
        if not result.error:  # still loading: report nothing rather than a wrong 0
            open_txns.add_metric([], len(result.transactions))
        yield open_txns

        m = broker.metrics
        requests = CounterMetricFamily("exactly_requests", "Requests received per API.", labels=["api"])
        for api_key, count in sorted(m.requests.items()):
            requests.add_metric([api_name(api_key)], count)
        yield requests
        errors = CounterMetricFamily(
            "exactly_errors", "Error codes returned per API and error.", labels=["api", "error"]
        )
        for (api_key, code), count in sorted(m.errors.items()):
            errors.add_metric([api_name(api_key), error_name(code)], count)
        yield errors
        denied = CounterMetricFamily(
            "exactly_authorization_denied",
            "Authorization checks the ACL authorizer denied, per resource type and operation.",
            labels=["resource_type", "operation"],
        )
        for (rtype, op), count in sorted(m.authorization_denied.items()):
            denied.add_metric([rtype, op], count)
        yield denied
        yield CounterMetricFamily(
            "exactly_duplicate_batches",
            "Produce batches acknowledged as duplicates by the idempotence check.",
            value=m.duplicate_batches,
        )
        yield CounterMetricFamily("exactly_messages_in", "Records appended by Produce.", value=m.messages_in)
        yield CounterMetricFamily("exactly_bytes_in", "Request bytes received.", value=m.bytes_in)
        yield CounterMetricFamily("exactly_bytes_out", "Response bytes sent.", value=m.bytes_out)
        yield CounterMetricFamily(
            "exactly_offsets_expired",
            "Committed offsets removed by offset retention (Kafka's offset-expiration-count).",
            value=m.offsets_expired,
        )
        yield CounterMetricFamily(
            "exactly_groups_removed", "Empty groups removed by offset retention.", value=m.groups_removed
        )
        yield from _authentications(m)


def _authentications(m: Metrics) -> Iterator[Metric]:
    """Kafka's successful-authentication-total / failed-authentication-total, per listener and
    mechanism (SSL for a client certificate; SASL failures before a mechanism was chosen count
    under SASL)."""
    labels = ["listener", "mechanism"]
    ok = CounterMetricFamily(
        "exactly_successful_authentication",
        "Connections authenticated (SASL or client certificate).",
        labels=labels,
    )
    failed = CounterMetricFamily(
        "exactly_failed_authentication",
        "Failed authentications (SASL, or an unmapped certificate).",
        labels=labels,
    )
    for (listener, mechanism, succeeded), count in sorted(m.authentications.items()):
        (ok if succeeded else failed).add_metric([listener, mechanism], count)
    yield ok
    yield failed


def _log_cleaner(broker: Broker) -> Iterator[Metric]:
    """The log cleaner's series (see the module docstring); zeros when the cleaner is off."""
    cleaner = broker.cleaner
    manager = broker.logs.cleaner_manager
    stats = cleaner.metrics if cleaner is not None else None
    yield CounterMetricFamily(
        "exactly_log_cleaner_passes", "Cleaning passes completed.", value=stats.passes if stats else 0
    )
    yield CounterMetricFamily(
        "exactly_log_cleaner_bytes_read",
        "Bytes of segments the cleaner rewrote (read).",
        value=stats.bytes_read if stats else 0,
    )
    yield CounterMetricFamily(
        "exactly_log_cleaner_bytes_written",
        "Bytes the cleaner wrote back.",
        value=stats.bytes_written if stats else 0,
    )
    yield GaugeMetricFamily(
        "exactly_log_cleaner_recopy_percent",
        "Bytes written / bytes read of the last pass, in percent (Kafka's cleaner-recopy-percent).",
        value=100.0 * stats.last_recopy_ratio if stats else 0.0,
    )
    yield GaugeMetricFamily(
        "exactly_log_cleaner_max_clean_time_seconds",
        "The longest pass so far (Kafka's max-clean-time-secs).",
        value=stats.max_pass_s if stats else 0.0,
    )
    yield GaugeMetricFamily(
        "exactly_log_cleaner_max_owner_hop_seconds",
        "The longest the cleaner held the event loop in one go (choosing a log, committing a swap): "
        "exactly's own; Kafka's cleaner threads lock only the partition they swap.",
        value=stats.owner_hop_max_s if stats else 0.0,
    )
    yield GaugeMetricFamily(
        "exactly_log_cleaner_max_dirty_percent",
        "Dirty ratio of the dirtiest compacted log at the last check, in percent.",
        value=100.0 * manager.dirtiest_ratio,
    )
    yield GaugeMetricFamily(
        "exactly_log_cleaner_max_compaction_delay_seconds",
        "How far past max.compaction.lag.ms the most overdue log is.",
        value=manager.max_compaction_delay_ms / 1000,
    )
    yield GaugeMetricFamily(
        "exactly_log_cleaner_uncleanable_partitions_count",
        "Partitions the cleaner gave up on after an error.",
        value=len(manager.uncleanable()),
    )
    yield GaugeMetricFamily(
        "exactly_log_cleaner_dead_thread_count",
        "Cleaner threads that died.",
        value=cleaner.dead_threads if cleaner is not None else 0,
    )
    ratio = GaugeMetricFamily(
        "exactly_partition_dirty_ratio",
        "Cleanable / total bytes of a compacted partition.",
        labels=["topic", "partition"],
    )
    for tp, value in sorted(
        manager.dirty_ratios().items(), key=lambda item: (item[0].topic, item[0].partition)
    ):
        ratio.add_metric([tp.topic, str(tp.partition)], value)
    yield ratio


def _cluster_health(broker: Broker, under_replicated: int) -> Iterator[Metric]:
    """The broker-level replication series (see the module docstring). A single broker is its own
    controller with nothing to replicate: 1 active controller, zeros elsewhere."""
    replicas = broker.replicas
    controller = replicas.controller if replicas is not None else None
    active = controller is None or controller.is_active
    offline = 0
    if replicas is not None and active:
        cache = replicas.cache
        for name in cache.topic_names():
            offline += sum(
                1
                for p in cache.partitions(name)
                if cache.state(TopicPartition(name, p.partition)) is not None
                and p.leader not in cache.brokers
            )
    yield GaugeMetricFamily(
        "exactly_under_replicated_partitions",
        "Partitions led here whose ISR is smaller than their replica set (UnderReplicatedPartitions).",
        value=under_replicated,
    )
    yield GaugeMetricFamily(
        "exactly_offline_partitions_count",
        "Partitions without a live leader, on the active controller (OfflinePartitionsCount).",
        value=offline,
    )
    yield GaugeMetricFamily(
        "exactly_active_controller_count",
        "1 on the active controller, 0 elsewhere (ActiveControllerCount).",
        value=int(active),
    )
    yield CounterMetricFamily(
        "exactly_isr_shrinks",
        "ISR shrinks written by this broker as a leader (IsrShrinksPerSec).",
        value=replicas.isr_writer.shrinks if replicas is not None else 0,
    )
    yield CounterMetricFamily(
        "exactly_isr_expands",
        "ISR expansions written by this broker as a leader (IsrExpandsPerSec).",
        value=replicas.isr_writer.expands if replicas is not None else 0,
    )
    yield CounterMetricFamily(
        "exactly_leader_elections",
        "Partition leaders elected by this broker as the controller (LeaderElectionRateAndTimeMs).",
        value=controller.leader_elections if controller is not None else 0,
    )
    yield CounterMetricFamily(
        "exactly_unclean_leader_elections",
        "Unclean leader elections by this broker as the controller (UncleanLeaderElectionsPerSec).",
        value=controller.unclean_leader_elections if controller is not None else 0,
    )


def make_registry(broker: Broker) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(broker))
    ProcessCollector(registry=registry)
    return registry


class MetricsServer:
    """A minimal HTTP/1.1 server for ``GET /metrics`` (one request per connection).

    Owns its listening ``asyncio.Server``. Lifecycle: ``start`` binds -> ``serve`` runs as one of
    the broker's tasks until the broker cancels it at shutdown, which closes the server."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        self.server = await asyncio.start_server(self._handle, host, port, reuse_address=True)
        return int(self.server.sockets[0].getsockname()[1])

    async def serve(self) -> None:
        """Run until cancelled (the broker cancels its tasks at shutdown)."""
        assert self.server is not None
        try:
            await self.server.serve_forever()
        finally:
            self.server.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            status, content_type, body, head_only = await self._respond(reader)
            head = (
                f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            ).encode()
            writer.write(head if head_only else head + body)
            await writer.drain()
        except (
            TimeoutError,
            ConnectionError,
            ValueError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
        ):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _respond(self, reader: asyncio.StreamReader) -> tuple[str, str, bytes, bool]:
        line = await asyncio.wait_for(reader.readline(), _READ_TIMEOUT_S)
        parts = line.decode("latin-1").split()
        accept = ""
        for _ in range(_MAX_HEADER_LINES):
            header = await asyncio.wait_for(reader.readline(), _READ_TIMEOUT_S)
            if header in (b"\r\n", b"\n", b""):
                break
            name, _, value = header.decode("latin-1").partition(":")
            if name.strip().lower() == "accept":
                accept = value.strip()
        text = "text/plain; charset=utf-8"
        if len(parts) < 2:
            return "400 Bad Request", text, b"bad request\n", False
        method, target = parts[0], parts[1]
        if method not in ("GET", "HEAD"):
            return "405 Method Not Allowed", text, b"method not allowed\n", False
        if target.split("?", 1)[0] not in ("/metrics", "/"):
            return "404 Not Found", text, b"not found: try /metrics\n", method == "HEAD"
        encoder, content_type = choose_encoder(accept)
        try:
            body = encoder(self.registry)
        except Exception:
            log.exception("collecting metrics failed")
            return "500 Internal Server Error", text, b"collecting metrics failed\n", method == "HEAD"
        return "200 OK", content_type, body, method == "HEAD"


async def start_metrics(broker: Broker) -> tuple[int, asyncio.Task[None]] | None:
    """Start the endpoint if ``metrics.port`` is set -> (bound port, serving task), else None."""
    port = metrics_port(broker.config)
    if port is None:
        return None
    server = MetricsServer(make_registry(broker))
    bound = await server.start(METRICS_HOST, port)
    log.info("metrics on http://%s:%d/metrics", METRICS_HOST, bound)
    return bound, asyncio.create_task(server.serve(), name="metrics-http")
