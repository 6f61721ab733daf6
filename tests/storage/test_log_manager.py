from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path
from typing import Any

import pytest

from exactly.storage.checkpoint import read_offset_checkpoint
from exactly.storage.config import InvalidConfigError, LogConfig
from exactly.storage.log_checkpoints import RECOVERY_POINT_CHECKPOINT
from exactly.storage.log_manager import (
    CLEAN_SHUTDOWN_MARKER,
    TOPICS_FILE,
    InvalidPartitionsError,
    InvalidTopicError,
    LogManager,
    TopicExistsError,
    UnknownTopicError,
)
from exactly.storage.partition_log import PartitionLog
from exactly.types import TopicPartition
from tests.storage.helpers import NOW, append, crash, make_batch, read_all


def test_create_close_reopen(tmp_path: Path) -> None:
    manager = LogManager(tmp_path, LogConfig(), now_ms=NOW)
    assert not manager.had_clean_shutdown  # a fresh directory
    cluster_id = manager.cluster_id
    assert len(cluster_id) == 22
    info = manager.create_topic("orders", 2, {"retention.ms": "1000"}, now_ms=NOW)
    assert info.config.retention_ms == 1000 and info.partitions == 2
    manager.create_topic("__consumer_offsets", 1, {"cleanup.policy": "compact"}, now_ms=NOW, internal=True)
    log = manager.get_partition(TopicPartition("orders", 1))
    assert log is not None
    append(log, 3)
    assert manager.get_partition(TopicPartition("orders", 2)) is None
    assert len(list(manager.partitions())) == 3
    manager.close()
    assert (tmp_path / CLEAN_SHUTDOWN_MARKER).exists()
    assert read_offset_checkpoint(tmp_path / RECOVERY_POINT_CHECKPOINT) == {
        TopicPartition("orders", 0): 0,
        TopicPartition("orders", 1): 3,
        TopicPartition("__consumer_offsets", 0): 0,
    }

    reopened = LogManager(tmp_path, LogConfig(), now_ms=NOW)
    assert reopened.had_clean_shutdown
    assert not (tmp_path / CLEAN_SHUTDOWN_MARKER).exists()  # a crash from now on is unclean
    assert reopened.cluster_id == cluster_id
    assert reopened.topics().keys() == {"orders", "__consumer_offsets"}
    orders = reopened.topic("orders")
    assert (
        orders is not None
        and orders.topic_id == info.topic_id
        and orders.overrides == {"retention.ms": "1000"}
    )
    assert reopened.topic_by_id(info.topic_id) == orders
    offsets = reopened.topic("__consumer_offsets")
    assert offsets is not None and offsets.internal and offsets.config.cleanup_policy == "compact"
    log = reopened.get_partition(TopicPartition("orders", 1))
    assert log is not None and log.log_end_offset == 3
    assert log.load_result.replayed_batches == 0 and log.load_result.truncated_bytes == 0
    reopened.close()


def test_unclean_shutdown_recovers_from_checkpoint(tmp_path: Path) -> None:
    manager = LogManager(tmp_path, LogConfig(), now_ms=NOW)
    manager.create_topic("t", 1, {}, now_ms=NOW)
    log = manager.get_partition(TopicPartition("t", 0))
    assert log is not None
    append(log, 2)
    log.flush()
    manager.checkpoint_recovery_points()  # recovery point 2 is on disk
    append(log, 2)
    crash(log)
    with open(log.segments[-1].log_path, "ab") as f:
        f.write(make_batch(1)[:30])

    reopened = LogManager(tmp_path, LogConfig(), now_ms=NOW)
    assert not reopened.had_clean_shutdown
    log = reopened.get_partition(TopicPartition("t", 0))
    assert log is not None
    assert log.log_end_offset == 4  # nothing written whole is lost
    assert log.load_result.truncated_bytes == 30
    assert log.load_result.replayed_batches == 2  # no snapshot yet: producer state replays from 0
    reopened.close()


def test_topic_errors(tmp_path: Path) -> None:
    manager = LogManager(tmp_path, LogConfig(), now_ms=NOW)
    manager.create_topic("t", 1, {}, now_ms=NOW)
    with pytest.raises(TopicExistsError):
        manager.create_topic("t", 1, {}, now_ms=NOW)
    with pytest.raises(InvalidConfigError):
        manager.create_topic("u", 1, {"no.such.config": "1"}, now_ms=NOW)
    with pytest.raises(InvalidTopicError):
        manager.create_topic("bad/name", 1, {}, now_ms=NOW)
    with pytest.raises(InvalidPartitionsError):
        manager.create_topic("v", 0, {}, now_ms=NOW)
    with pytest.raises(UnknownTopicError):
        manager.delete_topic("nope")
    assert manager.topics().keys() == {"t"}
    manager.close()


