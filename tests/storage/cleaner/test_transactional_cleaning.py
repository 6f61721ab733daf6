"""Cleaning with transactions: Kafka's transactional LogCleanerTest cases.

Notation as in Kafka's tests: ``P1:[1,2]`` is a transactional batch of producer 1 with keys 1 and
2; ``A1``/``C1`` its abort/commit markers. The log is rolled before each clean."""

from __future__ import annotations

from pathlib import Path

from exactly.records.batch import BatchHeader
from exactly.storage.partition_log import PartitionLog
from exactly.storage.producer_state import ProducerStateError
from tests.storage.cleaner.helpers import (
    COMPACT,
    NOW,
    TxnProducer,
    aborted,
    append_keyed,
    batches,
    keys_in,
    last_offsets_per_batch,
    offsets_in,
    open_compacted,
    run_clean,
    two_pass_clean,
)

LATER = NOW + COMPACT.delete_retention_ms + 1


def test_basic_transaction_aware_cleaning(tmp_path: Path) -> None:
    log = open_compacted(tmp_path)
    p1, p2 = TxnProducer(log, 1), TxnProducer(log, 2)
    p1([1, 2])
    p2([2, 3])
    p1([3, 4])
    p1.abort()
    p2.commit()
    p1([2])
    p1.commit()
    aborted_before = aborted(log)
    log.roll(NOW)
    run_clean(log)
    assert keys_in(log) == [3, 2]
    assert offsets_in(log) == [3, 6, 7, 8, 9]
    assert aborted(log) == aborted_before == [(1, 0, 6)]
    log.close()


def test_clean_with_transactions_spanning_segments(tmp_path: Path) -> None:
    log = open_compacted(tmp_path)
    p1, p2, p3 = TxnProducer(log, 1), TxnProducer(log, 2), TxnProducer(log, 3)
    p1([1, 2])
    p3([2, 3])
    p2([3, 4])
    log.roll(NOW)
    p2([5, 6])
    p3([6, 7])
    p1([7, 8])
    p2.abort()
    p3([8, 9])
    p3.commit()
    p1([9, 10])
    p1.abort()
    # Only the first segment is cleanable (the second is active).
    end, _ = run_clean(log)
    assert keys_in(log) == [2, 3, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10]
    log.roll(NOW)
    p2([11])  # new transactions: the LSO is in the new active segment
    p1([12])
    run_clean(log, first_dirty=end)
    assert keys_in(log) == [2, 3, 6, 7, 8, 9, 11, 12]
    log.close()


def test_commit_marker_removal(tmp_path: Path) -> None:
    log = open_compacted(tmp_path)
    p = TxnProducer(log, 1)
    p([1])
    p([2, 3])
    p.commit()  # 3
    p([2])
    p.commit()  # 5
    log.roll(NOW)
    # The marker cannot go in this pass: its transaction still has records.
    end, _ = run_clean(log)
    assert keys_in(log) == [1, 3, 2]
    assert offsets_in(log) == [0, 2, 3, 4, 5]
    p([1, 3])
    p.commit()  # 8
    log.roll(NOW)
    # The first transaction's data is superseded; its marker (offset 3) gets a horizon, not removed.
    end, _ = run_clean(log, first_dirty=end)
    assert keys_in(log) == [2, 1, 3]
    assert offsets_in(log) == [3, 4, 5, 6, 7, 8]
    # A full pass at the same time: the marker, now without data, gets its horizon only.
    run_clean(log)
    assert offsets_in(log) == [3, 4, 5, 6, 7, 8]
    run_clean(log, now_ms=LATER)
    assert keys_in(log) == [2, 1, 3]
    assert offsets_in(log) == [4, 5, 6, 7, 8]
    log.close()


def test_abort_marker_removal(tmp_path: Path) -> None:
    log = open_compacted(tmp_path)
    p = TxnProducer(log, 1)
    p([1])
    p([2, 3])
    p.abort()
    p([3])
    p.commit()
    log.roll(NOW)
    run_clean(log)
    # Aborted data is gone; the abort marker stays (this pass saw data of its transaction).
    assert keys_in(log) == [3]
    assert offsets_in(log) == [3, 4, 5]
    # The next passes: the marker is eligible, gets a horizon, and goes after it.
    two_pass_clean(log)
    assert offsets_in(log) == [4, 5]
    assert aborted(log) == []
    log.close()


def test_abort_marker_retention_with_empty_batch(tmp_path: Path) -> None:
    log = open_compacted(tmp_path)
    p = TxnProducer(log, 1)
    p([2, 3])  # offsets 0-1
    p.abort()  # 2
    log.roll(NOW)
    for _ in range(2):
        run_clean(log)
        # The aborted batch is the producer's last data: kept empty; its marker kept.
        assert keys_in(log) == []
        assert offsets_in(log) == [2]
        assert last_offsets_per_batch(log) == [1, 2]
        assert aborted(log) == [(1, 0, 2)]
    # A new append of the producer lets the empty batch go.
    p([1])  # 3
    p.commit()  # 4
    log.roll(NOW)
    run_clean(log)
    assert keys_in(log) == [1]
    assert offsets_in(log) == [2, 3, 4]  # the abort marker stays: this pass read the empty batch
    assert last_offsets_per_batch(log) == [2, 3, 4]  # but the empty batch is gone
    assert aborted(log) == [(1, 0, 2)]
    # The next pass gives the marker its horizon, the one after it removes it with its index entry.
    two_pass_clean(log)
    assert keys_in(log) == [1]
    assert offsets_in(log) == [3, 4]
    assert last_offsets_per_batch(log) == [3, 4]
    assert aborted(log) == []
    log.close()


