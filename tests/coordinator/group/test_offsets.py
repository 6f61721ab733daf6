"""Offsets: commit/fetch, generation checks, transactional offsets (KIP-98/447), deletes, replay."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from exactly.coordinator.group.api import (
    CommitPartition,
    CommitTopic,
    FetchGroup,
    FetchTopic,
    OffsetCommitRequestData,
    OffsetFetchRequestData,
    TxnOffsetCommitRequestData,
)
from exactly.coordinator.group.records import partition_for
from exactly.coordinator.group.state import GroupState

from .harness import GROUP, SESSION, Box, Shell

PID = 4000


def topics(offsets: dict[tuple[str, int], int], metadata: str = "") -> tuple[CommitTopic, ...]:
    by_topic: dict[str, list[CommitPartition]] = {}
    for (topic, partition), offset in offsets.items():
        by_topic.setdefault(topic, []).append(
            CommitPartition(partition_index=partition, committed_offset=offset, committed_metadata=metadata)
        )
    return tuple(CommitTopic(t, tuple(ps)) for t, ps in by_topic.items())


def commit(
    shell: Shell,
    offsets: dict[tuple[str, int], int],
    *,
    group: str = GROUP,
    generation: int = -1,
    member_id: str = "",
    api_version: int = 8,
    metadata: str = "",
    hold: bool = False,
    retention_time_ms: int = -1,
) -> Box:
    box = Box()
    request = OffsetCommitRequestData(
        group_id=group,
        topics=topics(offsets, metadata),
        generation_id=generation,
        member_id=member_id,
        retention_time_ms=retention_time_ms,
        api_version=api_version,
    )
    shell.run(shell.coordinator.offset_commit(request, shell.now, box), hold=hold)
    return box


def txn_commit(
    shell: Shell,
    offsets: dict[tuple[str, int], int],
    *,
    group: str = GROUP,
    producer_id: int = PID,
    generation: int = -1,
    member_id: str = "",
    instance: str | None = None,
    hold: bool = False,
) -> Box:
    box = Box()
    request = TxnOffsetCommitRequestData(
        transactional_id="tx",
        group_id=group,
        producer_id=producer_id,
        producer_epoch=0,
        topics=topics(offsets),
        generation_id=generation,
        member_id=member_id,
        group_instance_id=instance,
    )
    shell.run(shell.coordinator.txn_offset_commit(request, shell.now, box), hold=hold)
    return box


def errors(box: Box) -> set[ErrorCode]:
    return {p.error_code for t in box.one.topics for p in t.partitions}


def fetch(
    shell: Shell, tps: list[tuple[str, int]] | None, *, group: str = GROUP, stable: bool = False
) -> dict[tuple[str, int], int | ErrorCode]:
    """Committed offset per partition, or the partition's error code."""
    fetch_topics = None
    if tps is not None:
        names = dict.fromkeys(t for t, _ in tps)
        fetch_topics = tuple(FetchTopic(n, tuple(p for t, p in tps if t == n)) for n in names)
    response = shell.coordinator.offset_fetch(
        OffsetFetchRequestData(groups=(FetchGroup(group, fetch_topics),), require_stable=stable)
    )
    [result] = response.groups
    out: dict[tuple[str, int], int | ErrorCode] = {}
    for t in result.topics:
        for p in t.partitions:
            out[(t.name, p.partition_index)] = (
                p.error_code if p.error_code != ErrorCode.none else p.committed_offset
            )
    return out


def marker(shell: Shell, commit_: bool, *, group: str = GROUP, producer_id: int = PID) -> None:
    shell.marker(producer_id, commit_, partition_for(group, shell.config.num_partitions))


# -- plain commits -------------------------------------------------------------------------------


def test_simple_commit_without_membership_creates_empty_group() -> None:
    shell = Shell()
    assert errors(commit(shell, {("t", 0): 5, ("t", 1): 7})) == {ErrorCode.none}
    group = shell.coordinator.group(GROUP)
    assert group is not None and group.state is GroupState.EMPTY and group.protocol_type is None
    assert fetch(shell, [("t", 0), ("t", 1), ("t", 2)]) == {("t", 0): 5, ("t", 1): 7, ("t", 2): -1}
    assert fetch(shell, None) == {("t", 0): 5, ("t", 1): 7}


def test_offsets_are_visible_only_after_the_append() -> None:
    shell = Shell()
    box = commit(shell, {("t", 0): 5}, hold=True)
    assert box.items == [] and fetch(shell, [("t", 0)]) == {("t", 0): -1}
    shell.release()
    assert errors(box) == {ErrorCode.none} and fetch(shell, [("t", 0)]) == {("t", 0): 5}


