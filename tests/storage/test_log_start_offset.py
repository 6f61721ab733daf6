"""The log start offset moved by DeleteRecords: segment deletion, reads, the checkpoint across a
crash, producer state and the transaction index (PartitionLog + LogManager)."""

from __future__ import annotations

from pathlib import Path

import pytest

from exactly.storage.checkpoint import read_offset_checkpoint, write_offset_checkpoint
from exactly.storage.config import LogConfig
from exactly.storage.log_checkpoints import LOG_START_OFFSET_CHECKPOINT
from exactly.storage.log_manager import (
    LogManager,
    PolicyViolationError,
    UnknownTopicError,
)
from exactly.storage.log_read import AbortedTxn, OffsetOutOfRangeError
from exactly.storage.partition_log import PartitionLog
from exactly.storage.retention import deletable_segments
from exactly.types import TopicPartition
from tests.storage.helpers import NOW, append, append_marker, crash, headers_of, open_log, read_all

SMALL_SEGMENTS = LogConfig(segment_bytes=300)
TP = TopicPartition("t", 0)


def filled(directory: Path, batches: int = 10, per_batch: int = 3) -> PartitionLog:
    log = open_log(directory, SMALL_SEGMENTS)
    for _ in range(batches):
        append(log, per_batch, value_size=20)
    return log


def test_moving_the_start_deletes_only_segments_wholly_below_it(tmp_path: Path) -> None:
    log = filled(tmp_path)
    bases = [s.base_offset for s in log.segments]
    assert len(bases) >= 4, bases
    target = bases[2] + 1  # inside the third segment, inside its first batch
    assert log.recovery_point < target
    assert log.increment_log_start_offset(target)
    assert log.recovery_point == log.log_end_offset  # flushed, not merely moved up
    assert log.log_start_offset == target
    assert [s.base_offset for s in log.segments] == bases[2:]  # the segment holding it stays
    assert not any((tmp_path / f"{b:020d}.log").exists() for b in bases[:2])
    with pytest.raises(OffsetOutOfRangeError):
        log.read(target - 1, 1 << 20, read_committed=False)
    # A fetch at the start returns the batch containing it (the client skips the records below).
    first = headers_of(log.read(target, 1 << 20, read_committed=False).records)[0]
    assert first.base_offset == bases[2] < target <= first.last_offset
    assert read_all(log)[-1].next_offset == log.log_end_offset == 30
    log.close()


def test_start_never_beyond_the_high_watermark_and_never_backwards(tmp_path: Path) -> None:
    log = filled(tmp_path, batches=3)
    append(log, 2, advance_hw=False)  # 9-10 written, not yet below the high watermark
    assert log.high_watermark == 9
    with pytest.raises(OffsetOutOfRangeError):
        log.increment_log_start_offset(10)
    assert log.increment_log_start_offset(4)
    assert not log.increment_log_start_offset(4)
    assert not log.increment_log_start_offset(2)
    assert log.log_start_offset == 4
    assert log.increment_log_start_offset(9)  # up to the high watermark itself: nothing readable
    assert log.read(9, 1 << 20, read_committed=False).records == b""
    log.update_high_watermark(log.log_end_offset)
    assert [h.base_offset for h in read_all(log)] == [9]
    log.close()


def test_offset_for_timestamp_ignores_batches_below_the_start(tmp_path: Path) -> None:
    log = open_log(tmp_path, SMALL_SEGMENTS)
    append(log, 3, timestamp=NOW + 500)  # 0-2: a late timestamp, soon below the start
    append(log, 3, timestamp=NOW + 100)  # 3-5
    append(log, 3, timestamp=NOW + 600)  # 6-8
    assert log.offset_for_timestamp(NOW + 200) == (0, NOW + 500)
    log.increment_log_start_offset(3)
    assert log.offset_for_timestamp(NOW + 200) == (6, NOW + 600)
    log.close()


def test_retention_moves_the_start_and_start_breach_ignores_the_cleanup_policy(tmp_path: Path) -> None:
    compacted = LogConfig(segment_bytes=300, cleanup_policy="compact", retention_bytes=1)
    log = open_log(tmp_path, compacted)
    for _ in range(6):
        append(log, 3, value_size=20)
    bases = [s.base_offset for s in log.segments]
    assert log.apply_retention(NOW) == 0  # retention.bytes does not apply to a compacted topic
    # Segments below the log start go whatever the policy (the log manager refuses DeleteRecords
    # on compacted topics, but the start also comes from the checkpoint).
    assert deletable_segments(log.segments, compacted, NOW, bases[2]) == 2
    assert deletable_segments(log.segments, compacted, NOW, bases[2] - 1) == 1
    assert deletable_segments(log.segments, compacted, NOW, log.log_end_offset) == len(bases) - 1
    log.close()

    plain = open_log(tmp_path / "plain", LogConfig(segment_bytes=300, retention_bytes=1))
    for _ in range(6):
        append(plain, 3, value_size=20)
    assert plain.apply_retention(NOW) > 0
    assert plain.log_start_offset == plain.segments[0].base_offset > 0
    plain.close()


