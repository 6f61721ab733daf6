"""The replica floor of a compacted partition: the offset below which every replica of the
partition's assignment is known to have the log, which gates the cleaner's removal of
tombstones, COMMIT/ABORT markers and producers' emptied batches (``storage.cleaner.batch_filter``).

Why
---
Kafka compacts each replica on its own and protects tombstones and markers by time alone
(``delete.retention.ms``). A follower offline for longer fetches, when it returns, a log from which
they are gone while it still holds the older data they decided: deleted keys come back on it,
aborted data reads as committed, a transaction without its marker holds its LSO (and a
read_committed reader) forever, and so it serves once it leads. Here a replica removes one only
when its horizon has passed *and* its offset is below the floor.

Rules (invariants)
------------------
* The leader computes the floor: the minimum of the log end offsets of every replica of the
  *current assignment* (not just the ISR: an offline replica counts with the last offset it
  fetched at), capped at the leader's high watermark (data below it is never truncated by a clean
  election, so a replica that had it keeps it). A replica whose offset the leader does not know
  (a leader that just took over or restarted knows none: it starts from nothing) makes the floor
  0: nothing is removed. A replica removed from the assignment stops counting; one added counts
  from its first fetch.
* The leader publishes the floor with its leader epoch, the assignment it was computed over and
  the topic id (``PublishedFloor``; the shell writes it to a znode of exactly's own). A follower
  uses a published floor only when all three match what it knows now (same leader epoch: a
  floor of an older leadership may predate an unclean election; same assignment; same topic id:
  not a deleted topic's namesake), capped at its own high watermark; otherwise its floor is 0.
* A single broker has no floor (``None``): the cleaner keeps Kafka's rules exactly.

Publication is rate-limited (``publish_interval_ms``): a floor a little behind only delays
removals, which ``delete.retention.ms`` delays far more anyway. Pure: no I/O, time comes in as
``now_ms``; used on the event loop.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from exactly.types import TopicPartition

#: A floor below every offset: nothing is removable.
NOTHING_REMOVABLE = 0
PUBLISH_INTERVAL_MS = 5_000  # a floor a few seconds behind only delays removals; bounds ZooKeeper writes (50 offsets partitions: <= 10 writes/s)


class FloorFormatError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class PublishedFloor:
    """What a leader publishes for one partition."""

    topic_id: str | None
    leader_epoch: int
    replicas: tuple[int, ...]  # sorted
    floor: int

    def encode(self) -> bytes:
        return json.dumps(
            {
                "version": 1,
                "topic_id": self.topic_id,
                "leader_epoch": self.leader_epoch,
                "replicas": list(self.replicas),
                "floor": self.floor,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, data: bytes) -> PublishedFloor:
        try:
            obj = json.loads(data)
            topic_id = obj["topic_id"]
            replicas = tuple(sorted(int(r) for r in obj["replicas"]))
            floor = cls(
                None if topic_id is None else str(topic_id),
                int(obj["leader_epoch"]),
                replicas,
                int(obj["floor"]),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise FloorFormatError(f"unreadable replica floor: {exc!r}") from None
        return floor


def leader_floor(
    local_broker: int, assignment: Iterable[int], follower_offsets: Mapping[int, int], high_watermark: int
) -> int:
    """The floor as the leader knows it: min over the assignment's log end offsets (unknown or
    negative: nothing removable), capped at the high watermark."""
    floor = high_watermark
    for broker in assignment:
        if broker == local_broker:
            continue
        offset = follower_offsets.get(broker, -1)
        if offset < 0:
            return NOTHING_REMOVABLE
        floor = min(floor, offset)
    return max(floor, NOTHING_REMOVABLE)


def follower_floor(
    published: PublishedFloor | None,
    *,
    topic_id: str | None,
    leader_epoch: int,
    assignment: Iterable[int],
    high_watermark: int,
) -> int:
    """A follower's floor: the leader's published one if it is about this leadership, this
    assignment and this topic, capped at the follower's own high watermark."""
    if (
        published is None
        or published.leader_epoch != leader_epoch
        or published.topic_id != topic_id
        or published.replicas != tuple(sorted(assignment))
    ):
        return NOTHING_REMOVABLE
    return max(min(published.floor, high_watermark), NOTHING_REMOVABLE)


