"""TransactionState: ids, names and the transition table, checked against Kafka's (TV1) values."""

from __future__ import annotations

import itertools

import pytest

from exactly.coordinator.txn.state import (
    VALID_PREVIOUS_STATES,
    InvalidTransitionError,
    TransactionState,
    check_transition,
    is_valid_transition,
)

S = TransactionState

# Written out independently of the module (from Kafka's TransactionState.java, TV1 edges only).
KAFKA_IDS_AND_NAMES = [
    (S.EMPTY, 0, "Empty"),
    (S.ONGOING, 1, "Ongoing"),
    (S.PREPARE_COMMIT, 2, "PrepareCommit"),
    (S.PREPARE_ABORT, 3, "PrepareAbort"),
    (S.COMPLETE_COMMIT, 4, "CompleteCommit"),
    (S.COMPLETE_ABORT, 5, "CompleteAbort"),
    (S.DEAD, 6, "Dead"),
    (S.PREPARE_EPOCH_FENCE, 7, "PrepareEpochFence"),
]

VALID = {
    (prev, target)
    for target, prevs in {
        S.EMPTY: [S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT],
        S.ONGOING: [S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT],
        S.PREPARE_COMMIT: [S.ONGOING],
        S.PREPARE_ABORT: [S.ONGOING, S.PREPARE_EPOCH_FENCE],
        S.COMPLETE_COMMIT: [S.PREPARE_COMMIT],
        S.COMPLETE_ABORT: [S.PREPARE_ABORT],
        S.DEAD: [S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT],
        S.PREPARE_EPOCH_FENCE: [S.ONGOING],
    }.items()
    for prev in prevs
}
ALL_PAIRS = list(itertools.product(S, S))


@pytest.mark.parametrize(("state", "state_id", "name"), KAFKA_IDS_AND_NAMES)
def test_ids_and_names_match_kafka(state: TransactionState, state_id: int, name: str) -> None:
    assert state.id == state_id
    assert state.state_name == name
    assert str(state) == name
    assert TransactionState.from_id(state_id) is state
    assert TransactionState.from_name(name) is state


def test_every_state_is_listed() -> None:
    assert {s for s, _, _ in KAFKA_IDS_AND_NAMES} == set(S)
    assert set(VALID_PREVIOUS_STATES) == set(S)


def test_unknown_id_and_name() -> None:
    with pytest.raises(ValueError, match="unknown transaction state id 8"):
        TransactionState.from_id(8)
    assert TransactionState.from_name("ongoing") is None  # names are case-sensitive, as in Kafka
    assert TransactionState.from_name("Bogus") is None


@pytest.mark.parametrize(("prev", "target"), sorted(VALID, key=lambda p: (p[0].id, p[1].id)))
def test_valid_transition(prev: TransactionState, target: TransactionState) -> None:
    assert is_valid_transition(prev, target)
    assert prev in target.valid_previous_states
    check_transition(prev, target)  # does not raise


@pytest.mark.parametrize(
    ("prev", "target"), [p for p in ALL_PAIRS if p not in VALID], ids=lambda s: s.state_name
)
def test_invalid_transition_raises(prev: TransactionState, target: TransactionState) -> None:
    assert not is_valid_transition(prev, target)
    with pytest.raises(InvalidTransitionError, match=f"{prev.state_name} -> {target.state_name}"):
        check_transition(prev, target)


def test_tv2_edges_are_not_allowed() -> None:
    # Kafka 4 lets a TV2 client abort from Empty/Complete*; this coordinator is TV1.
    for prev in (S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT):
        assert not is_valid_transition(prev, S.PREPARE_ABORT)


def test_dead_and_fence_are_terminal_or_transient() -> None:
    # Nothing may follow Dead; only PrepareAbort may follow PrepareEpochFence.
    assert [t for t in S if is_valid_transition(S.DEAD, t)] == []
    assert [t for t in S if is_valid_transition(S.PREPARE_EPOCH_FENCE, t)] == [S.PREPARE_ABORT]


def test_expiration_allowed_only_without_transaction_in_flight() -> None:
    assert {s for s in S if s.expiration_allowed} == {S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}
    assert {s for s in S if s.is_prepare} == {S.PREPARE_COMMIT, S.PREPARE_ABORT}
