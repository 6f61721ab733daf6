"""What one cleaning pass is given and what it gives back, as plain picklable values, so the pass
can run in a worker process of its own (``worker``) while the broker keeps the log.

Why plain values: a pass reads and rewrites whole segments and decodes every record; in the
broker's process that work holds CPython's GIL and the event loop waits behind it (the produce
p99 at 1,000 msg/s rose thirtyfold while a cleaner *thread* ran). A worker process has its own
GIL, so the broker only (1) describes the pass from its live state (``describe_pass``: the
cleanable range chosen under the manager's lock, the non-active segments' paths and sizes, the
aborted transactions of their indexes, the active producers' last batches, the log's configs),
(2) waits on a pipe, and (3) swaps in each ``.cleaned`` segment the worker wrote
(``open_cleaned`` + ``PartitionLog.replace_segments``), a few renames and fsyncs.

Invariants of a ``CleaningJob``: ``segments`` are the log's non-active segments when the pass was
described, in offset order; the worker only reads them (through descriptors of its own) and
writes ``<base>.*.cleaned`` files in ``directory`` for bases among theirs; the broker swaps a
cleaned segment in only if the segments it replaces are still, unchanged, the log's.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from exactly.records.batch import HEADER_SIZE, BatchHeader, iter_batches
from exactly.storage.cleaner.batch_filter import LastRecord
from exactly.storage.cleaner.cleanable import LogToClean
from exactly.storage.cleaner.swap import CLEANED_SUFFIX
from exactly.storage.index import OFFSET_ENTRY, TIME_ENTRY
from exactly.storage.partition_log import PartitionLog
from exactly.storage.segment import LogSegment
from exactly.storage.txn_index import AbortedTxnEntry


@dataclass(frozen=True, slots=True)
class SegmentSource:
    """A non-active segment as the pass reads it: where, how many bytes (the size when described:
    only the broker's truncation could change it, and then the swap is refused), an exclusive
    upper bound of its offsets (``next_offset``: the next segment's base offset, or one past its
    last offset), the bytes its indexes hold (for grouping) and its mtime."""

    base_offset: int
    log_path: Path
    size: int
    next_offset: int
    offset_index_bytes: int
    time_index_bytes: int
    last_modified_ns: int
    #: Position of the batch holding the first dirty offset (0 below the dirty section).
    dirty_position: int = 0


@dataclass(frozen=True, slots=True)
class CleaningJob:
    """Everything one pass needs, fixed when the broker describes it."""

    tp: str
    directory: Path
    segments: tuple[SegmentSource, ...]
    #: Every aborted transaction of the log's transaction indexes, the active segment's too (a
    #: transaction aborted there may have data in the segments cleaned).
    aborted: tuple[AbortedTxnEntry, ...]
    first_dirty_offset: int
    first_uncleanable_offset: int
    active_producers: Mapping[int, LastRecord]
    now_ms: int
    delete_retention_ms: int
    segment_bytes: int
    segment_index_bytes: int
    index_interval_bytes: int
    #: ``batch_filter.FilterContext.replica_floor``: None on a single broker.
    replica_floor: int | None = None


@dataclass(frozen=True, slots=True)
class CleanedSegment:
    """A flushed ``<base>.log.cleaned`` (and its indexes) that replaces the segments based at
    ``replaces`` (consecutive, ``replaces[0] == base_offset``)."""

    base_offset: int
    replaces: tuple[int, ...]


def read_next_offset(segment: LogSegment) -> int:
    """One past the segment's last offset, from its last index entry on (a segment trusted at
    load time was never scanned, so its ``next_offset`` is not known). Reads at most one index
    interval of the file, through a descriptor of its own."""
    segment.ensure_indexes()
    entry_offset, position = segment.offset_index.last_entry()
    next_offset = max(entry_offset, segment.base_offset, segment.next_offset)
    fd = os.open(segment.log_path, os.O_RDONLY)
    try:
        end = min(segment.size, os.fstat(fd).st_size)
        pos = position
        while pos < end:
            buf = os.pread(fd, max(min(end - pos, 1 << 20), HEADER_SIZE), pos)
            consumed = 0
            for header in iter_batches(buf):
                next_offset = header.next_offset
                consumed = header.position + header.size
            if consumed == 0:  # a batch larger than the read: its header is enough
                if len(buf) < HEADER_SIZE:
                    break
                big = BatchHeader.parse(buf)
                next_offset = big.next_offset
                consumed = big.size
            pos += consumed
    finally:
        os.close(fd)
    return next_offset


def source_of(
    segment: LogSegment, first_dirty_offset: int = -1, next_base: int | None = None
) -> SegmentSource:
    """Describe one loaded, non-active segment (on the broker: its indexes are in memory).

    ``next_base``, the base offset of the segment after it, is its offsets' upper bound: no
    offset lies between a segment's last one and the next segment's base, so the transactions
    that overlap it are the same. With it, describing a pass reads no segment file on the event
    loop (``read_next_offset`` opens the file and scans its tail: for a pass over 75 segments, a
    10 ms stall of the loop); without it (tests, tools), the file is read."""
    segment.ensure_indexes()
    position = 0
    if first_dirty_offset > segment.base_offset:
        position = segment.offset_index.lookup(first_dirty_offset)[1]
    return SegmentSource(
        base_offset=segment.base_offset,
        log_path=segment.log_path,
        size=segment.size,
        next_offset=read_next_offset(segment) if next_base is None else next_base,
        offset_index_bytes=len(segment.offset_index) * OFFSET_ENTRY.size,
        time_index_bytes=len(segment.time_index) * TIME_ENTRY.size,
        last_modified_ns=segment.last_modified_ns,
        dirty_position=position,
    )


def describe_pass(
    plog: PartitionLog, to_clean: LogToClean, now_ms: int, *, replica_floor: int | None = None
) -> CleaningJob:
    """The pass over ``plog``'s cleanable range as plain values (broker side); ``replica_floor``
    gates the removal of tombstones, markers and producers' batches (``batch_filter``)."""
    config = plog.config
    producers = {
        pid: LastRecord(entry.last_data_offset, entry.producer_epoch)
        for pid, entry in plog.producer_state.active_producers().items()
    }
    return CleaningJob(
        tp=str(plog.tp),
        directory=plog.directory,
        segments=tuple(
            source_of(s, to_clean.first_dirty_offset, following.base_offset)
            for s, following in itertools.pairwise(plog.segments)
        ),
        aborted=tuple(e for s in plog.segments for e in s.txn_index.entries),
        first_dirty_offset=to_clean.first_dirty_offset,
        first_uncleanable_offset=to_clean.first_uncleanable_offset,
        active_producers=producers,
        now_ms=now_ms,
        delete_retention_ms=config.delete_retention_ms,
        segment_bytes=config.segment_bytes,
        segment_index_bytes=config.segment_index_bytes,
        index_interval_bytes=config.index_interval_bytes,
        replica_floor=replica_floor,
    )


