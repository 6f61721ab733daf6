"""All partitions of one broker's data directory (Kafka's LogManager).

Layout of ``data_dir``::

    meta.properties                       broker/cluster id
    topics.json                           topic name -> id, partition count, config overrides
                                          (rewritten via storage/durable.py, like every file here)
    recovery-point-offset-checkpoint      per partition recovery point
    log-start-offset-checkpoint           log start offsets above the first segment's base
    replication-offset-checkpoint         high watermarks (cluster mode only)
    cleaner-offset-checkpoint             first dirty offsets of compacted partitions (cleaner)
    .clean_shutdown                       present only after a clean close
    <topic>-<partition>/                  one PartitionLog each

Topics named ``__consumer_offsets`` / ``__transaction_state`` are ordinary topics here.

Theory of operation
-------------------
The recovery-point, log-start-offset and high-watermark checkpoints (what each records, when
it is written and why that is safe) are ``log_checkpoints``'s; this class decides when to write
them: periodically from ``run_maintenance``, whenever the set of partitions changes, after a
DeleteRecords moved a log start (before it returns), and at close after every partition was
flushed. Opening a partition validates everything after its checkpointed recovery point, so after
``kill -9`` only the unflushed tail is scanned.

The ``.clean_shutdown`` marker is written last by ``close`` and removed as soon as the logs are
open, so its presence at start-up means the previous process shut down cleanly (every recovery
point then equals its log end offset and recovery reads nothing). ``had_clean_shutdown`` reports it.

topics.json is the commit point of every topic change, and both orders around it are safe:
``create_topic`` and ``delete_topic`` write it *before* touching partition directories (a crash in
between leaves either a listed topic whose missing directories are created on open, or unlisted
directories that start-up deletes). ``add_partitions`` prepares the new partitions' directories
*first* and then writes topics.json: a crash before the write leaves directories numbered beyond
the listed partition count, which start-up deletes, and a failure while preparing only has to
delete what it made - the listed topic never names a partition that could not be created.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import shutil
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType

from exactly.storage.cleaner.manager import LogCleanerManager
from exactly.storage.config import LogConfig
from exactly.storage.durable import write_durably
from exactly.storage.leader_epoch import INITIAL_LEADER_EPOCH, flush_caches
from exactly.storage.log_checkpoints import DEFAULT_CHECKPOINT_INTERVAL_MS, LogCheckpoints
from exactly.storage.log_read import OffsetOutOfRangeError
from exactly.storage.partition_log import PartitionLog
from exactly.storage.producer_state import DEFAULT_PRODUCER_ID_EXPIRATION_MS
from exactly.storage.rolled_flush import RolledFlushRunner
from exactly.topics import topic_name_error
from exactly.types import TopicPartition

log = logging.getLogger(__name__)

META_PROPERTIES = "meta.properties"
TOPICS_FILE = "topics.json"
DELETE_RECORDS_HIGH_WATERMARK = -1  # DeleteRecords offset meaning "up to the high watermark"
CLEAN_SHUTDOWN_MARKER = ".clean_shutdown"
_PARTITION_DIR = re.compile(r"^(.+)-(\d+)$")


class TopicExistsError(Exception):
    pass


class UnknownTopicError(Exception):
    pass


class InvalidTopicError(ValueError):
    """A topic name Kafka would refuse (INVALID_TOPIC_EXCEPTION)."""


class InvalidPartitionsError(ValueError):
    """A partition count below 1 (INVALID_PARTITIONS)."""


class PolicyViolationError(Exception):
    """DeleteRecords on a topic whose cleanup.policy lacks ``delete`` (POLICY_VIOLATION)."""


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    topic_id: uuid.UUID
    partitions: int
    overrides: Mapping[str, str]  # Kafka-named topic config overrides
    config: LogConfig  # defaults + overrides
    internal: bool


def validate_topic_name(name: str) -> None:
    """Kafka's Topic.validate (exactly.topics): 1..249 chars of [a-zA-Z0-9._-], not '.' or '..'."""
    problem = topic_name_error(name)
    if problem is not None:
        raise InvalidTopicError(problem)


