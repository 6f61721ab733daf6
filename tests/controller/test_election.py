"""Leader election strategies: Kafka's Election rules, table-driven."""

from __future__ import annotations

import pytest

from exactly.controller.election import (
    ElectionResult,
    controlled_shutdown_leader,
    initial_leader,
    offline_partition_leader,
    preferred_replica_leader,
)


@pytest.mark.parametrize(
    ("assignment", "isr", "live", "unclean", "expected"),
    [
        # the first live ISR member in assignment order; new ISR = live part of the old ISR
        ((1, 2, 3), (1, 2, 3), {2, 3}, False, ElectionResult(2, (2, 3))),
        ((1, 2, 3), (3, 2), {2, 3}, False, ElectionResult(2, (3, 2))),
        # no live ISR member: stays offline without unclean election ...
        ((1, 2, 3), (1,), {2, 3}, False, None),
        # ... or takes the first live replica, ISR = [leader], marked unclean
        ((1, 2, 3), (1,), {2, 3}, True, ElectionResult(2, (2,), unclean=True)),
        # nobody live at all
        ((1, 2), (1, 2), set(), True, None),
        # a live broker outside the assignment is never chosen
        ((1, 2), (1,), {3}, True, None),
    ],
)
def test_offline_partition_leader(
    assignment: tuple[int, ...],
    isr: tuple[int, ...],
    live: set[int],
    unclean: bool,
    expected: ElectionResult | None,
) -> None:
    assert offline_partition_leader(assignment, isr, live, unclean_enabled=unclean) == expected


def test_controlled_shutdown_skips_and_removes_shutting_down_brokers() -> None:
    assert controlled_shutdown_leader((1, 2, 3), (1, 2, 3), {1, 2, 3}, {1}) == ElectionResult(2, (2, 3))
    assert controlled_shutdown_leader((1, 2), (1,), {1, 2}, {1}) is None  # 2 is not in the ISR


def test_preferred_only_if_first_replica_is_live_and_in_isr() -> None:
    assert preferred_replica_leader((1, 2, 3), (2, 3, 1), {1, 2, 3}) == ElectionResult(1, (2, 3, 1))
    assert preferred_replica_leader((1, 2, 3), (2, 3), {1, 2, 3}) is None
    assert preferred_replica_leader((1, 2, 3), (1, 2, 3), {2, 3}) is None


def test_initial_leader_is_first_live_replica() -> None:
    assert initial_leader((3, 1, 2), {1, 2}) == ElectionResult(1, (1, 2))
    assert initial_leader((3,), set()) is None
