"""The sans-IO group coordinator: the object the coordinator runtime drives.

It is composed of parts, each owning its own state, that share one :class:`Operations` context:

* :class:`~exactly.coordinator.group.membership.Membership` owns the groups and serves
  JoinGroup/SyncGroup/Heartbeat/LeaveGroup, with its
  :class:`~exactly.coordinator.group.rebalance.Rebalancer` (join phase, generations, timers);
* :class:`~exactly.coordinator.group.offset_manager.OffsetManager` owns the committed and pending
  offsets and serves OffsetCommit/TxnOffsetCommit/OffsetFetch;
* :class:`~exactly.coordinator.group.expiry.Expiry` runs offset retention over both.

This module routes requests to them, serves the group admin APIs (DescribeGroups, ListGroups,
DeleteGroups) and routes replayed records: a group record to the membership, an offset record to
the offset manager.

Lifecycle
---------
1. Construct with a :class:`GroupCoordinatorConfig`.
2. Load: feed every record of the owned ``__consumer_offsets`` partitions, in log order, to
   :meth:`GroupCoordinator.replay` (with the record's offset and its batch's producer id) and every
   COMMIT/ABORT control record to :meth:`GroupCoordinator.replay_end_transaction`; then
   :meth:`GroupCoordinator.load_complete` starts the loaded members' session timers.
3. Serve: request methods (``join_group`` ...) take ``now_ms`` and the request's token and return
   a :class:`~exactly.coordinator.result.CoordinatorResult` whose ``replies`` answer it (now or,
   when parked, from a later result); reads (``offset_fetch``, ``describe_groups``,
   ``list_groups``) return their answer.
4. Time: call :meth:`GroupCoordinator.poll` at :meth:`GroupCoordinator.next_deadline`; it fires
   session/rebalance/sync timeouts and the initial rebalance delay.
5. Transactions: when a COMMIT/ABORT marker of producer P has been appended to a
   ``__consumer_offsets`` partition, call :meth:`GroupCoordinator.complete_transaction`.
6. Retention: every ``offsets.retention.check.interval.ms`` call
   :meth:`GroupCoordinator.cleanup_group_metadata` (see ``expiry.py``).

The coordinator owns no I/O, no clock and no threads; the runtime serializes calls (one event loop).

Ownership
---------
The coordinator knows which ``__consumer_offsets`` partitions its last load replayed (``None``:
every one, a single broker; :meth:`GroupCoordinator.begin_load` names them on a cluster) and
answers every group request *when it runs* as Kafka's ``validateGroupStatus`` does:
COORDINATOR_LOAD_IN_PROGRESS while loading, NOT_COORDINATOR for a group of a partition it does not
own (:meth:`GroupCoordinator.owner_error`, over :class:`~exactly.coordinator.ownership.Ownership`,
which the transaction coordinator shares; an unload resigns every partition). The runtime's handlers check the same before queueing
(a cheap answer without the operation lock), but a request may wait for that lock behind a reload
that resigned the group's partition; it must then get NOT_COORDINATOR, which sends the client to
the new coordinator, and not what an empty coordinator would say (UNKNOWN_MEMBER_ID,
GROUP_ID_NOT_FOUND, a new group created here). Invariant: no request changes or creates a group
of a partition outside the owned set.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from typing import Any, Never

from kio.schema.errors import ErrorCode

from exactly.coordinator.group.api import (
    CommitPartitionResult,
    CommitTopic,
    CommitTopicResult,
    DeleteGroupResult,
    DescribedGroup,
    FetchGroupResult,
    HeartbeatRequestData,
    HeartbeatResponseData,
    JoinGroupRequestData,
    JoinGroupResponseData,
    LeaveGroupRequestData,
    LeaveGroupResponseData,
    ListedGroup,
    OffsetCommitRequestData,
    OffsetCommitResponseData,
    OffsetFetchRequestData,
    OffsetFetchResponseData,
    SyncGroupRequestData,
    SyncGroupResponseData,
    TxnOffsetCommitRequestData,
)
from exactly.coordinator.group.core import GroupCoordinatorConfig, Operations
from exactly.coordinator.group.expiry import Expiry
from exactly.coordinator.group.group import ClassicGroup
from exactly.coordinator.group.membership import Membership
from exactly.coordinator.group.offset_manager import OffsetManager
from exactly.coordinator.group.offsets import (
    CommittedOffset,
    OffsetStore,
    TopicPartitionKey,
    map_append_error,
)
from exactly.coordinator.group.records import (
    GroupMetadataKey,
    OffsetCommitKey,
    OffsetCommitValue,
    decode_record,
    encode_record,
)
from exactly.coordinator.group.state import GroupState
from exactly.coordinator.group.timers import DeadlineQueue
from exactly.coordinator.ownership import Ownership
from exactly.coordinator.result import AppendOutcome, CoordinatorResult, RequestToken

__all__ = ["GroupCoordinator", "GroupCoordinatorConfig"]


class GroupCoordinator:
    """Classic consumer groups and their offsets for every ``__consumer_offsets`` partition.

    Owns its parts (``membership``, ``offsets``, ``expiry``) and their shared :class:`Operations`;
    see the module docstring for the lifecycle.
    """

    def __init__(
        self,
        config: GroupCoordinatorConfig | None = None,
        *,
        member_id_factory: Callable[[str], str] | None = None,
    ) -> None:
        self.config = config or GroupCoordinatorConfig()
        self._ops = Operations(self.config)
        self.membership = Membership(
            self.config, self._ops, member_id_factory or (lambda prefix: f"{prefix}-{uuid.uuid4()}")
        )
        self._offsets = OffsetManager(self.config, self._ops, self.membership)
        self.expiry = Expiry(self.config, self._ops, self.membership, self._offsets.store)
        # The __consumer_offsets partitions owned or loading ("Ownership" above).
        self._ownership = Ownership()

    # -- state (read-only views for the runtime, admin tools and tests) -------------------------

    @property
    def groups(self) -> dict[str, ClassicGroup]:
        return self.membership.groups

    @property
    def offsets(self) -> OffsetStore:
        return self._offsets.store

    @property
    def timers(self) -> DeadlineQueue:
        return self._ops.timers

    @property
    def ownership(self) -> Ownership:
        """The partitions owned or loading (changed only by the load/unload calls below)."""
        return self._ownership

    def partition_for(self, group_id: str) -> int:
        """The ``__consumer_offsets`` partition of ``group_id`` (FindCoordinator uses the same)."""
        return self._ops.partition_for(group_id)

    def group(self, group_id: str) -> ClassicGroup | None:
        return self.groups.get(group_id)

    def owner_error(self, group_id: str) -> ErrorCode | None:
        """Kafka's ``validateGroupStatus``, made when a request runs (see "Ownership" above):
        COORDINATOR_LOAD_IN_PROGRESS while loading, NOT_COORDINATOR when the group's partition
        is not one this coordinator loaded, else None (go on: a group absent from ``groups`` is
        then really unknown)."""
        return self._ownership.owner_error(self.partition_for(group_id))

    def _refuse(self, now_ms: int, token: RequestToken, response: Any) -> CoordinatorResult[Never]:
        """Answer ``token`` with ``response`` (an ownership error) and change nothing else."""
        return self._ops.run(now_ms, lambda: self._ops.reply(token, response))

    def committed_offsets(self, group_id: str) -> dict[TopicPartitionKey, CommittedOffset]:
        return self.offsets.committed(group_id)

    # -- time -----------------------------------------------------------------------------------

    def poll(self, now_ms: int) -> CoordinatorResult[Never]:
        """Fire every timer due at ``now_ms``."""
        return self._ops.run(now_ms, lambda: None)

    def next_deadline(self) -> int | None:
        """When :meth:`poll` next has work (absolute ms), or None if no timer is pending."""
        return self._ops.timers.next_deadline()

    # -- requests (routed to the parts) ---------------------------------------------------------

    # Each checks ownership first (``owner_error``, "Ownership" above), then goes to its part.

    def join_group(
        self, request: JoinGroupRequestData, now_ms: int, token: RequestToken
    ) -> CoordinatorResult[Never]:
        if (error := self.owner_error(request.group_id)) is not None:
            return self._refuse(
                now_ms, token, JoinGroupResponseData(error_code=error, member_id=request.member_id)
            )
        return self.membership.join_group(request, now_ms, token)

    def sync_group(
        self, request: SyncGroupRequestData, now_ms: int, token: RequestToken
    ) -> CoordinatorResult[Never]:
        if (error := self.owner_error(request.group_id)) is not None:
            return self._refuse(now_ms, token, SyncGroupResponseData(error_code=error))
        return self.membership.sync_group(request, now_ms, token)

    def heartbeat(
        self, request: HeartbeatRequestData, now_ms: int, token: RequestToken
    ) -> CoordinatorResult[Never]:
        if (error := self.owner_error(request.group_id)) is not None:
            return self._refuse(now_ms, token, HeartbeatResponseData(error_code=error))
        return self.membership.heartbeat(request, now_ms, token)

    def leave_group(
        self, request: LeaveGroupRequestData, now_ms: int, token: RequestToken
    ) -> CoordinatorResult[Never]:
        if (error := self.owner_error(request.group_id)) is not None:
            return self._refuse(now_ms, token, LeaveGroupResponseData(error_code=error))
        return self.membership.leave_group(request, now_ms, token)

    def offset_commit(
        self, request: OffsetCommitRequestData, now_ms: int, token: RequestToken
    ) -> CoordinatorResult[Never]:
        if (error := self.owner_error(request.group_id)) is not None:
            return self._refuse(now_ms, token, _every_partition(request.topics, error))
        return self._offsets.offset_commit(request, now_ms, token)

    def txn_offset_commit(
        self, request: TxnOffsetCommitRequestData, now_ms: int, token: RequestToken
    ) -> CoordinatorResult[Never]:
        if (error := self.owner_error(request.group_id)) is not None:
            return self._refuse(now_ms, token, _every_partition(request.topics, error))
        return self._offsets.txn_offset_commit(request, now_ms, token)

    def offset_fetch(self, request: OffsetFetchRequestData) -> OffsetFetchResponseData:
        """OffsetFetch, one answer per group in request order; a group this coordinator does not
        own gets its error as the group's ``error_code`` (no offsets: never an empty answer a
        consumer would start from)."""
        return OffsetFetchResponseData(
            groups=tuple(
                FetchGroupResult(group_id=g.group_id, error_code=error)
                if (error := self.owner_error(g.group_id)) is not None
                else self._offsets.fetch_group(g, request.require_stable)
                for g in request.groups
            )
        )

    def cleanup_group_metadata(self, now_ms: int, token: RequestToken) -> CoordinatorResult[Never]:
        return self.expiry.cleanup_group_metadata(now_ms, token)

    def complete_transaction(self, producer_id: int, commit: bool, partition: int | None = None) -> None:
        """A COMMIT/ABORT marker of ``producer_id`` landed on ``partition`` (None: on every one).

        Identical to :meth:`replay_end_transaction`: the marker is already in the log, so applying it
        live and replaying it at startup must give the same state.
        """
        self.replay_end_transaction(producer_id, commit, partition)

    # -- DescribeGroups / ListGroups / DeleteGroups ---------------------------------------------

    def describe_groups(self, group_ids: Iterable[str], api_version: int = 5) -> list[DescribedGroup]:
        """DescribeGroups; an unknown group is described as Dead (GROUP_ID_NOT_FOUND from v6)."""
        out: list[DescribedGroup] = []
        for group_id in group_ids:
            group = self.groups.get(group_id)
            if (owner := self.owner_error(group_id)) is not None:
                out.append(DescribedGroup(group_id=group_id, error_code=owner, group_state=""))
            elif not group_id:
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
        self, group_ids: Iterable[str], now_ms: int, token: RequestToken
    ) -> CoordinatorResult[Never]:
        """DeleteGroups: only Empty groups; tombstones for the group and all its offsets."""
        ids = list(dict.fromkeys(group_ids))

        def body() -> None:
            results: dict[str, ErrorCode] = {}
            by_partition: dict[int, list[str]] = {}
            for group_id in ids:
                group = self.groups.get(group_id)
                if (owner := self.owner_error(group_id)) is not None:
                    results[group_id] = owner
                elif not group_id:
                    results[group_id] = ErrorCode.invalid_group_id
                elif group is None or group.is_in(GroupState.DEAD):
                    results[group_id] = ErrorCode.group_id_not_found
                elif not group.is_in(GroupState.EMPTY):
                    results[group_id] = ErrorCode.non_empty_group
                else:
                    by_partition.setdefault(self._ops.partition_for(group_id), []).append(group_id)
            outstanding = [len(by_partition)]

            def finish() -> None:
                self._ops.reply(token, [DeleteGroupResult(g, results[g]) for g in ids])

            for partition, group_ids_here in by_partition.items():
                records: list[tuple[bytes, bytes | None]] = []
                for group_id in group_ids_here:
                    for topic, p in self._offsets.store.partitions_with_state(group_id):
                        records.append(encode_record(OffsetCommitKey(group_id, topic, p), None))
                    records.append(encode_record(GroupMetadataKey(group_id), None))
                self._ops.emit(
                    partition,
                    records,
                    self._delete_done(group_ids_here, records, results, outstanding, finish),
                    describe="delete groups",
                )
            if not by_partition:
                finish()

        return self._ops.run(now_ms, body)

    def _delete_done(
        self,
        group_ids: list[str],
        records: list[tuple[bytes, bytes | None]],
        results: dict[str, ErrorCode],
        outstanding: list[int],
        finish: Callable[[], None],
    ) -> Callable[[AppendOutcome], None]:
        def done(result: AppendOutcome) -> None:
            if result.ok:
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
        """Apply one ``__consumer_offsets`` record (startup load, or after our own write).

        ``producer_id`` is the batch's producer id: >= 0 only for transactional batches, whose offset
        commits stay pending until :meth:`replay_end_transaction`. Unknown record types are ignored.
        """
        decoded = decode_record(key, value)
        if decoded is None:
            return
        record_key, record_value = decoded
        if isinstance(record_key, OffsetCommitKey):
            assert record_value is None or isinstance(record_value, OffsetCommitValue)
            self._offsets.replay(record_key, record_value, record_offset=offset, producer_id=producer_id)
            return
        assert not isinstance(record_value, OffsetCommitValue)
        if record_value is not None:
            self.membership.load_group(record_key.group, record_value)
            return
        self.membership.unload_group(record_key.group)
        if self.offsets.partitions_with_state(record_key.group):
            # Offsets outlive their group record (a commit landed after the tombstone's offsets
            # were chosen): they belong to a simple Empty group, as Kafka's loader makes them.
            self.membership.ensure_group(record_key.group)

    def replay_end_transaction(self, producer_id: int, commit: bool, partition: int | None = None) -> None:
        """Apply a COMMIT (True) / ABORT (False) marker found on ``partition`` (None: all)."""
        self._offsets.replay_end_transaction(producer_id, commit, partition)

    def begin_load(self, partitions: Iterable[int] | None = None) -> None:
        """A load of ``partitions`` (None: every one) starts: requests get
        COORDINATOR_LOAD_IN_PROGRESS until :meth:`load_complete`, then NOT_COORDINATOR for groups
        of other partitions. Call it on an empty coordinator (new, or after :meth:`unload`); a
        single broker's first load may skip it (a new coordinator owns every partition)."""
        self._ownership = self._ownership.begin_load(partitions)

    def load_complete(self, now_ms: int) -> CoordinatorResult[Never]:
        """After replay: start session timers for the loaded members (they must heartbeat again)."""
        self._ownership = self._ownership.complete_load()
        return self._ops.run(now_ms, self.membership.start_sessions)

    def unload(self, now_ms: int) -> CoordinatorResult[Never]:
        """Stop owning ``__consumer_offsets``: parked requests are answered NOT_COORDINATOR, all
        state is forgotten; a later load replays the log again (Kafka's ``onUnloaded``). Until a
        :meth:`begin_load` names what that load replays, it owns no partition: requests get
        NOT_COORDINATOR (LOAD_IN_PROGRESS once the load began).

        Writes still in flight complete against groups that are gone and change nothing.
        """

        def body() -> None:
            self.membership.unload_all()
            self._offsets.store.clear()

        self._ownership = self._ownership.resign()
        return self._ops.run(now_ms, body)


def _every_partition(topics: Iterable[CommitTopic], error: ErrorCode) -> OffsetCommitResponseData:
    """An OffsetCommit/TxnOffsetCommit answer with ``error`` for every requested partition."""
    return OffsetCommitResponseData(
        topics=tuple(
            CommitTopicResult(
                t.name, tuple(CommitPartitionResult(p.partition_index, error) for p in t.partitions)
            )
            for t in topics
        )
    )
