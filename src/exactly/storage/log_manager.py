"""All partitions of one broker's data directory (Kafka's LogManager).

CONTRACT STUB — the public API below is fixed; the implementation is being written.

Layout of ``data_dir``::

    meta.properties                       broker/cluster id
    topics.json                           topic name -> id, partition count, config overrides
                                          (written atomically: tmp + fsync + rename)
    recovery-point-offset-checkpoint      per partition recovery point (clean shutdown)
    .clean_shutdown                       present only after a clean close
    <topic>-<partition>/                  one PartitionLog each

Topics named ``__consumer_offsets`` / ``__transaction_state`` are ordinary topics here.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from exactly.storage.config import LogConfig
from exactly.storage.partition_log import PartitionLog
from exactly.types import TopicPartition


class TopicExistsError(Exception):
    pass


class UnknownTopicError(Exception):
    pass


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    topic_id: uuid.UUID
    partitions: int
    overrides: Mapping[str, str]  # Kafka-named topic config overrides
    config: LogConfig  # defaults + overrides
    internal: bool


class LogManager:
    def __init__(self, data_dir: Path, default_config: LogConfig, *, now_ms: int) -> None:
        """Open every topic found in topics.json, recovering partitions (the recovery point
        comes from the checkpoint; after an unclean shutdown everything after it is validated)."""
        raise NotImplementedError

    @property
    def cluster_id(self) -> str:
        raise NotImplementedError

    def topics(self) -> dict[str, TopicInfo]:
        raise NotImplementedError

    def topic(self, name: str) -> TopicInfo | None:
        raise NotImplementedError

    def topic_by_id(self, topic_id: uuid.UUID) -> TopicInfo | None:
        raise NotImplementedError

    def create_topic(
        self, name: str, partitions: int, overrides: Mapping[str, str], *, now_ms: int, internal: bool = False
    ) -> TopicInfo:
        """Raises TopicExistsError, InvalidConfigError (bad overrides)."""
        raise NotImplementedError

    def delete_topic(self, name: str) -> TopicInfo:
        """Close and delete the topic's partitions. Raises UnknownTopicError."""
        raise NotImplementedError

    def get_partition(self, tp: TopicPartition) -> PartitionLog | None:
        raise NotImplementedError

    def partitions(self) -> Iterator[PartitionLog]:
        raise NotImplementedError

    def run_maintenance(self, now_ms: int) -> None:
        """Periodic: segment roll by age, retention, flush.ms, producer-id expiration."""
        raise NotImplementedError

    def checkpoint_recovery_points(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Clean shutdown: close every partition (flush + producer snapshot), write the recovery
        checkpoint and the clean-shutdown marker."""
        raise NotImplementedError
