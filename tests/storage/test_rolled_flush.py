"""The rolled-segment flush split into plan / fsync / complete (storage.rolled_flush): the
recovery point moves only after the fsync, and a completion after the log changed under it is
dropped rather than claiming data that is gone or was never fsynced."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from exactly.storage.config import LogConfig
from exactly.storage.log_manager import LogManager
from exactly.storage.partition_log import PartitionLog
from exactly.storage.rolled_flush import (
    RolledFlushPlan,
    complete_rolled_flushes,
    flush_rolled,
    fsync_plan,
    fsync_plans,
    plan_rolled_flushes,
    rolled_flush_steps,
)
from tests.storage.cleaner.helpers import append_keyed, open_compacted, run_clean
from tests.storage.helpers import NOW, TP, append, open_log


def _fsynced_paths(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the path of every descriptor os.fsync is called on (then fsync it for real)."""
    seen: list[str] = []
    real = os.fsync

    def recording(fd: int) -> None:
        try:
            seen.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            seen.append(f"<closed fd {fd}>")
        real(fd)

    monkeypatch.setattr(os, "fsync", recording)
    return seen


def _rolled(tmp_path: Path, segments: int = 3) -> PartitionLog:
    """A log with ``segments`` rolled segments of 2 records each and an empty active one."""
    log = open_log(tmp_path)
    for _ in range(segments):
        append(log, 2)
        log.roll(NOW)
    return log


@pytest.fixture
def log(tmp_path: Path) -> Iterator[PartitionLog]:
    plog = _rolled(tmp_path)
    yield plog
    plog.close()


def test_the_recovery_point_moves_only_when_the_plan_completes(log: PartitionLog) -> None:
    plan = log.rolled_flush_plan()
    assert plan is not None
    assert plan.target == log.segments[-1].base_offset == 6
    assert plan.segments == tuple(log.segments[:-1])
    assert log.recovery_point == 0  # planned, not fsynced
    assert log.rolled_flush_plan() is None  # one plan in flight at a time
    assert fsync_plan(plan)
    assert log.recovery_point == 0  # fsynced, not yet completed
    assert log.complete_rolled_flush(plan)
    assert log.recovery_point == 6
    assert log.rolled_flush_plan() is None  # nothing left to do


