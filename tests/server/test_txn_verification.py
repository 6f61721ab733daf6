"""The partition leader's side of KIP-890 across brokers (``server/txn_verification.py``): the
verification guards that keep a marker which overtook a verification from letting the write
through, and the mapping of the coordinator's answers to Produce errors. The request itself runs
against real brokers in tests/cluster/test_cluster_txn_tools.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from exactly.cluster.znodes import LeaderAndIsr
from exactly.replication.leader import LeaderPartition
from exactly.server.txn_verification import TxnVerifier, produce_error
from exactly.types import TopicPartition

TP = TopicPartition("orders", 0)
PID = 7


def leadership(epoch: int = 5) -> LeaderPartition:
    return LeaderPartition(
        local_broker=1,
        state=LeaderAndIsr(1, epoch, (1, 2, 3), 2),
        zk_version=3,
        replicas=(1, 2, 3),
        leader_log_end_offset=0,
        high_watermark=0,
        now_ms=0,
    )


def verifier(leaders: dict[TopicPartition, LeaderPartition]) -> TxnVerifier:
    # only ``replicas.leaders`` is read by the guard bookkeeping
    broker: Any = SimpleNamespace(replicas=SimpleNamespace(leaders=leaders), node_id=1)
    return TxnVerifier(broker)


def test_a_guard_holds_once_when_nothing_happened_meanwhile() -> None:
    lead = leadership()
    v = verifier({TP: lead})
    guard = v.guard(TP, PID, 0, lead)
    assert v.consume(TP, PID, guard)
    assert not v.consume(TP, PID, guard), "a guard is spent by the append it allowed"


def test_a_marker_of_the_producer_voids_the_verification_in_flight() -> None:
    lead = leadership()
    v = verifier({TP: lead})
    guard = v.guard(TP, PID, 0, lead)
    v.on_marker(TopicPartition("orders", 1), PID)  # another partition: no effect
    v.on_marker(TP, PID + 1)  # another producer: no effect
    v.on_marker(TP, PID)
    assert not v.consume(TP, PID, guard)


def test_a_new_leadership_voids_the_verification_in_flight() -> None:
    first = leadership(5)
    leaders = {TP: first}
    v = verifier(leaders)
    guard = v.guard(TP, PID, 0, first)
    leaders[TP] = leadership(6)  # lost and regained the partition meanwhile
    assert not v.consume(TP, PID, guard)
    del leaders[TP]  # not the leader at all
    assert not v.consume(TP, PID, v.guard(TP, PID, 0, first))


def test_requests_in_flight_together_share_a_guard_of_the_same_epoch() -> None:
    lead = leadership()
    v = verifier({TP: lead})
    first = v.guard(TP, PID, 0, lead)
    assert v.guard(TP, PID, 0, lead) is first
    bumped = v.guard(TP, PID, 1, lead)  # a new producer epoch replaces it
    assert bumped is not first
    assert not v.consume(TP, PID, first)
    v.forget(TP, PID, first)  # a failed verification of the old one leaves the new one alone
    assert v.consume(TP, PID, bumped)


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (ErrorCode.none, None),
        (ErrorCode.invalid_txn_state, ErrorCode.invalid_txn_state),
        (ErrorCode.transaction_abortable, ErrorCode.invalid_txn_state),
        (ErrorCode.invalid_producer_id_mapping, ErrorCode.invalid_txn_state),
        (ErrorCode.producer_fenced, ErrorCode.invalid_producer_epoch),
        (ErrorCode.not_coordinator, ErrorCode.not_enough_replicas),
        (ErrorCode.coordinator_not_available, ErrorCode.not_enough_replicas),
        (ErrorCode.coordinator_load_in_progress, ErrorCode.not_enough_replicas),
        (ErrorCode.concurrent_transactions, ErrorCode.not_enough_replicas),
        (ErrorCode.network_exception, ErrorCode.not_enough_replicas),
        (ErrorCode.invalid_request, ErrorCode.invalid_request),
    ],
)
def test_coordinator_answers_map_to_produce_errors_as_kafka(
    answer: ErrorCode, expected: ErrorCode | None
) -> None:
    mapped = produce_error(answer, TP)
    assert (None if mapped is None else mapped[0]) == expected
    if expected is ErrorCode.invalid_txn_state:
        assert mapped is not None and "Partition was not added to the transaction" in mapped[1]
