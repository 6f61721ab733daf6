"""Transactions at the wire level (tests/support/wire.py, kio): KIP-890 partition verification on
Produce, error codes (not closed connections) for fenced coordinator requests by version, and
transaction.max.timeout.ms on InitProducerId."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from exactly.testing.wait import wait_until
from tests.support.broker import Broker
from tests.support.txn_helpers import (
    CONCURRENT_TRANSACTIONS,
    INVALID_PRODUCER_EPOCH,
    INVALID_TRANSACTION_TIMEOUT,
    INVALID_TXN_STATE,
    PRODUCER_FENCED,
    log_entries,
    txn_batch,
    txn_broker_config,
    wire_add_partitions,
    wire_end_txn,
    wire_fetch,
    wire_init_producer_id,
    wire_list_offset,
    wire_produce,
)
from tests.support.wire import WireClient, create_topic

pytestmark = pytest.mark.timeout(30)

MAX_TXN_TIMEOUT_MS = 60_000


@pytest.fixture(scope="module")
def module_broker_config() -> dict[str, str]:
    return txn_broker_config(**{"transaction.max.timeout.ms": str(MAX_TXN_TIMEOUT_MS)})


@pytest.fixture
def wb(module_broker: Broker) -> Broker:
    return module_broker


@pytest.fixture
def tid(unique_name: Callable[[str], str]) -> str:
    return unique_name("wtx")


def _init(wc: WireClient, tid: str, timeout_ms: int = 30_000) -> tuple[int, int]:
    """InitProducerId, retried on CONCURRENT_TRANSACTIONS as clients do: with an ongoing transaction
    of the previous instance Kafka first answers 51 while it aborts that transaction."""
    error, pid, epoch = wait_until(
        lambda: (
            (answer := wire_init_producer_id(wc, tid, timeout_ms))[0] != CONCURRENT_TRANSACTIONS and answer
        ),
        10,
        f"InitProducerId({tid}) past CONCURRENT_TRANSACTIONS",
    )
    assert error == 0, f"InitProducerId({tid}) error {error}"
    return pid, epoch


def _still_answers(wc: WireClient) -> None:
    """The connection is usable after an error answer: a further request is answered."""
    error, _pid, _epoch = wire_init_producer_id(wc, None)
    assert error == 0


# ---------------------------------------------------------------------------- 9. KIP-890
def test_transactional_produce_to_a_partition_not_in_the_transaction_is_rejected(
    wb: Broker, topic: str, tid: str
) -> None:
    with WireClient(wb.bootstrap) as wc:
        assert create_topic(wc, topic, partitions=2).error_code == 0
        pid, epoch = _init(wc, tid)
        assert wire_add_partitions(wc, tid, pid, epoch, {topic: [0]}) == {(topic, 0): 0}

        batch = txn_batch([b"v0", b"v1"], pid, epoch, base_sequence=0)
        # partition 1 was never added: INVALID_TXN_STATE, nothing written
        assert wire_produce(wc, topic, 1, batch, tid) == (INVALID_TXN_STATE, -1)
        assert log_entries(wc, topic, 1) == []
        assert wire_list_offset(wc, topic, 1, -1, isolation_level=0)[2] == 0
        assert wire_list_offset(wc, topic, 1, -1, isolation_level=1)[2] == 0, (
            "a hanging transaction was started"
        )

        # the added partition takes it
        assert wire_produce(wc, topic, 0, batch, tid) == (0, 0)
        # once added, the very same batch goes through on partition 1
        assert wire_add_partitions(wc, tid, pid, epoch, {topic: [1]}) == {(topic, 1): 0}
        assert wire_produce(wc, topic, 1, batch, tid) == (0, 0)
        assert [e.value for e in log_entries(wc, topic, 1)] == [b"v0", b"v1"]
        assert wire_list_offset(wc, topic, 1, -1, isolation_level=1)[2] == 0, "LSO must hold at the open txn"

        assert wire_end_txn(wc, tid, pid, epoch, commit=True) == 0
        for part in (0, 1):
            entries = log_entries(wc, topic, part)
            assert [(e.offset, e.value, e.kind) for e in entries] == [
                (0, b"v0", "data"), (1, b"v1", "data"), (2, None, "COMMIT"),
            ]  # fmt: skip
            assert wire_list_offset(wc, topic, part, -1, isolation_level=1)[2] == 3


def test_transactional_write_arriving_after_the_transaction_ended_is_rejected(
    wb: Broker, topic: str, tid: str
) -> None:
    """The hanging-transaction case KIP-890 closes: a write delayed past its transaction's end must
    not open a new "transaction" on the partition that no coordinator will ever end."""
    with WireClient(wb.bootstrap) as wc:
        assert create_topic(wc, topic, partitions=1).error_code == 0
        pid, epoch = _init(wc, tid)
        assert wire_add_partitions(wc, tid, pid, epoch, {topic: [0]}) == {(topic, 0): 0}
        assert wire_produce(wc, topic, 0, txn_batch([b"in-txn"], pid, epoch, 0), tid) == (0, 0)
        assert wire_end_txn(wc, tid, pid, epoch, commit=True) == 0  # COMMIT at offset 1

        late = txn_batch([b"late"], pid, epoch, 1)  # the next sequence, same epoch, no AddPartitionsToTxn
        error, _ = wire_produce(wc, topic, 0, late, tid)
        assert error == INVALID_TXN_STATE
        assert [e.value for e in log_entries(wc, topic, 0)] == [b"in-txn", None]
        fetched = wire_fetch(wc, topic, 0, 0, isolation_level=1)
        assert (fetched.high_watermark, fetched.last_stable_offset) == (2, 2), "LSO held back by a late write"


def test_transactional_produce_without_transactional_id_is_rejected(wb: Broker, topic: str, tid: str) -> None:
    with WireClient(wb.bootstrap) as wc:
        assert create_topic(wc, topic, partitions=1).error_code == 0
        pid, epoch = _init(wc, tid)
        assert wire_add_partitions(wc, tid, pid, epoch, {topic: [0]}) == {(topic, 0): 0}
        error, _ = wire_produce(wc, topic, 0, txn_batch([b"x"], pid, epoch, 0), transactional_id=None)
        assert error != 0
        assert log_entries(wc, topic, 0) == []
        _still_answers(wc)


# ---------------------------------------------------------------------------- 10. fenced answers
@pytest.mark.parametrize("version", [0, 1, 2, 3, 4])
def test_fenced_end_txn_answers_an_error_code(wb: Broker, topic: str, tid: str, version: int) -> None:
    with WireClient(wb.bootstrap) as wc:
        assert create_topic(wc, topic, partitions=1).error_code == 0
        pid, old_epoch = _init(wc, tid)
        assert wire_add_partitions(wc, tid, pid, old_epoch, {topic: [0]}) == {(topic, 0): 0}
        assert wire_produce(wc, topic, 0, txn_batch([b"zombie"], pid, old_epoch, 0), tid) == (0, 0)
        pid2, new_epoch = _init(wc, tid)  # the successor: same producer id, bumped epoch
        assert pid2 == pid and new_epoch > old_epoch

        code = wire_end_txn(wc, tid, pid, old_epoch, commit=True, version=version)
        expected = PRODUCER_FENCED if version >= 2 else INVALID_PRODUCER_EPOCH
        assert code == expected, f"EndTxn v{version} with a fenced epoch answered {code}"
        assert not wc.is_closed(0.2), "broker closed the connection instead of answering"
        _still_answers(wc)

        # the zombie's record was aborted by the successor's InitProducerId and stays invisible
        entries = log_entries(wc, topic, 0)
        assert [(e.value, e.kind) for e in entries] == [(b"zombie", "data"), (None, "ABORT")]
        assert wire_list_offset(wc, topic, 0, -1, isolation_level=1)[2] == 2


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_fenced_add_partitions_answers_an_error_code(wb: Broker, topic: str, tid: str, version: int) -> None:
    with WireClient(wb.bootstrap) as wc:
        assert create_topic(wc, topic, partitions=1).error_code == 0
        pid, old_epoch = _init(wc, tid)
        _init(wc, tid)
        errors = wire_add_partitions(wc, tid, pid, old_epoch, {topic: [0]}, version=version)
        expected = PRODUCER_FENCED if version >= 2 else INVALID_PRODUCER_EPOCH
        assert errors == {(topic, 0): expected}
        _still_answers(wc)


def test_fenced_produce_answers_invalid_producer_epoch(wb: Broker, topic: str, tid: str) -> None:
    with WireClient(wb.bootstrap) as wc:
        assert create_topic(wc, topic, partitions=1).error_code == 0
        pid, old_epoch = _init(wc, tid)
        assert wire_add_partitions(wc, tid, pid, old_epoch, {topic: [0]}) == {(topic, 0): 0}
        assert wire_produce(wc, topic, 0, txn_batch([b"a"], pid, old_epoch, 0), tid) == (0, 0)
        _init(wc, tid)
        error, _ = wire_produce(wc, topic, 0, txn_batch([b"b"], pid, old_epoch, 1), tid)
        assert error == INVALID_PRODUCER_EPOCH
        assert [e.value for e in log_entries(wc, topic, 0)] == [b"a", None]
        _still_answers(wc)


def test_end_txn_retried_after_completion_is_ok(wb: Broker, topic: str, tid: str) -> None:
    with WireClient(wb.bootstrap) as wc:
        assert create_topic(wc, topic, partitions=1).error_code == 0
        pid, epoch = _init(wc, tid)
        assert wire_add_partitions(wc, tid, pid, epoch, {topic: [0]}) == {(topic, 0): 0}
        assert wire_produce(wc, topic, 0, txn_batch([b"a"], pid, epoch, 0), tid) == (0, 0)
        assert wire_end_txn(wc, tid, pid, epoch, commit=True) == 0
        assert wire_end_txn(wc, tid, pid, epoch, commit=True) == 0, "a retried commit must succeed"
        assert wire_end_txn(wc, tid, pid, epoch, commit=False) == INVALID_TXN_STATE, "abort after commit"
        assert [e.kind for e in log_entries(wc, topic, 0)] == ["data", "COMMIT"], "one marker only"


# ---------------------------------------------------------------------------- 7. max timeout
@pytest.mark.parametrize("version", [0, 1, 2, 3, 4])
def test_init_producer_id_above_transaction_max_timeout_is_rejected(
    wb: Broker, tid: str, version: int
) -> None:
    with WireClient(wb.bootstrap) as wc:
        error, pid, _ = wire_init_producer_id(wc, tid, MAX_TXN_TIMEOUT_MS + 1, version=version)
        assert (error, pid) == (INVALID_TRANSACTION_TIMEOUT, -1)
        error, pid, epoch = wire_init_producer_id(wc, tid, MAX_TXN_TIMEOUT_MS, version=version)
        assert error == 0 and pid >= 0 and epoch == 0


def test_read_committed_fetch_lists_the_aborted_transactions(wb: Broker, topic: str, tid: str) -> None:
    """read_committed Fetch answers the records below the LSO plus (producer id, first offset) of
    every aborted transaction in the returned range; read_uncommitted carries no such list."""
    with WireClient(wb.bootstrap) as wc:
        assert create_topic(wc, topic, partitions=1).error_code == 0
        pid, epoch = _init(wc, tid)
        seq = 0
        for commit, n in ((True, 2), (False, 3), (True, 1)):
            assert wire_add_partitions(wc, tid, pid, epoch, {topic: [0]}) == {(topic, 0): 0}
            values_ = [f"{commit}-{i}".encode() for i in range(n)]
            assert wire_produce(wc, topic, 0, txn_batch(values_, pid, epoch, seq), tid)[0] == 0
            seq += n
            assert wire_end_txn(wc, tid, pid, epoch, commit=commit) == 0
        # layout: 0-1 data, 2 COMMIT, 3-5 data (aborted), 6 ABORT, 7 data, 8 COMMIT
        assert [e.kind for e in log_entries(wc, topic, 0)] == ["data"] * 2 + ["COMMIT"] + ["data"] * 3 + [
            "ABORT",
            "data",
            "COMMIT",
        ]
        rc = wire_fetch(wc, topic, 0, 0, isolation_level=1)
        assert (rc.error, rc.high_watermark, rc.last_stable_offset) == (0, 9, 9)
        assert rc.aborted == ((pid, 3),)
        assert wire_fetch(wc, topic, 0, 7, isolation_level=1).aborted == (), "range after the abort"
        ru = wire_fetch(wc, topic, 0, 0, isolation_level=0)
        assert ru.aborted == ()