def test_delete_topic_and_orphan_directories(tmp_path: Path) -> None:
    manager = LogManager(tmp_path, LogConfig(), now_ms=NOW)
    manager.create_topic("gone", 2, {}, now_ms=NOW)
    manager.create_topic("kept", 1, {}, now_ms=NOW)
    log = manager.get_partition(TopicPartition("gone", 0))
    assert log is not None
    append(log, 1)
    info = manager.delete_topic("gone")
    assert info.name == "gone"
    assert not (tmp_path / "gone-0").exists() and not (tmp_path / "gone-1").exists()
    assert manager.get_partition(TopicPartition("gone", 0)) is None
    assert set(json.loads((tmp_path / TOPICS_FILE).read_text())["topics"]) == {"kept"}
    manager.close()
    (tmp_path / "ghost-0").mkdir()  # as left by a crash during a delete
    (tmp_path / "ghost-0" / "00000000000000000000.log").write_bytes(b"")
    reopened = LogManager(tmp_path, LogConfig(), now_ms=NOW)
    assert not (tmp_path / "ghost-0").exists()
    assert reopened.topics().keys() == {"kept"}
    reopened.close()


def test_run_maintenance(tmp_path: Path) -> None:
    one = len(make_batch(1))
    manager = LogManager(tmp_path, LogConfig(), now_ms=NOW, checkpoint_interval_ms=10_000)
    manager.create_topic(
        "t",
        1,
        {"segment.bytes": str(2 * one), "retention.ms": "5000", "flush.ms": "1000", "segment.ms": "3000"},
        now_ms=NOW,
    )
    log = manager.get_partition(TopicPartition("t", 0))
    assert log is not None
    for i in range(5):
        append(log, 1, timestamp=NOW + i, producer_id=100 + i, epoch=0, seq=0)
    assert len(log.segments) == 3 and log.recovery_point == 0
    manager.run_maintenance(NOW + 1000)
    assert log.recovery_point == 5  # flush.ms
    # The checkpoint still has what create_topic wrote: the interval has not passed.
    assert read_offset_checkpoint(tmp_path / RECOVERY_POINT_CHECKPOINT) == {TopicPartition("t", 0): 0}
    manager.run_maintenance(NOW + 4000)  # roll by age
    assert log.segments[-1].base_offset == 5 and log.segments[-1].is_empty
    manager.run_maintenance(NOW + 10_000)  # retention: every non-active segment is old
    assert log.log_start_offset == 5 and len(log.segments) == 1
    assert read_offset_checkpoint(tmp_path / RECOVERY_POINT_CHECKPOINT) == {TopicPartition("t", 0): 5}
    assert len(log.producers()) == 5
    manager.run_maintenance(NOW + 86_400_000 + 10)  # producer.id.expiration.ms
    assert log.producers() == {}
    assert read_all(log) == []
    manager.close()


def test_periodic_checkpoint_rewrites_only_changed_offsets(tmp_path: Path) -> None:
    """The periodic recovery-point and log-start checkpoints run on the event loop (durable
    writes): one that would write what is on disk already is skipped (the file keeps its inode:
    every write is a rename of a new file); a moved offset is written."""
    manager = LogManager(tmp_path, LogConfig(), now_ms=NOW, checkpoint_interval_ms=10_000)
    manager.create_topic("t", 1, {"flush.ms": "1000"}, now_ms=NOW)
    log = manager.get_partition(TopicPartition("t", 0))
    assert log is not None
    recovery = tmp_path / RECOVERY_POINT_CHECKPOINT
    manager.run_maintenance(NOW + 10_000)
    inode = recovery.stat().st_ino
    manager.run_maintenance(NOW + 20_000)  # due, nothing moved
    assert recovery.stat().st_ino == inode
    append(log, 3, timestamp=NOW, producer_id=100, epoch=0, seq=0)
    manager.run_maintenance(NOW + 30_000)  # flush.ms moved the recovery point, then due
    assert recovery.stat().st_ino != inode
    assert read_offset_checkpoint(recovery) == {TopicPartition("t", 0): 3}
    manager.close()


def test_created_partitions_start_their_leader_epoch(tmp_path: Path) -> None:
    """The epoch is checkpointed at creation (Kafka: on becoming leader), so the first produce
    does not write and fsync the checkpoint inside the request."""
    manager = LogManager(tmp_path, LogConfig(), now_ms=NOW)
    manager.create_topic("t", 2, {}, now_ms=NOW)
    for p in range(2):
        log = manager.get_partition(TopicPartition("t", p))
        assert log is not None
        assert [(e.epoch, e.start_offset) for e in log.leader_epochs.entries] == [(0, 0)]
        assert (log.directory / "leader-epoch-checkpoint").read_text().split() == ["0", "1", "0", "0"]
    manager.close()


