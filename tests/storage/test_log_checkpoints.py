from __future__ import annotations

from pathlib import Path

from exactly.storage.checkpoint import write_offset_checkpoint
from exactly.storage.log_checkpoints import (
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    LogCheckpoints,
)
from exactly.types import TopicPartition

TP = TopicPartition("t", 0)


def test_due_once_per_interval_counted_from_the_last_checkpoint(tmp_path: Path) -> None:
    cps = LogCheckpoints(tmp_path, replicated=False, interval_ms=1000, now_ms=0)
    assert not cps.due(999)
    assert cps.due(1000)
    assert not cps.due(1999)  # the interval restarted at 1000
    assert cps.due(2000)


def test_read_gives_each_file_and_high_watermarks_only_in_cluster_mode(tmp_path: Path) -> None:
    write_offset_checkpoint(tmp_path / RECOVERY_POINT_CHECKPOINT, {TP: 7})
    write_offset_checkpoint(tmp_path / LOG_START_OFFSET_CHECKPOINT, {TP: 3})
    write_offset_checkpoint(tmp_path / REPLICATION_OFFSET_CHECKPOINT, {TP: 5})
    single = LogCheckpoints(tmp_path, replicated=False, interval_ms=1000, now_ms=0).read()
    assert (single.recovery_points, single.log_starts, single.high_watermarks) == ({TP: 7}, {TP: 3}, None)
    cluster = LogCheckpoints(tmp_path, replicated=True, interval_ms=1000, now_ms=0).read()
    assert cluster.high_watermarks == {TP: 5}


def test_missing_files_read_as_empty(tmp_path: Path) -> None:
    start = LogCheckpoints(tmp_path, replicated=True, interval_ms=1000, now_ms=0).read()
    assert (start.recovery_points, start.log_starts, start.high_watermarks) == ({}, {}, {})


def test_high_watermarks_are_not_written_on_a_single_broker(tmp_path: Path) -> None:
    LogCheckpoints(tmp_path, replicated=False, interval_ms=1000, now_ms=0).write_high_watermarks({})
    assert not (tmp_path / REPLICATION_OFFSET_CHECKPOINT).exists()