def test_producer_state_is_kept_for_producers_below_the_start(tmp_path: Path) -> None:
    log = open_log(tmp_path, SMALL_SEGMENTS)
    append(log, 3, value_size=20, producer_id=7, epoch=0, seq=0)  # 0-2
    for _ in range(4):
        append(log, 3, value_size=20)
    log.increment_log_start_offset(9)
    # As in Kafka since KIP-360: no UNKNOWN_PRODUCER_ID / sequence reset for producer 7.
    assert log.producers()[7].last_seq == 2
    retry = append(log, 3, value_size=20, producer_id=7, epoch=0, seq=0)
    assert retry.duplicate and retry.first_offset == 0
    nxt = append(log, 1, producer_id=7, epoch=0, seq=3)
    assert not nxt.duplicate
    crash(log)
    reopened = PartitionLog.open(
        tmp_path, log.tp, SMALL_SEGMENTS, recovery_point=0, now_ms=NOW, log_start_offset=9
    )
    assert reopened.log_start_offset == 9
    assert reopened.producers()[7].last_seq == 3
    reopened.close()


def test_open_transaction_straddling_the_new_start(tmp_path: Path) -> None:
    log = open_log(tmp_path, SMALL_SEGMENTS)
    append(log, 2)  # 0-1
    append(log, 3, producer_id=1, epoch=0, seq=0, transactional=True, value_size=20)  # 2-4 open txn
    append(log, 3, value_size=20)  # 5-7
    assert log.last_stable_offset == 2
    log.increment_log_start_offset(6)  # inside the open transaction's range: allowed, as in Kafka
    assert log.producer_state.ongoing_transactions() == {1: 2}  # the transaction stays open
    assert log.last_stable_offset == 6  # clamped to the log start (maybeIncrementFirstUnstableOffset)
    assert log.read(6, 1 << 20, read_committed=True).records == b""
    append(log, 1, producer_id=1, epoch=0, seq=3, transactional=True)  # 8
    append_marker(log, 1, 0, abort=True)  # 9
    assert log.last_stable_offset == 10
    result = log.read(6, 1 << 20, read_committed=True)
    assert result.aborted_transactions == (AbortedTxn(1, 2),)  # it overlaps what is returned

    crash(log)
    reopened = PartitionLog.open(
        tmp_path, log.tp, SMALL_SEGMENTS, recovery_point=0, now_ms=NOW, log_start_offset=6
    )
    assert reopened.log_start_offset == 6 and reopened.last_stable_offset == 10
    assert reopened.producer_state.ongoing_transactions() == {}
    assert reopened.read(6, 1 << 20, read_committed=True).aborted_transactions == (AbortedTxn(1, 2),)
    reopened.close()


def test_open_transaction_below_the_start_survives_a_crash(tmp_path: Path) -> None:
    log = open_log(tmp_path, SMALL_SEGMENTS)
    append(log, 3, producer_id=1, epoch=0, seq=0, transactional=True, value_size=20)  # 0-2 open
    for _ in range(5):
        append(log, 3, value_size=20)
    log.increment_log_start_offset(12)
    assert log.segments[0].base_offset > 0  # the transaction's first batch is gone
    crash(log)
    reopened = PartitionLog.open(
        tmp_path, log.tp, SMALL_SEGMENTS, recovery_point=0, now_ms=NOW, log_start_offset=12
    )
    assert reopened.producer_state.ongoing_transactions() == {1: 0}
    assert reopened.last_stable_offset == 12
    reopened.close()


def test_aborted_transactions_below_the_start_are_not_returned(tmp_path: Path) -> None:
    log = open_log(tmp_path, SMALL_SEGMENTS)
    append(log, 2, producer_id=1, epoch=0, seq=0, transactional=True)  # 0-1
    append_marker(log, 1, 0, abort=True)  # 2
    for _ in range(3):
        append(log, 3, value_size=20)  # 3-11
    assert log.read(0, 1 << 20, read_committed=True).aborted_transactions == (AbortedTxn(1, 0),)
    log.increment_log_start_offset(3)
    result = log.read(3, 1 << 20, read_committed=True)
    assert result.records and result.aborted_transactions == ()
    log.close()