def test_failed_append_commits_nothing() -> None:
    shell = Shell()
    shell.fail_with = ErrorCode.not_enough_replicas
    assert errors(commit(shell, {("t", 0): 5})) == {ErrorCode.coordinator_not_available}
    assert fetch(shell, [("t", 0)]) == {("t", 0): -1}
    shell.fail_with = ErrorCode.record_list_too_large
    assert errors(commit(shell, {("t", 0): 5})) == {ErrorCode.invalid_commit_offset_size}


def test_member_commit_generation_checks() -> None:
    shell = Shell()
    member_id, gen = shell.stable_single()
    assert errors(commit(shell, {("t", 0): 1}, generation=gen, member_id=member_id)) == {ErrorCode.none}
    assert errors(commit(shell, {("t", 0): 1}, generation=gen - 1, member_id=member_id)) == {
        ErrorCode.illegal_generation
    }
    assert errors(commit(shell, {("t", 0): 1}, generation=gen, member_id="ghost")) == {
        ErrorCode.unknown_member_id
    }
    # generation -1 and no member: only allowed for empty groups
    assert errors(commit(shell, {("t", 0): 1})) == {ErrorCode.unknown_member_id}
    assert errors(commit(shell, {("t", 0): 1}, group="none", generation=3)) == {ErrorCode.illegal_generation}
    assert errors(commit(shell, {("t", 0): 1}, group="none", generation=3, api_version=9)) == {
        ErrorCode.group_id_not_found
    }


def test_commit_during_completing_rebalance_is_rebalance_in_progress() -> None:
    shell = Shell()
    joined = shell.join_fully().one
    box = commit(shell, {("t", 0): 1}, generation=joined.generation_id, member_id=joined.member_id)
    assert errors(box) == {ErrorCode.rebalance_in_progress}


