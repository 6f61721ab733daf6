"""The broker-side parts a ``LeaderFetcher`` touches, as plain objects: its logs, the waiters it
notifies and the manager's settings. Shared by the follower fetcher tests
(``test_replica_fetcher_fast``, ``test_follower_response_fast``), which drive real
``PartitionLog``\\ s through them."""

from __future__ import annotations

from dataclasses import dataclass, field

from exactly.storage.partition_log import PartitionLog
from exactly.types import TopicPartition


@dataclass
class Logs:
    logs: dict[TopicPartition, PartitionLog]

    def get_partition(self, tp: TopicPartition) -> PartitionLog | None:
        return self.logs.get(tp)


@dataclass
class Waiters:
    notified: list[TopicPartition] = field(default_factory=list)

    def notify(self, tp: TopicPartition) -> None:
        self.notified.append(tp)


@dataclass
class Broker:
    logs: Logs
    waiters: Waiters = field(default_factory=Waiters)


@dataclass
class Manager:
    broker: Broker
    broker_id: int = 1
    fetch_timeout_s: float = 30.0
