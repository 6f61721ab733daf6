"""``replication-offset-checkpoint``: a cluster replica's high watermarks survive a restart (Kafka's
HighwaterMarkCheckpoint), a single broker neither writes nor needs them."""

from __future__ import annotations

from pathlib import Path

from exactly.storage.checkpoint import read_offset_checkpoint
from exactly.storage.config import LogConfig
from exactly.storage.log_checkpoints import REPLICATION_OFFSET_CHECKPOINT
from exactly.storage.log_manager import LogManager
from exactly.types import TopicPartition
from tests.storage.helpers import NOW, append

A0 = TopicPartition("orders", 0)
A1 = TopicPartition("orders", 1)


def _replicated(tmp_path: Path) -> LogManager:
    manager = LogManager(tmp_path, LogConfig(), now_ms=NOW, replicated=True)
    if manager.topic("orders") is None:
        manager.create_topic("orders", 2, {}, now_ms=NOW)
    return manager


def test_file_format_is_kafkas(tmp_path: Path) -> None:
    manager = _replicated(tmp_path)
    plog = manager.get_partition(A1)
    assert plog is not None
    append(plog, 5)
    plog.update_high_watermark(3)
    manager.checkpoint_high_watermarks()
    text = (tmp_path / REPLICATION_OFFSET_CHECKPOINT).read_text()
    assert text == "0\n2\norders 0 0\norders 1 3\n"  # version, count, "topic partition offset"
    manager.close()


def test_restart_restores_the_checkpointed_high_watermark(tmp_path: Path) -> None:
    manager = _replicated(tmp_path)
    plog = manager.get_partition(A0)
    assert plog is not None
    append(plog, 10)
    plog.update_high_watermark(4)  # a follower: records 4..9 not acknowledged by the ISR yet
    manager.close()
    assert read_offset_checkpoint(tmp_path / REPLICATION_OFFSET_CHECKPOINT) == {A0: 4, A1: 0}

    reopened = _replicated(tmp_path)
    plog = reopened.get_partition(A0)
    assert plog is not None
    assert (plog.log_end_offset, plog.high_watermark) == (10, 4)
    reopened.close()


def test_checkpointed_high_watermark_is_capped_at_the_log_end(tmp_path: Path) -> None:
    manager = _replicated(tmp_path)
    plog = manager.get_partition(A0)
    assert plog is not None
    append(plog, 3)
    manager.close()
    # A checkpoint ahead of the log (the tail was lost in a crash): the HW cannot pass the LEO.
    (tmp_path / REPLICATION_OFFSET_CHECKPOINT).write_text("0\n1\norders 0 50\n")
    reopened = _replicated(tmp_path)
    plog = reopened.get_partition(A0)
    assert plog is not None
    assert plog.high_watermark == plog.log_end_offset == 3
    reopened.close()


def test_missing_or_unreadable_checkpoint_starts_at_the_log_start(tmp_path: Path) -> None:
    manager = _replicated(tmp_path)
    plog = manager.get_partition(A0)
    assert plog is not None
    append(plog, 3)
    manager.close()
    (tmp_path / REPLICATION_OFFSET_CHECKPOINT).write_text("7\nnot a checkpoint\n")
    reopened = _replicated(tmp_path)
    plog = reopened.get_partition(A0)
    assert plog is not None
    assert (plog.log_end_offset, plog.high_watermark) == (3, 0)  # Kafka: getOrElse(tp, 0), clamped
    reopened.close()


def test_single_broker_keeps_high_watermark_at_the_log_end(tmp_path: Path) -> None:
    manager = LogManager(tmp_path, LogConfig(), now_ms=NOW)
    manager.create_topic("orders", 1, {}, now_ms=NOW)
    plog = manager.get_partition(A0)
    assert plog is not None
    append(plog, 3)
    plog.update_high_watermark(1)
    manager.checkpoint_high_watermarks()
    manager.close()
    assert not (tmp_path / REPLICATION_OFFSET_CHECKPOINT).exists()
    reopened = LogManager(tmp_path, LogConfig(), now_ms=NOW)
    plog = reopened.get_partition(A0)
    assert plog is not None
    assert plog.high_watermark == plog.log_end_offset == 3
    reopened.close()


def test_the_checkpoint_is_the_snapshot_taken_when_asked_written_when_called(tmp_path: Path) -> None:
    """``high_watermark_checkpoint`` freezes the values at the call (the replica manager takes
    it on the event loop and writes it from a thread): a HW move afterwards is not in that file."""
    manager = _replicated(tmp_path)
    plog = manager.get_partition(A0)
    assert plog is not None
    append(plog, 5)
    plog.update_high_watermark(2)
    write = manager.high_watermark_checkpoint()
    assert write is not None
    plog.update_high_watermark(4)
    write()
    assert read_offset_checkpoint(tmp_path / REPLICATION_OFFSET_CHECKPOINT) == {A0: 2, A1: 0}
    manager.close()
    assert manager.high_watermark_checkpoint() is None  # closed: nothing more to write
    single = LogManager(tmp_path / "single", LogConfig(), now_ms=NOW)
    assert single.high_watermark_checkpoint() is None
    single.close()
