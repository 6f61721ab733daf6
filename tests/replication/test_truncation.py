"""Follower truncation (KIP-101 / KIP-279), with the failover pitfalls Kafka hit.

``converge`` plays the whole Truncating loop between a follower and a leader as the replica
manager will: ask with the follower's latest epoch, truncate (log and epoch cache, even at or past
the log end), ask again until the decision is complete.
"""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode

from exactly.replication.fetch_checks import check_diverging_epoch
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
        follower.on_diverging_epoch(TruncationDecision(5, True), for_epoch=0)


def test_follower_with_epochs_truncates_on_fetch() -> None:
    # Truncation on fetch (KIP-595): a follower with epochs fetches at once after every new epoch,
    # the leader's DivergingEpoch answer truncates it and it keeps fetching.
    follower = FollowerPartition(1, 4, truncate_on_fetch=True)
    assert follower.state is FetchState.FETCHING
    assert follower.on_diverging_epoch(TruncationDecision(8, True), for_epoch=4)
    assert follower.state is FetchState.FETCHING
    assert not follower.on_diverging_epoch(TruncationDecision(8, True), for_epoch=3)  # stale answer
    # an incomplete answer (the follower lacks the leader's epoch, KIP-279): ask with
    # OffsetsForLeaderEpoch until complete, then fetch again
    assert follower.on_diverging_epoch(TruncationDecision(6, False), for_epoch=4)
    assert follower.state is FetchState.TRUNCATING
    assert follower.on_truncated(TruncationDecision(5, True), for_epoch=4)
    assert follower.state is FetchState.FETCHING
    # a new epoch (KAFKA-7164) with epochs known: the next fetch's check does the truncation
    assert follower.on_leader_epoch(1, 5, truncate_on_fetch=True)
    assert follower.state is FetchState.FETCHING
    # a new epoch without any local epoch: truncate (to the HW) first
    assert follower.on_leader_epoch(1, 6)
    assert follower.state is FetchState.TRUNCATING
    assert follower.on_leader_epoch(1, 7, truncate_on_fetch=True)  # a mid-truncation new epoch
    assert follower.state is FetchState.FETCHING


def converge_on_fetch(
    follower: tuple[E, ...], follower_leo: int, hw: int, leader: tuple[E, ...], leader_leo: int
) -> tuple[int, tuple[E, ...], int, int]:
    """The truncation-on-fetch loop: fetch with the latest epoch, truncate on each DivergingEpoch;
    an incomplete answer falls back to ``converge`` (OffsetsForLeaderEpoch). Returns (final log
    end, final epoch cache, diverging answers, OffsetsForLeaderEpoch round trips)."""
    leo = follower_leo
    for answers in range(0, 20):
        epoch = epoch_to_ask(follower)
        assert epoch is not None
        check = check_diverging_epoch(
            leader, last_fetched_epoch=epoch, fetch_offset=leo, log_start_offset=0, log_end_offset=leader_leo
        )
        assert check.error == ErrorCode.none
        if check.diverging is None:
            return leo, follower, answers, 0
        decision = truncation_offset(follower, check.diverging, log_end_offset=leo, high_watermark=hw)
        leo = min(leo, decision.offset)
        follower = truncate_from_end(follower, decision.offset)
        if not decision.completed:
            leo, follower, rounds = converge(follower, leo, hw, leader, leader_leo)
            return leo, follower, answers + 1, rounds
    raise AssertionError("fetching never stopped diverging")


def test_old_leader_tail_is_cut_by_the_diverging_epoch_alone() -> None:
    # The old leader wrote [10, 12) in epoch 1 that nobody got; the new leader has epoch 2 from 10.
    leo, cache, answers, rounds = converge_on_fetch(
        (E(0, 0), E(1, 5)), 12, 8, (E(0, 0), E(1, 5), E(2, 10)), 15
    )
    assert (leo, cache, answers, rounds) == (10, (E(0, 0), E(1, 5)), 1, 0)


def test_same_results_as_offsets_for_leader_epoch() -> None:
    # The KIP-279 case: the first answer is for an epoch the follower lacks, OffsetsForLeaderEpoch
    # finishes; either way the logs end at the common prefix [0, 3).
    follower, leader = (E(0, 0), E(2, 5)), (E(0, 0), E(1, 3), E(3, 7))
    on_fetch = converge_on_fetch(follower, 8, 2, leader, 9)
    asking = converge(follower, 8, 2, leader, 9)
    assert on_fetch[:2] == asking[:2] == (3, (E(0, 0),))
    # and a follower that is merely behind gets no diverging answer at all
    assert converge_on_fetch((E(0, 0), E(1, 5)), 7, 5, (E(0, 0), E(1, 5), E(2, 10)), 15)[2] == 0
