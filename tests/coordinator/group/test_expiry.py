"""Offset retention and empty-group cleanup (KIP-211, KIP-496, Kafka's cleanupGroupMetadata).

The clock is the harness's ``shell.now``; every coordinator call takes it as ``now_ms``.
"""

from __future__ import annotations

import struct
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from exactly.coordinator.group.api import (
    CleanupStats,
    FetchGroup,
    FetchTopic,
    LeaveGroupRequestData,
    LeaveMember,
    OffsetFetchRequestData,
    Protocol,
)
from exactly.coordinator.group.coordinator import GroupCoordinator, GroupCoordinatorConfig
from exactly.coordinator.group.expiry import (
    ExpirationCondition,
    SubscriptionParseError,
    subscribed_topics,
)
from exactly.coordinator.group.offsets import CommittedOffset
from exactly.coordinator.group.records import (
    GroupMetadataKey,
    OffsetCommitKey,
    decode_record,
    partition_for,
)
from exactly.coordinator.group.state import GroupState

from .harness import GROUP, Box, Shell
from .test_offsets import commit as offset_commit
from .test_offsets import errors, fetch, marker, snapshot, txn_commit

RETENTION = 60_000
LONG_SESSION = 1_800_000  # members stay alive across the retention period without heartbeats


def subscription(*topic_names: str, version: int = 1) -> bytes:
    """A ConsumerProtocolSubscription: version, topics, null user data (+ empty owned partitions)."""
    out = struct.pack(">hi", version, len(topic_names))
    for name in topic_names:
        raw = name.encode()
        out += struct.pack(">h", len(raw)) + raw
    out += struct.pack(">i", -1)
    if version >= 1:
        out += struct.pack(">i", 0)
    return out


def new_shell() -> Shell:
    return Shell(GroupCoordinatorConfig(initial_rebalance_delay_ms=0, offsets_retention_ms=RETENTION))


def commit(shell: Shell, offsets: dict[tuple[str, int], int], **kwargs: Any) -> None:
    """An OffsetCommit that must succeed (test_offsets.commit's keywords)."""
    assert errors(offset_commit(shell, offsets, **kwargs)) == {ErrorCode.none}


def cleanup(shell: Shell, *, hold: bool = False) -> Box:
    box = Box()
    shell.run(shell.coordinator.cleanup_group_metadata(shell.now, box), hold=hold)
    return box


def leave(shell: Shell, member_id: str) -> None:
    box = Box()
    request = LeaveGroupRequestData(group_id=GROUP, members=(LeaveMember(member_id),))
    shell.run(shell.coordinator.leave_group(request, shell.now, box))
    assert box.one.members[0].error_code == ErrorCode.none


def consumer_group(shell: Shell, *subscribed: str) -> tuple[str, int]:
    """One Stable member of a ``consumer`` group subscribed to ``subscribed``."""
    return shell.stable_single(
        protocols=(Protocol("range", subscription(*subscribed)),), session=LONG_SESSION
    )


def fetch_from(coordinator: GroupCoordinator, tp: tuple[str, int]) -> int:
    response = coordinator.offset_fetch(
        OffsetFetchRequestData(groups=(FetchGroup(GROUP, (FetchTopic(tp[0], (tp[1],)),)),))
    )
    return response.groups[0].topics[0].partitions[0].committed_offset


def records(shell: Shell, group: str = GROUP) -> list[tuple[object, object]]:
    out = []
    for e in shell.log.get(partition_for(group), []):
        if e.key is not None:
            decoded = decode_record(e.key, e.value)
            assert decoded is not None
            out.append(decoded)
    return out


# -- consumer groups (KIP-211) ---------------------------------------------------------------------


def test_stable_consumer_group_keeps_subscribed_offsets_past_retention() -> None:
    shell = new_shell()
    member_id, gen = consumer_group(shell, "t")
    commit(shell, {("t", 0): 5}, generation=gen, member_id=member_id)
    shell.now += 10 * RETENTION
    assert cleanup(shell).one == CleanupStats()
    assert fetch(shell, [("t", 0)]) == {("t", 0): 5}
    group = shell.coordinator.group(GROUP)
    assert group is not None and group.state is GroupState.STABLE


def test_stable_consumer_group_expires_unsubscribed_topics_by_commit_time() -> None:
    # KIP-496: a Stable consumer group no longer subscribed to a topic lets its offsets age.
    shell = new_shell()
    member_id, gen = consumer_group(shell, "t")
    commit(shell, {("t", 0): 5, ("old", 0): 9}, generation=gen, member_id=member_id)
    shell.now += RETENTION - 1
    assert cleanup(shell).one == CleanupStats()
    shell.now += 1
    assert cleanup(shell).one == CleanupStats(offsets_removed=1)
    assert fetch(shell, None) == {("t", 0): 5}