def new_cluster_id() -> str:
    """Kafka's Uuid.randomUuid().toString(): URL-safe base64 of 16 random bytes, no padding."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


class LogManager:
    """The broker's data directory: every partition log, the topic registry and the broker-wide
    metadata files.

    Owns: the ``PartitionLog`` of every partition (opened and closed here, nowhere else), the
    topic registry (``topics.json``), ``meta.properties`` (cluster id), the recovery-point and
    log-start-offset checkpoints and the ``.clean_shutdown`` marker.

    Lifecycle: the constructor opens (and, after an unclean shutdown, recovers) every partition
    and removes the clean-shutdown marker; from then on ``create_topic``, ``add_partitions`` and
    ``delete_topic`` change the registry, ``delete_records`` moves log start offsets, and
    ``run_maintenance`` runs periodically (rolls, retention, flushes, producer expiry,
    checkpoints); ``close`` flushes and closes every partition, writes the checkpoints and the
    marker, and is idempotent. Nothing may be used after ``close``. Single-threaded: the
    broker's event loop is the only caller (the one thread of its own, started by
    ``start_epoch_flush``, only rewrites the leader-epoch checkpoints recovery truncated; ``close``
    waits for it), except ``rolled_flush_runner``'s fsyncs, which any one thread at a time may run
    (``storage.rolled_flush``; ``close`` waits for them too).
    """

    def __init__(
        self,
        data_dir: Path,
        default_config: LogConfig,
        *,
        now_ms: int,
        checkpoint_interval_ms: int = DEFAULT_CHECKPOINT_INTERVAL_MS,
        producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS,
        replicated: bool = False,
    ) -> None:
        """Open every topic found in topics.json, recovering partitions (the recovery point
        comes from the checkpoint; after an unclean shutdown everything after it is validated).
        ``replicated`` (cluster mode): high watermarks come from ``replication-offset-checkpoint``."""
        self.data_dir = data_dir
        self.replicated = replicated
        self.default_config = default_config
        self.producer_id_expiration_ms = producer_id_expiration_ms
        data_dir.mkdir(parents=True, exist_ok=True)
        self._cluster_id = self._load_or_create_meta()
        marker = data_dir / CLEAN_SHUTDOWN_MARKER
        self.had_clean_shutdown = marker.exists()
        self._topics: dict[str, TopicInfo] = self._load_topics()
        if self._topics and not self.had_clean_shutdown:
            log.warning("%s was not shut down cleanly: validating unflushed data", data_dir)
        self._logs: dict[TopicPartition, PartitionLog] = {}
        self._checkpoints = LogCheckpoints(
            data_dir, replicated=replicated, interval_ms=checkpoint_interval_ms, now_ms=now_ms
        )
        start = self._checkpoints.read()
        high_watermarks = start.high_watermarks
        self._remove_orphan_directories()
        for info in self._topics.values():
            for partition in range(info.partitions):
                tp = TopicPartition(info.name, partition)
                self._logs[tp] = PartitionLog.open(
                    self._partition_dir(tp),
                    tp,
                    info.config,
                    recovery_point=start.recovery_points.get(tp),
                    now_ms=now_ms,
                    producer_id_expiration_ms=producer_id_expiration_ms,
                    log_start_offset=start.log_starts.get(tp, 0),
                    high_watermark=None if high_watermarks is None else high_watermarks.get(tp, 0),
                )
        # Recovery truncated some leader-epoch caches without rewriting their checkpoints (as
        # Kafka's truncateFromEndAsyncFlush defers the fsync): a thread of its own owes the
        # rewrites and their fsyncs (``start_epoch_flush``, once the broker serves), so a start
        # does not wait on a file creation, a rename and two fsyncs per partition (a topic of 100
        # empty partitions: 400 of them, each waiting for the filesystem journal on a busy disk).
        self._owed_epochs = [
            plog.leader_epochs for plog in self._logs.values() if plog.leader_epochs.unflushed
        ]
        self._epoch_flush: threading.Thread | None = None
        self._rolled_flushes = RolledFlushRunner()  # ``close`` stops it before closing partitions
        # The log cleaner's checkpoint; the cleaner threads themselves are the server's.
        self.cleaner_manager = LogCleanerManager(data_dir)
        # From here on a crash is an unclean shutdown.
        marker.unlink(missing_ok=True)
        self._closed = False

    def start_epoch_flush(self) -> None:
        """Start the thread that rewrites the leader-epoch checkpoints recovery truncated (see
        the constructor); the broker calls it once it serves, so that work (file creations,
        renames, fsyncs: kernel time and journal waits) competes with nothing of the start.
        Idempotent; ``close`` does whatever is still owed (everything if this was never called)."""
        if self._epoch_flush is not None or not self._owed_epochs:
            return
        self._epoch_flush = threading.Thread(
            target=flush_caches, args=(self._owed_epochs,), name="leader-epoch-flush", daemon=True
        )
        self._epoch_flush.start()

    # --- metadata files ------------------------------------------------------------------
    def _load_or_create_meta(self) -> str:
        path = self.data_dir / META_PROPERTIES
        if path.exists():
            for line in path.read_text().splitlines():
                key, sep, value = line.partition("=")
                if sep and key.strip() == "cluster.id" and value.strip():
                    return value.strip()
        cluster_id = new_cluster_id()
        write_durably(path, f"version=0\nbroker.id=0\ncluster.id={cluster_id}\n".encode())
        return cluster_id

    def _load_topics(self) -> dict[str, TopicInfo]:
        path = self.data_dir / TOPICS_FILE
        if not path.exists():
            return {}
        doc = json.loads(path.read_text())
        topics: dict[str, TopicInfo] = {}
        for name, entry in doc["topics"].items():
            overrides = {str(k): str(v) for k, v in entry.get("configs", {}).items()}
            topics[name] = TopicInfo(
                name=name,
                topic_id=uuid.UUID(entry["id"]),
                partitions=int(entry["partitions"]),
                overrides=MappingProxyType(overrides),
                config=self.default_config.with_overrides(overrides),
                internal=bool(entry.get("internal", False)),
            )
        return topics

    def _write_topics(self, topics: Mapping[str, TopicInfo] | None = None) -> None:
        """Persist ``topics`` (default: the current ones) to topics.json, atomically."""
        doc = {
            "version": 1,
            "topics": {
                info.name: {
                    "id": str(info.topic_id),
                    "partitions": info.partitions,
                    "configs": dict(info.overrides),
                    "internal": info.internal,
                }
                for info in (self._topics if topics is None else topics).values()
            },
        }
        write_durably(self.data_dir / TOPICS_FILE, json.dumps(doc, indent=1, sort_keys=True).encode())

    def _partition_dir(self, tp: TopicPartition) -> Path:
        return self.data_dir / f"{tp.topic}-{tp.partition}"

    def _remove_orphan_directories(self) -> None:
        """Partition directories of topics that are not listed (a delete interrupted by a crash)."""
        for path in self.data_dir.iterdir():
            match = _PARTITION_DIR.match(path.name)
            if not (path.is_dir() and match):
                continue
            topic, partition = match.group(1), int(match.group(2))
            info = self._topics.get(topic)
            if info is None or partition >= info.partitions:
                log.warning("deleting %s: no such topic partition in %s", path, TOPICS_FILE)
                shutil.rmtree(path, ignore_errors=True)

    # --- topics ----------------------------------------------------------------------------
    @property
    def cluster_id(self) -> str:
        return self._cluster_id

    def topics(self) -> dict[str, TopicInfo]:
        return dict(self._topics)

    def topic(self, name: str) -> TopicInfo | None:
        return self._topics.get(name)

    def topic_by_id(self, topic_id: uuid.UUID) -> TopicInfo | None:
        for info in self._topics.values():
            if info.topic_id == topic_id:
                return info
        return None

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
        """Raises TopicExistsError, InvalidConfigError (bad overrides), InvalidTopicError,
        InvalidPartitionsError. ``topic_id``: the cluster's id for the topic (every replica
        uses the one in ZooKeeper); a new random one when None."""
        if name in self._topics:
            raise TopicExistsError(f"Topic '{name}' already exists.")
        validate_topic_name(name)
        if partitions < 1:
            raise InvalidPartitionsError(f"Number of partitions must be larger than 0, got {partitions}")
        clean = {k: str(v) for k, v in overrides.items() if v is not None}
        config = self.default_config.with_overrides(clean)
        info = TopicInfo(
            name=name,
            topic_id=topic_id if topic_id is not None else uuid.uuid4(),
            partitions=partitions,
            overrides=MappingProxyType(clean),
            config=config,
            internal=internal,
        )
        self._topics[name] = info
        self._write_topics()
        for partition in range(partitions):
            tp = TopicPartition(name, partition)
            self._logs[tp] = self._new_partition(tp, config, now_ms)
        # No stale recovery point or log start of an older topic with this name may survive.
        self.checkpoint_recovery_points()
        self.checkpoint_log_start_offsets()
        return info

    def add_partitions(self, name: str, count: int, *, now_ms: int) -> TopicInfo:
        """Grow topic ``name`` to ``count`` partitions, created with the topic's config.

        prepare (open the new partitions, empty, with their leader epoch) -> persist (topics.json
        names the new count: the commit point) -> complete (publish them, checkpoint). If
        preparing or persisting fails, the new directories are deleted and the topic is as
        before. Raises UnknownTopicError, InvalidPartitionsError (``count`` is not an increase),
        OSError."""
        info = self._topics.get(name)
        if info is None:
            raise UnknownTopicError(f"Topic '{name}' does not exist.")
        if count <= info.partitions:
            raise InvalidPartitionsError(
                f"Topic '{name}' has {info.partitions} partitions; {count} would not be an increase"
            )
        grown = replace(info, partitions=count)
        prepared: dict[TopicPartition, PartitionLog] = {}
        try:
            for partition in range(info.partitions, count):
                tp = TopicPartition(name, partition)
                prepared[tp] = self._new_partition(tp, info.config, now_ms)
            self._write_topics({**self._topics, name: grown})
        except BaseException:
            for partition_log in prepared.values():
                partition_log.delete()
            raise
        self._topics[name] = grown
        self._logs.update(prepared)
        self.checkpoint_recovery_points()
        return grown

    def _new_partition(self, tp: TopicPartition, config: LogConfig, now_ms: int) -> PartitionLog:
        """An empty partition in a fresh directory, leader epoch recorded."""
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
        # Kafka records the epoch when the replica becomes leader, at creation: the
        # checkpoint write (an fsync) happens here, not inside the first produce request.
        partition_log.leader_epochs.assign(INITIAL_LEADER_EPOCH, 0)
        return partition_log

    def delete_topic(self, name: str) -> TopicInfo:
        """Close and delete the topic's partitions. Raises UnknownTopicError."""
        info = self._topics.pop(name, None)
        if info is None:
            raise UnknownTopicError(f"Topic '{name}' does not exist.")
        self._write_topics()
        for partition in range(info.partitions):
            tp = TopicPartition(name, partition)
            partition_log = self._logs.pop(tp, None)
            if partition_log is not None:
                partition_log.delete()
            self.cleaner_manager.remove(tp)
        self.checkpoint_recovery_points()
        self.checkpoint_log_start_offsets()
        return info

    def get_partition(self, tp: TopicPartition) -> PartitionLog | None:
        return self._logs.get(tp)

    def compacted_logs(self) -> list[PartitionLog]:
        """The logs the cleaner considers (cleanup.policy containing compact). Callable from a
        cleaner thread: it copies the partition map's values in one step."""
        return [plog for plog in list(self._logs.values()) if plog.config.compact and not plog.closed]

    def partitions(self) -> Iterator[PartitionLog]:
        return iter(list(self._logs.values()))

    # --- DeleteRecords -----------------------------------------------------------------------
    def delete_records(self, offsets: Mapping[TopicPartition, int]) -> dict[TopicPartition, int | Exception]:
        """Move each partition's log start offset to the given offset (-1: its high watermark),
        deleting the segments wholly below it (Kafka's Partition.deleteRecordsOnLeader). Per
        partition the result is the new log start offset (Kafka's low watermark) or the error:
        UnknownTopicError, PolicyViolationError (cleanup.policy without delete),
        OffsetOutOfRangeError (above the high watermark, or negative). When any start moved, the
        log start checkpoint is written (fsynced) before this returns."""
        results: dict[TopicPartition, int | Exception] = {}
        moved = False
        for tp, offset in offsets.items():
            partition_log = self._logs.get(tp)
            info = self._topics.get(tp.topic)
            if partition_log is None or info is None:
                results[tp] = UnknownTopicError(f"{tp} does not exist")
                continue
            if "delete" not in info.config.cleanup_policy:
                results[tp] = PolicyViolationError(
                    f"Records of partition {tp} can not be deleted due to the configured policy"
                )
                continue
            target = partition_log.high_watermark if offset == DELETE_RECORDS_HIGH_WATERMARK else offset
            if target < 0:
                results[tp] = OffsetOutOfRangeError(f"The offset {target} for partition {tp} is not valid")
                continue
            try:
                if partition_log.increment_log_start_offset(target):
                    moved = True
                    log.info("%s: log start offset moved to %d by DeleteRecords", tp, target)
            except OffsetOutOfRangeError as exc:
                results[tp] = exc
                continue
            results[tp] = partition_log.log_start_offset
        if moved:
            self.checkpoint_log_start_offsets()
        return results

    def checkpoint_log_start_offsets(self) -> None:
        """Write the log start offsets that the segments alone do not tell (``log_checkpoints``)."""
        self._checkpoints.write_log_start_offsets(self._logs)

    # --- maintenance -----------------------------------------------------------------------
    def run_maintenance(self, now_ms: int, *, flush_rolled: bool = True) -> None:
        """Periodic: segment roll by age, retention, flush.ms, fsync of rolled segments,
        producer-id expiration, and the recovery-point checkpoint every checkpoint interval.
        Without ``flush_rolled`` the rolled segments are left to the caller, which drives
        ``storage.rolled_flush.rolled_flush_steps`` over ``partitions()`` with the fsyncs (by
        ``rolled_flush_runner``) off its thread (the broker: off the event loop)."""
        for partition_log in list(self._logs.values()):
            partition_log.maybe_roll(now_ms)
            partition_log.apply_retention(now_ms)
            partition_log.maybe_flush(now_ms)
            if flush_rolled:
                partition_log.flush_rolled_segments()
            partition_log.producer_state.remove_expired_producers(now_ms)
        if self._checkpoints.due(now_ms):
            self.checkpoint_recovery_points()
            self.checkpoint_log_start_offsets()

    @property
    def rolled_flush_runner(self) -> RolledFlushRunner:
        """The fsyncs of ``rolled_flush_steps`` over ``partitions()`` (storage.rolled_flush), any
        one thread at a time; ``close`` stops it (waiting for one in flight), then it does nothing."""
        return self._rolled_flushes

    def checkpoint_recovery_points(self) -> None:
        """Write every partition's recovery point (flushed data only, by construction)."""
        self._checkpoints.write_recovery_points(self._logs)

    def checkpoint_high_watermarks(self) -> None:
        """Cluster mode: write every partition's high watermark (``replication-offset-checkpoint``,
        durably). A no-op on a single broker, whose HW is its recovered log end."""
        write = self.high_watermark_checkpoint()
        if write is not None:
            write()

    def high_watermark_checkpoint(self) -> Callable[[], None] | None:
        """The HW checkpoint as of now (None where there is none to write), written by calling the
        result, from any thread: it touches only this snapshot and the file, so the replica
        manager's periodic one runs off the event loop (two fsyncs, 15-35 ms on this box's disk).
        The caller keeps one log manager's writes in order and finished before ``close``."""
        if self._closed:
            return None
        return self._checkpoints.high_watermark_write(self._logs)

    def close(self) -> None:
        """Clean shutdown: close every partition (flush + producer snapshot), write the recovery,
        log start and (cluster mode) high watermark checkpoints and the clean-shutdown marker."""
        if self._closed:
            return
        if self._epoch_flush is not None:
            self._epoch_flush.join()
        self._rolled_flushes.stop()  # waits for a background fsync in flight
        # whatever is still owed: everything when start_epoch_flush never ran, else nothing
        # unless a partition opened later owed a rewrite the thread had no list entry for
        flush_caches([plog.leader_epochs for plog in self._logs.values() if plog.leader_epochs.unflushed])
        for partition_log in self._logs.values():
            partition_log.close()
        self.checkpoint_recovery_points()
        self.checkpoint_log_start_offsets()
        self.checkpoint_high_watermarks()
        write_durably(self.data_dir / CLEAN_SHUTDOWN_MARKER, b"")
        self._closed = True
