"""What the controller knows, as one immutable snapshot the decision functions read.

The shell keeps it current from ZooKeeper (broker ids with their czxids, topic assignments, state
znodes with their stat versions) and rebuilds a new snapshot after each applied change; decisions
are computed against a snapshot and written conditionally, so a snapshot that went stale in between
shows up as BADVERSION, never as a lost update.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from exactly.cluster.znodes import LeaderAndIsr, PartitionState
from exactly.types import TopicPartition


def _never(_topic: str) -> bool:
    return False


@dataclass(frozen=True, slots=True)
class ControllerContext:
    """``controller_epoch``: this controller's epoch (written into every state znode).
    ``live_brokers``: broker id -> broker epoch (the czxid of its registration znode).
    ``assignments``: replicas per partition, in preference order.
    ``states``: the state znode of each partition that has one, with its zkVersion.
    ``shutting_down``: brokers in controlled shutdown (never elected, never re-added to the ISR).
    ``unclean_election``: per topic, ``unclean.leader.election.enable`` (topic config over broker's).
    ``state_zxids``: the mzxid of each state znode (when it was last written); compared with a
    broker epoch (a czxid) it tells which incarnation of that broker a state was written for.
    """

    controller_epoch: int
    live_brokers: Mapping[int, int]
    assignments: Mapping[TopicPartition, tuple[int, ...]]
    states: Mapping[TopicPartition, PartitionState]
    shutting_down: frozenset[int] = frozenset()
    unclean_election: Callable[[str], bool] = field(default=_never)
    state_zxids: Mapping[TopicPartition, int] = field(default_factory=dict)

    def is_live(self, broker: int) -> bool:
        return broker in self.live_brokers

    def partitions_on(self, broker: int) -> Iterator[TopicPartition]:
        for tp, replicas in sorted(self.assignments.items(), key=lambda kv: (kv[0].topic, kv[0].partition)):
            if broker in replicas:
                yield tp

    def leader_and_isr(self, tp: TopicPartition) -> LeaderAndIsr | None:
        state = self.states.get(tp)
        return state.leader_and_isr if state is not None else None
