"""PartitionLog.append_as_follower: a follower takes the leader's batches byte for byte (Kafka's
appendAsFollower), with the replication rules of producer state."""

from __future__ import annotations

from pathlib import Path

import pytest

from exactly.records.batch import TIMESTAMP_TYPE_MASK, BatchHeader, iter_batches
from exactly.storage.config import LogConfig
from exactly.storage.leader_epoch import EpochEntry
from exactly.storage.partition_log import PartitionLog
from tests.storage.helpers import NOW, append, append_marker, make_batch, open_log

LOG_APPEND_TIME = LogConfig(message_timestamp_type="LogAppendTime")


def leader_bytes(log: PartitionLog) -> bytes:
    return log.read(0, 1 << 20, read_committed=False, up_to_log_end=True).records


def replicate(leader: PartitionLog, follower: PartitionLog, now_ms: int) -> None:
    """What the fetcher does with a Fetch response: every batch past the follower's end."""
    data = bytearray(
        leader.read(follower.log_end_offset, 1 << 20, read_committed=False, up_to_log_end=True).records
    )
    for header in iter_batches(data):
        batch = data[header.position : header.position + header.size]
        follower.append_as_follower(batch, BatchHeader.parse(batch, 0), now_ms=now_ms)


def segment_bytes(log: PartitionLog) -> bytes:
    return b"".join(s.log_path.read_bytes() for s in log.segments)


def test_log_append_time_stays_the_leaders(tmp_path: Path) -> None:
    leader = open_log(tmp_path / "leader", LOG_APPEND_TIME)
    follower = open_log(tmp_path / "follower", LOG_APPEND_TIME)
    append(leader, 3, timestamp=5, now_ms=NOW + 42, leader_epoch=3)
    append(leader, 2, timestamp=6, now_ms=NOW + 43, leader_epoch=4)
    replicate(leader, follower, now_ms=NOW + 999)  # a later clock must not restamp anything
    assert segment_bytes(follower) == segment_bytes(leader)
    headers = list(iter_batches(leader_bytes(follower), verify_crc=True))
    assert [h.max_timestamp for h in headers] == [NOW + 42, NOW + 43]
    assert all(h.attributes & TIMESTAMP_TYPE_MASK for h in headers)
    assert follower.log_end_offset == 5
    assert follower.leader_epochs.entries == [EpochEntry(3, 0), EpochEntry(4, 3)]
    leader.close()
    follower.close()


def test_producer_state_follows_without_sequence_checks_and_markers_complete(tmp_path: Path) -> None:
    leader = open_log(tmp_path / "leader")
    follower = open_log(tmp_path / "follower")
    append(leader, 2, producer_id=7, epoch=0, seq=0, transactional=True)
    append_marker(leader, 7, 0, abort=False)
    replicate(leader, follower, now_ms=NOW)
    assert follower.producers()[7].last_seq == 1
    assert follower.last_stable_offset == follower.high_watermark  # the transaction completed
    # A sequence gap is the leader's business: the follower takes the batch as written.
    gap = make_batch(1, producer_id=7, epoch=0, seq=9)
    gap_header = BatchHeader.parse(gap)
    gap[0:8] = follower.log_end_offset.to_bytes(8, "big")  # the offset the leader gave it
    follower.append_as_follower(gap, BatchHeader.parse(gap), now_ms=NOW)
    assert gap_header.base_sequence == 9 and follower.producers()[7].last_seq == 9
    leader.close()
    follower.close()


def test_a_batch_may_start_past_the_log_end_but_never_below_it(tmp_path: Path) -> None:
    # Past it: the leader's cleaner removed the batches in between (Kafka's follower takes it too).
    follower = open_log(tmp_path)
    batch = make_batch(1)
    batch[0:8] = (5).to_bytes(8, "big")
    follower.append_as_follower(batch, BatchHeader.parse(batch), now_ms=NOW)
    assert follower.log_end_offset == 6
    below = make_batch(1)
    below[0:8] = (3).to_bytes(8, "big")
    with pytest.raises(ValueError, match="starts at 3, the log ends at 6"):
        follower.append_as_follower(below, BatchHeader.parse(below), now_ms=NOW)
    assert follower.log_end_offset == 6
    follower.close()


