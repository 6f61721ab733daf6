"""The leader-epoch cache's rules with Kafka's replication semantics (``LeaderEpochFileCache``).

``exactly.storage.leader_epoch.LeaderEpochCache`` persists the same entries for the single broker;
its ``assign`` ignores anything not newer than the latest epoch and its ``end_offset_for`` returns
only an offset. Replication needs Kafka's exact behaviour, which differs in three ways:

* ``assign(e, off)`` also accepts ``e == latest`` with a *smaller* start offset, and first drops
  trailing entries whose epoch >= e or whose start >= off (a follower's log was truncated and the
  leader's batches re-stamp the range), instead of ignoring the assignment.
* ``end_offset_for(e)`` answers a pair ``(epoch, end offset)`` (OffsetsForLeaderEpoch), including
  ``(e, higher.start)`` when no epoch <= e is known, where storage answers -1.
* Truncating to an offset at or past the log end must still drop entries that start there
  (KAFKA-10706): that is ``truncate_from_end`` applied unconditionally by the caller.

These are pure functions over a tuple of :class:`EpochEntry` (storage's value type, reused), so the
storage class can delegate to them when replication is wired in: its ``entries`` list becomes the
input, the returned tuple is written with its existing checkpoint code.

Invariant of every returned tuple: epochs and start offsets strictly increase.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from exactly.storage.leader_epoch import EpochEntry

UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1


@dataclass(frozen=True, slots=True)
class EpochEndOffset:
    """An OffsetsForLeaderEpoch answer: the largest epoch <= the one asked (or the one asked when
    nothing older is known) and the offset where the next epoch starts (the log end for the
    latest). ``(-1, -1)``: the epoch is newer than anything known, or nothing is known."""

    leader_epoch: int
    end_offset: int

    @property
    def undefined(self) -> bool:
        return self.end_offset == UNDEFINED_EPOCH_OFFSET


UNDEFINED = EpochEndOffset(UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)


def latest_epoch(entries: Sequence[EpochEntry]) -> int:
    return entries[-1].epoch if entries else UNDEFINED_EPOCH


def assign(entries: Sequence[EpochEntry], epoch: int, start_offset: int) -> tuple[EpochEntry, ...]:
    """Record that ``epoch`` starts at ``start_offset`` (from an appended batch's
    partitionLeaderEpoch/baseOffset, or from becoming leader at the log end)."""
    current = tuple(entries)
    if epoch < 0 or start_offset < 0:
        return current
    if current:
        last = current[-1]
        if epoch == last.epoch and start_offset >= last.start_offset:
            return current  # the same epoch continuing: nothing to record
    kept = list(current)
    while kept and (kept[-1].epoch >= epoch or kept[-1].start_offset >= start_offset):
        kept.pop()
    kept.append(EpochEntry(epoch, start_offset))
    return tuple(kept)


def end_offset_for(entries: Sequence[EpochEntry], epoch: int, log_end_offset: int) -> EpochEndOffset:
    """Kafka's ``endOffsetFor``: what a leader answers to OffsetsForLeaderEpoch(epoch), and what a
    follower uses to find its own end of an epoch."""
    if epoch == UNDEFINED_EPOCH or not entries:
        return UNDEFINED
    if epoch == entries[-1].epoch:
        return EpochEndOffset(epoch, log_end_offset)
    higher = next((e for e in entries if e.epoch > epoch), None)
    if higher is None:
        return UNDEFINED
    floor = next((e for e in reversed(entries) if e.epoch <= epoch), None)
    if floor is None:
        return EpochEndOffset(epoch, higher.start_offset)
    return EpochEndOffset(floor.epoch, higher.start_offset)


def truncate_from_end(entries: Sequence[EpochEntry], end_offset: int) -> tuple[EpochEntry, ...]:
    """The log was cut at ``end_offset`` (exclusive): forget epochs starting at or after it."""
    if end_offset < 0:
        return tuple(entries)
    return tuple(e for e in entries if e.start_offset < end_offset)


def truncate_from_start(entries: Sequence[EpochEntry], start_offset: int) -> tuple[EpochEntry, ...]:
    """Segments below ``start_offset`` were deleted: the epoch covering it now starts there."""
    older = [e for e in entries if e.start_offset <= start_offset]
    newer = [e for e in entries if e.start_offset > start_offset]
    if not older:
        return tuple(entries)
    return (EpochEntry(older[-1].epoch, start_offset), *newer)
