"""The controller role of one broker: elect, load, react — applying ``exactly.controller`` decisions.

Why a thread and a queue
------------------------
Kafka's controller handles one event at a time (``ControllerEventManager``): decisions read one
consistent context and nothing interleaves. Here kazoo delivers watch callbacks on its own
threads, so callbacks only *enqueue* events; one worker thread takes them in order, reads
ZooKeeper, computes decisions with the sans-IO functions and writes them fenced by
``/controller_epoch``. ZooKeeper calls block that worker only, never the broker's event loop.

Epochs, not events: an event only says "something changed"; the worker re-reads what it needs
(the broker set with czxids, the state znodes with zkVersions), so merged or repeated watch
notifications are harmless. A write refused with BADVERSION triggers a re-read and a new decision
(bounded); a failed fence (:class:`ControllerMovedError`) ends this controller's term.

Scope: election and failover, broker failure / start-up / bounce, initial states of new
partitions (of new topics: the children of ``/brokers/topics``; added to existing topics by
CreatePartitions: a ``DataWatch`` per topic, Kafka's PartitionModifications event), topic deletion
(``/admin/delete_topics``), controlled shutdown (requests under ``/controlled_shutdown``, see
``cluster.controlled_shutdown``) and the automatic preferred-leader rebalance
(``auto.leader.rebalance.enable``: first check 5 s after winning the election, then every
``leader.imbalance.check.interval.seconds``, as Kafka schedules it). The rebalance timer is the
worker's own queue timeout, so it runs between events like any other event.

Brokers with a current controlled-shutdown request are in the context's ``shutting_down`` for
every decision (never elected, never given a new partition), as Kafka's ``liveBrokerIds``
excludes them.
"""

from __future__ import annotations

import enum
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kazoo.exceptions import KazooException

from exactly.cluster.controlled_shutdown import ShutdownRequests, in_effect
from exactly.cluster.zk import ClusterZk, ControllerLease, ControllerMovedError
from exactly.cluster.znodes import PartitionState, TopicAssignment, ZnodeFormatError
from exactly.controller.context import ControllerContext
from exactly.controller.decisions import (
    BrokerChange,
    ChangeReason,
    StateChange,
    apply,
    controlled_shutdowns,
    diff_brokers,
    imbalanced_partitions,
    new_partitions,
    on_broker_change,
    on_controller_failover,
    preferred_elections,
)
from exactly.types import TopicPartition

log = logging.getLogger(__name__)

MAX_DECISION_ROUNDS = 5
ELECTIONS = frozenset(
    {
        ChangeReason.OFFLINE_ELECTION,
        ChangeReason.UNCLEAN_ELECTION,
        ChangeReason.CONTROLLED_SHUTDOWN,
        ChangeReason.PREFERRED_ELECTION,
    }
)


class ControllerEvent(enum.Enum):
    CONTROLLER_CHANGED = "controller changed"
    BROKERS_CHANGED = "brokers changed"
    TOPICS_CHANGED = "topics changed"
    PARTITIONS_ADDED = "partitions added to topics"
    TOPIC_DELETIONS = "topics marked for deletion"
    CONTROLLED_SHUTDOWN = "controlled shutdown requested"
    AUTO_REBALANCE = "automatic preferred leader election"
    STOP = "stop"


def _never(_topic: str) -> bool:
    return False


def topic_unclean_election(zk: ClusterZk, broker_default: bool) -> Callable[[str], bool]:
    """``unclean.leader.election.enable`` per topic, as Kafka resolves it: the topic's override
    in ``/config/topics/<t>`` over the broker's setting. Read on the controller's worker thread
    (which may block on ZooKeeper), only for partitions without a live ISR member; an unreadable
    config falls back to the broker's setting."""

    def enabled(topic: str) -> bool:
        try:
            override = zk.topic_config(topic).get("unclean.leader.election.enable")
        except ZnodeFormatError as exc:
            log.warning(
                "topic %s config unreadable, using the broker's unclean election setting: %s", topic, exc
            )
            return broker_default
        return broker_default if override is None else override.strip().lower() == "true"

    return enabled


