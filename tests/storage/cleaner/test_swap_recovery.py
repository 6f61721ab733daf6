"""Crash safety of the swap (Kafka's testRecoveryAfterCrash): stop a swap at each step as a
kill -9 would, reopen the log from disk, and find either the old or the cleaned segments, with
every offset unchanged and the newest value of every key."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from exactly.storage.cleaner.swap import SwapStep
from exactly.storage.partition_log import PartitionLog
from tests.storage.cleaner.helpers import (
    COMPACT,
    NOW,
    TxnProducer,
    aborted,
    append_keyed,
    committed_key_values,
    key_values,
    offsets_in,
    open_compacted,
    run_clean,
)
from tests.storage.helpers import crash


class SimulatedCrash(BaseException):
    """Not an Exception: the cleaner's error handling must not tidy up, as after a kill -9."""


def stop_at(step: SwapStep, occurrence: int = 1):  # type: ignore[no-untyped-def]
    seen = {"n": 0}

    def hook(current: SwapStep) -> None:
        if current is step:
            seen["n"] += 1
            if seen["n"] == occurrence:
                raise SimulatedCrash(step.value)

    return hook


ONE_GROUP = dataclasses.replace(COMPACT, segment_bytes=1 << 20)


def build(directory: Path) -> PartitionLog:
    """Several segments of overwritten keys, plus an aborted transaction whose marker is kept;
    reopened with a segment size that makes them one cleaning group (one swap)."""
    log = open_compacted(directory)
    p = TxnProducer(log, 1)
    p([100, 101])
    p.abort()
    for i in range(80):
        append_keyed(log, [(i % 6, i)])
    log.roll(NOW)
    assert len(log.segments) > 3
    log.close()
    return open_compacted(directory, ONE_GROUP)


def snapshot(log: PartitionLog) -> tuple[dict[int, bytes | None], list[int], list[tuple[int, int, int]]]:
    return key_values(log), offsets_in(log), aborted(log)


@pytest.fixture
def cleaned_state(tmp_path: Path) -> tuple[dict[int, bytes | None], list[int], list[tuple[int, int, int]]]:
    log = build(tmp_path / "reference")
    run_clean(log)
    state = snapshot(log)
    log.close()
    return state


BEFORE_COMMIT = [SwapStep.CLEANED_FLUSHED, SwapStep.SWAP_INDEXES_RENAMED]
AFTER_COMMIT = [
    SwapStep.SWAP_COMMITTED,
    SwapStep.OLD_SEGMENT_RENAMED,
    SwapStep.NEW_LOG_RENAMED,
    SwapStep.SWAP_DONE,
    SwapStep.OLD_FILES_DELETED,
]


@pytest.mark.parametrize("step", BEFORE_COMMIT + AFTER_COMMIT, ids=lambda s: s.value)
@pytest.mark.parametrize("recovery_point", ["none", "log_end"])
def test_crash_at_each_swap_step(
    tmp_path: Path,
    step: SwapStep,
    recovery_point: str,
    cleaned_state: tuple[dict[int, bytes | None], list[int], list[tuple[int, int, int]]],
) -> None:
    directory = tmp_path / "log"
    log = build(directory)
    original = snapshot(log)
    committed_key_values_before = committed_key_values(log)
    assert 100 not in committed_key_values_before
    end = log.log_end_offset
    log.flush()
    with pytest.raises(SimulatedCrash):
        run_clean(log, hook=stop_at(step))
    crash(log)
    reopened = PartitionLog.open(
        directory, log.tp, log.config, recovery_point=None if recovery_point == "none" else end, now_ms=NOW
    )
    state = snapshot(reopened)
    assert state == (original if step in BEFORE_COMMIT else cleaned_state)
    # The newest committed value of every key, either way.
    assert committed_key_values(reopened) == committed_key_values_before
    assert reopened.log_end_offset == end
    assert not [p.name for p in directory.iterdir() if p.name.endswith((".cleaned", ".swap", ".deleted"))]
    # The recovered log cleans again and appends on.
    run_clean(reopened)
    assert snapshot(reopened) == cleaned_state
    assert append_keyed(reopened, [(1, 1)]).first_offset == end
    reopened.close()


