"""One cleaning pass over a partition log (Kafka's Cleaner.doClean, buildOffsetMap,
cleanSegments and cleanInto).

Theory of operation
-------------------
1. *Offset map*: read the cleanable dirty section [first dirty, first uncleanable) and map each
   key to its newest offset. Aborted transactional data (from the transaction indexes) and control
   batches never enter the map, so an aborted write never shadows an older committed value. When
   the map is full the pass ends early, at the last offset it covers: the next pass continues from
   there (multi-pass cleaning with a small ``log.cleaner.dedupe.buffer.size``). After each fully
   read segment the map's latest offset jumps to that segment's end, covering offset gaps.
2. *Grouping*: every segment from the log start up to the end of the map (the clean prefix too,
   which is how old tombstones and markers eventually go) is grouped (``cleanable``) and each group
   is rewritten into one ``.cleaned`` segment by ``batch_filter``, which keeps offsets, order and
   each active producer's last batch. Aborted-transaction entries still needed are re-emitted into
   the new segment's transaction index; its offset and time indexes are built as it is written.
3. *Swap*: the new segment is flushed, given its last source segment's modification time, and
   swapped in crash-safely (``PartitionLog.replace_segments`` / ``swap``) by the log's owner.

Steps 1 and 2 (``run_pass``) work on a ``job.CleaningJob``, plain values the broker describes from
the log, and touch no ``PartitionLog``: in the broker they run in a worker process (``worker``),
which hands each ``.cleaned`` segment back for step 3 (``swap_in``). ``Cleaner`` runs all three in
the calling process (tests and tools). The pass returns the end offset, the caller's next first
dirty offset (the cleaner checkpoint).

Decoding: the offset map needs only each record's offset and key (``records.rebuild.record_keys``);
the recopy decodes the batches it rewrites (keys, values, timestamps, headers). Only
uncompressed and gzip batches can be read here, so a log holding another codec raises
``UncleanableBatchError`` and is left alone rather than cleaned wrongly.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from exactly.records.batch import HEADER_SIZE, MIN_BATCH_LENGTH, BatchHeader, iter_batches
from exactly.storage.cleaner.batch_filter import (
    TICK_RECORDS,
    FilterContext,
    Tick,
    UncleanableBatchError,
    control_type_of,
    filter_batch,
    map_keys,
    no_tick,
)
from exactly.storage.cleaner.cleanable import LogToClean, group_segments_by_size
from exactly.storage.cleaner.job import (
    CleanedSegment,
    CleaningJob,
    SegmentSource,
    describe_pass,
    open_cleaned,
    remove_cleaned_files,
    segments_replaced,
)
from exactly.storage.cleaner.offset_map import OffsetMap
from exactly.storage.cleaner.swap import CLEANED_SUFFIX, SwapHook
from exactly.storage.cleaner.txn_metadata import CleanedTransactionMetadata
from exactly.storage.partition_log import PartitionLog
from exactly.storage.segment import LogSegment
from exactly.storage.txn_index import AbortedTxnEntry

log = logging.getLogger(__name__)

DEFAULT_IO_BUFFER_SIZE = 512 * 1024


def _no_throttle(_nbytes: int) -> None:
    return None


@dataclass(slots=True)
class CleanerStats:
    """What one pass did (Kafka's CleanerStats); mutable: the pass accumulates into it."""

    map_records_read: int = 0
    map_bytes_read: int = 0
    records_read: int = 0
    bytes_read: int = 0
    records_written: int = 0
    bytes_written: int = 0
    batches_rebuilt: int = 0
    segments_cleaned: int = 0
    map_utilization: float = 0.0
    start_s: float = field(default_factory=time.monotonic)
    end_s: float = 0.0

    @property
    def elapsed_s(self) -> float:
        return max(self.end_s - self.start_s, 0.0)


class ReadableSegment(Protocol):
    """What reading a segment's batches needs (a ``LogSegment`` or a ``job.SegmentSource``)."""

    @property
    def log_path(self) -> Path: ...
    @property
    def size(self) -> int: ...


def segment_batches(
    segment: ReadableSegment, position: int = 0, chunk: int = DEFAULT_IO_BUFFER_SIZE
) -> Iterator[tuple[bytes, BatchHeader]]:
    """(buffer, header) of each batch from ``position`` (``header.position`` is relative to the
    buffer), read ``chunk`` bytes at a time; a batch larger than the chunk is read alone.

    The file is read through a descriptor of its own, opened here: the cleaner runs in a process
    of its own, and the log's owner may delete the segment meanwhile (retention, topic deletion). Raises FileNotFoundError when
    the segment is already gone, UncleanableBatchError at bytes that are not a whole batch (the log
    was recovered, so that means corruption)."""
    fd = os.open(segment.log_path, os.O_RDONLY)
    try:
        end = min(segment.size, os.fstat(fd).st_size)
        pos = position
        while pos < end:
            buf = os.pread(fd, min(chunk, end - pos), pos)
            consumed = 0
            for header in iter_batches(buf):
                yield buf, header
                consumed = header.position + header.size
            if consumed == 0:
                big = BatchHeader.parse(buf) if len(buf) >= HEADER_SIZE else None
                if (
                    big is None
                    or big.magic != 2
                    or big.batch_length < MIN_BATCH_LENGTH
                    or pos + big.size > end
                ):
                    raise UncleanableBatchError(f"{segment}: no valid batch at position {pos}")
                yield os.pread(fd, big.size, pos), big
                consumed = big.size
            pos += consumed
    finally:
        os.close(fd)


def collect_aborted(aborted: Sequence[AbortedTxnEntry], start: int, upper: int) -> list[AbortedTxnEntry]:
    """Aborted transactions overlapping [start, upper), with all their index fields."""
    return [e for e in aborted if e.last_offset >= start and e.first_offset < upper]


def segments_between(segments: Sequence[SegmentSource], start: int, end: int) -> list[SegmentSource]:
    """Segments overlapping [start, end): from the one holding ``start`` to those based below ``end``."""
    out: list[SegmentSource] = []
    for i, segment in enumerate(segments):
        next_base = segments[i + 1].base_offset if i + 1 < len(segments) else None
        if next_base is not None and next_base <= start:
            continue
        if segment.base_offset >= end:
            break
        out.append(segment)
    return out


Throttle = Callable[[int], None]
OnCleaned = Callable[[CleanedSegment], None]


class CleaningAbortedError(Exception):
    """The log changed under a pass (segments deleted or truncated): its work is dropped, the
    partition stays cleanable."""


def run_pass(
    job: CleaningJob,
    offset_map: OffsetMap,
    on_cleaned: OnCleaned,
    *,
    io_buffer_size: int = DEFAULT_IO_BUFFER_SIZE,
    throttle: Throttle = _no_throttle,
    tick: Tick = no_tick,
) -> tuple[int, CleanerStats]:
    """One pass over the job's segments, touching no ``PartitionLog``: build the offset map,
    group, write each group as a flushed ``.cleaned`` segment and hand it to ``on_cleaned``
    (which swaps it in, at once or later) before the next group. Returns the new first dirty
    offset and the statistics. Runs in a worker process (``worker``) or in the caller's.

    ``throttle(nbytes)`` is called for each batch read, ``tick()`` every ``TICK_RECORDS``
    records decoded or mapped (``batch_filter.Tick``: where the worker's CPU duty cycle sleeps)."""
    stats = CleanerStats()
    upper = job.first_uncleanable_offset
    build_offset_map(job, offset_map, stats, io_buffer_size=io_buffer_size, throttle=throttle, tick=tick)
    end_offset = offset_map.latest_offset + 1
    ctx = FilterContext(
        offset_map, job.active_producers, upper, job.now_ms, job.delete_retention_ms, tick, job.replica_floor
    )
    txn = CleanedTransactionMetadata()
    to_rewrite = [s for s in job.segments if s.base_offset < end_offset]
    for group in group_segments_by_size(to_rewrite, job.segment_bytes, job.segment_index_bytes, upper):
        on_cleaned(
            clean_segments(job, group, ctx, txn, stats, io_buffer_size=io_buffer_size, throttle=throttle)
        )
        stats.segments_cleaned += len(group)
    stats.map_utilization = offset_map.utilization
    stats.end_s = time.monotonic()
    return end_offset, stats


# --- step 1: the offset map -------------------------------------------------------------------
def build_offset_map(
    job: CleaningJob,
    offset_map: OffsetMap,
    stats: CleanerStats,
    *,
    io_buffer_size: int = DEFAULT_IO_BUFFER_SIZE,
    throttle: Throttle = _no_throttle,
    tick: Tick = no_tick,
) -> None:
    offset_map.clear(tick)
    start, end = job.first_dirty_offset, job.first_uncleanable_offset
    dirty = segments_between(job.segments, start, end)
    txn = CleanedTransactionMetadata()
    txn.add_aborted_transactions(collect_aborted(job.aborted, start, end))
    for i, segment in enumerate(dirty):
        next_start = dirty[i + 1].base_offset if i + 1 < len(dirty) else end
        if _map_segment(offset_map, segment, start, next_start, txn, stats, io_buffer_size, throttle, tick):
            log.debug("%s: offset map full in the segment at %d", job.tp, segment.base_offset)
            return


def _map_segment(
    offset_map: OffsetMap,
    segment: SegmentSource,
    start: int,
    next_start: int,
    txn: CleanedTransactionMetadata,
    stats: CleanerStats,
    io_buffer_size: int,
    throttle: Throttle,
    tick: Tick = no_tick,
) -> bool:
    """Add one segment's keys at or after ``start``; True when the map filled up."""
    position = segment.dirty_position if start > segment.base_offset else 0
    for buf, header in segment_batches(segment, position, io_buffer_size):
        if header.base_offset >= next_start:
            break
        stats.map_bytes_read += header.size
        throttle(header.size)
        if header.is_control:
            txn.on_control_batch_read(header, control_type_of(buf, header))
        elif not txn.on_batch_read(header):
            for i, (offset, key) in enumerate(map_keys(buf, header, tick), 1):
                if key is not None and offset >= start:
                    if offset_map.is_full:
                        return True  # as Kafka: even a key already mapped ends the pass here
                    offset_map.put(key, offset)
                stats.map_records_read += 1
                if i % TICK_RECORDS == 0:
                    tick()
        if header.last_offset >= start:
            offset_map.update_latest_offset(header.last_offset)
    offset_map.update_latest_offset(next_start - 1)
    return False


# --- steps 2 and 3: rewrite a group ------------------------------------------------------------
def clean_segments(
    job: CleaningJob,
    group: Sequence[SegmentSource],
    ctx: FilterContext,
    txn: CleanedTransactionMetadata,
    stats: CleanerStats,
    *,
    io_buffer_size: int = DEFAULT_IO_BUFFER_SIZE,
    throttle: Throttle = _no_throttle,
) -> CleanedSegment:
    """Write ``group`` into one flushed ``.cleaned`` segment (closed again: the swap reopens it),
    with the mtime of the group's last segment. On an error the files are removed."""
    cleaned = LogSegment.create(
        job.directory,
        group[0].base_offset,
        index_interval_bytes=job.index_interval_bytes,
        index_max_bytes=job.segment_index_bytes,
        now_ms=job.now_ms,
        file_suffix=CLEANED_SUFFIX,
    )
    txn.on_retained_abort = cleaned.txn_index.append
    try:
        for i, segment in enumerate(group):
            upper = group[i + 1].base_offset if i + 1 < len(group) else segment.next_offset
            txn.add_aborted_transactions(collect_aborted(job.aborted, segment.base_offset, upper))
            for buf, header in segment_batches(segment, 0, io_buffer_size):
                stats.bytes_read += header.size
                throttle(header.size)
                result = filter_batch(buf, header, ctx, txn)
                stats.records_read += result.records_read
                if result.data is None:
                    continue
                written = BatchHeader.parse(result.data)
                cleaned.append(result.data, written)
                stats.records_written += result.records_kept
                stats.bytes_written += written.size
                stats.batches_rebuilt += int(result.rebuilt)
        cleaned.on_become_inactive()
        cleaned.unflushed = True
        cleaned.flush()
        cleaned.set_last_modified(group[-1].last_modified_ns)
        cleaned.close()
    except BaseException:
        cleaned.delete()
        raise
    finally:
        txn.on_retained_abort = None
    return CleanedSegment(group[0].base_offset, tuple(s.base_offset for s in group))


def open_cleaned_segments(job: CleaningJob, cleaned: Sequence[CleanedSegment]) -> list[LogSegment]:
    """The cleaned segments opened (``open_cleaned``: their indexes loaded), in ``cleaned``'s
    order. All or none: on a failure those already opened are closed again (no descriptor is
    left behind) and CleaningAbortedError is raised; the files are the caller's to remove. The
    one opening path of a swap, whether the owner opens them (``swap_in_groups``) or the broker's
    cleaner thread does beforehand (``runner``)."""
    segments: list[LogSegment] = []
    try:
        for c in cleaned:
            segments.append(open_cleaned(job, c))
    except (ValueError, OSError) as exc:
        for segment in segments:
            segment.close()
        raise CleaningAbortedError(f"{job.tp}: a cleaned segment could not be opened: {exc}") from None
    return segments


def swap_in(
    plog: PartitionLog, job: CleaningJob, cleaned: CleanedSegment, hook: SwapHook | None = None
) -> None:
    """The broker's step: swap a cleaned segment in for the segments it replaces, only if they are
    still the log's as the job read them (else CleaningAbortedError, the files removed)."""
    swap_in_groups(plog, job, [cleaned], hook)


def swap_in_groups(
    plog: PartitionLog,
    job: CleaningJob,
    cleaned: Sequence[CleanedSegment],
    hook: SwapHook | None = None,
    *,
    opened: Sequence[LogSegment] | None = None,
    finish: bool = True,
) -> list[tuple[LogSegment, list[LogSegment]]]:
    """``swap_in`` for consecutive cleaned segments of one pass at once (one directory fsync per
    swap step for all of them): all or none, each checked as ``swap_in`` checks it.

    ``opened``: the cleaned segments already opened (``open_cleaned``, in ``cleaned``'s order) by
    the caller off the owner's thread, so the owner does not read their indexes. Without
    ``finish`` the swap's last directory fsync and the removal of the replaced files are left to
    the caller (``swap.finish_segment_groups`` on the groups returned)."""
    bases = [c.base_offset for c in cleaned]
    if plog.closed:
        for segment in opened or ():
            segment.close()
        remove_cleaned_files(job.directory, bases)
        raise CleaningAbortedError(f"{plog.tp} was closed during cleaning")
    try:
        olds = [segments_replaced(plog, job, c) for c in cleaned]
        segments = list(opened) if opened is not None else open_cleaned_segments(job, cleaned)
    except (ValueError, OSError, CleaningAbortedError) as exc:
        for segment in opened or ():  # those opened here are closed by open_cleaned_segments
            segment.close()
        remove_cleaned_files(job.directory, bases)
        raise CleaningAbortedError(f"{plog.tp} changed during cleaning: {exc}") from None
    groups = list(zip(segments, olds, strict=True))
    try:
        plog.replace_segment_groups(groups, hook, finish=finish)
    except ValueError as exc:
        for segment in segments:
            segment.delete()
        raise CleaningAbortedError(f"{plog.tp} changed during cleaning: {exc}") from None
    return groups


class Cleaner:
    """Cleans one log at a time in the calling process, with its own offset map; the cleaned
    groups are swapped in together once the pass has written them all, as the broker's runner
    does (tests, tools; the broker runs ``run_pass`` in worker processes instead, see
    ``runner``). ``hook`` (tests) is passed to the swap."""

    def __init__(
        self,
        offset_map: OffsetMap,
        *,
        io_buffer_size: int = DEFAULT_IO_BUFFER_SIZE,
        hook: SwapHook | None = None,
        throttle: Throttle | None = None,
    ) -> None:
        self.offset_map = offset_map
        self.io_buffer_size = io_buffer_size
        self.hook = hook
        self.throttle: Throttle = throttle or _no_throttle

    def clean(
        self, plog: PartitionLog, to_clean: LogToClean, now_ms: int, *, replica_floor: int | None = None
    ) -> tuple[int, CleanerStats]:
        """One pass; returns the new first dirty offset and the pass's statistics."""
        job = describe_pass(plog, to_clean, now_ms, replica_floor=replica_floor)
        written: list[CleanedSegment] = []
        try:
            result = run_pass(
                job,
                self.offset_map,
                written.append,
                io_buffer_size=self.io_buffer_size,
                throttle=self.throttle,
            )
        except Exception:
            remove_cleaned_files(job.directory, [c.base_offset for c in written])
            raise
        if written:
            swap_in_groups(plog, job, written, self.hook)
        return result
