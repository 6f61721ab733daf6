"""Every metadata file is replaced durably: data fsync, rename, then the directory's fsync.

The file system calls are recorded (not faked: they still run), so each test checks the order a
power loss cares about. Without the final directory fsync the rename may not be on disk, and the
file rolls back to its old content after a power loss; the coordinator epoch file once had that
bug.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from exactly.coordinator.producer_id.manager import ProducerIdManager
from exactly.server.txn_runtime import _bump_epoch
from exactly.storage.checkpoint import read_offset_checkpoint, write_offset_checkpoint
from exactly.storage.durable import write_durably
from exactly.storage.leader_epoch import LeaderEpochCache
from exactly.storage.producer_entry import BatchMetadata, ProducerStateEntry
from exactly.storage.producer_snapshot import read_snapshot, write_snapshot
from exactly.types import TopicPartition

Event = tuple[str, str]  # ("fsync-file" | "fsync-dir" | "replace", name)


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Event]]:
    seen: list[Event] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        info = os.fstat(fd)
        kind = "fsync-dir" if stat.S_ISDIR(info.st_mode) else "fsync-file"
        seen.append((kind, os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        seen.append(("replace", str(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    yield seen


def assert_durable_replace(events: list[Event], path: Path) -> None:
    """The data was fsynced before the rename over ``path``, and its directory after it."""
    path = path.resolve()
    target = str(path)
    replaced = [i for i, (kind, name) in enumerate(events) if kind == "replace" and name == target]
    assert replaced, f"{path} was not replaced atomically: {events}"
    last = replaced[-1]
    before, after = events[:last], events[last + 1 :]
    assert ("fsync-file", target + ".tmp") in before, f"data not fsynced before the rename: {events}"
    assert ("fsync-dir", str(path.parent)) in after, f"directory not fsynced after the rename: {events}"


def test_write_durably(events: list[Event], tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"old")
    write_durably(path, b"new" * 10_000)
    assert path.read_bytes() == b"new" * 10_000
    assert not (tmp_path / "f.tmp").exists()
    assert_durable_replace(events, path)


def test_write_durably_without_durability_still_replaces_atomically(
    events: list[Event], tmp_path: Path
) -> None:
    path = tmp_path / "f"
    write_durably(path, b"x", durable=False)
    assert path.read_bytes() == b"x"
    assert events == [("replace", str(path))]


def test_recovery_point_checkpoint(events: list[Event], tmp_path: Path) -> None:
    path = tmp_path / "recovery-point-offset-checkpoint"
    write_offset_checkpoint(path, {TopicPartition("t", 0): 5})
    assert read_offset_checkpoint(path) == {TopicPartition("t", 0): 5}
    assert_durable_replace(events, path)


def test_leader_epoch_checkpoint(events: list[Event], tmp_path: Path) -> None:
    cache = LeaderEpochCache(tmp_path)
    cache.assign(3, 100)
    assert LeaderEpochCache(tmp_path).latest_epoch == 3
    assert_durable_replace(events, cache.path)


def test_producer_snapshot(events: list[Event], tmp_path: Path) -> None:
    entry = ProducerStateEntry(7, 1, (BatchMetadata(0, 4, 14, 4, 99),), -1, 99, None)
    path = write_snapshot(tmp_path, 15, [entry])
    assert read_snapshot(path) == [entry]
    assert_durable_replace(events, path)


def test_producer_id_block(events: list[Event], tmp_path: Path) -> None:
    path = tmp_path / "producer-ids"
    manager = ProducerIdManager(path, block_size=10)
    assert manager.generate() == 0
    assert ProducerIdManager(path).reserved_end == 10
    assert_durable_replace(events, path)


def test_transaction_coordinator_epoch(events: list[Event], tmp_path: Path) -> None:
    path = tmp_path / "txn-coordinator-epoch"
    assert _bump_epoch(path) == 0
    assert _bump_epoch(path) == 1
    assert_durable_replace(events, path)