def test_the_plan_fsyncs_the_rolled_logs_and_indexes(
    log: PartitionLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _fsynced_paths(monkeypatch)
    plan = log.rolled_flush_plan()
    assert plan is not None
    fsync_plan(plan)
    names = {Path(p).name for p in seen}
    assert {f"{base:020d}.log" for base in (0, 2, 4)} <= names
    assert f"{4:020d}.timeindex" in names  # the roll's max-timestamp entry
    assert f"{6:020d}.snapshot" in names  # the roll's producer snapshot
    assert f"{6:020d}.log" not in names  # not the active segment


def test_a_synchronous_flush_during_the_flight_fsyncs_the_planned_segments(
    log: PartitionLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = log.rolled_flush_plan()
    assert plan is not None
    seen = _fsynced_paths(monkeypatch)
    append(log, 1)
    log.flush()  # flush.ms / DeleteRecords / close: must not rely on the background fsync
    names = {Path(p).name for p in seen}
    assert {f"{base:020d}.log" for base in (0, 2, 4)} <= names
    assert log.recovery_point == 7
    assert log.complete_rolled_flush(plan)
    assert log.recovery_point == 7  # never moves back


def test_a_truncation_between_plan_and_complete_drops_the_completion(log: PartitionLog) -> None:
    plan = log.rolled_flush_plan()
    assert plan is not None
    log.truncate_to(2)  # a batch boundary: the first segment is the only (active) one left
    assert log.log_end_offset == 2 and len(log.segments) == 1
    fsync_plan(plan)  # the other segments' descriptors are closed: skipped, not raised
    assert not log.complete_rolled_flush(plan)
    assert log.recovery_point == 0
    assert log.segments[0].unflushed  # still in the log: unflushed again
    append(log, 1)
    log.roll(NOW)
    again = log.rolled_flush_plan()
    assert again is not None and again.target == 3
    assert fsync_plan(again)
    assert log.complete_rolled_flush(again)
    assert log.recovery_point == 3 <= log.log_end_offset


def test_deleted_segments_between_plan_and_complete_drop_the_completion(log: PartitionLog) -> None:
    plan = log.rolled_flush_plan()
    assert plan is not None
    log.update_high_watermark(log.log_end_offset)
    assert log.increment_log_start_offset(2)  # DeleteRecords: the first segment goes
    assert log.segments[0].base_offset == 2
    flushed_to = log.recovery_point  # the synchronous flush that moved the start
    fsync_plan(plan)
    assert not log.complete_rolled_flush(plan)
    assert log.recovery_point == flushed_to == log.log_end_offset


def test_retention_between_plan_and_complete_drops_the_completion(tmp_path: Path) -> None:
    log = open_log(tmp_path, LogConfig(retention_ms=1000))
    for _ in range(3):
        append(log, 2, timestamp=NOW)
        log.roll(NOW)
    plan = log.rolled_flush_plan()
    assert plan is not None
    assert log.apply_retention(NOW + 10_000) == 3
    fsync_plan(plan)
    assert not log.complete_rolled_flush(plan)
    assert log.recovery_point <= log.log_end_offset
    assert log.recovery_point == log.log_start_offset == 6  # retention moved the start (and it)
    log.close()


def test_a_cleaner_swap_between_plan_and_complete_drops_the_completion(tmp_path: Path) -> None:
    log = open_compacted(tmp_path)
    for i in range(60):
        append_keyed(log, [(i % 5, i)])
    log.roll(NOW)
    assert len(log.segments) > 3
    plan = log.rolled_flush_plan()
    assert plan is not None
    run_clean(log)  # replaces the planned segments with cleaned (fsynced) ones
    assert not set(map(id, plan.segments)) & set(map(id, log.segments))
    fsync_plan(plan)  # descriptors of deleted segments: skipped
    assert not log.complete_rolled_flush(plan)
    assert log.recovery_point == 0
    again = log.rolled_flush_plan()  # the next maintenance pass plans afresh
    assert again is not None
    fsync_plan(again)
    assert log.complete_rolled_flush(again)
    assert log.recovery_point == log.segments[-1].base_offset == 60
    log.close()


def test_a_failed_fsync_leaves_the_recovery_point_and_the_segments_unflushed(log: PartitionLog) -> None:
    plan = log.rolled_flush_plan()
    assert plan is not None
    assert not any(s.unflushed for s in plan.segments)  # handed over
    assert not log.complete_rolled_flush(plan, ok=False)
    assert log.recovery_point == 0
    assert all(s.unflushed for s in plan.segments)
    log.flush_rolled_segments()  # the synchronous form: plan, fsync, complete
    assert log.recovery_point == 6


def test_a_completion_after_close_is_dropped_and_the_fsync_does_not_crash(tmp_path: Path) -> None:
    log = _rolled(tmp_path)
    plan = log.rolled_flush_plan()
    assert plan is not None
    log.close()  # flushes everything, in-flight segments included
    fsync_plan(plan)  # every descriptor closed (or reused): no exception
    assert not log.complete_rolled_flush(plan)
    assert log.recovery_point == log.log_end_offset == 6


def test_the_log_manager_plans_fsyncs_completes_and_close_stops_it(tmp_path: Path) -> None:
    manager = LogManager(tmp_path, LogConfig(), now_ms=NOW)
    manager.create_topic("t", 1, {}, now_ms=NOW)
    plog = manager.get_partition(TP)
    assert plog is not None
    append(plog, 2)
    plog.roll(NOW)
    manager.run_maintenance(NOW, flush_rolled=False)
    assert plog.recovery_point == 0
    plans = plan_rolled_flushes(manager.partitions())
    assert [p.target for _log, p in plans] == [2]
    fsynced = manager.rolled_flush_runner.fsync(p for _log, p in plans)
    assert fsynced == [True]
    complete_rolled_flushes(plans, fsynced)
    assert plog.recovery_point == 2
    manager.checkpoint_recovery_points()

    append(plog, 1)
    plog.roll(NOW)
    late = plan_rolled_flushes(manager.partitions())
    manager.close()
    assert manager.rolled_flush_runner.fsync(p for _log, p in late) == [False]  # after close: nothing
    complete_rolled_flushes(late, [True])  # dropped even so: the log is closed
    reopened = LogManager(tmp_path, LogConfig(), now_ms=NOW)
    assert reopened.had_clean_shutdown
    again = reopened.get_partition(TP)
    assert again is not None and again.recovery_point == again.log_end_offset == 3
    reopened.close()


def test_run_maintenance_still_flushes_rolled_segments_by_default(tmp_path: Path) -> None:
    manager = LogManager(tmp_path, LogConfig(), now_ms=NOW)
    manager.create_topic("t", 1, {}, now_ms=NOW)
    plog = manager.get_partition(TP)
    assert plog is not None
    append(plog, 2)
    plog.roll(NOW)
    manager.run_maintenance(NOW)
    assert plog.recovery_point == 2
    manager.close()


# --- the producer snapshot written at a roll (Kafka 3.5+: takeSnapshot(sync=false)) -------------


def _snapshot(directory: Path, offset: int) -> Path:
    return directory / f"{offset:020d}.snapshot"


def test_a_roll_writes_its_snapshot_without_fsync_and_the_rolled_flush_fsyncs_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = open_log(tmp_path)
    append(log, 2, producer_id=5, epoch=0, seq=0)
    seen = _fsynced_paths(monkeypatch)
    log.roll(NOW)
    assert _snapshot(tmp_path, 2).exists()
    assert not [p for p in seen if p.endswith(".snapshot")]  # none on the roll (the loop)
    assert log.producer_state.unsynced_snapshots(2) == (2,)
    plan = log.rolled_flush_plan()
    assert plan is not None and plan.snapshots == (2,) and plan.target == 2
    fsync_plan(plan)
    assert str(_snapshot(tmp_path, 2)) in seen
    assert str(tmp_path) in seen  # the rename made durable
    assert log.producer_state.unsynced_snapshots(2) == (2,)  # only completion marks it
    assert log.complete_rolled_flush(plan)
    assert log.producer_state.unsynced_snapshots(2) == ()
    assert log.recovery_point == 2
    log.close()


def test_a_synchronous_flush_fsyncs_an_owed_snapshot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = open_log(tmp_path)
    append(log, 2, producer_id=5, epoch=0, seq=0)
    log.roll(NOW)
    seen = _fsynced_paths(monkeypatch)
    log.flush()
    assert str(_snapshot(tmp_path, 2)) in seen
    assert log.producer_state.unsynced_snapshots(10) == ()
    assert log.recovery_point == 2
    log.close()


def test_a_dropped_plan_leaves_its_snapshot_owed(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    append(log, 2, producer_id=5, epoch=0, seq=0)
    log.roll(NOW)
    append(log, 2, producer_id=5, epoch=0, seq=2)
    log.roll(NOW)
    plan = log.rolled_flush_plan()
    assert plan is not None and plan.snapshots == (2, 4)
    log.truncate_to(2)  # the snapshot at 4 goes with the cut; the one at 2 stays owed
    fsync_plan(plan)  # the deleted snapshot is skipped
    assert not log.complete_rolled_flush(plan)
    assert log.producer_state.unsynced_snapshots(10) == (2,)
    log.close()
    assert log.producer_state.unsynced_snapshots(10) == ()  # close flushed it


def test_a_lost_roll_snapshot_falls_back_to_replay(tmp_path: Path) -> None:
    """A machine crash before the snapshot's fsync may leave it empty: recovery skips it (corrupt)
    and rebuilds the producer state from an older snapshot or the log."""
    log = open_log(tmp_path)
    append(log, 2, producer_id=5, epoch=0, seq=0)
    log.roll(NOW)
    append(log, 1, producer_id=5, epoch=0, seq=2)
    log.flush()
    end = log.log_end_offset
    log.close()
    _snapshot(tmp_path, 3).unlink()  # the snapshot close took at the end
    _snapshot(tmp_path, 2).write_bytes(b"")  # the roll's, as a power loss may leave it
    reopened = open_log(tmp_path, recovery_point=end)
    assert not _snapshot(tmp_path, 2).exists()  # dropped as corrupt
    entry = reopened.producer_state.last_entry(5)
    assert entry is not None and entry.last_seq == 2
    # and the next in-sequence append is accepted
    assert append(reopened, 1, producer_id=5, epoch=0, seq=3).first_offset == 3
    reopened.close()


def test_fsync_plan_reports_what_went_away_instead_of_raising(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT, 0o644)
    assert fsync_plan(RolledFlushPlan((), (fd,), (), tmp_path, 0, 0))
    os.close(fd)
    assert not fsync_plan(RolledFlushPlan((), (fd,), (), tmp_path, 0, 0))  # closed: EBADF
    left, right = socket.socketpair()  # a number reused by a socket: EINVAL
    try:
        assert not fsync_plan(RolledFlushPlan((), (left.fileno(),), (), tmp_path, 0, 0))
    finally:
        left.close()
        right.close()
    assert not fsync_plan(RolledFlushPlan((), (), (7,), tmp_path, 0, 0))  # snapshot deleted
    assert not fsync_plan(RolledFlushPlan((), (), (7,), tmp_path / "gone", 0, 0))  # directory too


def test_the_shared_steps_complete_a_failed_fsync_as_not_ok_and_re_raise(log: PartitionLog) -> None:
    """``rolled_flush_steps`` through its synchronous driver: an fsync step that raises leaves
    the recovery point and hands the segments back (unflushed, no plan in flight)."""
    failed: list[list[RolledFlushPlan]] = []

    def failing(plans: list[RolledFlushPlan]) -> list[bool]:
        failed.append(plans)
        raise OSError(5, "Input/output error")

    with pytest.raises(OSError, match="Input/output"):
        flush_rolled([log], failing)
    assert [p.target for p in failed[0]] == [6]
    assert log.recovery_point == 0
    assert all(s.unflushed for s in failed[0][0].segments)
    flush_rolled([log], lambda plans: [False] * len(plans))  # fsynced only in part: not ok
    assert log.recovery_point == 0
    assert all(s.unflushed for s in failed[0][0].segments)
    flush_rolled([log], fsync_plans)  # planned afresh: nothing was left in flight
    assert log.recovery_point == 6


def test_the_steps_of_several_logs_complete_each_with_its_own_result(tmp_path: Path) -> None:
    one, two = _rolled(tmp_path / "one"), _rolled(tmp_path / "two", segments=2)
    steps = rolled_flush_steps([one, two], fsync_plans)
    next(steps)
    with pytest.raises(StopIteration):
        steps.send([True, False])
    assert (one.recovery_point, two.recovery_point) == (6, 0)
    assert all(s.unflushed for s in two.segments[:-1])
    one.close()
    two.close()


def test_abandoned_steps_complete_nothing(log: PartitionLog) -> None:
    """A driver cancelled while its fsync job may still run closes the steps: the plan stays in
    flight (its segments count as unflushed for a synchronous flush) and nothing moves."""
    steps = rolled_flush_steps([log], fsync_plans)
    job = next(steps)
    steps.close()
    assert log.recovery_point == 0
    assert log.rolled_flush_plan() is None  # still in flight
    assert job() == [True]  # the job itself is harmless after that
    log.flush()  # forces the in-flight segments itself
    assert log.recovery_point == 6


def test_no_plan_means_no_fsync_step(log: PartitionLog) -> None:
    log.flush_rolled_segments()
    assert next(rolled_flush_steps([log], fsync_plans), None) is None
