"""PartitionLog.truncate_to: the follower's cut after a leader change (KIP-101/279)."""

from __future__ import annotations

from pathlib import Path

from exactly.storage.config import LogConfig
from exactly.storage.leader_epoch import EpochEntry
from tests.storage.helpers import append, append_marker, make_batch, open_log, read_all


def test_truncate_across_segments_rewinds_producer_state_and_epochs(tmp_path: Path) -> None:
    one = len(make_batch(4, value_size=50))
    log = open_log(tmp_path, LogConfig(segment_bytes=3 * one, index_interval_bytes=64))
    for i in range(10):
        append(log, 4, value_size=50, producer_id=7, epoch=0, seq=4 * i, leader_epoch=i // 5)
    assert [s.base_offset for s in log.segments] == [0, 12, 24, 36]
    assert log.leader_epochs.entries == [EpochEntry(0, 0), EpochEntry(1, 20)]
    removed = log.truncate_to(16)
    assert removed > 0
    assert log.log_end_offset == 16
    assert [s.base_offset for s in log.segments] == [0, 12]
    assert [h.base_offset for h in read_all(log)] == [0, 4, 8, 12]
    assert log.high_watermark <= 16
    assert log.leader_epochs.entries == [EpochEntry(0, 0)]
    # Producer state is the one at offset 16: the next sequence continues from the kept batches,
    # and a batch that was cut away is no longer a duplicate.
    assert log.producers()[7].last_seq == 15
    again = append(log, 4, value_size=50, producer_id=7, epoch=0, seq=16)
    assert not again.duplicate and again.first_offset == 16
    log.close()


def test_truncate_at_or_past_the_end_only_trims_the_epoch_cache(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    append(log, 2, leader_epoch=0)
    append(log, 2, leader_epoch=3)
    assert log.leader_epochs.entries == [EpochEntry(0, 0), EpochEntry(3, 2)]
    assert log.truncate_to(2) > 0  # cuts the epoch-3 batch
    assert log.log_end_offset == 2
    assert log.leader_epochs.entries == [EpochEntry(0, 0)]
    # A new leader epoch recorded at the log end, with no record appended in it (KAFKA-10706):
    log.leader_epochs.assign(5, 2)
    assert log.truncate_to(2) == 0 and log.log_end_offset == 2
    assert log.leader_epochs.entries == [EpochEntry(0, 0)]
    log.close()


def test_truncate_drops_an_open_transaction_that_started_after_the_cut(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    append(log, 2)  # 0-1
    append(log, 2, producer_id=1, epoch=0, seq=0, transactional=True)  # 2-3 open txn
    assert log.last_stable_offset == 2
    log.truncate_to(2)
    assert log.log_end_offset == 2 and log.last_stable_offset == 2
    append(log, 1)  # 2
    assert log.last_stable_offset == 3  # nothing open any more
    append_marker(log, 1, 0, abort=True)  # a marker for the cut transaction changes nothing
    log.close()
