"""The group coordinator's configuration and its operation context (writes, replies, timers).

Operations
----------
Every public call that can change state runs as one *operation* (:meth:`Operations.run`):

1. fire the timers already due at ``now_ms`` (a session that expired before this request arrived is
   expired first, as Kafka's timer thread would have done);
2. run the request's logic, which may park replies, answer them, schedule timers and emit
   :class:`~exactly.coordinator.result.Write` s;
3. fire timers due at ``now_ms`` again -- this is how ``group.initial.rebalance.delay.ms = 0``
   completes a lone consumer's first join inside its own JoinGroup call;
4. return the collected writes and replies as one
   :class:`~exactly.coordinator.result.CoordinatorResult`.

Replies are data addressed by the token each request came with, so answering a parked request
from a later operation (a rebalance completed by another member's JoinGroup, or by a timer) never
re-enters the coordinator. Operations nest (a write's completion runs as its own operation while
the runtime drives the result): each gets its own write and reply lists.

The parts of the coordinator (membership, rebalance, offsets, expiry) share one
:class:`Operations`; it is the only state they share besides the groups the membership part owns.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Never, TypeVar

from exactly.coordinator.group.records import (
    GroupMetadataKey,
    GroupMetadataValue,
    encode_record,
    partition_for,
)
from exactly.coordinator.group.timers import DeadlineQueue
from exactly.coordinator.result import (
    AppendOutcome,
    CoordinatorResult,
    Record,
    Reply,
    RequestToken,
    Write,
)

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
    __slots__ = ("now_ms", "replies", "writes")

    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms
        self.writes: list[Write] = []
        self.replies: list[Reply] = []


class Operations:
    """The context every coordinator operation runs in.

    Owns the stack of running operations (their clock, writes and replies) and the keyed timers
    (:class:`DeadlineQueue`). Lives as long as its coordinator; holds no group state.
    """

    def __init__(self, config: GroupCoordinatorConfig) -> None:
        self.config = config
        self.timers = DeadlineQueue()
        self._stack: list[_Operation] = []

    def run(self, now_ms: int, body: Callable[[], None]) -> CoordinatorResult[Never]:
        """Run ``body`` as one operation at ``now_ms`` (see the module docstring)."""
        op = _Operation(now_ms)
        self._stack.append(op)
        try:
            self._fire_due()
            body()
            self._fire_due()
        finally:
            self._stack.pop()
        return CoordinatorResult(writes=tuple(op.writes), replies=tuple(op.replies))

    @property
    def now(self) -> int:
        return self._stack[-1].now_ms

    @property
    def write_count(self) -> int:
        """Writes the current operation has emitted so far."""
        return len(self._stack[-1].writes)

    def _fire_due(self) -> None:
        while (action := self.timers.pop_due(self.now)) is not None:
            action()

    def reply(self, token: RequestToken, response: Any) -> None:
        """Answer the request ``token`` at the end of the current operation."""
        self._stack[-1].replies.append(Reply(token, response))

    def deferred(self, token: RequestToken) -> Callable[[R], None]:
        """A reply callback to park on a member: calling it answers ``token`` from whatever
        operation is running then."""

        def deliver(response: R) -> None:
            self.reply(token, response)

        return deliver

    def emit(
        self,
        partition: int,
        records: list[Record],
        on_done: Callable[[AppendOutcome], None],
        *,
        producer_id: int = -1,
        producer_epoch: int = -1,
        describe: str = "",
    ) -> None:
        """Emit a write whose completion runs ``on_done`` as its own operation."""

        def complete(outcome: AppendOutcome) -> CoordinatorResult[Never]:
            return self.run(outcome.now_ms, lambda: on_done(outcome))

        self._stack[-1].writes.append(
            Write(
                partition=partition,
                records=tuple(records),
                complete=complete,
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                describe=describe,
            )
        )

    def emit_group_record(
        self, group_id: str, value: GroupMetadataValue | None, on_done: Callable[[AppendOutcome], None]
    ) -> None:
        self.emit(
            self.partition_for(group_id),
            [encode_record(GroupMetadataKey(group_id), value)],
            on_done,
            describe=f"group {group_id}",
        )

    def partition_for(self, group_id: str) -> int:
        """The ``__consumer_offsets`` partition of ``group_id`` (FindCoordinator uses the same)."""
        return partition_for(group_id, self.config.num_partitions)