@pytest.mark.parametrize("background", [True, False])
def test_reopen_truncates_an_empty_partitions_epoch_and_rewrites_it_off_the_open(
    tmp_path: Path, background: bool
) -> None:
    """Recovery drops the ``0 0`` entry of a partition that never got a record (its log end is 0,
    as Kafka's truncateFromEnd does) at once; the checkpoint's rewrite and fsyncs are left to a
    thread the broker starts once it serves (``start_epoch_flush``), or to ``close``."""
    manager = LogManager(tmp_path, LogConfig(), now_ms=NOW)
    manager.create_topic("t", 3, {}, now_ms=NOW)
    manager.close()
    manager = LogManager(tmp_path, LogConfig(), now_ms=NOW)
    logs = [manager.get_partition(TopicPartition("t", p)) for p in range(3)]
    for log in logs:
        assert log is not None
        assert log.leader_epochs.entries == []
        assert (log.directory / "leader-epoch-checkpoint").read_text().split() == ["0", "1", "0", "0"]
    if background:
        manager.start_epoch_flush()
        manager.start_epoch_flush()  # idempotent
    manager.close()
    for log in logs:
        assert log is not None and not log.leader_epochs.unflushed
        assert (log.directory / "leader-epoch-checkpoint").read_text().split() == ["0", "0"]


def test_close_settles_a_rewrite_owed_after_the_flush_thread_ran(tmp_path: Path) -> None:
    manager = LogManager(tmp_path, LogConfig(), now_ms=NOW)
    manager.create_topic("t", 1, {}, now_ms=NOW)
    manager.start_epoch_flush()  # nothing owed: no thread
    log = manager.get_partition(TopicPartition("t", 0))
    assert log is not None
    log.leader_epochs.assign(3, 0)
    log.leader_epochs.truncate_from_end(0, durable=False)
    assert log.leader_epochs.unflushed
    manager.close()
    assert not log.leader_epochs.unflushed
    assert (log.directory / "leader-epoch-checkpoint").read_text().split() == ["0", "0"]


def test_a_topic_deleted_while_its_epoch_rewrites_are_owed_leaves_no_directory(tmp_path: Path) -> None:
    """delete_topic right after a restart: the flush thread may not have reached the deleted
    partitions; it must not recreate their checkpoints in directories being removed."""
    manager = LogManager(tmp_path, LogConfig(), now_ms=NOW)
    manager.create_topic("t", 20, {}, now_ms=NOW)
    manager.close()
    manager = LogManager(tmp_path, LogConfig(), now_ms=NOW)
    manager.start_epoch_flush()
    manager.delete_topic("t")
    manager.close()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("t-")]


# ---- add_partitions ---------------------------------------------------------------------------
def _listed_partitions(data_dir: Path, topic: str) -> int:
    return int(json.loads((data_dir / TOPICS_FILE).read_text())["topics"][topic]["partitions"])


def test_add_partitions_uses_the_topic_config_and_survives_reopen(tmp_path: Path) -> None:
    manager = LogManager(tmp_path, LogConfig(), now_ms=NOW)
    created = manager.create_topic("t", 1, {"retention.ms": "1000", "segment.bytes": "4096"}, now_ms=NOW)
    first = manager.get_partition(TopicPartition("t", 0))
    assert first is not None
    append(first, 2)
    grown = manager.add_partitions("t", 3, now_ms=NOW)
    assert grown.partitions == 3 and grown.topic_id == created.topic_id
    assert grown.overrides == {"retention.ms": "1000", "segment.bytes": "4096"}
    assert manager.topic("t") == grown
    assert _listed_partitions(tmp_path, "t") == 3
    for p in (1, 2):
        log = manager.get_partition(TopicPartition("t", p))
        assert log is not None
        assert log.config == created.config  # retention.ms=1000, segment.bytes=4096
        assert log.log_start_offset == log.log_end_offset == 0
        assert [(e.epoch, e.start_offset) for e in log.leader_epochs.entries] == [(0, 0)]
    assert read_offset_checkpoint(tmp_path / RECOVERY_POINT_CHECKPOINT) == {
        TopicPartition("t", 0): 0,
        TopicPartition("t", 1): 0,
        TopicPartition("t", 2): 0,
    }
    new = manager.get_partition(TopicPartition("t", 2))
    assert new is not None
    append(new, 4)
    manager.close()

    reopened = LogManager(tmp_path, LogConfig(), now_ms=NOW)
    info = reopened.topic("t")
    assert info is not None and info.partitions == 3 and info.config == created.config
    ends = []
    for p in range(3):
        log = reopened.get_partition(TopicPartition("t", p))
        assert log is not None
        ends.append(log.log_end_offset)
    assert ends == [2, 0, 4]
    reopened.close()


