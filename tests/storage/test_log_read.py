"""The read path (``log_read``) over real segments, without a log around them."""

from __future__ import annotations

from pathlib import Path

import pytest

from exactly.records.batch import iter_batches
from exactly.storage import log_read
from exactly.storage.file_slice import FileSlice
from exactly.storage.log_read import (
    AbortedTxn,
    collect_aborted_transactions,
    offset_for_timestamp,
    read_batches,
)
from exactly.storage.segment import LogSegment
from exactly.storage.txn_index import AbortedTxnEntry
from tests.storage.helpers import NOW
from tests.storage.test_segment import fill, new_segment


def two_segments(tmp_path: Path) -> tuple[list[LogSegment], list[int], int]:
    """Offsets 0-14 in the first segment and 15-29 in the second (batches of three)."""
    first = new_segment(tmp_path, base=0)
    fill(first, 5, timestamp=NOW)
    second = new_segment(tmp_path, base=15)
    fill(second, 5, timestamp=NOW + 100)
    return [first, second], [0, 15], second.next_offset


def offsets(data: bytes) -> list[int]:
    return [h.base_offset for h in iter_batches(data)]


def test_reads_whole_batches_of_one_segment_up_to_the_bound(tmp_path: Path) -> None:
    segments, bases, end = two_segments(tmp_path)
    data, upper = read_batches(segments, bases, end, 4, bound=12, max_bytes=1 << 20, min_one=True)
    assert offsets(data) == [3, 6, 9] and upper == 12  # from the batch holding offset 4
    data, upper = read_batches(segments, bases, end, 12, bound=end, max_bytes=1 << 20, min_one=True)
    assert offsets(data) == [12] and upper == 15  # one segment per call
    data, upper = read_batches(segments, bases, end, 15, bound=end, max_bytes=1 << 20, min_one=True)
    assert offsets(data) == [15, 18, 21, 24, 27] and upper == 30


def test_max_bytes_cuts_after_a_whole_batch_or_gives_one(tmp_path: Path) -> None:
    segments, bases, end = two_segments(tmp_path)
    size = next(iter_batches(segments[0].read(0, segments[0].size))).size
    data, upper = read_batches(segments, bases, end, 0, bound=end, max_bytes=2 * size + 1, min_one=True)
    assert offsets(data) == [0, 3] and upper == 6
    data, upper = read_batches(segments, bases, end, 0, bound=end, max_bytes=size - 1, min_one=True)
    assert offsets(data) == [0] and upper == 3
    assert read_batches(segments, bases, end, 0, bound=end, max_bytes=size - 1, min_one=False) == (b"", 0)


def test_nothing_at_or_past_the_bound(tmp_path: Path) -> None:
    segments, bases, end = two_segments(tmp_path)
    assert read_batches(segments, bases, end, 9, bound=9, max_bytes=1 << 20, min_one=True) == (b"", 9)
    # The bound inside the batch holding the fetch offset: that batch is not visible yet.
    assert read_batches(segments, bases, end, 9, bound=10, max_bytes=1 << 20, min_one=True) == (b"", 9)


def test_aborted_transactions_overlapping_the_range(tmp_path: Path) -> None:
    segments, bases, _ = two_segments(tmp_path)
    segments[0].txn_index.append(AbortedTxnEntry(7, 0, 5, 6))
    segments[1].txn_index.append(AbortedTxnEntry(8, 10, 20, 21))
    assert collect_aborted_transactions(segments, bases, 6, 9) == ()
    assert collect_aborted_transactions(segments, bases, 3, 12) == (AbortedTxn(7, 0), AbortedTxn(8, 10))
    assert collect_aborted_transactions(segments, bases, 16, 30) == (AbortedTxn(8, 10),)


