"""GroupRuntime in cluster mode over an in-memory ``__consumer_offsets`` whose acks=all appends wait
for the test: a TxnOffsetCommit waiting for its acks is already unstable to OffsetFetch, and a
transaction marker is applied to the group coordinator only after that commit completed (under
the runtime's operation lock), as in the log, where the commit's record precedes the marker."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, cast

from kio.schema.errors import ErrorCode

from exactly.coordinator.group import GroupCoordinator, GroupCoordinatorConfig
from exactly.coordinator.group.api import (
    CommitPartition,
    CommitTopic,
    FetchGroup,
    FetchTopic,
    HeartbeatRequestData,
    JoinGroupRequestData,
    LeaveGroupRequestData,
    LeaveGroupResponseData,
    LeaveMember,
    OffsetCommitRequestData,
    OffsetCommitResponseData,
    OffsetFetchRequestData,
    Protocol,
    SyncGroupAssignment,
    SyncGroupRequestData,
    TxnOffsetCommitRequestData,
)
from exactly.coordinator.result import CoordinatorResult, Record, RequestToken
from exactly.server.clock import now_ms
from exactly.server.coordinator_runtime import CoordinatorRuntime
from exactly.server.group_runtime import GroupRuntime
from exactly.server.internal_topics import InternalTopics, ReplayedBatch
from exactly.topics import CONSUMER_OFFSETS_TOPIC

GROUP = "copier"
PID = 7000


class ReplicatedOffsetsTopic:
    """The calls the runtime makes on InternalTopics; appends wait for ``acks`` when it is set."""

    replicated = True

    def __init__(self) -> None:
        self.log: list[tuple[int, Record, int]] = []
        self.acks: asyncio.Event | None = None

    async def append_replicated(
        self, topic: str, partition: int, records: Sequence[Record], *, producer_id: int = -1, **_kw: Any
    ) -> int:
        base = len(self.log)
        self.log.extend((partition, r, producer_id) for r in records)
        if self.acks is not None:
            await self.acks.wait()
        return base

    def replay(self, topic: str, partitions: Iterable[int] | None = None) -> Iterator[ReplayedBatch]:
        return iter(())


def group_runtime() -> tuple[GroupRuntime, ReplicatedOffsetsTopic]:
    """A GroupRuntime without a broker: ``apply_marker`` and requests need only these two parts."""
    topic = ReplicatedOffsetsTopic()
    coordinator = GroupCoordinator(GroupCoordinatorConfig(initial_rebalance_delay_ms=0))
    groups = object.__new__(GroupRuntime)
    groups.coordinator = coordinator
    groups.runtime = CoordinatorRuntime(
        "groups", CONSUMER_OFFSETS_TOPIC, cast(InternalTopics, topic), coordinator, skip_bad_records=True
    )
    return groups, topic


def txn_offset_commit(groups: GroupRuntime, offset: int) -> asyncio.Future[Any]:
    request = TxnOffsetCommitRequestData(
        transactional_id="tx",
        group_id=GROUP,
        producer_id=PID,
        producer_epoch=0,
        topics=(CommitTopic("in", (CommitPartition(partition_index=0, committed_offset=offset),)),),
    )
    coordinator = groups.coordinator
    return groups.call(lambda token: coordinator.txn_offset_commit(request, 1_000, token))


def stable_fetch(groups: GroupRuntime) -> int | ErrorCode:
    response = groups.coordinator.offset_fetch(
        OffsetFetchRequestData(groups=(FetchGroup(GROUP, (FetchTopic("in", (0,)),)),), require_stable=True)
    )
    [partition] = response.groups[0].topics[0].partitions
    return partition.committed_offset if partition.error_code == ErrorCode.none else partition.error_code


def test_marker_waits_for_the_txn_offset_commit_in_flight_and_an_abort_stays_aborted() -> None:
    async def scenario() -> None:
        groups, topic = group_runtime()
        partition = groups.coordinator.partition_for(GROUP)
        await groups.runtime.reload(
            lambda: {p: None for p in range(groups.coordinator.config.num_partitions)}
        )
        topic.acks = asyncio.Event()
        commit = txn_offset_commit(groups, 150)
        while not topic.log:  # the commit's record is appended, its acks are awaited
            await asyncio.sleep(0)
        assert stable_fetch(groups) == ErrorCode.unstable_offset_commit
        # Its client gave up and aborted: the ABORT marker was appended after the commit's record.
        abort = asyncio.create_task(groups.apply_marker(partition, PID, commit=False))
        for _ in range(20):
            await asyncio.sleep(0)
        assert not abort.done()  # applied only after the commit completed, as in the log
        topic.acks.set()
        await abort
        response = await commit
        assert {p.error_code for t in response.topics for p in t.partitions} == {ErrorCode.none}
        assert not groups.coordinator.offsets.has_pending(GROUP)
        assert stable_fetch(groups) == -1
        # The producer's next transaction commits only its own offset.
        await txn_offset_commit(groups, 300)
        await groups.apply_marker(partition, PID, commit=True)
        assert stable_fetch(groups) == 300

    asyncio.run(scenario())


def _other_group(coordinator: GroupCoordinator) -> str:
    ours = coordinator.partition_for(GROUP)
    return next(g for g in (f"other-{i}" for i in range(100)) if coordinator.partition_for(g) != ours)


def _commit(group: str, offset: int, *, generation: int = -1, member: str = "") -> OffsetCommitRequestData:
    return OffsetCommitRequestData(
        group_id=group,
        topics=(CommitTopic("in", (CommitPartition(partition_index=0, committed_offset=offset),)),),
        generation_id=generation,
        member_id=member,
    )


def _join(member: str) -> JoinGroupRequestData:
    return JoinGroupRequestData(
        group_id=GROUP,
        session_timeout_ms=10_000,
        rebalance_timeout_ms=30_000,
        member_id=member,
        protocol_type="consumer",
        protocols=(Protocol("range", b"sub"),),
    )


def _error_of(answer: Any) -> ErrorCode:
    """One error code for any group API's answer (every partition, group or member the same)."""
    if isinstance(answer, OffsetCommitResponseData):
        codes = {p.error_code for t in answer.topics for p in t.partitions}
    elif isinstance(answer, list):  # DeleteGroups
        codes = {r.error_code for r in answer}
    elif isinstance(answer, LeaveGroupResponseData) and answer.error_code == ErrorCode.none:
        codes = {m.error_code for m in answer.members}
    else:
        codes = {answer.error_code}
    (code,) = codes
    return code


