"""The aborted-transaction index of one segment (``<base>.txnindex``), Kafka's TransactionIndex.

Theory of operation
-------------------
When an ABORT marker completes a transaction, the log appends one entry to the transaction index
of the segment that holds the marker: (producer id, first offset of the transaction, offset of
the marker, last stable offset right after the abort). A read_committed fetch returning offsets
``[fetch_offset, upper)`` must tell the consumer about every aborted transaction overlapping that
range, i.e. every entry with ``last_offset >= fetch_offset`` and ``first_offset < upper``. Such
markers lie at or after ``fetch_offset``, so only segments from the fetched one onward are searched,
and the search stops at the first entry whose last stable offset is >= ``upper``: every
transaction aborted later was still open (or not yet begun) at that point and therefore starts at
or after that LSO (Kafka's TxnIndexSearchResult.isComplete).

Entries are few (one per aborted transaction), so they are held in memory as a list and the file
is append-only. Entry layout (34 bytes, big-endian): version int16 = 0, producer id int64, first
offset int64, last offset int64, last stable offset int64.

Invariants
----------
* Entries are in marker order: ``last_offset`` strictly increases.
* The file holds exactly ``len(entries) * 34`` bytes; a torn or garbled file is corrupt and is
  rebuilt by recovery.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

TXN_ENTRY = struct.Struct(">hqqqq")
TXN_ENTRY_VERSION = 0


@dataclass(frozen=True, slots=True)
class AbortedTxnEntry:
    producer_id: int
    first_offset: int
    last_offset: int  # offset of the ABORT marker
    last_stable_offset: int


class TransactionIndex:
    """In-memory list of aborted transactions, mirrored by an append-only file.

    Owns: ``entries`` (ordered by marker offset) and a lazily opened append descriptor of the
    ``<base>.txnindex`` file. Lifecycle: ``load`` at segment recovery (a corrupt file is deleted
    and rebuilt by the caller), ``append``/``truncate_to`` as the log changes, ``flush`` with the
    segment, ``close`` with it. The file is not fsynced on append: like the log, it is made
    durable by the segment's flush, and recovery rebuilds its entries by replaying the log from
    the producer-state snapshot onwards.
    """

    __slots__ = ("_fd", "base_offset", "entries", "path")

    def __init__(self, path: Path, base_offset: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self.entries: list[AbortedTxnEntry] = []
        self._fd = -1

    def load(self) -> bool:
        """Read the file (a missing file is an empty index). False when corrupt."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return True
        entries: list[AbortedTxnEntry] = []
        last = -1
        valid = len(data) % TXN_ENTRY.size == 0
        if valid:
            for version, pid, first, last_offset, lso in TXN_ENTRY.iter_unpack(data):
                if version != TXN_ENTRY_VERSION or last_offset <= last or first > last_offset:
                    valid = False
                    break
                entries.append(AbortedTxnEntry(pid, first, last_offset, lso))
                last = last_offset
        if not valid:
            # Unusable: drop it so recovery's rebuild starts from an empty index.
            self.entries = []
            self.close()
            self.path.unlink(missing_ok=True)
            return False
        self.entries = entries
        return True

    def append(self, entry: AbortedTxnEntry) -> None:
        if self.entries and entry.last_offset <= self.entries[-1].last_offset:
            raise ValueError(f"aborted txn at {entry.last_offset} does not follow the last entry")
        self.entries.append(entry)
        if self._fd < 0:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.write(
            self._fd,
            TXN_ENTRY.pack(
                TXN_ENTRY_VERSION,
                entry.producer_id,
                entry.first_offset,
                entry.last_offset,
                entry.last_stable_offset,
            ),
        )

    def truncate_to(self, offset: int) -> None:
        """Drop entries whose marker is at or after ``offset``."""
        keep = len(self.entries)
        while keep and self.entries[keep - 1].last_offset >= offset:
            keep -= 1
        if keep == len(self.entries) and self.path.exists():
            return
        del self.entries[keep:]
        self.close()
        if not self.entries:
            self.path.unlink(missing_ok=True)
            return
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        os.write(
            self._fd,
            b"".join(
                TXN_ENTRY.pack(
                    TXN_ENTRY_VERSION, e.producer_id, e.first_offset, e.last_offset, e.last_stable_offset
                )
                for e in self.entries
            ),
        )

    def collect(self, fetch_offset: int, upper_bound: int, out: list[AbortedTxnEntry]) -> bool:
        """Append entries overlapping ``[fetch_offset, upper_bound)`` to ``out``; True when the
        search is complete (no later segment can hold an overlapping entry)."""
        for entry in self.entries:
            if entry.last_offset >= fetch_offset and entry.first_offset < upper_bound:
                out.append(entry)
            if entry.last_stable_offset >= upper_bound:
                return True
        return False

    def flush(self) -> None:
        if self._fd >= 0:
            os.fsync(self._fd)

    def flush_descriptor(self) -> int:
        """The descriptor ``flush`` would fsync (-1: none), for a background fsync."""
        return self._fd

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
