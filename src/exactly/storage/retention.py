"""Which segments retention deletes (Kafka's UnifiedLog.deleteOldSegments), as a pure function.

Retention removes whole segments from the start of the log, never the active one (the log always
keeps a segment to append to and its end offset). Three independent reasons, from the oldest
segment on:

* the log start offset (moved by DeleteRecords): a segment goes once the *next* segment starts
  at or below it, i.e. every offset it holds is below the log start. This applies whatever the
  cleanup.policy (Kafka's deleteLogStartOffsetBreachedSegments); the segment holding the log
  start stays, so the log start may lie inside a segment, even inside a batch.

Two limits, either of which may be off (-1):

* retention.ms: a segment goes once its largest timestamp is older than ``now - retention.ms``;
  the scan stops at the first segment that is young enough, so the log stays contiguous even when
  timestamps are not monotonic.
* retention.bytes: the oldest segments go while the log stays at or above the limit without them.

Only topics whose cleanup.policy contains ``delete`` are subject to the two limits.
"""

from __future__ import annotations

from collections.abc import Sequence

from exactly.storage.config import LogConfig
from exactly.storage.segment import LogSegment


def deletable_segments(
    segments: Sequence[LogSegment], config: LogConfig, now_ms: int, log_start_offset: int = 0
) -> int:
    """How many segments, counted from the oldest, retention may delete now."""
    candidates = len(segments) - 1  # never the active segment
    deletable = segments_below_log_start(segments, log_start_offset)
    if "delete" not in config.cleanup_policy:
        return deletable
    if config.retention_ms >= 0:
        while (
            deletable < candidates
            and now_ms - segments[deletable].retention_timestamp() > config.retention_ms
        ):
            deletable += 1
    if config.retention_bytes >= 0:
        excess = sum(s.size for s in segments[deletable:]) - config.retention_bytes
        while deletable < candidates and excess - segments[deletable].size >= 0:
            excess -= segments[deletable].size
            deletable += 1
    return deletable


def segments_below_log_start(segments: Sequence[LogSegment], log_start_offset: int) -> int:
    """How many segments, from the oldest, hold only offsets below ``log_start_offset``: those
    whose successor starts at or below it (never the active segment, which has none)."""
    count = 0
    while count < len(segments) - 1 and segments[count + 1].base_offset <= log_start_offset:
        count += 1
    return count
