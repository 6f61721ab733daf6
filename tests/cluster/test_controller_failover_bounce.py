"""A broker that re-registered (new session, new broker epoch) while there was no controller:
the next controller's failover must treat it as bounced, or the leadership its previous
incarnation held stays written in ZooKeeper while the broker itself refuses to lead on a state
older than its registration (the roles' AWAIT_CONTROLLER rule) - a partition with no serving
leader until some unrelated change comes along.

It happens when ZooKeeper expires every session at once (ZooKeeper paused, a network blip longer
than the session timeout): all brokers re-register concurrently, and the one that wins the
controller election may load its context after the others are back."""

from __future__ import annotations

from collections.abc import Callable

from exactly.cluster.controller_runtime import ControllerRuntime
from exactly.cluster.zk import ClusterZk
from exactly.cluster.znodes import BrokerRegistration, Endpoint, LeaderAndIsr, TopicAssignment
from exactly.replication.roles import PartitionRoles, RoleAction
from exactly.types import TopicPartition
from tests.cluster.helpers import wait_for

Factory = Callable[[], ClusterZk]
P0 = TopicPartition("orders", 0)
P1 = TopicPartition("orders", 1)


def register(zk: ClusterZk, broker_id: int) -> int:
    return zk.register_broker(
        BrokerRegistration(broker_id, (Endpoint("PLAINTEXT", "127.0.0.1", 9000 + broker_id),))
    )


def state(observer: ClusterZk, tp: TopicPartition) -> LeaderAndIsr | None:
    observed = observer.partition_state(tp)
    return None if observed is None else observed.state.leader_and_isr


def test_failover_treats_a_broker_registered_after_its_leadership_as_bounced(cluster_zk: Factory) -> None:
    observer = cluster_zk()
    first = cluster_zk()
    register(first, 1)
    register(cluster_zk_two := cluster_zk(), 2)
    runtime = ControllerRuntime(first, 1)
    runtime.start()
    try:
        wait_for(lambda: runtime.is_active, what="broker 1 to control")
        observer.create_topic("orders", TopicAssignment({0: (1, 2), 1: (2, 1)}), {})
        wait_for(lambda: state(observer, P0) is not None and state(observer, P1) is not None, what="states")
        assert state(observer, P0) == LeaderAndIsr(1, 0, (1, 2), 1)
    finally:
        runtime.stop()
    # Broker 1's session ends (registration and /controller go) and it registers again at once,
    # before anyone is controller: no controller ever sees it gone.
    first.stop()
    again = cluster_zk()
    new_epoch = register(again, 1)
    assert observer.controller_id() is None
    successor = ControllerRuntime(cluster_zk_two, 2)
    successor.start()
    try:
        wait_for(lambda: successor.is_active, what="broker 2 to control")

        def leadership_rewritten() -> bool:
            s = state(observer, P0)
            return s is not None and s.leader_epoch > 0

        wait_for(leadership_rewritten, what="the old incarnation's leadership to be rewritten")
    finally:
        successor.stop()
    p0 = state(observer, P0)
    assert p0 is not None and p0.leader == 2 and p0.isr == (2,)  # as a bounce: failure, then start-up
    p1 = state(observer, P1)
    assert p1 is not None and p1.leader == 2 and 1 not in p1.isr  # its old ISR membership ends too
    # The returning broker follows (the state was written after its registration): no partition
    # is left waiting for a controller.
    roles = PartitionRoles(1, broker_epoch=new_epoch)
    observed = observer.partition_state(P0)
    assert observed is not None
    decision = roles.on_state(
        P0, (1, 2), observed.state.leader_and_isr, observed.state.zk_version, observed.modified_zxid
    )
    assert decision.action is RoleAction.BECOME_FOLLOWER
