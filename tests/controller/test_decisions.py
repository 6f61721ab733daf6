"""Controller reactions to broker failure/return/bounce, new partitions, controlled shutdown and
preferred election: the writes they produce, with epochs and expected zkVersions."""

from __future__ import annotations

from exactly.cluster.znodes import NO_LEADER, LeaderAndIsr, PartitionState
from exactly.controller.context import ControllerContext
from exactly.controller.decisions import (
    NEW_ZNODE,
    BrokerChange,
    ChangeReason,
    apply,
    controlled_shutdown,
    controlled_shutdown_pending,
    controlled_shutdowns,
    diff_brokers,
    elect_offline_partitions,
    imbalanced_partitions,
    new_partitions,
    on_broker_change,
    on_brokers_failed,
    on_controller_failover,
    preferred_elections,
)
from exactly.types import TopicPartition

T0 = TopicPartition("t", 0)
T1 = TopicPartition("t", 1)
T2 = TopicPartition("t", 2)


def ctx(
    live: set[int],
    states: dict[TopicPartition, tuple[int, int, tuple[int, ...]]],
    *,
    assignments: dict[TopicPartition, tuple[int, ...]] | None = None,
    unclean: bool = False,
    shutting_down: frozenset[int] = frozenset(),
) -> ControllerContext:
    """states: tp -> (leader, leader_epoch, isr), all at zkVersion 3, written by controller epoch 1."""
    return ControllerContext(
        controller_epoch=2,
        live_brokers={b: 100 + b for b in live},
        assignments=assignments or {tp: (1, 2, 3) for tp in states},
        states={tp: PartitionState(LeaderAndIsr(ldr, e, isr, 1), 3) for tp, (ldr, e, isr) in states.items()},
        shutting_down=shutting_down,
        unclean_election=lambda _t: unclean,
    )


def test_diff_brokers_finds_bounces_by_epoch() -> None:
    change = diff_brokers({1: 10, 2: 20, 3: 30}, {1: 10, 2: 25, 4: 40})
    assert change == BrokerChange(dead=frozenset({3}), started=frozenset({4}), bounced=frozenset({2}))
    assert diff_brokers({1: 10}, {1: 10}).empty


def test_dead_leader_replaced_from_isr_with_epoch_bump() -> None:
    c = ctx({2, 3}, {T0: (1, 5, (1, 2, 3))})
    [change] = on_brokers_failed(c, {1})
    assert change.new == LeaderAndIsr(2, 6, (2, 3), 2)
    assert change.expected_zk_version == 3
    assert change.reason is ChangeReason.OFFLINE_ELECTION


def test_dead_follower_removed_from_isr_with_epoch_bump_same_leader() -> None:
    c = ctx({1, 3}, {T0: (1, 5, (1, 2, 3))})
    [change] = on_brokers_failed(c, {2})
    assert change.new == LeaderAndIsr(1, 6, (1, 3), 2)
    assert change.reason is ChangeReason.ISR_REMOVAL


def test_last_isr_member_dies_partition_goes_offline_keeping_isr() -> None:
    c = ctx({2, 3}, {T0: (1, 5, (1,))})
    [change] = on_brokers_failed(c, {1})
    assert change.new == LeaderAndIsr(NO_LEADER, 6, (1,), 2)
    # a second failure event for the same partition changes nothing more
    assert on_brokers_failed(apply(c, [change]), {1}) == []


def test_unclean_election_only_when_enabled() -> None:
    c = ctx({2, 3}, {T0: (1, 5, (1,))}, unclean=True)
    [change] = on_brokers_failed(c, {1})
    assert change.new == LeaderAndIsr(2, 6, (2,), 2)
    assert change.reason is ChangeReason.UNCLEAN_ELECTION


def test_untouched_partitions_produce_no_writes() -> None:
    c = ctx({1, 2, 3}, {T0: (1, 5, (1, 2))}, assignments={T0: (1, 2)})
    assert on_brokers_failed(c, {3}) == []


