"""Topic changes as prepare -> persist -> complete (storage.topic_changes, storage.topics_file):
the one writer of topics.json keeps "committed + this change" across changes in flight, a failed
persist leaves nothing behind, and a restart (or a kill -9) after any step finds the right topics."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exactly.storage import topics_file
from exactly.storage.checkpoint import read_offset_checkpoint
from exactly.storage.config import LogConfig
from exactly.storage.leader_epoch import LEADER_EPOCH_CHECKPOINT
from exactly.storage.log_checkpoints import LOG_START_OFFSET_CHECKPOINT, RECOVERY_POINT_CHECKPOINT
from exactly.storage.log_manager import (
    TOPICS_FILE,
    LogManager,
    NewTopic,
    TopicExistsError,
    UnknownTopicError,
)
from exactly.types import TopicPartition
from tests.storage.helpers import NOW, append


def _listed(data_dir: Path) -> set[str]:
    return set(json.loads((data_dir / TOPICS_FILE).read_text())["topics"])


def _restart_sees(data_dir: Path, scratch: Path) -> set[str]:
    """What a broker started on a copy of ``data_dir`` as it is now (a crash here) would serve."""
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.copytree(data_dir, scratch)
    reopened = LogManager(scratch, LogConfig(), now_ms=NOW)
    try:
        names = set(reopened.topics())
        for info in reopened.topics().values():  # every listed partition is there and usable
            for p in range(info.partitions):
                plog = reopened.get_partition(TopicPartition(info.name, p))
                assert plog is not None
        left = {p.name.rsplit("-", 1)[0] for p in scratch.iterdir() if p.is_dir()}
        assert left <= names  # unlisted directories were deleted
        return names
    finally:
        reopened.close()


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[LogManager]:
    m = LogManager(tmp_path / "data", LogConfig(), now_ms=NOW)
    yield m
    m.close()


def test_two_creates_and_a_delete_in_flight_commit_in_any_order(manager: LogManager, tmp_path: Path) -> None:
    data, scratch = manager.data_dir, tmp_path / "restart"
    manager.create_topic("old", 1, {}, now_ms=NOW)
    a = manager.prepare_create([NewTopic("a", 2, {})], now_ms=NOW)
    b = manager.prepare_create([NewTopic("b", 1, {"retention.ms": "5"})], now_ms=NOW)
    gone = manager.prepare_delete("old")
    # prepared: nothing published, no file touched (the partitions are made by the persist
    # step, off the owner's thread); the names are taken
    assert manager.topics().keys() == set() and _listed(data) == {"old"}
    assert manager.get_partition(TopicPartition("a", 0)) is None
    assert not (data / "a-0").exists() and (data / "old-0").is_dir()
    with pytest.raises(TopicExistsError):
        manager.prepare_create([NewTopic("a", 1, {})], now_ms=NOW)
    with pytest.raises(TopicExistsError):  # a name being deleted is not free yet (Kafka too)
        manager.prepare_create([NewTopic("old", 1, {})], now_ms=NOW)
    with pytest.raises(UnknownTopicError):
        manager.prepare_delete("old")
    assert _restart_sees(data, scratch) == {"old"}

    manager.persist_topic_change(b)  # out of prepare order: the changes commute
    assert _listed(data) == {"old", "b"}
    assert _restart_sees(data, scratch) == {"old", "b"}
    manager.persist_topic_change(gone)
    assert _listed(data) == {"b"} and not (data / "old-0").exists()
    assert _restart_sees(data, scratch) == {"b"}
    manager.persist_topic_change(a)
    assert (data / "a-1" / LEADER_EPOCH_CHECKPOINT).read_text() == "0\n1\n0 0\n"
    assert _listed(data) == {"a", "b"}
    assert _restart_sees(data, scratch) == {"a", "b"}
    assert manager.topics().keys() == set()  # published only on complete

    for plan in (b, gone, a):
        manager.complete_topic_change(plan, None)
    assert manager.topics().keys() == {"a", "b"}
    plog = manager.get_partition(TopicPartition("a", 1))
    assert plog is not None
    append(plog, 2)
    # a's snapshot was taken before "old" was deleted: the writer kept it out all the same
    written = read_offset_checkpoint(data / RECOVERY_POINT_CHECKPOINT)
    assert written is not None and {tp.topic for tp in written} == {"a"}
    manager.checkpoint_recovery_points()
    assert read_offset_checkpoint(data / RECOVERY_POINT_CHECKPOINT) == {
        TopicPartition("a", 0): 0,
        TopicPartition("a", 1): 0,
        TopicPartition("b", 0): 0,
    }
    manager.create_topic("old", 1, {}, now_ms=NOW)  # the name is free again


def test_a_failed_persist_leaves_the_topic_nowhere(
    manager: LogManager, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = manager.data_dir
    failing = manager.prepare_create([NewTopic("fails", 2, {})], now_ms=NOW)
    other = manager.prepare_create([NewTopic("other", 1, {})], now_ms=NOW)
    real_write = topics_file.write_durably

    def no_space(path: Path, payload: bytes, **kwargs: Any) -> None:
        if path.name == TOPICS_FILE:
            raise OSError(28, "No space left on device")
        real_write(path, payload, **kwargs)

    monkeypatch.setattr(topics_file, "write_durably", no_space)
    with pytest.raises(OSError):
        manager.persist_topic_change(failing)
    monkeypatch.undo()
    manager.persist_topic_change(other)  # "committed + this change": not the failed one
    assert _listed(data) == {"other"}
    manager.complete_topic_change(failing, OSError(28, "No space left on device"))
    manager.complete_topic_change(other, None)
    assert manager.topics().keys() == {"other"}
    assert not (data / "fails-0").exists() and not (data / "fails-1").exists()
    assert manager.get_partition(TopicPartition("fails", 0)) is None
    assert _restart_sees(data, tmp_path / "restart") == {"other"}
    assert manager.create_topic("fails", 1, {}, now_ms=NOW).partitions == 1  # released


def test_a_failed_delete_keeps_the_topic_serving(
    manager: LogManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager.create_topic("t", 1, {}, now_ms=NOW)
    plog = manager.get_partition(TopicPartition("t", 0))
    assert plog is not None
    append(plog, 3)

    def no_space(path: Path, payload: bytes, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(topics_file, "write_durably", no_space)
    with pytest.raises(OSError):
        manager.delete_topic("t")
    monkeypatch.undo()
    assert manager.topic("t") is not None and manager.get_partition(TopicPartition("t", 0)) is plog
    append(plog, 1)
    assert plog.log_end_offset == 4 and _listed(manager.data_dir) == {"t"}
    manager.delete_topic("t")
    assert manager.topics() == {} and not (manager.data_dir / "t-0").exists()


def test_a_create_of_many_topics_writes_topics_json_and_the_checkpoint_once(
    manager: LogManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    written: list[str] = []
    real_write = topics_file.write_durably

    def counting(path: Path, payload: bytes, **kwargs: Any) -> None:
        written.append(path.name)
        real_write(path, payload, **kwargs)

    monkeypatch.setattr(topics_file, "write_durably", counting)
    monkeypatch.setattr("exactly.storage.checkpoint.write_durably", counting)
    monkeypatch.setattr("exactly.storage.leader_epoch.write_durably", counting)
    plan = manager.prepare_create([NewTopic(f"t{i}", 2, {}) for i in range(5)], now_ms=NOW)
    assert written == []  # preparing writes nothing durable
    manager.apply_topic_change(plan)
    assert written.count(TOPICS_FILE) == 1
    assert written.count(RECOVERY_POINT_CHECKPOINT) == 1
    assert written.count(LEADER_EPOCH_CHECKPOINT) == 10
    assert written.count(LOG_START_OFFSET_CHECKPOINT) <= 1
    assert written.index(TOPICS_FILE) == len(written) - 1  # the commit point comes last
    assert len(manager.topics()) == 5


def test_add_partitions_in_flight_reserves_the_topic(manager: LogManager, tmp_path: Path) -> None:
    manager.create_topic("t", 1, {}, now_ms=NOW)
    grow = manager.prepare_add_partitions("t", 3, now_ms=NOW)
    info = manager.topic("t")
    assert info is not None and info.partitions == 1  # still the published topic
    with pytest.raises(UnknownTopicError):
        manager.prepare_add_partitions("t", 4, now_ms=NOW)
    with pytest.raises(UnknownTopicError):
        manager.prepare_delete("t")
    assert _restart_sees(manager.data_dir, tmp_path / "restart") == {"t"}
    manager.apply_topic_change(grow)
    info = manager.topic("t")
    assert info is not None and info.partitions == 3
    assert manager.get_partition(TopicPartition("t", 2)) is not None


@pytest.mark.parametrize("persisted", [False, True])
def test_close_with_a_change_in_flight(tmp_path: Path, persisted: bool) -> None:
    data = tmp_path / "data"
    manager = LogManager(data, LogConfig(), now_ms=NOW)
    plan = manager.prepare_create([NewTopic("t", 2, {})], now_ms=NOW)
    if persisted:
        manager.persist_topic_change(plan)
    manager.close()  # the broker shut down before the completion ran
    manager.complete_topic_change(plan, None)  # a late completion does nothing
    with pytest.raises(topics_file.TopicsWriterStopped):
        manager.persist_topic_change(plan)
    reopened = LogManager(data, LogConfig(), now_ms=NOW)
    assert set(reopened.topics()) == ({"t"} if persisted else set())
    assert (data / "t-1").is_dir() == persisted
    reopened.close()


def _crash_inside_create(data_dir: Path, *, before_topics_file: bool) -> None:
    """Child process: create two topics in one change and die like kill -9 just before or just
    after topics.json is written (after the epoch checkpoints, before completion)."""
    from tests.storage.test_log_manager import _die_around_topics_file

    manager = LogManager(data_dir, LogConfig(), now_ms=NOW)
    plan = manager.prepare_create([NewTopic("x", 2, {}), NewTopic("y", 1, {})], now_ms=NOW)
    _die_around_topics_file(before_topics_file)
    manager.persist_topic_change(plan)
    os._exit(0)  # not reached


@pytest.mark.parametrize("before_topics_file", [True, False])
def test_a_create_killed_between_prepare_and_complete(tmp_path: Path, before_topics_file: bool) -> None:
    manager = LogManager(tmp_path, LogConfig(), now_ms=NOW)
    manager.create_topic("kept", 1, {}, now_ms=NOW)
    manager.close()
    child = multiprocessing.get_context("fork").Process(
        target=_crash_inside_create, args=(tmp_path,), kwargs={"before_topics_file": before_topics_file}
    )
    child.start()
    child.join(30)
    assert child.exitcode == 9
    assert (tmp_path / "x-1").is_dir()  # prepared before the crash

    if not before_topics_file:  # the epoch checkpoints were written before the commit point
        for name in ("x-0", "x-1", "y-0"):
            assert (tmp_path / name / LEADER_EPOCH_CHECKPOINT).read_text() == "0\n1\n0 0\n"
    reopened = LogManager(tmp_path, LogConfig(), now_ms=NOW)
    expected = {"kept"} if before_topics_file else {"kept", "x", "y"}
    assert set(reopened.topics()) == expected
    dirs = sorted(p.name for p in tmp_path.iterdir() if p.is_dir())
    assert dirs == (["kept-0"] if before_topics_file else ["kept-0", "x-0", "x-1", "y-0"])
    if not before_topics_file:  # whole: every partition there, epoch 0 recorded, writable
        for tp in (TopicPartition("x", 0), TopicPartition("x", 1), TopicPartition("y", 0)):
            plog = reopened.get_partition(tp)
            assert plog is not None
            append(plog, 2)
            assert plog.log_end_offset == 2
    reopened.close()
