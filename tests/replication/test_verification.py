"""Replica comparison (``exactly.replication.verification``): what counts as a difference, what
counts as lag only, and which range is compared."""

from __future__ import annotations

from exactly.replication.verification import ReplicaBatch, ReplicaLog, compare_replicas
from exactly.types import TopicPartition

TP = TopicPartition("t", 0)


def batch(base: int, last: int, payload: bytes = b"x") -> ReplicaBatch:
    return ReplicaBatch(base, last, bytes([base % 256]) + payload)


def log(broker: int, hw: int, *batches: ReplicaBatch, start: int = 0) -> ReplicaLog:
    return ReplicaLog(broker, hw, batches, start)


def test_identical_replicas_at_one_high_watermark_are_in_sync() -> None:
    batches = (batch(0, 4), batch(5, 5), batch(6, 9))
    verdict = compare_replicas(TP, [log(0, 10, *batches), log(1, 10, *batches), log(2, 10, *batches)], 0)
    assert verdict.consistent and verdict.in_sync
    assert verdict.compared_up_to == 10 and verdict.batches == 3 and verdict.max_lag == 0


def test_a_lagging_replica_is_consistent_but_not_in_sync() -> None:
    leader = log(0, 10, batch(0, 4), batch(5, 9))
    follower = log(1, 5, batch(0, 4))  # its HW (and log) trail by one fetch round
    verdict = compare_replicas(TP, [leader, follower], 0)
    assert verdict.consistent and not verdict.in_sync
    assert verdict.compared_up_to == 5 and verdict.batches == 1 and verdict.max_lag == 5


def test_other_bytes_at_the_same_offsets_are_a_difference() -> None:
    leader = log(0, 10, batch(0, 4), batch(5, 9, b"leader"))
    follower = log(2, 10, batch(0, 4), batch(5, 9, b"zombie"))
    (difference,) = compare_replicas(TP, [leader, follower], 0).differences
    assert (difference.broker_id, difference.reference_id, difference.offset) == (2, 0, 5)
    assert "other bytes" in difference.reason


def test_other_batch_boundaries_are_a_difference() -> None:
    leader = log(0, 10, batch(0, 4), batch(5, 9))
    follower = log(1, 10, batch(0, 6), batch(7, 9))
    (difference,) = compare_replicas(TP, [follower, leader], reference_id=0).differences
    assert difference.broker_id == 1 and difference.offset == 0


def test_a_missing_batch_below_the_common_high_watermark_is_a_difference() -> None:
    leader = log(0, 10, batch(0, 4), batch(5, 9))
    follower = log(1, 10, batch(0, 4))  # claims HW 10 but lacks 5-9
    (difference,) = compare_replicas(TP, [leader, follower], 0).differences
    assert difference.offset == 5 and "only the reference" in difference.reason


def test_batches_above_the_smallest_high_watermark_are_not_compared() -> None:
    leader = log(0, 5, batch(0, 4), batch(5, 9, b"uncommitted"))
    follower = log(1, 5, batch(0, 4), batch(5, 9, b"other tail"))
    verdict = compare_replicas(TP, [leader, follower], 0)
    assert verdict.in_sync and verdict.compared_up_to == 5


def test_comparison_starts_at_the_largest_log_start_offset() -> None:
    leader = log(0, 10, batch(0, 4), batch(5, 9))
    trimmed = log(1, 10, batch(5, 9), start=5)  # retention removed its first segment
    assert compare_replicas(TP, [leader, trimmed], 0).in_sync


def test_an_unreachable_replica_makes_the_partition_inconsistent() -> None:
    verdict = compare_replicas(TP, [log(0, 3, batch(0, 2))], 0, unreachable=["replica 1: broker not alive"])
    assert not verdict.consistent
    assert "unreachable: replica 1" in verdict.describe()
