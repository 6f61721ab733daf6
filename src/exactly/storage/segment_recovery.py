"""Reading a segment back from its log file: the batch-header scan, and what is built on it,
crash recovery and index rebuilds (Kafka's LogSegment.recover and the index sanity checks).

Why apart from ``segment``: this is the part of a segment that runs when a partition is opened
(or an index found corrupt), not on the append and read paths. :class:`SegmentRecovery` is the
base of :class:`~exactly.storage.segment.LogSegment`, which owns every attribute declared here;
the split is by responsibility only, the public API is ``LogSegment``'s.

Invariants kept (``segment``'s): ``size`` ends on a batch boundary after ``recover``; index
entries never point past it; recovery trusts the index files only for entries of offsets below
the recovery point (written and fsynced by the flush that set it: ``index``, deferred writes).
After a rebuild or recovery the time index ends with the segment's max timestamp, as after a roll.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from exactly.records.batch import HEADER_SIZE, MIN_BATCH_LENGTH, BatchHeader, compute_crc, iter_batches
from exactly.storage.index import OffsetIndex, TimeIndex

RECOVERY_CHUNK = 4 * 1024 * 1024  # recovery reads (CRC needs whole batches)
LOOKUP_CHUNK = 64 * 1024  # index-to-offset scans: a few batches past an index entry


class SegmentRecovery:
    """Scan, recovery and index rebuilds of a ``LogSegment`` (see the module docstring)."""

    # The slots of the attributes used here live on this class (a slotted subclass cannot share
    # them otherwise); LogSegment's constructor sets every one of them.
    __slots__ = (
        "_bytes_since_index",
        "_fd",
        "_max_timestamp",
        "_offset_of_max_timestamp",
        "base_offset",
        "index_interval_bytes",
        "next_offset",
        "offset_index",
        "size",
        "time_index",
        "unflushed",
    )
    base_offset: int
    index_interval_bytes: int
    offset_index: OffsetIndex
    time_index: TimeIndex
    size: int
    next_offset: int
    unflushed: bool
    _fd: int
    _bytes_since_index: int
    _max_timestamp: int | None
    _offset_of_max_timestamp: int

    def _truncate_file(self, position: int) -> None:
        raise NotImplementedError  # LogSegment's

    # --- scanning ---------------------------------------------------------------------------
    def scan(
        self, position: int = 0, *, verify_crc: bool = False, chunk: int = RECOVERY_CHUNK
    ) -> Iterator[tuple[int, BatchHeader]]:
        """(absolute position, header) of each whole, valid batch from ``position`` until the
        first invalid or incomplete one. Without ``verify_crc`` a batch larger than ``chunk``
        costs one 61-byte read, not a read of the batch."""
        end = self.size
        pos = position
        while pos + HEADER_SIZE <= end:
            buf = os.pread(self._fd, min(end - pos, max(chunk, HEADER_SIZE)), pos)
            if len(buf) < HEADER_SIZE:
                return
            consumed = 0
            for header in iter_batches(buf, 0, verify_crc=verify_crc):
                yield pos + header.position, header
                consumed = header.position + header.size
            if consumed == 0:
                # The first batch did not fit the chunk, or is invalid.
                header = BatchHeader.parse(buf, 0)
                if header.magic != 2 or header.batch_length < MIN_BATCH_LENGTH or pos + header.size > end:
                    return
                if header.size <= len(buf):
                    return  # it fitted, so iter_batches refused it: invalid
                if verify_crc:
                    whole = os.pread(self._fd, header.size, pos)
                    if len(whole) < header.size or compute_crc(whole, 0, header.size) != header.crc:
                        return
                yield pos, header
                consumed = header.size
            pos += consumed

    def rebuild_indexes(self) -> None:
        """Rebuild the offset and time indexes from the log (headers only, no truncation)."""
        self.offset_index.reset()
        self.time_index.reset()
        self._reset_scan_state()
        for pos, header in self.scan(0):
            self._index_during_scan(pos, header)
        self._write_rebuilt_entries()

    def _write_rebuilt_entries(self) -> None:
        """After a rebuild or recovery: record the max timestamp in the time index (as Kafka's
        LogSegment.recover, and as a roll does: a later open of the segment learns it from the
        time index alone), then write the entries (rare, and many) to the files at once,
        fsynced by the next flush."""
        if self._max_timestamp is not None and self._max_timestamp >= 0:
            self.time_index.maybe_append(self._max_timestamp, self._offset_of_max_timestamp)
        self.offset_index.write_pending()
        self.time_index.write_pending()
        self.unflushed = True

    def _reset_scan_state(self) -> None:
        self._bytes_since_index = 0
        self._max_timestamp = -1
        self._offset_of_max_timestamp = self.base_offset
        self.next_offset = self.base_offset

    def _index_during_scan(self, position: int, header: BatchHeader) -> None:
        if self._bytes_since_index > self.index_interval_bytes:
            self.offset_index.append(header.base_offset, position)
            max_timestamp = self._max_timestamp
            self.time_index.maybe_append(
                -1 if max_timestamp is None else max_timestamp, self._offset_of_max_timestamp
            )
            self._bytes_since_index = 0
        self._bytes_since_index += header.size
        self.next_offset = header.next_offset
        current = -1 if self._max_timestamp is None else self._max_timestamp
        if header.max_timestamp > current:
            self._max_timestamp = header.max_timestamp
            self._offset_of_max_timestamp = header.base_offset

    def recover(self, from_offset: int | None = None) -> int:
        """Validate (CRC32C) every batch at or after ``from_offset`` (the whole segment when
        None), cut the log at the first invalid or incomplete batch and rebuild the index
        entries for the validated part. Returns how many bytes were cut."""
        start = 0
        if from_offset is not None and from_offset > self.base_offset:
            start = self._position_for_recovery(from_offset)
        if start == 0:
            self.offset_index.reset()
            self.time_index.reset()
            self._reset_scan_state()
        valid_end = start
        for pos, header in self.scan(start, verify_crc=True):
            self._index_during_scan(pos, header)
            valid_end = pos + header.size
        cut = self.size - valid_end
        if cut:
            self._truncate_file(valid_end)
        self._write_rebuilt_entries()
        return cut

    def _position_for_recovery(self, offset: int) -> int:
        """Position of the first batch at or after ``offset`` (the recovery point), trusting
        the log and indexes before it (they were flushed). Leaves the scan state as if the part
        before had just been indexed. Returns 0 (recover everything) when the flushed part looks
        wrong.

        The entry it starts from is the last one *below* ``offset``: an entry at ``offset``
        itself was created after the flush that set the recovery point, so its time-index
        companion (the max timestamp before it) may be missing from the file while the offset
        entry is there, and resuming from it would underestimate the segment's max timestamp."""
        if not (self.offset_index.load(self.size) and self.time_index.load()):
            return 0
        entry_offset, position = self.offset_index.lookup(offset - 1)
        self.offset_index.truncate_to_position(position + 1)
        self.time_index.truncate_to_offset(entry_offset + 1)
        last = self.time_index.last_entry()
        self._max_timestamp, self._offset_of_max_timestamp = (
            last if last is not None else (-1, self.base_offset)
        )
        self.next_offset = entry_offset
        self._bytes_since_index = 0
        end = position
        for pos, header in self.scan(position, chunk=LOOKUP_CHUNK):
            if header.base_offset >= offset:
                return pos
            self._index_during_scan(pos, header)
            end = pos + header.size
        return end
