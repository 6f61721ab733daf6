"""KIP-939 two-phase commit in the transaction coordinator: the broker switch, the 2PC mark that
exempts a transaction from the timeout, and ``keep_prepared_txn`` handing an open transaction to
a new holder -- through crashes (replay of ``__transaction_state``)."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from exactly.coordinator.txn import TransactionState, TxnCoordinatorConfig
from exactly.coordinator.txn.log import decode_value
from exactly.coordinator.txn.metadata import TWO_PHASE_COMMIT_TIMEOUT_MS
from exactly.records.control import ControlType

from .harness import TIMEOUT_MS, Shell, tp

E = ErrorCode
S = TransactionState
TID = "sink-0"
ENABLED = TxnCoordinatorConfig(two_phase_commit_enable=True)


def prepared(shell: Shell, *, enable_2pc: bool = True) -> tuple[int, int]:
    """A producer (2PC or not) with an open transaction on out-0 and out-1: its (pid, epoch)."""
    r = shell.init(TID, enable_2pc=enable_2pc)
    assert r.error == E.none
    assert shell.add(TID, r.producer_id, r.producer_epoch, tp("out", 0), tp("out", 1)).error == E.none
    return r.producer_id, r.producer_epoch


def test_enable_2pc_is_refused_when_the_broker_does_not_allow_it() -> None:
    shell = Shell()  # transaction.two.phase.commit.enable defaults to false, as in Kafka
    assert shell.init(TID, enable_2pc=True).error == E.transactional_id_authorization_failed
    assert shell.init(TID, enable_2pc=True, keep_prepared_txn=True).error == (
        E.transactional_id_authorization_failed
    )
    assert shell.coord.transaction(TID) is None  # nothing was created
    assert shell.init(TID).error == E.none  # a plain transactional producer is unaffected


def test_keep_prepared_needs_enable_2pc() -> None:
    shell = Shell(config=ENABLED)
    assert shell.init(TID, keep_prepared_txn=True).error == E.invalid_request


def test_2pc_producer_ignores_its_timeout_and_stores_the_2pc_mark() -> None:
    shell = Shell(config=ENABLED)
    # a timeout above transaction.max.timeout.ms is not checked for a 2PC producer
    r = shell.init(TID, 10**9, enable_2pc=True)
    assert r.error == E.none
    assert shell.txn(TID).txn_timeout_ms == TWO_PHASE_COMMIT_TIMEOUT_MS
    assert decode_value(shell.log[-1][2] or b"").transaction_timeout_ms == TWO_PHASE_COMMIT_TIMEOUT_MS


def test_2pc_transaction_is_not_timed_out_even_after_a_restart() -> None:
    shell = Shell(config=ENABLED)
    pid, epoch = prepared(shell)
    shell.now += 10 * 24 * 3600 * 1000  # ten days
    assert shell.run(shell.coord.expire_timed_out(shell.now)) is None
    assert shell.restart() == ()  # replayed: still Ongoing, nothing owed
    assert shell.run(shell.coord.expire_timed_out(shell.now)) is None
    assert shell.txn(TID).state is S.ONGOING
    assert not shell.markers
    assert shell.end(TID, pid, epoch, True).error == E.none
    assert shell.markers[-1].result is ControlType.COMMIT


def test_plain_transaction_still_times_out() -> None:
    shell = Shell(config=ENABLED)
    prepared(shell, enable_2pc=False)
    shell.now += TIMEOUT_MS + 1
    shell.run(shell.coord.expire_timed_out(shell.now))
    assert shell.markers[-1].result is ControlType.ABORT


def test_keep_prepared_answers_the_ongoing_producer_and_fences_the_writer() -> None:
    shell = Shell(config=ENABLED)
    pid, epoch = prepared(shell)
    shell.restart()  # the writer died and the coordinator restarted: the transaction survives
    r = shell.init(TID, enable_2pc=True, keep_prepared_txn=True)
    assert (r.error, r.producer_id, r.producer_epoch) == (E.none, pid, epoch + 1)
    assert (r.ongoing_txn_producer_id, r.ongoing_txn_producer_epoch) == (pid, epoch)
    txn = shell.txn(TID)
    assert txn.state is S.ONGOING
    assert txn.partitions == frozenset({tp("out", 0), tp("out", 1)})
    assert not shell.markers  # nothing was aborted
    # the writer's epoch is fenced; the new holder decides
    assert shell.end(TID, pid, epoch, True).error == E.producer_fenced
    assert shell.end(TID, pid, epoch + 1, True).error == E.none
    (m,) = shell.markers
    assert (m.result, m.producer_epoch, m.partitions) == (
        ControlType.COMMIT,
        epoch + 1,
        frozenset({tp("out", 0), tp("out", 1)}),
    )
    assert shell.txn(TID).state is S.COMPLETE_COMMIT
    # a repeated commit by the holder is harmless
    assert shell.end(TID, pid, epoch + 1, True).error == E.none


def test_kept_transaction_survives_a_restart_and_can_be_aborted() -> None:
    shell = Shell(config=ENABLED)
    pid, epoch = prepared(shell)
    r = shell.init(TID, enable_2pc=True, keep_prepared_txn=True)
    shell.restart()
    txn = shell.txn(TID)
    assert (txn.state, txn.producer_epoch, txn.txn_timeout_ms) == (
        S.ONGOING,
        epoch + 1,
        TWO_PHASE_COMMIT_TIMEOUT_MS,
    )
    assert shell.end(TID, pid, r.producer_epoch, False).error == E.none
    assert shell.markers[-1].result is ControlType.ABORT


def test_keep_prepared_adopts_a_plain_transaction_as_2pc() -> None:
    """librdkafka cannot start a 2PC transaction: the sink adopts its plain one after flushing."""
    shell = Shell(config=ENABLED)
    pid, epoch = prepared(shell, enable_2pc=False)
    r = shell.init(TID, enable_2pc=True, keep_prepared_txn=True)
    assert (r.ongoing_txn_producer_id, r.ongoing_txn_producer_epoch) == (pid, epoch)
    assert shell.txn(TID).txn_timeout_ms == TWO_PHASE_COMMIT_TIMEOUT_MS
    shell.now += TIMEOUT_MS * 100
    assert shell.run(shell.coord.expire_timed_out(shell.now)) is None
    assert shell.txn(TID).state is S.ONGOING


def test_without_keep_prepared_a_2pc_transaction_is_aborted_as_usual() -> None:
    shell = Shell(config=ENABLED)
    _pid, epoch = prepared(shell)
    assert shell.init(TID, enable_2pc=True).error == E.concurrent_transactions
    assert shell.markers[-1].result is ControlType.ABORT
    r = shell.init(TID, enable_2pc=True)
    assert (r.error, r.producer_epoch, r.ongoing_txn_producer_id) == (E.none, epoch + 2, -1)


def test_keep_prepared_without_an_open_transaction_is_a_plain_init() -> None:
    shell = Shell(config=ENABLED)
    pid, epoch = prepared(shell)
    assert shell.end(TID, pid, epoch, True).error == E.none
    r = shell.init(TID, enable_2pc=True, keep_prepared_txn=True)
    assert (r.error, r.producer_id, r.producer_epoch) == (E.none, pid, epoch + 1)
    assert (r.ongoing_txn_producer_id, r.ongoing_txn_producer_epoch) == (-1, -1)


def test_keep_prepared_while_the_decision_is_being_written_is_retried() -> None:
    shell = Shell(config=ENABLED)
    pid, epoch = prepared(shell)
    shell.hold_markers = True
    assert shell.end(TID, pid, epoch, True).error == E.none
    assert shell.init(TID, enable_2pc=True, keep_prepared_txn=True).error == E.concurrent_transactions
    shell.release_markers()
    assert shell.init(TID, enable_2pc=True, keep_prepared_txn=True).error == E.none


def test_failed_keep_prepared_append_changes_nothing() -> None:
    shell = Shell(config=ENABLED)
    pid, epoch = prepared(shell)
    shell.append_errors = [E.not_leader_or_follower]
    assert shell.init(TID, enable_2pc=True, keep_prepared_txn=True).error == E.not_coordinator
    txn = shell.txn(TID)
    assert (txn.state, txn.producer_epoch) == (S.ONGOING, epoch)
    assert shell.end(TID, pid, epoch, True).error == E.none
