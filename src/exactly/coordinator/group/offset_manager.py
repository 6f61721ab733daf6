"""OffsetCommit, TxnOffsetCommit and OffsetFetch (Kafka's ``OffsetMetadataManager``).

prepare -> persist -> complete: a commit is validated and encoded (prepare), appended as one
write to the group's ``__consumer_offsets`` partition -- transactional for TxnOffsetCommit
(persist) -- and only its completion applies the records, through :meth:`OffsetManager.replay`,
the same call startup replay makes (complete). A TxnOffsetCommit's offsets are staged in the store
before the append (so a ``require_stable`` OffsetFetch answers UNSTABLE_OFFSET_COMMIT while the write
waits for its acks, as Kafka's ``prepareTxnOffsetCommit``), become pending when the append succeeds
(dropped if it fails) and stay pending until the COMMIT/ABORT marker reaches the partition
(:meth:`OffsetManager.replay_end_transaction`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Never

from kio.schema.errors import ErrorCode

from exactly.coordinator.group.api import (
    CommitPartitionResult,
    CommitTopic,
    CommitTopicResult,
    FetchGroup,
    FetchGroupResult,
    OffsetCommitRequestData,
    OffsetCommitResponseData,
    TxnOffsetCommitRequestData,
)
from exactly.coordinator.group.core import GroupCoordinatorConfig, Operations
from exactly.coordinator.group.membership import Membership
from exactly.coordinator.group.offsets import (
    CommittedOffset,
    OffsetStore,
    TopicPartitionKey,
    map_append_error,
    unknown_group_fetch,
    validate_offset_commit,
)
from exactly.coordinator.group.records import OffsetCommitKey, OffsetCommitValue, encode_record
from exactly.coordinator.group.state import GroupState
from exactly.coordinator.result import AppendOutcome, CoordinatorResult, RequestToken

DEFAULT_RETENTION_TIME_MS = -1  # OffsetCommitRequest.DEFAULT_RETENTION_TIME: the broker's retention


class OffsetManager:
    """Committed and pending offsets of every group, and the requests that read and write them.

    Owns the :class:`OffsetStore` (``store``), changed only by :meth:`replay` /
    :meth:`replay_end_transaction` (and the retention cleanup's tombstones). Reads the membership
    part's groups to validate commits. Created empty with its coordinator, filled by replay.
    """

    def __init__(self, config: GroupCoordinatorConfig, ops: Operations, membership: Membership) -> None:
        self.config = config
        self.store = OffsetStore()
        self._ops = ops
        self._membership = membership

    # -- OffsetCommit / TxnOffsetCommit ---------------------------------------------------------

    def offset_commit(
        self, request: OffsetCommitRequestData, now_ms: int, token: RequestToken
    ) -> CoordinatorResult[Never]:
        """OffsetCommit: validate, append, and make the offsets visible when the append completes."""

        def body() -> None:
            group = self._membership.groups.get(request.group_id)
            if not request.group_id:
                error = ErrorCode.invalid_group_id
            else:
                error = validate_offset_commit(
                    group,
                    member_id=request.member_id,
                    group_instance_id=request.group_instance_id,
                    generation_id=request.generation_id,
                    transactional=False,
                    api_version=request.api_version,
                )
            if error is ErrorCode.none and group is not None:
                member = group.members.get(request.member_id)
                if member is not None and group.is_in(GroupState.STABLE, GroupState.PREPARING_REBALANCE):
                    self._membership.rebalance.schedule_heartbeat(
                        group, member
                    )  # a commit also proves liveness
            # KIP-211: only v2-v4 carry a retention; anything but -1 (the default) fixes the expiry.
            retention = request.retention_time_ms
            expire = -1 if retention == DEFAULT_RETENTION_TIME_MS else now_ms + retention
            self._commit(request.group_id, request.topics, error, expire, -1, -1, token)

        return self._ops.run(now_ms, body)

    def txn_offset_commit(
        self, request: TxnOffsetCommitRequestData, now_ms: int, token: RequestToken
    ) -> CoordinatorResult[Never]:
        """TxnOffsetCommit: append transactionally; the offsets stay pending until the marker."""

        def body() -> None:
            error = validate_offset_commit(
                self._membership.groups.get(request.group_id),
                member_id=request.member_id,
                group_instance_id=request.group_instance_id,
                generation_id=request.generation_id,
                transactional=True,
            )
            if not request.group_id:
                error = ErrorCode.invalid_group_id
            self._commit(
                request.group_id,
                request.topics,
                error,
                -1,
                request.producer_id,
                request.producer_epoch,
                token,
            )

        return self._ops.run(now_ms, body)

    def _commit(
        self,
        group_id: str,
        topics: tuple[CommitTopic, ...],
        error: ErrorCode,
        expire_timestamp: int,
        producer_id: int,
        producer_epoch: int,
        token: RequestToken,
    ) -> None:
        if error is not ErrorCode.none:
            self._ops.reply(token, _commit_response(topics, lambda topic, partition: error))
            return
        max_metadata = self.config.offset_metadata_max_bytes
        keys: list[OffsetCommitKey] = []
        values: list[OffsetCommitValue] = []
        too_large: set[TopicPartitionKey] = set()
        for topic in topics:
            for p in topic.partitions:
                metadata = p.committed_metadata or ""
                if len(metadata) > max_metadata:
                    too_large.add((topic.name, p.partition_index))
                    continue
                keys.append(OffsetCommitKey(group_id, topic.name, p.partition_index))
                values.append(
                    OffsetCommitValue(
                        offset=p.committed_offset,
                        metadata=metadata,
                        commit_timestamp=self._ops.now,
                        leader_epoch=p.committed_leader_epoch,
                        expire_timestamp=expire_timestamp,
                    )
                )

        def answer(append_error: ErrorCode) -> None:
            def partition_error(topic: str, partition: int) -> ErrorCode:
                if (topic, partition) in too_large:
                    return ErrorCode.offset_metadata_too_large
                return append_error

            self._ops.reply(token, _commit_response(topics, partition_error))

        if not keys:
            answer(ErrorCode.none)
            return
        transactional = producer_id >= 0
        staged = [CommittedOffset.from_value(v, -1) for v in values] if transactional else []
        for key, entry in zip(keys, staged):
            self.store.stage(producer_id, group_id, (key.topic, key.partition), entry)

        def done(result: AppendOutcome) -> None:
            if result.error is not ErrorCode.none:
                for key, entry in zip(keys, staged):
                    self.store.unstage(producer_id, group_id, (key.topic, key.partition), entry)
                answer(map_append_error(result.error, offsets=True))
                return
            for i, (key, value) in enumerate(zip(keys, values)):
                record_offset = result.base_offset + i
                if not transactional:
                    self.replay(key, value, record_offset=record_offset, producer_id=producer_id)
                    continue
                self._membership.ensure_group(key.group)  # as the replay of this record would
                tp = (key.topic, key.partition)
                self.store.complete_staged(producer_id, group_id, tp, staged[i], record_offset=record_offset)
            answer(ErrorCode.none)

        self._ops.emit(
            self._ops.partition_for(group_id),
            [encode_record(k, v) for k, v in zip(keys, values)],
            done,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            describe=f"offsets of {group_id}",
        )

    def replay(
        self, key: OffsetCommitKey, value: OffsetCommitValue | None, *, record_offset: int, producer_id: int
    ) -> None:
        """Apply one offset record (startup load, or the completion of our own write)."""
        if value is not None:
            self._membership.ensure_group(key.group)  # offsets without membership: a simple group
        self.store.replay(key, value, record_offset=record_offset, producer_id=producer_id)

    def replay_end_transaction(self, producer_id: int, commit: bool, partition: int | None = None) -> None:
        """Apply a COMMIT (True) / ABORT (False) marker found on ``partition`` (None: all)."""
        if not self.store.has_transaction(producer_id):
            return
        partition_for = self._ops.partition_for
        group_filter = None if partition is None else (lambda g: partition_for(g) == partition)
        self.store.replay_end_transaction(producer_id, commit, group_filter)

    # -- OffsetFetch ----------------------------------------------------------------------------

    def fetch_group(self, fetch: FetchGroup, require_stable: bool) -> FetchGroupResult:
        """One group of an OffsetFetch (v8+ asks for several; the coordinator checks ownership
        of each first); ``require_stable`` reports pending transactional offsets
        as UNSTABLE_OFFSET_COMMIT so the consumer retries instead of reading a stale one."""
        group = self._membership.groups.get(fetch.group_id)
        # A group first created by a TxnOffsetCommit exists only once its append completes;
        # its staged offsets are unstable already.
        open_txn = require_stable and self.store.has_pending(fetch.group_id)
        if (group is None or group.is_in(GroupState.DEAD)) and not open_txn:
            return unknown_group_fetch(fetch.group_id, fetch.topics)
        topics = self.store.fetch(fetch.group_id, fetch.topics, require_stable)
        return FetchGroupResult(group_id=fetch.group_id, topics=topics)


def _commit_response(
    topics: tuple[CommitTopic, ...], error_of: Callable[[str, int], ErrorCode]
) -> OffsetCommitResponseData:
    return OffsetCommitResponseData(
        topics=tuple(
            CommitTopicResult(
                t.name,
                tuple(
                    CommitPartitionResult(p.partition_index, error_of(t.name, p.partition_index))
                    for p in t.partitions
                ),
            )
            for t in topics
        )
    )