def test_commit_keeps_the_session_alive() -> None:
    shell = Shell()
    member_id, gen = shell.stable_single()
    for _ in range(4):
        shell.advance(SESSION // 2)
        assert errors(commit(shell, {("t", 0): 1}, generation=gen, member_id=member_id)) == {ErrorCode.none}
    assert shell.heartbeat(member_id, gen) == ErrorCode.none


def test_metadata_too_large_is_per_partition() -> None:
    shell = Shell()
    box = commit(shell, {("t", 0): 1}, metadata="x" * 5000)
    assert errors(box) == {ErrorCode.offset_metadata_too_large}
    assert fetch(shell, [("t", 0)]) == {("t", 0): -1}


def test_fetch_of_unknown_group_and_multi_group() -> None:
    shell = Shell()
    commit(shell, {("t", 0): 3})
    commit(shell, {("u", 0): 4}, group="g2")
    response = shell.coordinator.offset_fetch(
        OffsetFetchRequestData(
            groups=(FetchGroup(GROUP), FetchGroup("g2"), FetchGroup("nope", (FetchTopic("t", (0,)),)))
        )
    )
    offsets = [
        [(t.name, p.committed_offset) for t in g.topics for p in t.partitions] for g in response.groups
    ]
    assert offsets == [[("t", 3)], [("u", 4)], [("t", -1)]]
    assert all(g.error_code == ErrorCode.none for g in response.groups)


# -- transactional offsets -----------------------------------------------------------------------


def test_txn_offsets_pending_then_committed() -> None:
    shell = Shell()
    commit(shell, {("t", 0): 1})
    assert errors(txn_commit(shell, {("t", 0): 10, ("t", 1): 11})) == {ErrorCode.none}
    # The record went to the log as a transactional batch of the producer.
    entries = shell.log[partition_for(GROUP)]
    assert [e.producer_id for e in entries[-2:]] == [PID, PID]
    assert fetch(shell, [("t", 0), ("t", 1)]) == {("t", 0): 1, ("t", 1): -1}
    assert fetch(shell, [("t", 0), ("t", 1), ("t", 2)], stable=True) == {
        ("t", 0): ErrorCode.unstable_offset_commit,
        ("t", 1): ErrorCode.unstable_offset_commit,
        ("t", 2): -1,
    }
    marker(shell, True)
    assert fetch(shell, [("t", 0), ("t", 1)], stable=True) == {("t", 0): 10, ("t", 1): 11}
    assert shell.coordinator.offsets.pending_producers() == []


def test_txn_offsets_aborted_are_dropped() -> None:
    shell = Shell()
    commit(shell, {("t", 0): 1})
    txn_commit(shell, {("t", 0): 10})
    marker(shell, False)
    assert fetch(shell, [("t", 0)], stable=True) == {("t", 0): 1}
    assert not shell.coordinator.offsets.has_pending(GROUP)


def test_txn_offsets_are_unstable_while_their_append_waits() -> None:
    """Kafka's prepareTxnOffsetCommit: pending from before the append, never committed early."""
    shell = Shell()
    commit(shell, {("t", 0): 1})
    box = txn_commit(shell, {("t", 0): 10}, hold=True)
    assert box.items == []
    assert fetch(shell, [("t", 0), ("t", 1)], stable=True) == {
        ("t", 0): ErrorCode.unstable_offset_commit,
        ("t", 1): -1,
    }
    assert fetch(shell, [("t", 0)]) == {("t", 0): 1}
    assert shell.coordinator.offsets.open_partitions(GROUP) == {("t", 0)}
    shell.release()
    assert errors(box) == {ErrorCode.none}
    assert fetch(shell, [("t", 0)], stable=True) == {("t", 0): ErrorCode.unstable_offset_commit}
    marker(shell, True)
    assert fetch(shell, [("t", 0)], stable=True) == {("t", 0): 10}
    assert rebuilt_committed(shell) == shell.coordinator.committed_offsets(GROUP)


def test_txn_offsets_of_a_new_group_are_unstable_while_their_append_waits() -> None:
    shell = Shell()
    txn_commit(shell, {("t", 0): 10}, group="fresh", hold=True)
    assert shell.coordinator.group("fresh") is None  # created only by the completion
    assert fetch(shell, [("t", 0)], group="fresh", stable=True) == {
        ("t", 0): ErrorCode.unstable_offset_commit
    }
    assert fetch(shell, [("t", 0)], group="fresh") == {("t", 0): -1}


def test_failed_txn_append_drops_the_staged_offsets() -> None:
    shell = Shell()
    commit(shell, {("t", 0): 1})
    shell.fail_with = ErrorCode.not_enough_replicas
    box = txn_commit(shell, {("t", 0): 10})
    assert errors(box) == {ErrorCode.coordinator_not_available}
    assert fetch(shell, [("t", 0)], stable=True) == {("t", 0): 1}
    assert not shell.coordinator.offsets.has_pending(GROUP)
    assert shell.coordinator.offsets.pending_producers() == []


def test_marker_before_the_append_completes_settles_the_offset_for_good() -> None:
    """An ABORT applied while the TxnOffsetCommit's append waits: the late completion must not
    leave the aborted offset pending, or the producer's next COMMIT would commit it (Kafka's
    onTxnOffsetCommitAppend ignores it)."""
    shell = Shell()
    commit(shell, {("t", 0): 1})
    box = txn_commit(shell, {("t", 0): 10}, hold=True)
    marker(shell, False)
    assert fetch(shell, [("t", 0)], stable=True) == {("t", 0): 1}
    shell.release()
    assert errors(box) == {ErrorCode.none}
    assert not shell.coordinator.offsets.has_pending(GROUP)
    assert fetch(shell, [("t", 0)], stable=True) == {("t", 0): 1}
    txn_commit(shell, {("t", 1): 20})  # the producer's next transaction
    marker(shell, True)
    assert fetch(shell, [("t", 0), ("t", 1)], stable=True) == {("t", 0): 1, ("t", 1): 20}


def test_staged_offset_keeps_an_appended_one_of_the_same_producer_open() -> None:
    shell = Shell()
    txn_commit(shell, {("t", 0): 10})
    shell.fail_with = ErrorCode.not_enough_replicas
    txn_commit(shell, {("t", 0): 11})  # fails: the first one is still pending
    assert fetch(shell, [("t", 0)], stable=True) == {("t", 0): ErrorCode.unstable_offset_commit}
    shell.fail_with = None
    marker(shell, True)
    assert fetch(shell, [("t", 0)], stable=True) == {("t", 0): 10}


def rebuilt_committed(shell: Shell) -> dict[tuple[str, int], object]:
    return dict(shell.rebuild().committed_offsets(GROUP))


def test_later_plain_commit_wins_over_earlier_txn_commit() -> None:
    shell = Shell()
    txn_commit(shell, {("t", 0): 10})
    commit(shell, {("t", 0): 20})  # written after the transactional record
    marker(shell, True)
    assert fetch(shell, [("t", 0)]) == {("t", 0): 20}


def test_marker_on_another_partition_leaves_offsets_pending() -> None:
    shell = Shell()
    other = next(g for g in (f"grp-{i}" for i in range(100)) if partition_for(g) != partition_for(GROUP))
    txn_commit(shell, {("t", 0): 10})
    txn_commit(shell, {("t", 0): 30}, group=other)
    marker(shell, True)  # only GROUP's partition
    assert fetch(shell, [("t", 0)]) == {("t", 0): 10}
    assert fetch(shell, [("t", 0)], group=other, stable=True) == {("t", 0): ErrorCode.unstable_offset_commit}
    marker(shell, False, group=other)
    assert fetch(shell, [("t", 0)], group=other, stable=True) == {("t", 0): -1}


def test_kip447_generation_fencing() -> None:
    shell = Shell()
    member_id, gen = shell.stable_single()
    assert errors(txn_commit(shell, {("t", 0): 1}, generation=gen, member_id=member_id)) == {ErrorCode.none}
    assert errors(txn_commit(shell, {("t", 0): 1}, generation=gen - 1, member_id=member_id)) == {
        ErrorCode.illegal_generation
    }
    assert errors(txn_commit(shell, {("t", 0): 1}, generation=gen, member_id="zombie")) == {
        ErrorCode.unknown_member_id
    }
    assert errors(
        txn_commit(shell, {("t", 0): 1}, generation=gen, member_id=member_id, instance="other")
    ) == {ErrorCode.unknown_member_id}
    # Pre-KIP-447 producers (no member data) are accepted even while the group has members.
    assert errors(txn_commit(shell, {("t", 0): 1})) == {ErrorCode.none}
    # No group and a generation: ILLEGAL_GENERATION (TxnOffsetCommit has no GROUP_ID_NOT_FOUND).
    assert errors(txn_commit(shell, {("t", 0): 1}, group="nope", generation=1)) == {
        ErrorCode.illegal_generation
    }


def test_txn_commit_during_completing_rebalance_is_allowed() -> None:
    shell = Shell()
    joined = shell.join_fully().one
    box = txn_commit(shell, {("t", 0): 1}, generation=joined.generation_id, member_id=joined.member_id)
    assert errors(box) == {ErrorCode.none}


def test_offset_tombstone_clears_pending() -> None:
    shell = Shell()
    txn_commit(shell, {("t", 0): 10})
    results = Box()
    shell.run(shell.coordinator.delete_groups([GROUP], shell.now, results))
    assert results.one[0].error_code == ErrorCode.none
    marker(shell, True)
    assert shell.coordinator.group(GROUP) is None
    assert shell.coordinator.committed_offsets(GROUP) == {}


# -- DeleteGroups ----------------------------------------------------------------------------------


def test_delete_groups() -> None:
    shell = Shell()
    _member_id, _gen = shell.stable_single()
    commit(shell, {("t", 0): 1}, group="simple")
    box = Box()
    shell.run(shell.coordinator.delete_groups([GROUP, "simple", "nope"], shell.now, box))
    assert [(r.group_id, r.error_code) for r in box.one] == [
        (GROUP, ErrorCode.non_empty_group),
        ("simple", ErrorCode.none),
        ("nope", ErrorCode.group_id_not_found),
    ]
    assert shell.coordinator.group("simple") is None
    assert fetch(shell, [("t", 0)], group="simple") == {("t", 0): -1}
    assert shell.rebuild().group("simple") is None


def test_delete_is_applied_only_after_the_append() -> None:
    shell = Shell()
    commit(shell, {("t", 0): 1})
    box = Box()
    shell.run(shell.coordinator.delete_groups([GROUP], shell.now, box), hold=True)
    assert box.items == [] and fetch(shell, [("t", 0)]) == {("t", 0): 1}
    shell.release()
    assert box.one[0].error_code == ErrorCode.none and fetch(shell, [("t", 0)]) == {("t", 0): -1}


# -- replay ----------------------------------------------------------------------------------------


def snapshot(coordinator: object) -> object:
    from exactly.coordinator.group.coordinator import GroupCoordinator

    assert isinstance(coordinator, GroupCoordinator)
    groups = {}
    for gid, g in coordinator.groups.items():
        groups[gid] = (
            g.state if g.state is GroupState.EMPTY else "with-members",
            g.generation,
            g.protocol_name,
            sorted((m.member_id, m.assignment) for m in g.members.values()),
            coordinator.committed_offsets(gid),
        )
    pending = {pid: coordinator.offsets.pending(pid) for pid in coordinator.offsets.pending_producers()}
    return groups, pending


def test_replay_equals_live_state() -> None:
    shell = Shell()
    member_id, gen = shell.stable_single()
    commit(shell, {("t", 0): 1, ("t", 1): 2}, generation=gen, member_id=member_id)
    txn_commit(shell, {("t", 0): 10}, generation=gen, member_id=member_id)
    marker(shell, True)
    txn_commit(shell, {("t", 1): 20}, producer_id=PID + 1)
    marker(shell, False, producer_id=PID + 1)
    txn_commit(shell, {("t", 2): 30}, producer_id=PID + 2)  # still open
    commit(shell, {("u", 0): 5}, group="simple")
    commit(shell, {("v", 0): 6}, group="gone")
    shell.run(shell.coordinator.delete_groups(["gone"], shell.now, Box()))
    rebuilt = shell.rebuild()
    assert snapshot(rebuilt) == snapshot(shell.coordinator)
    live = shell.coordinator.committed_offsets(GROUP)
    assert {tp: o.offset for tp, o in live.items()} == {("t", 0): 10, ("t", 1): 2}
    assert rebuilt.offsets.has_pending(GROUP, "t", 2)
