"""Shared machinery of the group coordinator: config, groups, timers, effects and replies.

Operations
----------
Every public call that can change state runs as one *operation* (:meth:`CoordinatorCore._run`):

1. fire the timers already due at ``now_ms`` (a session that expired before this request arrived is
   expired first, as Kafka's timer thread would have done);
2. run the request's logic, which may park reply callbacks, answer them, schedule timers and emit
   :class:`AppendRecords` effects;
3. fire timers due at ``now_ms`` again -- this is how ``group.initial.rebalance.delay.ms = 0``
   completes a lone consumer's first join inside its own JoinGroup call;
4. deliver the collected replies, then return the effects.

Replies are delivered only after the state changes are finished, so a reply callback may re-enter the
coordinator (a test client sending its SyncGroup from its JoinGroup callback) without seeing a group
half-way through a change. Operations nest: a re-entrant call gets its own reply and effect lists.

Continuations of appends (``AppendRecords.on_complete``) also run as operations, at the
``now_ms`` the shell reports.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from exactly.coordinator.group.api import AppendRecords, AppendResult
from exactly.coordinator.group.group import ClassicGroup
from exactly.coordinator.group.member import GroupMember
from exactly.coordinator.group.offsets import OffsetStore
from exactly.coordinator.group.records import (
    GroupMetadataKey,
    GroupMetadataValue,
    encode_record,
    partition_for,
)
from exactly.coordinator.group.timers import DeadlineQueue

R = TypeVar("R")


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupCoordinatorConfig:
    """Broker settings of the group coordinator, with Kafka's names and defaults."""

    num_partitions: int = 50  # offsets.topic.num.partitions
    initial_rebalance_delay_ms: int = 3000  # group.initial.rebalance.delay.ms
    min_session_timeout_ms: int = 6000  # group.min.session.timeout.ms
    max_session_timeout_ms: int = 1_800_000  # group.max.session.timeout.ms
    new_member_join_timeout_ms: int = 300_000  # group.new.member.join.timeout (internal)
    max_group_size: int = 2**31 - 1  # group.max.size
    offset_metadata_max_bytes: int = 4096  # offset.metadata.max.bytes
    offsets_retention_ms: int = 7 * 24 * 3600 * 1000  # offsets.retention.minutes (10080) in ms
    offsets_retention_check_interval_ms: int = 600_000  # offsets.retention.check.interval.ms


class _Operation:
    __slots__ = ("effects", "now_ms", "replies")

    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms
        self.effects: list[AppendRecords] = []
        self.replies: list[tuple[Callable[[Any], None], Any]] = []


class CoordinatorCore:
    """State and plumbing shared by the membership and offset halves of the coordinator."""

    def __init__(
        self,
        config: GroupCoordinatorConfig | None = None,
        *,
        member_id_factory: Callable[[str], str] | None = None,
    ) -> None:
        self.config = config or GroupCoordinatorConfig()
        self.groups: dict[str, ClassicGroup] = {}
        self.offsets = OffsetStore()
        self.timers = DeadlineQueue()
        self._ops: list[_Operation] = []
        self._member_id_factory = member_id_factory or (lambda prefix: f"{prefix}-{uuid.uuid4()}")

    # -- operations -----------------------------------------------------------------------------

    def _run(self, now_ms: int, body: Callable[[], None]) -> list[AppendRecords]:
        op = _Operation(now_ms)
        self._ops.append(op)
        try:
            self._fire_due()
            body()
            self._fire_due()
        finally:
            self._ops.pop()
        for respond, response in op.replies:
            respond(response)
        return op.effects

    @property
    def _now(self) -> int:
        return self._ops[-1].now_ms

    def _fire_due(self) -> None:
        while (action := self.timers.pop_due(self._now)) is not None:
            action()

    def _reply(self, respond: Callable[[R], None], response: R) -> None:
        """Queue ``response`` for delivery at the end of the current operation."""
        self._ops[-1].replies.append((respond, response))

    def _deferred(self, respond: Callable[[R], None]) -> Callable[[R], None]:
        """Wrap a shell callback so that calling it only queues the reply (see module docstring)."""

        def deliver(response: R) -> None:
            self._reply(respond, response)

        return deliver

    def _emit(
        self,
        partition: int,
        records: list[tuple[bytes, bytes | None]],
        on_done: Callable[[AppendResult], None],
        *,
        producer_id: int = -1,
        producer_epoch: int = -1,
    ) -> None:
        """Emit an append effect whose continuation runs ``on_done`` as its own operation."""

        def complete(result: AppendResult) -> list[AppendRecords]:
            return self._run(result.now_ms, lambda: on_done(result))

        self._ops[-1].effects.append(
            AppendRecords(
                partition=partition,
                records=tuple(records),
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                on_complete=complete,
            )
        )

    def _emit_group_record(
        self, group: ClassicGroup, value: GroupMetadataValue | None, on_done: Callable[[AppendResult], None]
    ) -> None:
        self._emit(
            self.partition_for(group.group_id),
            [encode_record(GroupMetadataKey(group.group_id), value)],
            on_done,
        )

    # -- helpers --------------------------------------------------------------------------------

    def partition_for(self, group_id: str) -> int:
        """The ``__consumer_offsets`` partition of ``group_id`` (FindCoordinator uses the same)."""
        return partition_for(group_id, self.config.num_partitions)

    def _new_member_id(self, prefix: str) -> str:
        return self._member_id_factory(prefix)

    def _unload_group(self, group_id: str) -> ClassicGroup | None:
        """Forget a group and its timers (group tombstone applied, or replaced by a newer record)."""
        existing = self.groups.pop(group_id, None)
        if existing is not None:
            for member_id in list(existing.members) + list(existing.pending_join):
                self.timers.cancel(("heartbeat", group_id, member_id))
            for kind in ("join", "sync"):
                self.timers.cancel((kind, group_id))
        return existing

    def _is_current(self, group: ClassicGroup) -> bool:
        """Timers and continuations capture a group object; ignore them if it was replaced/removed."""
        return self.groups.get(group.group_id) is group

    def _schedule_heartbeat(
        self, group: ClassicGroup, member: GroupMember, timeout_ms: int | None = None
    ) -> None:
        delay = member.session_timeout_ms if timeout_ms is None else timeout_ms
        member_id = member.member_id
        self.timers.schedule(
            ("heartbeat", group.group_id, member_id),
            self._now + delay,
            lambda: self._on_heartbeat_expired(group, member_id),
        )

    def _cancel_heartbeat(self, group: ClassicGroup, member_id: str) -> None:
        self.timers.cancel(("heartbeat", group.group_id, member_id))

    def _on_heartbeat_expired(self, group: ClassicGroup, member_id: str) -> None:
        raise NotImplementedError  # provided by the membership half
