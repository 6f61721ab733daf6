"""The controller role against a real ZooKeeper: three registered "brokers" (ZooKeeper sessions
without a Kafka listener), each running the controller runtime; exactly one controls, it creates
initial partition states, it survives its own death (failover), and it handles failures and
bounces with leader-epoch bumps."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from exactly.cluster.controller_runtime import ControllerRuntime, topic_unclean_election
from exactly.cluster.zk import ClusterZk
from exactly.cluster.znodes import BrokerRegistration, Endpoint, LeaderAndIsr, TopicAssignment
from exactly.types import TopicPartition
from tests.cluster.helpers import expire_session, wait_for

Factory = Callable[[], ClusterZk]
P0 = TopicPartition("orders", 0)
P1 = TopicPartition("orders", 1)


class Node:
    def __init__(self, zk: ClusterZk, broker_id: int) -> None:
        self.zk = zk
        self.broker_id = broker_id
        zk.register_broker(
            BrokerRegistration(broker_id, (Endpoint("PLAINTEXT", "127.0.0.1", 9000 + broker_id),))
        )
        self.runtime = ControllerRuntime(zk, broker_id)
        self.runtime.start()


@pytest.fixture
def nodes(cluster_zk: Factory) -> Iterator[dict[int, Node]]:
    started = {b: Node(cluster_zk(), b) for b in (1, 2, 3)}
    yield started
    for node in started.values():
        node.runtime.stop()


def state(observer: ClusterZk, tp: TopicPartition) -> LeaderAndIsr | None:
    observed = observer.partition_state(tp)
    return None if observed is None else observed.state.leader_and_isr


def controller(nodes: dict[int, Node], observer: ClusterZk) -> Node:
    wait_for(lambda: observer.controller_id() in nodes, what="a controller")
    active = nodes[observer.controller_id() or -1]
    wait_for(lambda: active.runtime.is_active, what="the controller's bootstrap")
    return active


@pytest.mark.slow
def test_one_controller_creates_states_and_fails_over(nodes: dict[int, Node], cluster_zk: Factory) -> None:
    observer = cluster_zk()
    first = controller(nodes, observer)
    assert sum(n.runtime.is_active for n in nodes.values()) == 1
    observer.create_topic("orders", TopicAssignment({0: (1, 2, 3), 1: (2, 3, 1)}), {})
    wait_for(
        lambda: state(observer, P0) is not None and state(observer, P1) is not None, what="initial states"
    )
    assert state(observer, P0) == LeaderAndIsr(1, 0, (1, 2, 3), 1)
    assert state(observer, P1) == LeaderAndIsr(2, 0, (2, 3, 1), 1)
    # a new partition's first leader is not an election (the metrics' LeaderElectionRate)
    assert all(n.runtime.leader_elections == 0 for n in nodes.values())

    # the controller's broker dies: another broker takes over and handles that very failure
    dead = first.broker_id
    led_by_dead = sum(1 for tp in (P0, P1) if (s := state(observer, tp)) is not None and s.leader == dead)
    first.runtime.stop()
    first.zk.stop()
    del nodes[dead]
    second = controller(nodes, observer)
    assert second.broker_id != dead and second.runtime.lease is not None
    assert second.runtime.lease.epoch == 2

    def dead_broker_handled() -> bool:
        states = [state(observer, tp) for tp in (P0, P1)]
        return all(s is not None and s.leader != dead and dead not in s.isr for s in states)

    wait_for(dead_broker_handled, what="the dead controller's partitions to move")
    for tp in (P0, P1):
        s = state(observer, tp)
        assert s is not None and s.leader_epoch == 1 and s.controller_epoch == 2
    # the new controller elected a leader for each partition the dead broker led (none if it was
    # broker 3); an ISR removal is no election
    assert second.runtime.leader_elections == led_by_dead
    assert second.runtime.unclean_leader_elections == 0
    assert sum(n.runtime.leader_elections for n in nodes.values()) == led_by_dead


@pytest.mark.slow
def test_bounced_broker_loses_leadership_and_isr_with_epoch_bump(
    nodes: dict[int, Node], cluster_zk: Factory
) -> None:
    observer = cluster_zk()
    active = controller(nodes, observer)
    victim = next(n for b, n in nodes.items() if b != active.broker_id)
    observer.create_topic("orders", TopicAssignment({0: (victim.broker_id, active.broker_id)}), {})
    wait_for(lambda: state(observer, P0) is not None, what="the initial state")
    epochs: list[int] = []
    victim.zk.on_registered = epochs.append
    expire_session(victim.zk)  # it comes back with a new session (and broker epoch) at once
    wait_for(lambda: len(epochs) == 1, what="the victim's re-registration")

    def moved() -> bool:
        s = state(observer, P0)
        return s is not None and s.leader == active.broker_id and s.isr == (active.broker_id,)

    wait_for(moved, what="the bounce to be handled")
    s = state(observer, P0)
    assert s is not None and s.leader_epoch == 1


def test_partitions_added_to_a_topic_get_initial_states(nodes: dict[int, Node], cluster_zk: Factory) -> None:
    """CreatePartitions rewrites the assignment: the controller's per-topic watch sees it and
    creates states for the new partitions only (the topic set itself did not change)."""
    observer = cluster_zk()
    lease = controller(nodes, observer).runtime.lease
    assert lease is not None
    observer.create_topic("orders", TopicAssignment({0: (1, 2, 3)}), {})
    wait_for(lambda: state(observer, P0) is not None, what="the initial state")
    read = observer.topic_assignment_at("orders")
    assert read is not None
    assert observer.set_topic_assignment("orders", TopicAssignment({0: (1, 2, 3), 1: (3, 1, 2)}), read[1])
    wait_for(lambda: state(observer, P1) is not None, what="the added partition's state")
    assert state(observer, P1) == LeaderAndIsr(3, 0, (3, 1, 2), lease.epoch)
    assert state(observer, P0) == LeaderAndIsr(1, 0, (1, 2, 3), lease.epoch)  # untouched


def test_unclean_election_setting_is_the_topics_override_else_the_brokers(cluster_zk: Factory) -> None:
    zk = cluster_zk()
    zk.create_topic("plain", TopicAssignment({0: (1, 2)}), {})
    zk.create_topic("risky", TopicAssignment({0: (1, 2)}), {"unclean.leader.election.enable": "true"})
    zk.create_topic("safe", TopicAssignment({0: (1, 2)}), {"unclean.leader.election.enable": "false"})
    strict, lax = topic_unclean_election(zk, False), topic_unclean_election(zk, True)
    assert [strict(t) for t in ("plain", "risky", "safe")] == [False, True, False]
    assert [lax(t) for t in ("plain", "risky", "safe")] == [True, True, False]
