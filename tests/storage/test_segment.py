from __future__ import annotations

import os
from pathlib import Path

import pytest

from exactly.records.batch import BatchHeader, patch_base_offset
from exactly.storage.file_write import PREALLOCATE_AHEAD, PREALLOCATE_MIN_WRITE
from exactly.storage.segment import LogSegment, segment_file
from tests.storage.helpers import NOW, headers_of, make_batch


def new_segment(directory: Path, base: int = 0, interval: int = 100) -> LogSegment:
    return LogSegment.create(
        directory, base, index_interval_bytes=interval, index_max_bytes=1 << 20, now_ms=NOW
    )


def fill(segment: LogSegment, batches: int, *, records: int = 3, timestamp: int = NOW) -> list[BatchHeader]:
    headers = []
    for i in range(batches):
        batch = make_batch(records, value_size=40, timestamp=timestamp + i)
        patch_base_offset(batch, 0, segment.next_offset)
        header = BatchHeader.parse(batch)
        segment.append(batch, header)
        headers.append(header)
    return headers


def test_append_indexes_and_finds_every_offset(tmp_path: Path) -> None:
    segment = new_segment(tmp_path, base=50)
    headers = fill(segment, 20)
    assert segment.next_offset == 50 + 60
    assert len(segment.offset_index) > 5  # one entry per ~100 bytes of appended data
    positions = {}
    position = 0
    for header in headers:
        positions[header.base_offset] = position
        position += header.size
    assert segment.size == position
    for header in headers:
        for offset in range(header.base_offset, header.next_offset):
            found = segment.find_batch(offset)
            assert found is not None
            assert found[0] == positions[header.base_offset]
            assert found[1].base_offset == header.base_offset
    assert segment.find_batch(110) is None
    # Reading a range gives back exactly the appended batches.
    data = segment.read(0, segment.size)
    assert [h.base_offset for h in headers_of(data)] == [h.base_offset for h in headers]
    segment.close()


def test_max_timestamp_and_find_by_timestamp(tmp_path: Path) -> None:
    segment = new_segment(tmp_path)
    fill(segment, 10, timestamp=5000)  # batch i has timestamp 5000 + i
    assert segment.max_timestamp == 5009
    found = segment.find_by_timestamp(5004)
    assert found is not None and found.max_timestamp == 5004 and found.base_offset == 12
    assert segment.find_by_timestamp(6000) is None
    first = segment.find_by_timestamp(0)
    assert first is not None and first.base_offset == 0
    segment.close()


