"""The sans-IO group coordinator: the object the asyncio shell drives.

Lifecycle
---------
1. Construct with a :class:`GroupCoordinatorConfig`.
2. Startup: feed every record of the owned ``__consumer_offsets`` partitions, in log order, to
   :meth:`GroupCoordinator.replay` (with the record's offset and its batch's producer id) and every
   COMMIT/ABORT control record to :meth:`GroupCoordinator.replay_end_transaction`; then call
   :meth:`GroupCoordinator.load_complete` to start the loaded members' session timers.
3. Serve: request methods (``join_group`` ...) take ``now_ms`` and a ``respond`` callback and return
   effects (:class:`~exactly.coordinator.group.api.AppendRecords`) to carry out; reads
   (``offset_fetch``, ``describe_groups``, ``list_groups``) return their answer.
4. Time: call :meth:`GroupCoordinator.poll` at :meth:`GroupCoordinator.next_deadline` (or
   periodically); it fires session/rebalance/sync timeouts and the initial rebalance delay.
5. Transactions: when a COMMIT/ABORT marker of producer P has been appended to a
   ``__consumer_offsets`` partition, call :meth:`GroupCoordinator.complete_transaction`.
6. Retention: every ``offsets.retention.check.interval.ms`` call
   :meth:`~exactly.coordinator.group.expiry.ExpiryMixin.cleanup_group_metadata`; it returns the
   tombstone appends for expired offsets and empty groups (see ``expiry.py``).

The coordinator owns no I/O, no clock and no threads; the shell serializes calls (one asyncio loop).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from kio.schema.errors import ErrorCode

from exactly.coordinator.group.api import (
    AppendRecords,
    AppendResult,
    CommitPartitionResult,
    CommitTopic,
    CommitTopicResult,
    DeleteGroupResult,
    DescribedGroup,
    FetchGroupResult,
    ListedGroup,
    OffsetCommitRequestData,
    OffsetCommitResponseData,
    OffsetFetchRequestData,
    OffsetFetchResponseData,
    TxnOffsetCommitRequestData,
)
from exactly.coordinator.group.core import GroupCoordinatorConfig
from exactly.coordinator.group.expiry import ExpiryMixin
from exactly.coordinator.group.group import ClassicGroup
from exactly.coordinator.group.membership import MembershipMixin
from exactly.coordinator.group.offsets import (
    CommittedOffset,
    TopicPartitionKey,
    map_append_error,
    unknown_group_fetch,
    validate_offset_commit,
)
from exactly.coordinator.group.records import (
    GroupMetadataKey,
    OffsetCommitKey,
    OffsetCommitValue,
    decode_record,
    encode_record,
)
from exactly.coordinator.group.state import GroupState

__all__ = ["GroupCoordinator", "GroupCoordinatorConfig"]

CommitRespond = Callable[[OffsetCommitResponseData], None]
DEFAULT_RETENTION_TIME_MS = -1  # OffsetCommitRequest.DEFAULT_RETENTION_TIME: the broker's retention


class GroupCoordinator(MembershipMixin, ExpiryMixin):
    """Classic consumer groups and their offsets for every ``__consumer_offsets`` partition."""

    # -- time -----------------------------------------------------------------------------------

    def poll(self, now_ms: int) -> list[AppendRecords]:
        """Fire every timer due at ``now_ms``; returns the appends they caused."""
        return self._run(now_ms, lambda: None)

    def next_deadline(self) -> int | None:
        """When :meth:`poll` next has work (absolute ms), or None if no timer is pending."""
        return self.timers.next_deadline()

    # -- OffsetCommit / TxnOffsetCommit ---------------------------------------------------------

    def offset_commit(
        self, request: OffsetCommitRequestData, now_ms: int, respond: CommitRespond
    ) -> list[AppendRecords]:
        """OffsetCommit: validate, append, and make the offsets visible when the append completes."""

        def body() -> None:
            group = self.groups.get(request.group_id)
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
                    self._schedule_heartbeat(group, member)  # a commit also proves liveness
            # KIP-211: only v2-v4 carry a retention; anything but -1 (the default) fixes the expiry.
            retention = request.retention_time_ms
            expire = -1 if retention == DEFAULT_RETENTION_TIME_MS else now_ms + retention
            self._commit(request.group_id, request.topics, error, expire, -1, -1, respond)

        return self._run(now_ms, body)

    def txn_offset_commit(
        self, request: TxnOffsetCommitRequestData, now_ms: int, respond: CommitRespond
    ) -> list[AppendRecords]:
        """TxnOffsetCommit: append transactionally; the offsets stay pending until the marker."""

        def body() -> None:
            error = validate_offset_commit(
                self.groups.get(request.group_id),
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
                respond,
            )

        return self._run(now_ms, body)

    def _commit(
        self,
        group_id: str,
        topics: tuple[CommitTopic, ...],
        error: ErrorCode,
        expire_timestamp: int,
        producer_id: int,
        producer_epoch: int,
        respond: CommitRespond,
    ) -> None:
        if error is not ErrorCode.none:
            self._reply(respond, _commit_response(topics, lambda topic, partition: error))
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
                        commit_timestamp=self._now,
                        leader_epoch=p.committed_leader_epoch,
                        expire_timestamp=expire_timestamp,
                    )
                )

        def answer(append_error: ErrorCode) -> None:
            def partition_error(topic: str, partition: int) -> ErrorCode:
                if (topic, partition) in too_large:
                    return ErrorCode.offset_metadata_too_large
                return append_error

            self._reply(respond, _commit_response(topics, partition_error))

        if not keys:
            answer(ErrorCode.none)
            return

        def done(result: AppendResult) -> None:
            if result.error is not ErrorCode.none:
                answer(map_append_error(result.error, offsets=True))
                return
            for i, (key, value) in enumerate(zip(keys, values)):
                self._replay_offset(key, value, record_offset=result.base_offset + i, producer_id=producer_id)
            answer(ErrorCode.none)

        self._emit(
            self.partition_for(group_id),
            [encode_record(k, v) for k, v in zip(keys, values)],
            done,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
        )

    def complete_transaction(self, producer_id: int, commit: bool, partition: int | None = None) -> None:
        """A COMMIT/ABORT marker of ``producer_id`` landed on ``partition`` (None: on every one).

        Identical to :meth:`replay_end_transaction`: the marker is already in the log, so applying it
        live and replaying it at startup must give the same state.
        """
        self.replay_end_transaction(producer_id, commit, partition)

    # -- OffsetFetch ----------------------------------------------------------------------------

    def offset_fetch(self, request: OffsetFetchRequestData) -> OffsetFetchResponseData:
        """OffsetFetch (v8+ several groups); ``require_stable`` reports pending transactional
        offsets as UNSTABLE_OFFSET_COMMIT so the consumer retries instead of reading a stale one."""
        results: list[FetchGroupResult] = []
        for fetch in request.groups:
            group = self.groups.get(fetch.group_id)
            if group is None or group.is_in(GroupState.DEAD):
                results.append(unknown_group_fetch(fetch.group_id, fetch.topics))
                continue
            topics = self.offsets.fetch(fetch.group_id, fetch.topics, request.require_stable)
            results.append(FetchGroupResult(group_id=fetch.group_id, topics=topics))
        return OffsetFetchResponseData(groups=tuple(results))

    # -- DescribeGroups / ListGroups / DeleteGroups ---------------------------------------------

    def describe_groups(self, group_ids: Iterable[str], api_version: int = 5) -> list[DescribedGroup]:
        """DescribeGroups; an unknown group is described as Dead (GROUP_ID_NOT_FOUND from v6)."""
        out: list[DescribedGroup] = []
        for group_id in group_ids:
            group = self.groups.get(group_id)
            if not group_id:
                out.append(DescribedGroup(group_id=group_id, error_code=ErrorCode.invalid_group_id))
            elif group is None or group.is_in(GroupState.DEAD):
                error = ErrorCode.group_id_not_found if api_version >= 6 else ErrorCode.none
                out.append(DescribedGroup(group_id=group_id, error_code=error))
            else:
                out.append(group.describe())
        return out

    def list_groups(
        self, states_filter: Iterable[str] = (), types_filter: Iterable[str] = ()
    ) -> list[ListedGroup]:
        """ListGroups; filters compare case-insensitively and an empty filter matches all."""
        states = {s.lower() for s in states_filter}
        types = {t.lower() for t in types_filter}
        if types and "classic" not in types:
            return []
        return [
            g.listed()
            for g in self.groups.values()
            if not g.is_in(GroupState.DEAD) and (not states or g.state.wire_name.lower() in states)
        ]

    def delete_groups(
        self, group_ids: Iterable[str], now_ms: int, respond: Callable[[list[DeleteGroupResult]], None]
    ) -> list[AppendRecords]:
        """DeleteGroups: only Empty groups; tombstones for the group and all its offsets."""
        ids = list(dict.fromkeys(group_ids))

        def body() -> None:
            results: dict[str, ErrorCode] = {}
            by_partition: dict[int, list[str]] = {}
            for group_id in ids:
                group = self.groups.get(group_id)
                if not group_id:
                    results[group_id] = ErrorCode.invalid_group_id
                elif group is None or group.is_in(GroupState.DEAD):
                    results[group_id] = ErrorCode.group_id_not_found
                elif not group.is_in(GroupState.EMPTY):
                    results[group_id] = ErrorCode.non_empty_group
                else:
                    by_partition.setdefault(self.partition_for(group_id), []).append(group_id)
            outstanding = [len(by_partition)]

            def finish() -> None:
                self._reply(respond, [DeleteGroupResult(g, results[g]) for g in ids])

            for partition, group_ids_here in by_partition.items():
                records: list[tuple[bytes, bytes | None]] = []
                for group_id in group_ids_here:
                    for topic, p in self.offsets.partitions_with_state(group_id):
                        records.append(encode_record(OffsetCommitKey(group_id, topic, p), None))
                    records.append(encode_record(GroupMetadataKey(group_id), None))
                self._emit(
                    partition,
                    records,
                    self._delete_done(group_ids_here, records, results, outstanding, finish),
                )
            if not by_partition:
                finish()

        return self._run(now_ms, body)

    def _delete_done(
        self,
        group_ids: list[str],
        records: list[tuple[bytes, bytes | None]],
        results: dict[str, ErrorCode],
        outstanding: list[int],
        finish: Callable[[], None],
    ) -> Callable[[AppendResult], None]:
        def done(result: AppendResult) -> None:
            if result.error is ErrorCode.none:
                for i, (key, value) in enumerate(records):
                    self.replay(key, value, offset=result.base_offset + i)
            error = map_append_error(result.error, offsets=False)
            for group_id in group_ids:
                results[group_id] = error
            outstanding[0] -= 1
            if outstanding[0] == 0:
                finish()

        return done

    # -- replay ---------------------------------------------------------------------------------

    def replay(self, key: bytes, value: bytes | None, *, offset: int, producer_id: int = -1) -> None:
        """Apply one ``__consumer_offsets`` record (startup load, or after our own append).

        ``producer_id`` is the batch's producer id: >= 0 only for transactional batches, whose offset
        commits stay pending until :meth:`replay_end_transaction`. Unknown record types are ignored.
        """
        decoded = decode_record(key, value)
        if decoded is None:
            return
        record_key, record_value = decoded
        if isinstance(record_key, OffsetCommitKey):
            assert record_value is None or isinstance(record_value, OffsetCommitValue)
            self._replay_offset(record_key, record_value, record_offset=offset, producer_id=producer_id)
            return
        self._unload_group(record_key.group)
        if record_value is not None:
            assert not isinstance(record_value, OffsetCommitValue)
            self.groups[record_key.group] = ClassicGroup.from_record(record_key.group, record_value)
        elif self.offsets.partitions_with_state(record_key.group):
            # Offsets outlive their group record (a commit landed after the tombstone's offsets
            # were chosen): they belong to a simple Empty group, as Kafka's loader makes them.
            self.groups[record_key.group] = ClassicGroup(record_key.group)

    def _replay_offset(
        self, key: OffsetCommitKey, value: OffsetCommitValue | None, *, record_offset: int, producer_id: int
    ) -> None:
        if value is not None and key.group not in self.groups:
            # Offsets without membership (manual assignment): a "simple" Empty group, as in Kafka.
            self.groups[key.group] = ClassicGroup(key.group)
        self.offsets.replay(key, value, record_offset=record_offset, producer_id=producer_id)

    def replay_end_transaction(self, producer_id: int, commit: bool, partition: int | None = None) -> None:
        """Apply a COMMIT (True) / ABORT (False) marker found on ``partition`` (None: all)."""
        group_filter = None if partition is None else (lambda g: self.partition_for(g) == partition)
        self.offsets.replay_end_transaction(producer_id, commit, group_filter)

    def load_complete(self, now_ms: int) -> list[AppendRecords]:
        """After replay: start session timers for the loaded members (they must heartbeat again)."""

        def body() -> None:
            for group in self.groups.values():
                for member in group.members.values():
                    self._schedule_heartbeat(group, member)

        return self._run(now_ms, body)

    # -- introspection (tests, DescribeGroups-like tooling) -------------------------------------

    def group(self, group_id: str) -> ClassicGroup | None:
        return self.groups.get(group_id)

    def committed_offsets(self, group_id: str) -> dict[TopicPartitionKey, CommittedOffset]:
        return self.offsets.committed(group_id)


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
