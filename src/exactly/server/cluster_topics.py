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
    ) -> None:
        self.zk = zk
        self.cache = cache
        self.logs = logs
        self.config = config
        self._wait_for_cache = wait_for_cache
        self._spawn = spawn
        self._auto_creating: set[str] = set()
        self._refused: set[str] = set()  # internal topics refused for too few brokers (logged once)

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

    def local_log(self, tp: TopicPartition) -> PartitionLog | None:
        """The local log of a hosted partition, creating the topic locally (with the cluster's
        topic id and config) the first time this broker hosts one of its partitions. The local
        topic has every partition's directory; only hosted ones are ever written or served.
        None while the topic is not in the metadata cache or cannot be created locally."""
        logs = self.logs
        plog = logs.get_partition(tp)
        if plog is not None:
            return plog
        cached = self.cache.topic(tp.topic)
        if cached is None:
            return None
        local = logs.topic(tp.topic)
        if local is not None and tp.partition >= local.partitions:
            # CreatePartitions grew the topic: add the partitions the cluster has now (all of
            # them, as at creation; only the hosted ones are ever written or served).
            try:
                logs.add_partitions(tp.topic, len(cached.assignment.partitions), now_ms=now_ms())
            except (InvalidPartitionsError, UnknownTopicError, OSError) as exc:
                log.error("%s: local replica not created: %s", tp, exc)
                return None
            log.info("%s: topic grown locally to %d partitions", tp, len(cached.assignment.partitions))
        elif local is None:
            topic_id = None
            if cached.assignment.topic_id is not None:
                try:
                    topic_id = decode_topic_id(cached.assignment.topic_id)
                except ZnodeFormatError:
                    log.warning(
                        "%s: bad topic id %r, a local one is used", tp.topic, cached.assignment.topic_id
                    )
            try:
                logs.create_topic(
                    tp.topic,
                    len(cached.assignment.partitions),
                    dict(cached.config),
                    now_ms=now_ms(),
                    internal=tp.topic in INTERNAL_TOPICS,
                    topic_id=topic_id,
                )
            except (TopicExistsError, InvalidConfigError) as exc:
                log.error("%s: local replica not created: %s", tp, exc)
                return None
        return logs.get_partition(tp)
