"""One log segment: ``<base_offset:020d>.log`` plus its offset, time and transaction indexes
(Kafka's LogSegment).

Theory of operation
-------------------
A segment is an append-only file of whole v2 record batches whose offsets start at
``base_offset``. Writes go through one descriptor with ``os.pwrite`` at the current size and land
in the page cache; nothing is fsynced until ``flush``. A bulk append first reserves blocks past
the end (``file_write.BlockReserve``: cheaper page-cache writes, the file size unchanged); roll,
close and truncation free them.
Every ``index.interval.bytes`` of appended data the segment adds an offset-index entry (base
offset of the batch, its position) and offers the largest timestamp seen so far to the time
index; the entries reach the index files at flush, roll and close (``index``: deferred writes). Finding an offset is an index lookup plus a scan of batch *headers* (61 bytes each, via
``BatchHeader.parse``); records are never decoded.

Reads are ``os.pread`` of a byte range, so a fetch costs one system call and one copy into a
``bytes`` that goes straight to the socket.

Recovery (``recover``, with the header scan in ``segment_recovery``) re-reads the batches at or after a given offset with their CRC32C, cuts the
file at the first invalid or incomplete batch, and rebuilds the index entries for what it read.
It trusts the index files only for entries of offsets below the recovery point: those were
written and fsynced by the flush that set it, while later ones may be missing (entries are
written at flush, not when created) or, after a power loss, lost with the page cache.

Invariants
----------
* ``size`` is the file length and always ends on a batch boundary (after ``recover`` or
  ``truncate_to``); appends keep it so.
* ``next_offset`` is one past the last offset of the last batch (``base_offset`` when empty).
* ``max_timestamp`` is the largest batch max timestamp in the segment (-1 when unknown/none) and
  ``offset_of_max_timestamp`` the base offset of the first batch that has it.
* Index entries never point past ``size``.
"""

from __future__ import annotations

import os
from pathlib import Path

from exactly.records.batch import HEADER_SIZE, MIN_BATCH_LENGTH, BatchHeader
from exactly.storage.file_slice import FileSlice
from exactly.storage.file_write import PREALLOCATE_MIN_WRITE, BlockReserve, write_whole
from exactly.storage.index import OFFSET_ENTRY, TIME_ENTRY, OffsetIndex, TimeIndex
from exactly.storage.recent_batches import RecentBatches
from exactly.storage.segment_recovery import LOOKUP_CHUNK, RECOVERY_CHUNK, SegmentRecovery
from exactly.storage.txn_index import TransactionIndex

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
TXN_INDEX_SUFFIX = ".txnindex"
ALL_SUFFIXES = (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX)

__all__ = [
    "ALL_SUFFIXES",
    "INDEX_SUFFIX",
    "LOG_SUFFIX",
    "LOOKUP_CHUNK",
    "RECOVERY_CHUNK",
    "TIME_INDEX_SUFFIX",
    "TXN_INDEX_SUFFIX",
    "LogSegment",
    "segment_file",
]


def segment_file(directory: Path, base_offset: int, suffix: str) -> Path:
    return directory / f"{base_offset:020d}{suffix}"