def test_offset_for_timestamp_is_at_least_the_log_start(tmp_path: Path) -> None:
    segments, _, _ = two_segments(tmp_path)
    assert offset_for_timestamp(segments, 0, NOW) == (0, NOW)
    assert offset_for_timestamp(segments, 0, NOW + 3) == (9, NOW + 3)
    assert offset_for_timestamp(segments, 10, NOW + 3) == (10, NOW + 3)
    assert offset_for_timestamp(segments, 0, NOW + 101) == (18, NOW + 101)
    assert offset_for_timestamp(segments, 0, NOW + 105) is None


def test_a_read_of_at_least_slice_from_bytes_is_a_slice_of_the_segment_file(tmp_path: Path) -> None:
    segments, bases, end = two_segments(tmp_path)
    copied, upper = read_batches(segments, bases, end, 15, bound=end, max_bytes=1 << 20, min_one=True)
    assert isinstance(copied, bytes)
    sliced, sliced_upper = read_batches(
        segments, bases, end, 15, bound=end, max_bytes=1 << 20, min_one=True, slice_from=len(copied)
    )
    assert isinstance(sliced, FileSlice) and sliced_upper == upper
    assert len(sliced) == len(copied) and sliced.read() == copied and sliced.read(10) == copied[10:]
    small, _ = read_batches(
        segments, bases, end, 15, bound=end, max_bytes=1 << 20, min_one=True, slice_from=len(copied) + 1
    )
    assert isinstance(small, bytes)  # below the threshold: copied
    sliced.close()


def test_a_slice_outlives_its_segment_and_sees_a_truncation(tmp_path: Path) -> None:
    """The slice holds its own descriptor: a closed (or deleted) segment still reads; a file cut
    under it reads short, which the writer must treat as a broken answer."""
    segments, bases, end = two_segments(tmp_path)
    sliced, _ = read_batches(segments, bases, end, 0, bound=15, max_bytes=1 << 20, min_one=True, slice_from=1)
    assert isinstance(sliced, FileSlice)
    whole = sliced.read()
    segments[0].close()
    segments[0].log_path.unlink()
    assert sliced.read() == whole
    again, _ = read_batches(
        segments[1:], bases[1:], end, 15, bound=end, max_bytes=1 << 20, min_one=True, slice_from=1
    )
    assert isinstance(again, FileSlice)
    segments[1].truncate_to(18)
    assert len(again.read()) < len(again)
    sliced.close()
    again.close()


def test_a_read_cut_by_max_bytes_is_a_slice_of_the_whole_batches_that_fit(tmp_path: Path) -> None:
    segments, bases, end = two_segments(tmp_path)
    size = next(iter_batches(segments[1].read(0, segments[1].size))).size
    copied, upper = read_batches(segments, bases, end, 15, bound=end, max_bytes=3 * size - 1, min_one=True)
    assert isinstance(copied, bytes) and offsets(copied) == [15, 18] and upper == 21
    for recent in (True, False):  # headers from the recent-batch memory, then from index + file
        if not recent:
            segments[1].on_become_inactive()
        sliced, sliced_upper = read_batches(
            segments, bases, end, 15, bound=end, max_bytes=3 * size - 1, min_one=True, slice_from=size
        )
        assert isinstance(sliced, FileSlice) and sliced_upper == upper and sliced.read() == copied
        sliced.close()
    # the bound still ends the range first when it comes before max_bytes
    bounded, bounded_upper = read_batches(
        segments, bases, end, 15, bound=20, max_bytes=3 * size - 1, min_one=True, slice_from=size
    )
    assert isinstance(bounded, FileSlice) and bounded_upper == 18 and offsets(bounded.read()) == [15]
    bounded.close()


def test_the_header_walk_for_a_cut_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    segments, bases, end = two_segments(tmp_path)
    size = next(iter_batches(segments[1].read(0, segments[1].size))).size
    monkeypatch.setattr(log_read, "HEADER_WALK", 1)
    sliced, upper = read_batches(
        segments, bases, end, 15, bound=end, max_bytes=4 * size, min_one=True, slice_from=size
    )
    assert isinstance(sliced, FileSlice) and upper == 21 and offsets(sliced.read()) == [15, 18]
    sliced.close()