def test_group_requests_queued_behind_a_resigning_reload_get_not_coordinator() -> None:
    """The check-then-queue window of txnbounce-s19.md, for groups. A handler checks ownership
    when the request arrives (``load_error_for``) and then waits for the operation lock; here an
    offset commit of another group holds the lock (its append waits for the ISR), the broker
    loses the group's ``__consumer_offsets`` partition (its reload queues for the lock), and a
    request of every group API that queues arrives, passes the check and queues behind the reload.
    Once they run, the coordinator no longer holds the group's partition: each must get
    NOT_COORDINATOR (Kafka's ``validateGroupStatus``), which a client follows to the new
    coordinator -- not an empty coordinator's UNKNOWN_MEMBER_ID (the consumer drops its
    assignment and re-joins from scratch), GROUP_ID_NOT_FOUND, a MEMBER_ID_REQUIRED that creates
    a group here, or a commit accepted into a group this broker does not own."""

    async def scenario() -> None:
        groups, topic = group_runtime()
        coordinator = groups.coordinator
        ours, other = coordinator.partition_for(GROUP), _other_group(coordinator)
        theirs = coordinator.partition_for(other)
        lease, other_lease = object(), object()
        await groups.on_leadership(lambda: {ours: lease, theirs: other_lease})
        joined = await groups.call(lambda t: coordinator.join_group(_join(""), now_ms(), t))
        assert joined.error_code == ErrorCode.member_id_required
        member = joined.member_id
        joined = await groups.call(lambda t: coordinator.join_group(_join(member), now_ms(), t))
        assert joined.error_code == ErrorCode.none
        generation = joined.generation_id
        sync = SyncGroupRequestData(
            group_id=GROUP,
            generation_id=generation,
            member_id=member,
            assignments=(SyncGroupAssignment(member, b"a"),),
        )
        synced = await groups.call(lambda t: coordinator.sync_group(sync, now_ms(), t))
        assert synced.error_code == ErrorCode.none
        committed = await groups.call(
            lambda t: coordinator.offset_commit(
                _commit(GROUP, 100, generation=generation, member=member), now_ms(), t
            )
        )
        assert _error_of(committed) == ErrorCode.none

        topic.acks = asyncio.Event()
        holding = groups.call(lambda t: coordinator.offset_commit(_commit(other, 5), now_ms(), t))
        while not any(p == theirs for p, _, _ in topic.log):
            await asyncio.sleep(0)
        resigning = asyncio.create_task(groups.on_leadership(lambda: {theirs: other_lease}))
        for _ in range(5):
            await asyncio.sleep(0)
        assert groups.load_error_for(GROUP) == ErrorCode.none  # what each handler sees
        written = len(topic.log)
        requests: dict[str, Callable[[RequestToken], CoordinatorResult[Any]]] = {
            "delete": lambda t: coordinator.delete_groups([GROUP], now_ms(), t),
            "join (member)": lambda t: coordinator.join_group(_join(member), now_ms(), t),
            "join (new)": lambda t: coordinator.join_group(_join(""), now_ms(), t),
            "sync": lambda t: coordinator.sync_group(sync, now_ms(), t),
            "heartbeat": lambda t: coordinator.heartbeat(
                HeartbeatRequestData(group_id=GROUP, generation_id=generation, member_id=member), now_ms(), t
            ),
            "leave": lambda t: coordinator.leave_group(
                LeaveGroupRequestData(group_id=GROUP, members=(LeaveMember(member),)), now_ms(), t
            ),
            "commit": lambda t: coordinator.offset_commit(
                _commit(GROUP, 200, generation=generation, member=member), now_ms(), t
            ),
            "commit (simple)": lambda t: coordinator.offset_commit(_commit(GROUP, 300), now_ms(), t),
            "txn commit": lambda t: coordinator.txn_offset_commit(
                TxnOffsetCommitRequestData(
                    transactional_id="tx",
                    group_id=GROUP,
                    producer_id=PID,
                    producer_epoch=0,
                    topics=_commit(GROUP, 400).topics,
                    generation_id=generation,
                    member_id=member,
                ),
                now_ms(),
                t,
            ),
        }
        queued = {name: groups.call(op) for name, op in requests.items()}
        topic.acks.set()
        assert _error_of(await holding) == ErrorCode.none
        await resigning
        answers = {name: _error_of(await fut) for name, fut in queued.items()}
        print(
            {k: v.name for k, v in answers.items()},
            "groups",
            list(coordinator.groups),
            "log",
            len(topic.log) - written,
        )
        assert answers == dict.fromkeys(requests, ErrorCode.not_coordinator)
        assert groups.load_error_for(GROUP) == ErrorCode.not_coordinator  # the next one, at once
        assert GROUP not in coordinator.groups  # no group created for a partition not owned
        assert len(topic.log) == written  # nothing written for it

    asyncio.run(scenario())
