"""A controller's failover finds brokers that bounced while nobody was controller: a state znode
written before a live broker's registration (mzxid < broker epoch) names an earlier incarnation."""

from __future__ import annotations

from exactly.cluster.znodes import NO_LEADER, LeaderAndIsr, PartitionState
from exactly.controller.context import ControllerContext
from exactly.controller.decisions import ChangeReason, on_controller_failover, stale_replicas
from exactly.types import TopicPartition

T0 = TopicPartition("t", 0)
T1 = TopicPartition("t", 1)
T2 = TopicPartition("t", 2)


def ctx(
    live: dict[int, int],
    states: dict[TopicPartition, tuple[int, tuple[int, ...], int]],
) -> ControllerContext:
    """states: tp -> (leader, isr, mzxid), leader epoch 4 at zkVersion 3; replicas (1, 2, 3)."""
    return ControllerContext(
        controller_epoch=2,
        live_brokers=live,
        assignments={tp: (1, 2, 3) for tp in states},
        states={tp: PartitionState(LeaderAndIsr(ldr, 4, isr, 1), 3) for tp, (ldr, isr, _z) in states.items()},
        state_zxids={tp: zxid for tp, (_l, _i, zxid) in states.items()},
    )


def test_a_leader_registered_after_its_state_was_written_is_stale() -> None:
    c = ctx({1: 500, 2: 100, 3: 110}, {T0: (1, (1, 2, 3), 200), T1: (2, (2, 3), 300)})
    assert stale_replicas(c) == {T0: {1}}


def test_an_isr_member_registered_after_its_state_was_written_is_stale() -> None:
    c = ctx({1: 100, 2: 100, 3: 400}, {T0: (1, (1, 2, 3), 200)})
    assert stale_replicas(c) == {T0: {3}}


def test_states_written_after_every_registration_name_nobody_stale() -> None:
    c = ctx({1: 100, 2: 110, 3: 120}, {T0: (1, (1, 2, 3), 200), T1: (2, (2, 3), 130)})
    assert stale_replicas(c) == {}
    assert on_controller_failover(c) == []


def test_failover_handles_a_stale_incarnation_as_a_bounce() -> None:
    """Broker 1 re-registered (epoch 500) after leading T0 and following T1: both end with an epoch
    bump, like on_broker_change's bounce; T2, whose ISR took it in after its registration (a newer
    write), keeps it."""
    c = ctx(
        {1: 500, 2: 100, 3: 110},
        {T0: (1, (1, 2, 3), 200), T1: (2, (2, 1), 300), T2: (3, (3, 1), 600)},
    )
    changes = on_controller_failover(c)
    assert [(ch.tp, ch.new, ch.reason) for ch in changes] == [
        (T0, LeaderAndIsr(2, 5, (2, 3), 2), ChangeReason.OFFLINE_ELECTION),
        (T1, LeaderAndIsr(2, 5, (2,), 2), ChangeReason.ISR_REMOVAL),
    ]


def test_a_stale_last_isr_member_is_elected_again() -> None:
    """Offline T0 kept broker 1 as its last ISR member when it died; back with a new epoch before
    any controller saw it, it is the only clean choice and gets elected."""
    c = ctx({1: 500, 2: 100}, {T0: (NO_LEADER, (1,), 200)})
    changes = on_controller_failover(c)
    assert [ch.new for ch in changes] == [LeaderAndIsr(1, 5, (1,), 2)]
