"""Ownership, Kafka's ``validateGroupStatus`` checked when a request runs: a group of a
``__consumer_offsets`` partition the coordinator did not load gets NOT_COORDINATOR, and every
group gets COORDINATOR_LOAD_IN_PROGRESS while a load runs, from every group API; nothing is
created or written for such a group. A cluster broker's request can reach the coordinator after
a reload that resigned the group's partition (it waited for the operation lock,
tests/server/test_group_runtime.py); an empty coordinator must not answer it as "unknown"."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from exactly.coordinator.group.api import (
    CommitPartition,
    CommitTopic,
    FetchGroup,
    FetchTopic,
    HeartbeatRequestData,
    JoinGroupRequestData,
    LeaveGroupRequestData,
    LeaveMember,
    OffsetCommitRequestData,
    OffsetCommitResponseData,
    OffsetFetchRequestData,
    Protocol,
    SyncGroupAssignment,
    SyncGroupRequestData,
    TxnOffsetCommitRequestData,
)
from exactly.coordinator.group.coordinator import GroupCoordinatorConfig
from exactly.coordinator.result import CoordinatorResult

from .harness import GROUP, SESSION, Box, Shell

CONFIG = GroupCoordinatorConfig(initial_rebalance_delay_ms=0, num_partitions=4)
TOPICS = (CommitTopic("t", (CommitPartition(partition_index=0, committed_offset=9),)),)


def other_group(shell: Shell) -> str:
    ours = shell.coordinator.partition_for(GROUP)
    return next(g for g in (f"g-{i}" for i in range(100)) if shell.coordinator.partition_for(g) != ours)


def fetch(shell: Shell, *group_ids: str) -> Any:
    return shell.coordinator.offset_fetch(
        OffsetFetchRequestData(groups=tuple(FetchGroup(g, (FetchTopic("t", (0,)),)) for g in group_ids))
    )


def every_api(shell: Shell, member: str, generation: int) -> dict[str, ErrorCode]:
    """Each group API once for ``GROUP``; asserts none of them writes anything."""
    coord, now = shell.coordinator, shell.now

    def answered(result: CoordinatorResult[Any]) -> Any:
        assert not result.writes
        box = Box()
        for reply in result.replies:
            assert reply.token is token
            box(reply.response)
        return box.one

    def error_of(answer: Any) -> ErrorCode:
        if isinstance(answer, OffsetCommitResponseData):
            (code,) = {p.error_code for t in answer.topics for p in t.partitions}
            assert [t.name for t in answer.topics] == ["t"]
            return code
        if isinstance(answer, list):
            (only,) = answer
            return ErrorCode(only.error_code)
        return ErrorCode(answer.error_code)

    def join(member_id: str) -> JoinGroupRequestData:
        return JoinGroupRequestData(
            group_id=GROUP,
            session_timeout_ms=SESSION,
            rebalance_timeout_ms=SESSION,
            member_id=member_id,
            protocol_type="consumer",
            protocols=(Protocol("range", b""),),
        )

    token = Box()
    out: dict[str, ErrorCode] = {}
    out["join"] = error_of(answered(coord.join_group(join(member), now, token)))
    out["join (new member)"] = error_of(answered(coord.join_group(join(""), now, token)))
    sync = SyncGroupRequestData(
        group_id=GROUP,
        generation_id=generation,
        member_id=member,
        assignments=(SyncGroupAssignment(member, b"a"),),
    )
    out["sync"] = error_of(answered(coord.sync_group(sync, now, token)))
    heartbeat = HeartbeatRequestData(group_id=GROUP, generation_id=generation, member_id=member)
    out["heartbeat"] = error_of(answered(coord.heartbeat(heartbeat, now, token)))
    leave = LeaveGroupRequestData(group_id=GROUP, members=(LeaveMember(member),))
    left = answered(coord.leave_group(leave, now, token))
    assert left.members == ()
    out["leave"] = error_of(left)
    commit = OffsetCommitRequestData(
        group_id=GROUP, topics=TOPICS, generation_id=generation, member_id=member
    )
    out["commit"] = error_of(answered(coord.offset_commit(commit, now, token)))
    simple = OffsetCommitRequestData(group_id=GROUP, topics=TOPICS)
    out["commit (simple)"] = error_of(answered(coord.offset_commit(simple, now, token)))
    txn = TxnOffsetCommitRequestData(
        transactional_id="tx",
        group_id=GROUP,
        producer_id=5,
        producer_epoch=0,
        topics=TOPICS,
        generation_id=generation,
        member_id=member,
    )
    out["txn commit"] = error_of(answered(coord.txn_offset_commit(txn, now, token)))
    out["delete"] = error_of(answered(coord.delete_groups([GROUP], now, token)))
    (fetched,) = fetch(shell, GROUP).groups
    assert fetched.topics == ()  # an error, never offsets (-1 would restart a consumer wrongly)
    out["fetch"] = fetched.error_code
    (described,) = coord.describe_groups([GROUP])
    assert described.group_state == "" and described.members == ()
    out["describe"] = described.error_code
    assert GROUP not in coord.groups and not coord.offsets.partitions_with_state(GROUP)
    return out


APIS = (
    "join",
    "join (new member)",
    "sync",
    "heartbeat",
    "leave",
    "commit",
    "commit (simple)",
    "txn commit",
    "delete",
    "fetch",
    "describe",
)


def test_every_group_api_answers_not_coordinator_for_a_partition_not_loaded() -> None:
    shell = Shell(CONFIG)
    coord = shell.coordinator
    ours = coord.partition_for(GROUP)
    member, generation = shell.stable_single()
    commit = OffsetCommitRequestData(
        group_id=GROUP,
        generation_id=generation,
        member_id=member,
        topics=(CommitTopic("t", (CommitPartition(partition_index=0, committed_offset=7),)),),
    )
    box = Box()
    shell.run(coord.offset_commit(commit, shell.now, box))
    assert box.one.topics[0].partitions[0].error_code == ErrorCode.none
    written = {p: len(entries) for p, entries in shell.log.items()}

    # resigned everything (Kafka's onResignation): owns no partition until a load names some
    shell.run(coord.unload(shell.now))
    assert every_api(shell, member, generation) == dict.fromkeys(APIS, ErrorCode.not_coordinator)
    # a load of another partition: every group waits for it, then the group is still not ours
    theirs = coord.partition_for(other_group(shell))
    coord.begin_load([theirs])
    assert every_api(shell, member, generation) == dict.fromkeys(APIS, ErrorCode.coordinator_load_in_progress)
    shell.run(coord.load_complete(shell.now))
    assert every_api(shell, member, generation) == dict.fromkeys(APIS, ErrorCode.not_coordinator)
    assert {p: len(entries) for p, entries in shell.log.items()} == written  # nothing written

    # a load of the group's own partition restores it, and it is served again
    coord.unload(shell.now)
    coord.begin_load([ours, theirs])
    for e in shell.log[ours]:
        assert e.key is not None
        coord.replay(e.key, e.value, offset=e.offset, producer_id=e.producer_id)
    shell.run(coord.load_complete(shell.now))
    assert shell.heartbeat(member, generation) == ErrorCode.none
    (described,) = coord.describe_groups([GROUP])
    assert described.error_code == ErrorCode.none and described.group_state == "Stable"
    (fetched,) = fetch(shell, GROUP).groups
    assert fetched.error_code == ErrorCode.none
    assert fetched.topics[0].partitions[0].committed_offset == 7


def test_offset_fetch_and_describe_of_several_groups_refuse_only_the_ones_not_owned() -> None:
    """A batched OffsetFetch (v8+) / DescribeGroups mixes groups of several partitions: each group
    gets its own answer, in request order."""
    shell = Shell(CONFIG)
    coord = shell.coordinator
    stranger = other_group(shell)
    member, generation = shell.stable_single()
    commit = OffsetCommitRequestData(
        group_id=GROUP, topics=TOPICS, generation_id=generation, member_id=member
    )
    box = Box()
    shell.run(coord.offset_commit(commit, shell.now, box))
    assert box.one.topics[0].partitions[0].error_code == ErrorCode.none
    coord.unload(shell.now)
    coord.begin_load([coord.partition_for(GROUP)])
    for entries in shell.log.values():
        for e in entries:
            assert e.key is not None
            coord.replay(e.key, e.value, offset=e.offset, producer_id=e.producer_id)
    shell.run(coord.load_complete(shell.now))
    mine, theirs = fetch(shell, GROUP, stranger).groups
    assert (mine.group_id, mine.error_code) == (GROUP, ErrorCode.none)
    assert mine.topics[0].partitions[0].committed_offset == 9
    assert (theirs.group_id, theirs.error_code, theirs.topics) == (stranger, ErrorCode.not_coordinator, ())
    described = coord.describe_groups([stranger, GROUP])
    assert [(d.group_id, d.error_code) for d in described] == [
        (stranger, ErrorCode.not_coordinator),
        (GROUP, ErrorCode.none),
    ]
