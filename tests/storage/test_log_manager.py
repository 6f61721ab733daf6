from __future__ import annotations

import json
from pathlib import Path

import pytest

from exactly.storage.checkpoint import read_offset_checkpoint
from exactly.storage.config import InvalidConfigError, LogConfig
from exactly.storage.log_manager import (
    CLEAN_SHUTDOWN_MARKER,
    RECOVERY_POINT_CHECKPOINT,
    TOPICS_FILE,
    InvalidPartitionsError,
    InvalidTopicError,
    LogManager,
    TopicExistsError,
    UnknownTopicError,
)
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
