from __future__ import annotations

from pathlib import Path

from exactly.storage.index import OFFSET_ENTRY, OffsetIndex, TimeIndex
from exactly.storage.txn_index import AbortedTxnEntry, TransactionIndex


def test_offset_index_lookup_and_reload(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000100.index"
    index = OffsetIndex(path, 100, 1000)
    index.reset()
    for i, (offset, position) in enumerate([(110, 500), (120, 1000), (130, 1500)]):
        index.append(offset, position)
        assert len(index) == i + 1
    assert index.lookup(99) == (100, 0)
    assert index.lookup(109) == (100, 0)
    assert index.lookup(110) == (110, 500)
    assert index.lookup(125) == (120, 1000)
    assert index.lookup(10_000) == (130, 1500)
    index.close()
    assert path.stat().st_size == 3 * OFFSET_ENTRY.size

    reloaded = OffsetIndex(path, 100, 1000)
    assert reloaded.load(log_size=2000)
    assert reloaded.lookup(125) == (120, 1000)
    assert reloaded.last_entry() == (130, 1500)

    reloaded.truncate_to_position(1000)
    assert reloaded.last_entry() == (110, 500)
    reloaded.close()
    assert path.stat().st_size == OFFSET_ENTRY.size


def test_offset_index_refuses_non_increasing_entries(tmp_path: Path) -> None:
    index = OffsetIndex(tmp_path / "x.index", 0, 10)
    index.reset()
    index.append(5, 100)
    for offset, position in [(5, 200), (6, 100), (4, 300)]:
        try:
            index.append(offset, position)
        except ValueError:
            pass
        else:
            raise AssertionError(f"accepted ({offset}, {position})")
    index.close()


def test_offset_index_corruption_is_detected(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000000.index"
    assert not OffsetIndex(path, 0, 10).quick_check()  # missing
    assert not OffsetIndex(path, 0, 10).load(100)
    path.write_bytes(OFFSET_ENTRY.pack(1, 10) + b"\x00")  # not a multiple of 8
    assert not OffsetIndex(path, 0, 10).quick_check()
    path.write_bytes(OFFSET_ENTRY.pack(5, 10) + OFFSET_ENTRY.pack(3, 20))  # offsets decrease
    assert OffsetIndex(path, 0, 10).quick_check()
    assert not OffsetIndex(path, 0, 10).load(100)
    path.write_bytes(OFFSET_ENTRY.pack(5, 10) + OFFSET_ENTRY.pack(6, 200))  # points past the log
    assert not OffsetIndex(path, 0, 10).load(100)
    assert OffsetIndex(path, 0, 10).load(300)


def test_offset_index_full(tmp_path: Path) -> None:
    index = OffsetIndex(tmp_path / "x.index", 0, 2)
    index.reset()
    index.append(1, 10)
    assert not index.is_full
    index.append(2, 20)
    assert index.is_full
    index.close()


def _check_full(*indexes: OffsetIndex | TimeIndex) -> None:
    for index in indexes:
        assert index.is_full == (len(index) >= index.max_entries), (index.max_entries, len(index))


def test_is_full_follows_the_entries_through_every_change(tmp_path: Path) -> None:
    """``is_full`` is a plain attribute (the roll check reads it per Produce): after appends,
    truncations, a reset and a load it equals the rule ``len >= max_entries``."""
    for max_entries in (1, 2, 3):
        offsets = OffsetIndex(tmp_path / f"{max_entries}.index", 0, max_entries)
        times = TimeIndex(tmp_path / f"{max_entries}.timeindex", 0, max_entries)

        offsets.reset()
        times.reset()
        _check_full(offsets, times)
        for i in range(1, 4):
            offsets.append(i, 10 * i)
            times.maybe_append(1000 + i, i)
            _check_full(offsets, times)
        offsets.truncate_to_position(20)
        times.truncate_to_offset(2)
        _check_full(offsets, times)
        assert len(offsets) == 1 and len(times) == 1
        offsets.close()
        times.close()
        reopened_offsets = OffsetIndex(tmp_path / f"{max_entries}.index", 0, max_entries)
        reopened_times = TimeIndex(tmp_path / f"{max_entries}.timeindex", 0, max_entries)
        assert not reopened_offsets.is_full and not reopened_times.is_full  # nothing loaded yet
        assert reopened_offsets.load(10**6) and reopened_times.load()
        offsets, times = reopened_offsets, reopened_times
        _check_full(offsets, times)
        assert offsets.is_full == (max_entries == 1)
        offsets.reset()
        times.reset()
        _check_full(offsets, times)
        assert not offsets.is_full and not times.is_full
        offsets.close()
        times.close()


def test_time_index_only_records_new_maxima(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000000.timeindex"
    index = TimeIndex(path, 0, 100)
    index.reset()
    index.maybe_append(1000, 0)
    index.maybe_append(1000, 5)  # not a new maximum
    index.maybe_append(900, 6)
    index.maybe_append(-1, 7)
    index.maybe_append(2000, 10)
    assert len(index) == 2
    # The last entry strictly below the target is a safe place to start scanning.
    assert index.lookup(500) == 0
    assert index.lookup(1000) == 0
    assert index.lookup(1001) == 0
    assert index.lookup(2001) == 10
    index.close()
    reloaded = TimeIndex(path, 0, 100)
    assert reloaded.load()
    assert reloaded.last_entry() == (2000, 10)
    reloaded.truncate_to_offset(10)
    assert reloaded.last_entry() == (1000, 0)
    reloaded.close()
    path.write_bytes(path.read_bytes()[:-3])
    assert not TimeIndex(path, 0, 100).load()


def test_transaction_index_collect_and_reload(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000000.txnindex"
    index = TransactionIndex(path, 0)
    index.append(AbortedTxnEntry(1, 0, 10, 5))
    index.append(AbortedTxnEntry(2, 5, 20, 21))
    index.append(AbortedTxnEntry(3, 30, 40, 41))
    index.close()
    assert path.stat().st_size == 3 * 34

    reloaded = TransactionIndex(path, 0)
    assert reloaded.load()
    found: list[AbortedTxnEntry] = []
    # [11, 21): txn 1 ended at 10 (before), txn 2 overlaps; its LSO 21 >= 21 ends the search.
    assert reloaded.collect(11, 21, found)
    assert [e.producer_id for e in found] == [2]
    found.clear()
    assert not reloaded.collect(0, 100, found)
    assert [e.producer_id for e in found] == [1, 2, 3]

    reloaded.truncate_to(20)
    assert [e.producer_id for e in reloaded.entries] == [1]
    reloaded.close()
    assert path.stat().st_size == 34

    path.write_bytes(b"garbage")
    broken = TransactionIndex(path, 0)
    assert not broken.load()
    assert broken.entries == []
    assert not path.exists()