def test_max_message_bytes_is_the_leaders_check(tmp_path: Path) -> None:
    follower = open_log(tmp_path, LogConfig(max_message_bytes=100))
    batch = make_batch(1, value_size=500)
    follower.append_as_follower(batch, BatchHeader.parse(batch), now_ms=NOW)
    assert follower.log_end_offset == 1
    follower.close()


def replicate_in_place(leader: PartitionLog, follower: PartitionLog, now_ms: int, *, prefix: int = 0) -> None:
    """What the fetcher does now: the leader's bytes at ``prefix`` inside a larger frame, every
    batch past the follower's end appended from there in one call."""
    records = leader.read(follower.log_end_offset, 1 << 20, read_committed=False, up_to_log_end=True).records
    frame = bytearray(b"\xaa" * prefix) + records + b"\xbb" * 7  # response bytes around the records
    headers = list(iter_batches(frame, prefix, prefix + len(records)))
    follower.append_batches_as_follower(frame, headers, now_ms=now_ms)


def test_batches_from_a_frame_match_one_by_one_appends_across_rolls(tmp_path: Path) -> None:
    leader = open_log(tmp_path / "leader", LOG_APPEND_TIME)  # one segment: one read returns all
    small = LogConfig(segment_bytes=300, message_timestamp_type="LogAppendTime")
    in_place = open_log(tmp_path / "in-place", small)
    one_by_one = open_log(tmp_path / "one-by-one", small)
    append(leader, 2, producer_id=7, epoch=0, seq=0, transactional=True)
    append_marker(leader, 7, 0, abort=True)
    for i in range(5):
        append(leader, 1, value_size=60, now_ms=NOW + i, leader_epoch=2)
    replicate_in_place(leader, in_place, NOW + 999, prefix=13)
    replicate(leader, one_by_one, NOW + 999)
    assert len(in_place.segments) > 1  # the batches of one call rolled segments on the way
    assert [s.base_offset for s in in_place.segments] == [s.base_offset for s in one_by_one.segments]
    for ours, theirs in zip(in_place.segments, one_by_one.segments, strict=True):
        assert ours.log_path.read_bytes() == theirs.log_path.read_bytes()
    assert segment_bytes(in_place) == segment_bytes(leader)
    assert in_place.log_end_offset == leader.log_end_offset == 8
    assert (
        in_place.leader_epochs.entries == leader.leader_epochs.entries == [EpochEntry(0, 0), EpochEntry(2, 3)]
    )
    assert in_place.producers()[7].last_seq == 1
    in_place.update_high_watermark(8)
    assert in_place.last_stable_offset == 8  # the aborted transaction completed
    assert in_place.collect_aborted_transactions(0, 8) == leader.collect_aborted_transactions(0, 8)
    assert len(in_place.collect_aborted_transactions(0, 8)) == 1
    for log in (leader, in_place, one_by_one):
        log.close()


def test_batches_overlapping_the_log_end_write_nothing_and_gaps_are_taken(tmp_path: Path) -> None:
    leader = open_log(tmp_path / "leader")
    follower = open_log(tmp_path / "follower")
    append(leader, 2)
    append(leader, 3)
    data = bytearray(leader_bytes(leader))
    headers = list(iter_batches(data))
    with pytest.raises(ValueError, match="starts at 0, expected 2"):
        follower.append_batches_as_follower(data, [headers[0], headers[0]], now_ms=NOW)
    assert follower.log_end_offset == 0 and segment_bytes(follower) == b""
    # a gap is fine (a compacted leader's log): the batches land at the leader's offsets
    follower.append_batches_as_follower(data, headers[1:], now_ms=NOW)
    assert follower.log_end_offset == 5
    leader.close()
    follower.close()