def test_recover_cuts_torn_tail_and_keeps_whole_batches(tmp_path: Path) -> None:
    segment = new_segment(tmp_path)
    headers = fill(segment, 10)
    whole = segment.size
    extra = make_batch(3)
    patch_base_offset(extra, 0, segment.next_offset)
    segment.close()
    with open(segment.log_path, "ab") as f:
        f.write(extra[: len(extra) // 2])  # a batch that never fully reached the disk

    reopened = LogSegment.open(tmp_path, 0, index_interval_bytes=100, index_max_bytes=1 << 20, now_ms=NOW)
    assert reopened.recover() == len(extra) // 2
    assert reopened.size == whole == os.path.getsize(reopened.log_path)
    assert reopened.next_offset == headers[-1].next_offset
    assert reopened.find_batch(headers[-1].base_offset) is not None
    reopened.close()


def test_recover_cuts_at_first_crc_failure(tmp_path: Path) -> None:
    segment = new_segment(tmp_path)
    headers = fill(segment, 10)
    segment.close()
    victim = headers[6]
    position = sum(h.size for h in headers[:6])
    with open(segment.log_path, "r+b") as f:
        f.seek(position + victim.size - 1)
        byte = f.read(1)
        f.seek(position + victim.size - 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    reopened = LogSegment.open(tmp_path, 0, index_interval_bytes=100, index_max_bytes=1 << 20, now_ms=NOW)
    assert reopened.recover() > 0
    assert reopened.size == position
    assert reopened.next_offset == victim.base_offset
    # Index entries never point past the cut.
    assert reopened.offset_index.last_entry()[1] < position
    reopened.close()


def test_recover_from_offset_validates_only_after_it(tmp_path: Path) -> None:
    segment = new_segment(tmp_path)
    headers = fill(segment, 10)
    segment.flush()
    segment.close()
    # Corrupt a batch *before* the recovery offset: partial recovery must not look at it.
    with open(segment.log_path, "r+b") as f:
        f.seek(headers[0].size - 1)
        f.write(b"\xff")
    reopened = LogSegment.open(tmp_path, 0, index_interval_bytes=100, index_max_bytes=1 << 20, now_ms=NOW)
    assert reopened.recover(from_offset=headers[5].base_offset) == 0
    assert reopened.next_offset == headers[-1].next_offset
    assert reopened.recover() > 0  # a full recovery does find it
    assert reopened.size == 0
    reopened.close()


@pytest.mark.parametrize("damage", ["delete", "truncate"])
def test_damaged_index_is_rebuilt_from_log(tmp_path: Path, damage: str) -> None:
    segment = new_segment(tmp_path)
    headers = fill(segment, 20)
    expected = [segment.find_batch(h.base_offset + 1) for h in headers]
    entries = len(segment.offset_index)
    segment.close()
    index_path = segment_file(tmp_path, 0, ".index")
    if damage == "delete":
        index_path.unlink()
    else:
        index_path.write_bytes(index_path.read_bytes()[:-3])
    reopened = LogSegment.open(tmp_path, 0, index_interval_bytes=100, index_max_bytes=1 << 20, now_ms=NOW)
    assert not reopened.indexes_look_sane()
    assert [reopened.find_batch(h.base_offset + 1) for h in headers] == expected
    assert len(reopened.offset_index) == entries
    assert index_path.stat().st_size == entries * 8
    reopened.close()


def test_truncate_to_and_delete(tmp_path: Path) -> None:
    segment = new_segment(tmp_path)
    headers = fill(segment, 10)
    removed = segment.truncate_to(headers[4].base_offset)
    assert removed == sum(h.size for h in headers[4:])
    assert segment.next_offset == headers[4].base_offset
    assert segment.find_batch(headers[4].base_offset) is None
    segment.delete()
    assert list(tmp_path.iterdir()) == []


def test_bulk_appends_reserve_blocks_that_roll_and_truncation_free(tmp_path: Path) -> None:
    """A batch of PREALLOCATE_MIN_WRITE or more is written into blocks preallocated past the end;
    the file's size stays the log end throughout, and becoming inactive or truncating frees the
    rest (no disk held by a rolled segment)."""
    segment = new_segment(tmp_path, interval=4096)
    big = make_batch(1, value_size=PREALLOCATE_MIN_WRITE)
    small = make_batch(3, value_size=40)
    for batch in (big, small, big):
        patch_base_offset(batch, 0, segment.next_offset)
        segment.append(batch, BatchHeader.parse(batch))
    st = os.stat(segment.log_path)
    assert st.st_size == segment.size == 2 * len(big) + len(small)
    if st.st_blocks * 512 < segment.size + PREALLOCATE_AHEAD // 2:
        pytest.skip("this file system has no fallocate(FALLOC_FL_KEEP_SIZE)")
    assert [h.base_offset for h in headers_of(segment.read(0, segment.size))] == [0, 1, 4]
    segment.truncate_to(4)  # drops the last big batch, and the reserve with it
    assert os.stat(segment.log_path).st_blocks * 512 < segment.size + PREALLOCATE_MIN_WRITE
    patch_base_offset(big, 0, segment.next_offset)
    segment.append(big, BatchHeader.parse(big))  # reserves again
    assert os.stat(segment.log_path).st_blocks * 512 >= segment.size + PREALLOCATE_AHEAD // 2
    segment.on_become_inactive()
    st = os.stat(segment.log_path)
    assert st.st_size == segment.size and st.st_blocks * 512 < segment.size + 64 * 1024
    segment.close()


def test_append_skips_before_write_only_when_it_would_do_nothing(tmp_path: Path) -> None:
    """``append`` calls ``BlockReserve.before_write`` only for a write of PREALLOCATE_MIN_WRITE or
    more (a call saved per Produce): the reservation it leaves equals one fed every write, for
    writes just below, at and above that size."""
    from exactly.storage.file_write import BlockReserve

    overhead = len(make_batch(1, value_size=PREALLOCATE_MIN_WRITE)) - PREALLOCATE_MIN_WRITE
    at = make_batch(1, value_size=PREALLOCATE_MIN_WRITE - overhead)
    below = make_batch(1, value_size=PREALLOCATE_MIN_WRITE - overhead - 1)
    assert len(at) == PREALLOCATE_MIN_WRITE and len(below) == PREALLOCATE_MIN_WRITE - 1
    segment = new_segment(tmp_path, interval=1 << 30)
    reference = BlockReserve()
    for batch in (
        make_batch(3, value_size=40),
        below,
        at,
        below,
        make_batch(1, value_size=2 * PREALLOCATE_AHEAD),
    ):
        patch_base_offset(batch, 0, segment.next_offset)
        position = segment.size
        reference.before_write(segment._fd, position, len(batch))
        segment.append(batch, BatchHeader.parse(batch))
        assert segment._reserve._upto == reference._upto, len(batch)
    assert reference._upto != 0  # the at-size write did reserve (or the file system refused: -1)
    segment.close()