def test_crash_with_some_old_segments_renamed(
    tmp_path: Path, cleaned_state: tuple[dict[int, bytes | None], list[int], list[tuple[int, int, int]]]
) -> None:
    # A group of several old segments, stopped after the first one became .deleted.
    directory = tmp_path / "log"
    log = build(directory)
    end = log.log_end_offset
    with pytest.raises(SimulatedCrash):
        run_clean(log, hook=stop_at(SwapStep.OLD_SEGMENT_RENAMED, occurrence=1))
    assert any(p.name.endswith(".deleted") for p in directory.iterdir())
    crash(log)
    reopened = PartitionLog.open(directory, log.tp, log.config, recovery_point=None, now_ms=NOW)
    assert snapshot(reopened) == cleaned_state
    assert reopened.log_end_offset == end
    reopened.close()


def test_stray_cleaned_files_of_a_lost_pass_are_removed(tmp_path: Path) -> None:
    log = build(tmp_path)
    original = snapshot(log)
    with pytest.raises(SimulatedCrash):
        run_clean(log, hook=stop_at(SwapStep.CLEANED_FLUSHED))
    assert any(p.name.endswith(".log.cleaned") for p in tmp_path.iterdir())
    crash(log)
    reopened = open_compacted(tmp_path, ONE_GROUP)
    assert snapshot(reopened) == original
    reopened.close()


MANY_GROUPS = dataclasses.replace(COMPACT, segment_bytes=600)


def build_many(directory: Path) -> PartitionLog:
    """As ``build``, reopened with a segment size that makes the pass several groups, all
    swapped in together (one directory fsync per step)."""
    log = build(directory)
    log.close()
    return open_compacted(directory, MANY_GROUPS)


@pytest.mark.parametrize(
    ("step", "occurrence"),
    [
        (SwapStep.SWAP_INDEXES_RENAMED, 2),  # inside step 1: the first group committed, not the second
        (SwapStep.SWAP_COMMITTED, 1),
        (SwapStep.OLD_SEGMENT_RENAMED, 2),
        (SwapStep.NEW_LOG_RENAMED, 2),  # inside step 3: the first group done, the second half-way
        (SwapStep.SWAP_DONE, 1),
    ],
    ids=lambda v: v.value if isinstance(v, SwapStep) else str(v),
)
def test_crash_inside_a_swap_of_several_groups(tmp_path: Path, step: SwapStep, occurrence: int) -> None:
    reference = build_many(tmp_path / "reference")
    run_clean(reference)
    cleaned = snapshot(reference)
    reference.close()
    directory = tmp_path / "log"
    log = build_many(directory)
    original = snapshot(log)
    values_before = committed_key_values(log)
    end = log.log_end_offset
    groups: list[int] = []

    def hook(current: SwapStep) -> None:
        if current is SwapStep.SWAP_INDEXES_RENAMED:
            groups.append(1)
        stop_at_step(current)

    stop_at_step = stop_at(step, occurrence)
    with pytest.raises(SimulatedCrash):
        run_clean(log, hook=hook)
    assert len(groups) >= 2  # the pass really swapped several groups in one go
    crash(log)
    reopened = PartitionLog.open(directory, log.tp, log.config, recovery_point=None, now_ms=NOW)
    state = snapshot(reopened)
    # No record moved to another offset and the newest committed value of every key stayed,
    # whichever groups made it (a prefix of them for a crash inside step 1, all once it is done).
    assert set(cleaned[1]) <= set(state[1]) <= set(original[1])
    assert state[1] == sorted(state[1])
    assert committed_key_values(reopened) == values_before
    assert reopened.log_end_offset == end
    if step is SwapStep.SWAP_INDEXES_RENAMED:
        assert state not in (original, cleaned)  # the first group in, the others not
    else:
        assert state == cleaned
    assert not [p.name for p in directory.iterdir() if p.name.endswith((".cleaned", ".swap", ".deleted"))]
    run_clean(reopened)
    assert snapshot(reopened) == cleaned
    reopened.close()