def open_cleaned(job: CleaningJob, cleaned: CleanedSegment) -> LogSegment:
    """Open a segment the worker wrote (its indexes loaded) for the swap."""
    segment = LogSegment.open(
        job.directory,
        cleaned.base_offset,
        index_interval_bytes=job.index_interval_bytes,
        index_max_bytes=job.segment_index_bytes,
        now_ms=job.now_ms,
        file_suffix=CLEANED_SUFFIX,
    )
    segment.ensure_indexes()
    segment.txn_index.load()
    return segment


def segments_replaced(plog: PartitionLog, job: CleaningJob, cleaned: CleanedSegment) -> list[LogSegment]:
    """The log's segments a cleaned segment replaces, checked to be the ones the job read
    (same bases, same sizes). Raises ValueError when the log changed meanwhile."""
    by_base = {s.base_offset: s for s in plog.segments[:-1]}
    sources = {s.base_offset: s for s in job.segments}
    out: list[LogSegment] = []
    for base in cleaned.replaces:
        segment = by_base.get(base)
        if segment is None or segment.size != sources[base].size:
            raise ValueError(f"the segment at {base} is gone or changed")
        out.append(segment)
    return out


def remove_cleaned_files(directory: Path, bases: Sequence[int]) -> None:
    """Drop ``.cleaned`` files a pass left behind (a worker that died, a dropped pass)."""
    wanted = {f"{base:020d}" for base in bases}
    for path in directory.glob(f"*{CLEANED_SUFFIX}"):
        if path.name[:20] in wanted:
            path.unlink(missing_ok=True)