class CompactionFloors:
    """One broker's floors: the ones published by its partitions' leaders (seen in ZooKeeper)
    and the ones it published itself as a leader. Fed with events by the shell."""

    __slots__ = ("_published", "_written", "local_broker", "publish_interval_ms")

    def __init__(self, local_broker: int, publish_interval_ms: int = PUBLISH_INTERVAL_MS) -> None:
        self.local_broker = local_broker
        self.publish_interval_ms = publish_interval_ms
        self._published: dict[TopicPartition, PublishedFloor] = {}
        self._written: dict[TopicPartition, tuple[PublishedFloor, int]] = {}

    # --- events ----------------------------------------------------------------------------------

    def on_published(self, tp: TopicPartition, floor: PublishedFloor | None) -> None:
        """The partition's floor znode now holds ``floor`` (None: absent or unreadable)."""
        if floor is None:
            self._published.pop(tp, None)
        else:
            self._published[tp] = floor

    def on_written(self, tp: TopicPartition, floor: PublishedFloor, now_ms: int) -> None:
        """This broker, leading, wrote ``floor``."""
        self._written[tp] = (floor, now_ms)

    def on_not_leading(self, tp: TopicPartition) -> None:
        """A leadership ended: a later one publishes afresh."""
        self._written.pop(tp, None)

    def forget(self, tp: TopicPartition) -> None:
        """The partition is gone."""
        self._published.pop(tp, None)
        self._written.pop(tp, None)

    def written_partitions(self) -> set[TopicPartition]:
        """The partitions this broker has published a floor for in its current leaderships."""
        return set(self._written)

    # --- decisions -------------------------------------------------------------------------------

    def floor(
        self,
        tp: TopicPartition,
        *,
        topic_id: str | None,
        assignment: Iterable[int],
        leader_epoch: int,
        high_watermark: int,
        follower_offsets: Mapping[int, int] | None,
    ) -> int:
        """The floor the local cleaner uses for ``tp``: the leader's own (``follower_offsets``
        given: this broker leads) or the published one."""
        if follower_offsets is not None:
            return leader_floor(self.local_broker, assignment, follower_offsets, high_watermark)
        return follower_floor(
            self._published.get(tp),
            topic_id=topic_id,
            leader_epoch=leader_epoch,
            assignment=assignment,
            high_watermark=high_watermark,
        )

    def to_publish(
        self,
        tp: TopicPartition,
        *,
        topic_id: str | None,
        assignment: Iterable[int],
        leader_epoch: int,
        high_watermark: int,
        follower_offsets: Mapping[int, int],
        now_ms: int,
    ) -> PublishedFloor | None:
        """What this leader should write for ``tp`` now, if anything: nothing without followers,
        nothing that says no more than nothing (floor 0 with no earlier write in this
        leadership), nothing unchanged, and a change of the floor alone at most once per
        ``publish_interval_ms`` (a new epoch, assignment or topic id is written at once)."""
        replicas = tuple(sorted(assignment))
        if replicas == (self.local_broker,) or not replicas:
            return None
        value = leader_floor(self.local_broker, replicas, follower_offsets, high_watermark)
        candidate = PublishedFloor(topic_id, leader_epoch, replicas, value)
        written = self._written.get(tp)
        if written is None:
            return candidate if value > NOTHING_REMOVABLE else None
        last, at_ms = written
        if last == candidate:
            return None
        same_scope = (last.topic_id, last.leader_epoch, last.replicas) == (topic_id, leader_epoch, replicas)
        if same_scope and now_ms - at_ms < self.publish_interval_ms:
            return None
        return candidate