def test_commit_marker_retention_with_empty_batch(tmp_path: Path) -> None:
    log = open_compacted(tmp_path)
    p1, p2 = TxnProducer(log, 1), TxnProducer(log, 2)
    p1([2, 3])  # 0, 1
    log.roll(NOW)
    p2([2, 3])  # 2, 3
    p2.commit()  # 4
    log.roll(NOW)
    append_keyed(log, [(2, 2)])  # 5
    append_keyed(log, [(3, 3)])  # 6
    p1.commit()  # 7
    log.roll(NOW)
    for _ in range(2):
        run_clean(log)
        assert keys_in(log) == [2, 3]
        assert offsets_in(log) == [4, 5, 6, 7]
        assert last_offsets_per_batch(log) == [1, 3, 4, 5, 6, 7]
    p2([1])  # 8
    p2.commit()  # 9
    log.roll(NOW)
    run_clean(log)
    # Producer 2's empty batch goes; its commit marker has no horizon yet.
    assert keys_in(log) == [2, 3, 1]
    assert offsets_in(log) == [4, 5, 6, 7, 8, 9]
    assert last_offsets_per_batch(log) == [1, 4, 5, 6, 7, 8, 9]
    two_pass_clean(log)
    assert keys_in(log) == [2, 3, 1]
    assert offsets_in(log) == [5, 6, 7, 8, 9]
    assert last_offsets_per_batch(log) == [1, 5, 6, 7, 8, 9]
    log.close()


def test_clean_empty_control_batch(tmp_path: Path) -> None:
    # A commit with no data of its transaction in the log: the marker is the producer's last
    # entry (epoch), so it stays as an empty control batch and re-cleans without error.
    log = open_compacted(tmp_path)
    p = TxnProducer(log, 1)
    p.commit()
    append_keyed(log, [(1, 1)])
    log.roll(NOW)
    run_clean(log, now_ms=NOW)
    run_clean(log, now_ms=LATER)
    assert last_offsets_per_batch(log) == [0, 1]
    assert [h.record_count for h, _ in batches(log)] == [0, 1]
    run_clean(log, now_ms=LATER * 2)
    assert last_offsets_per_batch(log) == [0, 1]
    log.close()


def test_aborted_transaction_spanning_segments_keeps_empty_batch_and_marker(tmp_path: Path) -> None:
    log = open_compacted(tmp_path)
    p = TxnProducer(log, 1)
    p([1])
    log.roll(NOW)
    p.abort()
    log.roll(NOW)
    for now in (NOW, LATER, 2 * LATER):
        run_clean(log, now_ms=now)
        assert offsets_in(log) == [1]  # the marker
        assert last_offsets_per_batch(log) == [0, 1]  # and the emptied data batch
    log.close()


def test_committed_transaction_spanning_segments(tmp_path: Path) -> None:
    log = open_compacted(tmp_path)
    p = TxnProducer(log, 1)
    p([1])
    log.roll(NOW)
    p.commit()
    log.roll(NOW)
    run_clean(log)
    run_clean(log, now_ms=LATER)
    assert offsets_in(log) == [0, 1]
    assert keys_in(log) == [1]
    log.close()


def test_log_cleaner_retains_producer_last_sequence(tmp_path: Path) -> None:
    log = open_compacted(tmp_path)
    p1 = TxnProducer(log, 1, transactional=False)
    p2 = TxnProducer(log, 2, transactional=False)
    p3 = TxnProducer(log, 3, transactional=False)
    p1([(0, 0), (1, 1)])  # 0-1
    p2([(0, 2), (1, 3)])  # 2-3, supersedes producer 1's keys
    p3([(2, 4)])  # 4
    append_keyed(log, [(2, 5)])  # 5, supersedes producer 3's key
    log.roll(NOW)
    run_clean(log)
    assert last_offsets_per_batch(log) == [1, 3, 4, 5]
    assert {pid: e.last_seq for pid, e in log.producers().items()} == {1: 1, 2: 1, 3: 0}
    assert offsets_in(log) == [2, 3, 5]
    log.close()


def test_retains_last_sequence_even_if_transaction_aborted(tmp_path: Path) -> None:
    log = open_compacted(tmp_path)
    p = TxnProducer(log, 1)
    p([1, 2])
    p.abort()
    append_keyed(log, [(3, 3)])
    log.roll(NOW)
    run_clean(log)
    assert last_offsets_per_batch(log) == [1, 2, 3]
    assert keys_in(log) == [3]
    log.close()


