"""TransactionMetadata / TxnTransitMetadata: prepare -> complete, and every prepare_* rule."""

from __future__ import annotations

import dataclasses

import pytest

from exactly.coordinator.txn.metadata import (
    IllegalTransitionStateError,
    ProducerFencedError,
    TransactionMetadata,
    TxnTransitMetadata,
    is_epoch_exhausted,
)
from exactly.coordinator.txn.state import InvalidTransitionError, TransactionState
from exactly.types import MAX_PRODUCER_EPOCH, ProducerEpoch, ProducerId, TopicPartition

from .harness import PidGen, tp

S = TransactionState
T0 = 1_000


def fresh(pid: int = 7, timeout: int = 60_000) -> TransactionMetadata:
    return TransactionMetadata.new("t", ProducerId(pid), timeout, T0)


def at(
    state: TransactionState,
    *,
    epoch: int = 3,
    partitions: frozenset[TopicPartition] = frozenset(),
    start: int = -1,
) -> TransactionMetadata:
    """Metadata loaded in ``state`` (as replay would build it)."""
    if start == -1 and state not in (S.EMPTY, S.DEAD):
        start = T0
    md = fresh()
    md.state = state
    md.producer_epoch = ProducerEpoch(epoch)
    md.partitions = partitions
    md.txn_start_timestamp = start
    return md


def applied(md: TransactionMetadata, transit: TxnTransitMetadata) -> TransactionMetadata:
    md.complete_transition(transit)
    return md


def test_new_is_empty_with_no_epoch() -> None:
    md = fresh()
    assert (md.state, md.producer_epoch, md.txn_start_timestamp, md.pending_state) == (S.EMPTY, -1, -1, None)


def test_prepare_changes_nothing_but_pending_state() -> None:
    md = fresh()
    before = md.snapshot()
    transit = md.prepare_init_producer_id(30_000, None, T0 + 5, PidGen())
    assert md.snapshot() == before
    assert md.pending_state is S.EMPTY
    assert (transit.producer_epoch, transit.txn_timeout_ms, transit.txn_last_update_timestamp) == (
        0,
        30_000,
        T0 + 5,
    )
    applied(md, transit)
    assert (md.producer_epoch, md.txn_timeout_ms, md.pending_state) == (0, 30_000, None)


def test_abort_pending_restores_exactly() -> None:
    md = at(S.ONGOING, partitions=frozenset({tp("a")}))
    before = md.snapshot()
    md.prepare_abort_or_commit(S.PREPARE_COMMIT, T0 + 1)
    md.abort_pending()
    assert md.snapshot() == before and md.pending_state is None


def test_second_prepare_while_pending_raises() -> None:
    md = at(S.ONGOING, partitions=frozenset({tp("a")}))
    md.prepare_abort_or_commit(S.PREPARE_COMMIT, T0)
    with pytest.raises(IllegalTransitionStateError, match="pending"):
        md.prepare_add_partitions([tp("b")], T0)


def test_transit_is_immutable() -> None:
    transit = fresh().prepare_dead()
    with pytest.raises(dataclasses.FrozenInstanceError):
        transit.state = S.EMPTY  # type: ignore[misc]


# -- InitProducerId: bump, KIP-360, rotation ----------------------------------------------------


def test_increment_without_expected_epoch_forgets_last_epoch() -> None:
    md = at(S.COMPLETE_COMMIT, epoch=4)
    t = md.prepare_increment_producer_epoch(1, None, T0)
    assert (t.producer_epoch, t.last_producer_epoch, t.partitions, t.txn_start_timestamp) == (
        5,
        -1,
        frozenset(),
        -1,
    )


def test_increment_with_current_epoch_remembers_it_and_retry_does_not_bump() -> None:
    md = at(S.EMPTY, epoch=4)
    applied(md, md.prepare_increment_producer_epoch(1, ProducerEpoch(4), T0))
    assert (md.producer_epoch, md.last_producer_epoch) == (5, 4)
    # the response was lost; the producer retries with the epoch it still holds
    retry = md.prepare_increment_producer_epoch(1, ProducerEpoch(4), T0 + 1)
    assert (retry.producer_epoch, retry.last_producer_epoch) == (5, 4)


