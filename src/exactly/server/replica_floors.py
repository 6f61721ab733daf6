"""Cluster mode's replica floors on the event loop: what the log cleaner may remove below
(``replication.compaction_floor`` decides, ``cluster.zk_floors`` does the ZooKeeper I/O); and
beside them the other offset bound a replica persists in the background, its high watermarks
(``high_watermark_checkpoint_loop``: what a restart resumes from).

* ``compaction_floor(tp)``: called by the cleaner (on the loop) when it describes a pass. As the
  leader: from the ``LeaderPartition``'s follower log end offsets and high watermark. As a follower:
  the floor the leader published, if it is about the current leadership, assignment and topic id.
  A partition this broker neither leads nor follows with a known epoch: 0 (nothing removed).
* ``publish_loop``: every ``PUBLISH_INTERVAL_MS`` the leader writes the changed floors of the
  compacted partitions it leads (in the executor; a failed write is retried next round).
* ``on_published`` (from the floor watches of ``replica_watches``) and ``topic_gone`` feed the rest.

* ``high_watermark_checkpoint_loop``: Kafka's highwatermark-checkpoint task, for every hosted log.

Invariant: every value handed to the cleaner is a lower bound of every assigned replica's log end
offset and of this replica's high watermark, or 0.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from kazoo.exceptions import KazooException

from exactly.cluster.zk_floors import delete_topic_floors, write_floor
from exactly.replication.compaction_floor import (
    NOTHING_REMOVABLE,
    PUBLISH_INTERVAL_MS,
    CompactionFloors,
    PublishedFloor,
)
from exactly.server.clock import now_ms
from exactly.types import TopicPartition

if TYPE_CHECKING:
    from kazoo.client import KazooClient

    from exactly.replication.leader import LeaderPartition
    from exactly.replication.roles import PartitionRoles
    from exactly.server.metadata_cache import MetadataCache
    from exactly.storage.log_manager import LogManager

log = logging.getLogger("exactly.replica_manager")


class ReplicaFloors:
    def __init__(
        self,
        broker_id: int,
        *,
        client: Callable[[], KazooClient],
        cache: MetadataCache,
        roles: PartitionRoles,
        leaders: Mapping[TopicPartition, LeaderPartition],
        logs: LogManager,
    ) -> None:
        self.floors = CompactionFloors(broker_id)
        self._client = client
        self._cache = cache
        self._roles = roles
        self._leaders = leaders
        self._logs = logs

    def _topic_id(self, tp: TopicPartition) -> str | None:
        cached = self._cache.topic(tp.topic)
        return None if cached is None else cached.assignment.topic_id

    def compaction_floor(self, tp: TopicPartition) -> int:
        plog = self._logs.get_partition(tp)
        cached = self._cache.topic(tp.topic)
        local = self._roles.local(tp)
        if plog is None or cached is None or local is None:
            return NOTHING_REMOVABLE
        assignment = cached.assignment.partitions.get(tp.partition, ())
        leader = self._leaders.get(tp)
        offsets = None
        if leader is not None:
            offsets = {b: f.log_end_offset for b, f in leader.followers.items()}
        return self.floors.floor(
            tp,
            topic_id=cached.assignment.topic_id,
            assignment=assignment,
            leader_epoch=local.leader_epoch if leader is None else leader.leader_epoch,
            high_watermark=plog.high_watermark if leader is None else leader.high_watermark,
            follower_offsets=offsets,
        )

    def on_published(self, tp: TopicPartition, floor: PublishedFloor | None) -> None:
        self.floors.on_published(tp, floor)

    def topic_gone(self, topic: str, partitions: list[int]) -> None:
        for partition in partitions:
            self.floors.forget(TopicPartition(topic, partition))
        loop = asyncio.get_running_loop()
        loop.run_in_executor(None, delete_topic_floors, self._client(), topic)

    def _due(self, now: int) -> list[tuple[TopicPartition, PublishedFloor]]:
        due: list[tuple[TopicPartition, PublishedFloor]] = []
        for tp, leader in list(self._leaders.items()):
            plog = self._logs.get_partition(tp)
            if plog is None or not plog.config.compact:
                continue
            floor = self.floors.to_publish(
                tp,
                topic_id=self._topic_id(tp),
                assignment=self._cache.replicas(tp),
                leader_epoch=leader.leader_epoch,
                high_watermark=leader.high_watermark,
                follower_offsets={b: f.log_end_offset for b, f in leader.followers.items()},
                now_ms=now,
            )
            if floor is not None:
                due.append((tp, floor))
        for tp in self.floors.written_partitions() - self._leaders.keys():
            self.floors.on_not_leading(tp)
        return due

    def _write(self, due: list[tuple[TopicPartition, PublishedFloor]]) -> list[TopicPartition]:
        """In the executor: write each floor; returns the partitions written."""
        client = self._client()
        written: list[TopicPartition] = []
        for tp, floor in due:
            try:
                write_floor(client, tp, floor)
            except KazooException as exc:
                log.info("%s: replica floor not published: %r", tp, exc)
                continue
            written.append(tp)
        return written

    async def publish_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.floors.publish_interval_ms / 1000)
            now = now_ms()
            try:
                due = self._due(now)
                if not due:
                    continue
                written = set(await loop.run_in_executor(None, self._write, due))
            except Exception:  # the task must live on: a missed round only delays removals
                log.exception("publishing replica floors failed")
                continue
            for tp, floor in due:
                if tp in written:
                    self.floors.on_written(tp, floor, now)


async def high_watermark_checkpoint_loop(logs: LogManager, interval_ms: int) -> None:
    """Kafka's highwatermark-checkpoint task: every ``replica.high.watermark.checkpoint.interval.ms``
    the HWs go to ``replication-offset-checkpoint``, where a restart takes them from (the log
    manager also writes it at close)."""
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(interval_ms / 1000)
        # The values now, the file written off the loop: its fsyncs took 15-35 ms here, a
        # stop of every produce, fetch and acks=all answer on this broker every interval.
        write = logs.high_watermark_checkpoint()
        if write is None:
            continue
        written = loop.run_in_executor(None, write)
        try:
            await asyncio.shield(written)
        except asyncio.CancelledError:
            # stopping: a thread cannot be stopped, and the log manager's own last write at
            # close must come after this one
            await asyncio.gather(written, return_exceptions=True)
            raise
        except OSError:  # a full or failing disk: the next round retries, the broker serves on
            log.exception("high watermark checkpoint failed")


__all__ = ["PUBLISH_INTERVAL_MS", "ReplicaFloors", "high_watermark_checkpoint_loop"]
