"""The controller runtime's controlled-shutdown and auto-rebalance events against a real
ZooKeeper: registered "brokers" (sessions without a Kafka listener) each run the runtime."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from exactly.cluster.controlled_shutdown import ShutdownRequests
from exactly.cluster.controller_runtime import ControllerRuntime, LeaderRebalance
from exactly.cluster.zk import ClusterZk
from exactly.cluster.znodes import (
    BrokerRegistration,
    Endpoint,
    LeaderAndIsr,
    TopicAssignment,
    partition_state_path,
)
from exactly.types import TopicPartition
from tests.cluster.helpers import wait_for

Factory = Callable[[], ClusterZk]
P0 = TopicPartition("orders", 0)
P1 = TopicPartition("orders", 1)
REBALANCE = LeaderRebalance(interval_s=0.2, first_delay_s=0.2)


def start_nodes(cluster_zk: Factory, rebalance: LeaderRebalance | None) -> dict[int, ControllerRuntime]:
    runtimes = {}
    for broker_id in (1, 2, 3):
        zk = cluster_zk()
        zk.register_broker(
            BrokerRegistration(broker_id, (Endpoint("PLAINTEXT", "127.0.0.1", 9000 + broker_id),))
        )
        runtimes[broker_id] = ControllerRuntime(zk, broker_id, rebalance=rebalance)
        runtimes[broker_id].start()
    return runtimes


@pytest.fixture
def nodes(cluster_zk: Factory) -> Iterator[dict[int, ControllerRuntime]]:
    runtimes = start_nodes(cluster_zk, None)
    yield runtimes
    for runtime in runtimes.values():
        runtime.stop()


@pytest.fixture
def rebalancing_nodes(cluster_zk: Factory) -> Iterator[dict[int, ControllerRuntime]]:
    runtimes = start_nodes(cluster_zk, REBALANCE)
    yield runtimes
    for runtime in runtimes.values():
        runtime.stop()


def state(observer: ClusterZk, tp: TopicPartition) -> LeaderAndIsr | None:
    observed = observer.partition_state(tp)
    return None if observed is None else observed.state.leader_and_isr


def active(nodes: dict[int, ControllerRuntime]) -> ControllerRuntime:
    wait_for(lambda: any(r.is_active for r in nodes.values()), what="a controller")
    return next(r for r in nodes.values() if r.is_active)


def test_shutdown_request_moves_leadership_and_isr_membership(
    nodes: dict[int, ControllerRuntime], cluster_zk: Factory
) -> None:
    observer = cluster_zk()
    active(nodes)
    observer.create_topic("orders", TopicAssignment({0: (1, 2, 3), 1: (2, 1, 3)}), {})
    wait_for(lambda: state(observer, P0) is not None and state(observer, P1) is not None, what="states")
    leaving = nodes[1]
    assert leaving.zk.broker_epoch is not None
    # a request from an earlier incarnation of broker 1 is ignored (Kafka: STALE_BROKER_EPOCH)
    ShutdownRequests(observer.client).request(1, leaving.zk.broker_epoch - 1)
    ShutdownRequests(leaving.zk.client).request(1, leaving.zk.broker_epoch)

    def moved() -> bool:
        s0, s1 = state(observer, P0), state(observer, P1)
        return s0 is not None and s0.leader == 2 and s1 is not None and 1 not in s1.isr

    wait_for(moved, what="broker 1's leadership and ISR membership to go")
    s0 = state(observer, P0)
    assert s0 is not None and (s0.leader, s0.leader_epoch, s0.isr) == (2, 1, (2, 3))
    s1 = state(observer, P1)
    assert s1 is not None and s1.leader == 2 and s1.isr == (2, 3) and s1.leader_epoch == 1


def test_only_requests_of_current_incarnations_count(
    nodes: dict[int, ControllerRuntime], cluster_zk: Factory
) -> None:
    observer = cluster_zk()
    controller = active(nodes)
    observer.create_topic("orders", TopicAssignment({0: (1, 2, 3)}), {})
    wait_for(lambda: state(observer, P0) is not None, what="the state")
    epoch = nodes[1].zk.broker_epoch
    assert epoch is not None
    ShutdownRequests(observer.client).request(1, epoch - 1)
    # the controller sees the request (it reads them into every context) and ignores it
    wait_for(lambda: controller.load_context().shutting_down == frozenset(), what="a context")
    ShutdownRequests(observer.client).request(1, epoch)
    wait_for(lambda: controller.load_context().shutting_down == {1}, what="the current request")


def test_auto_rebalance_returns_leadership_to_the_preferred_replica(
    rebalancing_nodes: dict[int, ControllerRuntime], cluster_zk: Factory
) -> None:
    observer = cluster_zk()
    controller = active(rebalancing_nodes)
    observer.create_topic("orders", TopicAssignment({0: (1, 2, 3)}), {})
    wait_for(lambda: state(observer, P0) is not None, what="the state")
    # someone else leads with the preferred replica in the ISR (as after a controlled shutdown
    # and the broker's return): the rebalance timer hands it back, epoch +1
    observed = observer.partition_state(P0)
    assert observed is not None
    assert controller.lease is not None
    moved = observed.state.leader_and_isr.new_leader_and_isr(2, (2, 3, 1), controller.lease.epoch)
    observer.client.set(partition_state_path("orders", 0), moved.encode(), version=observed.state.zk_version)
    wait_for(lambda: (s := state(observer, P0)) is not None and s.leader == 1, what="the preferred leader")
    s = state(observer, P0)
    assert s is not None and s.leader_epoch == moved.leader_epoch + 1 and s.isr == (2, 3, 1)