def test_unparseable_subscription_keeps_everything() -> None:
    shell = new_shell()
    member_id, gen = shell.stable_single(session=LONG_SESSION)  # metadata b"sub-a" is no subscription
    commit(shell, {("t", 0): 5}, generation=gen, member_id=member_id)
    shell.now += 10 * RETENTION
    assert cleanup(shell).one == CleanupStats()
    assert fetch(shell, [("t", 0)]) == {("t", 0): 5}


def test_group_expires_retention_after_it_became_empty() -> None:
    shell = new_shell()
    member_id, gen = consumer_group(shell, "t")
    commit(shell, {("t", 0): 5, ("t", 1): 6}, generation=gen, member_id=member_id)
    shell.now += 2 * RETENTION  # the commit is old, but the group still has a member
    assert cleanup(shell).one == CleanupStats()
    leave(shell, member_id)
    group = shell.coordinator.group(GROUP)
    assert group is not None and group.state is GroupState.EMPTY
    empty_since = shell.now
    assert group.state_timestamp_ms == empty_since

    shell.now = empty_since + RETENTION - 1
    assert cleanup(shell).one == CleanupStats()
    assert fetch(shell, None) == {("t", 0): 5, ("t", 1): 6}

    shell.now = empty_since + RETENTION
    assert cleanup(shell).one == CleanupStats(offsets_removed=2, groups_removed=1)
    assert group.state is GroupState.DEAD
    assert shell.coordinator.group(GROUP) is None
    assert fetch(shell, [("t", 0)]) == {("t", 0): -1}
    assert shell.coordinator.list_groups() == []
    [described] = shell.coordinator.describe_groups([GROUP], api_version=5)
    assert (described.error_code, described.group_state) == (ErrorCode.none, "Dead")


def test_commit_into_an_empty_group_gets_a_full_retention() -> None:
    shell = new_shell()
    member_id, _gen = consumer_group(shell, "t")
    leave(shell, member_id)
    empty_since = shell.now
    shell.now += RETENTION // 2
    commit(shell, {("t", 0): 3})  # admin-style commit (generation -1) into the Empty group
    shell.now = empty_since + RETENTION
    assert cleanup(shell).one == CleanupStats()
    shell.now += RETENTION // 2
    assert cleanup(shell).one == CleanupStats(offsets_removed=1, groups_removed=1)


def test_empty_group_without_offsets_is_removed_at_the_next_run() -> None:
    shell = new_shell()
    member_id, _gen = consumer_group(shell, "t")
    leave(shell, member_id)
    assert cleanup(shell).one == CleanupStats(groups_removed=1)
    assert shell.coordinator.group(GROUP) is None


def test_group_with_a_pending_member_id_is_kept() -> None:
    shell = new_shell()
    assert shell.join().one.error_code == ErrorCode.member_id_required  # KIP-394: id handed out
    assert cleanup(shell).one == CleanupStats()
    assert shell.coordinator.group(GROUP) is not None


def test_rebalancing_group_expires_nothing() -> None:
    shell = new_shell()
    member_id, gen = consumer_group(shell, "t")
    commit(shell, {("old", 0): 1}, generation=gen, member_id=member_id)
    shell.join(member_id, protocols=(Protocol("range", subscription("t")),), session=LONG_SESSION)
    group = shell.coordinator.group(GROUP)
    assert group is not None and group.state is GroupState.COMPLETING_REBALANCE
    for kind in ("join", "sync"):  # keep it rebalancing for this check
        shell.coordinator.timers.cancel((kind, GROUP))
    shell.now += 2 * RETENTION
    assert cleanup(shell).one == CleanupStats()
    assert group.state is GroupState.COMPLETING_REBALANCE
    assert fetch(shell, [("old", 0)]) == {("old", 0): 1}


# -- simple groups and explicit expiry -------------------------------------------------------------


def test_simple_group_offsets_expire_by_their_own_commit_time() -> None:
    shell = new_shell()
    start = shell.now
    commit(shell, {("t", 0): 1})
    shell.now = start + 30_000
    commit(shell, {("t", 1): 2})
    shell.now = start + RETENTION
    assert cleanup(shell).one == CleanupStats(offsets_removed=1)
    assert fetch(shell, None) == {("t", 1): 2}
    assert shell.coordinator.group(GROUP) is not None
    # the log holds the group tombstone *after* that commit; replay keeps the offset and its group
    rebuilt = shell.rebuild()
    assert snapshot(rebuilt) == snapshot(shell.coordinator)
    assert fetch_from(rebuilt, ("t", 1)) == 2
    shell.now = start + 30_000 + RETENTION
    assert cleanup(shell).one == CleanupStats(offsets_removed=1, groups_removed=1)
    assert shell.coordinator.group(GROUP) is None