def test_returning_broker_leads_the_offline_partitions_it_kept() -> None:
    offline = ctx({2, 3}, {T0: (NO_LEADER, 6, (1,))})
    assert elect_offline_partitions(offline) == []  # 1 still dead: stays offline
    back = ctx({1, 2, 3}, {T0: (NO_LEADER, 6, (1,))})
    [change] = on_broker_change(back, BrokerChange(frozenset(), frozenset({1}), frozenset()))
    assert change.new == LeaderAndIsr(1, 7, (1,), 2)


def test_bounce_is_failure_then_startup_with_consecutive_versions() -> None:
    # broker 1 led with ISR [1] and came back with a new session before anyone noticed it was gone
    c = ctx({1, 2, 3}, {T0: (1, 5, (1,)), T1: (2, 5, (2, 1))})
    changes = on_broker_change(c, BrokerChange(frozenset(), frozenset(), frozenset({1})))
    by_tp = [(ch.tp, ch.new, ch.expected_zk_version) for ch in changes]
    assert by_tp == [
        (T0, LeaderAndIsr(NO_LEADER, 6, (1,), 2), 3),  # failure: leaderless, ISR kept
        (T1, LeaderAndIsr(2, 6, (2,), 2), 3),  # failure: dropped from the follower ISR
        (T0, LeaderAndIsr(1, 7, (1,), 2), 4),  # start-up: its new incarnation leads again
    ]


def test_new_partitions_start_at_epoch_zero_with_live_replicas() -> None:
    c = ControllerContext(2, {1: 1, 3: 3}, {T0: (1, 2, 3), T1: (2,)}, {})
    [change] = new_partitions(c, [T0, T1])  # T1's only replica is down: nothing yet
    assert change.new == LeaderAndIsr(1, 0, (1, 3), 2)
    assert change.expected_zk_version == NEW_ZNODE
    assert apply(c, [change]).states[T0].zk_version == 0


def test_controlled_shutdown_moves_leadership_and_leaves_isr() -> None:
    c = ctx(
        {1, 2, 3},
        {T0: (1, 5, (1, 2, 3)), T1: (2, 5, (2, 1)), T2: (1, 5, (1,))},
        assignments={T0: (1, 2, 3), T1: (2, 1), T2: (1, 2)},
    )
    decision = controlled_shutdown(c, 1)
    assert [(ch.tp, ch.new) for ch in decision.changes] == [
        (T0, LeaderAndIsr(2, 6, (2, 3), 2)),
        (T1, LeaderAndIsr(2, 6, (2,), 2)),
    ]
    assert decision.remaining_leaderships == {T2}  # no other ISR member: the broker retries


def test_preferred_election_and_imbalance() -> None:
    c = ctx({1, 2, 3}, {T0: (2, 5, (1, 2, 3)), T1: (1, 5, (1, 2, 3)), T2: (2, 5, (2, 3))})
    assert imbalanced_partitions(c) == [T0, T2]
    changes = preferred_elections(c, imbalanced_partitions(c))
    # T2's preferred replica (1) is not in its ISR: left alone
    assert [(ch.tp, ch.new) for ch in changes] == [(T0, LeaderAndIsr(1, 6, (1, 2, 3), 2))]
    after = apply(c, changes)
    assert imbalanced_partitions(after) == [T2]  # 1 of broker 1's 3 preferred partitions: 33% > 10%
    assert imbalanced_partitions(after, imbalance_percentage=50) == []


