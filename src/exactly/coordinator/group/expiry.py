"""Offset retention and the removal of empty groups (Kafka's periodic group-metadata cleanup).

Theory of operation
-------------------
Committed offsets and empty groups would otherwise live forever. Every
``offsets.retention.check.interval.ms`` the runtime calls
:meth:`Expiry.cleanup_group_metadata`, which does what Kafka's ``cleanupGroupMetadata`` does
(``OffsetMetadataManager.cleanupExpiredOffsets`` + ``GroupMetadataManager.maybeDeleteGroup``):

1. *prepare*: for each group pick the offsets whose retention has passed
   (:func:`plan_group_cleanup`) and decide whether the group itself goes (Empty, no offset left, no
   open transaction). Nothing changes in memory yet.
2. *persist*: one :class:`~exactly.coordinator.result.Write` per ``__consumer_offsets``
   partition carries a tombstone (null value) for every expired ``OffsetCommitKey`` and, after them,
   one for the ``GroupMetadataKey`` of each group that goes.
3. *complete*: only when that append succeeded are the tombstones applied, through the same store
   operations replay uses, so a restart that replays the log arrives at the same state. A failed
   append changes nothing; the next run tries again (Kafka also just retries next cycle).

When an offset expires (KIP-211, and KIP-496 for the Stable case) -- :func:`expiration_condition`:

- group with a protocol type, Empty: every offset, ``retention`` after the group became Empty (its
  ``current_state_timestamp``). We take ``max(empty time, commit time)`` so an offset committed into
  an already Empty group (admin reset, manual assignment) also gets a full retention period; Kafka
  uses the empty time alone. Without a state timestamp (old records) the commit time is the base.
- ``consumer`` group, Stable: offsets of topics no member subscribes to, ``retention`` after their
  commit; subscribed topics never expire. If a subscription cannot be parsed nothing expires.
- group without a protocol type (a "simple" group: offsets only, no members ever): each offset
  ``retention`` after its own commit.
- any other state (PreparingRebalance, CompletingRebalance, Stable non-consumer): nothing expires.
- an offset committed with an explicit expire timestamp (OffsetCommit v2-v4 ``retention_time``,
  value record v1) expires at that timestamp instead, when its group's condition applies.
- a partition with a pending transactional offset keeps its committed offset; pending offsets are
  never expired, and a group with an open transaction is never removed.

Invariants:

- the coordinator's state changes only in the append's continuation (prepare -> persist -> complete);
- tombstones of one group are on the group's own partition, offsets before the group record, so a
  replay drops the offsets first and the group last, like the live path;
- a group is removed only if, when the append completes, it is still the same object, still Empty
  with no pending member id and no offset or open transaction left; it goes Empty -> Dead (the state
  table) and then leaves ``groups``, so captured references see Dead. With the synchronous runtime
  nothing can run between prepare and complete; the re-check only guards a runtime that interleaves.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass
from typing import Never

from exactly.coordinator.group.api import CleanupStats
from exactly.coordinator.group.core import GroupCoordinatorConfig, Operations
from exactly.coordinator.group.group import CONSUMER_PROTOCOL_TYPE, ClassicGroup
from exactly.coordinator.group.membership import Membership
from exactly.coordinator.group.offsets import CommittedOffset, OffsetStore, TopicPartitionKey
from exactly.coordinator.group.records import GroupMetadataKey, OffsetCommitKey, encode_record
from exactly.coordinator.group.state import GroupState
from exactly.coordinator.result import AppendOutcome, CoordinatorResult, RequestToken

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


class SubscriptionParseError(ValueError):
    """A member's metadata is not a ConsumerProtocolSubscription."""


