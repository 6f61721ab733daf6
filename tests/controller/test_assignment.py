"""Replica assignment: Kafka's rack-unaware AdminUtils, checked against Kafka's own unit-test table."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from exactly.controller.assignment import (
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    assign_added_partitions,
    assign_replicas,
)


def test_matches_kafkas_admin_utils_expectation_with_fixed_start() -> None:
    # AdminUtilsTest.testReplicaAssignment: brokers 0..4, 10 partitions, RF 3, start index 0.
    expected = {
        0: (0, 1, 2),
        1: (1, 2, 3),
        2: (2, 3, 4),
        3: (3, 4, 0),
        4: (4, 0, 1),
        5: (0, 2, 3),
        6: (1, 3, 4),
        7: (2, 4, 0),
        8: (3, 0, 1),
        9: (4, 1, 2),
    }
    assert assign_replicas([0, 1, 2, 3, 4], 10, 3, fixed_start_index=0) == expected


def test_random_start_spreads_leaders_evenly_and_replicas_are_distinct() -> None:
    result = assign_replicas([3, 1, 2], 6, 3, rng=random.Random(7))
    assert Counter(r[0] for r in result.values()) == {1: 2, 2: 2, 3: 2}
    assert all(len(set(r)) == 3 for r in result.values())


@pytest.mark.parametrize(
    ("partitions", "rf", "error"),
    [
        (0, 1, InvalidPartitionsError),
        (1, 0, InvalidReplicationFactorError),
        (1, 4, InvalidReplicationFactorError),
    ],
)
def test_invalid_requests(partitions: int, rf: int, error: type[Exception]) -> None:
    with pytest.raises(error):
        assign_replicas([1, 2, 3], partitions, rf)


def test_added_partitions_continue_from_partition_zeros_first_replica() -> None:
    existing = {0: (2, 3, 1), 1: (3, 1, 2)}
    added = assign_added_partitions([1, 2, 3], existing, 4)
    assert set(added) == {2, 3}
    assert all(len(r) == 3 and len(set(r)) == 3 for r in added.values())
    # start index = position of broker 2 (partition 0's leader): partition 2 -> (2 + 1) % 3 = broker 1
    assert added[2][0] == 1 and added[3][0] == 2
    with pytest.raises(InvalidPartitionsError):
        assign_added_partitions([1, 2, 3], existing, 2)