FIRST_REBALANCE_DELAY_S = 5.0  # Kafka schedules the first check 5 s after the election


@dataclass(frozen=True, slots=True)
class LeaderRebalance:
    """``auto.leader.rebalance.enable`` is on: check every ``interval_s``
    (``leader.imbalance.check.interval.seconds``) against ``imbalance_percentage``
    (``leader.imbalance.per.broker.percentage``)."""

    interval_s: float = 300.0
    imbalance_percentage: int = 10
    first_delay_s: float = FIRST_REBALANCE_DELAY_S


class ControllerRuntime:
    """Run with :meth:`start` after the broker registered; :meth:`stop` on shutdown."""

    def __init__(
        self,
        zk: ClusterZk,
        broker_id: int,
        *,
        unclean_election: Callable[[str], bool] = _never,
        rebalance: LeaderRebalance | None = None,
    ) -> None:
        self.zk = zk
        self.broker_id = broker_id
        self.unclean_election = unclean_election
        self.rebalance = rebalance
        self.shutdown_requests = ShutdownRequests(zk.client)
        self._next_rebalance: float | None = None  # time.monotonic() of the next check, while active
        self.lease: ControllerLease | None = None
        self._events: queue.Queue[ControllerEvent] = queue.Queue()
        self._known_brokers: dict[int, int] = {}
        self._watching = False
        # Topics with an assignment DataWatch (kept for the controller's life: a watch on a deleted
        # topic waits for its re-creation), and the topics whose assignment changed since the
        # worker last looked; both touched by kazoo threads and the worker, under the lock.
        self._assignment_watches: set[str] = set()
        self._modified_topics: set[str] = set()
        self._lock = threading.Lock()
        self._worker = threading.Thread(target=self._run, name=f"controller-{broker_id}", daemon=True)
        # Set whenever this broker wins an election (tests and metrics wait on it).
        self.elected = threading.Event()
        # Kafka's LeaderElectionRateAndTimeMs / UncleanLeaderElectionsPerSec as counts: leader
        # elections this broker wrote as the controller (committed writes only). Ints bumped by the
        # worker thread and read whole by the metrics collector, so no lock is needed.
        self.leader_elections = 0
        self.unclean_leader_elections = 0

    @property
    def is_active(self) -> bool:
        return self.lease is not None

    def start(self) -> None:
        self._worker.start()
        self.zk.watch_controller(lambda _controller: self._events.put(ControllerEvent.CONTROLLER_CHANGED))

    def stop(self) -> None:
        self._events.put(ControllerEvent.STOP)
        self._worker.join(10)

    # --- the worker ----------------------------------------------------------------------------

    def _next_event(self) -> ControllerEvent:
        """The next queued event, or AUTO_REBALANCE once its time has come."""
        while True:
            due = self._next_rebalance
            if due is None or self.lease is None:
                return self._events.get()
            try:
                return self._events.get(timeout=max(0.0, due - time.monotonic()))
            except queue.Empty:
                if self._next_rebalance is not None and time.monotonic() >= self._next_rebalance:
                    return ControllerEvent.AUTO_REBALANCE

    def _run(self) -> None:
        while True:
            event = self._next_event()
            if event is ControllerEvent.STOP:
                return
            try:
                self._handle(event)
            except ControllerMovedError:
                log.warning("broker %d: controller epoch moved on, resigning", self.broker_id)
                self.lease = None
            except Exception:  # a ZK hiccup: the next event re-reads everything
                log.exception("broker %d: controller event %s failed", self.broker_id, event.value)

    def _handle(self, event: ControllerEvent) -> None:
        if event is ControllerEvent.CONTROLLER_CHANGED:
            current = self.zk.controller_id()
            if current is None:
                self._try_elect()
            elif current != self.broker_id and self.lease is not None:
                log.info("broker %d: broker %d is controller now", self.broker_id, current)
                self.lease = None
                self._next_rebalance = None
            return
        if self.lease is None:
            return
        if event is ControllerEvent.BROKERS_CHANGED:
            live = self.zk.live_brokers()
            change = diff_brokers(self._known_brokers, live)
            self._known_brokers = live
            if not change.empty:
                log.info(
                    "controller: brokers dead %s started %s bounced %s",
                    sorted(change.dead),
                    sorted(change.started),
                    sorted(change.bounced),
                )
                # A retry round must not handle a bounce twice (it would bump epochs again): later
                # rounds only finish failures and elections, which are idempotent.
                settled = BrokerChange(change.dead, change.started, frozenset())
                self._decide_and_apply(
                    lambda ctx, rnd: (
                        on_broker_change(ctx, change if rnd == 0 else settled) + self._missing_states(ctx)
                    )
                )
        elif event is ControllerEvent.TOPICS_CHANGED:
            self._decide_and_apply(lambda ctx, _rnd: self._missing_states(ctx))
        elif event is ControllerEvent.PARTITIONS_ADDED:
            with self._lock:
                topics, self._modified_topics = self._modified_topics, set()
            if topics:
                self._decide_and_apply(lambda ctx, _rnd: self._missing_states(ctx), topics=topics)
        elif event is ControllerEvent.TOPIC_DELETIONS:
            # Brokers watch the assignments, so no StopReplica round is needed: removing the
            # topic's znodes is the whole decision (a marker for an unknown topic just goes).
            for topic in self.zk.topics_to_delete():
                self.zk.delete_topic(self.lease, topic)
        elif event is ControllerEvent.CONTROLLED_SHUTDOWN:
            # Every attempt of a shutting-down broker lands here; the decision is idempotent.
            self._decide_and_apply(lambda ctx, _rnd: controlled_shutdowns(ctx))
            if log.isEnabledFor(logging.INFO):
                self._log_remaining()
        elif event is ControllerEvent.AUTO_REBALANCE:
            assert self.rebalance is not None
            try:
                percentage = self.rebalance.imbalance_percentage
                self._decide_and_apply(
                    lambda ctx, _rnd: preferred_elections(ctx, imbalanced_partitions(ctx, percentage))
                )
            finally:
                self._next_rebalance = time.monotonic() + self.rebalance.interval_s

    def _log_remaining(self) -> None:
        """Kafka's answer to the shutting-down broker, as a log line: what it still leads."""
        ctx = self.load_context()
        for broker in sorted(ctx.shutting_down):
            remaining = sorted(
                str(tp)
                for tp in ctx.partitions_on(broker)
                if len(ctx.assignments[tp]) > 1
                and (lai := ctx.leader_and_isr(tp)) is not None
                and lai.leader == broker
            )
            log.info("controlled shutdown of broker %d: remaining leaderships %s", broker, remaining)

    def _try_elect(self) -> None:
        lease = self.zk.elect_controller(self.broker_id)
        if lease is None:
            return
        self.lease = lease
        self._known_brokers = self.zk.live_brokers()
        # Failover bootstrap: handle failures the previous controller may have missed, create
        # missing states, and continue controlled shutdowns the previous one was handling.
        self._decide_and_apply(lambda ctx, _rnd: self._bootstrap(ctx))
        if not self._watching:
            self._watching = True
            self.zk.watch_brokers(lambda _live: self._events.put(ControllerEvent.BROKERS_CHANGED))
            self.zk.watch_topics(self._on_topics)
            self.zk.watch_topic_deletions(lambda _topics: self._events.put(ControllerEvent.TOPIC_DELETIONS))
            self.shutdown_requests.watch(lambda _ids: self._events.put(ControllerEvent.CONTROLLED_SHUTDOWN))
        if self.rebalance is not None:
            self._next_rebalance = time.monotonic() + self.rebalance.first_delay_s
        self.elected.set()

    def _on_topics(self, topics: list[str]) -> None:
        """Kazoo thread: arm an assignment watch on every new topic *before* the worker re-reads
        the topics, so a partition added after that read fires the watch."""
        for topic in topics:
            with self._lock:
                if topic in self._assignment_watches:
                    continue
                self._assignment_watches.add(topic)
            try:
                self.zk.watch_topic_assignment(topic, self._assignment_watcher(topic))
            except KazooException as exc:  # the session is going: the topics watch fires on reconnection
                log.info("controller: no assignment watch on %s yet: %r", topic, exc)
                with self._lock:
                    self._assignment_watches.discard(topic)
        self._events.put(ControllerEvent.TOPICS_CHANGED)

    def _assignment_watcher(self, topic: str) -> Callable[[TopicAssignment | None], bool]:
        first = True

        def on_change(assignment: TopicAssignment | None) -> bool:
            nonlocal first
            if first:  # the arming read: TOPICS_CHANGED (queued next) reads the topic anyway
                first = False
                return True
            if assignment is not None:
                with self._lock:
                    self._modified_topics.add(topic)
                self._events.put(ControllerEvent.PARTITIONS_ADDED)
            return True

        return on_change

    def _bootstrap(self, ctx: ControllerContext) -> list[StateChange]:
        changes = on_controller_failover(ctx)
        changes += self._missing_states(apply(ctx, changes))
        return changes + controlled_shutdowns(apply(ctx, changes))

    @staticmethod
    def _missing_states(ctx: ControllerContext) -> list[StateChange]:
        return new_partitions(ctx, [tp for tp in ctx.assignments if tp not in ctx.states])

    # --- context and application ---------------------------------------------------------------

    def load_context(self, topics: Iterable[str] | None = None) -> ControllerContext:
        """A fresh snapshot of the cluster, or of ``topics`` only (a partition addition needs
        nothing else: the decision only creates states for that topic's partitions)."""
        assert self.lease is not None
        assignments: dict[TopicPartition, tuple[int, ...]] = {}
        states: dict[TopicPartition, PartitionState] = {}
        zxids: dict[TopicPartition, int] = {}
        for topic in self.zk.topics() if topics is None else sorted(topics):
            assignment = self.zk.topic_assignment(topic)
            if assignment is None:
                continue
            for partition, replicas in assignment.partitions.items():
                tp = TopicPartition(topic, partition)
                assignments[tp] = replicas
                observed = self.zk.partition_state(tp)
                if observed is not None:
                    states[tp] = observed.state
                    zxids[tp] = observed.modified_zxid
        live = self.zk.live_brokers()
        return ControllerContext(
            controller_epoch=self.lease.epoch,
            live_brokers=live,
            assignments=assignments,
            states=states,
            shutting_down=in_effect(self.shutdown_requests.read(), live),
            unclean_election=self.unclean_election,
            state_zxids=zxids,
        )

    def _count_election(self, change: StateChange) -> None:
        """A committed change that chose a leader counts as an election; a new partition's first
        state and an ISR removal do not (Kafka does not time those as elections either)."""
        if change.reason in ELECTIONS:
            self.leader_elections += 1
            if change.reason is ChangeReason.UNCLEAN_ELECTION:
                self.unclean_leader_elections += 1

    def _decide_and_apply(
        self,
        decide: Callable[[ControllerContext, int], list[StateChange]],
        *,
        topics: Iterable[str] | None = None,
    ) -> None:
        """Decide against a fresh context (of ``topics`` only when given) and write; a refused
        write (the znode moved) means the context was stale: read again and decide again, a
        bounded number of times."""
        for round_number in range(MAX_DECISION_ROUNDS):
            assert self.lease is not None
            ctx = self.load_context(topics)
            changes = decide(ctx, round_number)
            if not changes:
                return
            results = self.zk.write_partition_states(self.lease, changes)
            for result in results:
                if result.new_zk_version is not None:
                    self._count_election(result.change)
                    log.info(
                        "controller epoch %d: %s %s -> leader %d epoch %d isr %s",
                        self.lease.epoch,
                        result.change.tp,
                        result.change.reason.value,
                        result.change.new.leader,
                        result.change.new.leader_epoch,
                        list(result.change.new.isr),
                    )
            if all(r.new_zk_version is not None for r in results):
                return
        log.error("controller: decisions kept racing with other writers; will retry on the next event")
