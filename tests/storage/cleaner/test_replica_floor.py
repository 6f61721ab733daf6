"""The replica floor (cluster mode): tombstones, COMMIT/ABORT markers and producers' emptied
batches go only once every replica has them (reference Part B, note B5); without a floor (a
single broker) Kafka's rules are unchanged."""

from __future__ import annotations

from pathlib import Path

from exactly.storage.cleaner.cleanable import cleanable_offsets
from exactly.storage.partition_log import PartitionLog
from tests.storage.cleaner.helpers import (
    COMPACT,
    NOW,
    TxnProducer,
    aborted,
    append_keyed,
    batches,
    key_values,
    keys_in,
    last_offsets_per_batch,
    offsets_in,
    open_compacted,
    run_clean,
)

LATER = NOW + COMPACT.delete_retention_ms + 1
MUCH_LATER = LATER + COMPACT.delete_retention_ms + 1


def _deletes(log: PartitionLog) -> None:
    """Keys 1-3, then key 1 deleted (tombstone at offset 3), then a roll."""
    append_keyed(log, [(1, 1), (2, 2), (3, 3)])
    append_keyed(log, [(1, None)])  # 3
    append_keyed(log, [(4, 4)])  # 4
    log.roll(NOW)


def test_a_tombstone_past_its_horizon_stays_until_every_replica_has_it(tmp_path: Path) -> None:
    log = open_compacted(tmp_path)
    _deletes(log)
    run_clean(log, replica_floor=0)  # the horizon is set whatever the floor
    assert keys_in(log) == [2, 3, 1, 4]
    # Past the horizon, but a replica is known only up to offset 3 (it lacks the tombstone at 3).
    for _ in range(2):
        run_clean(log, now_ms=LATER, replica_floor=3)
        assert keys_in(log) == [2, 3, 1, 4]
        assert key_values(log)[1] is None
    # Every replica has offset 3: now it goes.
    run_clean(log, now_ms=LATER, replica_floor=4)
    assert keys_in(log) == [2, 3, 4]
    log.close()


def test_no_knowledge_removes_no_tombstone_or_marker(tmp_path: Path) -> None:
    # A floor of 0: a leader that knows no follower's offset yet, a follower without a published
    # floor for its current leadership.
    log = open_compacted(tmp_path)
    _deletes(log)
    p = TxnProducer(log, 7)
    p([5])
    p.commit()
    p([5])
    p.commit()
    log.roll(NOW)
    before = offsets_in(log)
    for now in (NOW, LATER, MUCH_LATER):
        run_clean(log, now_ms=now, replica_floor=0)
    # Superseded values went (the first key 5 record, the first value of key 1); the tombstone and
    # both markers stay.
    assert keys_in(log) == [2, 3, 1, 4, 5]
    assert [o for o in before if o not in offsets_in(log)] == [0, 5]
    assert [h.is_control for h, _ in batches(log)].count(True) == 2
    log.close()


def test_a_commit_marker_stays_until_every_replica_has_it(tmp_path: Path) -> None:
    log = open_compacted(tmp_path)
    p = TxnProducer(log, 1)
    p([1])  # 0
    p.commit()  # 1
    p([1])  # 2
    p.commit()  # 3
    log.roll(NOW)
    run_clean(log, replica_floor=1)  # the first transaction's data is superseded
    assert offsets_in(log) == [1, 2, 3]
    run_clean(log, replica_floor=1)  # its marker, now without data, gets a horizon
    # Past the horizon, a replica still lacks offset 1 (its log ends there): a replica that holds
    # the transaction's data without its marker would keep it open forever.
    run_clean(log, now_ms=LATER, replica_floor=1)
    assert offsets_in(log) == [1, 2, 3]
    run_clean(log, now_ms=LATER, replica_floor=2)
    assert offsets_in(log) == [2, 3]
    log.close()


