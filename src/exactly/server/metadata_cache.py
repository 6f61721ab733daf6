"""What a cluster-mode broker knows of the cluster, as observed in ZooKeeper (Kafka's
``ZkMetadataCache``, filled from watches instead of UpdateMetadata requests).

Why a separate cache: Metadata, CreateTopics and the produce/fetch leadership checks must answer
from the event loop without a ZooKeeper round trip. The replica manager's watch callbacks hop to
the loop and call the ``set_*`` methods; nothing here does I/O or reads a clock.

Invariants: every mutation happens on the event loop; a partition's state is the newest one seen
(the watch delivers states in zxid order within one session, and the replica manager never stores
an older zkVersion over a newer one).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from exactly.cluster.znodes import NO_LEADER, PartitionState, TopicAssignment
from exactly.types import TopicPartition


@dataclass(frozen=True, slots=True)
class BrokerEndpoint:
    """A live broker: ``host``/``port`` are its inter-broker listener's endpoint (what replica
    fetchers and the marker sender connect to); ``listeners`` every advertised listener's, by
    name (what Metadata and FindCoordinator answer, for the listener the client came in on)."""

    broker_id: int
    host: str
    port: int
    listeners: Mapping[str, tuple[str, int]] = field(default_factory=dict)

    def endpoint_for(self, listener: str) -> tuple[str, int] | None:
        """(host, port) on ``listener``; a registration without listener names (written by an
        older exactly) is taken to serve every listener on its one endpoint."""
        if not self.listeners:
            return self.host, self.port
        return self.listeners.get(listener)


@dataclass(frozen=True, slots=True)
class PartitionMetadata:
    """One partition as Metadata reports it: ``leader`` is -1 while there is none (offline, or
    the controller has not written the first state yet) and while the state names a broker that
    is not registered (it died and the controller has not moved the leadership yet: Kafka's
    metadata cache answers LEADER_NOT_AVAILABLE then, so clients never look for a leader that is
    missing from the broker list). ``leader_epoch`` stays the state's."""

    partition: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    offline_replicas: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class CachedTopic:
    name: str
    assignment: TopicAssignment
    config: Mapping[str, str]


class MetadataCache:
    __slots__ = ("_states", "_topics", "brokers", "controller_id", "version")

    def __init__(self) -> None:
        self.brokers: dict[int, BrokerEndpoint] = {}
        self.controller_id: int | None = None
        self._topics: dict[str, CachedTopic] = {}
        self._states: dict[TopicPartition, PartitionState] = {}
        # Bumped on every change, so waiters (CreateTopics) know when to look again.
        self.version = 0

    # --- updates (event loop only) --------------------------------------------------------------

    def set_brokers(self, brokers: Mapping[int, BrokerEndpoint]) -> None:
        self.brokers = dict(brokers)
        self.version += 1

    def set_controller(self, controller_id: int | None) -> None:
        self.controller_id = controller_id
        self.version += 1

    def set_topic(self, topic: CachedTopic) -> None:
        self._topics[topic.name] = topic
        self.version += 1

    def remove_topic(self, name: str) -> None:
        cached = self._topics.pop(name, None)
        if cached is not None:
            for partition in cached.assignment.partitions:
                self._states.pop(TopicPartition(name, partition), None)
        self.version += 1

    def set_state(self, tp: TopicPartition, state: PartitionState | None) -> None:
        """Store the newest observed state (an older zkVersion never replaces a newer one)."""
        if state is None:
            self._states.pop(tp, None)
        else:
            current = self._states.get(tp)
            if current is not None and current.zk_version > state.zk_version:
                return
            self._states[tp] = state
        self.version += 1

    # --- reads ----------------------------------------------------------------------------------

    def topic_names(self) -> list[str]:
        return sorted(self._topics)

    def topic(self, name: str) -> CachedTopic | None:
        return self._topics.get(name)

    def state(self, tp: TopicPartition) -> PartitionState | None:
        return self._states.get(tp)

    def replicas(self, tp: TopicPartition) -> tuple[int, ...]:
        cached = self._topics.get(tp.topic)
        if cached is None:
            return ()
        return tuple(cached.assignment.partitions.get(tp.partition, ()))

    def partitions(self, name: str) -> list[PartitionMetadata]:
        cached = self._topics.get(name)
        if cached is None:
            return []
        out = []
        for partition, replicas in sorted(cached.assignment.partitions.items()):
            state = self._states.get(TopicPartition(name, partition))
            leader, epoch, isr = NO_LEADER, -1, tuple[int, ...]()
            if state is not None:
                lai = state.leader_and_isr
                leader, epoch, isr = lai.leader, lai.leader_epoch, tuple(lai.isr)
                if leader not in self.brokers:
                    leader = NO_LEADER
            offline = tuple(b for b in replicas if b not in self.brokers)
            out.append(PartitionMetadata(partition, leader, epoch, tuple(replicas), isr, offline))
        return out

    def leader(self, tp: TopicPartition) -> BrokerEndpoint | None:
        """The live leader of ``tp``, or None (no state yet, offline, or the leader is gone)."""
        state = self._states.get(tp)
        if state is None:
            return None
        return self.brokers.get(state.leader_and_isr.leader)

    def has_leaders(self, name: str) -> bool:
        """Every partition of ``name`` has a live leader (CreateTopics answers then, as Kafka's
        DelayedCreatePartitions)."""
        parts = self.partitions(name)
        return bool(parts) and all(p.leader != NO_LEADER for p in parts)
