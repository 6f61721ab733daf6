"""ProducerStateManager: idempotence, epochs, transactions, expiration (Kafka's rules)."""

from __future__ import annotations

from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from exactly.records.batch import BatchHeader
from exactly.records.builder import Record, build_batch
from exactly.records.control import ControlType, build_control_batch
from exactly.storage.producer_state import (
    AppendOrigin,
    CompletedTxn,
    DuplicateBatch,
    ProducerAppendInfo,
    ProducerStateError,
    ProducerStateManager,
)

INT32_MAX = 2**31 - 1
CLIENT = AppendOrigin.CLIENT
COORD = AppendOrigin.COORDINATOR
REPL = AppendOrigin.REPLICATION


def data(
    offset: int,
    *,
    pid: int = 7,
    epoch: int = 0,
    seq: int = 0,
    count: int = 1,
    txn: bool = False,
    ts: int = 500,
) -> BatchHeader:
    raw = build_batch(
        [Record(value=b"v")] * count,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        transactional=txn,
        base_timestamp=ts,
    )
    return BatchHeader.parse(raw).with_base_offset(offset)


def marker(offset: int, *, pid: int = 7, epoch: int = 0, ts: int = 900) -> BatchHeader:
    raw = build_control_batch(
        ControlType.COMMIT, producer_id=pid, producer_epoch=epoch, coordinator_epoch=0, timestamp=ts
    )
    return BatchHeader.parse(raw).with_base_offset(offset)


@pytest.fixture
def psm(tmp_path: Path) -> ProducerStateManager:
    return ProducerStateManager(tmp_path, producer_id_expiration_ms=10_000)


def append(
    psm: ProducerStateManager, header: BatchHeader, origin: AppendOrigin = CLIENT, now_ms: int = 1000
) -> CompletedTxn | None:
    info = psm.prepare_append(header, origin=origin, now_ms=now_ms)
    assert isinstance(info, ProducerAppendInfo), info
    return psm.complete_append(info)


def end_txn(
    psm: ProducerStateManager,
    header: BatchHeader,
    ctype: ControlType = ControlType.COMMIT,
    coordinator_epoch: int = 0,
    origin: AppendOrigin = COORD,
) -> CompletedTxn | None:
    info = psm.prepare_append(
        header, origin=origin, now_ms=2000, control_type=ctype, coordinator_epoch=coordinator_epoch
    )
    assert isinstance(info, ProducerAppendInfo)
    return psm.complete_append(info)


def expect_error(psm: ProducerStateManager, header: BatchHeader, code: ErrorCode, **kw: object) -> None:
    with pytest.raises(ProducerStateError) as exc:
        psm.prepare_append(header, origin=CLIENT, now_ms=1000, **kw)  # type: ignore[arg-type]
    assert exc.value.error_code == code


# --- sequences -------------------------------------------------------------------------------


def test_unknown_producer_is_accepted_at_any_sequence(psm: ProducerStateManager) -> None:
    append(psm, data(0, seq=42, count=3))
    entry = psm.last_entry(7)
    assert entry is not None
    assert (entry.producer_epoch, entry.last_seq, entry.last_data_offset) == (0, 44, 2)
    assert entry.batches[0].first_offset == 0
    assert entry.last_timestamp == 1000  # broker time, not the batch's CreateTime


def test_in_sequence_batches_accepted_and_gap_rejected(psm: ProducerStateManager) -> None:
    append(psm, data(0, seq=0, count=2))
    append(psm, data(2, seq=2, count=3))
    expect_error(psm, data(5, seq=6), ErrorCode.out_of_order_sequence_number)  # gap
    expect_error(psm, data(5, seq=3), ErrorCode.out_of_order_sequence_number)  # overlap, not a dup
    entry = psm.last_entry(7)
    assert entry is not None and entry.last_seq == 4


def test_prepare_does_not_change_state_until_complete(psm: ProducerStateManager) -> None:
    append(psm, data(0, seq=0))
    info = psm.prepare_append(data(1, seq=1, txn=True), origin=CLIENT, now_ms=1000)
    assert isinstance(info, ProducerAppendInfo)
    entry = psm.last_entry(7)
    assert entry is not None and entry.last_seq == 0
    assert psm.first_unstable_offset() is None
    psm.complete_append(info)
    assert psm.first_unstable_offset() == 1
    assert psm.map_end_offset == 2