def subscribed_topics(metadata: bytes) -> frozenset[str]:
    """The topics of a ``consumer`` protocol subscription (any version).

    Layout: ``int16 version`` then ``topics: [string]`` (int32 count, int16-length UTF-8 strings)
    first in every version; what follows (user data, owned partitions, ...) is not needed. Kafka
    reads it the same way (as version 0) and gives up on the group's subscription if it fails.
    """
    try:
        (version,) = _I16.unpack_from(metadata, 0)
        if version < 0:
            raise SubscriptionParseError(f"negative subscription version {version}")
        (count,) = _I32.unpack_from(metadata, 2)
        if count < 0:
            raise SubscriptionParseError("null topic array")
        pos = 6
        topics: set[str] = set()
        for _ in range(count):
            (length,) = _I16.unpack_from(metadata, pos)
            pos += 2
            if length < 0 or pos + length > len(metadata):
                raise SubscriptionParseError("truncated topic name")
            topics.add(metadata[pos : pos + length].decode("utf-8"))
            pos += length
    except (struct.error, UnicodeDecodeError) as exc:
        raise SubscriptionParseError(str(exc)) from exc
    return frozenset(topics)


def group_subscribed_topics(group: ClassicGroup) -> frozenset[str] | None:
    """Union of the members' subscribed topics, or None when unknown (Kafka's ``subscribedTopics``)."""
    if group.protocol_type != CONSUMER_PROTOCOL_TYPE:
        return None
    if not group.members:
        return frozenset()
    if group.protocol_name is None:
        return None
    topics: set[str] = set()
    try:
        for member in group.members.values():
            topics |= subscribed_topics(member.metadata(group.protocol_name))
    except (SubscriptionParseError, KeyError):
        return None
    return frozenset(topics)


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpirationCondition:
    """How the offsets of one group age (Kafka's ``OffsetExpirationCondition``).

    ``empty_since_ms`` is the time an Empty group became Empty (-1: unknown, use the commit time);
    None means the base is each offset's own commit time. Offsets of ``subscribed`` topics never
    expire.
    """

    empty_since_ms: int | None = None
    subscribed: frozenset[str] = frozenset()

    def base_timestamp(self, entry: CommittedOffset) -> int:
        if self.empty_since_ms is None or self.empty_since_ms < 0:
            return entry.commit_timestamp
        return max(self.empty_since_ms, entry.commit_timestamp)

    def is_expired(self, topic: str, entry: CommittedOffset, now_ms: int, retention_ms: int) -> bool:
        if topic in self.subscribed:
            return False
        if entry.expire_timestamp >= 0:  # explicit per-commit expiry (OffsetCommit v2-v4) wins
            return now_ms >= entry.expire_timestamp
        return now_ms - self.base_timestamp(entry) >= retention_ms


def expiration_condition(group: ClassicGroup) -> ExpirationCondition | None:
    """The condition for ``group`` in its current state, or None if none of its offsets may expire."""
    if group.protocol_type is None:
        return ExpirationCondition()  # simple group: per commit
    if group.is_in(GroupState.EMPTY):
        return ExpirationCondition(empty_since_ms=group.state_timestamp_ms)
    if group.is_in(GroupState.STABLE):
        topics = group_subscribed_topics(group)
        if topics is not None:
            return ExpirationCondition(subscribed=topics)
    return None


@dataclass(frozen=True, slots=True)
class GroupCleanup:
    """What one cleanup run tombstones for one group, decided before anything is written."""

    group_id: str
    expired: tuple[TopicPartitionKey, ...]
    remove_group: bool

    @property
    def empty(self) -> bool:
        return not self.expired and not self.remove_group


def plan_group_cleanup(
    group: ClassicGroup,
    committed: Mapping[TopicPartitionKey, CommittedOffset],
    open_partitions: Set[TopicPartitionKey],
    now_ms: int,
    retention_ms: int,
) -> GroupCleanup:
    """Expired offsets of ``group`` and whether the group goes too (pure; nothing is changed)."""
    condition = expiration_condition(group)
    expired: tuple[TopicPartitionKey, ...] = ()
    if condition is not None:
        expired = tuple(
            tp
            for tp, entry in sorted(committed.items())
            if tp not in open_partitions and condition.is_expired(tp[0], entry, now_ms, retention_ms)
        )
    remove = (
        group.is_in(GroupState.EMPTY)
        and not group.pending_join
        and not open_partitions
        and len(expired) == len(committed)
    )
    return GroupCleanup(group.group_id, expired, remove)


