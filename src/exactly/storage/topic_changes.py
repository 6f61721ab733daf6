"""Topic creation, growth and deletion as prepare -> persist -> complete (the log manager's half).

Why
---
The durable writes of a topic change (topics.json, leader-epoch and offset checkpoints: six
fsyncs for a one-partition topic, 0.75-0.92 s of stalled event loop for one CreateTopics of 20
topics at load 9, bench/results/mends-s21.md) must not run on the broker's event loop. So:

* **prepare** (owner's thread, ``prepare_create`` / ``prepare_add_partitions`` /
  ``prepare_delete``): validate; reserve the names (``topic_busy``: a second change of a name
  while one is in flight is refused, a create with ``TopicExistsError`` as Kafka's
  TOPIC_ALREADY_EXISTS); unpublish the topic being deleted; snapshot the offset checkpoints as
  of the change. Returns a ``TopicChangePlan``. No file is touched.
* **persist** (``persist_topic_change``, any one thread at a time: ``TopicsWriter.persist``, the
  one writer of topics.json; see ``storage.topics_file`` for its invariants): make the new
  partitions (directories, empty segments, the leader-epoch checkpoint: file creations that wait
  for the filesystem journal on a busy disk, ~1 ms each when idle, so they are no loop work
  either; nothing sees these logs before complete), then the checkpoints and topics.json. A
  CreateTopics of N topics is one plan: one topics.json write and one checkpoint write.
* **complete** (owner's thread, ``complete_topic_change``, exactly once per plan, with the
  persist step's error or None): publish the created or grown topic and its logs, or close the
  deleted one's; on an error undo (delete the partitions the persist step made, publish the
  deleted topic again) and release the names. Callers answer only after this (the answer still
  follows durable files).

``create_topic``, ``add_partitions`` and ``delete_topic`` drive the three steps on the calling
thread (tests, start-up paths, the cluster's local replicas); the broker drives them with persist
in its topic-writes thread. Crash safety (kill -9 between any two steps): before topics.json is
written the prepared directories are unlisted and start-up deletes them (the topic is not there);
after it the topic is there whole (epoch checkpoints were written first; empty segments are
recreated on open). A deleted topic's directories are removed only after topics.json dropped it.
"""

from __future__ import annotations

import logging
import shutil
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

from exactly.storage.leader_epoch import INITIAL_LEADER_EPOCH
from exactly.storage.log_checkpoints import log_starts_of, recovery_points_of
from exactly.storage.partition_log import PartitionLog
from exactly.storage.topics_file import (
    InvalidPartitionsError,
    InvalidTopicError,
    TopicChange,
    TopicExistsError,
    TopicInfo,
    TopicsWriter,
    UnknownTopicError,
)
from exactly.topics import topic_name_error
from exactly.types import TopicPartition

if TYPE_CHECKING:
    from exactly.storage.cleaner.manager import LogCleanerManager
    from exactly.storage.config import LogConfig

log = logging.getLogger(__name__)


def validate_topic_name(name: str) -> None:
    """Kafka's Topic.validate (exactly.topics): 1..249 chars of [a-zA-Z0-9._-], not '.' or '..'."""
    problem = topic_name_error(name)
    if problem is not None:
        raise InvalidTopicError(problem)


@dataclass(frozen=True, slots=True)
class NewTopic:
    """One topic of a create: ``topic_id`` None draws a random one (a cluster passes ZooKeeper's)."""

    name: str
    partitions: int
    overrides: Mapping[str, str]
    internal: bool = False
    topic_id: uuid.UUID | None = None


@dataclass(frozen=True, slots=True)
class TopicChangePlan:
    """A prepared change: ``change`` for the persist step; ``topics``: the created or grown
    topics' entries; ``logs``: the new partitions (created, grown: filled in by the persist
    step, read by the completion, which runs after it) or the unpublished ones (``deleted``);
    ``names``: the reserved names."""

    change: TopicChange
    topics: tuple[TopicInfo, ...]
    logs: dict[TopicPartition, PartitionLog]
    deleted: tuple[TopicInfo, ...]
    names: frozenset[str]


