"""The read side of a partition's log (Kafka's LocalLog.read and the transaction-index lookup of
UnifiedLog), as pure functions over the log's segments, and the types reads answer with.

Why apart from ``partition_log``: reading never changes the log, so it needs only the segments
(oldest first) and their base offsets, never the offsets the log owns; ``PartitionLog.read``
decides the bounds (log start, high watermark, LSO, log end) and calls in here.

*Read* finds the segment by base offset, the batch containing the fetch offset via the sparse
index, and returns whole batches with one ``pread`` up to the bound and ``max_bytes``, or at least
one batch. Data comes from one segment per call, as in Kafka. With ``slice_from`` a read of at least
that many bytes comes back as a ``FileSlice`` of the segment file instead of a copy (the
connection sends it with ``os.sendfile``); when ``max_bytes`` cuts the range and the first batch
is itself at least ``slice_from`` bytes, the cut is found from batch headers, so a reader that is
more than ``max_bytes`` behind (a follower while the producer streams 1 MB batches) is answered
with a slice too, not with a ``max_bytes`` read and a second copy of the whole batches in it.

Invariant of the arguments: ``bases[i] == segments[i].base_offset``, ascending, and ``log_end``
is the last segment's next offset.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

from exactly.frozen import quick_init
from exactly.records.batch import BatchHeader, iter_batches
from exactly.storage.file_slice import FileSlice
from exactly.storage.segment import LogSegment
from exactly.storage.txn_index import AbortedTxnEntry


class OffsetOutOfRangeError(Exception):
    """Fetch/ListOffsets outside [log_start_offset, log_end_offset]; DeleteRecords beyond the
    high watermark."""


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    producer_id: int
    first_offset: int


@quick_init
@dataclass(frozen=True, slots=True)
class ReadResult:
    records: bytes | FileSlice  # whole batches, possibly empty; a FileSlice only when asked for
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    aborted_transactions: tuple[AbortedTxn, ...] | None  # only for read_committed


def read_batches(
    segments: Sequence[LogSegment],
    bases: Sequence[int],
    log_end: int,
    fetch_offset: int,
    bound: int,
    max_bytes: int,
    min_one: bool,
    slice_from: int | None = None,
) -> tuple[bytes | FileSlice, int]:
    """(whole batches from the one containing ``fetch_offset``, below ``bound`` and within
    ``max_bytes`` unless ``min_one`` lets a single larger batch through; the offset after the
    returned data). Empty bytes and ``fetch_offset`` when nothing may be returned. A range of at
    least ``slice_from`` bytes (None: never) that ends on a batch boundary is a ``FileSlice``."""
    i = bisect_right(bases, fetch_offset) - 1
    while fetch_offset < bound and i < len(segments):
        segment = segments[i]
        segment_end = bases[i + 1] if i + 1 < len(bases) else log_end
        found = segment.find_batch(fetch_offset)
        if found is None:  # an offset gap at the end of this segment
            i += 1
            continue
        position, first = found
        if first.last_offset >= bound:
            break
        if bound >= segment_end:
            end_position, upper = segment.size, segment_end
        else:
            limit = segment.find_batch(bound)
            end_position, upper = (limit[0], limit[1].base_offset) if limit else (segment.size, segment_end)
        available = end_position - position
        if available <= max_bytes:
            return _take(segment, position, available, slice_from), upper
        if first.size > max_bytes:
            if min_one:
                return _take(segment, position, first.size, slice_from), first.next_offset
            break
        if slice_from is not None and first.size >= slice_from:
            # Large batches (a follower or consumer behind by more than max_bytes): find the
            # cut from the batch headers and answer with a slice, not a copy of max_bytes
            size, upper = _whole_batches_within(segment, position, first, end_position, max_bytes)
            return _take(segment, position, size, slice_from), upper
        # Several batches, not all of which fit: cut after the last whole one.
        data = segment.read(position, max_bytes)
        cut = 0
        for header in iter_batches(data):
            cut = header.position + header.size
            upper = header.next_offset
        return (data if cut == len(data) else data[:cut]), upper
    return b"", fetch_offset


HEADER_WALK = 64  # batch headers looked at for one cut, at most (each >= slice_from bytes at first)


def _whole_batches_within(
    segment: LogSegment, position: int, first: BatchHeader, end_position: int, max_bytes: int
) -> tuple[int, int]:
    """(bytes, next offset) of the run of whole batches from ``first`` (at file ``position``)
    that ends at or before ``end_position`` and fits ``max_bytes`` (``first`` alone always counts),
    found from headers only: ``find_batch`` answers batches near the log end from the segment's
    recent-batch memory and others with an index lookup and one header read. At most
    HEADER_WALK batches, so a run of small batches behind a large one costs a bounded number of
    header reads; the answer then holds fewer bytes than max_bytes, which a Fetch allows."""
    size, upper = first.size, first.next_offset
    for _ in range(HEADER_WALK):
        found = segment.find_batch(upper)
        if found is None:
            break
        pos, header = found
        if pos != position + size or pos + header.size > end_position or size + header.size > max_bytes:
            break
        size, upper = size + header.size, header.next_offset
    return size, upper


def _take(segment: LogSegment, position: int, size: int, slice_from: int | None) -> bytes | FileSlice:
    if slice_from is not None and size >= slice_from:
        return segment.slice(position, size)
    return segment.read(position, size)


def collect_aborted_transactions(
    segments: Sequence[LogSegment], bases: Sequence[int], fetch_offset: int, upper_bound: int
) -> tuple[AbortedTxn, ...]:
    """Aborted transactions overlapping [fetch_offset, upper_bound), from the transaction
    indexes of the segment holding ``fetch_offset`` and the ones after it."""
    found: list[AbortedTxnEntry] = []
    start = max(bisect_right(bases, fetch_offset) - 1, 0)
    for segment in segments[start:]:
        if segment.txn_index.collect(fetch_offset, upper_bound, found):
            break
    return tuple(AbortedTxn(e.producer_id, e.first_offset) for e in found)


def offset_for_timestamp(
    segments: Sequence[LogSegment], log_start_offset: int, timestamp: int
) -> tuple[int, int] | None:
    """(offset, timestamp) of the first record batch with max timestamp >= timestamp: its base
    offset (at least the log start) and its max timestamp. Batch granularity: records are not
    decoded. Not bounded by the high watermark; the caller filters."""
    for segment in segments:
        if segment.max_timestamp >= timestamp:
            header = segment.find_by_timestamp(timestamp, log_start_offset)
            if header is not None:
                return max(header.base_offset, log_start_offset), header.max_timestamp
    return None
