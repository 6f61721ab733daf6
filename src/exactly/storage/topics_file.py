"""topics.json and its one writer: the durable half of every topic change, off the owner's thread.

Why
---
Creating a topic made six fsyncs per one-partition topic on the broker's event loop (topics.json,
the partition's leader-epoch checkpoint and the recovery-point checkpoint, each file and
directory): one CreateTopics of 20 topics stalled every connection for 0.75-0.92 s at load 9
(bench/results/mends-s21.md). A topic change is therefore split in three (``topic_changes``):
*prepare* on the owner's thread (validate, reserve the name, snapshot the checkpoints), *persist*
here (make the new partitions, write the checkpoints and topics.json), on any one thread at a time (the
broker: one worker thread, jobs in order), and *complete* on the owner's thread (publish, or undo).

Invariants
----------
* ``TopicsWriter`` is the only writer of topics.json after load. It keeps ``committed``, the
  topics the file lists, and every job writes "committed + this change": a job never drops a topic
  another job added, and never names a topic whose own job failed (a failed job leaves
  ``committed`` and the file as they were). Concurrent changes touch distinct names (the owner
  reserves a name for the whole prepare -> complete), so jobs commute and the order they run in
  changes nothing but which one waits.
* topics.json is the commit point. Before it, a job only writes what is harmless without it: the
  new partitions' directories with their leader-epoch checkpoints (unlisted: start-up deletes them)
  and the offset checkpoints without stale entries of an older topic of the same name (entries of
  unlisted partitions are ignored). After it, nothing may fail the job: the removal of a deleted
  topic's directories and its checkpoint entries are best effort (start-up deletes unlisted
  directories; the next checkpoint write, at the latest a create of that name, drops stale
  entries).
* After ``stop`` (the log manager's ``close``) no job starts; ``stop`` waits for one in flight.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from exactly.storage.config import LogConfig
from exactly.storage.durable import write_durably
from exactly.storage.log_checkpoints import (
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    LogCheckpoints,
)
from exactly.types import TopicPartition

log = logging.getLogger(__name__)

TOPICS_FILE = "topics.json"


class TopicExistsError(Exception):
    pass


class UnknownTopicError(Exception):
    pass


class InvalidTopicError(ValueError):
    """A topic name Kafka would refuse (INVALID_TOPIC_EXCEPTION)."""


class InvalidPartitionsError(ValueError):
    """A partition count below 1 (INVALID_PARTITIONS)."""


class TopicsWriterStopped(OSError):
    """The log manager closed before this job ran: nothing of it was written."""


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    topic_id: uuid.UUID
    partitions: int
    overrides: Mapping[str, str]  # Kafka-named topic config overrides
    config: LogConfig  # defaults + overrides
    internal: bool


def load_topics(path: Path, default_config: LogConfig) -> dict[str, TopicInfo]:
    """The topics ``path`` lists (none when it does not exist)."""
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
            config=default_config.with_overrides(overrides),
            internal=bool(entry.get("internal", False)),
        )
    return topics


def encode_topics(topics: Mapping[str, TopicInfo]) -> bytes:
    doc = {
        "version": 1,
        "topics": {
            info.name: {
                "id": str(info.topic_id),
                "partitions": info.partitions,
                "configs": dict(info.overrides),
                "internal": info.internal,
            }
            for info in topics.values()
        },
    }
    return json.dumps(doc, indent=1, sort_keys=True).encode()


@dataclass(frozen=True, slots=True)
class TopicChange:
    """The durable part of one topic change (any number of topics), built on the owner's thread.

    ``put``: the entries of created or grown topics after the change; ``remove``: deleted topics;
    ``make_files``: makes the new partitions (directories, segments, leader-epoch checkpoints),
    run first (what it made before failing is the owner's to undo); ``recovery_points`` / ``log_starts``: the offset checkpoints as of the change
    (snapshots: the logs are the owner's); ``after_commit``: best-effort steps once topics.json is
    written (a deleted topic's directories and cleaner checkpoint entries)."""

    put: tuple[TopicInfo, ...] = ()
    remove: tuple[str, ...] = ()
    make_files: Callable[[], object] | None = None
    recovery_points: Mapping[TopicPartition, int] = field(default_factory=dict)
    log_starts: Mapping[TopicPartition, int] = field(default_factory=dict)
    after_commit: tuple[Callable[[], object], ...] = ()


class TopicsWriter:
    """The one writer of topics.json (see the module docstring). ``persist`` runs on any one
    thread at a time (a lock serialises callers; the broker keeps one worker thread so jobs also
    run in the order they were prepared)."""

    def __init__(self, path: Path, committed: Mapping[str, TopicInfo], checkpoints: LogCheckpoints) -> None:
        self.path = path
        self._committed: dict[str, TopicInfo] = dict(committed)
        self._checkpoints = checkpoints
        self._lock = threading.Lock()
        self._stopped = False

    @property
    def committed(self) -> dict[str, TopicInfo]:
        """The topics topics.json lists as of the last job (a copy)."""
        with self._lock:
            return dict(self._committed)

    def persist(self, change: TopicChange) -> None:
        """Write ``change`` durably: the new partitions and (for a create or growth) the offset
        checkpoints, then topics.json as "committed + change" (the commit point), then the
        best-effort steps. Raises OSError (``TopicsWriterStopped`` after ``stop``) with nothing
        committed; ``committed`` then stays as it was."""
        with self._lock:
            if self._stopped:
                raise TopicsWriterStopped("the log manager is closed")
            after = {k: v for k, v in self._committed.items() if k not in change.remove}
            after.update((info.name, info) for info in change.put)
            if change.make_files is not None:
                change.make_files()
            if change.put:
                self._write_checkpoints(change, after)
            write_durably(self.path, encode_topics(after))
            self._committed = after
            if not change.put:
                try:
                    self._write_checkpoints(change, after)
                except OSError as exc:  # the next write drops the stale entries
                    log.warning("checkpoints after deleting %s not written: %s", change.remove, exc)
            for step in change.after_commit:
                try:
                    step()
                except OSError as exc:  # start-up deletes what is left unlisted
                    log.warning("after committing a topic change: %s", exc)

    def _write_checkpoints(self, change: TopicChange, listed: Mapping[str, TopicInfo]) -> None:
        """The change's snapshots, keeping only partitions ``listed`` (the topics after it): a
        snapshot taken before another change in flight was persisted must not bring back a
        topic that change deleted. A partition the snapshot misses (another change's, not yet
        published when it was taken) is validated from its start on recovery: only slower."""

        def kept(offsets: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
            return {
                tp: offset
                for tp, offset in offsets.items()
                if (info := listed.get(tp.topic)) is not None and tp.partition < info.partitions
            }

        self._checkpoints.write_offsets(RECOVERY_POINT_CHECKPOINT, kept(change.recovery_points))
        self._checkpoints.write_offsets(LOG_START_OFFSET_CHECKPOINT, kept(change.log_starts))

    def stop(self) -> None:
        """No job starts after this; waits for one in flight."""
        with self._lock:
            self._stopped = True


__all__ = [
    "TOPICS_FILE",
    "InvalidPartitionsError",
    "InvalidTopicError",
    "TopicChange",
    "TopicExistsError",
    "TopicInfo",
    "TopicsWriter",
    "TopicsWriterStopped",
    "UnknownTopicError",
    "encode_topics",
    "load_topics",
]
