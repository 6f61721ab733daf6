"""Sparse per-segment indexes: offset -> file position (``.index``) and timestamp -> offset
(``.timeindex``), Kafka's OffsetIndex and TimeIndex.

Theory of operation
-------------------
A segment adds one entry every ``index.interval.bytes`` of appended data, so an index is small
(a 1 GiB segment with the 4 KiB default has at most ~256 Ki entries) and a lookup is a binary
search followed by a short scan of batch headers in the log. Entries are kept in memory in
``array`` columns (no per-entry Python objects); unlike Kafka the files are not preallocated or
memory-mapped, so an index file is always exactly ``entries * entry_size`` bytes and needs no
trimming at roll.

Deferred writes
---------------
A new entry is only added to the columns; the entries not yet in the file (the *pending* ones,
those from ``_written`` on) reach it in one ``os.write`` by ``write_pending``: at the segment's
``flush`` (before the fsync), at roll (``on_become_inactive``), at ``close``, and whenever
``MAX_PENDING`` have gathered. That is Kafka's behaviour (its indexes are memory-mapped and reach
the disk at flush/roll/close), and why: an entry is created for nearly every Produce request of a
bulk producer (a request is one batch larger than ``index.interval.bytes``), so a write per entry
was two system calls per request. What a crash can lose is pending entries only, i.e. entries of
data past the recovery point, whose segments recovery rebuilds from the log anyway (``segment``
``recover``): the file is then a *prefix* of the entries, never wrong ones, and a prefix of a
sparse index is still a valid sparse index.

Loading is lazy: opening a segment only checks an index's size (``quick_check``); the entries are
read on first use. An index that is missing, has a size that is not a multiple of its entry size,
or whose entries do not increase is *corrupt*: ``load`` returns False and the owning segment
rebuilds it from the log. Nothing here ever trusts an index more than the log.

Invariants
----------
* OffsetIndex: relative offsets strictly increase, positions strictly increase, and every
  position is the start of a batch whose base offset is ``base_offset + relative offset``.
* TimeIndex: timestamps strictly increase and offsets never decrease; an entry ``(t, o)`` means
  "no batch before the one at offset ``o`` in this segment has a max timestamp >= t", which is what
  makes ``lookup`` a safe lower bound.
* On disk both are big-endian, like Kafka's (relative offset u32 + position u32; timestamp i64 +
  relative offset u32).
"""

from __future__ import annotations

import itertools
import os
import struct
import sys
from array import array
from bisect import bisect_left, bisect_right
from pathlib import Path

from exactly.storage.durable import write_all

OFFSET_ENTRY = struct.Struct(">II")
TIME_ENTRY = struct.Struct(">qI")
_LITTLE = sys.byteorder == "little"


MAX_PENDING = 1024  # entries gathered before a write regardless of flush (8-12 KiB)


def _strictly_increasing(values: array[int]) -> bool:
    return all(a < b for a, b in itertools.pairwise(values))