def test_sequence_wraps_at_int32_max(psm: ProducerStateManager) -> None:
    append(psm, data(0, seq=INT32_MAX - 1, count=2))  # last seq INT32_MAX
    append(psm, data(2, seq=0, count=1))
    # a batch spanning the wrap: seqs INT32_MAX, 0, 1
    psm2 = ProducerStateManager(psm.directory)
    append(psm2, data(0, seq=INT32_MAX - 2, count=2))
    append(psm2, data(2, seq=INT32_MAX, count=3))
    entry = psm2.last_entry(7)
    assert entry is not None and entry.last_seq == 1
    append(psm2, data(5, seq=2))
    expect_error(psm2, data(6, seq=INT32_MAX), ErrorCode.out_of_order_sequence_number)


def test_duplicate_of_last_batch_acks_original_offsets(psm: ProducerStateManager) -> None:
    append(psm, data(10, seq=0, count=3, ts=777))
    dup = psm.prepare_append(data(99, seq=0, count=3, ts=888), origin=CLIENT, now_ms=5000)
    assert dup == DuplicateBatch(first_offset=10, last_offset=12, timestamp=777)
    entry = psm.last_entry(7)
    assert entry is not None and len(entry.batches) == 1 and entry.last_timestamp == 1000


@pytest.mark.parametrize("which", range(5))
def test_duplicate_of_any_of_last_five_batches(psm: ProducerStateManager, which: int) -> None:
    for i in range(7):
        append(psm, data(i * 2, seq=i * 2, count=2))
    # cached: batches 2..6 (seqs 4..13)
    i = 2 + which
    dup = psm.prepare_append(data(100, seq=i * 2, count=2), origin=CLIENT, now_ms=1000)
    assert dup == DuplicateBatch(first_offset=i * 2, last_offset=i * 2 + 1, timestamp=500)


def test_sixth_oldest_batch_is_evicted_and_its_resend_is_out_of_order(psm: ProducerStateManager) -> None:
    for i in range(6):
        append(psm, data(i, seq=i))
    entry = psm.last_entry(7)
    assert entry is not None and [b.first_seq for b in entry.batches] == [1, 2, 3, 4, 5]
    expect_error(psm, data(6, seq=0), ErrorCode.out_of_order_sequence_number)
    assert isinstance(psm.prepare_append(data(6, seq=1), origin=CLIENT, now_ms=0), DuplicateBatch)


def test_duplicate_needs_same_epoch_and_same_range(psm: ProducerStateManager) -> None:
    append(psm, data(0, seq=0, count=3))
    expect_error(psm, data(3, seq=0, count=2), ErrorCode.out_of_order_sequence_number)
    append(psm, data(3, epoch=1, seq=0, count=1))
    # same seq range as the epoch-0 batch, but epoch 0 is now fenced
    expect_error(psm, data(4, epoch=0, seq=0, count=3), ErrorCode.invalid_producer_epoch)


def test_duplicates_only_detected_for_client_origin(psm: ProducerStateManager) -> None:
    append(psm, data(0, seq=0))
    info = psm.prepare_append(data(1, seq=0), origin=REPL, now_ms=0)
    assert isinstance(info, ProducerAppendInfo)


# --- epochs ----------------------------------------------------------------------------------


def test_epoch_bump_must_start_at_sequence_zero(psm: ProducerStateManager) -> None:
    append(psm, data(0, seq=0, count=5))
    expect_error(psm, data(5, epoch=1, seq=5), ErrorCode.out_of_order_sequence_number)
    append(psm, data(5, epoch=1, seq=0))
    entry = psm.last_entry(7)
    assert entry is not None
    assert entry.producer_epoch == 1 and len(entry.batches) == 1  # old epoch's batches dropped
    append(psm, data(6, epoch=1, seq=1))