def test_recommit_restarts_the_clock() -> None:
    shell = new_shell()
    start = shell.now
    commit(shell, {("t", 0): 1})
    shell.now = start + RETENTION - 1
    commit(shell, {("t", 0): 2})
    shell.now = start + RETENTION
    assert cleanup(shell).one == CleanupStats()
    assert fetch(shell, [("t", 0)]) == {("t", 0): 2}


def test_explicit_expire_timestamp_wins() -> None:
    shell = new_shell()
    start = shell.now
    commit(shell, {("t", 0): 1}, retention_time_ms=5_000, api_version=2)
    commit(shell, {("t", 1): 1}, retention_time_ms=10 * RETENTION, api_version=4)
    entry = shell.coordinator.committed_offsets(GROUP)[("t", 0)]
    assert (entry.commit_timestamp, entry.expire_timestamp) == (start, start + 5_000)
    shell.now = start + 4_999
    assert cleanup(shell).one == CleanupStats()
    shell.now = start + 5_000
    assert cleanup(shell).one == CleanupStats(offsets_removed=1)
    shell.now = start + 2 * RETENTION  # past the broker retention, before its own expiry
    assert cleanup(shell).one == CleanupStats()
    assert fetch(shell, None) == {("t", 1): 1}
    # the expire timestamp survives a restart (value record v1)
    assert shell.rebuild().committed_offsets(GROUP)[("t", 1)].expire_timestamp == start + 10 * RETENTION


def test_default_retention_time_sets_no_expiry() -> None:
    shell = new_shell()
    commit(shell, {("t", 0): 1}, retention_time_ms=-1, api_version=2)
    assert shell.coordinator.committed_offsets(GROUP)[("t", 0)].expire_timestamp == -1


# -- transactions ----------------------------------------------------------------------------------


def test_pending_transactional_offsets_are_kept() -> None:
    shell = new_shell()
    start = shell.now
    commit(shell, {("t", 0): 1, ("t", 1): 1})
    txn_commit(shell, {("t", 0): 10, ("t", 2): 20})
    shell.now = start + 2 * RETENTION
    # t-1 has no open transaction and expires; t-0 keeps its committed offset; the group stays.
    assert cleanup(shell).one == CleanupStats(offsets_removed=1)
    assert fetch(shell, None) == {("t", 0): 1}
    assert shell.coordinator.offsets.has_pending(GROUP, "t", 0)
    assert shell.coordinator.offsets.has_pending(GROUP, "t", 2)
    assert shell.coordinator.group(GROUP) is not None

    marker(shell, False)  # ABORT: nothing pending any more
    assert cleanup(shell).one == CleanupStats(offsets_removed=1, groups_removed=1)
    assert shell.coordinator.group(GROUP) is None


def test_group_with_only_pending_offsets_is_not_removed() -> None:
    shell = new_shell()
    txn_commit(shell, {("t", 0): 10})
    shell.now += 2 * RETENTION
    assert cleanup(shell).one == CleanupStats()
    assert shell.coordinator.group(GROUP) is not None
    marker(shell, True)  # committed now, with its (old) commit timestamp
    assert cleanup(shell).one == CleanupStats(offsets_removed=1, groups_removed=1)


# -- persistence: tombstones, prepare -> persist -> complete, replay --------------------------------


def test_tombstones_offsets_first_then_the_group() -> None:
    shell = new_shell()
    commit(shell, {("t", 0): 1, ("u", 3): 2})
    before = len(records(shell))
    shell.now += RETENTION
    cleanup(shell)
    assert records(shell)[before:] == [
        (OffsetCommitKey(GROUP, "t", 0), None),
        (OffsetCommitKey(GROUP, "u", 3), None),
        (GroupMetadataKey(GROUP), None),
    ]


def test_one_append_per_partition_for_many_groups() -> None:
    shell = new_shell()
    names = [f"g{i}" for i in range(20)]
    for name in names:
        commit(shell, {("t", 0): 1}, group=name)
    shell.now += RETENTION
    result = shell.coordinator.cleanup_group_metadata(shell.now, Box())
    assert sorted(w.partition for w in result.writes) == sorted({partition_for(n) for n in names})
    shell.run(result)
    assert shell.coordinator.list_groups() == []


