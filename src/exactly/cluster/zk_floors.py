"""The kazoo shell of the replica floors (``replication.compaction_floor``): one znode per
partition, ``/exactly/replica_floors/<topic>/<partition>``, written by the partition's leader and
watched by every broker hosting it.

Why a znode of exactly's own: Kafka has no channel that tells a follower how far the *other*
replicas have replicated (a Fetch response carries the leader's high watermark, the minimum over
the ISR only), and Kafka's own znodes must keep Kafka's formats. The path lies under the cluster's
chroot beside Kafka's, where Kafka's tools never look. The content is a small JSON
(``PublishedFloor.encode``). Writes are unconditional: a stale leader's write carries its older
leader epoch, which followers ignore (a floor of 0: nothing removed, never too much).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError, NotEmptyError

from exactly.replication.compaction_floor import FloorFormatError, PublishedFloor
from exactly.types import TopicPartition

log = logging.getLogger(__name__)

REPLICA_FLOORS = "/exactly/replica_floors"


def topic_floors_path(topic: str) -> str:
    return f"{REPLICA_FLOORS}/{topic}"


def floor_path(tp: TopicPartition) -> str:
    return f"{REPLICA_FLOORS}/{tp.topic}/{tp.partition}"


def write_floor(client: KazooClient, tp: TopicPartition, floor: PublishedFloor) -> None:
    """Set (or create) the partition's floor znode. Blocking: run it off the event loop."""
    path, data = floor_path(tp), floor.encode()
    try:
        client.set(path, data)
    except NoNodeError:
        try:
            client.create(path, data, makepath=True)
        except NodeExistsError:  # created meanwhile (an older leader): ours is the newer value
            client.set(path, data)


def delete_topic_floors(client: KazooClient, topic: str) -> None:
    """Remove a deleted topic's floors (best effort: a namesake topic has another topic id, so a
    leftover floor is never used)."""
    try:
        client.delete(topic_floors_path(topic), recursive=True)
    except (NoNodeError, NotEmptyError):
        pass
    except KazooException as exc:
        log.info("replica floors of %s not deleted: %r", topic, exc)


def watch_floor(
    client: KazooClient, tp: TopicPartition, callback: Callable[[PublishedFloor | None], bool | None]
) -> None:
    """``callback`` with the floor now and after every change (None: absent or unreadable), on a
    kazoo thread; the watch ends when it returns False."""

    def on_change(data: bytes | None, stat: Any) -> bool | None:
        if data is None or stat is None:
            return callback(None)
        try:
            floor = PublishedFloor.decode(data)
        except FloorFormatError as exc:
            log.warning("%s: %s", floor_path(tp), exc)
            return callback(None)
        return callback(floor)

    client.DataWatch(floor_path(tp), on_change)