def test_lower_epoch_is_fenced(psm: ProducerStateManager) -> None:
    append(psm, data(0, epoch=3, seq=0))
    expect_error(psm, data(1, epoch=2, seq=1), ErrorCode.invalid_producer_epoch)
    expect_error(psm, data(1, epoch=2, seq=0), ErrorCode.invalid_producer_epoch)


def test_lower_epoch_fenced_for_coordinator_data_batches(psm: ProducerStateManager) -> None:
    append(psm, data(0, epoch=3, seq=0))
    with pytest.raises(ProducerStateError) as exc:
        psm.prepare_append(data(1, epoch=2, seq=-1, txn=True), origin=COORD, now_ms=0)
    assert exc.value.error_code == ErrorCode.invalid_producer_epoch
    # the coordinator's own batches carry no sequences: not checked
    append(psm, data(1, epoch=3, seq=-1, txn=True), origin=COORD)


def test_replication_never_raises_on_sequence_or_epoch(psm: ProducerStateManager) -> None:
    append(psm, data(0, epoch=3, seq=0))
    append(psm, data(1, epoch=3, seq=10), origin=REPL)
    append(psm, data(2, epoch=2, seq=99), origin=REPL)
    append(psm, data(3, epoch=5, seq=4), origin=REPL)
    entry = psm.last_entry(7)
    assert entry is not None and entry.producer_epoch == 5 and entry.last_seq == 4


def test_batches_without_producer_id_leave_no_state(psm: ProducerStateManager) -> None:
    info = psm.prepare_append(data(0, pid=-1, epoch=-1, seq=-1, count=4), origin=CLIENT, now_ms=0)
    assert isinstance(info, ProducerAppendInfo)
    assert psm.complete_append(info) is None
    assert psm.active_producers() == {}
    assert psm.map_end_offset == 4


# --- transactions ----------------------------------------------------------------------------


def test_transaction_start_continue_and_commit(psm: ProducerStateManager) -> None:
    append(psm, data(5, seq=0, count=2, txn=True))
    append(psm, data(7, seq=2, txn=True))
    assert psm.first_unstable_offset() == 5
    assert psm.ongoing_transactions() == {7: 5}
    entry = psm.last_entry(7)
    assert entry is not None and entry.current_txn_first_offset == 5
    assert end_txn(psm, marker(8)) == CompletedTxn(7, 5, 8, is_aborted=False)
    assert psm.first_unstable_offset() is None and psm.ongoing_transactions() == {}
    assert psm.map_end_offset == 9
    # the next transaction continues the sequence of the same epoch
    append(psm, data(9, seq=3, txn=True))
    assert psm.first_unstable_offset() == 9
    assert end_txn(psm, marker(10), ControlType.ABORT) == CompletedTxn(7, 9, 10, is_aborted=True)


def test_first_unstable_offset_is_the_minimum_over_producers(psm: ProducerStateManager) -> None:
    append(psm, data(0, pid=1, seq=0, txn=True))
    append(psm, data(1, pid=2, seq=0, txn=True))
    append(psm, data(2, pid=3, seq=0, txn=True))
    assert psm.first_unstable_offset() == 0
    end_txn(psm, marker(3, pid=2))
    assert psm.first_unstable_offset() == 0
    end_txn(psm, marker(4, pid=1))
    assert psm.first_unstable_offset() == 2
    append(psm, data(5, pid=1, seq=1, txn=True))
    end_txn(psm, marker(6, pid=3))
    assert psm.first_unstable_offset() == 5
    assert psm.ongoing_transactions() == {1: 5}


def test_non_transactional_batch_during_transaction_is_invalid_txn_state(psm: ProducerStateManager) -> None:
    append(psm, data(0, seq=0, txn=True))
    expect_error(psm, data(1, seq=1, txn=False), ErrorCode.invalid_txn_state)
    end_txn(psm, marker(1))
    append(psm, data(2, seq=1, txn=False))  # fine once the transaction is over