def _reopen(log: PartitionLog, tmp_path: Path, *, keep_snapshots: bool) -> PartitionLog:
    log.close()
    if not keep_snapshots:
        for snap in tmp_path.glob("*.snapshot"):
            snap.unlink()
    return open_compacted(tmp_path)


def test_duplicate_check_after_cleaning(tmp_path: Path) -> None:
    # Kafka's testDuplicateCheckAfterCleaning: after a clean and a reload (without producer
    # snapshots: correctness must not depend on them), a resent batch is a duplicate with its
    # original offsets, even though its records were cleaned away.
    from exactly.records.builder import Record, build_batch

    log = open_compacted(tmp_path)
    p = TxnProducer(log, 1, transactional=False)
    first = p([(1, 1), (2, 2)])
    append_keyed(log, [(1, 0), (2, 0)])
    log.roll(NOW)
    run_clean(log)
    assert keys_in(log) == [1, 2] and offsets_in(log) == [2, 3]
    log = _reopen(log, tmp_path, keep_snapshots=False)
    p.log = log
    resend = bytearray(
        build_batch(
            [Record(key=b"1", value=b"1"), Record(key=b"2", value=b"2")],
            producer_id=1,
            producer_epoch=0,
            base_sequence=0,
            base_timestamp=NOW,
        )
    )
    result = log.append(resend, BatchHeader.parse(resend), leader_epoch=0, now_ms=NOW)
    assert result.duplicate and (result.first_offset, result.last_offset) == (
        first.first_offset,
        first.last_offset,
    )
    # And the next sequence continues where the cleaned batch left it.
    assert p([(3, 3)]).first_offset == 4
    log.close()


def test_producer_epoch_fencing_survives_cleaning_and_reload(tmp_path: Path) -> None:
    # The producer's last entry is a marker with a bumped epoch: that control batch is kept.
    log = open_compacted(tmp_path)
    old = TxnProducer(log, 1, epoch=0)
    old([1])
    old.commit()
    new = TxnProducer(log, 1, epoch=1)
    new.commit()  # an epoch bump seen only through a marker
    append_keyed(log, [(1, 9)])
    log.roll(NOW)
    run_clean(log)
    run_clean(log, now_ms=LATER)
    log = _reopen(log, tmp_path, keep_snapshots=False)
    old.log = log
    assert log.producers()[1].producer_epoch == 1
    try:
        old([2])
        raise AssertionError("a fenced epoch must be refused")
    except ProducerStateError:
        pass
    log.close()


def test_undecided_transaction_is_not_cleaned(tmp_path: Path) -> None:
    log = open_compacted(tmp_path)
    p = TxnProducer(log, 1)
    append_keyed(log, [(1, 0)])
    p([1, 2])  # open transaction from offset 1
    log.roll(NOW)
    append_keyed(log, [(1, 5)])
    log.roll(NOW)
    end, _ = run_clean(log)
    assert end <= 1  # never past the LSO
    assert offsets_in(log) == [0, 1, 2, 3]
    p.abort()
    log.roll(NOW)
    run_clean(log)
    assert keys_in(log) == [1]
    assert offsets_in(log) == [3, 4]
    log.close()


def test_cleaning_with_keys_conflicting_with_txn_marker_keys(tmp_path: Path) -> None:
    # A data key equal to the COMMIT control key must not confuse cleaning.
    import struct

    from exactly.records.builder import Record, build_batch

    log = open_compacted(tmp_path)
    commit_key = struct.pack(">hh", 0, 1)
    p = TxnProducer(log, 1)
    raw = bytearray(
        build_batch(
            [Record(key=commit_key, value=b"data")],
            producer_id=1,
            producer_epoch=0,
            base_sequence=0,
            transactional=True,
            base_timestamp=NOW,
        )
    )
    log.append(raw, BatchHeader.parse(raw), leader_epoch=0, now_ms=NOW)
    log.update_high_watermark(log.log_end_offset)
    p.seq = 1
    p.abort()
    raw2 = bytearray(build_batch([Record(key=commit_key, value=b"kept")], base_timestamp=NOW))
    log.append(raw2, BatchHeader.parse(raw2), leader_epoch=0, now_ms=NOW)
    log.update_high_watermark(log.log_end_offset)
    log.roll(NOW)
    run_clean(log)
    values = [r.value for h, rs in batches(log) if not h.is_control for r in rs]
    assert values == [b"kept"]
    log.close()


def test_multi_pass_with_aborted_transactions_keeps_the_aborted_index_exact(tmp_path: Path) -> None:
    log = open_compacted(tmp_path)
    p1, p2 = TxnProducer(log, 1), TxnProducer(log, 2)
    p1([1, 2])
    p2([3, 4])
    p1([5, 6])
    p1.abort()
    p2.commit()
    for i in range(10):
        append_keyed(log, [(i % 3 + 10, i)])
    log.roll(NOW)
    end = 0
    while end < log.segments[-1].base_offset:
        end, _ = run_clean(log, first_dirty=end, map_entries=2)
    assert aborted(log) == [(1, 0, 6)]
    assert set(keys_in(log)) == {3, 4, 10, 11, 12}
    log.close()
