"""Follower truncation after a leader change (KIP-101, refined by KIP-279), and the follower's
per-partition fetch state.

Why
---
Truncating a follower to its own high watermark loses acknowledged data or leaves diverging logs
after back-to-back failovers (the HW lags one round trip). Instead the follower asks the leader
where its latest epoch ends (OffsetsForLeaderEpoch) and cuts its log there; if the leader answers
with an epoch the follower does not have, the follower cuts to the end of its largest epoch below
that one and **asks again** (KIP-279), until both agree on a common prefix.

Pitfalls this encodes:

* A follower must truncate after *every* leader-epoch increase, even when the leader is the same
  broker: it may have missed an epoch in between (KAFKA-7164). :class:`FollowerPartition` goes
  back to TRUNCATING on any higher epoch.
* The truncation offset can be >= the follower's log end. The log then keeps its records, but the
  epoch cache must still drop entries starting at or after it (KAFKA-10706), or the next question
  repeats forever after elections with no writes in between. The decision's ``offset`` is handed to
  the epoch cache's ``truncate_from_end`` unconditionally.
* A follower with no epochs at all cannot ask: it truncates to its high watermark (Kafka's fallback).

Truncation on fetch (Fetch v12+, KIP-595's diverging epoch; Kafka's path since IBP 2.7)
---------------------------------------------------------------------------------------
A follower that has epochs skips the OffsetsForLeaderEpoch round trip: on a new leader epoch it
goes straight to FETCHING and sends its latest epoch as ``last_fetched_epoch``; the leader answers
a ``DivergingEpoch`` (no records) when that epoch ends before the follower's fetch offset there,
and the follower feeds it to the same :func:`truncation_offset`. A complete truncation keeps it
FETCHING; an incomplete one (it lacks the leader's epoch, KIP-279) sends it TRUNCATING, where
OffsetsForLeaderEpoch finishes the job, as in Kafka. A follower without epochs starts TRUNCATING
(to its high watermark), since it has no ``last_fetched_epoch`` the leader could check.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from exactly.storage.leader_epoch import (
    UNDEFINED_EPOCH,
    EpochEndOffset,
    EpochEntry,
    end_offset_for,
    latest_epoch,
)


@dataclass(frozen=True, slots=True)
class TruncationDecision:
    """Truncate the log (and the epoch cache, and producer state) to ``offset``; when not
    ``completed``, send OffsetsForLeaderEpoch again with the new latest local epoch."""

    offset: int
    completed: bool


def truncation_offset(
    entries: Sequence[EpochEntry],
    leader_answer: EpochEndOffset,
    *,
    log_end_offset: int,
    high_watermark: int,
) -> TruncationDecision:
    """Kafka's ``getOffsetTruncationState``: ``entries`` is the follower's epoch cache and
    ``leader_answer`` the leader's OffsetsForLeaderEpoch (or DivergingEpoch) answer for the
    follower's latest epoch."""
    if leader_answer.end_offset == -1:
        # The leader knows nothing about that epoch: fall back to the high watermark.
        return TruncationDecision(high_watermark, True)
    if leader_answer.leader_epoch == UNDEFINED_EPOCH:
        return TruncationDecision(min(leader_answer.end_offset, log_end_offset), True)
    own = end_offset_for(entries, leader_answer.leader_epoch, log_end_offset)
    if own.undefined:
        # No local epoch at or below the leader's: trust the leader's offset.
        return TruncationDecision(min(leader_answer.end_offset, log_end_offset), True)
    if own.leader_epoch != leader_answer.leader_epoch:
        # We lack the leader's epoch: cut to the end of our largest epoch below it, then ask again.
        return TruncationDecision(min(own.end_offset, log_end_offset), False)
    return TruncationDecision(min(own.end_offset, leader_answer.end_offset, log_end_offset), True)


class FetchState(enum.Enum):
    TRUNCATING = "truncating"  # asking OffsetsForLeaderEpoch, not fetching records
    FETCHING = "fetching"  # with a last fetched epoch the leader checks (truncation on fetch)


class FollowerEvent(enum.Enum):
    NEW_LEADER_EPOCH = "new leader epoch"  # no local epoch: truncate (to the HW) before fetching
    NEW_LEADER_EPOCH_ON_FETCH = "new leader epoch, truncate on fetch"  # local epochs: fetch at once
    TRUNCATION_INCOMPLETE = "truncated, ask again"
    TRUNCATION_COMPLETE = "truncated, fetch"
    DIVERGING_EPOCH_COMPLETE = "truncated to the leader's diverging epoch, fetch"
    DIVERGING_EPOCH_INCOMPLETE = "truncated to the leader's diverging epoch, ask"