def test_aborted_data_goes_at_once_but_its_abort_marker_waits_for_the_floor(tmp_path: Path) -> None:
    log = open_compacted(tmp_path)
    p = TxnProducer(log, 1)
    p([1])  # 0
    p([2, 3])  # 1-2
    p.abort()  # 3
    p([3])  # 4
    p.commit()  # 5
    log.roll(NOW)
    run_clean(log, replica_floor=0)
    # The aborted records go whatever the floor: a replica that gets the marker without them, or
    # with part of them, still reads the transaction as aborted.
    assert keys_in(log) == [3]
    assert offsets_in(log) == [3, 4, 5]
    for now in (NOW, LATER, MUCH_LATER):
        run_clean(log, now_ms=now, replica_floor=3)
    assert offsets_in(log) == [3, 4, 5]
    # (its index entry went with the last aborted record, as in Kafka: nothing is left to hide;
    # the marker is what a replica fetching it needs to close the transaction)
    assert aborted(log) == []
    run_clean(log, now_ms=MUCH_LATER, replica_floor=4)
    assert offsets_in(log) == [4, 5]
    log.close()


def test_an_emptied_producer_batch_stays_as_a_header_until_every_replica_has_it(tmp_path: Path) -> None:
    # An idempotent producer's first batch is superseded by its second: Kafka drops it (it is not
    # the producer's last); above the floor it stays as an empty header, so a replica still to
    # fetch it learns the producer's sequence and epoch from it.
    log = open_compacted(tmp_path)
    p = TxnProducer(log, 9, transactional=False)
    p([1, 2])  # 0-1
    p([1, 2])  # 2-3
    append_keyed(log, [(3, 3)])  # 4
    log.roll(NOW)
    run_clean(log, replica_floor=1)  # a replica's log ends at offset 1: it lacks the batch's last
    assert keys_in(log) == [1, 2, 3]
    assert last_offsets_per_batch(log) == [1, 3, 4]
    run_clean(log, replica_floor=2)
    assert last_offsets_per_batch(log) == [3, 4]
    log.close()


def _tombstones_and_markers(log: PartitionLog) -> None:
    _deletes(log)
    p, q = TxnProducer(log, 1), TxnProducer(log, 2, transactional=False)
    p([1, 5])
    p.abort()
    q([6])
    q([6])
    p([5])
    p.commit()
    p([5, (6, None)])
    p.commit()
    log.roll(NOW)


def test_without_a_floor_the_single_broker_rules_are_unchanged(tmp_path: Path) -> None:
    # None (a single broker) and a floor past every offset clean the same as Kafka: byte for byte.
    logs = [open_compacted(tmp_path / name) for name in ("none", "past")]
    for log in logs:
        _tombstones_and_markers(log)
    for now in (NOW, LATER, MUCH_LATER):
        run_clean(logs[0], now_ms=now)
        run_clean(logs[1], now_ms=now, replica_floor=10**9)
    assert [h for h, _ in batches(logs[0])] == [h for h, _ in batches(logs[1])]
    assert [rs for _, rs in batches(logs[0])] == [rs for _, rs in batches(logs[1])]
    # and everything removable went: no tombstone, no marker of an empty transaction
    assert None not in key_values(logs[0]).values()
    for log in logs:
        log.close()


def test_the_cleanable_range_stops_at_the_high_watermark(tmp_path: Path) -> None:
    log = open_compacted(tmp_path)
    append_keyed(log, [(1, 1)])
    log.roll(NOW)
    append_keyed(log, [(1, 2)])
    log.roll(NOW)
    append_keyed(log, [(1, 3)])

    def uncleanable(high_watermark: int | None) -> int:
        return cleanable_offsets(
            log.segments,
            log_start_offset=log.log_start_offset,
            log_end_offset=log.log_end_offset,
            last_stable_offset=log.last_stable_offset,
            high_watermark=high_watermark,
            checkpoint=None,
            config=log.config,
            now_ms=NOW,
        ).first_uncleanable_offset

    assert uncleanable(None) == 2  # the active segment
    assert uncleanable(3) == 2
    assert uncleanable(1) == 1  # a follower whose high watermark lags its log end
    log.close()
