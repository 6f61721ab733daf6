"""The leader's view of its followers: HW, ISR shrink/expand with the maximal-ISR rule, acks=all."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from exactly.cluster.znodes import LeaderAndIsr
from exactly.replication.leader import AckOutcome, FollowerReplicaState, LeaderPartition

LAG = 10_000


def leader(
    isr: tuple[int, ...] = (1, 2, 3), leo: int = 10, hw: int = 10, now: int = 0, **kw: object
) -> LeaderPartition:
    return LeaderPartition(
        local_broker=1,
        state=LeaderAndIsr(1, 5, isr, 2),
        zk_version=7,
        replicas=(1, 2, 3),
        leader_log_end_offset=leo,
        high_watermark=hw,
        now_ms=now,
        max_lag_ms=LAG,
        **kw,  # type: ignore[arg-type]
    )


def test_last_caught_up_time_follows_kafkas_rules() -> None:
    s = FollowerReplicaState()
    s = s.after_fetch(10, 0, now_ms=100, leader_log_end_offset=10)
    assert s.last_caught_up_time_ms == 100  # reached the leader's LEO now
    s = s.after_fetch(10, 0, now_ms=200, leader_log_end_offset=15)
    assert s.last_caught_up_time_ms == 100  # reached the previous fetch's leader LEO (10) at 100
    s = s.after_fetch(15, 0, now_ms=300, leader_log_end_offset=20)
    assert s.last_caught_up_time_ms == 200  # reached 15, the leader's LEO at the fetch of time 200
    s = s.after_fetch(16, 0, now_ms=400, leader_log_end_offset=25)
    assert s.last_caught_up_time_ms == 200  # behind both: unchanged
    assert s.is_caught_up(25, now_ms=200 + LAG, max_lag_ms=LAG)
    assert not s.is_caught_up(25, now_ms=201 + LAG, max_lag_ms=LAG)
    assert s.is_caught_up(16, now_ms=10**9, max_lag_ms=LAG)  # same LEO as the leader


def test_high_watermark_is_min_leo_over_isr_and_never_decreases() -> None:
    p = leader(leo=10, hw=10)
    assert not p.on_leader_append(20, now_ms=1)
    assert not p.on_follower_fetch(2, 15, 0, now_ms=2).high_watermark_advanced
    outcome = p.on_follower_fetch(3, 18, 0, now_ms=3)
    assert outcome.high_watermark_advanced and p.high_watermark == 15
    # a follower that restarts lower (it truncated) cannot pull the HW back
    p.on_follower_fetch(2, 12, 0, now_ms=4)
    assert p.high_watermark == 15


def test_new_leader_waits_for_isr_followers_it_has_not_heard_from() -> None:
    p = leader(leo=10, hw=4)
    p.on_leader_append(12, now_ms=1)
    assert p.high_watermark == 4  # unknown follower LEOs (-1) hold it until they fetch
    p.on_follower_fetch(2, 12, 0, now_ms=2)
    assert p.high_watermark == 4
    p.on_follower_fetch(3, 11, 0, now_ms=3)
    assert p.high_watermark == 11


def test_lagging_follower_is_shrunk_only_after_the_write_commits() -> None:
    p = leader(leo=10, hw=10)
    p.on_follower_fetch(2, 10, 0, now_ms=0)
    p.on_follower_fetch(3, 10, 0, now_ms=0)
    p.on_leader_append(30, now_ms=1)
    p.on_follower_fetch(2, 30, 0, now_ms=LAG)
    assert p.maybe_shrink_isr(now_ms=LAG) is None  # 3 caught up at 0, exactly LAG ago
    update = p.maybe_shrink_isr(now_ms=LAG + 1)
    assert update is not None and update.isr == (1, 2)
    assert update.expected_zk_version == 7 and update.new.leader_epoch == 5  # the leader never bumps it
    # in flight: the maximal ISR (the old one) still holds the HW back, and no second change starts
    assert p.isr == (1, 2, 3) and p.maximal_isr == {1, 2, 3}
    assert p.high_watermark == 10 and p.maybe_shrink_isr(now_ms=LAG + 2) is None
    assert p.on_isr_committed(update, new_zk_version=8, now_ms=LAG + 2)
    assert p.isr == (1, 2) and p.zk_version == 8 and p.high_watermark == 30


def test_expand_needs_hw_and_current_epoch_start_and_eligibility() -> None:
    p = leader(isr=(1, 2), leo=10, hw=8, isr_eligible=lambda b: b != 4)
    p.on_leader_append(20, now_ms=0)
    assert p.on_follower_fetch(3, 9, 0, now_ms=1).isr_update is None  # below the epoch start (10)
    update = p.on_follower_fetch(3, 10, 0, now_ms=2).isr_update
    assert update is not None and update.isr == (1, 2, 3)
    assert p.maximal_isr == {1, 2, 3}  # counted for the HW and acks at once
    p.on_isr_failed(update)
    assert p.isr == (1, 2) and not p.isr_change_in_flight


def test_shutting_down_or_dead_broker_never_rejoins() -> None:
    p = leader(isr=(1, 2), leo=10, hw=10, isr_eligible=lambda b: b != 3)
    assert p.on_follower_fetch(3, 10, 0, now_ms=1).isr_update is None


def test_caught_up_follower_outside_the_isr_holds_the_hw_only_while_eligible() -> None:
    # 3 is out of the ISR and below the epoch start (10), so it cannot join yet, but it counts as
    # caught up (within the lag): while it may join, the HW waits for it so it is not left
    # behind; once it is shutting down (or gone) it holds nothing back.
    leaving: set[int] = set()
    p = leader(isr=(1, 2), leo=10, hw=9, isr_eligible=lambda b: b not in leaving)
    assert p.on_follower_fetch(3, 9, 0, now_ms=0).isr_update is None
    p.on_leader_append(20, now_ms=1)
    p.on_follower_fetch(2, 20, 0, now_ms=2)
    assert p.high_watermark == 9  # held by 3, caught up at 0 and eligible
    leaving.add(3)
    assert p.refresh_high_watermark(now_ms=3)
    assert p.high_watermark == 20
    assert not p.refresh_high_watermark(now_ms=4)  # nothing new


def test_zombie_leader_cannot_ack_alone() -> None:
    # The leader lost its session; a new leader was elected (the znode moved on). The followers
    # stopped fetching from it. Its shrink write fails with BADVERSION and is never adopted, so
    # its HW stays at what the followers had and acks=all writes never complete here.
    p = leader(leo=10, hw=10)
    p.on_follower_fetch(2, 10, 0, now_ms=0)
    p.on_follower_fetch(3, 10, 0, now_ms=0)
    p.on_leader_append(15, now_ms=1)
    update = p.maybe_shrink_isr(now_ms=LAG + 5)
    assert update is not None and update.isr == (1,)
    p.on_isr_failed(update)  # BADVERSION
    assert p.isr == (1, 2, 3)
    assert p.check_acks_all(15, min_insync_replicas=2) is AckOutcome.WAIT
    assert p.high_watermark == 10


def test_min_insync_replicas_before_and_after_append() -> None:
    p = leader(isr=(1,), leo=10, hw=10)
    assert p.check_before_append(-1, min_insync_replicas=2) == ErrorCode.not_enough_replicas
    assert p.check_before_append(1, min_insync_replicas=2) == ErrorCode.none
    q = leader(leo=10, hw=10)
    assert q.check_before_append(-1, min_insync_replicas=2) == ErrorCode.none
    q.on_leader_append(11, now_ms=0)
    assert q.check_acks_all(11, 2) is AckOutcome.WAIT
    q.on_follower_fetch(2, 11, 0, now_ms=1)
    update = q.maybe_shrink_isr(now_ms=LAG + 1)  # 2 caught up at 1, 3 never fetched
    assert update is not None and update.isr == (1, 2)
    q.on_isr_committed(update, 8, now_ms=LAG + 1)
    assert q.check_acks_all(11, 2) is AckOutcome.DONE
    q.on_leader_append(12, now_ms=LAG + 2)  # 2 falls behind from here on
    update = q.maybe_shrink_isr(now_ms=3 * LAG)
    assert update is not None and update.isr == (1,)
    q.on_isr_committed(update, 9, now_ms=3 * LAG)
    # appended while the ISR was big enough, acknowledged when it is not: written, maybe not durable
    assert q.check_acks_all(11, 2) is AckOutcome.NOT_ENOUGH_REPLICAS_AFTER_APPEND


def test_observed_isr_change_at_same_epoch_is_adopted() -> None:
    p = leader(leo=10, hw=10)
    assert p.on_state_observed(LeaderAndIsr(1, 5, (1, 3), 2), zk_version=8, now_ms=0) is False
    assert p.isr == (1, 3) and p.zk_version == 8
    assert not p.on_state_observed(LeaderAndIsr(1, 5, (1,), 2), zk_version=8, now_ms=0)  # not newer
    assert p.isr == (1, 3)


def test_reelection_at_a_newer_epoch_keeps_follower_log_ends_and_completes_parked_acks() -> None:
    """The controller drops dead follower 3 from the ISR with an epoch bump; leader 1 stays. A
    produce parked on 3 completes once the HW reaches it over the smaller ISR (Kafka keeps the
    same Partition and its delayed produces)."""
    p = leader(leo=10, hw=10, now=0)
    p.on_follower_fetch(2, 10, 0, now_ms=1)
    p.on_follower_fetch(3, 10, 0, now_ms=1)
    p.on_leader_append(12, now_ms=2)
    p.on_follower_fetch(2, 12, 0, now_ms=3)
    assert p.check_acks_all(12, 2) is AckOutcome.WAIT  # 3 (in the ISR) has not fetched 10-11
    shrink = p.maybe_shrink_isr(now_ms=10**6)  # a pending change is dropped by the re-election
    assert shrink is not None
    now = 10**6 + 5
    advanced = p.on_reelected(LeaderAndIsr(1, 6, (1, 2), 3), 8, (1, 2, 3), 12, now_ms=now)
    assert advanced  # follower 2's known LEO (12) counts at once
    assert (p.leader_epoch, p.zk_version, p.controller_epoch, p.isr) == (6, 8, 3, (1, 2))
    assert p.epoch_start_offset == 12 and not p.isr_change_in_flight
    assert p.high_watermark == 12
    assert p.check_acks_all(12, 2) is AckOutcome.DONE
    assert p.follower(2).last_caught_up_time_ms == now and p.follower(2).log_end_offset == 12
    assert p.follower(3).last_caught_up_time_ms == 0  # out of the ISR: never caught up since
    # The stale shrink's write result is ignored.
    assert not p.on_isr_committed(shrink, 9, now_ms=now)
    assert p.isr == (1, 2)


def test_reelection_refuses_an_older_or_foreign_state() -> None:
    p = leader()
    for state in (LeaderAndIsr(1, 5, (1, 2, 3), 2), LeaderAndIsr(2, 6, (1, 2, 3), 2)):
        try:
            p.on_reelected(state, 9, (1, 2, 3), 10, now_ms=1)
        except ValueError:
            continue
        raise AssertionError(f"accepted {state}")
