"""Cluster mode (``zookeeper.connect`` set): this broker's membership in a ZooKeeper-coordinated
cluster, and its role for every partition it hosts (Kafka's ``ReplicaManager`` driven by
observed ZooKeeper state instead of LeaderAndIsr requests; ``exactly/cluster/README.md`` says why).

Threads: kazoo delivers watches on its own threads; ``replica_watches.ReplicaWatches`` reads
there and hands plain values to the event loop (``_hop``); broker state (logs, roles, leaders,
the metadata cache) is touched on the loop only. Blocking ZooKeeper calls made for the loop
(start-up, ISR writes by ``isr_writer.IsrWriter``) run in the default executor.

Decisions are the sans-IO ones: ``PartitionRoles.on_state`` says become leader / follower /
update ISR / stop; ``LeaderPartition`` owns the leader's HW and ISR; ``fetch_checks`` the epoch
rules of reads. This module applies them to the local logs; what a leadership does on the hot
path once it exists (HW publication, follower fetches, acks=all waits) is
``leader_replicas.LeaderReplicas`` (``leading``, whose ``leaders`` dict this module fills). Changing the cluster's topic set
(CreateTopics, DeleteTopics, auto-creation) is ``cluster_topics``' job, reached as ``topics``.

Lifecycle: ``start`` (connect, register with the advertised endpoint, start the watches and the
controller role) -> serve -> on SIGTERM ``server.controlled_shutdown`` (leaderships move away
while this broker still serves and follows; what could not move is resigned) -> ``stop`` (stop
the fetchers and the controller, close the session: the registration, any ``/controller`` and
the shutdown request disappear at once).

Coordinators: after every role change of a ``__consumer_offsets`` / ``__transaction_state``
partition the group / transaction coordinator is told which partitions this broker now leads
(``_coordinators_follow``); they load and unload accordingly.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from exactly.cluster.controlled_shutdown import ShutdownRequest
from exactly.cluster.controller_runtime import ControllerRuntime, LeaderRebalance, topic_unclean_election
from exactly.cluster.producer_ids import ZkProducerIdManager
from exactly.cluster.zk import BrokerIdInUseError, ClusterZk, ObservedState
from exactly.cluster.zk_acls import ZkAclStore
from exactly.cluster.zk_base import call_with_retry
from exactly.cluster.zk_scram import ZkScramStore
from exactly.cluster.znodes import BrokerRegistration, Endpoint
from exactly.replication.fetch_checks import check_follower_fetch, check_partition_read
from exactly.replication.isr_eligibility import IsrEligibility
from exactly.replication.leader import LeaderPartition
from exactly.replication.roles import PartitionRoles, RoleAction, RoleDecision
from exactly.server.clock import now_ms
from exactly.server.cluster_topics import ClusterTopics
from exactly.server.controlled_shutdown import controlled_shutdown, resign_leaderships
from exactly.server.isr_writer import IsrWriter
from exactly.server.leader_replicas import LeaderReplicas
from exactly.server.metadata_cache import BrokerEndpoint, CachedTopic, MetadataCache
from exactly.server.replica_fetcher import LeaderFetcher
from exactly.server.replica_floors import ReplicaFloors, high_watermark_checkpoint_loop
from exactly.server.replica_watches import ReplicaWatches
from exactly.topics import INTERNAL_TOPICS, TRANSACTION_STATE_TOPIC
from exactly.types import TopicPartition

if TYPE_CHECKING:
    from exactly.security.authorizer import Authorizer
    from exactly.server.broker import Broker

log = logging.getLogger("exactly.replica_manager")

REGISTRATION_POLL_S = 0.2


class ReplicaManager:
    def __init__(self, broker: Broker) -> None:
        config = broker.config
        self.broker = broker
        self.broker_id = config.node_id
        self.zk = ClusterZk(
            config.get("zookeeper.connect"),
            session_timeout_ms=config.get_int("zookeeper.session.timeout.ms"),
        )
        unclean = topic_unclean_election(self.zk, config.get_bool("unclean.leader.election.enable"))
        rebalance = (
            LeaderRebalance(
                interval_s=config.get_int("leader.imbalance.check.interval.seconds"),
                imbalance_percentage=config.get_int("leader.imbalance.per.broker.percentage"),
            )
            if config.get_bool("auto.leader.rebalance.enable")
            else None
        )
        self.controller = ControllerRuntime(
            self.zk, self.broker_id, unclean_election=unclean, rebalance=rebalance
        )
        # Live brokers and the registrations marked leaving by a controlled-shutdown request:
        # who may join an ISR (KAFKA-14140), one value fed by both watches (isr_eligibility).
        self.eligibility = IsrEligibility()
        self.producer_ids = ZkProducerIdManager(self.zk.client, self.broker_id)
        self.cache = MetadataCache()
        self.cluster_id = broker.logs.cluster_id  # replaced by /cluster/id at start
        self.roles = PartitionRoles(self.broker_id, broker_epoch=0)
        # The leader side (HW, follower fetches, acks=all waits) of the partitions this broker
        # leads; ``leaders`` is its dict, filled and emptied by the role changes here.
        self.leading = LeaderReplicas(
            broker, self.broker_id, lambda tp, leader, update: self.isr_writer.write(tp, leader, update)
        )
        self.leaders = self.leading.leaders
        self.delayed_produces = self.leading.delayed_produces
        # the handlers' entry points to it
        self.on_follower_fetch = self.leading.on_follower_fetch
        self.after_leader_append = self.leading.after_leader_append
        self.park_for_acks = self.leading.park_for_acks
        self.wait_for_acks = self.leading.wait_for_acks
        self.max_lag_ms = config.get_int("replica.lag.time.max.ms")
        # Bumped *before* every change to what ``check_follower_read`` reads (topic assignments,
        # partition roles and epochs, leaderships): a parked follower Fetch whose checks passed at
        # the current count needs no second pass when an append wakes it (follower_fetch_fast).
        self.role_changes = 0
        # how long a fetcher waits for one response before it drops the connection and reconnects
        self.fetch_timeout_s = config.get_int("replica.socket.timeout.ms") / 1000
        self._loop: asyncio.AbstractEventLoop | None = None
        self._cache_changed: asyncio.Event | None = None
        self._stopped = False
        self.fetchers: dict[int, LeaderFetcher] = {}
        self._background: set[asyncio.Task[None]] = set()
        # CreateTopics / DeleteTopics / auto-creation, and the local replica of a hosted topic.
        self.topics = ClusterTopics(
            self.zk, self.cache, broker.logs, config, wait_for_cache=self.wait_for_cache, spawn=self._spawn
        )
        # What the log cleaner may remove tombstones and markers below (replica_floors).
        self.floors = ReplicaFloors(
            self.broker_id,
            client=lambda: self.zk.client,
            cache=self.cache,
            roles=self.roles,
            leaders=self.leaders,
            logs=broker.logs,
        )
        # Kazoo threads: the broker and topic sets, assignments, partition states and floors (replica_watches).
        # SCRAM credentials in /config/users, watched into a copy the event loop reads
        self.scram = ZkScramStore()
        self.watches = ReplicaWatches(
            self.zk,
            hop=self._hop,
            stopped=lambda: self._stopped,
            set_brokers=self._set_brokers,
            set_topic=self._set_topic,
            topic_gone=self._topic_gone,
            on_state=self._on_state,
            inter_broker_listener=broker.config.listeners().inter_broker,
            on_floor=self.floors.on_published,
        )
        # The leader's conditional ISR writes and the isr-expiration timer (isr_writer).
        self.isr_writer = IsrWriter(
            self.zk,
            self.leaders,
            max_lag_ms=self.max_lag_ms,
            spawn=self._spawn,
            publish_high_watermark=self.leading.publish_high_watermark,
        )

    # --- lifecycle -------------------------------------------------------------------------------

    async def start(self, endpoints: tuple[tuple[str, str, str, int], ...]) -> None:
        """``endpoints``: (listener, security protocol, host, port) of every advertised listener."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._cache_changed = asyncio.Event()
        registration = BrokerRegistration(
            self.broker_id,
            tuple(Endpoint(name, host, port, protocol) for name, protocol, host, port in endpoints),
            timestamp_ms=int(time.time() * 1000),
        )
        epoch = await loop.run_in_executor(None, self._connect_and_register, registration)
        self.roles.on_registered(epoch)
        self.zk.on_registered = lambda e: self._hop(self.roles.on_registered, e)
        await loop.run_in_executor(None, self._start_watches)
        shrink = loop.create_task(self.isr_writer.expiration_loop(), name="isr-expiration")
        self._background.add(shrink)
        interval_ms = self.broker.config.get_int("replica.high.watermark.checkpoint.interval.ms")
        self._spawn(high_watermark_checkpoint_loop(self.broker.logs, interval_ms), "highwatermark-checkpoint")
        self._spawn(self.floors.publish_loop(), "replica-floors")
        log.info(
            "broker %d joined the cluster at %s (broker epoch %d)", self.broker_id, self.zk.connect, epoch
        )

    def _connect_and_register(self, registration: BrokerRegistration) -> int:
        """Runs in the executor. A broker restarted after kill -9 finds its previous session's
        registration until that session expires: wait for it, as Kafka's tests do. Each ZooKeeper
        call here is retried through a dropped connection (``zk_base.call_with_retry``): a retried
        registration whose lost attempt did create the node finds it owned by its own session
        and takes its epoch (``ClusterZk.register_broker``)."""
        self.zk.start()
        self.cluster_id = self.zk.get_or_create_cluster_id(self.broker.logs.cluster_id)
        if self.cluster_id != self.broker.logs.cluster_id:
            log.info(
                "cluster id %s from ZooKeeper (the data directory's own id %s is not used)",
                self.cluster_id,
                self.broker.logs.cluster_id,
            )
        deadline = time.monotonic() + 2 * self.zk.session_timeout_ms / 1000 + 5
        while True:
            try:
                return call_with_retry(self.zk.client, self.zk.register_broker, registration)
            except BrokerIdInUseError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(REGISTRATION_POLL_S)

    def _start_watches(self) -> None:
        self.scram.start(self.zk.client, self._hop)
        self.zk.watch_controller(lambda controller: self._hop(self._set_controller, controller))
        self.watches.start()
        self.controller.shutdown_requests.watch_requests(
            lambda requests: self._hop(self._set_shutdown_requests, requests)
        )
        self.controller.start()
        self.producer_ids.prefetch()

    def acl_store(self, authorizer: Authorizer) -> ZkAclStore:
        """The cluster's ACLs, kept in ZooKeeper and shared by every broker."""
        return ZkAclStore(self.zk.client, authorizer)

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        for fetcher in self.fetchers.values():
            await fetcher.stop()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._stop_blocking)

    async def controlled_shutdown(self) -> bool:
        """SIGTERM's first step, see :func:`exactly.server.controlled_shutdown.controlled_shutdown`."""
        return await controlled_shutdown(self)

    def resign_leaderships(self) -> None:
        resign_leaderships(self)

    def _stop_blocking(self) -> None:
        try:
            self.controller.stop()
        finally:
            self.zk.stop()

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        """A background task of this broker's cluster role (ISR writes, auto-creations):
        cancelled by ``stop``."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # --- kazoo threads: read, then hop -----------------------------------------------------------

    def _hop(self, fn: Callable[..., None], *args: Any) -> None:
        """From a kazoo thread to the event loop (dropped once stopping)."""
        loop = self._loop
        if loop is None or loop.is_closed() or self._stopped:
            return
        loop.call_soon_threadsafe(fn, *args)

    # --- event loop ------------------------------------------------------------------------------

    def _changed(self) -> None:
        if self._cache_changed is not None:
            self._cache_changed.set()

    @property
    def shutting_down(self) -> frozenset[int]:
        """Registered brokers whose current registration asked for a controlled shutdown."""
        return self.eligibility.shutting_down

    def _set_brokers(self, endpoints: dict[int, BrokerEndpoint], live: dict[int, int]) -> None:
        self.cache.set_brokers(endpoints)
        self.eligibility = self.eligibility.on_brokers(live)
        self.leading.refresh_high_watermarks()
        self._changed()

    def _set_shutdown_requests(self, requests: list[ShutdownRequest]) -> None:
        self.eligibility = self.eligibility.on_shutdown_requests(
            (r.broker_id, r.broker_epoch) for r in requests
        )
        self.leading.refresh_high_watermarks()
        self._changed()

    def _set_controller(self, controller: int | None) -> None:
        self.cache.set_controller(controller)
        self._changed()

    def _set_topic(self, topic: CachedTopic) -> None:
        self.role_changes += 1
        self.cache.set_topic(topic)
        self._changed()

    def _topic_gone(self, name: str) -> None:
        self.role_changes += 1
        partitions = [p.partition for p in self.cache.partitions(name)]
        for partition in partitions:
            self._on_state(TopicPartition(name, partition), None)
        self.floors.topic_gone(name, partitions)
        self.cache.remove_topic(name)
        if name in INTERNAL_TOPICS:
            self._coordinators_follow(name)
        info = self.broker.logs.topic(name)
        if info is not None:
            self.broker.logs.delete_topic(name)
            log.info("deleted local replicas of topic %s", name)
        self._changed()

    def _on_state(self, tp: TopicPartition, observed: ObservedState | None) -> None:
        self.role_changes += 1  # first: the role change below wakes parked reads synchronously
        state = observed.state if observed is not None else None
        self.cache.set_state(tp, state)
        self._changed()
        if state is None or observed is None:
            decision = self.roles.on_state(tp, self.cache.replicas(tp), None, -1, 0)
        else:
            decision = self.roles.on_state(
                tp, self.cache.replicas(tp), state.leader_and_isr, state.zk_version, observed.modified_zxid
            )
        try:
            self._apply(tp, decision)
        except Exception:  # one partition's failure must not stop the others
            log.exception("%s: %s failed", tp, decision.action.value)
        if tp.topic in INTERNAL_TOPICS:
            self._coordinators_follow(tp.topic)

    def _coordinators_follow(self, topic: str) -> None:
        """Kafka's ``onLeadershipChange`` for the coordinators: hand the partitions of ``topic``
        this broker now leads, each with its ``LeaderPartition`` (one object per continuous
        leadership: its identity tells a lost-and-regained partition from an epoch bump, and its
        leader epoch is the coordinator epoch), to its coordinator, which loads what it gained
        and drops what it lost (nothing when nothing changed: an epoch bump with the same
        leader, as the decisions' ``coordinator_election`` flag says)."""

        def led() -> dict[int, LeaderPartition]:  # read when the coordinator gets to it, not now
            return {tp.partition: lp for tp, lp in self.leaders.items() if tp.topic == topic}

        if topic == TRANSACTION_STATE_TOPIC:
            self._spawn(self.broker.txn.on_leadership(led), f"coordinator-{topic}")
        else:
            self._spawn(self.broker.groups.on_leadership(led), f"coordinator-{topic}")

    def _apply(self, tp: TopicPartition, decision: RoleDecision) -> None:
        action = decision.action
        if action is RoleAction.BECOME_LEADER:
            self._become_leader(tp, decision)
            self.broker.waiters.notify(tp)  # parked reads re-check the new epoch
        elif action is RoleAction.BECOME_FOLLOWER:
            self.topics.local_log(tp)
            self.leaders.pop(tp, None)
            self.leading.wake_acks(tp)  # delayed produces answer NOT_LEADER_OR_FOLLOWER
            self.broker.waiters.notify(tp)  # parked reads re-check and get NOT_LEADER_OR_FOLLOWER
            self._unfollow(tp)
            if decision.leader >= 0:
                self._follow(tp, decision.leader, decision.leader_epoch)
            log.info("%s: follower of %d at leader epoch %d", tp, decision.leader, decision.leader_epoch)
        elif action is RoleAction.UPDATE_ISR:
            leader = self.leaders.get(tp)
            state = self.cache.state(tp)
            if (
                leader is not None
                and state is not None
                and leader.on_state_observed(state.leader_and_isr, state.zk_version, now_ms())
            ):
                self.leading.publish_high_watermark(tp, leader)
        elif action is RoleAction.STOP_REPLICA:
            self.leaders.pop(tp, None)
            self._unfollow(tp)
            self.leading.wake_acks(tp)
            self.broker.waiters.notify(tp)
            log.info("%s: replica stopped", tp)

    def _become_leader(self, tp: TopicPartition, decision: RoleDecision) -> None:
        plog = self.topics.local_log(tp)
        state = self.cache.state(tp)
        self._unfollow(tp)
        if plog is None or state is None:
            return
        # KAFKA-7415: the new epoch starts at the current log end, recorded before any append.
        plog.leader_epochs.assign(decision.leader_epoch, plog.log_end_offset)
        current = self.leaders.get(tp)
        if current is not None:
            # Still leading (no follower period in between, which would have dropped it): keep
            # the object, so parked acks=all produces complete instead of failing.
            if current.on_reelected(
                state.leader_and_isr, state.zk_version, self.cache.replicas(tp), plog.log_end_offset, now_ms()
            ):
                self.leading.publish_high_watermark(tp, current)
            log.info(
                "%s: still leader, now at epoch %d, isr %s", tp, decision.leader_epoch, list(decision.isr)
            )
            return
        leader = LeaderPartition(
            local_broker=self.broker_id,
            state=state.leader_and_isr,
            zk_version=state.zk_version,
            replicas=self.cache.replicas(tp),
            leader_log_end_offset=plog.log_end_offset,
            high_watermark=plog.high_watermark,
            now_ms=now_ms(),
            max_lag_ms=self.max_lag_ms,
            isr_eligible=self._isr_eligible,
        )
        self.leaders[tp] = leader
        leader.on_leader_append(plog.log_end_offset, now_ms())
        self.leading.publish_high_watermark(tp, leader)
        log.info("%s: leader at epoch %d, isr %s", tp, decision.leader_epoch, list(decision.isr))

    def _isr_eligible(self, broker: int) -> bool:
        return broker in self.cache.brokers and self.eligibility.eligible(broker)

    # --- followers -------------------------------------------------------------------------------

    def _follow(self, tp: TopicPartition, leader: int, leader_epoch: int) -> None:
        fetcher = self.fetchers.get(leader)
        if fetcher is None:
            fetcher = self.fetchers[leader] = LeaderFetcher(self, leader)
            fetcher.start()
        fetcher.follow(tp, leader_epoch)

    def _unfollow(self, tp: TopicPartition) -> None:
        for fetcher in self.fetchers.values():
            fetcher.unfollow(tp)

    def check_follower_read(
        self, tp: TopicPartition, replica_id: int, current_leader_epoch: int
    ) -> ErrorCode:
        """A replica's Fetch at this broker: the epoch, leadership, then membership. The same
        checks as ``check_read`` then ``check_follower_fetch`` on ``cache.replicas``, with the
        topic looked up once (every follower fetch asks this for each of its partitions, twice)."""
        cached = self.cache.topic(tp.topic)
        replicas = None if cached is None else cached.assignment.partitions.get(tp.partition)
        if replicas is None:
            return ErrorCode.unknown_topic_or_partition
        local = self.roles.local(tp)
        if local is None:
            return ErrorCode.not_leader_or_follower
        code = check_partition_read(
            current_leader_epoch, local.leader_epoch, is_leader=tp in self.leaders, require_leader=True
        )
        if code != ErrorCode.none:
            return code
        return check_follower_fetch(replica_id, current_leader_epoch, replicas)

    # --- serving ---------------------------------------------------------------------------------

    def manages(self, tp: TopicPartition) -> bool:
        """Whether ``tp`` is a cluster partition (internal topics included): on a cluster broker
        every partition is, also one whose topic the metadata cache does not know (yet). A broker
        restarted after kill -9 listens while it waits for ZooKeeper to let it register, with its
        old replicas loaded from disk and an empty cache; served as a single broker's partition,
        such a replica took a retried acks=-1 write at leader epoch 0 and acknowledged it at once,
        then lost it to truncation as a follower. The leadership checks answer
        UNKNOWN_TOPIC_OR_PARTITION / NOT_LEADER_OR_FOLLOWER instead (retriable), as Kafka, which
        does not even process requests before the broker registered."""
        del tp  # kept for the callers' symmetry: the answer does not depend on the partition
        return True

    def leader_for_write(self, tp: TopicPartition) -> tuple[ErrorCode, LeaderPartition | None]:
        cached = self.cache.topic(tp.topic)
        if cached is None or tp.partition not in cached.assignment.partitions:
            return ErrorCode.unknown_topic_or_partition, None
        leader = self.leaders.get(tp)
        if leader is None:
            return ErrorCode.not_leader_or_follower, None
        return ErrorCode.none, leader

    def check_read(
        self, tp: TopicPartition, current_leader_epoch: int, *, require_leader: bool = True
    ) -> ErrorCode:
        """Epoch then leadership, for consumer reads (Fetch, ListOffsets). ``require_leader=False``
        is the debug replica id's read (any hosted replica, up to its own high watermark)."""
        cached = self.cache.topic(tp.topic)
        if cached is None or tp.partition not in cached.assignment.partitions:
            return ErrorCode.unknown_topic_or_partition
        local = self.roles.local(tp)
        if local is None:
            return ErrorCode.not_leader_or_follower
        return check_partition_read(
            current_leader_epoch,
            local.leader_epoch,
            is_leader=tp in self.leaders,
            require_leader=require_leader,
        )

    async def wait_for_cache(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        """Wait until ``predicate()`` holds after a cache change, or the timeout."""
        assert self._cache_changed is not None
        deadline = time.monotonic() + timeout_s
        while not predicate():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._cache_changed.clear()
            try:
                await asyncio.wait_for(self._cache_changed.wait(), remaining)
            except TimeoutError:
                return bool(predicate())
        return True
