from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from exactly.records.batch import TIMESTAMP_TYPE_MASK, BatchHeader, InvalidRecordError
from exactly.storage.config import LogConfig
from exactly.storage.leader_epoch import LEADER_EPOCH_CHECKPOINT, EpochEndOffset
from exactly.storage.log_read import AbortedTxn, OffsetOutOfRangeError
from exactly.storage.producer_state import ProducerStateError
from tests.storage.helpers import (
    NOW,
    append,
    append_marker,
    headers_of,
    make_batch,
    open_log,
    read_all,
    values_of,
)


def test_append_assigns_offsets_and_read_returns_them(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    assert (log.log_start_offset, log.log_end_offset, log.high_watermark) == (0, 0, 0)
    r1 = append(log, 3, tag=b"a")
    r2 = append(log, 2, tag=b"b")
    assert (r1.first_offset, r1.last_offset, r2.first_offset, r2.last_offset) == (0, 2, 3, 4)
    assert not r1.duplicate and r1.log_append_time == -1
    assert log.log_end_offset == 5
    result = log.read(0, 1 << 20, read_committed=False)
    assert [h.base_offset for h in headers_of(result.records)] == [0, 3]
    assert values_of(result.records)[3].startswith(b"b0")  # type: ignore[union-attr]
    assert result.high_watermark == 5 and result.aborted_transactions is None
    # A fetch inside a batch returns the whole batch containing it.
    assert [h.base_offset for h in headers_of(log.read(4, 1 << 20, read_committed=False).records)] == [3]
    assert log.read(5, 1 << 20, read_committed=False).records == b""
    with pytest.raises(OffsetOutOfRangeError):
        log.read(6, 100, read_committed=False)
    log.close()


def test_read_is_bounded_by_high_watermark(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    append(log, 2)
    append(log, 2, advance_hw=False)
    assert log.high_watermark == 2 and log.log_end_offset == 4
    assert [h.base_offset for h in headers_of(log.read(0, 1 << 20, read_committed=False).records)] == [0]
    assert log.read(2, 1 << 20, read_committed=False).records == b""
    log.update_high_watermark(100)  # clamped to the log end
    assert log.high_watermark == 4
    log.close()


def test_max_bytes_and_min_one_batch(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    sizes = [append(log, 5, value_size=100) for _ in range(4)]
    assert len(sizes) == 4
    one = len(make_batch(5, value_size=100))
    full = log.read(0, 1 << 20, read_committed=False).records
    assert len(full) == 4 * one
    assert len(log.read(0, 2 * one + 10, read_committed=False).records) == 2 * one
    assert len(log.read(0, one // 2, read_committed=False).records) == one  # at least one batch
    assert log.read(0, one // 2, read_committed=False, min_one_batch=False).records == b""
    assert len(log.read(0, 0, read_committed=False).records) == one
    log.close()


def test_message_too_large(tmp_path: Path) -> None:
    log = open_log(tmp_path, LogConfig(max_message_bytes=200))
    with pytest.raises(InvalidRecordError) as info:
        append(log, 5, value_size=100)
    assert info.value.error_code == ErrorCode.message_too_large
    assert log.log_end_offset == 0 and log.segments[-1].size == 0
    log.close()


def test_roll_by_size_keeps_offsets_contiguous(tmp_path: Path) -> None:
    one = len(make_batch(4, value_size=50))
    log = open_log(tmp_path, LogConfig(segment_bytes=3 * one, index_interval_bytes=64))
    for _ in range(10):
        append(log, 4, value_size=50)
    bases = [s.base_offset for s in log.segments]
    assert bases == [0, 12, 24, 36]
    assert all(s.size <= 3 * one for s in log.segments)
    assert [h.base_offset for h in read_all(log)] == list(range(0, 40, 4))
    # A roll snapshots producer state at the new segment's base offset.
    assert sorted(p.name for p in tmp_path.glob("*.snapshot")) == [f"{o:020d}.snapshot" for o in (12, 24, 36)]
    log.close()


def test_roll_by_age(tmp_path: Path) -> None:
    log = open_log(tmp_path, LogConfig(segment_ms=1000))
    append(log, 1, timestamp=NOW, now_ms=NOW)
    append(log, 1, timestamp=NOW + 500, now_ms=NOW + 500)
    assert len(log.segments) == 1
    log.maybe_roll(NOW + 900)
    assert len(log.segments) == 1
    append(log, 1, timestamp=NOW + 1500, now_ms=NOW + 1500)  # first batch is 1500 ms old: roll
    assert [s.base_offset for s in log.segments] == [0, 2]
    log.maybe_roll(NOW + 2600)  # idle partitions roll from maintenance
    assert [s.base_offset for s in log.segments] == [0, 2, 3]
    log.maybe_roll(NOW + 9000)  # an empty active segment never rolls
    assert len(log.segments) == 3
    log.close()


def test_retention_by_size_never_deletes_the_active_segment(tmp_path: Path) -> None:
    one = len(make_batch(1, value_size=100))
    log = open_log(tmp_path, LogConfig(segment_bytes=2 * one, retention_bytes=3 * one))
    for _ in range(9):
        append(log, 1, value_size=100)
    assert [s.base_offset for s in log.segments] == [0, 2, 4, 6, 8]
    assert log.apply_retention(NOW) == 3  # 9 batches -> keep <= 3 batches' worth
    assert [s.base_offset for s in log.segments] == [6, 8]
    assert log.log_start_offset == 6
    with pytest.raises(OffsetOutOfRangeError):
        log.read(5, 1000, read_committed=False)
    assert [h.base_offset for h in read_all(log)] == [6, 7, 8]
    assert not list(tmp_path.glob("00000000000000000000.*"))
    assert min(int(p.stem) for p in tmp_path.glob("*.snapshot")) >= 6
    log_zero = open_log(tmp_path / "other", LogConfig(segment_bytes=one, retention_bytes=0))
    append(log_zero, 1, value_size=100)
    assert log_zero.apply_retention(NOW) == 0  # only the active segment: kept
    log_zero.close()
    log.close()


def test_retention_by_age(tmp_path: Path) -> None:
    one = len(make_batch(1))
    log = open_log(tmp_path, LogConfig(segment_bytes=one, retention_ms=10_000))
    for i in range(4):
        append(log, 1, timestamp=NOW + i * 5000)
    assert len(log.segments) == 4
    assert log.apply_retention(NOW + 12_000) == 1  # only the segment with timestamp NOW is > 10 s old
    assert log.log_start_offset == 1
    assert log.apply_retention(NOW + 100_000) == 2  # the active one stays
    assert [s.base_offset for s in log.segments] == [3]
    log.close()
    compacted = open_log(
        tmp_path / "c", LogConfig(segment_bytes=one, retention_ms=0, cleanup_policy="compact")
    )
    append(compacted, 1)
    append(compacted, 1)
    assert compacted.apply_retention(NOW + 100_000) == 0
    compacted.close()


def test_offset_for_timestamp_across_segments(tmp_path: Path) -> None:
    one = len(make_batch(2, value_size=30))
    log = open_log(tmp_path, LogConfig(segment_bytes=3 * one, index_interval_bytes=32))
    for i in range(10):
        append(log, 2, value_size=30, timestamp=1000 + 10 * i)
    assert len(log.segments) > 2
    assert log.offset_for_timestamp(0) == (0, 1000)
    assert log.offset_for_timestamp(1000) == (0, 1000)
    assert log.offset_for_timestamp(1001) == (2, 1010)
    assert log.offset_for_timestamp(1055) == (12, 1060)
    assert log.offset_for_timestamp(1090) == (18, 1090)
    assert log.offset_for_timestamp(1091) is None
    log.close()


def test_duplicate_batch_returns_original_offsets_and_writes_nothing(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    first = append(log, 3, producer_id=7, epoch=0, seq=0)
    append(log, 2, producer_id=7, epoch=0, seq=3)
    size = log.segments[-1].size
    again = append(log, 3, producer_id=7, epoch=0, seq=0)
    assert again.duplicate and (again.first_offset, again.last_offset) == (
        first.first_offset,
        first.last_offset,
    )
    assert log.log_end_offset == 5 and log.segments[-1].size == size
    with pytest.raises(ProducerStateError) as info:
        append(log, 1, producer_id=7, epoch=0, seq=9)
    assert info.value.error_code == ErrorCode.out_of_order_sequence_number
    assert log.log_end_offset == 5 and log.segments[-1].size == size
    assert log.producers()[7].last_seq == 4
    log.close()


def test_open_transaction_holds_back_lso_and_abort_is_indexed(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    append(log, 2)  # 0-1 plain
    append(log, 2, producer_id=1, epoch=0, seq=0, transactional=True)  # 2-3 txn A
    append(log, 1)  # 4 plain
    append(log, 2, producer_id=2, epoch=0, seq=0, transactional=True)  # 5-6 txn B
    assert log.high_watermark == 7 and log.last_stable_offset == 2
    committed = log.read(0, 1 << 20, read_committed=True)
    assert [h.base_offset for h in headers_of(committed.records)] == [0]
    assert committed.last_stable_offset == 2 and committed.aborted_transactions == ()
    assert [h.base_offset for h in read_all(log)] == [0, 2, 4, 5]  # read_uncommitted sees all

    append_marker(log, 1, 0, abort=True)  # 7: abort A
    assert log.last_stable_offset == 5  # B still open
    result = log.read(0, 1 << 20, read_committed=True)
    assert [h.base_offset for h in headers_of(result.records)] == [0, 2, 4]
    assert result.aborted_transactions == (AbortedTxn(1, 2),)
    entries = log.segments[-1].txn_index.entries
    assert [(e.producer_id, e.first_offset, e.last_offset, e.last_stable_offset) for e in entries] == [
        (1, 2, 7, 5)
    ]

    append_marker(log, 2, 0, abort=False)  # 8: commit B
    assert log.last_stable_offset == 9
    all_committed = read_all(log, read_committed=True)
    assert [h.base_offset for h in all_committed] == [0, 2, 4, 5, 7, 8]
    # A fetch starting after the abort marker does not report it.
    assert log.read(8, 1 << 20, read_committed=True).aborted_transactions == ()
    assert log.read(3, 1 << 20, read_committed=True).aborted_transactions == (AbortedTxn(1, 2),)
    log.close()


def test_log_append_time(tmp_path: Path) -> None:
    log = open_log(tmp_path, LogConfig(message_timestamp_type="LogAppendTime"))
    result = append(log, 2, timestamp=5, now_ms=NOW + 42)
    assert result.log_append_time == NOW + 42
    (header,) = headers_of(log.read(0, 1 << 20, read_committed=False).records)  # CRC still valid
    assert header.max_timestamp == NOW + 42 and header.attributes & TIMESTAMP_TYPE_MASK
    log.close()


def test_leader_epoch_is_patched_and_checkpointed(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    append(log, 1, leader_epoch=0)
    append(log, 2, leader_epoch=3)
    append(log, 1, leader_epoch=3)
    headers = read_all(log)
    assert [h.partition_leader_epoch for h in headers] == [0, 3, 3]
    assert (tmp_path / LEADER_EPOCH_CHECKPOINT).read_text().split("\n")[:4] == ["0", "2", "0 0", "3 1"]
    assert log.leader_epochs.end_offset_for(0, log.log_end_offset) == EpochEndOffset(0, 1)
    log.close()


def test_flush_messages_advances_recovery_point(tmp_path: Path) -> None:
    log = open_log(tmp_path, LogConfig(flush_messages=3))
    append(log, 2)
    assert log.recovery_point == 0
    append(log, 2)
    assert log.recovery_point == 4
    append(log, 1)
    assert log.recovery_point == 4
    assert not log.maybe_flush(NOW)  # flush.ms defaults to "never"
    log.flush()
    assert log.recovery_point == 5
    log.close()


def test_flush_ms_and_flush_rolled_segments(tmp_path: Path) -> None:
    one = len(make_batch(1))
    log = open_log(tmp_path, LogConfig(flush_ms=1000, segment_bytes=2 * one))
    for _ in range(5):
        append(log, 1)
    assert log.recovery_point == 0
    log.flush_rolled_segments()
    assert log.recovery_point == log.segments[-1].base_offset == 4
    assert not log.maybe_flush(NOW + 999)
    assert log.maybe_flush(NOW + 1000)
    assert log.recovery_point == 5
    log.close()


def test_append_batch_at_nonzero_position(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    batch = make_batch(2)
    buffer = bytearray(b"xxxx") + batch
    header = BatchHeader.parse(buffer, 4)
    result = log.append(buffer, header, leader_epoch=0, now_ms=NOW)
    log.update_high_watermark(log.log_end_offset)
    assert result.first_offset == 0
    (stored,) = headers_of(log.read(0, 1000, read_committed=False).records)
    assert stored.record_count == 2
    log.close()


def test_delete_removes_directory(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p")
    append(log, 1)
    log.delete()
    assert not (tmp_path / "p").exists()


def test_roll_by_age_follows_batch_timestamps_not_the_wall_clock(tmp_path: Path) -> None:
    log = open_log(tmp_path, LogConfig(segment_ms=1000))
    old = NOW - 10 * 86_400_000  # replaying ten-day-old data
    for i in range(5):
        append(log, 1, timestamp=old + i * 100, now_ms=NOW + i)
    assert len(log.segments) == 1  # the data spans 400 ms: no roll although it is old
    append(log, 1, timestamp=old + 1200, now_ms=NOW + 5)
    assert [s.base_offset for s in log.segments] == [0, 5]
    log.close()


def test_aborted_transactions_found_in_later_segments(tmp_path: Path) -> None:
    one = len(make_batch(1, value_size=100))
    log = open_log(tmp_path, LogConfig(segment_bytes=2 * one))
    append(log, 1, value_size=100, producer_id=1, epoch=0, seq=0, transactional=True)  # 0
    append(log, 1, value_size=100)  # 1
    append(log, 1, value_size=100, producer_id=2, epoch=0, seq=0, transactional=True)  # 2
    append(log, 1, value_size=100)  # 3
    append_marker(log, 1, 0, abort=True)  # 4
    append(log, 1, value_size=100)  # 5
    append_marker(log, 2, 0, abort=True)  # 6
    append(log, 1, value_size=100, producer_id=3, epoch=0, seq=0, transactional=True)  # 7
    append_marker(log, 3, 0, abort=True)  # 8
    assert len(log.segments) >= 4
    assert log.last_stable_offset == 9
    first = log.read(0, 1 << 20, read_committed=True)  # one segment: offsets 0-1
    assert [h.base_offset for h in headers_of(first.records)] == [0, 1]
    # Only txn 1 overlaps [0, 2): txn 2 starts at 2, txn 3 later still.
    assert first.aborted_transactions == (AbortedTxn(1, 0),)
    second = log.read(2, 1 << 20, read_committed=True)
    assert [h.base_offset for h in headers_of(second.records)] == [2, 3]
    assert second.aborted_transactions == (AbortedTxn(1, 0), AbortedTxn(2, 2))
    last = log.read(7, 1 << 20, read_committed=True)
    assert last.aborted_transactions == (AbortedTxn(3, 7),)
    # With the HW below the first unstable offset, the LSO is the HW.
    append(log, 1, value_size=100, producer_id=4, epoch=0, seq=0, transactional=True, advance_hw=False)
    assert log.last_stable_offset == log.high_watermark == 9
    log.close()


def test_full_offset_index_rolls_the_segment(tmp_path: Path) -> None:
    # 24 bytes: 3 offset-index entries (and 2 time-index entries; equal timestamps need only 1).
    log = open_log(tmp_path, LogConfig(segment_index_bytes=24, index_interval_bytes=1))
    for _ in range(10):
        append(log, 1)
    assert [s.base_offset for s in log.segments] == [0, 4, 8]
    assert [len(s.offset_index) for s in log.segments[:-1]] == [3, 3]
    assert [h.base_offset for h in read_all(log)] == list(range(10))
    log.close()


def test_log_start_offset_and_closed_are_plain_attributes_that_follow_the_log(tmp_path: Path) -> None:
    """``log_start_offset`` and ``closed`` are attributes (the fast paths read them per request),
    kept by the log itself: DeleteRecords and retention move the start, a reopen restores it,
    ``close`` and ``delete`` set ``closed``."""
    log = open_log(tmp_path / "a", LogConfig(segment_bytes=400, retention_bytes=-1))
    assert "log_start_offset" in vars(log) and "closed" in vars(log)
    for _ in range(6):
        append(log, 2, value_size=100)
    assert log.log_start_offset == 0 and not log.closed
    assert log.increment_log_start_offset(3)
    assert log.log_start_offset == 3
    assert log.read(3, 1 << 20, read_committed=False).log_start_offset == 3
    with pytest.raises(OffsetOutOfRangeError):
        log.read(2, 1 << 20, read_committed=False)
    log.close()
    assert log.closed
    reopened = type(log).open(
        tmp_path / "a", log.tp, LogConfig(segment_bytes=400), recovery_point=0, now_ms=NOW, log_start_offset=3
    )
    assert reopened.log_start_offset == 3 and not reopened.closed
    reopened.delete()
    assert reopened.closed


def test_high_watermark_is_a_plain_attribute_that_follows_the_log(tmp_path: Path) -> None:
    """``high_watermark`` is an attribute (the fast paths read it per request), kept by the log:
    a single broker's plain append moves it to the log end, ``update_high_watermark`` clamps it
    to [log start, log end], a truncation below it and a log start past it move it, a reopen
    with a checkpointed one restores it."""
    log = open_log(tmp_path / "a", LogConfig(segment_bytes=400, retention_bytes=-1))
    assert "high_watermark" in vars(log)
    batch = make_batch(2, value_size=50)
    header = BatchHeader.parse(batch)
    fields = dataclasses.astuple(header)[:13]  # the 13 fields the Produce fast path unpacks
    assert log.append_plain(batch, fields, NOW) == 0
    assert log.high_watermark == log.log_end_offset == 2
    for _ in range(4):
        append(log, 2, value_size=100, advance_hw=False)
    assert log.high_watermark == 2 and log.log_end_offset == 10
    log.update_high_watermark(99)
    assert log.high_watermark == 10
    log.update_high_watermark(8)
    assert log.high_watermark == 8 and log.read(0, 1 << 20, read_committed=False).high_watermark == 8
    log.truncate_to(6)
    assert log.high_watermark == 6
    log.update_high_watermark(3)
    assert log.increment_log_start_offset(3)
    append(log, 1, value_size=10, advance_hw=False)
    log.update_high_watermark(2)  # clamped to the log start
    assert log.high_watermark == 3
    log.close()
    reopened = type(log).open(
        tmp_path / "a",
        log.tp,
        LogConfig(segment_bytes=400),
        recovery_point=0,
        now_ms=NOW,
        log_start_offset=3,
        high_watermark=5,
    )
    assert reopened.high_watermark == 5
    reopened.close()
