"""The operations that change a partition's log other than by appending: segment rolls, flushes,
retention, moves of the log start offset (DeleteRecords) and a follower's truncation.

:class:`LogMaintenance` is the base of :class:`~exactly.storage.partition_log.PartitionLog`, which
owns every attribute declared here (it sets them in its constructor, from recovery); the split is by
responsibility only, the public API is ``PartitionLog``'s. The invariants kept are the ones in
``partition_log``'s docstring: ``log_start <= LSO <= HW <= LEO`` and ``log_start <= recovery point
<= LEO``; the recovery point only ever covers fsynced data.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

from exactly.storage.cleaner.swap import SwapHook, commit_segment_groups, replace_segment_groups
from exactly.storage.config import LogConfig
from exactly.storage.leader_epoch import LeaderEpochCache
from exactly.storage.log_loader import new_segment, rebuild_producer_state
from exactly.storage.log_read import OffsetOutOfRangeError
from exactly.storage.producer_state import ProducerStateManager
from exactly.storage.retention import deletable_segments, segments_below_log_start
from exactly.storage.roll_policy import rolls_when_idle
from exactly.storage.rolled_flush import RolledFlushPlan, flush_rolled, fsync_plans
from exactly.storage.segment import LogSegment
from exactly.types import TopicPartition


def stable_offset(first_unstable: int | None, high_watermark: int, log_start_offset: int) -> int:
    """The last stable offset: min(first unstable offset, high watermark), never below the log
    start; the high watermark when no transaction is open."""
    if first_unstable is None:
        return high_watermark
    return max(min(first_unstable, high_watermark), log_start_offset)


class LogMaintenance:
    """Rolls, flushes, retention, log-start moves and truncation over the attributes ``PartitionLog`` owns."""

    tp: TopicPartition
    directory: Path
    config: LogConfig
    producer_state: ProducerStateManager
    leader_epochs: LeaderEpochCache
    _segments: list[LogSegment]
    _bases: list[int]
    _recovery_point: int
    high_watermark: int
    log_start_offset: int
    last_stable_offset: int
    _first_unstable: int | None
    _unflushed_messages: int
    _last_flush_ms: int
    _truncation_lock: threading.Lock
    _truncated_to: int | None
    # Bumped by every change that removes, replaces or cuts segments (truncation, retention and
    # log-start deletes, cleaner swaps): a rolled flush planned under another version is
    # dropped (``complete_rolled_flush``).
    _layout_version: int
    _rolled_in_flight: tuple[LogSegment, ...]
    closed: bool

    @property
    def log_end_offset(self) -> int:
        return self._segments[-1].next_offset

    def _refresh_lso(self) -> None:
        """Set ``last_stable_offset`` from what it depends on: min(first unstable offset, high
        watermark), never below the log start. Called after every change of one of the three
        (the append paths, markers, truncation, log-start moves, high watermark updates); a plain
        attribute rather than a property because the consumer Fetch fast path reads it per
        request (``fetch_fast``). ``append_plain`` inlines it."""
        self.last_stable_offset = stable_offset(
            self._first_unstable, self.high_watermark, self.log_start_offset
        )

    def roll(self, now_ms: int) -> LogSegment:
        """Start a new active segment at the log end offset and snapshot producer state there
        (so recovery never replays more than one segment). The old segment is not fsynced here:
        ``rolled_flush_plan`` (log manager maintenance) hands that to a background thread."""
        active = self._segments[-1]
        if active.is_empty:
            return active
        active.on_become_inactive()
        segment = new_segment(self.directory, self.log_end_offset, self.config, now_ms)
        self._segments.append(segment)
        self._bases.append(segment.base_offset)
        # Written without its fsyncs (Kafka 3.5+): the rolled flush that moves the recovery
        # point to this offset fsyncs it first. Only a recovery point already here (a flush just
        # ran) needs it durable at once.
        self.producer_state.take_snapshot(sync=segment.base_offset <= self._recovery_point)
        return segment

    def maybe_roll(self, now_ms: int) -> None:
        """Roll by age (segment.ms) an active segment nothing is appended to (see ``roll_policy``)."""
        if rolls_when_idle(self._segments[-1], self.config, now_ms):
            self.roll(now_ms)

    def flush(self, *, now_ms: int | None = None) -> None:
        """fsync every segment with unflushed data and advance the recovery point to the LEO.
        Segments of a rolled flush still in flight are fsynced here too: the recovery point moved
        by this flush must not rely on a background fsync that may not have happened yet; so
        are the producer snapshots written at rolls without their fsyncs."""
        in_flight = self._rolled_in_flight
        for segment in self._segments:
            segment.flush(force=segment in in_flight)
        self.producer_state.sync_snapshots(self.log_end_offset)
        self._recovery_point = self.log_end_offset
        self._unflushed_messages = 0
        if now_ms is not None:
            self._last_flush_ms = now_ms

    def maybe_flush(self, now_ms: int) -> bool:
        """flush.ms: flush when the last flush is older than that. True when it flushed."""
        if self._unflushed_messages and now_ms - self._last_flush_ms >= self.config.flush_ms:
            self.flush(now_ms=now_ms)
            return True
        return False

    def flush_rolled_segments(self) -> None:
        """fsync the segments before the active one and move the recovery point to the active
        segment's base, all on the calling thread (``rolled_flush_steps``, which the broker drives
        with the fsync off its event loop, see ``storage.rolled_flush``). Bounds recovery after a crash to
        the active segment even when flush.messages/flush.ms are off."""
        flush_rolled([self], fsync_plans)

    def rolled_flush_plan(self) -> RolledFlushPlan | None:
        """Kafka's flush on roll, first half (owner's thread): hand the unflushed segments before
        the active one to a background fsync and name the recovery point it allows (the active
        segment's base). None when the recovery point is already there, the log is closed, or a
        plan is still in flight. Until ``complete_rolled_flush`` the handed segments count as
        unflushed for ``flush``; the caller must call it exactly once, after ``fsync_plan``
        returned (``ok``) or failed (not ``ok``)."""
        target = self._segments[-1].base_offset
        if self.closed or self._rolled_in_flight or target <= self._recovery_point:
            return None
        segments = tuple(segment for segment in self._segments[:-1] if segment.unflushed)
        snapshots = self.producer_state.unsynced_snapshots(target)
        try:
            descriptors = tuple(fd for segment in segments for fd in segment.take_flush_descriptors())
        except BaseException:  # an index write failed: nothing was handed over
            for segment in segments:
                segment.unflushed = True
            raise
        self._rolled_in_flight = segments
        return RolledFlushPlan(segments, descriptors, snapshots, self.directory, target, self._layout_version)

    def complete_rolled_flush(self, plan: RolledFlushPlan, *, ok: bool = True) -> bool:
        """Second half (owner's thread): with ``ok`` (every descriptor fsynced) move the recovery
        point to the plan's target, clamped to the log end; True when the plan was applied. Not
        ``ok``, or the log closed or its segments removed, replaced or truncated since the plan
        (``_layout_version``): the recovery point stays and the planned segments still in the log
        are unflushed again, so only fsynced data is ever claimed and nothing gone is."""
        if plan.segments is self._rolled_in_flight:
            self._rolled_in_flight = ()
        if not ok or self.closed or plan.layout_version != self._layout_version:
            if not self.closed:
                present = {id(segment) for segment in self._segments}
                for segment in plan.segments:
                    if id(segment) in present:
                        segment.unflushed = True
            return False
        self.producer_state.snapshots_synced(plan.snapshots)
        self._recovery_point = max(self._recovery_point, min(plan.target, self.log_end_offset))
        return True

    def apply_retention(self, now_ms: int) -> int:
        """Delete whole segments past retention.ms / retention.bytes (never the active one).
        Returns the number of segments deleted. The limits apply only for cleanup.policy containing
        delete; segments wholly below the log start offset go whatever the policy."""
        deletable = deletable_segments(self._segments, self.config, now_ms, self.log_start_offset)
        if deletable:
            self._delete_oldest(deletable)
        return deletable

    def increment_log_start_offset(self, offset: int) -> bool:
        """Move the log start offset up to ``offset`` (DeleteRecords; Kafka's
        UnifiedLog.maybeIncrementLogStartOffset) and delete the segments wholly below it. Raises
        OffsetOutOfRangeError when ``offset`` is above the high watermark; an offset at or below
        the current start changes nothing. True when it moved: the caller must then checkpoint
        it before acknowledging."""
        if offset > self.high_watermark:
            raise OffsetOutOfRangeError(
                f"{self.tp}: cannot move the log start offset to {offset}, above the high "
                f"watermark {self.high_watermark}"
            )
        if offset <= self.log_start_offset:
            return False
        if offset > self._recovery_point:
            # The recovery point must stay at or above the log start, and it only ever covers
            # fsynced data: flush rather than claim data below the new start is on disk.
            self.flush()
        self._move_log_start(offset)
        count = segments_below_log_start(self._segments, offset)
        if count:
            self._delete_oldest(count)
        return True

    def truncate_to(self, offset: int) -> int:
        """A follower's truncation (KIP-101/279): remove every batch at or after ``offset``
        (the batch containing it stays whole, so pass a batch boundary) and return the bytes
        removed. The leader-epoch cache forgets epochs starting at or after ``offset`` even when
        nothing is removed (KAFKA-10706). Producer state is rewound to the newest snapshot at or
        below the new log end and the log replayed from there, which also rebuilds the aborted
        transactions of the replayed range. The HW and recovery point never exceed the new end.
        A cut below the log start offset is clamped to it (Kafka would restart the log there)."""
        offset = max(offset, self.log_start_offset)
        self.leader_epochs.truncate_from_end(offset)
        if offset >= self.log_end_offset:
            return 0
        with self._truncation_lock:  # for the log cleaner's checkpoint (``take_truncation``)
            self._truncated_to = offset if self._truncated_to is None else min(self._truncated_to, offset)
        self._layout_version += 1
        removed = 0
        while len(self._segments) > 1 and self._segments[-1].base_offset >= offset:
            doomed = self._segments.pop()
            self._bases.pop()
            removed += doomed.size
            doomed.delete()
        active = self._segments[-1]
        removed += active.truncate_to(offset)
        active.txn_index.truncate_to(offset)
        new_end = self.log_end_offset
        self.high_watermark = min(self.high_watermark, new_end)
        self._recovery_point = min(self._recovery_point, new_end)
        self.producer_state.truncate_and_reload(
            log_start_offset=self.log_start_offset, log_end_offset=new_end
        )
        rebuild_producer_state(
            self._segments, self.producer_state, self.leader_epochs, self.log_start_offset, new_end, new_end
        )
        self._first_unstable = self.producer_state.first_unstable_offset()
        self._refresh_lso()
        return removed

    def replace_segments(
        self, cleaned: LogSegment, old: Sequence[LogSegment], hook: SwapHook | None = None
    ) -> None:
        """Swap a flushed ``.cleaned`` segment in for the consecutive non-active segments ``old``
        (the log cleaner's last step; Kafka's replaceSegments): files first, crash-safely
        (``cleaner.swap``), then the segment list. Offsets, the log start, the high watermark and
        producer state are unchanged: cleaning keeps every offset and each active producer's last
        batch, so a replay of the cleaned log from any remaining snapshot gives the same state."""
        self.replace_segment_groups([(cleaned, old)], hook)

    def replace_segment_groups(
        self,
        groups: Sequence[tuple[LogSegment, Sequence[LogSegment]]],
        hook: SwapHook | None = None,
        *,
        finish: bool = True,
    ) -> None:
        """``replace_segments`` for several cleaned segments of one pass at once, one directory
        fsync per swap step for all of them (``cleaner.swap.replace_segment_groups``). The groups
        must be in offset order and consecutive: together they replace one contiguous run of
        non-active segments. Without ``finish`` the last directory fsync and the removal of the
        old files are left to the caller (``cleaner.swap.finish_segment_groups``, off the
        owner's thread): the log is already whole without them."""
        if not groups:
            return
        first = self._segments.index(groups[0][1][0])
        position = first
        for cleaned, old in groups:
            if not old or self._segments[position : position + len(old)] != list(old):
                raise ValueError(f"{self.tp}: segments to replace are not consecutive non-active segments")
            if cleaned.base_offset != old[0].base_offset:
                raise ValueError(
                    f"{self.tp}: a cleaned segment must start where the segments it replaces start"
                )
            position += len(old)
        if position >= len(self._segments):
            raise ValueError(f"{self.tp}: segments to replace are not consecutive non-active segments")
        if finish:
            replace_segment_groups(self.directory, groups, hook)
        else:
            commit_segment_groups(self.directory, groups, hook)
        self._segments[first:position] = [cleaned for cleaned, _old in groups]
        self._layout_version += 1
        self._bases[first:position] = [cleaned.base_offset for cleaned, _old in groups]
        # As Kafka: the snapshots taken at the bases of segments merged away go (recovery then
        # replays from an older one), so a compacted log does not gather one per roll forever.
        for _cleaned, old in groups:
            for segment in old[1:]:
                self.producer_state.delete_snapshot(segment.base_offset)

    def _move_log_start(self, start: int) -> None:
        """``log_start <= LSO <= HW`` and ``log_start <= recovery point`` stay true; the leader
        epoch cache forgets epochs below the start (LSO clamping: ``last_stable_offset``)."""
        self.log_start_offset = start
        self.high_watermark = max(self.high_watermark, start)
        self._refresh_lso()
        if start > self._recovery_point:  # a snapshot at the new start may be loaded: durable first
            self.producer_state.sync_snapshots(start)
        self._recovery_point = max(self._recovery_point, start)
        self.leader_epochs.truncate_from_start(start)

    def _delete_oldest(self, count: int) -> None:
        self._layout_version += 1
        for segment in self._segments[:count]:
            segment.delete()
        del self._segments[:count]
        del self._bases[:count]
        first_base = self._segments[0].base_offset
        if first_base > self.log_start_offset:
            self._move_log_start(first_base)
        # Snapshots from the first segment's base on stay: recovery replays that whole segment
        # (the log start may lie inside it, and a transaction open there must be rebuilt).
        self.producer_state.delete_snapshots_before(first_base)
