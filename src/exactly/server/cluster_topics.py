"""Cluster mode's topic administration: CreateTopics, CreatePartitions, DeleteTopics and
Metadata's auto-creation change the cluster's topic set in ZooKeeper (Kafka's AdminZkClient path), and a broker creates
its local replica of a topic the first time it hosts one of the topic's partitions.

Why apart from the replica manager: that one *reacts* to observed ZooKeeper state (roles, high
watermark, ISR); this one *changes* the topic set and answers once the change shows in the
metadata cache. Invariant: the metadata cache (filled by the replica manager's watches) is the
only source of truth for which cluster topics exist and their ids; nothing here caches them.
The only state of its own is the set of auto-creations under way, so a burst of Metadata
requests for a missing topic writes it once.

Threads: blocking ZooKeeper writes run in the default executor; everything else runs on the
event loop, as the replica manager's own state does.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, replace
from typing import Any

from kio.schema.errors import ErrorCode

from exactly.cluster.zk import ClusterZk
from exactly.cluster.zk import TopicExistsError as ZkTopicExistsError
from exactly.cluster.znodes import TopicAssignment, ZnodeFormatError, decode_topic_id, encode_topic_id
from exactly.controller.assignment import (
    InvalidReplicationFactorError,
    assign_added_partitions,
    assign_replicas,
)
from exactly.server.clock import now_ms
from exactly.server.config import BrokerConfig
from exactly.server.metadata_cache import MetadataCache
from exactly.storage.config import InvalidConfigError
from exactly.storage.log_manager import (
    InvalidPartitionsError,
    LogManager,
    NewTopic,
    TopicChangePlan,
    TopicExistsError,
    UnknownTopicError,
)
from exactly.storage.partition_log import PartitionLog
from exactly.topics import INTERNAL_TOPICS
from exactly.types import TopicPartition

log = logging.getLogger("exactly.cluster_topics")


@dataclass(frozen=True, slots=True)
class ObservedTopic:
    """A topic's assignment as read from ZooKeeper, with the znode's version."""

    assignment: TopicAssignment
    zk_version: int
    queued_for_deletion: bool

    @property
    def being_reassigned(self) -> bool:
        return any(self.assignment.adding_replicas.values()) or any(
            self.assignment.removing_replicas.values()
        )


WaitForCache = Callable[[Callable[[], bool], float], Awaitable[bool]]
Spawn = Callable[[Coroutine[Any, Any, None], str], None]
ApplyChange = Callable[[TopicChangePlan], Awaitable[None]]


def _apply_here(logs: LogManager) -> ApplyChange:
    async def apply(plan: TopicChangePlan) -> None:
        logs.apply_topic_change(plan)

    return apply


class ClusterTopics:
    """The topic admin path of one broker in cluster mode (see the module docstring).

    ``wait_for_cache(predicate, timeout_s)`` waits for a metadata cache change that makes the
    predicate hold; ``spawn(coro, name)`` runs a background task the replica manager cancels
    when it stops."""

    def __init__(
        self,
        zk: ClusterZk,
        cache: MetadataCache,
        logs: LogManager,
        config: BrokerConfig,
        *,
        wait_for_cache: WaitForCache,
        spawn: Spawn,
        apply_change: ApplyChange | None = None,
    ) -> None:
        self.zk = zk
        self.cache = cache
        self.logs = logs
        self.config = config
        self._wait_for_cache = wait_for_cache
        self._spawn = spawn
        self._auto_creating: set[str] = set()
        self._refused: set[str] = set()  # internal topics refused for too few brokers (logged once)
        # the persist step of local topic changes (the broker's ``TopicWrites.apply``); on the
        # calling thread when None (tests)
        self._apply_change = apply_change or _apply_here(logs)
        # partitions waiting for their topic's local change in flight: topic -> tp -> when_ready
        self._waiting: dict[str, dict[TopicPartition, Callable[[], None]]] = {}
        self._doomed: set[str] = set()  # deleted from the cluster while a local change was in flight

    # --- ids -------------------------------------------------------------------------------------

    def topic_id(self, name: str) -> uuid.UUID | None:
        cached = self.cache.topic(name)
        if cached is None or cached.assignment.topic_id is None:
            return None
        try:
            return decode_topic_id(cached.assignment.topic_id)
        except ZnodeFormatError:
            return None

    def topic_name_by_id(self, topic_id: uuid.UUID) -> str | None:
        return next((n for n in self.cache.topic_names() if self.topic_id(n) == topic_id), None)

    # --- CreateTopics and auto-creation ------------------------------------------------------------

    def plan_assignment(
        self, partitions: int, replication_factor: int
    ) -> tuple[ErrorCode, str | None, dict[int, tuple[int, ...]]]:
        """Kafka's AdminUtils placement over the live brokers."""
        try:
            return ErrorCode.none, None, assign_replicas(self.cache.brokers, partitions, replication_factor)
        except InvalidReplicationFactorError as exc:
            return ErrorCode.invalid_replication_factor, str(exc), {}

    async def create_topic(
        self, name: str, replicas: dict[int, tuple[int, ...]], overrides: dict[str, str], timeout_s: float
    ) -> tuple[ErrorCode, str | None, uuid.UUID | None]:
        """Write ``/config/topics/<t>`` then ``/brokers/topics/<t>`` (the controller reacts to the
        latter), then wait until every partition has a live leader in the metadata cache, as
        Kafka's DelayedCreatePartitions (on timeout: REQUEST_TIMED_OUT, the topic still exists)."""
        topic_id = uuid.uuid4()
        assignment = TopicAssignment(replicas, topic_id=encode_topic_id(topic_id))
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, self.zk.create_topic, name, assignment, overrides)
        except ZkTopicExistsError:
            return ErrorCode.topic_already_exists, f"Topic '{name}' already exists.", None
        log.info("created topic %s in ZooKeeper: %s", name, dict(replicas))
        if timeout_s > 0 and not await self._wait_for_cache(lambda: self.cache.has_leaders(name), timeout_s):
            return ErrorCode.request_timed_out, f"Timed out waiting for leaders of {name}", topic_id
        return ErrorCode.none, None, topic_id

    def request_internal_topic(
        self, name: str, partitions: int, replication_factor: int, overrides: dict[str, str]
    ) -> ErrorCode:
        """A coordinator's internal topic, created when first needed (Kafka's
        ``createInternalTopic`` on FindCoordinator): NONE once it is in the metadata cache, else
        COORDINATOR_NOT_AVAILABLE while it is written in the background. Like Kafka (KIP-115), it
        is not created while fewer live brokers than its replication factor exist: no smaller
        factor is ever chosen silently, the clients keep asking until the cluster is big enough."""
        if self.cache.topic(name) is not None:
            return ErrorCode.none
        if name in self._auto_creating:
            return ErrorCode.coordinator_not_available
        code, message, replicas = self.plan_assignment(partitions, replication_factor)
        if code != ErrorCode.none:
            if name not in self._refused:
                self._refused.add(name)
                log.warning(
                    "internal topic %s not created: %s (%d live brokers, replication factor %d)",
                    name,
                    message,
                    len(self.cache.brokers),
                    replication_factor,
                )
            return ErrorCode.coordinator_not_available
        self._refused.discard(name)
        self._auto_creating.add(name)

        async def create() -> None:
            try:
                await self.create_topic(name, replicas, overrides, 0)
            except Exception:
                log.exception("creation of internal topic %s failed", name)
            finally:
                self._auto_creating.discard(name)

        self._spawn(create(), f"create-{name}")
        return ErrorCode.coordinator_not_available

    def request_auto_create(self, name: str, partitions: int) -> None:
        """Metadata's auto-creation: write the topic in the background (default.replication.factor,
        capped by nothing: too few live brokers leave it uncreated with a log line, as Kafka
        answers such a request with an error)."""
        if self.cache.topic(name) is not None or name in self._auto_creating:
            return
        rf = self.config.get_int("default.replication.factor")
        code, message, replicas = self.plan_assignment(partitions, rf)
        if code != ErrorCode.none:
            log.warning("auto-creation of %s refused: %s", name, message)
            return
        self._auto_creating.add(name)

        async def create() -> None:
            try:
                await self.create_topic(name, replicas, {}, 0)
            except Exception:
                log.exception("auto-creation of %s failed", name)
            finally:
                self._auto_creating.discard(name)

        self._spawn(create(), f"auto-create-{name}")

    # --- CreatePartitions ---------------------------------------------------------------------------

    async def read_topic(self, name: str) -> ObservedTopic | None:
        """The topic as ZooKeeper has it now (not the cache: a conditional rewrite needs the
        znode's version); None when it does not exist."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self._read_topic, name)

    def _read_topic(self, name: str) -> ObservedTopic | None:
        observed = self.zk.topic_assignment_at(name)
        if observed is None:
            return None
        assignment, version = observed
        return ObservedTopic(assignment, version, self.zk.topic_marked_for_deletion(name))

    def place_added_partitions(
        self, current: TopicAssignment, count: int, assignments: tuple[tuple[int, ...], ...] | None
    ) -> TopicAssignment:
        """The assignment grown to ``count`` partitions: the request's replicas for the new ones
        (validated by the caller), else Kafka's placement over the live brokers, continuing where
        the topic's creation left off. The topic id and reassignment sets are kept. Raises
        InvalidReplicationFactorError when fewer brokers are live than partition 0 has replicas."""
        existing = dict(current.partitions)
        if assignments is not None:
            added = {len(existing) + i: replicas for i, replicas in enumerate(assignments)}
        else:
            added = assign_added_partitions(self.cache.brokers, existing, count)
        return replace(current, partitions={**existing, **added})

    async def write_assignment(self, name: str, grown: TopicAssignment, expected_version: int) -> bool:
        """Rewrite ``/brokers/topics/<t>`` at the version ``grown`` was computed from (the
        controller's assignment watch then creates the new partitions' states). False: it moved
        or went since it was read; read again and decide again."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self.zk.set_topic_assignment, name, grown, expected_version)

    async def wait_for_partitions(self, name: str, count: int, timeout_s: float) -> bool:
        """Until the metadata cache has at least ``count`` partitions of ``name``, each with a
        live leader (Kafka's DelayedCreatePartitions); False on timeout (they still come)."""

        def grown_with_leaders() -> bool:
            cached = self.cache.topic(name)
            return (
                cached is not None
                and len(cached.assignment.partitions) >= count
                and self.cache.has_leaders(name)
            )

        return timeout_s > 0 and await self._wait_for_cache(grown_with_leaders, timeout_s)

    # --- DeleteTopics ------------------------------------------------------------------------------

    async def delete_topic(self, name: str, timeout_s: float) -> bool:
        """Mark ``/admin/delete_topics/<t>`` (the controller removes the topic's znodes, every
        broker then drops its replicas) and wait until this broker's metadata cache no longer
        has the topic. False on timeout: the deletion goes on without the caller."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.zk.mark_topic_for_deletion, name)
        return await self._wait_for_cache(lambda: self._forgotten(name), timeout_s)

    def _forgotten(self, name: str) -> bool:
        return self.cache.topic(name) is None

    # --- local replicas ----------------------------------------------------------------------------

    def local_log(
        self, tp: TopicPartition, when_ready: Callable[[], None] | None = None
    ) -> PartitionLog | None:
        """The local log of a hosted partition, creating the topic locally (with the cluster's
        topic id and config) the first time this broker hosts one of its partitions, or growing
        it after CreatePartitions. The local topic has every partition's directory; only hosted
        ones are ever written or served. None while the topic is not in the metadata cache or
        cannot be created locally.

        With ``when_ready`` the creation (or growth) is prepared now and persisted off the loop
        (``server.topic_writes``): None is returned meanwhile, and ``when_ready`` (the latest
        given for ``tp``) is called on the loop once the change is durable and published, or once
        a deletion of the topic's old local replica in flight settled; it is dropped if the
        creation fails (logged, as a synchronous failure is) or by ``forget_waiting``. Without
        it everything runs on the calling thread (tests)."""
        logs = self.logs
        plog = logs.get_partition(tp)
        if plog is not None:
            return plog
        cached = self.cache.topic(tp.topic)
        if cached is None:
            return None
        if when_ready is not None:
            self._waiting.setdefault(tp.topic, {})[tp] = when_ready
            if logs.topic_busy(tp.topic):
                return None  # the change in flight calls it
        count = len(cached.assignment.partitions)
        local = logs.topic(tp.topic)
        try:
            if local is not None and tp.partition >= local.partitions:
                # CreatePartitions grew the topic: add the partitions the cluster has now (all of
                # them, as at creation; only the hosted ones are ever written or served).
                plan = logs.prepare_add_partitions(tp.topic, count, now_ms=now_ms())
            elif local is None:
                topic_id = self._cluster_topic_id(tp.topic, cached.assignment.topic_id)
                spec = NewTopic(tp.topic, count, dict(cached.config), tp.topic in INTERNAL_TOPICS, topic_id)
                plan = logs.prepare_create([spec], now_ms=now_ms())
            else:
                return None  # listed locally but not opened: nothing to create
        except (
            TopicExistsError,
            InvalidConfigError,
            InvalidPartitionsError,
            UnknownTopicError,
            OSError,
        ) as exc:
            log.error("%s: local replica not created: %s", tp, exc)
            self._waiting.pop(tp.topic, None)
            return None
        if when_ready is None:
            try:
                logs.apply_topic_change(plan)
            except OSError as exc:
                log.error("%s: local replica not created: %s", tp, exc)
                return None
            return logs.get_partition(tp)
        self._spawn(self._persist(plan, f"{tp.topic}: local replica"), f"local-{tp.topic}")
        return None

    def _cluster_topic_id(self, name: str, encoded: str | None) -> uuid.UUID | None:
        if encoded is None:
            return None
        try:
            return decode_topic_id(encoded)
        except ZnodeFormatError:
            log.warning("%s: bad topic id %r, a local one is used", name, encoded)
            return None

    def delete_local(self, name: str) -> None:
        """The topic left the cluster: unpublish its local replica now, delete its files off the
        loop; partitions hosted again meanwhile wait for that (``local_log``). A local creation
        or growth in flight is let finish, then the topic is deleted (unless it is back)."""
        if self.logs.topic_busy(name):  # a local creation in flight: deleted once it completed
            self._doomed.add(name)
            return
        try:
            plan = self.logs.prepare_delete(name)
        except UnknownTopicError:
            return  # not local
        self._spawn(self._persist(plan, f"{name}: local replicas deleted"), f"delete-{name}")

    def waiting_partitions(self, name: str) -> frozenset[int]:
        """Partitions of ``name`` whose role waits for their local replica's creation (off the
        loop): this broker does not serve them yet, whatever the metadata cache says."""
        waiting = self._waiting.get(name)
        return frozenset(tp.partition for tp in waiting) if waiting else frozenset()

    def forget_waiting(self, tp: TopicPartition) -> None:
        """``tp`` no longer needs its local log (its replica stopped): drop its ``when_ready``."""
        waiting = self._waiting.get(tp.topic)
        if waiting is not None:
            waiting.pop(tp, None)

    async def _persist(self, plan: TopicChangePlan, what: str) -> None:
        """Persist ``plan`` off the loop, then call the ``when_ready`` of its topics' partitions
        (dropped when a creation failed: a retry would fail alike, and a later role change asks
        again)."""
        try:
            await self._apply_change(plan)
        except OSError as exc:
            log.error("%s: failed: %s", what, exc)
            if not plan.deleted:
                for name in plan.names:
                    self._waiting.pop(name, None)
                return
        else:
            log.info("%s", what)
        for name in sorted(plan.names):
            if name in self._doomed:  # the topic left the cluster while it was being created
                self._doomed.discard(name)
                if self.cache.topic(name) is None:
                    self._waiting.pop(name, None)
                    self.delete_local(name)
                    continue
            for ready in self._waiting.pop(name, {}).values():
                ready()