def test_marker_without_open_transaction_updates_epochs_only(psm: ProducerStateManager) -> None:
    append(psm, data(0, seq=0))
    assert end_txn(psm, marker(1, epoch=1), coordinator_epoch=4) is None
    entry = psm.last_entry(7)
    assert entry is not None
    assert (entry.producer_epoch, entry.coordinator_epoch, entry.batches) == (1, 4, ())
    # epoch 1 is now current: epoch 0 is fenced, epoch 1 must start at 0 (no batches in it yet)
    expect_error(psm, data(2, epoch=0, seq=1), ErrorCode.invalid_producer_epoch)
    expect_error(psm, data(2, epoch=1, seq=5), ErrorCode.out_of_order_sequence_number)
    append(psm, data(2, epoch=1, seq=0))


def test_marker_for_unknown_producer_creates_entry(psm: ProducerStateManager) -> None:
    assert end_txn(psm, marker(0, pid=99, epoch=2), ControlType.ABORT, coordinator_epoch=1) is None
    entry = psm.last_entry(99)
    assert entry is not None and (entry.producer_epoch, entry.coordinator_epoch) == (2, 1)


def test_marker_with_older_producer_epoch_is_rejected(psm: ProducerStateManager) -> None:
    append(psm, data(0, epoch=2, seq=0, txn=True))
    with pytest.raises(ProducerStateError) as exc:
        end_txn(psm, marker(1, epoch=1))
    assert exc.value.error_code == ErrorCode.invalid_producer_epoch
    assert psm.first_unstable_offset() == 0


def test_marker_from_fenced_coordinator_is_rejected(psm: ProducerStateManager) -> None:
    append(psm, data(0, seq=0, txn=True))
    end_txn(psm, marker(1), coordinator_epoch=5)
    append(psm, data(2, seq=1, txn=True))
    with pytest.raises(ProducerStateError) as exc:
        end_txn(psm, marker(3), coordinator_epoch=4)
    assert exc.value.error_code == ErrorCode.transaction_coordinator_fenced
    assert psm.first_unstable_offset() == 2
    assert end_txn(psm, marker(3), coordinator_epoch=5) == CompletedTxn(7, 2, 3, is_aborted=False)
    # replay of the log never raises, even for a stale coordinator epoch
    append(psm, data(4, seq=2, txn=True))
    assert end_txn(psm, marker(5), coordinator_epoch=1, origin=REPL) == CompletedTxn(7, 4, 5, False)


def test_epoch_bump_keeps_open_transaction_until_its_marker(psm: ProducerStateManager) -> None:
    append(psm, data(0, epoch=0, seq=0, txn=True))
    # the coordinator aborts the old transaction with the bumped epoch
    assert end_txn(psm, marker(1, epoch=1), ControlType.ABORT) == CompletedTxn(7, 0, 1, True)
    append(psm, data(2, epoch=1, seq=0, txn=True))
    assert psm.first_unstable_offset() == 2


def test_control_batch_needs_control_type_except_in_replay(psm: ProducerStateManager) -> None:
    append(psm, data(0, seq=0, txn=True))
    with pytest.raises(ValueError):
        psm.prepare_append(marker(1), origin=COORD, now_ms=0)
    # replay of an unreadable marker: skipped (as Kafka skips an empty control batch)
    assert psm.replay(marker(1)) is None
    assert psm.first_unstable_offset() == 0 and psm.map_end_offset == 2


# --- expiration ------------------------------------------------------------------------------


def test_expiration_drops_idle_producers_without_open_transaction(psm: ProducerStateManager) -> None:
    append(psm, data(0, pid=1, seq=0), now_ms=1_000)
    append(psm, data(1, pid=2, seq=0, txn=True), now_ms=1_000)
    append(psm, data(2, pid=3, seq=0), now_ms=5_000)
    assert psm.remove_expired_producers(10_999) == 0
    assert psm.remove_expired_producers(11_000) == 1  # idle exactly the expiration: expired
    assert set(psm.active_producers()) == {2, 3}
    assert psm.remove_expired_producers(100_000) == 1  # 3 goes; 2 keeps its open transaction
    assert set(psm.active_producers()) == {2}
    # an expired producer is unknown again: any sequence is accepted
    append(psm, data(3, pid=1, seq=77))


def test_expiration_uses_broker_time_not_client_timestamps(psm: ProducerStateManager) -> None:
    append(psm, data(0, seq=0, ts=1), now_ms=50_000)  # client clock far in the past
    assert psm.remove_expired_producers(55_000) == 0
