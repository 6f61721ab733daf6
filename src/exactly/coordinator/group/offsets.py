"""Committed and pending (transactional) offsets, rebuilt only by replaying records.

Theory of operation
-------------------
Every offset change is a record of ``__consumer_offsets``; :meth:`OffsetStore.replay` applies one, and
that is the only way the store changes (Kafka's ``OffsetMetadataManager.replay``; :meth:`OffsetStore.expire`
is the same tombstone rule, applied live by the retention cleanup):

- a record from a non-transactional batch (``producer_id == -1``) sets the committed offset;
- a record from a transactional batch (TxnOffsetCommit) is kept *pending* under its producer id and
  marks the partition as having an open transaction;
- a tombstone deletes the committed offset and every pending offset of that partition;
- a COMMIT marker for a producer (:meth:`replay_end_transaction`) moves its pending offsets into the
  committed store, an ABORT marker drops them.

Staged transactional offsets (Kafka's ``prepareTxnOffsetCommit``): a TxnOffsetCommit's offsets are
staged (:meth:`OffsetStore.stage`) *before* its append, so a ``require_stable`` OffsetFetch answers
UNSTABLE_OFFSET_COMMIT while the write waits for the ISR. A staged offset is never committed and
never fetched as a value; the append's completion turns it into a pending offset
(:meth:`OffsetStore.complete_staged`, Kafka's ``onTxnOffsetCommitAppend``) only if it is still
staged, a failed append drops it (:meth:`OffsetStore.unstage`, ``failPendingTxnOffsetCommit``). A
marker of the producer drops its staged offsets (they are not in the log before the marker as far as
this store knows), and the late completion of such an offset is then ignored, as Kafka does: an
aborted offset can never resurface as pending and be committed by the producer's next COMMIT.
The runtime applies markers under its operation lock, so in practice a marker never overtakes an
append; staging is what OffsetFetch (answered outside that lock) sees.

Replay therefore needs each record's log offset and producer id, and the markers: the live path
(after an append completes) and startup recovery call the same methods with the same arguments, so
recovery rebuilds exactly the live state.

Why record offsets are kept: a transactional commit may be decided after a later plain commit to the
same partition. Like Kafka, the committed value is the one written *last in the log*: a pending
offset replaces the committed one at COMMIT only if its record offset is larger. That also keeps the
result right after log compaction.

A marker lands on one ``__consumer_offsets`` partition; a producer's pending offsets can span groups
on several partitions, so ``replay_end_transaction`` takes a predicate selecting the groups of the
marker's partition and leaves the rest pending until their own marker arrives.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from kio.schema.errors import ErrorCode

from exactly.coordinator.group.api import (
    FetchGroupResult,
    FetchPartitionResult,
    FetchTopic,
    FetchTopicResult,
)
from exactly.coordinator.group.group import ClassicGroup
from exactly.coordinator.group.records import OffsetCommitKey, OffsetCommitValue
from exactly.coordinator.group.state import GroupState
from exactly.frozen import quick_init

TopicPartitionKey = tuple[str, int]


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class CommittedOffset:
    """An offset as stored, with the log offset of the record that carried it."""

    offset: int
    leader_epoch: int = -1
    metadata: str = ""
    commit_timestamp: int = -1
    expire_timestamp: int = -1
    record_offset: int = -1

    @classmethod
    def from_value(cls, value: OffsetCommitValue, record_offset: int) -> CommittedOffset:
        return cls(
            offset=value.offset,
            leader_epoch=value.leader_epoch,
            metadata=value.metadata,
            commit_timestamp=value.commit_timestamp,
            expire_timestamp=value.expire_timestamp,
            record_offset=record_offset,
        )


class OffsetStore:
    """Committed offsets per group and pending transactional offsets per producer id.

    Invariant: ``_open[group][tp]`` is exactly the set of producer ids with a pending or a staged
    offset for ``(group, tp)``; no map level is ever left empty. Lifecycle: created empty with its
    coordinator (owned by its ``OffsetManager``), filled by replay, emptied by :meth:`clear`.
    """

    __slots__ = ("_committed", "_open", "_pending", "_staged")

    def __init__(self) -> None:
        self._committed: dict[str, dict[TopicPartitionKey, CommittedOffset]] = {}
        self._pending: dict[int, dict[str, dict[TopicPartitionKey, CommittedOffset]]] = {}
        self._staged: dict[int, dict[str, dict[TopicPartitionKey, CommittedOffset]]] = {}
        self._open: dict[str, dict[TopicPartitionKey, set[int]]] = {}

    def has_transaction(self, producer_id: int) -> bool:
        """Whether ``producer_id`` has staged or pending offsets: a marker of any other producer
        changes nothing (most markers a load replays, once their offsets were compacted away)."""
        return producer_id in self._pending or producer_id in self._staged

    def clear(self) -> None:
        """Forget everything (the coordinator stopped owning its partitions)."""
        self._committed.clear()
        self._pending.clear()
        self._staged.clear()
        self._open.clear()

    # -- staged transactional offsets (prepare -> persist -> complete) --------------------------

    def stage(self, producer_id: int, group_id: str, tp: TopicPartitionKey, entry: CommittedOffset) -> None:
        """A TxnOffsetCommit of ``producer_id`` is about to append ``entry`` (prepare)."""
        self._staged.setdefault(producer_id, {}).setdefault(group_id, {})[tp] = entry
        self._open.setdefault(group_id, {}).setdefault(tp, set()).add(producer_id)

    def unstage(self, producer_id: int, group_id: str, tp: TopicPartitionKey, entry: CommittedOffset) -> None:
        """The append of a staged ``entry`` failed: drop it if it is still the one staged."""
        if self._staged.get(producer_id, {}).get(group_id, {}).get(tp) == entry:
            _remove(self._staged, producer_id, group_id, tp)
            self._close_if_settled(group_id, tp, producer_id)

    def complete_staged(
        self,
        producer_id: int,
        group_id: str,
        tp: TopicPartitionKey,
        entry: CommittedOffset,
        *,
        record_offset: int,
    ) -> bool:
        """The append of a staged ``entry`` succeeded at ``record_offset``: it becomes pending,
        exactly as :meth:`replay` of that record would make it -- unless a marker (or a tombstone)
        settled the producer's offsets in between, in which case it is ignored (Kafka's
        ``onTxnOffsetCommitAppend``). Returns whether it became pending."""
        if self._staged.get(producer_id, {}).get(group_id, {}).get(tp) != entry:
            return False
        _remove(self._staged, producer_id, group_id, tp)
        appended = replace(entry, record_offset=record_offset)
        self._pending.setdefault(producer_id, {}).setdefault(group_id, {})[tp] = appended
        return True

    # -- replay ---------------------------------------------------------------------------------

    def replay(
        self, key: OffsetCommitKey, value: OffsetCommitValue | None, *, record_offset: int, producer_id: int
    ) -> None:
        tp = (key.topic, key.partition)
        if value is not None:
            entry = CommittedOffset(  # from_value inlined: a load replays every offset record
                offset=value.offset,
                leader_epoch=value.leader_epoch,
                metadata=value.metadata,
                commit_timestamp=value.commit_timestamp,
                expire_timestamp=value.expire_timestamp,
                record_offset=record_offset,
            )
            if producer_id < 0:
                self._committed.setdefault(key.group, {})[tp] = entry
            else:
                self._pending.setdefault(producer_id, {}).setdefault(key.group, {})[tp] = entry
                self._open.setdefault(key.group, {}).setdefault(tp, set()).add(producer_id)
            return
        self._remove_committed(key.group, tp)
        by_tp = self._open.get(key.group)
        producers = by_tp.pop(tp, set()) if by_tp is not None else set()
        if by_tp is not None and not by_tp:
            del self._open[key.group]
        for pid in producers:
            _remove(self._pending, pid, key.group, tp)
            _remove(self._staged, pid, key.group, tp)

    def replay_end_transaction(
        self, producer_id: int, commit: bool, group_filter: Callable[[str], bool] | None = None
    ) -> None:
        """Apply a COMMIT (``commit=True``) or ABORT marker of ``producer_id``.

        Staged (not yet appended) offsets of the selected groups are dropped whatever the marker:
        their records are not known to be in the log before it (Kafka throws for a COMMIT over an
        unappended offset; the runtime's lock makes that unreachable here), and their late
        completion is ignored (:meth:`complete_staged`).
        """
        staged = self._staged.get(producer_id)
        if staged is not None:
            for group_id in [g for g in staged if group_filter is None or group_filter(g)]:
                for tp in staged.pop(group_id):
                    self._close_if_settled(group_id, tp, producer_id)
            if not staged:
                del self._staged[producer_id]
        pending = self._pending.get(producer_id)
        if pending is None:
            return
        groups = list(pending) if group_filter is None else [g for g in pending if group_filter(g)]
        for group_id in groups:
            offsets = pending.pop(group_id)
            # What _close_if_settled does per partition, inlined (a load applies thousands of
            # markers): the producer's offsets of this group are neither pending (just popped)
            # nor staged (the group's staged ones went above) any more, so it leaves ``_open``.
            by_tp = self._open.get(group_id)
            committed = self._committed.get(group_id)
            for tp, entry in offsets.items():
                if by_tp is not None:
                    producers = by_tp.get(tp)
                    if producers is not None:
                        producers.discard(producer_id)
                        if not producers:
                            del by_tp[tp]
                if commit:
                    existing = None if committed is None else committed.get(tp)
                    if existing is None or entry.record_offset > existing.record_offset:
                        if committed is None:
                            committed = self._committed[group_id] = {}
                        committed[tp] = entry
            if by_tp is not None and not by_tp:
                del self._open[group_id]
        if not pending:
            del self._pending[producer_id]

    def expire(self, group_id: str, tp: TopicPartitionKey, *, tombstone_offset: int) -> bool:
        """Apply an expiry tombstone written at ``tombstone_offset``; True if an offset went.

        Like :meth:`replay` of that tombstone, except that an entry carried by a record *after* the
        tombstone survives -- exactly what a log-order replay at startup gives, even if a runtime
        completed a later commit first. Returns whether a committed offset was removed.
        """
        removed = False
        entry = self._committed.get(group_id, {}).get(tp)
        if entry is not None and entry.record_offset < tombstone_offset:
            self._remove_committed(group_id, tp)
            removed = True
        for pid in sorted(self._open.get(group_id, {}).get(tp, set())):
            pending = self._pending.get(pid, {}).get(group_id, {}).get(tp)
            if pending is not None and pending.record_offset < tombstone_offset:
                _remove(self._pending, pid, group_id, tp)
                self._close_if_settled(group_id, tp, pid)
        return removed

    def _remove_committed(self, group_id: str, tp: TopicPartitionKey) -> None:
        by_tp = self._committed.get(group_id)
        if by_tp is not None:
            by_tp.pop(tp, None)
            if not by_tp:
                del self._committed[group_id]

    def _close_if_settled(self, group_id: str, tp: TopicPartitionKey, producer_id: int) -> None:
        """Keep ``_open`` exact: drop ``producer_id`` for ``(group, tp)`` once it has neither a
        pending nor a staged offset there."""
        for by_pid in (self._pending, self._staged):
            if tp in by_pid.get(producer_id, {}).get(group_id, {}):
                return
        by_tp = self._open.get(group_id)
        if by_tp is None or tp not in by_tp:
            return
        by_tp[tp].discard(producer_id)
        if not by_tp[tp]:
            del by_tp[tp]
        if not by_tp:
            del self._open[group_id]

    # -- queries --------------------------------------------------------------------------------

    def committed(self, group_id: str) -> dict[TopicPartitionKey, CommittedOffset]:
        return dict(self._committed.get(group_id, {}))

    def pending(self, producer_id: int) -> dict[str, dict[TopicPartitionKey, CommittedOffset]]:
        return {g: dict(tps) for g, tps in self._pending.get(producer_id, {}).items()}

    def pending_producers(self) -> list[int]:
        return sorted(self._pending)

    def has_pending(self, group_id: str, topic: str | None = None, partition: int | None = None) -> bool:
        by_tp = self._open.get(group_id)
        if by_tp is None:
            return False
        return topic is None or (topic, partition if partition is not None else -1) in by_tp

    def open_partitions(self, group_id: str) -> frozenset[TopicPartitionKey]:
        """Partitions of ``group_id`` with a pending transactional offset (never expired)."""
        return frozenset(self._open.get(group_id, {}))

    def partitions_with_state(self, group_id: str) -> list[TopicPartitionKey]:
        """Every partition with a committed or pending offset: what DeleteGroups tombstones."""
        keys = set(self._committed.get(group_id, {})) | set(self._open.get(group_id, {}))
        return sorted(keys)

    def fetch(
        self, group_id: str, topics: Iterable[FetchTopic] | None, require_stable: bool
    ) -> tuple[FetchTopicResult, ...]:
        """OffsetFetch for one existing group; ``topics=None`` lists every committed offset."""
        committed = self._committed.get(group_id, {})
        open_tps = self._open.get(group_id, {}) if require_stable else {}

        def one(topic: str, partition: int) -> FetchPartitionResult:
            if (topic, partition) in open_tps:
                return FetchPartitionResult(
                    partition_index=partition, error_code=ErrorCode.unstable_offset_commit
                )
            entry = committed.get((topic, partition))
            if entry is None:
                return FetchPartitionResult(partition_index=partition)
            return FetchPartitionResult(
                partition_index=partition,
                committed_offset=entry.offset,
                committed_leader_epoch=entry.leader_epoch,
                metadata=entry.metadata,
            )

        if topics is None:
            by_topic: dict[str, list[int]] = {}
            for topic, partition in sorted(committed):
                by_topic.setdefault(topic, []).append(partition)
            return tuple(
                FetchTopicResult(topic, tuple(one(topic, p) for p in parts))
                for topic, parts in by_topic.items()
            )
        return tuple(
            FetchTopicResult(t.name, tuple(one(t.name, p) for p in t.partition_indexes)) for t in topics
        )


def _remove(
    by_pid: dict[int, dict[str, dict[TopicPartitionKey, CommittedOffset]]],
    producer_id: int,
    group_id: str,
    tp: TopicPartitionKey,
) -> None:
    """Remove one entry of a producer -> group -> partition map, leaving no level empty."""
    by_group = by_pid.get(producer_id)
    if by_group is None:
        return
    by_tp = by_group.get(group_id)
    if by_tp is not None:
        by_tp.pop(tp, None)
        if not by_tp:
            del by_group[group_id]
    if not by_group:
        del by_pid[producer_id]


def unknown_group_fetch(group_id: str, topics: Iterable[FetchTopic] | None) -> FetchGroupResult:
    """OffsetFetch for a group that does not exist: -1 everywhere, no error (Kafka behaviour)."""
    if topics is None:
        return FetchGroupResult(group_id=group_id)
    return FetchGroupResult(
        group_id=group_id,
        topics=tuple(
            FetchTopicResult(
                t.name, tuple(FetchPartitionResult(partition_index=p) for p in t.partition_indexes)
            )
            for t in topics
        ),
    )


def validate_offset_commit(
    group: ClassicGroup | None,
    *,
    member_id: str,
    group_instance_id: str | None,
    generation_id: int,
    transactional: bool,
    api_version: int = 8,
) -> ErrorCode:
    """Kafka's checks for OffsetCommit (``transactional=False``) and TxnOffsetCommit (KIP-447).

    - no group: generation -1 creates a simple group (on replay); otherwise ILLEGAL_GENERATION
      (GROUP_ID_NOT_FOUND for OffsetCommit v9+).
    - Dead group: COORDINATOR_NOT_AVAILABLE.
    - generation -1 on an Empty group: accepted (admin client, manual assignment).
    - any of generation/member id/instance id given: the member must exist (UNKNOWN_MEMBER_ID),
      a static id must map to it (FENCED_INSTANCE_ID) and the generation must match
      (ILLEGAL_GENERATION) -- the KIP-447 zombie fence for transactional commits.
    - nothing given on a non-empty group: UNKNOWN_MEMBER_ID, except for transactional commits (old
      producers send no member data).
    - OffsetCommit during CompletingRebalance: REBALANCE_IN_PROGRESS (not for transactional ones).
    """
    if group is None:
        if generation_id < 0:
            return ErrorCode.none
        if not transactional and api_version >= 9:
            return ErrorCode.group_id_not_found
        return ErrorCode.illegal_generation
    if group.state is GroupState.DEAD:
        return ErrorCode.coordinator_not_available
    if generation_id < 0 and group.state is GroupState.EMPTY:
        return ErrorCode.none
    if generation_id >= 0 or member_id or group_instance_id is not None:
        error = group.validate_member(member_id, group_instance_id)
        if error is not ErrorCode.none:
            return error
        if generation_id != group.generation:
            return ErrorCode.illegal_generation
    elif not transactional and group.state is not GroupState.EMPTY:
        return ErrorCode.unknown_member_id
    if not transactional and group.state is GroupState.COMPLETING_REBALANCE:
        return ErrorCode.rebalance_in_progress
    return ErrorCode.none


def map_append_error(error: ErrorCode, *, offsets: bool) -> ErrorCode:
    """Translate a failed ``__consumer_offsets`` append into what group clients understand."""
    if error in (
        ErrorCode.unknown_topic_or_partition,
        ErrorCode.not_enough_replicas,
        ErrorCode.not_enough_replicas_after_append,
        ErrorCode.request_timed_out,
    ):
        return ErrorCode.coordinator_not_available
    if error in (ErrorCode.not_leader_or_follower, ErrorCode.kafka_storage_error):
        return ErrorCode.not_coordinator
    if error in (ErrorCode.message_too_large, ErrorCode.record_list_too_large, ErrorCode.invalid_fetch_size):
        return ErrorCode.invalid_commit_offset_size if offsets else ErrorCode.unknown_server_error
    return error
