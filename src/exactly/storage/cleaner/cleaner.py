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
   swapped in crash-safely (``PartitionLog.replace_segments`` / ``swap``).

The pass returns the end offset, the caller's next first dirty offset (the cleaner checkpoint).

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

from exactly.records.batch import HEADER_SIZE, MIN_BATCH_LENGTH, BatchHeader, iter_batches
from exactly.storage.cleaner.batch_filter import (
    FilterContext,
    LastRecord,
    UncleanableBatchError,
    control_type_of,
    filter_batch,
    map_keys,
)
from exactly.storage.cleaner.cleanable import LogToClean, group_segments_by_size
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


def segment_batches(
    segment: LogSegment, position: int = 0, chunk: int = DEFAULT_IO_BUFFER_SIZE
) -> Iterator[tuple[bytes, BatchHeader]]:
    """(buffer, header) of each batch from ``position`` (``header.position`` is relative to the
    buffer), read ``chunk`` bytes at a time; a batch larger than the chunk is read alone.

    The file is read through a descriptor of its own, opened here: the cleaner runs on a thread
    of its own, and the log's owner may close the segment's descriptor meanwhile (retention, topic
    deletion), after which the number could even name another file. Raises FileNotFoundError when
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


def read_next_offset(segment: LogSegment) -> int:
    """One past the segment's last offset, from its last index entry on (a segment trusted at
    load time was never scanned, so its ``next_offset`` is not known)."""
    segment.ensure_indexes()
    entry_offset, position = segment.offset_index.last_entry()
    next_offset = max(entry_offset, segment.base_offset)
    for _buf, header in segment_batches(segment, position):
        next_offset = header.next_offset
    return next_offset


def collect_aborted(segments: Sequence[LogSegment], start: int, upper: int) -> list[AbortedTxnEntry]:
    """Aborted transactions overlapping [start, upper), with all their index fields."""
    found: list[AbortedTxnEntry] = []
    for segment in segments:
        for entry in segment.txn_index.entries:
            if entry.last_offset >= start and entry.first_offset < upper:
                found.append(entry)
    return found


def segments_between(segments: Sequence[LogSegment], start: int, end: int) -> list[LogSegment]:
    """Segments overlapping [start, end): from the one holding ``start`` to those based below ``end``."""
    out: list[LogSegment] = []
    for i, segment in enumerate(segments):
        next_base = segments[i + 1].base_offset if i + 1 < len(segments) else None
        if next_base is not None and next_base <= start:
            continue
        if segment.base_offset >= end:
            break
        out.append(segment)
    return out


SwapFn = Callable[[PartitionLog, LogSegment, Sequence[LogSegment]], None]
Throttle = Callable[[int], None]


class CleaningAbortedError(Exception):
    """The log changed under a pass (segments deleted or truncated): its work is dropped, the
    partition stays cleanable."""


class Cleaner:
    """Cleans one log at a time with its own offset map (one per cleaner thread).

    ``swap`` performs the last step, ``PartitionLog.replace_segments``; by default directly, and
    on the thread that owns the log when the cleaner runs on a thread of its own (``runner``).
    ``throttle(n)`` is called for every ``n`` bytes read or written
    (``log.cleaner.io.max.bytes.per.second``). ``hook`` (tests) is passed to every swap."""

    def __init__(
        self,
        offset_map: OffsetMap,
        *,
        io_buffer_size: int = DEFAULT_IO_BUFFER_SIZE,
        hook: SwapHook | None = None,
        swap: SwapFn | None = None,
        throttle: Throttle | None = None,
    ) -> None:
        self.offset_map = offset_map
        self.io_buffer_size = io_buffer_size
        self.hook = hook
        self.swap: SwapFn = swap or self._swap_directly
        self.throttle: Throttle = throttle or _no_throttle

    def _swap_directly(self, plog: PartitionLog, cleaned: LogSegment, group: Sequence[LogSegment]) -> None:
        plog.replace_segments(cleaned, group, self.hook)

    def clean(self, plog: PartitionLog, to_clean: LogToClean, now_ms: int) -> tuple[int, CleanerStats]:
        """One pass; returns the new first dirty offset and the pass's statistics."""
        stats = CleanerStats()
        upper = to_clean.first_uncleanable_offset
        self.build_offset_map(plog, to_clean.first_dirty_offset, upper, stats)
        end_offset = self.offset_map.latest_offset + 1
        config = plog.config
        producers = {
            pid: LastRecord(entry.last_data_offset, entry.producer_epoch)
            for pid, entry in plog.producer_state.active_producers().items()
        }
        ctx = FilterContext(self.offset_map, producers, upper, now_ms, config.delete_retention_ms)
        txn = CleanedTransactionMetadata()
        to_rewrite = [s for s in plog.segments[:-1] if s.base_offset < end_offset]
        for group in group_segments_by_size(
            to_rewrite, config.segment_bytes, config.segment_index_bytes, upper
        ):
            self.clean_segments(plog, group, ctx, txn, stats, now_ms)
        stats.map_utilization = self.offset_map.utilization
        stats.end_s = time.monotonic()
        return end_offset, stats

    # --- step 1: the offset map ---------------------------------------------------------------
    def build_offset_map(self, plog: PartitionLog, start: int, end: int, stats: CleanerStats) -> None:
        offset_map = self.offset_map
        offset_map.clear()
        segments = plog.segments
        dirty = segments_between(segments, start, end)
        txn = CleanedTransactionMetadata()
        txn.add_aborted_transactions(collect_aborted(segments, start, end))
        for i, segment in enumerate(dirty):
            next_start = dirty[i + 1].base_offset if i + 1 < len(dirty) else end
            if self._map_segment(segment, start, next_start, txn, stats):
                log.debug("%s: offset map full in the segment at %d", plog.tp, segment.base_offset)
                return

    def _map_segment(
        self,
        segment: LogSegment,
        start: int,
        next_start: int,
        txn: CleanedTransactionMetadata,
        stats: CleanerStats,
    ) -> bool:
        """Add one segment's keys at or after ``start``; True when the map filled up."""
        offset_map = self.offset_map
        segment.ensure_indexes()
        _o, position = segment.offset_index.lookup(start)
        for buf, header in segment_batches(segment, position, self.io_buffer_size):
            if header.base_offset >= next_start:
                break
            stats.map_bytes_read += header.size
            self.throttle(header.size)
            if header.is_control:
                txn.on_control_batch_read(header, control_type_of(buf, header))
            elif not txn.on_batch_read(header):
                for offset, key in map_keys(buf, header):
                    if key is not None and offset >= start:
                        if offset_map.is_full:
                            return True  # as Kafka: even a key already mapped ends the pass here
                        offset_map.put(key, offset)
                    stats.map_records_read += 1
            if header.last_offset >= start:
                offset_map.update_latest_offset(header.last_offset)
        offset_map.update_latest_offset(next_start - 1)
        return False

    # --- steps 2 and 3: rewrite a group and swap it in ---------------------------------------
    def clean_segments(
        self,
        plog: PartitionLog,
        group: Sequence[LogSegment],
        ctx: FilterContext,
        txn: CleanedTransactionMetadata,
        stats: CleanerStats,
        now_ms: int,
    ) -> None:
        config = plog.config
        cleaned = LogSegment.create(
            plog.directory,
            group[0].base_offset,
            index_interval_bytes=config.index_interval_bytes,
            index_max_bytes=config.segment_index_bytes,
            now_ms=now_ms,
            file_suffix=CLEANED_SUFFIX,
        )
        txn.on_retained_abort = cleaned.txn_index.append
        try:
            for i, segment in enumerate(group):
                upper = group[i + 1].base_offset if i + 1 < len(group) else read_next_offset(segment)
                txn.add_aborted_transactions(collect_aborted(plog.segments, segment.base_offset, upper))
                for buf, header in segment_batches(segment, 0, self.io_buffer_size):
                    stats.bytes_read += header.size
                    self.throttle(header.size)
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
            self.swap(plog, cleaned, group)
        except Exception:
            # An error before the commit: drop the uncommitted segment (recovery would too).
            # Anything else (the process ending) leaves the files to recovery at the next load.
            if cleaned.file_suffix == CLEANED_SUFFIX:
                cleaned.delete()
            raise
        finally:
            txn.on_retained_abort = None
        stats.segments_cleaned += len(group)
