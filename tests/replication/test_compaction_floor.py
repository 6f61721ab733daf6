"""The replica floor's rules: over the whole assignment (an offline replica counts with its last
known offset), capped at the high watermark, 0 without knowledge; what a follower accepts; what a
leader publishes and when."""

from __future__ import annotations

import pytest

from exactly.cluster.znodes import LeaderAndIsr
from exactly.replication.compaction_floor import (
    NOTHING_REMOVABLE,
    CompactionFloors,
    FloorFormatError,
    PublishedFloor,
    follower_floor,
    leader_floor,
)
from exactly.replication.leader import LeaderPartition
from exactly.types import TopicPartition

TP = TopicPartition("t", 0)
TID = "topic-id"


def test_the_floor_is_the_slowest_replica_of_the_assignment_capped_at_the_high_watermark() -> None:
    assert leader_floor(1, (1, 2, 3), {2: 40, 3: 35}, high_watermark=38) == 35
    assert leader_floor(1, (1, 2, 3), {2: 40, 3: 45}, high_watermark=38) == 38
    # An offline replica (out of the ISR, not fetching) counts with the last offset it fetched at.
    assert leader_floor(1, (1, 2, 3), {2: 100, 3: 7}, high_watermark=100) == 7


def test_a_replica_whose_offset_is_unknown_makes_nothing_removable() -> None:
    assert leader_floor(1, (1, 2, 3), {2: 40}, high_watermark=40) == NOTHING_REMOVABLE
    assert leader_floor(1, (1, 2, 3), {2: 40, 3: -1}, high_watermark=40) == NOTHING_REMOVABLE


def test_a_replica_removed_from_the_assignment_stops_counting_and_an_added_one_counts() -> None:
    known = {2: 40, 3: 5}
    assert leader_floor(1, (1, 2, 3), known, high_watermark=40) == 5
    assert leader_floor(1, (1, 2), known, high_watermark=40) == 40  # 3 reassigned away
    assert leader_floor(1, (1, 2, 4), known, high_watermark=40) == NOTHING_REMOVABLE  # 4 new, unknown


def test_a_leader_after_a_restart_or_takeover_starts_from_nothing() -> None:
    # The LeaderPartition of a new leadership knows no follower's log end offset yet.
    leader = LeaderPartition(
        local_broker=1,
        state=LeaderAndIsr(1, 5, (1, 2, 3), 2),
        zk_version=7,
        replicas=(1, 2, 3),
        leader_log_end_offset=50,
        high_watermark=50,
        now_ms=0,
    )
    floors = CompactionFloors(1)

    def floor() -> int:
        offsets = {b: f.log_end_offset for b, f in leader.followers.items()}
        return floors.floor(
            TP,
            topic_id=TID,
            assignment=(1, 2, 3),
            leader_epoch=5,
            high_watermark=leader.high_watermark,
            follower_offsets=offsets,
        )

    assert floor() == NOTHING_REMOVABLE
    leader.on_follower_fetch(2, 50, 0, now_ms=1)
    assert floor() == NOTHING_REMOVABLE  # 3 still unknown (offline since before the restart)
    leader.on_follower_fetch(3, 20, 0, now_ms=2)
    assert floor() == 20


def _published(epoch: int = 5, replicas: tuple[int, ...] = (1, 2, 3), floor: int = 30) -> PublishedFloor:
    return PublishedFloor(TID, epoch, replicas, floor)


def test_a_follower_uses_its_leaders_floor_only_for_this_leadership_assignment_and_topic() -> None:
    def floor(published: PublishedFloor | None, **kw: object) -> int:
        args: dict[str, object] = {
            "topic_id": TID,
            "leader_epoch": 5,
            "assignment": (3, 1, 2),
            "high_watermark": 100,
        }
        args.update(kw)
        return follower_floor(published, **args)  # type: ignore[arg-type]

    assert floor(_published()) == 30
    assert floor(_published(), high_watermark=12) == 12  # capped at its own high watermark
    assert floor(None) == NOTHING_REMOVABLE  # nothing published: nothing removed
    assert floor(_published(epoch=4)) == NOTHING_REMOVABLE  # an older leadership's
    assert floor(_published(), leader_epoch=6) == NOTHING_REMOVABLE  # not yet the new leader's
    assert floor(_published(replicas=(1, 2))) == NOTHING_REMOVABLE  # another assignment
    assert floor(_published(), topic_id="other") == NOTHING_REMOVABLE  # a deleted namesake's


def test_the_broker_object_serves_followers_from_what_was_published() -> None:
    floors = CompactionFloors(2)
    args = {"topic_id": TID, "assignment": (1, 2, 3), "leader_epoch": 5, "high_watermark": 90}
    assert floors.floor(TP, follower_offsets=None, **args) == NOTHING_REMOVABLE  # type: ignore[arg-type]
    floors.on_published(TP, _published(floor=60))
    assert floors.floor(TP, follower_offsets=None, **args) == 60  # type: ignore[arg-type]
    floors.on_published(TP, None)  # the znode went away
    assert floors.floor(TP, follower_offsets=None, **args) == NOTHING_REMOVABLE  # type: ignore[arg-type]
    floors.on_published(TP, _published(floor=60))
    floors.forget(TP)  # the topic was deleted
    assert floors.floor(TP, follower_offsets=None, **args) == NOTHING_REMOVABLE  # type: ignore[arg-type]


def test_what_a_leader_publishes_and_when() -> None:
    floors = CompactionFloors(1, publish_interval_ms=1_000)

    def due(
        offsets: dict[int, int], *, now: int, epoch: int = 5, assignment: tuple[int, ...] = (1, 2, 3)
    ) -> PublishedFloor | None:
        return floors.to_publish(
            TP,
            topic_id=TID,
            assignment=assignment,
            leader_epoch=epoch,
            high_watermark=100,
            follower_offsets=offsets,
            now_ms=now,
        )

    assert due({2: 10, 3: 10}, now=0, assignment=(1,)) is None  # no follower: nobody to tell
    assert due({2: 10}, now=0) is None  # knows nothing yet: says nothing
    first = due({2: 10, 3: 20}, now=0)
    assert first == PublishedFloor(TID, 5, (1, 2, 3), 10)
    floors.on_written(TP, first, 0)
    assert due({2: 10, 3: 20}, now=5_000) is None  # unchanged
    assert due({2: 15, 3: 20}, now=500) is None  # changed, but within the interval
    assert due({2: 15, 3: 20}, now=1_000) == PublishedFloor(TID, 5, (1, 2, 3), 15)
    # A new leader epoch or assignment is written at once, even when it says "nothing".
    assert due({2: 15, 3: 20}, now=1, epoch=6) == PublishedFloor(TID, 6, (1, 2, 3), 15)
    assert due({2: 15, 3: 20}, now=1, assignment=(1, 2, 3, 4)) == PublishedFloor(TID, 5, (1, 2, 3, 4), 0)
    floors.on_not_leading(TP)
    assert floors.written_partitions() == set()
    assert due({2: 10}, now=2) is None  # a later leadership starts afresh


def test_the_published_floor_round_trips_and_garbage_is_refused() -> None:
    floor = PublishedFloor(TID, 3, (1, 2, 3), 1234)
    assert PublishedFloor.decode(floor.encode()) == floor
    assert PublishedFloor.decode(PublishedFloor(None, 0, (2, 1), 0).encode()).replicas == (1, 2)
    for bad in (b"", b"{}", b'{"topic_id":null,"leader_epoch":"x","replicas":[],"floor":1}', b"[1]"):
        with pytest.raises(FloorFormatError):
            PublishedFloor.decode(bad)
