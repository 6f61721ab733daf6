"""The epoch checks of partition reads (Fetch, ListOffsets, OffsetsForLeaderEpoch), Kafka's
``Partition.checkCurrentLeaderEpoch`` / ``getLocalLog`` / ``readRecords`` rules.

Why: clients and followers send the leader epoch they believe current (KIP-320). A lower epoch
means the sender is behind and must refresh its metadata (FENCED_LEADER_EPOCH); a higher one means
*this* broker is behind (UNKNOWN_LEADER_EPOCH, retriable); only a match reads. That is how every
client follows leader changes without ever reading from a deposed leader.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from exactly.storage.leader_epoch import UNDEFINED_EPOCH, EpochEndOffset, EpochEntry, end_offset_for

NO_EPOCH = -1  # the request carried no current leader epoch (old versions, or -1 on the wire)


def check_current_leader_epoch(request_epoch: int, local_epoch: int) -> ErrorCode:
    if request_epoch == NO_EPOCH:
        return ErrorCode.none
    if local_epoch > request_epoch:
        return ErrorCode.fenced_leader_epoch
    if local_epoch < request_epoch:
        return ErrorCode.unknown_leader_epoch
    return ErrorCode.none


def check_partition_read(
    request_epoch: int, local_epoch: int, *, is_leader: bool, require_leader: bool
) -> ErrorCode:
    """The epoch first, then leadership: a follower asked with the right epoch answers
    NOT_LEADER_OR_FOLLOWER where a leader is required (consumers, follower fetches)."""
    error = check_current_leader_epoch(request_epoch, local_epoch)
    if error != ErrorCode.none:
        return error
    if require_leader and not is_leader:
        return ErrorCode.not_leader_or_follower
    return ErrorCode.none


def check_follower_fetch(replica_id: int, request_epoch: int, replicas: Collection[int]) -> ErrorCode:
    """A fetch with ``ReplicaId >= 0`` from a broker that is not a replica of the partition."""
    if replica_id in replicas:
        return ErrorCode.none
    return ErrorCode.not_leader_or_follower if request_epoch == NO_EPOCH else ErrorCode.unknown_leader_epoch


@dataclass(frozen=True, slots=True)
class DivergenceCheck:
    """``error`` (OFFSET_OUT_OF_RANGE) or ``diverging`` (answer with no records and this
    DivergingEpoch; do not update the follower's fetch state) or neither (read records)."""

    error: ErrorCode = ErrorCode.none
    diverging: EpochEndOffset | None = None


def check_diverging_epoch(
    entries: Sequence[EpochEntry],
    *,
    last_fetched_epoch: int,
    fetch_offset: int,
    log_start_offset: int,
    log_end_offset: int,
) -> DivergenceCheck:
    """Fetch v12+ truncation-on-fetch at the leader: where does the follower's last fetched epoch
    end here? Before the fetch offset, or at an older epoch, the follower's log diverged."""
    if last_fetched_epoch == NO_EPOCH:
        return DivergenceCheck()
    answer = end_offset_for(entries, last_fetched_epoch, log_end_offset)
    if answer.undefined or answer.leader_epoch == UNDEFINED_EPOCH:
        return DivergenceCheck(error=ErrorCode.offset_out_of_range)
    if fetch_offset < log_start_offset:
        return DivergenceCheck(error=ErrorCode.offset_out_of_range)
    if answer.leader_epoch < last_fetched_epoch or answer.end_offset < fetch_offset:
        return DivergenceCheck(diverging=answer)
    return DivergenceCheck()
