"""The segment's memory of its last appended batches (``storage.recent_batches``) must give the
answers the offset index and a scan give, and forget what truncation removes."""

from __future__ import annotations

from pathlib import Path

from exactly.records.batch import BatchHeader, patch_base_offset
from exactly.storage.recent_batches import MAX_ENTRIES, RecentBatches
from exactly.storage.segment import LogSegment
from tests.storage.helpers import NOW, make_batch

INTERVAL = 4096  # Kafka's index.interval.bytes: small batches share one index entry


def _segment(directory: Path, create: bool) -> LogSegment:
    make = LogSegment.create if create else LogSegment.open
    return make(directory, 0, index_interval_bytes=INTERVAL, index_max_bytes=1 << 20, now_ms=NOW)


def _append(segment: LogSegment, base_offset: int, records: int = 2) -> BatchHeader:
    batch = make_batch(records, value_size=30)
    patch_base_offset(batch, 0, base_offset)
    header = BatchHeader.parse(batch)
    segment.append(batch, header)
    return header


def _answers(segment: LogSegment, last: int) -> list[tuple[int, int, int] | None]:
    out: list[tuple[int, int, int] | None] = []
    for offset in range(last + 2):
        found = segment.find_batch(offset)
        out.append(None if found is None else (found[0], found[1].base_offset, found[1].size))
    return out


def test_answers_match_a_reopened_segment_that_has_no_memory(tmp_path: Path) -> None:
    segment = _segment(tmp_path, create=True)
    offset = 0
    for i in range(MAX_ENTRIES * 2 + 5):  # more than are kept: the oldest fall back to the index
        offset = _append(segment, offset).next_offset + (3 if i % 7 == 0 else 0)  # offset gaps too
    live = _answers(segment, offset)
    segment.flush()
    segment.close()
    reopened = _segment(tmp_path, create=False)
    reopened.rebuild_indexes()
    assert _answers(reopened, offset) == live
    assert live[-1] is None
    assert live[0] is not None and live[0][:2] == (0, 0)
    reopened.close()


def test_truncation_forgets_the_removed_batches(tmp_path: Path) -> None:
    segment = _segment(tmp_path, create=True)
    headers = [_append(segment, 2 * i) for i in range(10)]
    assert segment.truncate_to(10) > 0  # batches at 10, 12, ... are gone
    assert segment.find_batch(10) is None
    assert segment.find_batch(15) is None
    replacement = _append(segment, 10, records=4)  # different bytes at the same offsets
    found = segment.find_batch(12)
    assert found is not None
    position, header = found
    assert (header.base_offset, header.record_count) == (10, 4)
    assert position == sum(h.size for h in headers[:5])
    on_disk = BatchHeader.parse(segment.read(position, header.size))
    assert (on_disk.base_offset, on_disk.record_count, on_disk.size) == (10, 4, replacement.size)
    segment.close()


def test_rolled_segment_forgets_and_still_finds_by_index(tmp_path: Path) -> None:
    segment = _segment(tmp_path, create=True)
    headers = [_append(segment, 2 * i) for i in range(5)]
    segment.on_become_inactive()
    found = segment.find_batch(7)
    assert found is not None and found[1].base_offset == 6
    assert found[0] == sum(h.size for h in headers[:3])
    segment.close()


def test_lookup_before_the_oldest_kept_batch_is_a_miss() -> None:
    recent = RecentBatches()
    batch = make_batch(1)
    patch_base_offset(batch, 0, 5)
    second = BatchHeader.parse(batch)
    recent.note(100, second)
    assert recent.find(4) is None  # an earlier batch may hold it: ask the index
    assert recent.find(5) == (100, second)
    assert recent.find(6) is None  # past the end
    recent.clear()
    assert recent.find(5) is None
