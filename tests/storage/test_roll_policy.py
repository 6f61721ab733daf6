"""The roll decision (``roll_policy``) on real segments, without a log around them."""

from __future__ import annotations

from pathlib import Path

from exactly.records.batch import BatchHeader, patch_base_offset
from exactly.storage.config import LogConfig
from exactly.storage.roll_policy import (
    MAX_RELATIVE_OFFSET,
    rolls_before_append,
    rolls_before_write,
    rolls_when_idle,
    waited_for_roll,
)
from tests.storage.helpers import NOW, make_batch
from tests.storage.test_segment import fill, new_segment


def next_header(base_offset: int, timestamp: int = NOW) -> BatchHeader:
    batch = make_batch(3, value_size=40, timestamp=timestamp)
    patch_base_offset(batch, 0, base_offset)
    return BatchHeader.parse(batch)


def test_an_empty_segment_never_rolls(tmp_path: Path) -> None:
    segment = new_segment(tmp_path)
    config = LogConfig(segment_bytes=1, segment_ms=1)
    assert not rolls_before_append(segment, next_header(0), config, NOW + 10**9)
    assert not rolls_when_idle(segment, config, NOW + 10**9)


def test_rolls_when_the_batch_would_overflow_segment_bytes(tmp_path: Path) -> None:
    segment = new_segment(tmp_path)
    fill(segment, 2)
    header = next_header(segment.next_offset)
    fits = LogConfig(segment_bytes=segment.size + header.size)
    assert not rolls_before_append(segment, header, fits, NOW)
    overflows = LogConfig(segment_bytes=segment.size + header.size - 1)
    assert rolls_before_append(segment, header, overflows, NOW)


def test_rolls_when_offsets_no_longer_fit_relative_to_the_base(tmp_path: Path) -> None:
    segment = new_segment(tmp_path)
    fill(segment, 1, records=1)
    far = next_header(MAX_RELATIVE_OFFSET)  # its last offset is MAX + 2 above the base
    assert rolls_before_append(segment, far, LogConfig(), NOW)


def test_age_follows_batch_timestamps_else_the_wall_clock(tmp_path: Path) -> None:
    segment = new_segment(tmp_path)
    fill(segment, 1, timestamp=NOW)
    assert waited_for_roll(segment, NOW + 700, NOW + 5000) == 700
    assert waited_for_roll(segment, -1, NOW + 5000) == 5000  # since the segment was created
    config = LogConfig(segment_ms=1000)
    assert not rolls_before_append(segment, next_header(segment.next_offset, NOW + 1000), config, NOW)
    assert rolls_before_append(segment, next_header(segment.next_offset, NOW + 1001), config, NOW)


def test_an_idle_segment_rolls_by_the_newer_of_creation_and_first_timestamp(tmp_path: Path) -> None:
    segment = new_segment(tmp_path)
    fill(segment, 1, timestamp=NOW + 3000)  # a client clock ahead of the broker's
    config = LogConfig(segment_ms=1000)
    assert not rolls_when_idle(segment, config, NOW + 3500)
    assert not rolls_when_idle(segment, config, NOW + 4000)
    assert rolls_when_idle(segment, config, NOW + 4001)


def test_rolls_before_write_is_the_unfolded_rule(tmp_path: Path) -> None:
    """``rolls_before_write`` (the fast path's, with ``is_empty`` and ``waited_for_roll``
    inlined) answers as the rule spelled with them, across sizes, ages, clocks and offsets."""
    segment = new_segment(tmp_path)
    empty = LogConfig(segment_bytes=1, segment_ms=1)
    assert not rolls_before_write(segment, 10, 0, NOW, empty, NOW + 10**9)
    fill(segment, 3)
    for segment_bytes in (segment.size, segment.size + 200, 10**6):
        for segment_ms in (0, 5_000, 10**9):
            config = LogConfig(segment_bytes=segment_bytes, segment_ms=segment_ms)
            for timestamp in (-1, NOW - 10, NOW + 4_000, NOW + 6_000):
                for now_ms in (NOW, NOW + 10**7):
                    for last_offset in (
                        segment.next_offset + 2,
                        segment.base_offset + MAX_RELATIVE_OFFSET + 1,
                    ):
                        spelled = not segment.is_empty and (
                            segment.size + 150 > config.segment_bytes
                            or waited_for_roll(segment, timestamp, now_ms) > config.segment_ms
                            or segment.offset_index.is_full
                            or segment.time_index.is_full
                            or last_offset - segment.base_offset > MAX_RELATIVE_OFFSET
                        )
                        got = rolls_before_write(segment, 150, last_offset, timestamp, config, now_ms)
                        assert got == spelled, (segment_bytes, segment_ms, timestamp, now_ms, last_offset)
                        # a reopened segment has not read its first timestamp yet: same answer
                        known = segment.known_first_batch_timestamp
                        segment.known_first_batch_timestamp = None
                        got = rolls_before_write(segment, 150, last_offset, timestamp, config, now_ms)
                        assert got == spelled
                        # read from the file when the rule got that far: the same number
                        assert segment.known_first_batch_timestamp in (None, known)
                        segment.known_first_batch_timestamp = known
