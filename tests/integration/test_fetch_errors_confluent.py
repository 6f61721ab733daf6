"""Every error path of Fetch through confluent-kafka (librdkafka), ending as it does on Kafka.

* position beyond the log end, and below the log start (retention deleted the segments under a
  committed offset), with ``auto.offset.reset`` earliest, latest and error (librdkafka's name for
  Kafka's ``none``: an ``_AUTO_OFFSET_RESET`` error event from poll);
* a subscription to a topic that does not exist, and a topic deleted while it is consumed.

Each waits (up to a deadline) for the outcome Kafka gives, and counts the Fetch requests the
broker saw meanwhile in its Prometheus metrics: an error partition written with a null record
set made librdkafka drop the response and fetch again at once, thousands of times a second.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from exactly.testing.wait import wait_until
from tests.support.broker import Broker
from tests.support.clients import QUIET, admin, create_topic, produce_values, producer, watermarks
from tests.support.metrics import RequestCount

pytestmark = pytest.mark.timeout(90)

DEADLINE_S = 20.0


@pytest.fixture(scope="module")
def module_broker_config() -> dict[str, str]:
    return {
        "metrics.port": "0",
        "group.initial.rebalance.delay.ms": "0",
        "log.retention.check.interval.ms": "200",
    }


@pytest.fixture
def mb(module_broker: Broker) -> Broker:
    return module_broker


@pytest.fixture(scope="module")
def trimmed(_module_broker: Broker) -> str:
    """A topic whose log start offset retention moved above 0, with 3 fresh records after it."""
    bs = _module_broker.bootstrap
    name = f"trimmed-{uuid.uuid4().hex[:8]}"
    create_topic(bs, name, config={"segment.bytes": "2048", "retention.ms": "60000"})
    old = int(time.time() * 1000) - 3_600_000
    p = producer(bs, linger_ms=0)
    for i in range(100):  # an hour old: every closed segment is past retention at once
        p.produce(name, value=b"%03d" % i + b"." * 100, partition=0, timestamp=old + i)
        if i % 10 == 9:
            p.flush(10)
    assert p.flush(10) == 0
    wait_until(
        lambda: watermarks(bs, name)[0] > 0, DEADLINE_S, "retention moved the log start offset", interval=0.2
    )
    produce_values(bs, name, [b"fresh-1", b"fresh-2", b"fresh-3"])
    return name


def _consumer(bs: str, reset: str, group: str | None = None, **conf: Any) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bs,
            "group.id": group or f"g-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": reset,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            **QUIET,
            **conf,
        }
    )


def _poll_until(c: Consumer, done: Callable[[Message], bool], what: str) -> list[Message]:
    """Poll until ``done(event)`` (a message or an error event); every event seen, in order."""
    seen: list[Message] = []
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        m = c.poll(0.2)
        if m is None:
            continue
        seen.append(m)
        if done(m):
            return seen
    raise AssertionError(f"no {what} within {DEADLINE_S} s; saw {[_describe(m) for m in seen]}")


def _describe(m: Message) -> str:
    err = m.error()
    if err is not None:
        return f"error {err.name()} {m.topic()}[{m.partition()}]@{m.offset()}"
    return f"record {m.topic()}[{m.partition()}]@{m.offset()}"


def _is_error(code: int) -> Callable[[Message], bool]:
    return lambda m: m.error() is not None and m.error().code() == code


def _is_eof(m: Message) -> bool:
    return m.error() is not None and m.error().code() == KafkaError._PARTITION_EOF


def _records(seen: list[Message]) -> list[int]:
    return [m.offset() for m in seen if m.error() is None]


def _no_record_errors(seen: list[Message]) -> None:
    bad = [
        _describe(m) for m in seen if m.error() is not None and m.error().code() != KafkaError._PARTITION_EOF
    ]
    assert not bad, bad


@pytest.fixture
def five(mb: Broker) -> str:
    name = f"five-{uuid.uuid4().hex[:8]}"
    create_topic(mb.bootstrap, name)
    produce_values(mb.bootstrap, name, [b"r%d" % i for i in range(5)])
    return name


# ---- beyond the log end ----------------------------------------------------------------------
def test_beyond_end_with_earliest_reads_from_the_log_start(mb: Broker, five: str) -> None:
    fetches = RequestCount(mb).start()
    c = _consumer(mb.bootstrap, "earliest")
    try:
        c.assign([TopicPartition(five, 0, 1000)])
        seen = _poll_until(c, _is_eof, "end of partition after the reset")
    finally:
        c.close()
    _no_record_errors(seen)
    assert _records(seen) == [0, 1, 2, 3, 4]
    fetches.assert_no_storm()


def test_beyond_end_with_latest_waits_at_the_log_end(mb: Broker, five: str) -> None:
    fetches = RequestCount(mb).start()
    c = _consumer(mb.bootstrap, "latest")
    try:
        c.assign([TopicPartition(five, 0, 1000)])
        eof = _poll_until(c, _is_eof, "end of partition after the reset")
        assert eof[-1].offset() == 5 and _records(eof) == []
        produce_values(mb.bootstrap, five, [b"after"])
        seen = _poll_until(c, lambda m: m.error() is None, "the record produced after the reset")
    finally:
        c.close()
    _no_record_errors(eof + seen)
    assert _records(seen) == [5]
    fetches.assert_no_storm()


def test_beyond_end_with_error_reports_auto_offset_reset(mb: Broker, five: str) -> None:
    fetches = RequestCount(mb).start()
    c = _consumer(mb.bootstrap, "error")
    try:
        c.assign([TopicPartition(five, 0, 1000)])
        seen = _poll_until(c, _is_error(KafkaError._AUTO_OFFSET_RESET), "_AUTO_OFFSET_RESET error")
    finally:
        c.close()
    event = seen[-1]
    assert (event.topic(), event.partition(), event.offset()) == (five, 0, 1000)
    assert "out of range" in event.error().str().lower()
    assert _records(seen) == []
    fetches.assert_no_storm()


# ---- below the log start (retention) ---------------------------------------------------------
def _committed_at_zero(bs: str, topic: str, reset: str) -> Consumer:
    """A group consumer whose committed offset (0) retention has since deleted."""
    group = f"g-{uuid.uuid4().hex[:8]}"
    setter = _consumer(bs, "earliest", group)
    try:
        setter.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
    finally:
        setter.close()
    c = _consumer(bs, reset, group)
    c.subscribe([topic])
    return c


def test_below_start_with_earliest_reads_from_the_log_start(mb: Broker, trimmed: str) -> None:
    fetches = RequestCount(mb).start()
    c = _committed_at_zero(mb.bootstrap, trimmed, "earliest")
    try:
        seen = _poll_until(c, _is_eof, "end of partition after the reset")
    finally:
        c.close()
    _no_record_errors(seen)
    low, high = watermarks(mb.bootstrap, trimmed)
    assert low > 0 and _records(seen) == list(range(low, high))
    fetches.assert_no_storm()


def test_below_start_with_latest_waits_at_the_log_end(mb: Broker, trimmed: str) -> None:
    fetches = RequestCount(mb).start()
    c = _committed_at_zero(mb.bootstrap, trimmed, "latest")
    try:
        eof = _poll_until(c, _is_eof, "end of partition after the reset")
        high = watermarks(mb.bootstrap, trimmed)[1]
        assert eof[-1].offset() == high and _records(eof) == []
        produce_values(mb.bootstrap, trimmed, [b"after"])
        seen = _poll_until(c, lambda m: m.error() is None, "the record produced after the reset")
    finally:
        c.close()
    _no_record_errors(eof + seen)
    assert _records(seen) == [high]
    fetches.assert_no_storm()


def test_below_start_with_error_reports_auto_offset_reset(mb: Broker, trimmed: str) -> None:
    fetches = RequestCount(mb).start()
    c = _committed_at_zero(mb.bootstrap, trimmed, "error")
    try:
        seen = _poll_until(c, _is_error(KafkaError._AUTO_OFFSET_RESET), "_AUTO_OFFSET_RESET error")
    finally:
        c.close()
    event = seen[-1]
    assert (event.topic(), event.partition(), event.offset()) == (trimmed, 0, 0)
    assert _records(seen) == []
    fetches.assert_no_storm()


def _delete_topic(bs: str, name: str) -> None:
    client = admin(bs)  # keep a reference: a collected AdminClient fails its futures
    client.delete_topics([name], request_timeout=15)[name].result(15)


# ---- topics that are not there -----------------------------------------------------------------
def test_subscribing_to_an_unknown_topic_reports_it(mb: Broker) -> None:
    fetches = RequestCount(mb).start()
    missing = f"missing-{uuid.uuid4().hex[:8]}"
    c = _consumer(mb.bootstrap, "earliest")
    try:
        c.subscribe([missing])
        seen = _poll_until(c, _is_error(KafkaError.UNKNOWN_TOPIC_OR_PART), "UNKNOWN_TOPIC_OR_PART error")
    finally:
        c.close()
    assert seen[-1].topic() == missing and _records(seen) == []
    fetches.assert_no_storm()


def test_topic_deleted_while_subscribed_is_reported_and_revoked(mb: Broker, five: str) -> None:
    c = _consumer(mb.bootstrap, "earliest", **{"topic.metadata.refresh.interval.ms": 1000})
    try:
        c.subscribe([five])
        before = _poll_until(c, _is_eof, "end of partition")
        assert _records(before) == [0, 1, 2, 3, 4]
        fetches = RequestCount(mb).start()
        _delete_topic(mb.bootstrap, five)
        seen = _poll_until(c, _is_error(KafkaError.UNKNOWN_TOPIC_OR_PART), "UNKNOWN_TOPIC_OR_PART error")
        assert seen[-1].topic() == five
        deadline = time.monotonic() + DEADLINE_S
        while c.assignment():  # the group rebalances the deleted topic's partition away
            assert time.monotonic() < deadline, f"still assigned {c.assignment()}"
            c.poll(0.2)
        fetches.assert_no_storm()
    finally:
        c.close()


def test_topic_deleted_while_assigned_then_recreated_resets(mb: Broker, five: str) -> None:
    """An assigned (not subscribed) partition of a deleted topic: librdkafka keeps the assignment
    and retries with backoff (no storm); once the topic is created again its old position (5) is
    out of range in the new log, so auto.offset.reset=earliest starts at the new log's 0."""
    c = _consumer(mb.bootstrap, "earliest", **{"topic.metadata.refresh.interval.ms": 1000})
    try:
        c.assign([TopicPartition(five, 0, 0)])
        before = _poll_until(c, _is_eof, "end of partition")
        assert _records(before) == [0, 1, 2, 3, 4]
        fetches = RequestCount(mb).start()
        _delete_topic(mb.bootstrap, five)
        gone = time.monotonic() + 3  # long enough for several fetch rounds against the deleted topic
        while time.monotonic() < gone:
            m = c.poll(0.2)
            assert m is None or m.error() is not None, _describe(m)
        fetches.assert_no_storm()

        def recreated() -> bool:
            try:
                create_topic(mb.bootstrap, five)
            except Exception:  # deletion may finish after the admin call returns, as on Kafka
                return False
            return True

        wait_until(recreated, DEADLINE_S, f"{five} created again", interval=0.2)
        produce_values(mb.bootstrap, five, [b"new"])
        seen = _poll_until(c, lambda m: m.error() is None, "the recreated topic's record")
        assert _records(seen) == [0] and seen[-1].value() == b"new"
        fetches.assert_no_storm()
    finally:
        c.close()