def test_new_controller_handles_failures_its_predecessor_missed() -> None:
    # broker 3 died while there was no controller; T1 has no leader but its ISR member 2 is back
    c = ctx({1, 2}, {T0: (1, 5, (1, 2, 3)), T1: (NO_LEADER, 5, (2,)), T2: (3, 5, (3, 1))})
    changes = on_controller_failover(c)
    assert [(ch.tp, ch.new) for ch in changes] == [
        (T0, LeaderAndIsr(1, 6, (1, 2), 2)),
        (T1, LeaderAndIsr(2, 6, (2,), 2)),
        (T2, LeaderAndIsr(1, 6, (1,), 2)),
    ]
    # T1 with assignment (1, 2) only: no dead replica, still elected by the offline pass
    c2 = ctx({1, 2}, {T1: (NO_LEADER, 5, (2,))}, assignments={T1: (1, 2)})
    assert [ch.new for ch in on_controller_failover(c2)] == [LeaderAndIsr(2, 6, (2,), 2)]


def test_controlled_shutdowns_of_two_brokers_never_hand_leadership_to_each_other() -> None:
    c = ctx(
        {1, 2, 3},
        {T0: (1, 5, (1, 2, 3)), T1: (2, 7, (2, 1, 3))},
        assignments={T0: (1, 2, 3), T1: (2, 1, 3)},
        shutting_down=frozenset({1, 2}),
    )
    changes = controlled_shutdowns(c)
    after = apply(c, changes)
    for tp in (T0, T1):
        state = after.states[tp].leader_and_isr
        assert state.leader == 3 and state.isr == (3,)
    # T0: broker 1 hands it to 3 (epoch 6); then broker 2, no longer in its ISR, changes nothing
    by_tp = {tp: [ch for ch in changes if ch.tp == tp] for tp in (T0, T1)}
    assert [ch.new.leader_epoch for ch in by_tp[T0]] == [6]
    # T1: broker 1 leaves the ISR first (epoch 8), then broker 2 hands it over (epoch 9), each
    # write expecting the version the previous one produced
    assert [ch.new.leader_epoch for ch in by_tp[T1]] == [8, 9]
    assert [ch.expected_zk_version for ch in by_tp[T1]] == [3, 4]
    # idempotent: a retried request finds nothing left to do
    assert controlled_shutdowns(after) == []


def test_controlled_shutdowns_ignore_brokers_that_are_gone() -> None:
    c = ctx({2, 3}, {T0: (2, 5, (2, 3))}, shutting_down=frozenset({1}))
    assert controlled_shutdowns(c) == []


def test_controlled_shutdown_keeps_a_partition_whose_only_isr_member_leaves() -> None:
    c = ctx({1, 2, 3}, {T0: (1, 5, (1,))}, shutting_down=frozenset({1}))
    assert controlled_shutdowns(c) == []
    assert controlled_shutdown(c, 1).remaining_leaderships == {T0}


def test_controlled_shutdown_pending_until_leaderships_and_isr_memberships_are_gone() -> None:
    def lai(leader: int, isr: tuple[int, ...]) -> LeaderAndIsr:
        return LeaderAndIsr(leader, 5, isr, 1)

    assignments = {T0: (1, 2, 3), T1: (1, 3), T2: (2, 1), TopicPartition("single", 0): (1,)}
    states = {
        T0: lai(1, (1, 2, 3)),
        T1: lai(1, (1, 3)),
        T2: lai(2, (2, 1)),
        TopicPartition("single", 0): lai(1, (1,)),
    }
    assert controlled_shutdown_pending(1, states, assignments, {2, 3}) == {T0, T1, T2}
    # T1's other replica is gone: nobody could take it over, so it does not hold the exit
    assert controlled_shutdown_pending(1, states, assignments, {2}) == {T0, T2}
    assert controlled_shutdown_pending(1, states, assignments, set()) == {T2}  # T2: still in its ISR
    # the controller's work done: led elsewhere, out of the ISRs (the last ISR member stays)
    done = {T0: lai(2, (2, 3)), T1: lai(3, (3,)), T2: lai(2, (2,)), TopicPartition("t", 3): lai(-1, (1,))}
    assignments[TopicPartition("t", 3)] = (2, 1)
    assert controlled_shutdown_pending(1, done, assignments, {2, 3}) == frozenset()
