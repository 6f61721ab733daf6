"""The last batches appended to a segment, so that reads which follow appends find them directly.

Why: a consumer or a follower parked at the log end is woken by every append and reads from the
batch just written. The offset index has one entry per ``index.interval.bytes`` (4 KB), so with
small batches such a read went back to the last entry and parsed up to ~25 batch headers to
find its offset (``LogSegment.find_batch`` via ``scan``): 60% of a small Fetch's CPU in
``bench/dispatch_micro.py``. The appends already hold every header, so keeping the last few costs
a list append per batch.

Invariant: the entries are the batches at the very end of the segment file, in offset order,
each with its file position, and nothing was written after the last one. The segment clears
them whenever its bytes change other than by an append (truncation) and when it stops being
the active segment, so a lookup can only miss (and fall back to the index), never be wrong.
"""

from __future__ import annotations

from bisect import bisect_left

from exactly.records.batch import BatchHeader

MAX_ENTRIES = 64  # about a second of linger.ms=0 appends at the request-rate workload's rate


class RecentBatches:
    """(position, header) of the last appended batches of one segment."""

    __slots__ = ("_entries", "_last_offsets")

    def __init__(self) -> None:
        self._entries: list[tuple[int, BatchHeader]] = []
        self._last_offsets: list[int] = []

    def note(self, position: int, header: BatchHeader) -> None:
        """``header``'s batch was just written at ``position`` (its ``position`` field may be
        where it sat in the request; the file position is the one kept)."""
        if len(self._entries) >= MAX_ENTRIES:
            half = MAX_ENTRIES // 2  # drop in halves: amortised O(1) per append
            del self._entries[:half]
            del self._last_offsets[:half]
        self._entries.append((position, header))
        self._last_offsets.append(header.base_offset + header.last_offset_delta)

    def clear(self) -> None:
        self._entries.clear()
        self._last_offsets.clear()

    def find(self, offset: int) -> tuple[int, BatchHeader] | None:
        """The first kept batch whose last offset is >= ``offset``, when that is also the first
        such batch of the whole segment (``offset`` is not before the oldest kept batch); None
        when the answer is not here."""
        lasts = self._last_offsets
        if not lasts or offset > lasts[-1] or offset < self._entries[0][1].base_offset:
            return None
        return self._entries[bisect_left(lasts, offset)]