def test_nothing_changes_before_the_append_completes() -> None:
    shell = new_shell()
    commit(shell, {("t", 0): 1})
    shell.now += RETENTION
    box = cleanup(shell, hold=True)
    assert box.items == []
    assert fetch(shell, [("t", 0)]) == {("t", 0): 1} and shell.coordinator.group(GROUP) is not None
    shell.release()
    assert box.one == CleanupStats(offsets_removed=1, groups_removed=1)
    assert shell.coordinator.group(GROUP) is None


def test_failed_append_changes_nothing_and_the_next_run_retries() -> None:
    shell = new_shell()
    commit(shell, {("t", 0): 1})
    shell.now += RETENTION
    shell.fail_with = ErrorCode.not_enough_replicas
    assert cleanup(shell).one == CleanupStats(failed_appends=1)
    assert fetch(shell, [("t", 0)]) == {("t", 0): 1}
    shell.fail_with = None
    assert cleanup(shell).one == CleanupStats(offsets_removed=1, groups_removed=1)


def test_group_revived_before_the_append_completes_is_kept() -> None:
    shell = new_shell()
    commit(shell, {("t", 0): 1})
    shell.now += RETENTION
    box = cleanup(shell, hold=True)
    commit(shell, {("t", 1): 2})  # lands after the held tombstones would (a later record)
    shell.release()
    assert box.one == CleanupStats(offsets_removed=1)
    assert fetch(shell, None) == {("t", 1): 2}
    assert shell.coordinator.group(GROUP) is not None
    # the log holds the group tombstone *after* that commit; replay keeps the offset and its group
    rebuilt = shell.rebuild()
    assert snapshot(rebuilt) == snapshot(shell.coordinator)
    assert fetch_from(rebuilt, ("t", 1)) == 2


def test_replay_honours_expiry_tombstones() -> None:
    shell = new_shell()
    member_id, gen = consumer_group(shell, "t")
    commit(shell, {("t", 0): 5}, generation=gen, member_id=member_id)
    leave(shell, member_id)  # writes the Empty group record
    commit(shell, {("u", 0): 1}, group="simple")
    shell.now += RETENTION // 2
    commit(shell, {("u", 1): 2}, group="simple")
    shell.now += RETENTION // 2
    assert cleanup(shell).one == CleanupStats(offsets_removed=2, groups_removed=1)
    rebuilt = shell.rebuild()
    assert rebuilt.group(GROUP) is None and rebuilt.committed_offsets(GROUP) == {}
    assert snapshot(rebuilt) == snapshot(shell.coordinator)
    assert {tp for tp in rebuilt.committed_offsets("simple")} == {("u", 1)}


def test_replayed_empty_group_expires_from_its_recorded_empty_time() -> None:
    shell = new_shell()
    member_id, gen = consumer_group(shell, "t")
    commit(shell, {("t", 0): 5}, generation=gen, member_id=member_id)
    shell.now += 1_000
    leave(shell, member_id)
    empty_since = shell.now
    rebuilt = shell.rebuild()
    group = rebuilt.group(GROUP)
    assert group is not None and group.state_timestamp_ms == empty_since
    assert rebuilt.cleanup_group_metadata(empty_since + RETENTION - 1, Box()).writes == ()
    assert len(rebuilt.cleanup_group_metadata(empty_since + RETENTION, Box()).writes) == 1


# -- pieces ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [0, 1, 3])
def test_subscribed_topics_of_every_version(version: int) -> None:
    assert subscribed_topics(subscription("a", "bb", version=version)) == {"a", "bb"}


@pytest.mark.parametrize("raw", [b"", b"sub-a", struct.pack(">hi", 0, 2) + b"\x00\x01a", b"\xff\xff"])
def test_subscribed_topics_rejects_garbage(raw: bytes) -> None:
    with pytest.raises(SubscriptionParseError):
        subscribed_topics(raw)


def test_expiration_condition_rules() -> None:
    entry = CommittedOffset(offset=1, commit_timestamp=100)
    assert ExpirationCondition().is_expired("t", entry, 100 + RETENTION, RETENTION)
    empty = ExpirationCondition(empty_since_ms=200)
    assert not empty.is_expired("t", entry, 100 + RETENTION, RETENTION)
    assert empty.is_expired("t", entry, 200 + RETENTION, RETENTION)
    assert ExpirationCondition(empty_since_ms=-1).is_expired("t", entry, 100 + RETENTION, RETENTION)
    subscribed = ExpirationCondition(subscribed=frozenset({"t"}))
    assert not subscribed.is_expired("t", entry, 10 * RETENTION, RETENTION)
    explicit = CommittedOffset(offset=1, commit_timestamp=100, expire_timestamp=150)
    assert ExpirationCondition().is_expired("t", explicit, 150, RETENTION)
    assert not ExpirationCondition().is_expired("t", explicit, 149, RETENTION)
