"""Membership: join/sync/heartbeat/leave lifecycles, rebalances, timeouts, static members, replay."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from exactly.coordinator.group.api import (
    CommitPartition,
    CommitTopic,
    JoinGroupRequestData,
    LeaveGroupRequestData,
    LeaveMember,
    OffsetCommitRequestData,
    Protocol,
)
from exactly.coordinator.group.coordinator import GroupCoordinatorConfig
from exactly.coordinator.group.records import GroupMetadataKey, decode_record, partition_for
from exactly.coordinator.group.state import GroupState

from .harness import GROUP, REBALANCE, SESSION, Box, Shell

S = GroupState


def group_records(shell: Shell) -> list[object]:
    out = []
    for e in shell.log.get(partition_for(GROUP), []):
        if e.key is None:
            continue
        decoded = decode_record(e.key, e.value)
        assert decoded is not None
        if isinstance(decoded[0], GroupMetadataKey):
            out.append(decoded[1])
    return out


# -- KIP-394 and the single-member lifecycle -------------------------------------------------------


def test_member_id_required_then_join_sync_heartbeat() -> None:
    shell = Shell()
    first = shell.join().one
    assert first.error_code == ErrorCode.member_id_required
    assert first.member_id.startswith("c-")
    assert shell.coordinator.group(GROUP) is not None  # created, with an empty-metadata record
    joined = shell.join(first.member_id).one  # delay 0: answered inside the call
    assert joined.error_code == ErrorCode.none
    assert (joined.member_id, joined.generation_id, joined.leader) == (first.member_id, 1, first.member_id)
    assert joined.protocol_name == "range"
    assert [m.member_id for m in joined.members] == [first.member_id]
    assert shell.coordinator.group(GROUP).state is S.COMPLETING_REBALANCE  # type: ignore[union-attr]
    assert shell.heartbeat(first.member_id, 1) == ErrorCode.none  # heartbeats allowed before sync

    synced = shell.sync(first.member_id, 1, {first.member_id: b"A"}).one
    assert (synced.error_code, synced.assignment, synced.protocol_name) == (ErrorCode.none, b"A", "range")
    assert shell.coordinator.group(GROUP).state is S.STABLE  # type: ignore[union-attr]
    assert shell.heartbeat(first.member_id, 1) == ErrorCode.none
    records = group_records(shell)
    assert records[0].generation == 0 and records[0].members == ()  # type: ignore[attr-defined]
    assert records[-1].members[0].assignment == b"A"  # type: ignore[attr-defined]


def test_old_clients_join_without_member_id_round_trip() -> None:
    shell = Shell()
    joined = shell.join(version=3).one
    assert joined.error_code == ErrorCode.none
    assert joined.member_id and joined.generation_id == 1


def test_static_member_needs_no_member_id_round_trip() -> None:
    shell = Shell()
    joined = shell.join(instance="i1").one
    assert joined.error_code == ErrorCode.none
    assert joined.member_id.startswith("i1-")


def test_invalid_session_timeout_and_group_id() -> None:
    shell = Shell()
    assert shell.join(session=10).one.error_code == ErrorCode.invalid_session_timeout
    assert shell.join(group="").one.error_code == ErrorCode.invalid_group_id
    assert shell.join("ghost").one.error_code == ErrorCode.unknown_member_id


def test_inconsistent_protocol_is_rejected() -> None:
    shell = Shell()
    shell.stable_single()
    other = shell.join(protocols=(Protocol("roundrobin", b""),)).one
    assert other.error_code == ErrorCode.inconsistent_group_protocol


# -- initial rebalance delay -----------------------------------------------------------------------


def test_initial_delay_holds_first_join_and_extends_for_newcomers() -> None:
    shell = Shell(GroupCoordinatorConfig(initial_rebalance_delay_ms=3000))
    a_id = shell.join().one.member_id
    a = shell.join(a_id)
    assert a.items == []  # parked in the delay window
    assert shell.coordinator.next_deadline() == shell.now + 3000
    shell.advance(2000)
    b_id = shell.join(client_id="d").one.member_id
    b = shell.join(b_id, client_id="d")
    shell.advance(1000)  # first window ends, but B arrived: extended
    assert a.items == [] and b.items == []
    shell.advance(3000)
    assert a.one.generation_id == b.one.generation_id == 1
    assert len(a.one.members) == 2 and b.one.members == ()


def test_zero_delay_answers_a_lone_consumer_at_once() -> None:
    shell = Shell(GroupCoordinatorConfig(initial_rebalance_delay_ms=0))
    box = shell.join_fully()
    assert box.one.error_code == ErrorCode.none


# -- two members -----------------------------------------------------------------------------------


def two_member_stable(shell: Shell) -> tuple[str, str, int]:
    a_id, gen = shell.stable_single()
    b_id = shell.join(client_id="d").one.member_id
    b = shell.join(b_id, client_id="d")
    assert b.items == []  # waits for A to re-join
    assert shell.heartbeat(a_id, gen) == ErrorCode.rebalance_in_progress
    assert shell.sync(a_id, gen).one.error_code == ErrorCode.rebalance_in_progress
    a = shell.join(a_id)
    assert a.one.leader == a_id and b.one.leader == a_id
    gen2 = a.one.generation_id
    assert gen2 == gen + 1 == b.one.generation_id
    assert {m.member_id for m in a.one.members} == {a_id, b_id} and b.one.members == ()
    follower = shell.sync(b_id, gen2)
    assert follower.items == []  # parked until the leader's assignment is persisted
    leader = shell.sync(a_id, gen2, {a_id: b"A", b_id: b"B"}, hold=True)
    assert follower.items == [] and leader.items == []
    shell.release()
    assert leader.one.assignment == b"A" and follower.one.assignment == b"B"
    assert shell.coordinator.group(GROUP).state is S.STABLE  # type: ignore[union-attr]
    return a_id, b_id, gen2


def test_two_members_join_sync() -> None:
    two_member_stable(Shell())


def test_leave_triggers_rebalance_and_generation_checks() -> None:
    shell = Shell()
    a_id, b_id, gen = two_member_stable(shell)
    box = Box()
    shell.run(
        shell.coordinator.leave_group(
            LeaveGroupRequestData(group_id=GROUP, members=(LeaveMember(b_id),)), shell.now, box
        )
    )
    assert box.one.members[0].error_code == ErrorCode.none
    assert shell.heartbeat(b_id, gen) == ErrorCode.unknown_member_id
    assert shell.heartbeat(a_id, gen) == ErrorCode.rebalance_in_progress
    a = shell.join(a_id).one  # A is the only member left: the join phase completes at once
    assert a.generation_id == gen + 1
    assert shell.heartbeat(a_id, gen) == ErrorCode.illegal_generation
    assert shell.sync(a_id, gen).one.error_code == ErrorCode.illegal_generation


def test_last_member_leaving_empties_group_and_persists_it() -> None:
    shell = Shell()
    a_id, gen = shell.stable_single()
    box = Box()
    shell.run(
        shell.coordinator.leave_group(
            LeaveGroupRequestData(group_id=GROUP, members=(LeaveMember(a_id),)), shell.now, box
        )
    )
    group = shell.coordinator.group(GROUP)
    assert group is not None and group.state is S.EMPTY and group.generation == gen + 1
    last = group_records(shell)[-1]
    assert last.members == () and last.generation == gen + 1  # type: ignore[attr-defined]


def test_leave_unknown_member_and_static_by_instance_id() -> None:
    shell = Shell()
    joined = shell.join(instance="i1").one
    shell.sync(joined.member_id, 1, {joined.member_id: b"x"}, instance="i1")
    box = Box()
    request = LeaveGroupRequestData(group_id=GROUP, members=(LeaveMember("nobody"), LeaveMember("", "i1")))
    shell.run(shell.coordinator.leave_group(request, shell.now, box))
    assert [m.error_code for m in box.one.members] == [ErrorCode.unknown_member_id, ErrorCode.none]
    assert shell.coordinator.group(GROUP).state is S.EMPTY  # type: ignore[union-attr]


# -- timeouts --------------------------------------------------------------------------------------


def test_session_timeout_removes_member_and_rebalances() -> None:
    shell = Shell()
    a_id, b_id, gen = two_member_stable(shell)
    shell.advance(SESSION // 2)
    assert shell.heartbeat(a_id, gen) == ErrorCode.none
    group = shell.coordinator.group(GROUP)
    assert group is not None and b_id in group.members
    shell.advance(SESSION // 2)
    # B stopped heartbeating: its session expired, the group rebalances without it.
    assert group is not None and b_id not in group.members
    assert shell.heartbeat(a_id, gen) == ErrorCode.rebalance_in_progress
    a = shell.join(a_id).one
    assert a.generation_id == gen + 1 and [m.member_id for m in a.members] == [a_id]


def test_rebalance_timeout_kicks_members_that_do_not_rejoin() -> None:
    shell = Shell()
    a_id, b_id, gen = two_member_stable(shell)
    a = shell.join(a_id)  # the leader re-joins: rebalance; B keeps heartbeating but never re-joins
    assert a.items == []
    elapsed = 0
    while elapsed < REBALANCE - SESSION // 2:
        shell.advance(SESSION // 2)
        elapsed += SESSION // 2
        assert shell.heartbeat(b_id, gen) == ErrorCode.rebalance_in_progress
        assert a.items == []
    shell.advance(REBALANCE - elapsed)
    assert a.one.generation_id == gen + 1 and [m.member_id for m in a.one.members] == [a_id]
    assert shell.heartbeat(b_id, gen) == ErrorCode.unknown_member_id


def test_pending_member_id_expires() -> None:
    shell = Shell()
    a_id, gen = shell.stable_single()
    pending = shell.join(client_id="d").one.member_id
    shell.advance(SESSION // 2)
    assert shell.heartbeat(a_id, gen) == ErrorCode.none
    shell.advance(SESSION // 2)  # the handed-out id was never used: dropped, the group unaffected
    assert shell.heartbeat(a_id, gen) == ErrorCode.none
    assert shell.join(pending, client_id="d").one.error_code == ErrorCode.unknown_member_id


def test_rejoin_after_lost_join_response_gets_same_generation() -> None:
    shell = Shell()
    first = shell.join_fully().one
    again = shell.join(first.member_id).one  # same metadata during CompletingRebalance
    assert (again.generation_id, again.member_id) == (first.generation_id, first.member_id)
    assert [m.member_id for m in again.members] == [first.member_id]  # still the leader
    assert shell.coordinator.group(GROUP).state is S.COMPLETING_REBALANCE  # type: ignore[union-attr]


def test_follower_rejoin_with_same_metadata_in_stable_is_not_a_rebalance() -> None:
    shell = Shell()
    a_id, b_id, gen = two_member_stable(shell)
    b = shell.join(b_id, client_id="d").one
    assert (b.error_code, b.generation_id, b.members) == (ErrorCode.none, gen, ())
    assert shell.coordinator.group(GROUP).state is S.STABLE  # type: ignore[union-attr]
    changed = shell.join(b_id, client_id="d", protocols=(Protocol("range", b"sub-b"),))
    assert changed.items == []  # new metadata: rebalance, parked until A re-joins
    assert shell.heartbeat(a_id, gen) == ErrorCode.rebalance_in_progress


def test_members_that_never_sync_are_removed() -> None:
    shell = Shell()
    a_id, _gen = shell.stable_single()
    b_id = shell.join(client_id="d").one.member_id
    b = shell.join(b_id, client_id="d")
    a = shell.join(a_id)
    gen2 = a.one.generation_id
    shell.sync(a_id, gen2, {a_id: b"A", b_id: b"B"})  # B never sends SyncGroup
    shell.advance(SESSION // 2)
    shell.heartbeat(a_id, gen2)
    shell.advance(REBALANCE)
    group = shell.coordinator.group(GROUP)
    assert group is not None and b_id not in group.members
    assert b.one.generation_id == gen2


# -- static membership (KIP-345) -------------------------------------------------------------------


def test_static_member_rejoin_keeps_assignment_without_rebalance() -> None:
    shell = Shell()
    joined = shell.join(instance="i1").one
    old_id, gen = joined.member_id, joined.generation_id
    shell.sync(old_id, gen, {old_id: b"mine"}, instance="i1")
    # The process restarts: same instance id, empty member id.
    again = shell.join(instance="i1", hold=True)
    assert again.items == []  # waits for the group record with the new id
    shell.release()
    resp = again.one
    assert resp.error_code == ErrorCode.none and resp.member_id != old_id
    assert resp.generation_id == gen  # no rebalance
    assert resp.skip_assignment and resp.leader == resp.member_id  # v9: leader keeps its assignment
    assert shell.coordinator.group(GROUP).state is S.STABLE  # type: ignore[union-attr]
    synced = shell.sync(resp.member_id, gen, instance="i1").one
    assert synced.assignment == b"mine"
    # The old incarnation is fenced.
    assert shell.heartbeat(old_id, gen, instance="i1") == ErrorCode.fenced_instance_id
    assert group_records(shell)[-1].members[0].member_id == resp.member_id  # type: ignore[attr-defined]


def test_static_member_replacement_fences_parked_join() -> None:
    shell = Shell(GroupCoordinatorConfig(initial_rebalance_delay_ms=3000))
    first = shell.join(instance="i1")
    assert first.items == []
    second = shell.join(instance="i1")
    assert first.one.error_code == ErrorCode.fenced_instance_id
    shell.advance(3000)
    assert second.one.error_code == ErrorCode.none


def test_static_member_survives_join_timeout_as_not_rejoined() -> None:
    shell = Shell()
    joined = shell.join(instance="i1").one
    shell.sync(joined.member_id, 1, {joined.member_id: b"x"}, instance="i1")
    other = shell.join_fully(client_id="d")  # a dynamic member forces a rebalance
    for _ in range(REBALANCE // (SESSION // 2)):
        assert other.items == []
        shell.advance(SESSION // 2)  # i1 heartbeats but never re-joins
        shell.heartbeat(joined.member_id, 1, instance="i1")
    group = shell.coordinator.group(GROUP)
    assert group is not None and joined.member_id in group.members  # static members are not kicked
    assert other.one.generation_id == 2
    # The joined member leads (the old leader did not re-join) and still assigns to the static one.
    assert other.one.leader == other.one.member_id
    assert {m.member_id for m in other.one.members} == {other.one.member_id, joined.member_id}


# -- failures and replay ---------------------------------------------------------------------------


def test_failed_assignment_append_reports_error_to_everyone() -> None:
    shell = Shell()
    joined = shell.join_fully().one
    shell.fail_with = ErrorCode.not_leader_or_follower
    box = shell.sync(joined.member_id, joined.generation_id, {joined.member_id: b"A"})
    assert box.one.error_code == ErrorCode.not_coordinator
    assert shell.coordinator.group(GROUP).state is not S.STABLE  # type: ignore[union-attr]


def test_replay_rebuilds_stable_group() -> None:
    shell = Shell()
    _a_id, _b_id, _gen = two_member_stable(shell)
    live = shell.coordinator.group(GROUP)
    rebuilt = shell.rebuild().group(GROUP)
    assert live is not None and rebuilt is not None
    assert rebuilt.state is S.STABLE
    assert (rebuilt.generation, rebuilt.protocol_type, rebuilt.protocol_name, rebuilt.leader_id) == (
        live.generation,
        live.protocol_type,
        live.protocol_name,
        live.leader_id,
    )
    assert {m: (x.assignment, x.session_timeout_ms, x.client_id) for m, x in rebuilt.members.items()} == {
        m: (x.assignment, x.session_timeout_ms, x.client_id) for m, x in live.members.items()
    }


def test_loaded_members_must_heartbeat_again() -> None:
    shell = Shell()
    _a_id, gen = shell.stable_single()
    fresh = shell.rebuild()
    fresh.load_complete(shell.now)
    assert fresh.next_deadline() == shell.now + SESSION
    fresh.poll(shell.now + SESSION)
    group = fresh.group(GROUP)
    assert group is not None and group.state is S.EMPTY and not group.members
    assert group.generation == gen + 1


def test_describe_and_list_groups() -> None:
    shell = Shell()
    _a_id, _gen = shell.stable_single()
    [described] = shell.coordinator.describe_groups([GROUP])
    assert (described.group_state, described.protocol_type, described.protocol_data) == (
        "Stable",
        "consumer",
        "range",
    )
    assert described.members[0].member_assignment == b"assign-1"
    assert described.members[0].member_metadata == b"sub-a"
    [missing] = shell.coordinator.describe_groups(["nope"], api_version=6)
    assert (missing.group_state, missing.error_code) == ("Dead", ErrorCode.group_id_not_found)
    assert [g.group_id for g in shell.coordinator.list_groups(["STABLE"])] == [GROUP]
    assert shell.coordinator.list_groups(["Empty"]) == []
    assert shell.coordinator.list_groups(types_filter=["consumer"]) == []


def test_reply_callbacks_may_reenter() -> None:
    """A client that sends SyncGroup from inside its JoinGroup callback sees a consistent group."""
    shell = Shell()
    member_id = shell.join().one.member_id
    synced = Box()

    def on_join(resp: object) -> None:
        shell.run(
            shell.coordinator.sync_group(
                __import__("exactly.coordinator.group.api", fromlist=["x"]).SyncGroupRequestData(
                    group_id=GROUP,
                    generation_id=resp.generation_id,
                    member_id=member_id,  # type: ignore[attr-defined]
                    assignments=(),
                ),
                shell.now,
                synced,
            )
        )

    request = JoinGroupRequestData(
        group_id=GROUP,
        session_timeout_ms=SESSION,
        rebalance_timeout_ms=REBALANCE,
        member_id=member_id,
        protocol_type="consumer",
        protocols=(Protocol("range", b""),),
    )
    shell.run(shell.coordinator.join_group(request, shell.now, on_join))
    assert synced.one.error_code == ErrorCode.none


def test_group_max_size() -> None:
    shell = Shell(GroupCoordinatorConfig(initial_rebalance_delay_ms=0, max_group_size=1))
    shell.stable_single()
    assert shell.join(client_id="d").one.error_code == ErrorCode.group_max_size_reached


def test_unload_answers_parked_joins_not_coordinator_and_reload_restores_the_log_state() -> None:
    shell = Shell()
    member_id, generation = shell.stable_single()
    commit = OffsetCommitRequestData(
        group_id=GROUP,
        generation_id=generation,
        member_id=member_id,
        topics=(CommitTopic("t", (CommitPartition(partition_index=0, committed_offset=7),)),),
    )
    box = Box()
    shell.run(shell.coordinator.offset_commit(commit, shell.now, box))
    assert box.one.topics[0].partitions[0].error_code == ErrorCode.none
    other = shell.join_fully(client_id="c2")  # a rebalance starts; the newcomer waits for the leader
    assert other.items == []
    shell.run(shell.coordinator.unload(shell.now))
    assert other.one.error_code == ErrorCode.not_coordinator
    assert shell.coordinator.groups == {} and shell.coordinator.next_deadline() is None
    assert shell.coordinator.committed_offsets(GROUP) == {}
    assert shell.heartbeat(member_id, generation) == ErrorCode.not_coordinator  # owns nothing now
    # a reload replays the log into the same coordinator: the last persisted generation is back
    shell.coordinator.begin_load()
    for partition in sorted(shell.log):
        for e in shell.log[partition]:
            assert e.key is not None
            shell.coordinator.replay(e.key, e.value, offset=e.offset, producer_id=e.producer_id)
    shell.run(shell.coordinator.load_complete(shell.now))
    group = shell.coordinator.group(GROUP)
    assert group is not None and group.generation == generation and list(group.members) == [member_id]
    assert shell.coordinator.committed_offsets(GROUP)[("t", 0)].offset == 7
    assert shell.heartbeat(member_id, generation) == ErrorCode.none
