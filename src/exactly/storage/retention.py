"""Which segments retention deletes (Kafka's UnifiedLog.deleteOldSegments), as a pure function.

Retention removes whole segments from the start of the log, never the active one (the log always
keeps a segment to append to and its end offset). Two independent limits, either of which may be
off (-1):

* retention.ms: a segment goes once its largest timestamp is older than ``now - retention.ms``;
  the scan stops at the first segment that is young enough, so the log stays contiguous even when
  timestamps are not monotonic.
* retention.bytes: the oldest segments go while the log stays at or above the limit without them.

Only topics whose cleanup.policy contains ``delete`` are subject to retention.
"""

from __future__ import annotations

from collections.abc import Sequence

from exactly.storage.config import LogConfig
from exactly.storage.segment import LogSegment


def deletable_segments(segments: Sequence[LogSegment], config: LogConfig, now_ms: int) -> int:
    """How many segments, counted from the oldest, retention may delete now."""
    if "delete" not in config.cleanup_policy:
        return 0
    candidates = len(segments) - 1  # never the active segment
    deletable = 0
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