class LogSegment(SegmentRecovery):
    """A log file and its indexes; see the module docstring for the invariants.

    Owns: the open file descriptor of ``<base>.log`` and its three indexes (offset, time,
    transaction), plus what it knows about its batches (next offset, max timestamp, size).

    Lifecycle: ``create`` (a new, empty active segment) or ``open`` (an existing one, unread
    until ``recover``/``ensure_indexes``); appended to while active; ``on_become_inactive`` at
    roll or close; ``flush`` fsyncs the log and indexes when there are unflushed appends;
    ``close`` releases the descriptors, ``delete`` closes and removes the files. The owning
    ``PartitionLog`` is the only caller.
    """

    __slots__ = (  # and SegmentRecovery's
        "_indexes_ready",
        "_recent",
        "_reserve",
        "created_ms",
        "directory",
        "file_suffix",
        "known_first_batch_timestamp",
        "log_path",
        "txn_index",
    )

    def __init__(
        self,
        directory: Path,
        base_offset: int,
        *,
        index_interval_bytes: int,
        index_max_bytes: int,
        now_ms: int,
        create: bool,
        file_suffix: str = "",
    ) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        self.file_suffix = file_suffix
        self.log_path = segment_file(directory, base_offset, LOG_SUFFIX + file_suffix)
        flags = os.O_RDWR | os.O_CREAT | (os.O_TRUNC if create else 0)
        self._fd = os.open(self.log_path, flags, 0o644)
        st = os.fstat(self._fd)
        self.size = st.st_size
        self.offset_index = OffsetIndex(
            segment_file(directory, base_offset, INDEX_SUFFIX + file_suffix),
            base_offset,
            index_max_bytes // OFFSET_ENTRY.size,
        )
        self.time_index = TimeIndex(
            segment_file(directory, base_offset, TIME_INDEX_SUFFIX + file_suffix),
            base_offset,
            index_max_bytes // TIME_ENTRY.size,
        )
        self.txn_index = TransactionIndex(
            segment_file(directory, base_offset, TXN_INDEX_SUFFIX + file_suffix), base_offset
        )
        self.created_ms = now_ms
        self.next_offset = base_offset
        self.unflushed = False
        self._bytes_since_index = 0
        self._max_timestamp: int | None = -1
        self._offset_of_max_timestamp = base_offset
        # ``first_batch_timestamp`` once known (None: not read yet; the property reads it from
        # the file). Public so the roll check (``roll_policy.rolls_before_write``, per Produce)
        # reads the number without the property's call; written here only.
        self.known_first_batch_timestamp: int | None = None
        self._indexes_ready = False  # both indexes loaded (never goes back: ``ensure_indexes``)
        self._recent = RecentBatches()  # what reads at the log end look up first
        self._reserve = BlockReserve.of_existing(st)  # (a crash may have left blocks reserved)
        if create:
            self.offset_index.reset()
            self.time_index.reset()
            self.txn_index.truncate_to(base_offset)
        else:
            self._max_timestamp = None  # unknown until the indexes or the log are read

    @classmethod
    def create(
        cls,
        directory: Path,
        base_offset: int,
        *,
        index_interval_bytes: int,
        index_max_bytes: int,
        now_ms: int,
        file_suffix: str = "",
    ) -> LogSegment:
        """A new, empty segment; ``file_suffix`` (``.cleaned``) names the files of a segment the
        log cleaner writes, which becomes part of the log only through a swap."""
        return cls(
            directory,
            base_offset,
            index_interval_bytes=index_interval_bytes,
            index_max_bytes=index_max_bytes,
            now_ms=now_ms,
            create=True,
            file_suffix=file_suffix,
        )

    @classmethod
    def open(
        cls,
        directory: Path,
        base_offset: int,
        *,
        index_interval_bytes: int,
        index_max_bytes: int,
        now_ms: int,
        file_suffix: str = "",
    ) -> LogSegment:
        """Open an existing segment without reading it; ``indexes_look_sane`` says whether the
        indexes can be trusted or ``recover``/``rebuild_indexes`` must run."""
        return cls(
            directory,
            base_offset,
            index_interval_bytes=index_interval_bytes,
            index_max_bytes=index_max_bytes,
            now_ms=now_ms,
            create=False,
            file_suffix=file_suffix,
        )

    # --- state ------------------------------------------------------------------------------
    def indexes_look_sane(self) -> bool:
        """Cheap checks only (file sizes): full validation happens on the first lookup."""
        return self.offset_index.quick_check() and self.time_index.quick_check() and self.txn_index.load()

    def ensure_indexes(self) -> None:
        """Load the indexes on first use; rebuild both from the log if either is corrupt."""
        if self.offset_index.loaded and self.time_index.loaded:
            self._indexes_ready = True  # an index once loaded stays loaded
            return
        if not (self.offset_index.load(self.size) and self.time_index.load()):
            self.rebuild_indexes()
            return
        if self._max_timestamp is None:
            last = self.time_index.last_entry()
            if last is not None:
                self._max_timestamp, self._offset_of_max_timestamp = last
            else:
                self._max_timestamp = -1

    @property
    def max_timestamp(self) -> int:
        self.ensure_indexes()
        return self._max_timestamp if self._max_timestamp is not None else -1

    @property
    def offset_of_max_timestamp(self) -> int:
        self.ensure_indexes()
        return self._offset_of_max_timestamp

    @property
    def first_batch_timestamp(self) -> int:
        """Max timestamp of the first batch (-1 when empty or without timestamps): segment.ms is
        measured from it, as in Kafka, so the age of a segment survives restarts."""
        if self.known_first_batch_timestamp is None:
            if self.size < HEADER_SIZE:
                return -1
            self.known_first_batch_timestamp = BatchHeader.parse(
                os.pread(self._fd, HEADER_SIZE, 0)
            ).max_timestamp
        return self.known_first_batch_timestamp

    def retention_timestamp(self) -> int:
        """Largest timestamp in the segment, or the file's mtime when batches carry none."""
        ts = self.max_timestamp
        if ts >= 0:
            return ts
        return int(self.log_path.stat().st_mtime * 1000)

    @property
    def is_empty(self) -> bool:
        return self.size == 0

    # --- writes -----------------------------------------------------------------------------
    def append(self, data: bytes | bytearray | memoryview, header: BatchHeader) -> None:
        """Write one batch whose offsets are final; ``header`` describes ``data``."""
        position = self.size
        if self._bytes_since_index > self.index_interval_bytes:
            if not self._indexes_ready:
                self.ensure_indexes()  # (then ``_max_timestamp`` is known: the property, inlined)
            self.offset_index.append(header.base_offset, position)
            max_timestamp = self._max_timestamp
            self.time_index.maybe_append(
                -1 if max_timestamp is None else max_timestamp, self._offset_of_max_timestamp
            )
            self._bytes_since_index = 0
        size = len(data)  # == header.size (the caller's contract)
        if size >= PREALLOCATE_MIN_WRITE:  # the one case ``before_write`` may act on (a call saved)
            self._reserve.before_write(self._fd, position, size)
        write_whole(self._fd, data, position)  # or the file is cut back to ``position``
        # What the segment knows of its batches; the header properties inlined (a call each).
        self.size = position + size
        self.next_offset = header.base_offset + header.last_offset_delta + 1
        self._bytes_since_index += size
        if self.known_first_batch_timestamp is None and position == 0:
            self.known_first_batch_timestamp = header.max_timestamp
        if self._max_timestamp is not None and header.max_timestamp > self._max_timestamp:
            self._max_timestamp = header.max_timestamp
            self._offset_of_max_timestamp = header.base_offset
        self._recent.note(position, header)
        self.unflushed = True

    def on_become_inactive(self) -> None:
        """At roll/close: record the final max timestamp so a reopened segment knows it from the
        time index alone. Frees the blocks preallocated past the end."""
        self._recent.clear()
        self._reserve.release(self._fd, self.size)
        if self._max_timestamp is not None and self._max_timestamp >= 0:
            self.ensure_indexes()
            self.time_index.maybe_append(self._max_timestamp, self._offset_of_max_timestamp)
        if self.offset_index.pending or self.time_index.pending:
            self.offset_index.write_pending()
            self.time_index.write_pending()
            self.unflushed = True  # the next flush fsyncs them, even with the log already synced

    # --- scanning ---------------------------------------------------------------------------
    def find_batch(self, offset: int) -> tuple[int, BatchHeader] | None:
        """Position and header of the first batch whose last offset is >= ``offset`` (the batch
        containing it, or the next one after a gap); None if the segment ends before it.
        The header's ``position`` field is not the file position; the returned position is."""
        recent = self._recent.find(offset)
        if recent is not None:  # a read at the log end: no index lookup, no header read
            return recent
        self.ensure_indexes()
        _entry_offset, position = self.offset_index.lookup(offset)
        # Fetches usually start at a batch boundary that has an index entry: one header read.
        head = os.pread(self._fd, HEADER_SIZE, position)
        if len(head) == HEADER_SIZE:
            header = BatchHeader.parse(head)
            if (
                header.magic == 2
                and header.batch_length >= MIN_BATCH_LENGTH
                and header.base_offset <= offset <= header.last_offset
                and position + header.size <= self.size
            ):
                return position, header
        chunk = max(LOOKUP_CHUNK, self.index_interval_bytes + HEADER_SIZE)
        for pos, header in self.scan(position, chunk=chunk):
            if header.last_offset >= offset:
                return pos, header
        return None

    def find_by_timestamp(self, timestamp: int, starting_offset: int = 0) -> BatchHeader | None:
        """Header of the first batch whose max timestamp is >= ``timestamp`` among the batches
        that hold offsets at or after ``starting_offset`` (the log start offset)."""
        self.ensure_indexes()
        start_offset = max(self.time_index.lookup(timestamp), starting_offset)
        _o, position = self.offset_index.lookup(start_offset)
        for _pos, header in self.scan(position, chunk=LOOKUP_CHUNK):
            if header.max_timestamp >= timestamp and header.last_offset >= starting_offset:
                return header
        return None

    def read(self, position: int, size: int) -> bytes:
        return os.pread(self._fd, size, position)

    def slice(self, position: int, size: int) -> FileSlice:
        """The same range as ``read``, as a slice of the file for ``os.sendfile`` (no copy)."""
        return FileSlice(self._fd, position, size)

    # --- scanning, recovery, index rebuilds: inherited from SegmentRecovery (segment_recovery) --

    # --- truncation -------------------------------------------------------------------------
    def truncate_to(self, offset: int) -> int:
        """Remove every batch whose base offset is >= ``offset``. Returns bytes removed."""
        found = self.find_batch(offset)
        if found is None:
            return 0
        position, header = found
        if header.base_offset < offset:
            position += header.size  # keep the batch containing offset whole
        removed = self.size - position
        if removed:
            self._truncate_file(position)
            self.rebuild_indexes()
        return removed

    def _truncate_file(self, position: int) -> None:
        os.ftruncate(self._fd, position)  # frees any blocks preallocated past the end too
        self._reserve.truncated()
        self._recent.clear()
        self.size = position
        self.unflushed = True
        if self.offset_index.loaded:
            self.offset_index.truncate_to_position(position)
        if position == 0:
            self.known_first_batch_timestamp = None

    # --- durability and lifetime ------------------------------------------------------------
    def flush(self, *, force: bool = False) -> None:
        """fsync the log and indexes when there are unflushed appends (or ``force``: a background
        fsync of them may still be in flight, see ``storage.rolled_flush``)."""
        if self.unflushed or force:
            os.fsync(self._fd)
            self.offset_index.flush()
            self.time_index.flush()
            self.txn_index.flush()
            self.unflushed = False

    def take_flush_descriptors(self) -> tuple[int, ...]:
        """Hand this segment's flush to a background thread: write the pending index entries
        (page cache), clear ``unflushed`` and return the open descriptors (log, offset, time and
        transaction index) whose fsync makes the segment durable. The caller owns that fsync
        from now on: until it is done it must treat the segment as unflushed (``flush(force=True)``)
        and set ``unflushed`` again if the fsync fails or is abandoned."""
        fds = (
            self._fd,
            self.offset_index.flush_descriptor(),
            self.time_index.flush_descriptor(),
            self.txn_index.flush_descriptor(),
        )
        self.unflushed = False
        return tuple(fd for fd in fds if fd >= 0)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self.offset_index.close()
        self.time_index.close()
        self.txn_index.close()

    def delete(self) -> None:
        self.close()
        for suffix in ALL_SUFFIXES:
            segment_file(self.directory, self.base_offset, suffix + self.file_suffix).unlink(missing_ok=True)

    def change_file_suffixes(self, old: str, new: str, *, log_last: bool) -> None:
        """Rename the segment's files from ``<base>.<kind><old>`` to ``<base>.<kind><new>``
        (Kafka's changeFileSuffixes, used by the cleaner's swap). Open descriptors stay valid
        across a rename. ``log_last`` renames the indexes before the log file, otherwise after
        it: crash recovery trusts the log file's name (see ``storage.cleaner.swap``), which picks
        the order. Missing index files (an empty transaction index) are skipped."""
        if old != self.file_suffix:
            raise ValueError(f"{self} has suffix {self.file_suffix!r}, not {old!r}")

        def renamed(path: Path) -> Path:
            return path.with_name(path.name[: len(path.name) - len(old)] + new)

        def rename_log() -> None:
            target = renamed(self.log_path)
            os.replace(self.log_path, target)
            self.log_path = target

        if not log_last:
            rename_log()
        for index in (self.offset_index, self.time_index, self.txn_index):
            target = renamed(index.path)
            if index.path.exists():
                os.replace(index.path, target)
            index.path = target
        if log_last:
            rename_log()
        self.file_suffix = new

    def set_last_modified(self, mtime_ns: int) -> None:
        """Give the log file a modification time (a cleaned segment keeps its sources' age)."""
        os.utime(self.log_path, ns=(mtime_ns, mtime_ns))

    @property
    def last_modified_ns(self) -> int:
        return os.stat(self.log_path).st_mtime_ns

    def __repr__(self) -> str:
        suffix = f", suffix={self.file_suffix!r}" if self.file_suffix else ""
        return f"LogSegment(base_offset={self.base_offset}, size={self.size}, next_offset={self.next_offset}{suffix})"
