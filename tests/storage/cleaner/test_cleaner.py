"""One cleaning pass: key retention, tombstones, multi-pass, grouping (Kafka's LogCleanerTest)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from exactly.records.rebuild import delete_horizon_of
from exactly.storage.cleaner.batch_filter import TICK_RECORDS
from exactly.storage.cleaner.cleanable import cleanable_offsets, group_segments_by_size, log_to_clean
from exactly.storage.cleaner.cleaner import run_pass
from exactly.storage.cleaner.job import (
    CleanedSegment,
    describe_pass,
    read_next_offset,
    remove_cleaned_files,
    source_of,
)
from exactly.storage.cleaner.offset_map import OffsetMap
from exactly.storage.config import LogConfig
from exactly.storage.partition_log import PartitionLog
from tests.storage.cleaner.helpers import (
    COMPACT,
    NOW,
    append_keyed,
    batches,
    key_values,
    keys_in,
    offsets_in,
    open_compacted,
    run_clean,
    two_pass_clean,
)
from tests.storage.helpers import TP


def test_clean_keeps_the_newest_record_of_each_key_and_every_offset(tmp_path: Path) -> None:
    log = open_compacted(tmp_path)
    for i in range(60):
        append_keyed(log, [(i % 5, i)])
    assert len(log.segments) > 2
    before = key_values(log)
    log.roll(NOW)
    end, stats = run_clean(log)
    assert end == 60
    assert key_values(log) == before
    assert keys_in(log) == [0, 1, 2, 3, 4]
    assert offsets_in(log) == [55, 56, 57, 58, 59]  # offsets never change
    assert stats.records_read == 60 and stats.records_written == 5
    assert log.log_end_offset == 60
    # The next append continues after the log end, and reads still work across the gaps.
    assert append_keyed(log, [1]).first_offset == 60
    assert [h.base_offset for h, _ in batches(log)] == [55, 56, 57, 58, 59, 60]
    log.close()


def test_active_segment_is_never_cleaned(tmp_path: Path) -> None:
    log = open_compacted(tmp_path)
    for i in range(10):
        append_keyed(log, [(1, i)])
    assert len(log.segments) == 1
    end, _stats = run_clean(log)
    assert end == 0
    assert offsets_in(log) == list(range(10))
    log.close()


def test_unkeyed_records_are_dropped(tmp_path: Path) -> None:
    # Kafka's testCleaningWithUnkeyedMessages: old data may hold keyless records.
    from exactly.records.batch import BatchHeader
    from exactly.records.builder import Record, build_batch

    log = open_compacted(tmp_path)
    append_keyed(log, [1, 2])
    raw = bytearray(build_batch([Record(value=b"x"), Record(value=b"y")], base_timestamp=NOW))
    log.append(raw, BatchHeader.parse(raw), leader_epoch=0, now_ms=NOW)
    log.update_high_watermark(log.log_end_offset)
    append_keyed(log, [3])
    log.roll(NOW)
    run_clean(log)
    assert keys_in(log) == [1, 2, 3]
    assert offsets_in(log) == [0, 1, 4]
    log.close()


def test_tombstone_is_kept_until_its_horizon_then_removed(tmp_path: Path) -> None:
    # Kafka's testCleaningWithDeletes / testCleanTombstone: the horizon comes from the clean time.
    log = open_compacted(tmp_path)
    append_keyed(log, [(1, 1), (2, 2)])
    append_keyed(log, [(1, None)], timestamp=0)  # an old timestamp does not matter
    log.roll(NOW)
    run_clean(log, now_ms=NOW)
    assert keys_in(log) == [2, 1]
    tomb = [h for h, rs in batches(log) if any(r.value is None for r in rs)]
    assert [delete_horizon_of(h) for h in tomb] == [NOW + COMPACT.delete_retention_ms]
    # Still inside delete.retention.ms: kept.
    run_clean(log, now_ms=NOW + COMPACT.delete_retention_ms - 1)
    assert keys_in(log) == [2, 1]
    # Past the horizon: gone; the record it deleted went in the first pass.
    run_clean(log, now_ms=NOW + COMPACT.delete_retention_ms)
    assert keys_in(log) == [2]
    assert key_values(log) == {2: b"2"}
    log.close()


def test_two_pass_clean_removes_tombstones(tmp_path: Path) -> None:
    log = open_compacted(tmp_path)
    for i in range(20):
        append_keyed(log, [(i % 4, i)])
    for key in (0, 1):
        append_keyed(log, [(key, None)])
    log.roll(NOW)
    two_pass_clean(log)
    assert key_values(log) == {2: b"18", 3: b"19"}
    log.close()


def test_multi_pass_cleaning_with_a_small_offset_map(tmp_path: Path) -> None:
    # Kafka's testPartialSegmentClean: with a one-key map the dirty offset advances key by key.
    log = open_compacted(tmp_path)
    append_keyed(log, [(0, 0)])
    append_keyed(log, [(1, 1)])
    append_keyed(log, [(0, 2)])
    append_keyed(log, [(1, 3)])
    append_keyed(log, [(0, 4)])
    log.roll(NOW)
    end, _ = run_clean(log, first_dirty=2, map_entries=1)
    assert end == 3
    end, _ = run_clean(log, first_dirty=end, map_entries=1)
    assert end == 4
    assert key_values(log) == {0: b"4", 1: b"3"}
    # Passes until the whole dirty section is clean give the one-pass result.
    end = 0
    while end < 5:
        end, _ = run_clean(log, first_dirty=end, map_entries=1)
    assert keys_in(log) == [1, 0] and offsets_in(log) == [3, 4]
    log.close()


def test_many_keys_cleaned_in_several_passes_equal_one_pass(tmp_path: Path) -> None:
    small, big = tmp_path / "small", tmp_path / "big"
    logs = [open_compacted(small), open_compacted(big)]
    for log in logs:
        for i in range(200):
            append_keyed(log, [(i % 37, i), ((i * 7) % 53, i)])
        log.roll(NOW)
    end, passes = 0, 0
    while end < logs[0].log_end_offset - 0:
        end, _ = run_clean(logs[0], first_dirty=end, map_entries=10)
        passes += 1
        if end >= logs[0].segments[-1].base_offset:
            break
    run_clean(logs[1])
    assert passes > 3
    assert key_values(logs[0]) == key_values(logs[1])
    assert offsets_in(logs[0]) == offsets_in(logs[1])
    for log in logs:
        log.close()


def test_segments_are_grouped_up_to_the_segment_size(tmp_path: Path) -> None:
    # Kafka's testSegmentGrouping: small segments are merged into one per segment.bytes.
    small = LogConfig(cleanup_policy="compact", segment_bytes=300, index_interval_bytes=64)
    log = open_compacted(tmp_path, small)
    for i in range(60):
        append_keyed(log, [(i, i)])  # all keys distinct: nothing is removed
    log.roll(NOW)
    log.close()
    log = open_compacted(tmp_path, dataclasses.replace(small, segment_bytes=1000))
    sizes_before = [s.size for s in log.segments[:-1]]
    run_clean(log)
    sizes_after = [s.size for s in log.segments[:-1]]
    assert sum(sizes_after) == sum(sizes_before)
    assert len(sizes_after) < len(sizes_before)
    assert all(size <= 1000 for size in sizes_after)
    assert offsets_in(log) == list(range(60))
    groups = group_segments_by_size(
        [source_of(s) for s in log.segments[:-1]], 10_000, 10_000, log.segments[-1].base_offset
    )
    assert [len(g) for g in groups] == [len(sizes_after)]
    log.close()


def test_grouping_respects_the_index_size(tmp_path: Path) -> None:
    small = LogConfig(cleanup_policy="compact", segment_bytes=300, index_interval_bytes=1)
    log = open_compacted(tmp_path, small)
    for i in range(60):
        append_keyed(log, [(i, i)])
    log.roll(NOW)
    segments = log.segments[:-1]
    entries = [len(s.offset_index) for s in segments]
    assert min(entries) > 0
    per_group = 2
    sources = [source_of(s) for s in segments]
    groups = group_segments_by_size(
        sources, 1 << 30, per_group * max(entries) * 8, log.segments[-1].base_offset
    )
    assert all(sum(s.offset_index_bytes for s in g) <= per_group * max(entries) * 8 for g in groups)
    assert [s for g in groups for s in g] == sources
    assert len(groups) >= len(segments) // per_group
    log.close()


def test_cleaned_log_survives_a_clean_reopen(tmp_path: Path) -> None:
    log = open_compacted(tmp_path)
    for i in range(60):
        append_keyed(log, [(i % 5, i)])
    log.roll(NOW)
    run_clean(log)
    expected = (key_values(log), offsets_in(log))
    log.close()
    reopened = open_compacted(tmp_path)
    assert (key_values(reopened), offsets_in(reopened)) == expected
    assert reopened.log_end_offset == 60
    reopened.close()


def test_snapshots_of_merged_segments_are_deleted_and_state_survives(tmp_path: Path) -> None:
    small = LogConfig(cleanup_policy="compact", segment_bytes=300, index_interval_bytes=64)
    log = open_compacted(tmp_path, small)
    for i in range(60):
        append_keyed(log, [(i % 3, i)])
    log.roll(NOW)
    log.close()
    # A clean restart (recovery point at the log end) keeps the snapshots of every roll.
    log = PartitionLog.open(
        tmp_path, TP, dataclasses.replace(small, segment_bytes=100_000), recovery_point=60, now_ms=NOW
    )
    snapshots_before = sorted(int(p.name[:20]) for p in tmp_path.glob("*.snapshot"))
    assert len(snapshots_before) > 3
    run_clean(log)
    snapshots_after = sorted(int(p.name[:20]) for p in tmp_path.glob("*.snapshot"))
    bases = {s.base_offset for s in log.segments}
    assert set(snapshots_after) <= bases | {log.log_end_offset}
    assert len(snapshots_after) < len(snapshots_before)
    expected = key_values(log)
    log.close()
    reopened = open_compacted(tmp_path)
    assert key_values(reopened) == expected and reopened.log_end_offset == 60
    reopened.close()


def test_a_batch_partly_superseded_is_rebuilt_with_its_surviving_values(tmp_path: Path) -> None:
    # The retain decision reads keys only; the batch is decoded whole only when it is rebuilt.
    log = open_compacted(tmp_path)
    append_keyed(log, [(1, 10), (2, 20), (3, 30), (4, None)])  # offsets 0-3: 1 and 3 superseded
    append_keyed(log, [(1, 11), (3, 31)])  # 4-5: superseded whole, dropped without a decode
    append_keyed(log, [(1, 12), (3, 32)])  # 6-7: kept whole, copied byte for byte
    log.roll(NOW)
    end, stats = run_clean(log)
    assert end == 8
    assert offsets_in(log) == [1, 3, 6, 7]
    assert key_values(log) == {2: b"20", 4: None, 1: b"12", 3: b"32"}
    assert stats.records_read == 8 and stats.records_written == 4
    first = batches(log)[0][0]
    assert (first.base_offset, first.last_offset) == (0, 3)  # offsets and last offset kept
    assert delete_horizon_of(first) == NOW + COMPACT.delete_retention_ms  # its tombstone's clock starts
    log.close()


def test_a_described_segment_is_bounded_by_the_next_segments_base(tmp_path: Path) -> None:
    """The broker describes a pass without reading segment files: each segment's offsets are
    bounded by the next segment's base, which is at or past what a scan of the file finds."""
    log = open_compacted(tmp_path, dataclasses.replace(COMPACT, segment_bytes=300))
    for i in range(40):
        append_keyed(log, [(i % 4, i)])
    log.roll(NOW)
    offsets = cleanable_offsets(
        log.segments,
        log_start_offset=log.log_start_offset,
        log_end_offset=log.log_end_offset,
        last_stable_offset=log.last_stable_offset,
        checkpoint=None,
        config=log.config,
        now_ms=NOW,
    )
    job = describe_pass(log, log_to_clean(log.segments, offsets, log.config, NOW), NOW)
    assert len(job.segments) == len(log.segments) - 1 > 2
    for source, segment, following in zip(job.segments, log.segments, log.segments[1:], strict=False):
        assert source.next_offset == following.base_offset
        assert read_next_offset(segment) <= source.next_offset
    log.close()


