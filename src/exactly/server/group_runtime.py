"""The group coordinator's binding to the coordinator runtime (coordinator/group/README.md).

What the broker calls:

* ``GroupRuntime(broker)`` at construction (no I/O).
* ``load()`` once at start-up, before the listener opens: the runtime replays
  ``__consumer_offsets`` (if it exists) into the coordinator, then drives ``load_complete``.
  Until then group requests get COORDINATOR_LOAD_IN_PROGRESS (``load_error``).
* ``start_tasks()`` after the listener opens: the runtime's timer loop (``coordinator.poll`` at
  ``next_deadline()``) and the offset-retention job, which runs ``cleanup_group_metadata`` every
  ``offsets.retention.check.interval.ms`` (first run one interval after start, as Kafka's group
  coordinator schedules it); the broker cancels both at shutdown.
* ``on_marker(partition, producer_id, commit)`` from the transaction marker writer right after a
  COMMIT/ABORT marker was appended to ``__consumer_offsets-<partition>`` (single broker, where
  every operation is synchronous); in cluster mode ``await apply_marker(...)`` after the marker's
  acks=all append, which applies it under the runtime's operation lock.

What the handlers call: ``load_error_for(group_id)`` first (NOT_COORDINATOR /
COORDINATOR_LOAD_IN_PROGRESS / NONE), then ``call(op)``, which runs one coordinator request with
its token and returns an asyncio future of its answer (the runtime's ``call``). A JoinGroup
parked for a rebalance resolves later, from another request or the timer loop. The coordinator
checks ownership again when the request runs (``GroupCoordinator.owner_error``): in cluster mode
the request may wait for the operation lock behind a reload that resigned its group's partition.

Cluster mode: nothing is loaded at start-up; the replica manager calls
``on_leadership(partitions)`` whenever the set of ``__consumer_offsets`` partitions this broker
leads changes, and the runtime reloads them (groups of other partitions answer NOT_COORDINATOR).
Offset commits are acknowledged once the partition's ISR has them.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Never

from kio.schema.errors import ErrorCode

from exactly.coordinator.group import GroupCoordinator, GroupCoordinatorConfig
from exactly.coordinator.group.api import CleanupStats
from exactly.coordinator.result import NOTHING, CoordinatorResult, RequestToken
from exactly.server.clock import now_ms
from exactly.server.config import BrokerConfig, ConfigError
from exactly.server.coordinator_runtime import CoordinatorRuntime
from exactly.topics import CONSUMER_OFFSETS_TOPIC

if TYPE_CHECKING:
    from exactly.server.broker import Broker

log = logging.getLogger("exactly.groups")


def millis(delta: datetime.timedelta) -> int:
    """A kio duration field as Kafka's integer milliseconds."""
    return delta // datetime.timedelta(milliseconds=1)


def _positive(cfg: BrokerConfig, name: str) -> int:
    """Kafka requires these at least 1 (0 would make the cleanup loop spin)."""
    value = cfg.get_int(name)
    if value < 1:
        raise ConfigError(f"{name} must be at least 1, got {value}")
    return value


def client_host(peer: str) -> str:
    """Kafka reports a member's host as ``InetAddress.toString``: ``/1.2.3.4``."""
    host = peer.rpartition(":")[0] if ":" in peer else peer
    return "/" + host.strip("[]")