class _IndexFile:
    """File handling both indexes share: an append-only file of fixed-size entries, opened lazily,
    rewritten whole when entries are dropped.

    Owns: the index file's append descriptor (opened on the first write, released by ``close``)
    and, in the subclasses, the entries in memory. Lifecycle: created with the segment, loaded
    (or reset/rebuilt) during recovery, appended to while the segment is active, fsynced by the
    segment's ``flush``, closed with the segment.
    """

    __slots__ = ("_fd", "_loaded", "_written", "base_offset", "is_full", "max_entries", "path")
    ENTRY: struct.Struct

    def __init__(self, path: Path, base_offset: int, max_entries: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self.max_entries = max(1, max_entries)
        self._fd = -1
        self._loaded = False
        self._written = 0  # entries in the file; the rest of the columns are pending
        # Whether the index holds ``max_entries`` (the segment rolls before its next append). A
        # plain attribute, not a property: the roll check reads it on every Produce
        # (``roll_policy.rolls_before_write``), and entries change only every
        # index.interval.bytes. Invariant: ``is_full == (len(self) >= max_entries)``, kept by
        # ``_sized`` after every change of the entries (the rule's one place).
        self.is_full = False

    def __len__(self) -> int:
        raise NotImplementedError

    def _sized(self) -> None:
        """The entries changed: recompute ``is_full``."""
        self.is_full = len(self) >= self.max_entries

    def _encode(self, start: int) -> bytes:
        """Entries ``start`` onwards as they are stored in the file."""
        raise NotImplementedError

    @property
    def pending(self) -> int:
        """Entries created but not yet written to the file."""
        return len(self) - self._written

    def quick_check(self) -> bool:
        """Cheap test used when a segment is opened: the file exists with a sane size."""
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return False
        return size % self.ENTRY.size == 0

    def _read(self) -> bytes | None:
        """The file's bytes, or None when it is missing or not a whole number of entries."""
        self._loaded = True
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        return None if len(data) % self.ENTRY.size else data

    @property
    def loaded(self) -> bool:
        return self._loaded

    def _replace_file(self) -> None:
        """Rewrite the file as every entry in memory (after entries were dropped) and keep it
        open for appends: nothing is pending afterwards."""
        self._close_fd()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        self._written = 0
        self._sized()
        self.write_pending()

    def write_pending(self) -> None:
        """Append the pending entries to the file (page cache; ``flush`` fsyncs)."""
        count = len(self)
        if count <= self._written:
            return
        if self._fd < 0:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        write_all(self._fd, self._encode(self._written))
        self._written = count

    def flush(self) -> None:
        self.write_pending()
        if self._fd >= 0:
            os.fsync(self._fd)

    def flush_descriptor(self) -> int:
        """``flush`` split for a background fsync: write what is pending (owner's thread) and
        return the descriptor to fsync (-1: no file open, nothing written this run)."""
        self.write_pending()
        return self._fd

    def close(self) -> None:
        """Write what is pending (not fsynced, as Kafka's close) and release the descriptor."""
        self.write_pending()
        self._close_fd()

    def _close_fd(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class OffsetIndex(_IndexFile):
    """Sparse offset -> position map of one segment (``<base>.index``)."""

    __slots__ = ("_offsets", "_positions")
    ENTRY = OFFSET_ENTRY

    def __init__(self, path: Path, base_offset: int, max_entries: int) -> None:
        super().__init__(path, base_offset, max_entries)
        self._offsets: array[int] = array("I")  # relative offsets
        self._positions: array[int] = array("I")

    # --- loading ----------------------------------------------------------------------------
    def load(self, log_size: int) -> bool:
        """Read the entries; False (and empty) when the file is missing or corrupt."""
        data = self._read()
        if data is None:
            return False
        cols: array[int] = array("I")
        cols.frombytes(data)
        if _LITTLE:
            cols.byteswap()
        offsets, positions = cols[0::2], cols[1::2]
        if not (_strictly_increasing(offsets) and _strictly_increasing(positions)):
            return False
        if positions and positions[-1] >= log_size:
            return False
        self._offsets, self._positions = offsets, positions
        self._sized()
        self._written = len(offsets)
        return True

    def reset(self) -> None:
        """Forget every entry and empty the file (before a rebuild)."""
        self._offsets = array("I")
        self._positions = array("I")
        self._loaded = True
        self._replace_file()

    # --- entries ----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._offsets)

    def last_entry(self) -> tuple[int, int]:
        """(offset, position) of the last entry, or (base_offset, 0) when empty."""
        if not self._offsets:
            return self.base_offset, 0
        return self.base_offset + self._offsets[-1], self._positions[-1]

    def append(self, offset: int, position: int) -> None:
        rel = offset - self.base_offset
        if self._offsets and (rel <= self._offsets[-1] or position <= self._positions[-1]):
            raise ValueError(f"index entry ({offset}, {position}) does not follow the last one")
        self._offsets.append(rel)
        self._positions.append(position)
        self._sized()
        if len(self._offsets) - self._written >= MAX_PENDING:
            self.write_pending()

    def lookup(self, offset: int) -> tuple[int, int]:
        """(offset, position) of the last entry with offset <= ``offset`` (the segment start when
        there is none): the place to start scanning for ``offset``."""
        i = bisect_right(self._offsets, offset - self.base_offset) - 1
        if i < 0:
            return self.base_offset, 0
        return self.base_offset + self._offsets[i], self._positions[i]

    def truncate_to_position(self, position: int) -> None:
        """Drop entries at or after ``position`` (the log is being cut there)."""
        keep = bisect_left(self._positions, position)
        if keep == len(self._positions):
            return
        del self._offsets[keep:]
        del self._positions[keep:]
        self._replace_file()

    def _encode(self, start: int) -> bytes:
        count = len(self._offsets) - start
        cols: array[int] = array("I", bytes(8 * count))
        cols[0::2] = self._offsets[start:]
        cols[1::2] = self._positions[start:]
        if _LITTLE:
            cols.byteswap()
        return cols.tobytes()


class TimeIndex(_IndexFile):
    """Sparse max-timestamp -> offset map of one segment (``<base>.timeindex``)."""

    __slots__ = ("_offsets", "_timestamps")
    ENTRY = TIME_ENTRY

    def __init__(self, path: Path, base_offset: int, max_entries: int) -> None:
        super().__init__(path, base_offset, max_entries)
        self._timestamps: array[int] = array("q")
        self._offsets: array[int] = array("I")  # relative offsets

    def load(self) -> bool:
        """Read the entries; False (and empty) when the file is missing or corrupt."""
        data = self._read()
        if data is None:
            return False
        timestamps: array[int] = array("q")
        offsets: array[int] = array("I")
        for ts, rel in TIME_ENTRY.iter_unpack(data):
            timestamps.append(ts)
            offsets.append(rel)
        if not _strictly_increasing(timestamps) or any(a > b for a, b in itertools.pairwise(offsets)):
            return False
        self._timestamps, self._offsets = timestamps, offsets
        self._sized()
        self._written = len(offsets)
        return True

    def reset(self) -> None:
        self._timestamps = array("q")
        self._offsets = array("I")
        self._loaded = True
        self._replace_file()

    def __len__(self) -> int:
        return len(self._timestamps)

    def last_entry(self) -> tuple[int, int] | None:
        """(timestamp, offset) of the last entry."""
        if not self._timestamps:
            return None
        return self._timestamps[-1], self.base_offset + self._offsets[-1]

    def maybe_append(self, timestamp: int, offset: int) -> None:
        """Add (timestamp, offset) unless it does not raise the max timestamp (Kafka's
        maybeAppend): entries only ever record a new maximum."""
        if timestamp < 0 or (self._timestamps and timestamp <= self._timestamps[-1]):
            return
        rel = offset - self.base_offset
        if self._offsets and rel < self._offsets[-1]:
            return
        self._timestamps.append(timestamp)
        self._offsets.append(rel)
        self._sized()
        if len(self._offsets) - self._written >= MAX_PENDING:
            self.write_pending()

    def lookup(self, timestamp: int) -> int:
        """An offset at or before the first batch whose max timestamp is >= ``timestamp``: the
        offset of the last entry with a timestamp strictly below it (segment start if none)."""
        i = bisect_left(self._timestamps, timestamp) - 1
        if i < 0:
            return self.base_offset
        return self.base_offset + self._offsets[i]

    def truncate_to_offset(self, offset: int) -> None:
        """Drop entries whose offset is >= ``offset``."""
        rel = offset - self.base_offset
        keep = len(self._offsets)
        while keep and self._offsets[keep - 1] >= rel:
            keep -= 1
        if keep == len(self._offsets):
            return
        del self._timestamps[keep:]
        del self._offsets[keep:]
        self._replace_file()

    def _encode(self, start: int) -> bytes:
        pack = TIME_ENTRY.pack
        return b"".join(pack(t, o) for t, o in zip(self._timestamps[start:], self._offsets[start:]))