def test_delete_records_errors_and_high_watermark_shorthand(tmp_path: Path) -> None:
    manager = LogManager(tmp_path, LogConfig(), now_ms=NOW)
    manager.create_topic("t", 2, {}, now_ms=NOW)
    manager.create_topic("c", 1, {"cleanup.policy": "compact"}, now_ms=NOW)
    manager.create_topic("cd", 1, {"cleanup.policy": "compact,delete"}, now_ms=NOW)
    for tp in (TP, TopicPartition("t", 1), TopicPartition("cd", 0)):
        log = manager.get_partition(tp)
        assert log is not None
        append(log, 5)
    results = manager.delete_records(
        {
            TP: -1,
            TopicPartition("t", 1): 6,
            TopicPartition("c", 0): 0,
            TopicPartition("cd", 0): 2,
            TopicPartition("t", 9): 0,
            TopicPartition("nope", 0): 0,
        }
    )
    assert results[TP] == 5
    assert isinstance(results[TopicPartition("t", 1)], OffsetOutOfRangeError)
    assert isinstance(results[TopicPartition("c", 0)], PolicyViolationError)
    assert results[TopicPartition("cd", 0)] == 2
    assert isinstance(results[TopicPartition("t", 9)], UnknownTopicError)
    assert isinstance(results[TopicPartition("nope", 0)], UnknownTopicError)
    assert isinstance(manager.delete_records({TP: -2})[TP], OffsetOutOfRangeError)
    assert manager.delete_records({TP: 3}) == {TP: 5}  # never backwards; the low watermark stays
    assert read_offset_checkpoint(tmp_path / LOG_START_OFFSET_CHECKPOINT) == {
        TP: 5,
        TopicPartition("cd", 0): 2,
    }
    manager.close()


def test_delete_records_survives_kill_9(tmp_path: Path) -> None:
    manager = LogManager(tmp_path, SMALL_SEGMENTS, now_ms=NOW)
    manager.create_topic("t", 1, {}, now_ms=NOW)
    log = manager.get_partition(TP)
    assert log is not None
    for _ in range(10):
        append(log, 3, value_size=20)
    bases = [s.base_offset for s in log.segments]
    target = bases[2] + 2
    assert manager.delete_records({TP: target}) == {TP: target}
    crash(log)  # no close, no flush, no recovery-point checkpoint

    reopened = LogManager(tmp_path, SMALL_SEGMENTS, now_ms=NOW)
    log = reopened.get_partition(TP)
    assert log is not None
    assert log.log_start_offset == target and log.log_end_offset == 30
    assert [s.base_offset for s in log.segments] == bases[2:]
    with pytest.raises(OffsetOutOfRangeError):
        log.read(target - 1, 1 << 20, read_committed=False)
    assert read_all(log)[0].base_offset == bases[2]
    reopened.close()


def test_crash_before_segment_deletion_finishes_on_the_next_retention_run(tmp_path: Path) -> None:
    manager = LogManager(tmp_path, SMALL_SEGMENTS, now_ms=NOW)
    manager.create_topic("t", 1, {}, now_ms=NOW)
    log = manager.get_partition(TP)
    assert log is not None
    for _ in range(10):
        append(log, 3, value_size=20)
    bases = [s.base_offset for s in log.segments]
    manager.close()
    write_offset_checkpoint(tmp_path / LOG_START_OFFSET_CHECKPOINT, {TP: bases[3]})

    reopened = LogManager(tmp_path, SMALL_SEGMENTS, now_ms=NOW)
    log = reopened.get_partition(TP)
    assert log is not None and log.log_start_offset == bases[3]
    assert len(log.segments) == len(bases)
    reopened.run_maintenance(NOW)
    assert [s.base_offset for s in log.segments] == bases[3:]
    reopened.close()


def test_recreated_topic_forgets_the_old_start(tmp_path: Path) -> None:
    manager = LogManager(tmp_path, LogConfig(), now_ms=NOW)
    manager.create_topic("t", 1, {}, now_ms=NOW)
    log = manager.get_partition(TP)
    assert log is not None
    append(log, 5)
    manager.delete_records({TP: 4})
    manager.delete_topic("t")
    manager.create_topic("t", 1, {}, now_ms=NOW)
    assert read_offset_checkpoint(tmp_path / LOG_START_OFFSET_CHECKPOINT) == {}
    manager.close()
    reopened = LogManager(tmp_path, LogConfig(), now_ms=NOW)
    log = reopened.get_partition(TP)
    assert log is not None and log.log_start_offset == 0
    reopened.close()
