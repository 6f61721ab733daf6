"""Follower truncation (KIP-101 / KIP-279), with the failover pitfalls Kafka hit.

``converge`` plays the whole Truncating loop between a follower and a leader as the replica
manager will: ask with the follower's latest epoch, truncate (log and epoch cache, even at or past
the log end), ask again until the decision is complete.
"""

from __future__ import annotations

import pytest

from exactly.replication.truncation import (
    FetchState,
    FollowerPartition,
    InvalidTransitionError,
    TruncationDecision,
    epoch_to_ask,
    truncation_offset,
)
from exactly.storage.leader_epoch import (
    UNDEFINED,
    EpochEndOffset,
    assign,
    end_offset_for,
    truncate_from_end,
)
from exactly.storage.leader_epoch import EpochEntry as E


def converge(
    follower: tuple[E, ...], follower_leo: int, hw: int, leader: tuple[E, ...], leader_leo: int
) -> tuple[int, tuple[E, ...], int]:
    """Returns (final log end, final epoch cache, number of OffsetsForLeaderEpoch round trips)."""
    leo = follower_leo
    for round_trip in range(1, 20):
        epoch = epoch_to_ask(follower)
        if epoch is None:
            return min(hw, leo), follower, round_trip - 1
        answer = end_offset_for(leader, epoch, leader_leo)
        decision = truncation_offset(follower, answer, log_end_offset=leo, high_watermark=hw)
        leo = min(leo, decision.offset)
        follower = truncate_from_end(follower, decision.offset)  # always, even >= LEO (KAFKA-10706)
        if decision.completed:
            return leo, follower, round_trip
    raise AssertionError("truncation never completed")


@pytest.mark.parametrize(
    ("answer", "leo", "hw", "expected"),
    [
        (UNDEFINED, 10, 4, TruncationDecision(4, True)),  # leader knows nothing: HW
        (EpochEndOffset(-1, 7), 10, 4, TruncationDecision(7, True)),  # old protocol answer
        (EpochEndOffset(3, 9), 12, 4, TruncationDecision(9, True)),  # both have epoch 3
        (EpochEndOffset(3, 20), 12, 4, TruncationDecision(10, True)),  # our epoch 3 ends first
        (EpochEndOffset(4, 11), 12, 4, TruncationDecision(10, False)),  # we lack 4: cut, ask again
        (EpochEndOffset(1, 3), 12, 4, TruncationDecision(3, True)),  # nothing <= 1 known locally
    ],
)
def test_truncation_table(answer: EpochEndOffset, leo: int, hw: int, expected: TruncationDecision) -> None:
    follower = (E(2, 5), E(3, 7), E(5, 10))
    assert truncation_offset(follower, answer, log_end_offset=leo, high_watermark=hw) == expected


def test_kip101_lagging_hw_does_not_lose_acknowledged_data() -> None:
    # The follower has offsets 0..1 of epoch 0 but its HW is still 1 (one round trip behind the
    # leader's 2). Truncating to the HW would drop offset 1, which the leader acknowledged.
    leo, cache, _ = converge((E(0, 0),), 2, 1, (E(0, 0),), 2)
    assert (leo, cache) == (2, (E(0, 0),))


def test_kip279_diverged_logs_converge_after_asking_again() -> None:
    # follower: epoch 0 [0,5), epoch 2 [5,8). Leader: epoch 0 [0,3), epoch 1 [3,7), epoch 3 from 7.
    leo, cache, rounds = converge((E(0, 0), E(2, 5)), 8, 2, (E(0, 0), E(1, 3), E(3, 7)), 9)
    assert (leo, cache, rounds) == (3, (E(0, 0),), 2)  # the common prefix is [0, 3)


def test_kafka_7415_new_leader_must_record_its_epoch_at_election() -> None:
    # A holds [0, 10) all from epoch 0; B led epoch 1 from offset 8 and wrote 8..11, which A never
    # got. A becomes leader of epoch 2 at its log end 10 and records (2, 10) before any append.
    follower_b = (E(0, 0), E(1, 8))
    leader_a_recorded = assign((E(0, 0),), 2, 10)
    leo, _cache, _ = converge(follower_b, 12, 8, leader_a_recorded, 10)
    assert leo == 8  # B's whole epoch-1 tail goes
    # Had A not recorded (2, 10) it would know no epoch after 0 and could not answer for epoch 1:
    assert end_offset_for((E(0, 0),), 1, 10) == UNDEFINED


def test_kafka_10706_elections_without_writes_terminate() -> None:
    # B recorded epoch 2 at its log end 10 without writing; the leader has epoch 1 from 5 and 3
    # from 10. The first answer (1, 10) is for an epoch B lacks and cuts at 10 == B's log end:
    # only trimming the cache there lets the next question be about epoch 0.
    leo, cache, rounds = converge((E(0, 0), E(2, 10)), 10, 3, (E(0, 0), E(1, 5), E(3, 10)), 10)
    assert (leo, cache, rounds) == (5, (E(0, 0),), 2)


def test_follower_without_epochs_falls_back_to_hw() -> None:
    assert converge((), 10, 4, (E(0, 0),), 12)[0] == 4


def test_unclean_leader_with_shorter_log_wins() -> None:
    # pitfall 4: the unclean leader's log is authoritative; the follower loses its tail.
    leo, _, _ = converge((E(0, 0), E(1, 5)), 9, 9, (E(0, 0), E(2, 6)), 6)
    assert leo == 5


def test_follower_state_truncates_after_every_epoch_increase() -> None:
    follower = FollowerPartition(leader=1, leader_epoch=4)
    assert follower.state is FetchState.TRUNCATING
    assert follower.on_truncated(TruncationDecision(10, False), for_epoch=4)
    assert follower.state is FetchState.TRUNCATING
    assert follower.on_truncated(TruncationDecision(8, True), for_epoch=4)
    assert follower.state is FetchState.FETCHING
    # same leader, higher epoch (KAFKA-7164): truncate again
    assert follower.on_leader_epoch(1, 5)
    assert follower.state is FetchState.TRUNCATING
    # an answer computed for the old epoch is stale and ignored
    assert not follower.on_truncated(TruncationDecision(8, True), for_epoch=4)
    assert follower.state is FetchState.TRUNCATING
    # equal or lower epochs are ignored whatever order the watch delivered them in
    assert not follower.on_leader_epoch(2, 5)
    assert not follower.on_leader_epoch(2, 3)
    assert (follower.leader, follower.leader_epoch) == (1, 5)


def test_diverging_epoch_only_while_fetching() -> None:
    follower = FollowerPartition(1, 0)
    with pytest.raises(InvalidTransitionError):
        follower.on_diverging_epoch()
