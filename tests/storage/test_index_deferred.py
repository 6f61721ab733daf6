"""Deferred index writes (``storage.index``): entries reach the files at flush, roll, close or
when ``MAX_PENDING`` gather, and recovery after a crash that lost pending entries rebuilds the
indexes the log implies (the same entries a clean close leaves)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from exactly.records.batch import BatchHeader
from exactly.storage.config import LogConfig
from exactly.storage.index import MAX_PENDING, OFFSET_ENTRY, TIME_ENTRY, OffsetIndex, TimeIndex
from exactly.storage.partition_log import PartitionLog
from tests.storage.helpers import NOW, append, crash, headers_of, make_batch, open_log, read_all

ONE = len(make_batch(2, value_size=100))
HEADER_FIELDS = struct.Struct(">qiibIhiqqqhii")  # what the Produce fast path hands append_plain


def test_offset_entries_stay_pending_until_written(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000100.index"
    index = OffsetIndex(path, 100, 10_000)
    index.reset()
    index.append(110, 500)
    index.append(120, 1000)
    assert index.pending == 2 and path.stat().st_size == 0
    assert index.lookup(125) == (120, 1000)  # lookups see pending entries
    index.write_pending()
    assert index.pending == 0
    assert path.read_bytes() == OFFSET_ENTRY.pack(10, 500) + OFFSET_ENTRY.pack(20, 1000)
    index.append(130, 1500)
    index.flush()
    assert path.stat().st_size == 3 * OFFSET_ENTRY.size
    index.append(140, 2000)
    index.close()
    reloaded = OffsetIndex(path, 100, 10_000)
    assert reloaded.load(log_size=3000)
    assert reloaded.last_entry() == (140, 2000) and reloaded.pending == 0


def test_time_entries_stay_pending_until_written(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000000.timeindex"
    index = TimeIndex(path, 0, 10_000)
    index.reset()
    index.maybe_append(1000, 0)
    index.maybe_append(2000, 4)
    assert index.pending == 2 and path.stat().st_size == 0
    index.flush()
    assert path.read_bytes() == TIME_ENTRY.pack(1000, 0) + TIME_ENTRY.pack(2000, 4)
    index.maybe_append(3000, 9)
    index.close()
    reloaded = TimeIndex(path, 0, 10_000)
    assert reloaded.load()
    assert reloaded.last_entry() == (3000, 9) and len(reloaded) == 3


def test_a_bounded_number_of_entries_is_pending(tmp_path: Path) -> None:
    offsets = OffsetIndex(tmp_path / "x.index", 0, 10 * MAX_PENDING)
    times = TimeIndex(tmp_path / "x.timeindex", 0, 10 * MAX_PENDING)
    offsets.reset()
    times.reset()
    for i in range(1, 2 * MAX_PENDING + 11):
        offsets.append(i, 10 * i)
        times.maybe_append(NOW + i, i)
        assert offsets.pending < MAX_PENDING and times.pending < MAX_PENDING
    assert offsets.path.stat().st_size == 2 * MAX_PENDING * OFFSET_ENTRY.size
    assert times.path.stat().st_size == 2 * MAX_PENDING * TIME_ENTRY.size
    offsets.close()
    times.close()


def test_truncation_rewrites_written_and_pending_entries(tmp_path: Path) -> None:
    offsets = OffsetIndex(tmp_path / "x.index", 0, 100)
    times = TimeIndex(tmp_path / "x.timeindex", 0, 100)
    offsets.reset()
    times.reset()
    for i in range(1, 5):
        offsets.append(i, 100 * i)
        times.maybe_append(NOW + i, i)
    offsets.write_pending()
    times.write_pending()
    for i in range(5, 9):
        offsets.append(i, 100 * i)
        times.maybe_append(NOW + i, i)
    offsets.truncate_to_position(600)  # keeps entries 1-5: four written, one pending
    times.truncate_to_offset(6)
    assert offsets.pending == 0 and times.pending == 0
    assert offsets.path.read_bytes() == b"".join(OFFSET_ENTRY.pack(i, 100 * i) for i in range(1, 6))
    assert times.path.read_bytes() == b"".join(TIME_ENTRY.pack(NOW + i, i) for i in range(1, 6))
    offsets.close()
    times.close()


def _fill(log: PartitionLog, batches: int, first_ts: int = NOW) -> list[tuple[int, int]]:
    """(base offset, timestamp) of each batch appended, timestamps rising with a dip every 5th
    batch (so the time index holds only the new maxima)."""
    out = []
    for i in range(batches):
        ts = first_ts + 10 * i - (7 if i % 5 == 4 else 0)
        out.append((append(log, 2, value_size=100, timestamp=ts).first_offset, ts))
    return out


def _index_files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.glob("*index"))}


def _check_reads(log: PartitionLog, appended: list[tuple[int, int]]) -> None:
    """Every offset through the offset index, every batch's timestamp through the time index."""
    for base, _ts in appended:
        for offset in (base, base + 1):
            (header, *_rest) = headers_of(log.read(offset, 1, read_committed=False).records)
            assert header.base_offset <= offset <= header.last_offset
    best = -1
    for _base, ts in appended:
        # the first batch whose max timestamp is >= ts: nothing earlier reached ts
        expected = next(b for b, t in appended if t >= ts)
        found = log.offset_for_timestamp(ts)
        assert found is not None and found[0] == expected, (ts, found, expected)
        best = max(best, ts)
    assert log.offset_for_timestamp(best + 1) is None