def test_add_partitions_errors(tmp_path: Path) -> None:
    manager = LogManager(tmp_path, LogConfig(), now_ms=NOW)
    manager.create_topic("t", 2, {}, now_ms=NOW)
    with pytest.raises(UnknownTopicError):
        manager.add_partitions("nope", 3, now_ms=NOW)
    for count in (2, 1, 0, -1):
        with pytest.raises(InvalidPartitionsError):
            manager.add_partitions("t", count, now_ms=NOW)
    info = manager.topic("t")
    assert info is not None and info.partitions == 2
    assert manager.get_partition(TopicPartition("t", 2)) is None
    manager.close()


def test_add_partitions_failure_while_preparing_leaves_the_topic_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager = LogManager(tmp_path, LogConfig(), now_ms=NOW)
    manager.create_topic("t", 1, {}, now_ms=NOW)
    real_open = PartitionLog.open

    def open_failing_on_partition_2(directory: Path, tp: TopicPartition, *args: Any, **kwargs: Any) -> Any:
        if tp.partition == 2:
            raise OSError(28, "No space left on device")
        return real_open(directory, tp, *args, **kwargs)

    monkeypatch.setattr(PartitionLog, "open", open_failing_on_partition_2)
    with pytest.raises(OSError):
        manager.add_partitions("t", 4, now_ms=NOW)
    monkeypatch.undo()
    assert not (tmp_path / "t-1").exists()  # the one that was made is gone again
    info = manager.topic("t")
    assert info is not None and info.partitions == 1
    assert _listed_partitions(tmp_path, "t") == 1
    assert manager.get_partition(TopicPartition("t", 1)) is None
    assert manager.add_partitions("t", 4, now_ms=NOW).partitions == 4  # and it can be retried
    manager.close()


def _crash_inside_add_partitions(data_dir: Path, count: int, *, before_topics_file: bool) -> None:
    """Child process: grow topic 't' and die like kill -9 (os._exit: no cleanup, no flush)
    just before or just after topics.json is written."""
    manager = LogManager(data_dir, LogConfig(), now_ms=NOW)
    real_write = LogManager._write_topics

    def write_then_die(self: LogManager, topics: Any = None) -> None:
        if topics is None:  # not the write of add_partitions
            real_write(self, topics)
            return
        if not before_topics_file:
            real_write(self, topics)
        os._exit(9)

    LogManager._write_topics = write_then_die  # type: ignore[method-assign]
    manager.add_partitions("t", count, now_ms=NOW)
    os._exit(0)  # not reached


@pytest.mark.parametrize("before_topics_file", [True, False])
def test_add_partitions_killed_midway_leaves_a_loadable_topic(
    tmp_path: Path, before_topics_file: bool
) -> None:
    manager = LogManager(tmp_path, LogConfig(), now_ms=NOW)
    manager.create_topic("t", 2, {"segment.bytes": "4096"}, now_ms=NOW)
    log = manager.get_partition(TopicPartition("t", 1))
    assert log is not None
    append(log, 3)
    manager.close()

    child = multiprocessing.get_context("fork").Process(
        target=_crash_inside_add_partitions,
        args=(tmp_path, 5),
        kwargs={"before_topics_file": before_topics_file},
    )
    child.start()
    child.join(30)
    assert child.exitcode == 9
    assert (tmp_path / "t-4").is_dir()  # the new directories were made before the crash

    reopened = LogManager(tmp_path, LogConfig(), now_ms=NOW)
    assert not reopened.had_clean_shutdown
    expected = 2 if before_topics_file else 5
    info = reopened.topic("t")
    assert info is not None and info.partitions == expected
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("t-")) == [
        f"t-{p}" for p in range(expected)
    ]
    ends = []
    for p in range(expected):
        plog = reopened.get_partition(TopicPartition("t", p))
        assert plog is not None and plog.config.segment_bytes == 4096
        ends.append(plog.log_end_offset)
    assert ends == [0, 3] + [0] * (expected - 2)
    if not before_topics_file:
        new = reopened.get_partition(TopicPartition("t", 4))
        assert new is not None
        append(new, 2)
        assert new.log_end_offset == 2
    reopened.close()
