"""The replica floors' znodes on a real ZooKeeper: written (created, then set), watched (garbage
reads as no floor), deleted with their topic."""

from __future__ import annotations

import queue

from exactly.cluster.zk import ClusterZk
from exactly.cluster.zk_floors import delete_topic_floors, floor_path, watch_floor, write_floor
from exactly.replication.compaction_floor import PublishedFloor
from exactly.types import TopicPartition

TP = TopicPartition("t", 3)


def test_floors_are_written_watched_and_deleted(zk: ClusterZk) -> None:
    seen: queue.Queue[PublishedFloor | None] = queue.Queue()
    watch_floor(zk.client, TP, lambda floor: seen.put(floor))
    assert seen.get(timeout=10) is None  # nothing published yet
    first = PublishedFloor("id", 1, (0, 1, 2), 10)
    write_floor(zk.client, TP, first)  # created
    assert seen.get(timeout=10) == first
    second = PublishedFloor("id", 1, (0, 1, 2), 25)
    write_floor(zk.client, TP, second)  # set
    assert seen.get(timeout=10) == second
    zk.client.set(floor_path(TP), b"not json")
    assert seen.get(timeout=10) is None  # unreadable: no floor (nothing removed)
    delete_topic_floors(zk.client, TP.topic)
    assert zk.client.exists(floor_path(TP)) is None
    assert seen.get(timeout=10) is None
    delete_topic_floors(zk.client, TP.topic)  # again: nothing to delete, no error
