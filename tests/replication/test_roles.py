"""Role decisions from observed state znodes: epochs decide, not the order of observations."""

from __future__ import annotations

from exactly.cluster.znodes import NO_LEADER, LeaderAndIsr
from exactly.replication.roles import PartitionRoles, RoleAction
from exactly.types import TopicPartition

TP = TopicPartition("t", 0)
REPLICAS = (1, 2, 3)
BROKER_EPOCH = 50  # czxid of broker 1's registration


def state(leader: int, epoch: int, isr: tuple[int, ...] = (1, 2, 3)) -> LeaderAndIsr:
    return LeaderAndIsr(leader, epoch, isr, 1)


def test_become_leader_then_follower_with_coordinator_hooks() -> None:
    roles = PartitionRoles(1, BROKER_EPOCH)
    d = roles.on_state(TP, REPLICAS, state(1, 0), zk_version=0, modified_zxid=60)
    assert d.action is RoleAction.BECOME_LEADER and d.coordinator_election
    assert roles.is_leader(TP)
    # epoch bump with the same leader (e.g. a follower left the ISR): no coordinator reload
    d = roles.on_state(TP, REPLICAS, state(1, 1, (1, 3)), zk_version=1, modified_zxid=61)
    assert d.action is RoleAction.BECOME_LEADER and not d.coordinator_election
    d = roles.on_state(TP, REPLICAS, state(2, 2, (2, 3)), zk_version=2, modified_zxid=62)
    assert d.action is RoleAction.BECOME_FOLLOWER and d.leader == 2 and d.coordinator_resignation


def test_merged_or_reordered_observations_are_decided_by_epoch() -> None:
    roles = PartitionRoles(2, BROKER_EPOCH)
    # the watch skipped epoch 1 entirely and delivered epoch 3 first, then a late read of epoch 2
    assert roles.on_state(TP, REPLICAS, state(1, 3), 5, 70).action is RoleAction.BECOME_FOLLOWER
    assert roles.on_state(TP, REPLICAS, state(3, 2), 4, 69).action is RoleAction.IGNORE
    assert roles.on_state(TP, REPLICAS, state(1, 3), 5, 70).action is RoleAction.IGNORE  # seen
    local = roles.local(TP)
    assert local is not None and (local.leader, local.leader_epoch) == (1, 3)


def test_same_epoch_newer_zk_version_is_an_isr_update() -> None:
    roles = PartitionRoles(2, BROKER_EPOCH)
    roles.on_state(TP, REPLICAS, state(1, 3), 5, 70)
    d = roles.on_state(TP, REPLICAS, state(1, 3, (1, 2)), 6, 71)
    assert d.action is RoleAction.UPDATE_ISR and d.isr == (1, 2) and d.zk_version == 6


def test_offline_partition_makes_everyone_a_follower_of_nobody() -> None:
    roles = PartitionRoles(1, BROKER_EPOCH)
    roles.on_state(TP, REPLICAS, state(1, 3), 5, 70)
    d = roles.on_state(TP, REPLICAS, state(NO_LEADER, 4, (1,)), 6, 71)
    assert d.action is RoleAction.BECOME_FOLLOWER and d.leader == NO_LEADER and d.coordinator_resignation


def test_not_a_replica_or_deleted_stops_the_replica() -> None:
    roles = PartitionRoles(1, BROKER_EPOCH)
    roles.on_state(TP, REPLICAS, state(2, 3), 5, 70)
    d = roles.on_state(TP, (2, 3), state(2, 4), 6, 71)
    assert d.action is RoleAction.STOP_REPLICA and not d.delete
    assert roles.on_state(TP, (2, 3), state(2, 5), 7, 72).action is RoleAction.IGNORE
    roles.on_state(TP, REPLICAS, state(1, 6), 8, 73)
    d = roles.on_state(TP, REPLICAS, None, -1, 0)
    assert d.action is RoleAction.STOP_REPLICA and d.delete and d.coordinator_resignation


def test_leadership_decided_for_a_previous_incarnation_awaits_the_controller() -> None:
    # broker 1 re-registered at zxid 80; the state naming it leader was written at 70, before
    roles = PartitionRoles(1, 80)
    d = roles.on_state(TP, REPLICAS, state(1, 3), 5, 70)
    assert d.action is RoleAction.AWAIT_CONTROLLER and not roles.is_leader(TP)
    # the controller handles the bounce and rewrites the state: now it leads
    d = roles.on_state(TP, REPLICAS, state(1, 4), 6, 85)
    assert d.action is RoleAction.BECOME_LEADER
    # following never waits: it truncates first
    other = PartitionRoles(2, 80)
    assert other.on_state(TP, REPLICAS, state(1, 3), 5, 70).action is RoleAction.BECOME_FOLLOWER
