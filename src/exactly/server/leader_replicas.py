"""This broker's leaderships in cluster mode, on the event loop: the ``LeaderPartition`` of every
partition it leads, and what follows from them on the hot path of every produce: the high
watermark published to the log and to whoever waits on it, followers' fetches accounted, acks=all
produces parked until the ISR has their records (the leader side of Kafka's ``Partition`` plus
the wake-ups of its DelayedProduce purgatory).

Split from ``replica_manager``, which decides *which* partitions this broker leads (role changes
observed in ZooKeeper) and puts ``LeaderPartition`` objects into ``leaders`` or drops them; this
class only acts for the ones that are there, and proposes ISR changes through ``write_isr`` (the
manager's ``isr_writer``, which makes the conditional ZooKeeper write).

Order on a HW move: the parked produces first (their answers are written within the call, see
``delayed_produce``), then the consumers' parked fetches are woken. On a leader append that does
not move the HW (an ISR of more than one) only the followers' parked fetches are woken, since
only they read up to the log end.

Invariants: ``leaders`` is one dict for the broker's life (the manager, the ISR writer, the
handlers and the coordinators read it); a produce parked on a ``LeaderPartition`` is answered
NOT_LEADER_OR_FOLLOWER once that object is no longer in ``leaders``; a log's HW is set only from
its leader's, which never decreases.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from kio.schema.errors import ErrorCode

from exactly.replication.leader import IsrUpdate, LeaderPartition
from exactly.server.clock import now_ms
from exactly.server.delayed_produce import DelayedProduces, OnDone, Parked
from exactly.storage.partition_log import PartitionLog
from exactly.types import TopicPartition

if TYPE_CHECKING:
    from exactly.server.broker import Broker

WriteIsr = Callable[[TopicPartition, LeaderPartition, IsrUpdate], None]


class LeaderReplicas:
    def __init__(self, broker: Broker, broker_id: int, write_isr: WriteIsr) -> None:
        self.broker = broker
        self.broker_id = broker_id
        self.leaders: dict[TopicPartition, LeaderPartition] = {}
        # Delayed acks=all produces per partition: woken on every HW change and role change.
        self.delayed_produces = DelayedProduces()
        self._write_isr = write_isr

    def publish_high_watermark(self, tp: TopicPartition, leader: LeaderPartition) -> None:
        """The leader's HW moved: the delayed produces and consumers' parked fetches (bound by
        the HW) re-check; the followers' parked fetches (bound by the log end) stay parked."""
        plog = self.broker.logs.get_partition(tp)
        if plog is not None:
            self._published(plog, leader)
        else:
            self.delayed_produces.wake(tp)

    def _published(self, plog: PartitionLog, leader: LeaderPartition) -> None:
        """``publish_high_watermark`` for a caller holding the partition's current log (looked
        up within the same synchronous call): one log lookup less per follower fetch that moves
        the HW, the steady state of every acks=all message."""
        plog.update_high_watermark(leader.high_watermark)
        self.delayed_produces.wake(plog.tp)
        self.broker.waiters.notify_high_watermark(plog.tp)

    def refresh_high_watermarks(self) -> None:
        """A follower that left or is leaving no longer holds a HW back (``isr_eligible``)."""
        now = now_ms()
        for tp, leader in list(self.leaders.items()):
            if leader.refresh_high_watermark(now):
                self.publish_high_watermark(tp, leader)

    def on_follower_fetch(
        self, plog: PartitionLog, replica_id: int, fetch_offset: int, log_start: int
    ) -> None:
        """A follower's Fetch arrived at ``fetch_offset`` (its log end): the HW and the ISR
        follow it (``LeaderPartition.on_follower_fetch``). ``plog`` is the partition's current
        log, looked up by the caller within the same synchronous call."""
        leader = self.leaders.get(plog.tp)
        if leader is None or replica_id == self.broker_id:
            return
        try:
            outcome = leader.on_follower_fetch(replica_id, fetch_offset, log_start, now_ms())
        except KeyError:
            return
        if outcome.high_watermark_advanced:
            self._published(plog, leader)
        if outcome.isr_update is not None:
            self._write_isr(plog.tp, leader, outcome.isr_update)

    def after_leader_append(self, plog: PartitionLog) -> None:
        leader = self.leaders.get(plog.tp)
        if leader is not None:
            self.leader_appended(plog, leader)

    def leader_appended(self, plog: PartitionLog, leader: LeaderPartition) -> None:
        """``after_leader_append`` for a caller that holds ``plog``'s current leader already
        (looked up within the same synchronous call: the produce fast path)."""
        if leader.on_leader_append(plog.log_end_offset, now_ms()):  # an ISR of one
            plog.update_high_watermark(leader.high_watermark)
            self.delayed_produces.wake(plog.tp)
            self.broker.waiters.notify(plog.tp)  # consumers and parked follower fetches
        else:
            self.broker.waiters.notify_appended(plog.tp)  # parked follower fetches only

    def wake_acks(self, tp: TopicPartition) -> None:
        """A role change: parked produces of ``tp`` whose leader no longer leads are answered."""
        self.delayed_produces.wake(tp)

    def park_for_acks(
        self,
        tp: TopicPartition,
        leader: LeaderPartition,
        required_offset: int,
        min_isr: int,
        timeout_s: float,
        on_done: OnDone,
    ) -> ErrorCode | Parked:
        """Kafka's DelayedProduce for one partition, completed by a callback (``delayed_produce``)."""
        return self.delayed_produces.park(
            tp, leader, lambda: self.leaders.get(tp) is leader, required_offset, min_isr, timeout_s, on_done
        )

    async def wait_for_acks(
        self,
        tp: TopicPartition,
        leader: LeaderPartition,
        required_offset: int,
        min_isr: int,
        timeout_s: float,
    ) -> ErrorCode:
        """The same, awaited (the coordinators' writes to their internal topics)."""
        return await self.delayed_produces.wait(
            tp, leader, lambda: self.leaders.get(tp) is leader, required_offset, min_isr, timeout_s
        )
