"""The classic group state table: exactly Kafka's valid previous states, and nothing else."""

from __future__ import annotations

import itertools

import pytest

from exactly.coordinator.group.state import (
    VALID_PREVIOUS_STATES,
    GroupState,
    InvalidGroupTransition,
    can_transition,
    check_transition,
)

S = GroupState

ALLOWED = {
    (S.PREPARING_REBALANCE, S.EMPTY),
    (S.STABLE, S.PREPARING_REBALANCE),
    (S.COMPLETING_REBALANCE, S.PREPARING_REBALANCE),
    (S.EMPTY, S.PREPARING_REBALANCE),
    (S.PREPARING_REBALANCE, S.COMPLETING_REBALANCE),
    (S.COMPLETING_REBALANCE, S.STABLE),
    *((s, S.DEAD) for s in S),
}


@pytest.mark.parametrize(("source", "target"), list(itertools.product(S, S)))
def test_every_pair_matches_kafka(source: GroupState, target: GroupState) -> None:
    assert can_transition(source, target) == ((source, target) in ALLOWED)
    if (source, target) in ALLOWED:
        check_transition(source, target)
    else:
        with pytest.raises(InvalidGroupTransition):
            check_transition(source, target)


def test_table_covers_every_state() -> None:
    assert set(VALID_PREVIOUS_STATES) == set(S)


def test_dead_is_terminal() -> None:
    assert [t for t in S if can_transition(S.DEAD, t)] == [S.DEAD]


def test_wire_names_and_filter_lookup() -> None:
    assert [s.wire_name for s in S] == [
        "Empty",
        "PreparingRebalance",
        "CompletingRebalance",
        "Stable",
        "Dead",
    ]
    assert GroupState.from_wire("stable") is S.STABLE
    assert GroupState.from_wire("PREPARINGREBALANCE") is S.PREPARING_REBALANCE
    assert GroupState.from_wire("nope") is None