@pytest.mark.parametrize("later", [5, 15], ids=["active-holds-recovery-point", "active-after-it"])
def test_kill_after_unflushed_appends_rebuilds_the_indexes(tmp_path: Path, later: int) -> None:
    """The crash loses pending entries (the index files are shorter than the log implies);
    recovery from the recovery point gives back the indexes a twin log that was never killed
    has after the same appends and a clean close. The active segment is either the one the
    recovery point falls in (recovered from there) or a later one (recovered whole)."""
    config = LogConfig(segment_bytes=12 * ONE, index_interval_bytes=2 * ONE)
    logs = [open_log(tmp_path / name, config) for name in ("twin", "crashed")]
    for log in logs:
        appended = _fill(log, 17)  # a rolled segment, then one the recovery point falls in
        log.flush()
        appended += _fill(log, later, first_ts=NOW + 1000)
    twin, log = logs
    recovery_point = log.recovery_point
    holder = 1 if later == 5 else 2
    assert len(log.segments) == holder + 1
    assert log.segments[1].base_offset < recovery_point < log.segments[1].next_offset
    assert log.segments[-1].offset_index.pending > 0 and log.segments[-1].time_index.pending > 0
    crash(log)
    twin.close()
    expected = _index_files(tmp_path / "twin")
    lost = _index_files(tmp_path / "crashed")
    assert any(len(lost[name]) < len(expected[name]) for name in expected), "nothing was pending"

    reopened = open_log(tmp_path / "crashed", config, recovery_point=recovery_point)
    assert reopened.log_end_offset == appended[-1][0] + 2
    assert [h.base_offset for h in read_all(reopened)] == [base for base, _ts in appended]
    _check_reads(reopened, appended)
    reopened.close()
    assert _index_files(tmp_path / "crashed") == expected


def test_offset_entry_at_the_recovery_point_without_its_time_entry(tmp_path: Path) -> None:
    """An offset-index entry created right after the flush (at the recovery point) may reach the
    file while its time-index companion does not; recovery must not resume from it, or it
    would forget the max timestamp of the batches before it (here the 5000 of the fourth
    batch, which ListOffsets(1000) must then find)."""
    config = LogConfig(segment_bytes=1 << 20, index_interval_bytes=ONE)  # an entry every 2nd batch
    log = open_log(tmp_path, config)
    appended = []
    for ts in (100, 200, 150, 5000):
        appended.append((append(log, 2, value_size=100, timestamp=NOW + ts).first_offset, NOW + ts))
    log.flush()
    recovery_point = log.recovery_point
    for ts in (300, 400, 350, 450):
        appended.append((append(log, 2, value_size=100, timestamp=NOW + ts).first_offset, NOW + ts))
    active = log.segments[-1]
    assert active.offset_index.lookup(recovery_point)[0] == recovery_point  # an entry right there
    assert active.time_index.pending > 0
    active.offset_index.write_pending()  # the offset entry reached the file, the time entry not
    crash(log)
    reopened = open_log(tmp_path, config, recovery_point=recovery_point)
    assert reopened.segments[-1].max_timestamp == NOW + 5000
    assert reopened.offset_for_timestamp(NOW + 1000) == (appended[3][0], NOW + 5000)
    _check_reads(reopened, appended)
    reopened.close()


def test_roll_writes_the_rolled_segments_entries(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes=6 * ONE, index_interval_bytes=ONE)
    log = open_log(tmp_path, config)
    _fill(log, 8)
    first = log.segments[0]
    assert len(log.segments) == 2
    assert first.offset_index.pending == 0 and first.time_index.pending == 0
    assert first.offset_index.path.stat().st_size == len(first.offset_index) * OFFSET_ENTRY.size > 0
    assert first.time_index.path.stat().st_size == len(first.time_index) * TIME_ENTRY.size > 0
    log.flush_rolled_segments()
    assert not first.unflushed
    log.close()


def test_plain_and_generic_appends_leave_the_same_index_files(tmp_path: Path) -> None:
    """The Produce fast path (``append_plain``) and ``append`` index the same way."""
    config = LogConfig(segment_bytes=10 * ONE, index_interval_bytes=ONE)
    generic = open_log(tmp_path / "generic", config)
    plain = open_log(tmp_path / "plain", config)
    for i in range(25):
        ts = NOW + 10 * i - (7 if i % 5 == 4 else 0)
        generic_batch = make_batch(2, value_size=100, timestamp=ts)
        generic.append(generic_batch, BatchHeader.parse(generic_batch), leader_epoch=0, now_ms=NOW)
        plain_batch = make_batch(2, value_size=100, timestamp=ts)
        fields = HEADER_FIELDS.unpack_from(plain_batch, 0)
        assert plain.append_plain(plain_batch, fields, NOW) is not None
    assert [s.base_offset for s in generic.segments] == [s.base_offset for s in plain.segments]
    generic.close()
    plain.close()
    assert _index_files(tmp_path / "generic") == _index_files(tmp_path / "plain")
