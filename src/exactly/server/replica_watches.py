"""The kazoo-thread side of cluster mode: arm the watches of topics and their partition states,
read what they point at, and hand plain values to the event loop.

Kazoo delivers watches on its own threads. Everything here runs there and only *reads* ZooKeeper
(a broker's registration, a topic's assignment and config); broker state is changed on the loop
by the callbacks the replica manager passes in, reached through ``hop`` (``call_soon_threadsafe``,
dropped once the broker stops). The bookkeeping of which topics and partitions are watched lives
here and is touched on kazoo threads only.

A topic deleted and created again gets new watches: each topic's watches carry the generation
they were armed in and end (return False) when they next fire for an older one.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Mapping

from kazoo.exceptions import KazooException

from exactly.cluster.zk import ClusterZk, ObservedState
from exactly.cluster.zk_floors import watch_floor
from exactly.cluster.znodes import TopicAssignment, ZnodeFormatError
from exactly.replication.compaction_floor import PublishedFloor
from exactly.server.metadata_cache import BrokerEndpoint, CachedTopic
from exactly.types import TopicPartition

log = logging.getLogger("exactly.replica_manager")


class ReplicaWatches:
    """The broker set, the topic set, each topic's assignment and each partition's state."""

    def __init__(
        self,
        zk: ClusterZk,
        *,
        hop: Callable[..., None],
        stopped: Callable[[], bool],
        set_brokers: Callable[[dict[int, BrokerEndpoint], dict[int, int]], None],
        set_topic: Callable[[CachedTopic], None],
        topic_gone: Callable[[str], None],
        on_state: Callable[[TopicPartition, ObservedState | None], None],
        inter_broker_listener: str = "PLAINTEXT",
        on_floor: Callable[[TopicPartition, PublishedFloor | None], None] | None = None,
    ) -> None:
        self.zk = zk
        self._inter_broker_listener = inter_broker_listener
        self._hop = hop
        self._is_stopped = stopped
        self._set_brokers = set_brokers
        self._set_topic = set_topic
        self._topic_gone = topic_gone
        self._on_state = on_state
        self._on_floor = on_floor
        # Topic -> the generation of its watches (a topic deleted and created again gets new ones,
        # the old ones end when they next fire), and the partitions whose state is watched;
        # touched on kazoo threads only.
        self._watched_topics: dict[str, int] = {}
        self._watched_partitions: dict[str, set[int]] = {}
        self._generations = itertools.count(1)

    @property
    def _stopped(self) -> bool:
        return self._is_stopped()

    def start(self) -> None:
        """Arm the broker-set and topic-set watches (each fires at once with the current value)."""
        self.zk.watch_brokers(self._on_brokers)
        self.zk.watch_topics(self._on_topics)

    def _on_brokers(self, live: Mapping[int, int]) -> None:
        endpoints: dict[int, BrokerEndpoint] = {}
        for broker_id in live:
            try:
                registration = self.zk.broker_registration(broker_id)
            except ZnodeFormatError as exc:
                log.warning("broker %d registration unreadable: %s", broker_id, exc)
                continue
            if registration is None or not registration.endpoints:
                continue
            # the inter-broker listener's endpoint for our own connections (the first one when a
            # registration lacks it); every listener's for the clients
            inter = next(
                (e for e in registration.endpoints if e.listener == self._inter_broker_listener),
                registration.endpoints[0],
            )
            endpoints[broker_id] = BrokerEndpoint(
                broker_id,
                inter.host,
                inter.port,
                {e.listener: (e.host, e.port) for e in registration.endpoints},
            )
        self._hop(self._set_brokers, endpoints, dict(live))  # with the broker epochs

    def _on_topics(self, topics: list[str]) -> None:
        names = set(topics)
        for gone in sorted(self._watched_topics.keys() - names):
            del self._watched_topics[gone]
            self._watched_partitions.pop(gone, None)
            self._hop(self._topic_gone, gone)
        for name in sorted(names - self._watched_topics.keys()):
            generation = next(self._generations)
            self._watched_topics[name] = generation
            self._watched_partitions[name] = set()
            try:
                self.zk.watch_topic_assignment(name, self._assignment_watcher(name, generation))
            except KazooException as exc:  # the session is going: the topics watch fires on reconnection
                log.info("topic %s not watched yet: %r", name, exc)
                del self._watched_topics[name]

    def _assignment_watcher(self, name: str, generation: int) -> Callable[[TopicAssignment | None], bool]:
        """The topic's assignment now and after every change (CreatePartitions adds partitions):
        the cache gets it first, then the state of every partition not watched yet is watched,
        so a role decision always sees the partition's replicas."""

        def on_assignment(assignment: TopicAssignment | None) -> bool:
            if self._watched_topics.get(name) != generation or self._stopped:
                return False
            if assignment is None:
                return True  # deleted: the topics watch reports it
            try:
                config = self.zk.topic_config(name)
            except ZnodeFormatError as exc:
                log.warning("topic %s config unreadable in ZooKeeper: %s", name, exc)
                return True
            self._hop(self._set_topic, CachedTopic(name, assignment, config))
            watched = self._watched_partitions.setdefault(name, set())
            for partition in sorted(assignment.partitions.keys() - watched):
                watched.add(partition)
                tp = TopicPartition(name, partition)
                self.zk.watch_partition_state(tp, self._state_watcher(tp, generation))
                if self._on_floor is not None:
                    watch_floor(self.zk.client, tp, self._floor_watcher(tp, generation))
            return True

        return on_assignment

    def _state_watcher(self, tp: TopicPartition, generation: int) -> Callable[[ObservedState | None], bool]:
        def on_state(observed: ObservedState | None) -> bool:
            if self._watched_topics.get(tp.topic) != generation or self._stopped:
                return False  # the topic is gone (or was created again): end this watch
            self._hop(self._on_state, tp, observed)
            return True

        return on_state

    def _floor_watcher(self, tp: TopicPartition, generation: int) -> Callable[[PublishedFloor | None], bool]:
        """The partition's replica floor, as its leader publishes it (``zk_floors``)."""

        def on_floor(floor: PublishedFloor | None) -> bool:
            if self._watched_topics.get(tp.topic) != generation or self._stopped or self._on_floor is None:
                return False
            self._hop(self._on_floor, tp, floor)
            return True

        return on_floor
