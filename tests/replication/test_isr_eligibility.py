"""Who may join an ISR (KAFKA-14140), fed with the two watches in the orders a leader sees them.

The failure this pins down (``test_sigterm_moves_leadership_before_the_leader_leaves`` under load):
the leaving broker's request and registration vanish in one ZooKeeper transaction, the leader's
requests watch reports it first, and a Fetch the leaving broker sent before it stopped its
fetchers is read in between. It must not take the broker back into the ISR."""

from __future__ import annotations

from exactly.cluster.znodes import LeaderAndIsr
from exactly.replication.isr_eligibility import IsrEligibility
from exactly.replication.leader import LeaderPartition

EPOCHS = {0: 24, 1: 32, 2: 37}  # broker id -> broker epoch (czxid of its registration)


def cluster() -> IsrEligibility:
    return IsrEligibility().on_brokers(EPOCHS)


def test_registered_brokers_without_a_request_are_eligible() -> None:
    view = cluster()
    assert all(view.eligible(b) for b in EPOCHS)
    assert not view.eligible(3)  # not registered
    assert view.shutting_down == frozenset()


def test_request_gone_before_registration_keeps_the_broker_out() -> None:
    view = cluster().on_shutdown_requests([(0, 24)])
    assert not view.eligible(0) and view.shutting_down == {0}
    view = view.on_shutdown_requests([])  # its session closed: the requests watch reports first
    assert not view.eligible(0)  # the old rule ("registered and no request now") said eligible
    assert view.shutting_down == {0}
    view = view.on_brokers({1: 32, 2: 37})  # then its registration goes
    assert not view.eligible(0) and view.shutting_down == frozenset()
    assert view.eligible(1) and view.eligible(2)


def test_registration_gone_before_request() -> None:
    view = cluster().on_shutdown_requests([(0, 24)])
    view = view.on_brokers({1: 32, 2: 37})
    assert not view.eligible(0)
    view = view.on_shutdown_requests([])
    assert not view.eligible(0)


def test_a_restarted_broker_is_eligible_again() -> None:
    view = cluster().on_shutdown_requests([(0, 24)]).on_shutdown_requests([])
    view = view.on_brokers({1: 32, 2: 37}).on_brokers({**EPOCHS, 0: 51})  # new session, new epoch
    assert view.eligible(0) and view.shutting_down == frozenset()


def test_a_bounce_seen_before_the_old_request_went_does_not_mark_the_new_registration() -> None:
    # the new registration is read while the old session's request is still listed
    view = cluster().on_shutdown_requests([(0, 24)]).on_brokers({**EPOCHS, 0: 51})
    assert view.eligible(0)
    view = view.on_shutdown_requests([(0, 24)]).on_shutdown_requests([])
    assert view.eligible(0)


def test_a_request_of_an_older_registration_marks_nothing_current() -> None:
    view = cluster().on_shutdown_requests([(1, 30)])  # Kafka's STALE_BROKER_EPOCH
    assert view.eligible(1) and view.shutting_down == frozenset()
    view = view.on_shutdown_requests([(1, 32), (1, 30)])  # a newer one marks it for good
    assert not view.eligible(1)
    assert not view.on_shutdown_requests([(1, 30)]).eligible(1)


def test_the_late_fetch_of_the_leaving_broker_does_not_expand_the_isr() -> None:
    """The broken run's order, at the new leader 1 of a partition on (0, 1, 2) that broker 0 led:
    the controlled-shutdown election left ISR (1, 2); broker 0 follows and catches up; its session
    closes; the requests watch reports first; then its last Fetch is read; then the broker set."""
    view = cluster().on_shutdown_requests([(0, 24)])
    leader = LeaderPartition(
        local_broker=1,
        state=LeaderAndIsr(1, 1, (1, 2), 1),
        zk_version=1,
        replicas=(0, 1, 2),
        leader_log_end_offset=10,
        high_watermark=10,
        now_ms=0,
        isr_eligible=lambda b: view.eligible(b),
    )
    assert leader.on_follower_fetch(0, 10, 0, now_ms=1).isr_update is None  # shutting down
    view = view.on_shutdown_requests([])  # the session closed: request gone first
    assert leader.on_follower_fetch(0, 10, 0, now_ms=2).isr_update is None  # the late Fetch
    view = view.on_brokers({1: 32, 2: 37})
    assert leader.on_follower_fetch(0, 10, 0, now_ms=3).isr_update is None
    assert leader.isr == (1, 2)
    # broker 2 is eligible all along: the same fetch path does expand for it
    leader2 = LeaderPartition(
        local_broker=1,
        state=LeaderAndIsr(1, 1, (1,), 1),
        zk_version=1,
        replicas=(0, 1, 2),
        leader_log_end_offset=10,
        high_watermark=10,
        now_ms=0,
        isr_eligible=lambda b: view.eligible(b),
    )
    update = leader2.on_follower_fetch(2, 10, 0, now_ms=4).isr_update
    assert update is not None and update.isr == (1, 2)
