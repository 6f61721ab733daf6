"""How a broker derives its role for a partition from the state znode it observes (the
"brokers watch ZooKeeper directly" design; the package README says why it was chosen over Kafka's
LeaderAndIsr/UpdateMetadata/StopReplica RPCs).

The rule is Kafka's ``becomeLeaderOrFollower`` rule, applied to observations instead of requests:

* act only on a leader epoch **greater** than the local one (a watch fires once and may merge
  several changes; reads may arrive late; comparing epochs makes the order irrelevant);
* an equal epoch with a newer zkVersion is an ISR-only change (by the leader, or a committed
  write of our own): update metadata, no role change;
* anything older or equal is ignored;
* a broker that is not among the partition's replicas stops its replica (Kafka answers
  UNKNOWN_TOPIC_OR_PARTITION to such a LeaderAndIsr).

One rule has no counterpart in Kafka, because Kafka's controller only sends LeaderAndIsr after it
processed a broker's (re-)registration: a broker does not start **leading** on a state znode last
modified before its own registration (its broker epoch, the registration's czxid). Such a state was
decided for its previous incarnation; the controller will rewrite it (bounce handling bumps the
epoch), and the broker acts then. Following is always safe, since it truncates first.

Coordinator hooks follow Kafka's ``onLeadershipChange``: ``coordinator_election`` only when the
broker was not already leader (an epoch bump with the same leader does not reload the coordinator),
``coordinator_resignation`` when it stops leading.
"""

from __future__ import annotations

import enum
from collections.abc import Collection
from dataclasses import dataclass

from exactly.cluster.znodes import NO_LEADER, LeaderAndIsr
from exactly.types import TopicPartition


class RoleAction(enum.Enum):
    BECOME_LEADER = "become leader"
    BECOME_FOLLOWER = "become follower"  # leader may be -1: offline, stop fetching, serve nothing
    UPDATE_ISR = "update isr"  # same epoch, newer zkVersion
    STOP_REPLICA = "stop replica"  # not a replica any more, or the partition was deleted
    AWAIT_CONTROLLER = "await controller"  # leader state written for a previous incarnation
    IGNORE = "ignore"  # stale or already applied


@dataclass(frozen=True, slots=True)
class RoleDecision:
    action: RoleAction
    leader: int = NO_LEADER
    leader_epoch: int = -1
    zk_version: int = -1
    isr: tuple[int, ...] = ()
    coordinator_election: bool = False
    coordinator_resignation: bool = False
    delete: bool = False


@dataclass(frozen=True, slots=True)
class LocalPartition:
    """What this broker last acted on for a partition."""

    leader: int
    leader_epoch: int
    zk_version: int


class PartitionRoles:
    """The role state of every partition on one broker incarnation.

    ``broker_epoch`` is the czxid of this broker's registration; after a session loss the broker
    registers again and calls :meth:`on_registered` with the new one.
    """

    __slots__ = ("_partitions", "broker_epoch", "broker_id")

    def __init__(self, broker_id: int, broker_epoch: int) -> None:
        self.broker_id = broker_id
        self.broker_epoch = broker_epoch
        self._partitions: dict[TopicPartition, LocalPartition] = {}

    def on_registered(self, broker_epoch: int) -> None:
        self.broker_epoch = broker_epoch

    def local(self, tp: TopicPartition) -> LocalPartition | None:
        return self._partitions.get(tp)

    def is_leader(self, tp: TopicPartition) -> bool:
        local = self._partitions.get(tp)
        return local is not None and local.leader == self.broker_id

    def on_state(
        self,
        tp: TopicPartition,
        replicas: Collection[int],
        state: LeaderAndIsr | None,
        zk_version: int,
        modified_zxid: int,
    ) -> RoleDecision:
        """An observed state znode (None: it or the topic is gone) with its stat version and mzxid."""
        local = self._partitions.get(tp)
        was_leader = local is not None and local.leader == self.broker_id
        if state is None or self.broker_id not in replicas:
            if local is None:
                return RoleDecision(RoleAction.IGNORE)
            del self._partitions[tp]
            return RoleDecision(
                RoleAction.STOP_REPLICA, coordinator_resignation=was_leader, delete=state is None
            )
        if local is not None:
            if state.leader_epoch < local.leader_epoch:
                return RoleDecision(RoleAction.IGNORE)
            if state.leader_epoch == local.leader_epoch:
                if zk_version <= local.zk_version:
                    return RoleDecision(RoleAction.IGNORE)
                self._partitions[tp] = LocalPartition(local.leader, local.leader_epoch, zk_version)
                return RoleDecision(
                    RoleAction.UPDATE_ISR, local.leader, local.leader_epoch, zk_version, state.isr
                )
        if state.leader == self.broker_id:
            if modified_zxid < self.broker_epoch:
                return RoleDecision(RoleAction.AWAIT_CONTROLLER, state.leader, state.leader_epoch, zk_version)
            self._partitions[tp] = LocalPartition(state.leader, state.leader_epoch, zk_version)
            return RoleDecision(
                RoleAction.BECOME_LEADER,
                state.leader,
                state.leader_epoch,
                zk_version,
                state.isr,
                coordinator_election=not was_leader,
            )
        self._partitions[tp] = LocalPartition(state.leader, state.leader_epoch, zk_version)
        return RoleDecision(
            RoleAction.BECOME_FOLLOWER,
            state.leader,
            state.leader_epoch,
            zk_version,
            state.isr,
            coordinator_resignation=was_leader,
        )
