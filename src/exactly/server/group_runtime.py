"""The asyncio shell around the sans-IO GroupCoordinator (coordinator/group/README.md).

What the broker calls:

* ``GroupRuntime(broker)`` at construction (no I/O).
* ``load()`` once at start-up, before the listener opens: replay ``__consumer_offsets`` (if it
  exists) through ``broker.internal.replay(OFFSETS_TOPIC)`` into the coordinator, then
  ``load_complete``. Until then group requests get COORDINATOR_LOAD_IN_PROGRESS.
* ``start_tasks()`` after the listener opens: the timer loop that calls ``coordinator.poll`` at
  ``next_deadline()``, and the offset-retention loop that calls
  ``coordinator.cleanup_group_metadata`` every ``offsets.retention.check.interval.ms`` (first run
  one interval after start, as Kafka's group coordinator schedules it); the broker cancels both at
  shutdown.
* ``on_marker(partition, producer_id, commit)`` from the transaction marker writer right after a
  COMMIT/ABORT marker was appended to ``__consumer_offsets-<partition>``.

What the handlers call: ``call(op)`` runs one coordinator operation with a ``respond`` callback
and returns an asyncio future of its answer. The operation's effects (AppendRecords) are carried
out at once -- storage is synchronous, so an append has succeeded or failed when ``append``
returns -- and their completions, which may emit further effects, run depth-first in the same
call. A JoinGroup parked for a rebalance resolves later, from another request or the timer loop.

Everything runs on the broker's one event loop; the coordinator is never entered concurrently.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from kio.schema.errors import ErrorCode

from exactly.coordinator.group import (
    AppendRecords,
    AppendResult,
    GroupCoordinator,
    GroupCoordinatorConfig,
)
from exactly.coordinator.group.api import CleanupStats
from exactly.records.control import ControlType
from exactly.server.clock import now_ms
from exactly.server.config import BrokerConfig, ConfigError
from exactly.server.internal_topics import OFFSETS_TOPIC, AppendFailed

if TYPE_CHECKING:
    from exactly.server.broker import Broker

log = logging.getLogger("exactly.groups")

R = TypeVar("R")

IDLE_POLL_S = 0.1  # timer loop period when no deadline is nearer


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
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        cfg = broker.config
        # Kafka maps groups onto the partitions the offsets topic really has; the config only
        # decides the count when the topic is created.
        existing = broker.logs.topic(OFFSETS_TOPIC)
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
        self.loaded = False
        self._wake: asyncio.Event | None = None
        self._sleep_until: int | None = None  # when the timer loop wakes next (ms), if sleeping

    # ---- lifecycle ----------------------------------------------------------------------------
    def load(self) -> None:
        """Replay every ``__consumer_offsets`` batch in log order, then start the loaded members'
        session timers."""
        coord = self.coordinator
        batches = records = 0
        for batch in self.broker.internal.replay(OFFSETS_TOPIC):
            batches += 1
            if batch.control is not None:
                coord.replay_end_transaction(
                    batch.producer_id, commit=batch.control is ControlType.COMMIT, partition=batch.partition
                )
                continue
            # Only transactional batches (TxnOffsetCommit) are pending; idempotent ones are plain.
            producer_id = batch.producer_id if batch.is_transactional else -1
            for offset, key, value in batch.records:
                if key is None:
                    continue
                records += 1
                try:
                    coord.replay(key, value, offset=offset, producer_id=producer_id)
                except Exception:  # one undecodable record must not keep the broker down
                    log.exception(
                        "skipping undecodable record at %s-%d offset %d",
                        OFFSETS_TOPIC,
                        batch.partition,
                        offset,
                    )
        self.execute(coord.load_complete(now_ms()))
        self.loaded = True
        if batches:
            log.info("loaded %d groups from %d records of %s", len(coord.groups), records, OFFSETS_TOPIC)

    def start_tasks(self) -> list[asyncio.Task[None]]:
        self._wake = asyncio.Event()
        return [
            asyncio.create_task(self._timer_loop(), name="group-timers"),
            asyncio.create_task(self._cleanup_loop(), name="group-offset-expiration"),
        ]

    def on_marker(self, partition: int, producer_id: int, commit: bool) -> None:
        self.coordinator.complete_transaction(producer_id, commit, partition)

    # ---- requests -----------------------------------------------------------------------------
    @property
    def load_error(self) -> ErrorCode:
        """What a group request gets before the coordinator is ready (ErrorCode.none after)."""
        return ErrorCode.none if self.loaded else ErrorCode.coordinator_load_in_progress

    def call(self, op: Callable[[Callable[[R], None]], list[AppendRecords]]) -> asyncio.Future[R]:
        """Run ``op(respond)`` (a coordinator call), carry out its effects, and return a future
        resolved with whatever ``respond`` receives (maybe only after a rebalance)."""
        fut: asyncio.Future[R] = asyncio.get_running_loop().create_future()

        def respond(response: R) -> None:
            if not fut.done():  # the waiting connection may have gone away
                fut.set_result(response)

        self.execute(op(respond))
        self._maybe_wake()
        return fut

    def execute(self, effects: list[AppendRecords]) -> None:
        """Append each effect's records to ``__consumer_offsets`` and report the outcome;
        follow-up effects of a completion run before the next sibling (depth-first)."""
        todo = list(reversed(effects))
        while todo:
            effect = todo.pop()
            try:
                base = self.broker.internal.append(
                    OFFSETS_TOPIC,
                    effect.partition,
                    effect.records,
                    producer_id=effect.producer_id,
                    producer_epoch=effect.producer_epoch,
                    transactional=effect.transactional,
                )
                result = AppendResult(now_ms=now_ms(), base_offset=base)
            except AppendFailed as exc:
                log.warning(
                    "append to %s-%d failed: %s (%s)",
                    OFFSETS_TOPIC,
                    effect.partition,
                    exc.error_code.name,
                    exc,
                )
                result = AppendResult(now_ms=now_ms(), error=exc.error_code)
            except Exception:
                log.exception("unexpected error appending to %s-%d", OFFSETS_TOPIC, effect.partition)
                result = AppendResult(now_ms=now_ms(), error=ErrorCode.unknown_server_error)
            todo.extend(reversed(effect.complete(result)))

    # ---- time ---------------------------------------------------------------------------------
    def _maybe_wake(self) -> None:
        """A request may have armed a timer earlier than the one the loop sleeps towards."""
        if self._wake is None or self._sleep_until is None:
            return
        deadline = self.coordinator.next_deadline()
        if deadline is not None and deadline < self._sleep_until:
            self._wake.set()

    async def _timer_loop(self) -> None:
        wake = self._wake
        assert wake is not None
        while True:
            now = now_ms()
            deadline = self.coordinator.next_deadline()
            delay_ms = (
                IDLE_POLL_S * 1000 if deadline is None else min(max(deadline - now, 0), IDLE_POLL_S * 1000)
            )
            self._sleep_until = now + int(delay_ms)
            if delay_ms > 0:
                wake.clear()
                try:
                    await asyncio.wait_for(wake.wait(), delay_ms / 1000)
                except TimeoutError:
                    pass
            self._sleep_until = None
            try:
                self.execute(self.coordinator.poll(now_ms()))
            except Exception:  # a bug in one timer must not stop every group's timers
                log.exception("group coordinator poll failed")
                await asyncio.sleep(IDLE_POLL_S)

    # ---- offset retention ---------------------------------------------------------------------
    def cleanup(self) -> CleanupStats:
        """One retention run: expire offsets, remove dead groups (appends done when it returns)."""
        started = now_ms()
        answers: list[CleanupStats] = []
        self.execute(self.coordinator.cleanup_group_metadata(started, answers.append))
        stats = answers[0] if answers else CleanupStats()
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
                OFFSETS_TOPIC,
            )
        return stats

    async def _cleanup_loop(self) -> None:
        interval = self.coordinator.config.offsets_retention_check_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                self.cleanup()
            except Exception:  # one bad run must not stop retention for good
                log.exception("group metadata cleanup failed")