class _CleanupRun:
    """Totals of one cleanup run; answered when the last partition's append completed."""

    __slots__ = ("failed", "groups", "offsets", "outstanding")

    def __init__(self, outstanding: int) -> None:
        self.outstanding = outstanding
        self.offsets = 0
        self.groups = 0
        self.failed = 0

    def stats(self) -> CleanupStats:
        return CleanupStats(
            offsets_removed=self.offsets, groups_removed=self.groups, failed_appends=self.failed
        )


class Expiry:
    """Offset retention and the removal of empty groups, run on demand.

    Owns no state between runs (a run's totals live in its ``_CleanupRun`` until its last write
    completes): it plans from the membership part's groups and the offset store and applies its
    tombstones to them.
    """

    def __init__(
        self, config: GroupCoordinatorConfig, ops: Operations, membership: Membership, store: OffsetStore
    ) -> None:
        self.config = config
        self._ops = ops
        self._membership = membership
        self._store = store

    def cleanup_group_metadata(self, now_ms: int, token: RequestToken) -> CoordinatorResult[Never]:
        """Expire offsets and remove dead groups; ``token`` is answered with the totals
        (:class:`CleanupStats`) once the writes completed."""

        def body() -> None:
            by_partition: dict[int, list[tuple[GroupCleanup, ClassicGroup]]] = {}
            retention = self.config.offsets_retention_ms
            for group in self._membership.groups.values():
                if group.is_in(GroupState.DEAD):
                    continue
                plan = plan_group_cleanup(
                    group,
                    self._store.committed(group.group_id),
                    self._store.open_partitions(group.group_id),
                    self._ops.now,
                    retention,
                )
                if not plan.empty:
                    by_partition.setdefault(self._ops.partition_for(group.group_id), []).append((plan, group))
            run = _CleanupRun(len(by_partition))
            for partition, plans in sorted(by_partition.items()):
                records: list[tuple[bytes, bytes | None]] = []
                for plan, _group in plans:
                    for topic, p in plan.expired:
                        records.append(encode_record(OffsetCommitKey(plan.group_id, topic, p), None))
                    if plan.remove_group:
                        records.append(encode_record(GroupMetadataKey(plan.group_id), None))
                self._ops.emit(
                    partition, records, self._cleanup_done(plans, run, token), describe="offset retention"
                )
            if not by_partition:
                self._ops.reply(token, run.stats())

        return self._ops.run(now_ms, body)

    def _cleanup_done(
        self,
        plans: list[tuple[GroupCleanup, ClassicGroup]],
        run: _CleanupRun,
        token: RequestToken,
    ) -> Callable[[AppendOutcome], None]:
        def done(result: AppendOutcome) -> None:
            if not result.ok:
                run.failed += 1
            else:
                record_offset = result.base_offset
                for plan, group in plans:
                    for tp in plan.expired:
                        if self._store.expire(plan.group_id, tp, tombstone_offset=record_offset):
                            run.offsets += 1
                        record_offset += 1
                    if plan.remove_group:
                        if self._remove_expired_group(group):
                            run.groups += 1
                        record_offset += 1
            run.outstanding -= 1
            if run.outstanding == 0:
                self._ops.reply(token, run.stats())

        return done

    def _remove_expired_group(self, group: ClassicGroup) -> bool:
        """Apply a group tombstone of the cleanup: Empty -> Dead, then out of ``groups``."""
        if (
            not self._membership.is_current(group)
            or not group.is_in(GroupState.EMPTY)
            or group.pending_join
            or self._store.partitions_with_state(group.group_id)
        ):
            return False  # revived between prepare and complete (see the module docstring)
        group.transition_to(GroupState.DEAD, self._ops.now)
        self._membership.unload_group(group.group_id)
        return True
