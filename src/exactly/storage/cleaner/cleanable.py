"""Where a log may be cleaned, how dirty it is, and how its segments are grouped (Kafka's
LogCleanerManager.cleanableOffsets / calculateCleanableBytes / maxCompactionDelay, LogToClean and
Cleaner.groupSegmentsBySize), as functions of the segments and offsets.

Sections of a compacted log
---------------------------
* *clean*: from the log start to the *first dirty offset* (the cleaner checkpoint): already
  cleaned at least once;
* *cleanable dirty*: from the first dirty offset to the *first uncleanable offset*;
* *uncleanable*: the rest. The first uncleanable offset is the smallest of (1) the last stable
  offset, so undecided transactional data is never cleaned (the LSO is already at or below the
  high watermark); (2) the active segment's base offset; (3) with ``min.compaction.lag.ms`` > 0, the
  base of the first dirty non-active segment whose largest timestamp is newer than now - lag. It
  is never below the first dirty offset. Cleaning works on whole segments, so the bytes counted
  as cleanable stop at the segment holding the first uncleanable offset.

Replicas: each replica (leader or follower) cleans its own log, as Kafka's do. The cleanable
range stops at the high watermark as well as at the LSO (the LSO is already at or below it; the
explicit cap says so where the range is computed), so a follower never compacts data its leader
may still make it truncate. Removing tombstones, markers and producers' emptied batches is gated
by time (``delete.retention.ms`` past the pass that marked them) and, in a cluster, by the
*replica floor*: the offset below which every replica of the assignment is known to have the log
(``batch_filter``, ``replication.compaction_floor``), so a replica away for longer than the
retention still gets every one of them (Kafka gates by time alone; such a replica misses them).

A checkpoint below the log start (retention or DeleteRecords removed segments) or above the log
end (a truncated tail) is reset to the log start, and the caller rewrites it.

A log is *eligible* when its dirty ratio, cleanable bytes / (clean + cleanable bytes), exceeds
``min.cleanable.dirty.ratio``, or when ``max.compaction.lag.ms`` forces it: it has cleanable bytes
and a dirty non-active segment whose first batch is older than now - max lag. The filthiest
eligible log is cleaned first.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from exactly.storage.config import LogConfig
from exactly.storage.segment import LogSegment

log = logging.getLogger(__name__)

INT32_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class OffsetsToClean:
    first_dirty_offset: int
    first_uncleanable_offset: int
    force_update_checkpoint: bool  # the checkpoint was out of range and was reset


def _floor_index(segments: Sequence[LogSegment], offset: int) -> int:
    """Index of the segment holding ``offset`` (the last with base <= offset; 0 when below all)."""
    bases = [s.base_offset for s in segments]
    return max(bisect.bisect_right(bases, offset) - 1, 0)


def non_active_segments_from(segments: Sequence[LogSegment], offset: int) -> Sequence[LogSegment]:
    """The segments from the one holding ``offset`` on, without the active (last) one."""
    return segments[_floor_index(segments, offset) : len(segments) - 1]


def cleanable_offsets(
    segments: Sequence[LogSegment],
    *,
    log_start_offset: int,
    log_end_offset: int,
    last_stable_offset: int,
    checkpoint: int | None,
    config: LogConfig,
    now_ms: int,
    name: str = "",
    high_watermark: int | None = None,
) -> OffsetsToClean:
    """The first dirty offset and the first uncleanable offset (see the module docstring)."""
    dirty = log_start_offset if checkpoint is None else checkpoint
    force = False
    if dirty < log_start_offset:
        if "delete" not in config.cleanup_policy:
            log.warning(
                "%s: resetting the first dirty offset %d to the log start %d", name, dirty, log_start_offset
            )
        dirty, force = log_start_offset, True
    elif dirty > log_end_offset:
        log.warning(
            "%s: the first dirty offset %d is past the log end %d; resetting it to the log start %d",
            name,
            dirty,
            log_end_offset,
            log_start_offset,
        )
        dirty, force = log_start_offset, True
    uncleanable = min(last_stable_offset, segments[-1].base_offset)
    if high_watermark is not None:
        uncleanable = min(uncleanable, high_watermark)
    lag = max(config.min_compaction_lag_ms, 0)
    if lag > 0:
        for segment in non_active_segments_from(segments, dirty):
            if segment.max_timestamp > now_ms - lag:
                uncleanable = min(uncleanable, segment.base_offset)
                break
    return OffsetsToClean(dirty, max(dirty, uncleanable), force)


def max_compaction_delay(
    segments: Sequence[LogSegment], first_dirty_offset: int, config: LogConfig, now_ms: int
) -> int:
    """How long past ``max.compaction.lag.ms`` the oldest dirty non-active segment is (0: not)."""
    stamps = [
        ts
        for s in non_active_segments_from(segments, first_dirty_offset)
        if (ts := s.first_batch_timestamp) > 0
    ]
    if not stamps:
        return 0
    clean_until = now_ms - max(config.max_compaction_lag_ms, 0)
    earliest = min(stamps)
    return clean_until - earliest if earliest < clean_until else 0


@dataclass(frozen=True, slots=True)
class LogToClean:
    """One candidate log: its sections in bytes and its dirty ratio (Kafka's LogToClean)."""

    first_dirty_offset: int
    first_uncleanable_offset: int  # rounded down to a segment base
    clean_bytes: int
    cleanable_bytes: int
    compaction_delay_ms: int  # how far past max.compaction.lag.ms the oldest dirty data is

    @property
    def needs_compaction_now(self) -> bool:
        """max.compaction.lag.ms forces a pass whatever the dirty ratio."""
        return self.compaction_delay_ms > 0

    @property
    def total_bytes(self) -> int:
        return self.clean_bytes + self.cleanable_bytes

    @property
    def cleanable_ratio(self) -> float:
        return self.cleanable_bytes / self.total_bytes if self.total_bytes else 0.0

    def is_eligible(self, min_cleanable_ratio: float) -> bool:
        return (
            self.needs_compaction_now and self.cleanable_bytes > 0
        ) or self.cleanable_ratio > min_cleanable_ratio


def log_to_clean(
    segments: Sequence[LogSegment], offsets: OffsetsToClean, config: LogConfig, now_ms: int
) -> LogToClean:
    dirty = offsets.first_dirty_offset
    clean_bytes = sum(s.size for s in segments if s.base_offset < dirty)
    first_uncleanable = segments[_floor_index(segments, offsets.first_uncleanable_offset)].base_offset
    start = _floor_index(segments, min(dirty, first_uncleanable))
    cleanable_bytes = sum(s.size for s in segments[start:] if s.base_offset < first_uncleanable)
    delay = max_compaction_delay(segments, dirty, config, now_ms)
    return LogToClean(dirty, first_uncleanable, clean_bytes, cleanable_bytes, delay)


class GroupableSegment(Protocol):
    """What grouping reads of a segment (``job.SegmentSource`` in a cleaning pass)."""

    @property
    def base_offset(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def offset_index_bytes(self) -> int: ...
    @property
    def time_index_bytes(self) -> int: ...


S = TypeVar("S", bound=GroupableSegment)


def _index_bytes(segment: GroupableSegment) -> tuple[int, int]:
    return segment.offset_index_bytes, segment.time_index_bytes


def group_segments_by_size(
    segments: Sequence[S], max_size: int, max_index_size: int, first_uncleanable_offset: int
) -> list[list[S]]:
    """Consecutive groups, each rewritten into one segment: a group grows while its log bytes
    stay within ``segment.bytes``, each of its indexes within ``segment.index.bytes`` and its offset
    span within Int32 (relative offsets in the indexes are 32-bit). The span of a segment is
    bounded by the next segment's base (or the first uncleanable offset for the last one); an
    empty segment adds no span."""
    groups: list[list[S]] = []
    i = 0
    while i < len(segments):
        group = [segments[i]]
        log_size = segments[i].size
        index_size, time_index_size = _index_bytes(segments[i])
        i += 1
        while i < len(segments):
            candidate = segments[i]
            c_index, c_time = _index_bytes(candidate)
            last_offset = (
                segments[i + 1].base_offset - 1 if i + 1 < len(segments) else first_uncleanable_offset - 1
            )
            if not (
                log_size + candidate.size <= max_size
                and index_size + c_index <= max_index_size
                and time_index_size + c_time <= max_index_size
                and (candidate.size == 0 or last_offset - group[0].base_offset <= INT32_MAX)
            ):
                break
            group.append(candidate)
            log_size += candidate.size
            index_size += c_index
            time_index_size += c_time
            i += 1
        groups.append(group)
    return groups
