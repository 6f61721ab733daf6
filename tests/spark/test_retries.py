"""``exactly.spark.retries``: what is retried through a leader / coordinator move, and what is not."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from confluent_kafka import KafkaError, KafkaException

from exactly.spark.retries import call_retrying, retriable


def _failing(errors: list[KafkaError], result: str = "ok") -> tuple[list[int], Callable[[], str]]:
    calls: list[int] = []

    def call() -> str:
        calls.append(1)
        if len(calls) <= len(errors):
            raise KafkaException(errors[len(calls) - 1])
        return result

    return calls, call


def test_leadership_moves_are_retriable_even_when_librdkafka_does_not_flag_them() -> None:
    assert retriable(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION))
    assert retriable(KafkaError(KafkaError.OFFSET_NOT_AVAILABLE))
    assert retriable(KafkaException(KafkaError(KafkaError._TRANSPORT)))
    assert retriable(KafkaError(KafkaError.INVALID_CONFIG, retriable=True))


def test_fatal_abortable_and_plain_errors_are_not() -> None:
    assert not retriable(KafkaError(KafkaError.NOT_COORDINATOR, fatal=True))
    assert not retriable(KafkaError(KafkaError._TIMED_OUT, txn_requires_abort=True))
    assert not retriable(KafkaError(KafkaError.INVALID_CONFIG))
    assert not retriable(KafkaException("subscribed topics do not exist: x"))


def test_call_retrying_rides_out_retriable_errors() -> None:
    calls, call = _failing(
        [KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION), KafkaError(KafkaError._TRANSPORT)]
    )
    assert call_retrying(call, 10, "test") == "ok"
    assert len(calls) == 3


def test_call_retrying_raises_a_non_retriable_error_at_once() -> None:
    fenced = KafkaError(KafkaError._FENCED, fatal=True)
    calls, call = _failing([fenced, fenced])
    with pytest.raises(KafkaException) as info:
        call_retrying(call, 10, "test")
    assert info.value.args[0].code() == KafkaError._FENCED
    assert len(calls) == 1


def test_call_retrying_gives_up_at_the_deadline_with_the_last_error() -> None:
    calls, call = _failing([KafkaError(KafkaError.LEADER_NOT_AVAILABLE)] * 1000)
    with pytest.raises(KafkaException) as info:
        call_retrying(call, 0.5, "test")
    assert info.value.args[0].code() == KafkaError.LEADER_NOT_AVAILABLE
    assert 2 <= len(calls) < 1000