def test_increment_with_stale_epoch_is_fenced() -> None:
    md = at(S.EMPTY, epoch=4)
    with pytest.raises(ProducerFencedError):
        md.prepare_increment_producer_epoch(1, ProducerEpoch(2), T0)
    assert md.pending_state is None


def test_exhausted_epoch_rotates_producer_id() -> None:
    assert not is_epoch_exhausted(MAX_PRODUCER_EPOCH - 2)
    assert is_epoch_exhausted(MAX_PRODUCER_EPOCH - 1)
    md = at(S.COMPLETE_ABORT, epoch=MAX_PRODUCER_EPOCH - 1)
    gen = PidGen(start=5000)
    t = md.prepare_init_producer_id(1, None, T0, gen)
    assert (t.producer_id, t.producer_epoch, t.prev_producer_id, t.last_producer_epoch) == (5000, 0, 7, -1)
    assert gen.calls == 1
    applied(md, t)
    assert (md.producer_id, md.producer_epoch) == (5000, 0)


def test_rotation_with_expected_epoch_records_last_epoch() -> None:
    md = at(S.EMPTY, epoch=MAX_PRODUCER_EPOCH - 1)
    t = md.prepare_init_producer_id(1, ProducerEpoch(MAX_PRODUCER_EPOCH - 1), T0, PidGen())
    assert t.last_producer_epoch == MAX_PRODUCER_EPOCH - 1


def test_generator_not_called_when_epoch_can_be_bumped() -> None:
    gen = PidGen()
    fresh().prepare_init_producer_id(1, None, T0, gen)
    assert gen.calls == 0


def test_bumping_an_exhausted_epoch_directly_is_a_bug() -> None:
    with pytest.raises(IllegalTransitionStateError, match="exhausted"):
        at(S.EMPTY, epoch=MAX_PRODUCER_EPOCH - 1).prepare_increment_producer_epoch(1, None, T0)


def test_cannot_rotate_during_a_transaction() -> None:
    with pytest.raises(IllegalTransitionStateError):
        at(S.ONGOING).prepare_producer_id_rotation(ProducerId(9), 1, T0, record_last_epoch=False)


# -- partitions, end, fence, complete, dead -----------------------------------------------------


def test_add_partitions_starts_transaction_once() -> None:
    md = at(S.EMPTY)
    applied(md, md.prepare_add_partitions([tp("a")], T0 + 10))
    assert (md.state, md.txn_start_timestamp, md.partitions) == (S.ONGOING, T0 + 10, {tp("a")})
    applied(md, md.prepare_add_partitions([tp("b", 1)], T0 + 20))
    assert (md.txn_start_timestamp, md.txn_last_update_timestamp) == (T0 + 10, T0 + 20)
    assert md.partitions == {tp("a"), tp("b", 1)}


def test_add_partitions_after_complete_starts_a_new_transaction() -> None:
    md = at(S.COMPLETE_COMMIT, start=T0)
    t = md.prepare_add_partitions([tp("a")], T0 + 99)
    assert t.txn_start_timestamp == T0 + 99


@pytest.mark.parametrize("target", [S.PREPARE_COMMIT, S.PREPARE_ABORT])
def test_end_only_from_ongoing(target: TransactionState) -> None:
    md = at(S.ONGOING, partitions=frozenset({tp("a")}))
    t = md.prepare_abort_or_commit(target, T0 + 1)
    assert (t.state, t.producer_epoch, t.partitions) == (target, 3, {tp("a")})
    with pytest.raises(InvalidTransitionError):
        at(S.EMPTY).prepare_abort_or_commit(target, T0)
    with pytest.raises(ValueError, match="not a prepare state"):
        at(S.ONGOING).prepare_abort_or_commit(S.COMPLETE_ABORT, T0)