class GroupRuntime:
    """The group coordinator, its runtime and what only groups need.

    Owns: the :class:`GroupCoordinator` and the :class:`CoordinatorRuntime` driving it over
    ``__consumer_offsets``. Lifecycle: constructed by the broker (no I/O) -> :meth:`load` ->
    :meth:`start_tasks` (timer loop, offset retention; cancelled by the broker at shutdown).
    """

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        cfg = broker.config
        # Kafka maps groups onto the partitions the offsets topic really has; the config only
        # decides the count when the topic is created.
        existing = broker.logs.topic(CONSUMER_OFFSETS_TOPIC)
        partitions = (
            existing.partitions if existing is not None else cfg.get_int("offsets.topic.num.partitions")
        )
        self.coordinator = GroupCoordinator(
            GroupCoordinatorConfig(
                num_partitions=partitions,
                initial_rebalance_delay_ms=cfg.get_int("group.initial.rebalance.delay.ms"),
                min_session_timeout_ms=cfg.get_int("group.min.session.timeout.ms"),
                max_session_timeout_ms=cfg.get_int("group.max.session.timeout.ms"),
                offsets_retention_ms=_positive(cfg, "offsets.retention.minutes") * 60_000,
                offsets_retention_check_interval_ms=_positive(cfg, "offsets.retention.check.interval.ms"),
            )
        )
        self.runtime = CoordinatorRuntime(
            "groups", CONSUMER_OFFSETS_TOPIC, broker.internal, self.coordinator, skip_bad_records=True
        )
        self.runtime.every(
            "group-offset-expiration",
            self.coordinator.config.offsets_retention_check_interval_ms / 1000,
            self.cleanup,
        )

    # ---- lifecycle ----------------------------------------------------------------------------
    @property
    def loaded(self) -> bool:
        return self.runtime.loaded

    def load(self) -> None:
        """Replay every ``__consumer_offsets`` batch in log order, then start the loaded members'
        session timers. Cluster mode: nothing (loads follow leadership, ``on_leadership``)."""
        if self.runtime.replicated:
            return
        stats = self.runtime.load()
        if stats.batches:
            log.info(
                "loaded %d groups from %d records of %s",
                len(self.coordinator.groups),
                stats.records,
                CONSUMER_OFFSETS_TOPIC,
            )

    def start_tasks(self) -> list[asyncio.Task[None]]:
        return self.runtime.start_tasks()

    async def on_leadership(self, led: Callable[[], Mapping[int, object]]) -> None:
        """Cluster mode: the offsets partitions this broker leads may have changed; ``led()``
        maps each one it leads now to its leadership (read under the runtime's lock, see
        ``CoordinatorRuntime.reload``: a partition lost and led again is reloaded too).

        The coordinator is told which partitions it loads (``begin_load``): a request that passed
        ``load_error_for`` before this reload took the lock, for a group of a partition it
        resigned, gets NOT_COORDINATOR from the coordinator itself when it runs."""
        stats = await self.runtime.reload(led, self.coordinator.begin_load)
        if stats is None:
            return
        log.info(
            "group coordinator for %s partitions %s: %d groups loaded from %d records",
            CONSUMER_OFFSETS_TOPIC,
            sorted(self.runtime.owned or ()),
            len(self.coordinator.groups),
            stats.records,
        )

    def on_marker(self, partition: int, producer_id: int, commit: bool) -> None:
        self.coordinator.complete_transaction(producer_id, commit, partition)

    async def apply_marker(self, partition: int, producer_id: int, commit: bool) -> None:
        """Cluster mode: apply a replicated marker as one runtime operation, under its lock.

        A TxnOffsetCommit holds that lock from its append until its completion, so a marker can
        no longer be applied between the two: were it applied first, the completion would find
        its offset already settled (ignored, see ``OffsetStore.complete_staged``) -- without the
        lock the marker and the commit, waking on the same high-watermark move, were applied in
        either order. Kafka likewise completes a transaction's offsets under the group's lock.
        """

        def op() -> CoordinatorResult[Never]:
            self.coordinator.complete_transaction(producer_id, commit, partition)
            return NOTHING

        await self.runtime.execute(op)

    # ---- requests -----------------------------------------------------------------------------
    @property
    def load_error(self) -> ErrorCode:
        """What a request about every group (ListGroups) gets: COORDINATOR_LOAD_IN_PROGRESS while
        a load runs, else NONE (in cluster mode it lists the groups of the led partitions)."""
        runtime = self.runtime
        if runtime.loaded or runtime.owned == frozenset():
            return ErrorCode.none
        return ErrorCode.coordinator_load_in_progress

    def load_error_for(self, group_id: str) -> ErrorCode:
        """What a request for ``group_id`` gets before reaching the coordinator (NONE: go on)."""
        return self.runtime.owner_error(self.coordinator.partition_for(group_id))

    def call(self, op: Callable[[RequestToken], CoordinatorResult[Any]]) -> asyncio.Future[Any]:
        """Run ``op(token)`` (a coordinator request) and return a future of its answer."""
        return self.runtime.call(op)

    # ---- offset retention ---------------------------------------------------------------------
    async def cleanup(self) -> CleanupStats:
        """One retention run: expire offsets, remove dead groups (writes done when it returns)."""
        started = now_ms()
        coord = self.coordinator
        if not self.runtime.loaded:
            return CleanupStats()
        answer: object = await self.runtime.run_async(
            lambda token: coord.cleanup_group_metadata(started, token)
        )
        stats = answer if isinstance(answer, CleanupStats) else CleanupStats()
        self.broker.metrics.offsets_expired += stats.offsets_removed
        self.broker.metrics.groups_removed += stats.groups_removed
        if stats.offsets_removed or stats.groups_removed:
            log.info(
                "removed %d expired offsets and %d groups in %d ms",
                stats.offsets_removed,
                stats.groups_removed,
                now_ms() - started,
            )
        if stats.failed_appends:
            log.warning(
                "offset expiration could not write to %d %s partitions; retrying next run",
                stats.failed_appends,
                CONSUMER_OFFSETS_TOPIC,
            )
        return stats
