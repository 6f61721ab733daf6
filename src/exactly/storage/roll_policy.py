"""When the active segment rolls (Kafka's LocalLog.shouldRoll and LogSegment.timeWaitedForRoll),
as pure functions, as ``retention`` is for deleting segments.

Why apart from ``partition_log``: the decision reads only the active segment, the next batch's
header and the topic config; the log then does the roll (new segment, producer snapshot).
Invariant: an empty active segment never rolls, so a roll always leaves data behind it.
"""

from __future__ import annotations

from exactly.records.batch import BatchHeader
from exactly.storage.config import LogConfig
from exactly.storage.segment import LogSegment

MAX_RELATIVE_OFFSET = 2**31 - 1  # Kafka keeps relative offsets within an Int32


def rolls_before_append(active: LogSegment, header: BatchHeader, config: LogConfig, now_ms: int) -> bool:
    """Roll before writing ``header``'s batch when the active segment would overflow
    segment.bytes, is older than segment.ms, has a full index, or could not express the
    batch's offsets relative to its base."""
    return rolls_before_write(active, header.size, header.last_offset, header.max_timestamp, config, now_ms)


def rolls_before_write(
    active: LogSegment, size: int, last_offset: int, max_timestamp: int, config: LogConfig, now_ms: int
) -> bool:
    """``rolls_before_append`` from the batch's size, last offset and max timestamp as plain
    numbers: the Produce fast path (``PartitionLog.append_plain``) has them unpacked, and this
    runs once per Produce request, so it takes no call rather than nine (``is_empty``,
    ``waited_for_roll`` and the header properties inlined, the first batch's timestamp and the
    indexes' ``is_full`` read as plain numbers; ``test_roll_policy`` checks it against them)."""
    position = active.size
    if not position:  # an empty segment never rolls
        return False
    if position + size > config.segment_bytes:
        return True
    first = active.known_first_batch_timestamp  # the property's number without its call
    if first is None:
        first = active.first_batch_timestamp
    if first >= 0 and max_timestamp >= 0:  # waited_for_roll
        waited = max_timestamp - first
    else:
        waited = now_ms - active.created_ms
    return (
        waited > config.segment_ms
        or active.offset_index.is_full
        or active.time_index.is_full
        or last_offset - active.base_offset > MAX_RELATIVE_OFFSET
    )


def rolls_when_idle(active: LogSegment, config: LogConfig, now_ms: int) -> bool:
    """Roll by age (segment.ms) an active segment nothing is appended to: age by the wall
    clock since the segment was created or opened, or since its first batch's timestamp,
    whichever is more recent (skewed client clocks must not cause a roll per call)."""
    if active.is_empty:
        return False
    since = max(active.created_ms, active.first_batch_timestamp)
    return now_ms - since > config.segment_ms


def waited_for_roll(active: LogSegment, batch_timestamp: int, now_ms: int) -> int:
    """Kafka's LogSegment.timeWaitedForRoll: the new batch's timestamp minus the first
    batch's (so replaying old data does not roll at every batch), or wall-clock time since
    the segment was created when batches carry no timestamps."""
    first = active.first_batch_timestamp
    if first >= 0 and batch_timestamp >= 0:
        return batch_timestamp - first
    return now_ms - active.created_ms