def test_the_pass_ticks_within_big_batches_and_writes_the_same(tmp_path: Path) -> None:
    """``tick`` (where the worker's CPU duty cycle sleeps) is called every TICK_RECORDS records
    while a batch is mapped and filtered, not once per batch, and changes nothing written."""
    log = open_compacted(tmp_path)
    for b in range(3):
        append_keyed(log, [(i % 50, b * 1000 + i) for i in range(1000)])
        log.roll(NOW)
    append_keyed(log, [1])
    offsets = cleanable_offsets(
        log.segments,
        log_start_offset=log.log_start_offset,
        log_end_offset=log.log_end_offset,
        last_stable_offset=log.last_stable_offset,
        checkpoint=None,
        config=log.config,
        now_ms=NOW,
    )
    job = describe_pass(log, log_to_clean(log.segments, offsets, log.config, NOW), NOW)

    def cleaned_bytes(tick: Callable[[], None] | None) -> list[bytes]:
        written: list[CleanedSegment] = []
        kwargs = {} if tick is None else {"tick": tick}
        run_pass(job, OffsetMap(1 << 20), written.append, **kwargs)
        out = [
            p.read_bytes() for c in written for p in sorted(tmp_path.glob(f"{c.base_offset:020d}.*.cleaned"))
        ]
        remove_cleaned_files(job.directory, [c.base_offset for c in written])
        return out

    ticks: list[int] = []
    with_ticks = cleaned_bytes(lambda: ticks.append(1))
    assert len(ticks) >= 2 * 3000 // TICK_RECORDS  # the map, then the filter, of 3 batches of 1,000
    assert with_ticks == cleaned_bytes(None) and with_ticks
    log.close()