def test_fence_bumps_epoch_and_aborts() -> None:
    md = at(S.ONGOING, epoch=3, partitions=frozenset({tp("a")}))
    md.last_producer_epoch = ProducerEpoch(2)
    t = md.prepare_fence_and_abort(T0 + 5)
    assert (t.state, t.producer_epoch, t.last_producer_epoch, t.epoch_fence) == (S.PREPARE_ABORT, 4, -1, True)
    assert md.pending_state is S.PREPARE_ABORT and md.producer_epoch == 3
    applied(md, t)
    assert (md.state, md.producer_epoch) == (S.PREPARE_ABORT, 4)


def test_fence_at_max_epoch_keeps_epoch() -> None:
    md = at(S.ONGOING, epoch=MAX_PRODUCER_EPOCH)
    assert md.prepare_fence_and_abort(T0).producer_epoch == MAX_PRODUCER_EPOCH


def test_fence_requires_ongoing() -> None:
    with pytest.raises(InvalidTransitionError, match="PrepareEpochFence"):
        at(S.COMPLETE_COMMIT).prepare_fence_and_abort(T0)


@pytest.mark.parametrize(
    ("prep", "done"), [(S.PREPARE_COMMIT, S.COMPLETE_COMMIT), (S.PREPARE_ABORT, S.COMPLETE_ABORT)]
)
def test_complete_clears_partitions(prep: TransactionState, done: TransactionState) -> None:
    md = at(prep, partitions=frozenset({tp("a")}))
    applied(md, md.prepare_complete(T0 + 7))
    assert (md.state, md.partitions, md.txn_start_timestamp) == (done, frozenset(), T0)


def test_complete_only_from_prepare() -> None:
    with pytest.raises(IllegalTransitionStateError):
        at(S.ONGOING).prepare_complete(T0)


def test_dead_only_when_idle() -> None:
    assert at(S.COMPLETE_ABORT).prepare_dead().state is S.DEAD
    with pytest.raises(InvalidTransitionError):
        at(S.ONGOING).prepare_dead()


def test_dead_is_never_completed() -> None:
    md = at(S.EMPTY)
    t = md.prepare_dead()
    with pytest.raises(IllegalTransitionStateError):
        md.complete_transition(t)


# -- complete_transition guards -----------------------------------------------------------------


def test_complete_without_pending_raises() -> None:
    md = at(S.EMPTY)
    with pytest.raises(IllegalTransitionStateError, match="no pending"):
        md.complete_transition(md.snapshot())


def test_complete_with_other_state_than_prepared_raises() -> None:
    md = at(S.ONGOING, partitions=frozenset({tp("a")}))
    t = md.prepare_abort_or_commit(S.PREPARE_COMMIT, T0)
    with pytest.raises(IllegalTransitionStateError):
        md.complete_transition(dataclasses.replace(t, state=S.PREPARE_ABORT))


@pytest.mark.parametrize(
    "forge",
    [
        {"producer_epoch": ProducerEpoch(9)},  # epoch jump
        {"partitions": frozenset()},  # partition set changed under a prepare
        {"txn_timeout_ms": 1},
        {"txn_start_timestamp": 5},
    ],
)
def test_complete_rejects_forged_prepare_transit(forge: dict[str, object]) -> None:
    md = at(S.ONGOING, partitions=frozenset({tp("a")}))
    t = md.prepare_abort_or_commit(S.PREPARE_ABORT, T0)
    with pytest.raises(IllegalTransitionStateError):
        md.complete_transition(dataclasses.replace(t, **forge))  # type: ignore[arg-type]
    assert md.state is S.ONGOING


def test_complete_rejects_shrinking_partitions_on_add() -> None:
    md = at(S.ONGOING, partitions=frozenset({tp("a"), tp("b")}))
    t = md.prepare_add_partitions([tp("c")], T0)
    with pytest.raises(IllegalTransitionStateError):
        md.complete_transition(dataclasses.replace(t, partitions=frozenset({tp("c")})))


def test_complete_rejects_epoch_jump_on_init() -> None:
    md = at(S.EMPTY, epoch=3)
    t = md.prepare_increment_producer_epoch(1, None, T0)
    with pytest.raises(IllegalTransitionStateError):
        md.complete_transition(dataclasses.replace(t, producer_epoch=ProducerEpoch(6)))