_TRANSITIONS: dict[tuple[FetchState, FollowerEvent], FetchState] = {
    (FetchState.TRUNCATING, FollowerEvent.NEW_LEADER_EPOCH): FetchState.TRUNCATING,
    (FetchState.FETCHING, FollowerEvent.NEW_LEADER_EPOCH): FetchState.TRUNCATING,
    (FetchState.TRUNCATING, FollowerEvent.NEW_LEADER_EPOCH_ON_FETCH): FetchState.FETCHING,
    (FetchState.FETCHING, FollowerEvent.NEW_LEADER_EPOCH_ON_FETCH): FetchState.FETCHING,
    (FetchState.TRUNCATING, FollowerEvent.TRUNCATION_INCOMPLETE): FetchState.TRUNCATING,
    (FetchState.TRUNCATING, FollowerEvent.TRUNCATION_COMPLETE): FetchState.FETCHING,
    (FetchState.FETCHING, FollowerEvent.DIVERGING_EPOCH_COMPLETE): FetchState.FETCHING,
    (FetchState.FETCHING, FollowerEvent.DIVERGING_EPOCH_INCOMPLETE): FetchState.TRUNCATING,
}


class InvalidTransitionError(Exception):
    pass


class FollowerPartition:
    """A follower's fetch state for one partition, keyed on the leader epoch it follows.

    Invariant: ``leader_epoch`` never decreases; answers (truncation results) computed for an older
    epoch are dropped, so a slow OffsetsForLeaderEpoch round trip cannot undo a newer leader's start.
    """

    __slots__ = ("leader", "leader_epoch", "state")

    def __init__(self, leader: int, leader_epoch: int, *, truncate_on_fetch: bool = False) -> None:
        """``truncate_on_fetch``: the local log has epochs, so the leader's diverging-epoch check
        replaces the OffsetsForLeaderEpoch round (start FETCHING)."""
        self.leader = leader
        self.leader_epoch = leader_epoch
        self.state = FetchState.FETCHING if truncate_on_fetch else FetchState.TRUNCATING

    def _move(self, event: FollowerEvent) -> None:
        target = _TRANSITIONS.get((self.state, event))
        if target is None:
            raise InvalidTransitionError(f"{event.value} while {self.state.value}")
        self.state = target

    def on_leader_epoch(self, leader: int, leader_epoch: int, *, truncate_on_fetch: bool = False) -> bool:
        """A newer epoch (same leader or not) restarts truncation (KAFKA-7164): by asking, or by
        the next fetch's epoch check with ``truncate_on_fetch``; an equal or older one is ignored.
        Returns whether the state changed."""
        if leader_epoch <= self.leader_epoch:
            return False
        self.leader, self.leader_epoch = leader, leader_epoch
        self._move(
            FollowerEvent.NEW_LEADER_EPOCH_ON_FETCH if truncate_on_fetch else FollowerEvent.NEW_LEADER_EPOCH
        )
        return True

    def on_truncated(self, decision: TruncationDecision, for_epoch: int) -> bool:
        """Apply a truncation result computed while following ``for_epoch``; stale ones are ignored."""
        if for_epoch != self.leader_epoch or self.state is not FetchState.TRUNCATING:
            return False
        self._move(
            FollowerEvent.TRUNCATION_COMPLETE if decision.completed else FollowerEvent.TRUNCATION_INCOMPLETE
        )
        return True

    def on_diverging_epoch(self, decision: TruncationDecision, for_epoch: int) -> bool:
        """Apply the truncation computed from a fetch answer's DivergingEpoch (only while fetching:
        raises otherwise); one for an older epoch is ignored. Incomplete (KIP-279) -> TRUNCATING."""
        if for_epoch != self.leader_epoch:
            return False
        self._move(
            FollowerEvent.DIVERGING_EPOCH_COMPLETE
            if decision.completed
            else FollowerEvent.DIVERGING_EPOCH_INCOMPLETE
        )
        return True


def epoch_to_ask(entries: Sequence[EpochEntry]) -> int | None:
    """The epoch a truncating follower sends in OffsetsForLeaderEpoch; None when it has no epochs
    and must truncate to its high watermark instead."""
    epoch = latest_epoch(entries)
    return None if epoch == UNDEFINED_EPOCH else epoch
