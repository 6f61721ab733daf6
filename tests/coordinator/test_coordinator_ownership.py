"""The ownership object both coordinators share (``exactly.coordinator.ownership``): its one
transition table, the error a request for a key of a partition gets in each state, and that the
group and transaction coordinators follow it through their load/unload calls."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from kio.schema.errors import ErrorCode

from exactly.coordinator.group import GroupCoordinator, GroupCoordinatorConfig
from exactly.coordinator.ownership import (
    TRANSITIONS,
    InvalidOwnershipTransitionError,
    Ownership,
    OwnershipEvent,
    OwnershipState,
)
from exactly.coordinator.txn import TransactionCoordinator, TxnCoordinatorConfig
from exactly.types import ProducerId

S = OwnershipState
E = OwnershipEvent
PARTITIONS = range(6)


def in_state(state: OwnershipState) -> Ownership:
    """An ownership in ``state``, reached through the public transitions only."""
    new = Ownership()
    return {
        S.NEW: new,
        S.LOADING: new.begin_load([1, 2]),
        S.OWNING: new.begin_load([1, 2]).complete_load(),
        S.RESIGNED: new.resign(),
    }[state]


def apply(ownership: Ownership, event: OwnershipEvent) -> Ownership:
    if event is E.BEGIN_LOAD:
        return ownership.begin_load([3])
    if event is E.COMPLETE_LOAD:
        return ownership.complete_load()
    return ownership.resign()


def errors(ownership: Ownership) -> dict[int, ErrorCode | None]:
    return {p: ownership.owner_error(p) for p in PARTITIONS}


@pytest.mark.parametrize(("state", "event"), list(itertools.product(S, E)))
def test_every_transition_follows_the_table_and_the_rest_raise(
    state: OwnershipState, event: OwnershipEvent
) -> None:
    before = in_state(state)
    assert before.state is state
    target = TRANSITIONS.get((state, event))
    if target is None:
        with pytest.raises(InvalidOwnershipTransitionError):
            apply(before, event)
        return
    assert apply(before, event).state is target


def test_the_invalid_transitions_are_completing_a_load_that_never_began() -> None:
    invalid = {pair for pair in itertools.product(S, E) if pair not in TRANSITIONS}
    assert invalid == {(S.OWNING, E.COMPLETE_LOAD), (S.RESIGNED, E.COMPLETE_LOAD)}


def test_a_new_coordinator_owns_every_partition() -> None:
    assert errors(Ownership()) == dict.fromkeys(PARTITIONS)
    # a single broker's first load may skip begin_load
    assert errors(Ownership().complete_load()) == dict.fromkeys(PARTITIONS)


def test_a_load_answers_load_in_progress_for_every_partition_then_serves_only_its_own() -> None:
    loading = Ownership().begin_load([1, 4])
    assert loading.loading and loading.partitions == frozenset({1, 4})
    assert errors(loading) == dict.fromkeys(PARTITIONS, ErrorCode.coordinator_load_in_progress)
    owning = loading.complete_load()
    assert not owning.loading
    assert errors(owning) == {p: None if p in (1, 4) else ErrorCode.not_coordinator for p in PARTITIONS}
    # a load of every partition (None) serves every one
    assert errors(owning.begin_load(None).complete_load()) == dict.fromkeys(PARTITIONS)


def test_resigning_owns_nothing_until_a_load_begins() -> None:
    for state in (S.NEW, S.LOADING, S.OWNING, S.RESIGNED):
        resigned = in_state(state).resign()
        assert resigned.state is S.RESIGNED and resigned.partitions == frozenset()
        assert errors(resigned) == dict.fromkeys(PARTITIONS, ErrorCode.not_coordinator)
        with pytest.raises(InvalidOwnershipTransitionError):
            resigned.complete_load()
    # a load of nothing (the runtime's reload to an empty set), ended: still owns nothing
    empty = Ownership().begin_load(()).complete_load()
    assert errors(empty) == dict.fromkeys(PARTITIONS, ErrorCode.not_coordinator)


def test_loads_count_every_begin_load_and_the_value_is_frozen() -> None:
    o = Ownership()
    assert o.loads == 0
    o = o.begin_load([0]).begin_load([1]).complete_load().resign().begin_load(None)
    assert o.loads == 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.state = S.OWNING  # type: ignore[misc]


def test_the_group_coordinator_follows_the_lifecycle() -> None:
    coord = GroupCoordinator(GroupCoordinatorConfig(num_partitions=4))
    assert coord.ownership.state is S.NEW
    coord.begin_load([coord.partition_for("g")])
    assert coord.ownership.state is S.LOADING
    assert coord.owner_error("g") == ErrorCode.coordinator_load_in_progress
    coord.load_complete(0)
    assert coord.ownership.state is S.OWNING and coord.owner_error("g") is None
    coord.unload(0)
    assert coord.ownership.state is S.RESIGNED and coord.owner_error("g") == ErrorCode.not_coordinator
    with pytest.raises(InvalidOwnershipTransitionError):
        coord.load_complete(0)  # a load the runtime never began


def test_the_transaction_coordinator_follows_the_lifecycle() -> None:
    coord = TransactionCoordinator(
        lambda: ProducerId(1000), config=TxnCoordinatorConfig(transaction_state_partitions=4)
    )
    assert coord.ownership.state is S.NEW and coord.owner_error("t") is None
    coord.begin_load(1, partitions=[coord.partition_for("t")])
    assert coord.loading and coord.owner_error("t") == ErrorCode.coordinator_load_in_progress
    coord.load_complete(0)
    assert coord.ownership.state is S.OWNING and coord.owner_error("t") is None
    # its unload resigns (Kafka: a partition not owned is NOT_COORDINATOR, not LOAD_IN_PROGRESS)
    coord.unload(0)
    assert coord.ownership.state is S.RESIGNED and coord.ownership.partitions == frozenset()
    assert not coord.loading and coord.owner_error("t") == ErrorCode.not_coordinator
    with pytest.raises(InvalidOwnershipTransitionError):
        coord.load_complete(0)  # a load the runtime never began
    # the runtime's reload to an empty set: a load of nothing, ended
    coord.begin_load(2, partitions=())
    assert coord.owner_error("t") == ErrorCode.coordinator_load_in_progress
    coord.load_complete(0)
    assert coord.owner_error("t") == ErrorCode.not_coordinator
