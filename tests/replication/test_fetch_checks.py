"""Epoch checks on reads and the leader's diverging-epoch answer (Fetch v12)."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode

from exactly.replication.fetch_checks import (
    NO_EPOCH,
    DivergenceCheck,
    check_diverging_epoch,
    check_follower_fetch,
    check_partition_read,
)
from exactly.storage.leader_epoch import EpochEndOffset
from exactly.storage.leader_epoch import EpochEntry as E


@pytest.mark.parametrize(
    ("request_epoch", "is_leader", "require_leader", "expected"),
    [
        (5, True, True, ErrorCode.none),
        (4, True, True, ErrorCode.fenced_leader_epoch),  # the client is behind
        (6, True, True, ErrorCode.unknown_leader_epoch),  # this broker is behind
        (NO_EPOCH, True, True, ErrorCode.none),  # old clients send no epoch
        (5, False, True, ErrorCode.not_leader_or_follower),
        (4, False, True, ErrorCode.fenced_leader_epoch),  # the epoch is checked first
        (5, False, False, ErrorCode.none),  # e.g. OffsetsForLeaderEpoch from a follower
    ],
)
def test_partition_read(
    request_epoch: int, is_leader: bool, require_leader: bool, expected: ErrorCode
) -> None:
    assert (
        check_partition_read(request_epoch, 5, is_leader=is_leader, require_leader=require_leader) == expected
    )


def test_follower_fetch_from_a_non_replica() -> None:
    assert check_follower_fetch(2, 5, (1, 2)) == ErrorCode.none
    assert check_follower_fetch(3, 5, (1, 2)) == ErrorCode.unknown_leader_epoch
    assert check_follower_fetch(3, NO_EPOCH, (1, 2)) == ErrorCode.not_leader_or_follower


LEADER = (E(0, 0), E(2, 10), E(4, 20))


@pytest.mark.parametrize(
    ("last_epoch", "fetch_offset", "expected"),
    [
        (4, 22, DivergenceCheck()),  # current epoch, inside the log
        (2, 20, DivergenceCheck()),  # epoch 2 ends exactly where the follower is
        (2, 21, DivergenceCheck(diverging=EpochEndOffset(2, 20))),  # follower has epoch-2 data past its end
        (3, 21, DivergenceCheck(diverging=EpochEndOffset(2, 20))),  # epoch 3 never existed here
        (5, 25, DivergenceCheck(error=ErrorCode.offset_out_of_range)),  # newer than anything here
        (0, 3, DivergenceCheck(error=ErrorCode.offset_out_of_range)),  # below the log start
        (NO_EPOCH, 3, DivergenceCheck()),  # older fetch versions: no check
    ],
)
def test_diverging_epoch(last_epoch: int, fetch_offset: int, expected: DivergenceCheck) -> None:
    got = check_diverging_epoch(
        LEADER,
        last_fetched_epoch=last_epoch,
        fetch_offset=fetch_offset,
        log_start_offset=5,
        log_end_offset=25,
    )
    assert got == expected