class TopicChanges:
    """The topic-change half of ``LogManager`` (a mixin: its state is the log manager's)."""

    data_dir: Path
    default_config: LogConfig
    producer_id_expiration_ms: int
    cleaner_manager: LogCleanerManager
    _topics: dict[str, TopicInfo]
    _logs: dict[TopicPartition, PartitionLog]
    _busy: set[str]  # names with a change between prepare and complete
    _in_flight: dict[int, TopicChangePlan]  # those changes' plans, by id
    _writer: TopicsWriter
    _closed: bool

    def topic_busy(self, name: str) -> bool:
        """Whether a change of ``name`` is between prepare and complete (not yet published, or
        being grown or deleted)."""
        return name in self._busy

    def _partition_dir(self, tp: TopicPartition) -> Path:
        return self.data_dir / f"{tp.topic}-{tp.partition}"

    # --- prepare (owner's thread) ----------------------------------------------------------------
    def prepare_create(self, topics: Sequence[NewTopic], *, now_ms: int) -> TopicChangePlan:
        """Prepare the creation of ``topics`` (one persist for all). Raises TopicExistsError (a
        name published, in flight, or twice in ``topics``), InvalidConfigError, InvalidTopicError,
        InvalidPartitionsError, OSError; then nothing is prepared."""
        infos: list[TopicInfo] = []
        for spec in topics:
            if (
                spec.name in self._topics
                or spec.name in self._busy
                or any(i.name == spec.name for i in infos)
            ):
                raise TopicExistsError(f"Topic '{spec.name}' already exists.")
            validate_topic_name(spec.name)
            if spec.partitions < 1:
                raise InvalidPartitionsError(
                    f"Number of partitions must be larger than 0, got {spec.partitions}"
                )
            clean = {k: str(v) for k, v in spec.overrides.items() if v is not None}
            infos.append(
                TopicInfo(
                    name=spec.name,
                    topic_id=spec.topic_id if spec.topic_id is not None else uuid.uuid4(),
                    partitions=spec.partitions,
                    overrides=MappingProxyType(clean),
                    config=self.default_config.with_overrides(clean),
                    internal=spec.internal,
                )
            )
        ranges = [(info, 0, info.partitions) for info in infos]
        return self._prepare_partitions(ranges, now_ms)

    def prepare_add_partitions(self, name: str, count: int, *, now_ms: int) -> TopicChangePlan:
        """Prepare growing ``name`` to ``count`` partitions (the topic's config). Raises
        UnknownTopicError (also while a change of it is in flight), InvalidPartitionsError
        (``count`` is not an increase), OSError; then nothing is prepared."""
        info = self._topics.get(name)
        if info is None or name in self._busy:
            raise UnknownTopicError(f"Topic '{name}' does not exist.")
        if count <= info.partitions:
            raise InvalidPartitionsError(
                f"Topic '{name}' has {info.partitions} partitions; {count} would not be an increase"
            )
        return self._prepare_partitions([(replace(info, partitions=count), info.partitions, count)], now_ms)

    def _prepare_partitions(
        self, ranges: Sequence[tuple[TopicInfo, int, int]], now_ms: int
    ) -> TopicChangePlan:
        parts = [
            (TopicPartition(info.name, partition), info.config)
            for info, first, end in ranges
            for partition in range(first, end)
        ]
        infos = tuple(info for info, _first, _end in ranges)
        names = frozenset(info.name for info in infos)
        # The checkpoints as of the change: the new partitions at 0, so no recovery point or log
        # start of an older topic with a name reused survives (written before the commit).
        recovery_points = recovery_points_of(self._logs)
        recovery_points.update(dict.fromkeys((tp for tp, _config in parts), 0))
        opened: dict[TopicPartition, PartitionLog] = {}
        change = TopicChange(
            put=infos,
            make_files=partial(self._open_partitions, parts, opened, now_ms),
            recovery_points=recovery_points,
            log_starts=log_starts_of(self._logs),
        )
        plan = TopicChangePlan(change, infos, opened, (), names)
        self._busy |= names
        self._in_flight[id(plan)] = plan
        return plan

    def _open_partitions(
        self,
        parts: Sequence[tuple[TopicPartition, LogConfig]],
        into: dict[TopicPartition, PartitionLog],
        now_ms: int,
    ) -> None:
        """The persist step's first part (the writer's thread): the new partitions, each empty in
        a fresh directory with its leader epoch checkpointed, into ``into`` (the plan's ``logs``:
        on a failure the completion deletes those made). Nothing else sees them before the
        completion publishes them, so they may be made on another thread than the owner's."""
        for tp, config in parts:
            into[tp] = self._new_partition(tp, config, now_ms)

    def _new_partition(self, tp: TopicPartition, config: LogConfig, now_ms: int) -> PartitionLog:
        """An empty partition in a fresh directory, leader epoch assigned and checkpointed
        before topics.json names the partition."""
        directory = self._partition_dir(tp)
        shutil.rmtree(directory, ignore_errors=True)  # leftovers of an older topic of that name
        partition_log = PartitionLog.open(
            directory,
            tp,
            config,
            recovery_point=0,
            now_ms=now_ms,
            producer_id_expiration_ms=self.producer_id_expiration_ms,
        )
        # Kafka records the epoch when the replica becomes leader, at creation, not inside the
        # first produce request.
        partition_log.leader_epochs.assign(INITIAL_LEADER_EPOCH, 0)
        return partition_log

    def prepare_delete(self, name: str) -> TopicChangePlan:
        """Prepare deleting ``name``: unpublished at once (no request sees it any more), its logs
        stay open until complete. Raises UnknownTopicError (also while a change of it is in
        flight)."""
        info = self._topics.get(name)
        if info is None or name in self._busy:
            raise UnknownTopicError(f"Topic '{name}' does not exist.")
        del self._topics[name]
        detached: dict[TopicPartition, PartitionLog] = {}
        after: list[Callable[[], object]] = []
        for partition in range(info.partitions):
            tp = TopicPartition(name, partition)
            partition_log = self._logs.pop(tp, None)
            if partition_log is not None:
                detached[tp] = partition_log
                # no owed epoch rewrite may recreate a file in the directory being removed
                partition_log.leader_epochs.discard()
            after.append(partial(shutil.rmtree, self._partition_dir(tp), ignore_errors=True))
            after.append(partial(self.cleaner_manager.remove, tp))
        change = TopicChange(
            remove=(name,),
            recovery_points=recovery_points_of(self._logs),
            log_starts=log_starts_of(self._logs),
            after_commit=tuple(after),
        )
        plan = TopicChangePlan(change, (), detached, (info,), frozenset({name}))
        self._busy.add(name)
        self._in_flight[id(plan)] = plan
        return plan

    # --- persist (any one thread) and complete (owner's thread) ----------------------------------
    def persist_topic_change(self, plan: TopicChangePlan) -> None:
        """The durable step (``TopicsWriter.persist``); raises OSError with nothing committed."""
        self._writer.persist(plan.change)

    def complete_topic_change(self, plan: TopicChangePlan, error: BaseException | None) -> None:
        """Publish ``plan`` (``error`` None) or undo its prepare, and release its names. Never
        raises for an I/O problem (logged); a no-op after ``close`` (which settled the logs)."""
        if self._closed:
            return
        self._busy -= plan.names
        self._in_flight.pop(id(plan), None)
        if error is None:
            for info in plan.topics:
                self._topics[info.name] = info
            if plan.deleted:
                for partition_log in plan.logs.values():
                    partition_log.delete()  # closes; the persist step removed the directory
            else:
                self._logs.update(plan.logs)
            return
        log.error("topic change of %s not persisted: %s", sorted(plan.names), error)
        if plan.deleted:  # topics.json still lists it, its directories are intact
            for info in plan.deleted:
                self._topics[info.name] = info
            self._logs.update(plan.logs)
            return
        for partition_log in plan.logs.values():
            partition_log.delete()

    def apply_topic_change(self, plan: TopicChangePlan) -> None:
        """persist then complete on the calling thread; re-raises the persist step's error."""
        try:
            self.persist_topic_change(plan)
        except BaseException as exc:
            self.complete_topic_change(plan, exc)
            raise
        self.complete_topic_change(plan, None)

    def close_in_flight(self) -> None:
        """At close, once the writer stopped: the logs of changes never completed are closed if
        topics.json lists them, else deleted (start-up would delete them anyway)."""
        committed = self._writer.committed
        for plan in self._in_flight.values():
            for tp, partition_log in plan.logs.items():
                info = committed.get(tp.topic)
                if info is not None and tp.partition < info.partitions:
                    partition_log.close()
                else:
                    partition_log.delete()
        self._in_flight.clear()

    # --- synchronous drivers -----------------------------------------------------------------------
    def create_topic(
        self,
        name: str,
        partitions: int,
        overrides: Mapping[str, str],
        *,
        now_ms: int,
        internal: bool = False,
        topic_id: uuid.UUID | None = None,
    ) -> TopicInfo:
        """Create one topic, every step on the calling thread. Raises TopicExistsError,
        InvalidConfigError (bad overrides), InvalidTopicError, InvalidPartitionsError, OSError.
        ``topic_id``: the cluster's id for the topic (every replica uses the one in ZooKeeper); a
        new random one when None."""
        plan = self.prepare_create([NewTopic(name, partitions, overrides, internal, topic_id)], now_ms=now_ms)
        self.apply_topic_change(plan)
        return plan.topics[0]

    def add_partitions(self, name: str, count: int, *, now_ms: int) -> TopicInfo:
        """Grow topic ``name`` to ``count`` partitions, every step on the calling thread. If
        preparing or persisting fails, the new directories are deleted and the topic is as
        before. Raises UnknownTopicError, InvalidPartitionsError, OSError."""
        plan = self.prepare_add_partitions(name, count, now_ms=now_ms)
        self.apply_topic_change(plan)
        return plan.topics[0]

    def delete_topic(self, name: str) -> TopicInfo:
        """Delete the topic and its partitions, every step on the calling thread. Raises
        UnknownTopicError, OSError (the topic is then as before)."""
        plan = self.prepare_delete(name)
        self.apply_topic_change(plan)
        return plan.deleted[0]


__all__ = ["NewTopic", "TopicChangePlan", "TopicChanges", "validate_topic_name"]
