"""The cleanable range, the dirty ratio, the choice of log and the cleaner checkpoint (Kafka's
LogCleanerManagerTest)."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

from pytest import MonkeyPatch

from exactly.records.batch import BatchHeader, compute_crc
from exactly.records.builder import Record, build_batch
from exactly.storage.checkpoint import read_offset_checkpoint
from exactly.storage.cleaner import manager as manager_module
from exactly.storage.cleaner.cleaner import Cleaner
from exactly.storage.cleaner.manager import CLEANER_OFFSET_CHECKPOINT, LogCleanerManager, clean_filthiest
from exactly.storage.cleaner.offset_map import OffsetMap
from exactly.storage.config import LogConfig
from exactly.storage.partition_log import PartitionLog
from exactly.types import TopicPartition
from tests.storage.cleaner.helpers import (
    COMPACT,
    NOW,
    TxnProducer,
    append_keyed,
    key_values,
    keys_in,
    offsets_in,
    open_compacted,
)

HOUR = 3_600_000


def open_tp(data_dir: Path, tp: TopicPartition, config: LogConfig = COMPACT) -> PartitionLog:
    return PartitionLog.open(
        data_dir / f"{tp.topic}-{tp.partition}", tp, config, recovery_point=0, now_ms=NOW
    )


def test_undecided_transactional_data_is_not_cleanable(tmp_path: Path) -> None:
    config = dataclasses.replace(COMPACT, min_compaction_lag_ms=HOUR)
    log = open_compacted(tmp_path, config)
    manager = LogCleanerManager(tmp_path)
    p = TxnProducer(log, 15)
    p([1, 2], timestamp=NOW)
    p([3], timestamp=NOW)
    log.roll(NOW)
    now = NOW + HOUR + 1
    # The lag has passed, but the data is undecided.
    state = manager.dirty_state(log, now)
    assert (state.first_dirty_offset, state.first_uncleanable_offset) == (0, 0)
    p.abort(now_ms=now)
    log.roll(now)
    # The first segment is cleanable at once; the marker's segment is inside the lag.
    state = manager.dirty_state(log, now)
    assert (state.first_dirty_offset, state.first_uncleanable_offset) == (0, 3)
    state = manager.dirty_state(log, now + HOUR + 1)
    assert (state.first_dirty_offset, state.first_uncleanable_offset) == (0, 4)
    log.close()


def test_cleanable_offsets_for_time(tmp_path: Path) -> None:
    # Segments whose newest record is within min.compaction.lag.ms are not cleanable.
    config = dataclasses.replace(COMPACT, min_compaction_lag_ms=HOUR)
    log = open_compacted(tmp_path, config)
    manager = LogCleanerManager(tmp_path)
    append_keyed(log, [1], timestamp=NOW - 2 * HOUR)
    log.roll(NOW)
    append_keyed(log, [2], timestamp=NOW - 2 * HOUR)
    log.roll(NOW)
    append_keyed(log, [3], timestamp=NOW)  # young
    log.roll(NOW)
    append_keyed(log, [4], timestamp=NOW - 2 * HOUR)  # old again, but after a young one
    log.roll(NOW)
    state = manager.dirty_state(log, NOW)
    assert (state.first_dirty_offset, state.first_uncleanable_offset) == (0, 2)
    assert manager.dirty_state(log, NOW + HOUR + 1).first_uncleanable_offset == 4  # the active segment
    log.close()


def test_dirty_offset_reset_when_out_of_range(tmp_path: Path) -> None:
    log = open_compacted(tmp_path)
    for i in range(30):
        append_keyed(log, [(i % 3, i)])
    log.roll(NOW)
    manager = LogCleanerManager(tmp_path)
    manager.update_checkpoint(log.tp, 1000)  # beyond the log end (a truncated tail)
    assert manager.dirty_state(log, NOW).first_dirty_offset == 0
    assert manager.checkpoints()[log.tp] == 0
    # Below the log start (DeleteRecords moved it): reset to the log start.
    log.increment_log_start_offset(log.segments[1].base_offset)
    manager.update_checkpoint(log.tp, 0)
    start = log.log_start_offset
    assert manager.dirty_state(log, NOW).first_dirty_offset == start
    assert manager.checkpoints()[log.tp] == start
    log.close()


def test_dirty_ratio_and_min_cleanable_ratio(tmp_path: Path) -> None:
    manager = LogCleanerManager(tmp_path)
    tp = TopicPartition("t", 0)
    log = open_tp(tmp_path, tp, dataclasses.replace(COMPACT, min_cleanable_dirty_ratio=0.99))
    for i in range(40):
        append_keyed(log, [(i % 4, i)])
    log.roll(NOW)
    state = manager.dirty_state(log, NOW)
    assert state.cleanable_ratio == 1.0 and state.clean_bytes == 0
    cleaner = Cleaner(OffsetMap(1 << 20))
    result = clean_filthiest(manager, cleaner, [log], NOW)
    assert result is not None and result.end_offset == log.segments[-1].base_offset
    assert manager.checkpoints()[tp] == result.end_offset
    # A little new dirty data against a clean head: below a high min ratio, nothing is eligible.
    append_keyed(log, [(1, 100)])
    log.roll(NOW)
    state = manager.dirty_state(log, NOW)
    assert 0 < state.cleanable_ratio < 0.99
    assert clean_filthiest(manager, cleaner, [log], NOW) is None
    log.close()


def test_max_compaction_lag_forces_cleaning(tmp_path: Path) -> None:
    config = dataclasses.replace(COMPACT, min_cleanable_dirty_ratio=1.0, max_compaction_lag_ms=HOUR)
    log = open_compacted(tmp_path, config)
    manager = LogCleanerManager(tmp_path)
    append_keyed(log, [(1, 1)], timestamp=NOW)
    append_keyed(log, [(1, 2)], timestamp=NOW)
    log.roll(NOW)
    cleaner = Cleaner(OffsetMap(1 << 20))
    assert clean_filthiest(manager, cleaner, [log], NOW) is None  # a ratio of 1.0 is never exceeded
    assert manager.max_compaction_delay_ms == 0
    result = clean_filthiest(manager, cleaner, [log], NOW + HOUR + 10)
    assert result is not None and manager.max_compaction_delay_ms > 0
    assert offsets_in(log) == [1]
    log.close()


def test_filthiest_log_is_cleaned_first_and_checkpoint_is_kafkas_file(tmp_path: Path) -> None:
    manager = LogCleanerManager(tmp_path)
    a, b = TopicPartition("a", 0), TopicPartition("b", 3)
    log_a, log_b = open_tp(tmp_path, a), open_tp(tmp_path, b)
    for i in range(30):
        append_keyed(log_a, [(i, i)])
        append_keyed(log_b, [(i, i)])
    log_a.roll(NOW)
    log_b.roll(NOW)
    cleaner = Cleaner(OffsetMap(1 << 20))
    first = clean_filthiest(manager, cleaner, [log_a, log_b], NOW)
    assert first is not None
    second = clean_filthiest(manager, cleaner, [log_a, log_b], NOW)
    assert second is not None and {first.tp, second.tp} == {a, b}
    # Both clean now (ratio 0): nothing eligible.
    assert clean_filthiest(manager, cleaner, [log_a, log_b], NOW) is None
    assert manager.dirtiest_ratio == 0.0
    text = (tmp_path / CLEANER_OFFSET_CHECKPOINT).read_text().splitlines()
    assert text[:2] == ["0", "2"]
    assert sorted(text[2:]) == [
        f"a 0 {log_a.segments[-1].base_offset}",
        f"b 3 {log_b.segments[-1].base_offset}",
    ]
    assert LogCleanerManager(tmp_path).checkpoints() == read_offset_checkpoint(
        tmp_path / CLEANER_OFFSET_CHECKPOINT
    )
    manager.remove(a)
    assert set(LogCleanerManager(tmp_path).checkpoints()) == {b}
    log_a.close()
    log_b.close()


def test_delete_policy_logs_are_not_cleaned(tmp_path: Path) -> None:
    manager = LogCleanerManager(tmp_path)
    log = open_compacted(tmp_path, dataclasses.replace(COMPACT, cleanup_policy="delete"))
    for i in range(30):
        append_keyed(log, [(1, i)])
    log.roll(NOW)
    assert clean_filthiest(manager, Cleaner(OffsetMap(1 << 20)), [log], NOW) is None
    assert len(offsets_in(log)) == 30
    log.close()


def test_compact_delete_applies_retention_after_cleaning(tmp_path: Path) -> None:
    config = dataclasses.replace(COMPACT, cleanup_policy="compact,delete", retention_ms=HOUR)
    manager = LogCleanerManager(tmp_path)
    log = open_compacted(tmp_path, config)
    for i in range(30):
        append_keyed(log, [(i % 3, i)], timestamp=NOW - 2 * HOUR)
    log.roll(NOW)
    for i in range(3):
        append_keyed(log, [(i, 100 + i)], timestamp=NOW)
    log.roll(NOW)
    result = clean_filthiest(manager, Cleaner(OffsetMap(1 << 20)), [log], NOW)
    assert result is not None
    assert key_values(log) == {0: b"100", 1: b"101", 2: b"102"}
    assert keys_in(log) == [0, 1, 2]  # old segments went with retention
    log.close()


def _snappy_batch(key: bytes) -> bytearray:
    """A batch claiming snappy compression (the cleaner cannot read it)."""
    raw = bytearray(build_batch([Record(key=key, value=b"v")], base_timestamp=NOW))
    raw[22] = (raw[22] & ~0x07) | 2
    crc = compute_crc(raw, 0, len(raw))
    raw[17:21] = crc.to_bytes(4, "big")
    return raw


def test_failure_marks_the_partition_uncleanable_and_others_go_on(tmp_path: Path) -> None:
    manager = LogCleanerManager(tmp_path)
    bad_tp, good_tp = TopicPartition("bad", 0), TopicPartition("good", 0)
    bad, good = open_tp(tmp_path, bad_tp), open_tp(tmp_path, good_tp)
    for i in range(20):
        append_keyed(bad, [(1, i)])
        append_keyed(good, [(1, i)])
    raw = _snappy_batch(b"1")
    bad.append(raw, BatchHeader.parse(raw), leader_epoch=0, now_ms=NOW)
    bad.update_high_watermark(bad.log_end_offset)
    bad.roll(NOW)
    good.roll(NOW)
    before = offsets_in_raw(bad)
    cleaner = Cleaner(OffsetMap(1 << 20))
    results = [clean_filthiest(manager, cleaner, [bad, good], NOW) for _ in range(3)]
    assert [r.tp for r in results if r is not None] == [good_tp]
    assert set(manager.uncleanable()) == {bad_tp}
    assert offsets_in_raw(bad) == before  # untouched
    assert not list(bad.directory.glob("*.cleaned"))
    assert offsets_in(good) == [19]
    bad.close()
    good.close()


def offsets_in_raw(log: PartitionLog) -> list[int]:
    from exactly.storage.cleaner.cleaner import segment_batches

    return [h.base_offset for s in log.segments for _b, h in segment_batches(s)]


def test_truncation_lowers_the_checkpoint_so_new_data_is_dirty(tmp_path: Path) -> None:
    # A follower truncates below the checkpoint, then fetches new data past it: the new data must
    # be cleaned (its tombstones shadow older values), not taken for clean.
    log = open_compacted(tmp_path)
    for i in range(40):
        append_keyed(log, [(i % 4, i)])
    log.roll(NOW)
    manager = LogCleanerManager(tmp_path)
    cleaner = Cleaner(OffsetMap(1 << 20))
    first = clean_filthiest(manager, cleaner, [log], NOW)
    assert first is not None and manager.checkpoints()[log.tp] == 40
    log.truncate_to(38)
    for i in range(20):
        append_keyed(log, [(1, None)] if i == 0 else [(9, i)])
    log.roll(NOW)
    assert log.log_end_offset > 40
    state = manager.dirty_state(log, NOW)
    assert state.first_dirty_offset == 38 and manager.checkpoints()[log.tp] == 38
    assert manager.dirty_state(log, NOW).first_dirty_offset == 38  # taken once, kept in the file
    log.close()


def test_a_replica_cleans_only_below_its_high_watermark(tmp_path: Path) -> None:
    # Reference note B5: a replica (leader or follower) never cleans past its high watermark --
    # the cleanable range ends at the LSO, which is at or below the HW -- so a follower does not
    # compact data the leader may still cut away. Tombstones and markers are removed by time alone
    # (delete.retention.ms past the pass that marked them), as in Kafka.
    log = open_compacted(tmp_path)
    manager = LogCleanerManager(tmp_path)
    for i in range(30):
        append_keyed(log, [(i % 3, i)])
        if i % 10 == 9:
            log.roll(NOW)
    high_watermark = log.log_end_offset
    for i in range(30, 60):  # appended, not yet replicated: the high watermark stays
        batch = bytearray(build_batch([Record(key=b"%d" % (i % 3), value=b"%d" % i)], base_timestamp=NOW))
        log.append(batch, BatchHeader.parse(batch), leader_epoch=0, now_ms=NOW)
        if i % 10 == 9:
            log.roll(NOW)
    assert log.high_watermark == high_watermark == 30 and len(log.segments) == 7
    state = manager.dirty_state(log, NOW)
    assert state.first_uncleanable_offset == 30  # not the active segment's base, 60
    end_offset, _stats = Cleaner(OffsetMap(1 << 20)).clean(log, state, NOW)
    assert end_offset == 30
    assert offsets_in_raw(log)[-33:] == [27, 28, 29, *range(30, 60)]  # the unreplicated tail untouched
    log.close()


def test_a_log_with_only_its_active_segment_has_ratio_zero_and_keeps_its_truncation(tmp_path: Path) -> None:
    """The scan's shortcut for logs with nothing but the active segment (never cleaned): ratio 0
    and no candidate, and a truncation noted on the log still lowers the checkpoint."""
    manager = LogCleanerManager(tmp_path)
    tp = TopicPartition("t", 0)
    log = open_tp(tmp_path, tp)
    for i in range(10):
        append_keyed(log, [(i % 4, i)])
    manager.update_checkpoint(tp, 8)
    log.truncate_to(5)
    assert len(log.segments) == 1
    assert manager.grab_filthiest([log], NOW) is None
    assert manager.dirty_ratios() == {tp: 0.0}
    assert manager.checkpoints()[tp] == 5
    log.close()


def test_readers_do_not_wait_for_the_checkpoint_files_fsync(tmp_path: Path, monkeypatch: MonkeyPatch) -> None:
    """The cleaner thread writes the checkpoint (two fsyncs); the event loop reads the manager's
    state for /metrics meanwhile and must not wait for the disk. Two writers never put an older
    checkpoint back: whoever writes last writes the newest state."""
    manager = LogCleanerManager(tmp_path)
    tp = TopicPartition("t", 0)
    writing, release = threading.Event(), threading.Event()
    real_write = manager_module.write_offset_checkpoint

    def slow_write(path: Path, checkpoints: dict[TopicPartition, int]) -> None:
        if checkpoints.get(tp) == 10:  # the first write stalls like an fsync on a busy disk
            writing.set()
            assert release.wait(10)
        real_write(path, checkpoints)

    monkeypatch.setattr(manager_module, "write_offset_checkpoint", slow_write)
    first = threading.Thread(target=manager.done_cleaning, args=(tp, 10))
    first.start()
    assert writing.wait(10)
    # the state is readable while the write is stuck, and already holds the new offset
    seen: list[object] = []
    reader = threading.Thread(
        target=lambda: seen.extend([manager.checkpoints(), manager.dirty_ratios(), manager.uncleanable()])
    )
    reader.start()
    reader.join(5)
    stuck = reader.is_alive()
    if stuck:
        release.set()
    assert not stuck, "a reader waited for the checkpoint file's write"
    assert seen == [{tp: 10}, {}, {}]
    second = threading.Thread(target=manager.done_cleaning, args=(tp, 20))
    second.start()
    release.set()
    first.join(10)
    second.join(10)
    assert read_offset_checkpoint(tmp_path / CLEANER_OFFSET_CHECKPOINT) == {tp: 20}
