"""Fetch partitions that carry an error, decoded from the real broker's bytes at every advertised
Fetch version (v4-v11 classic, v12 flexible).

Kafka's ReplicaManager fills such a partition with MemoryRecords.EMPTY and unknown (-1) offsets;
a null record set there makes librdkafka drop the whole response ("invalid MessageSetSize -1")
without reading the error code, so it never runs auto.offset.reset and fetches again at once.
"""

from __future__ import annotations

from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from tests.support.broker import Broker
from tests.support.wire import (
    WireClient,
    create_topic,
    fetch_request,
    partition_response,
    produce_request,
    simple_batch,
)

from exactly.protocol.apis import VERSION_RANGES, ApiKey

pytestmark = pytest.mark.timeout(60)

FETCH_VERSIONS = range(VERSION_RANGES[ApiKey.FETCH][0], VERSION_RANGES[ApiKey.FETCH][1] + 1)


@pytest.fixture(scope="module")
def five_records(_session_broker: Broker) -> str:
    """A one-partition topic holding offsets 0-4."""
    name = "fetch-errors-five"
    with WireClient(_session_broker.bootstrap) as c:
        assert create_topic(c, name).error_code == 0
        part = partition_response(
            c.send(produce_request(name, 0, simple_batch([b"r%d" % i for i in range(5)])))
        )
        assert part.error_code == 0
    return name


def _only_partition(response: Any) -> Any:
    assert getattr(response, "error_code", 0) == 0  # the request-level error (v7+)
    (t,) = response.responses
    (p,) = t.partitions
    return p


def _assert_kafka_error_partition(p: Any, version: int, error: ErrorCode) -> None:
    assert p.error_code == error
    assert p.records is not None, f"v{version}: null record set on an error partition"
    assert bytes(p.records) == b""
    assert p.high_watermark == -1
    assert p.last_stable_offset == -1
    if version >= 5:
        assert p.log_start_offset == -1
    assert p.aborted_transactions is None  # Kafka: Optional.empty -> null on error partitions
    if version >= 11:
        assert p.preferred_read_replica == -1


@pytest.mark.parametrize("isolation_level", [0, 1], ids=["read_uncommitted", "read_committed"])
@pytest.mark.parametrize("version", FETCH_VERSIONS)
@pytest.mark.parametrize("offset", [1000, -3], ids=["beyond_end", "negative"])
def test_offset_out_of_range_carries_an_empty_record_set(
    broker: Broker, five_records: str, version: int, isolation_level: int, offset: int
) -> None:
    with WireClient(broker.bootstrap) as c:
        req = fetch_request(five_records, 0, offset, version=version, isolation_level=isolation_level)
        p = _only_partition(c.send(req))
    _assert_kafka_error_partition(p, version, ErrorCode.offset_out_of_range)


@pytest.mark.parametrize("version", FETCH_VERSIONS)
@pytest.mark.parametrize("where", ["unknown_topic", "unknown_partition"])
def test_unknown_topic_or_partition_carries_an_empty_record_set(
    broker: Broker, five_records: str, version: int, where: str
) -> None:
    topic, partition = ("no-such-topic-fetch-errors", 0) if where == "unknown_topic" else (five_records, 7)
    with WireClient(broker.bootstrap) as c:
        p = _only_partition(c.send(fetch_request(topic, partition, 0, version=version)))
    _assert_kafka_error_partition(p, version, ErrorCode.unknown_topic_or_partition)


@pytest.mark.parametrize("version", FETCH_VERSIONS)
def test_caught_up_read_is_an_empty_record_set(broker: Broker, five_records: str, version: int) -> None:
    """At the high watermark (no error) the record set is empty too, and reads from 0 have data."""
    with WireClient(broker.bootstrap) as c:
        at_end = _only_partition(c.send(fetch_request(five_records, 0, 5, version=version)))
        from_start = _only_partition(c.send(fetch_request(five_records, 0, 0, version=version)))
    assert at_end.error_code == 0 and at_end.records is not None and bytes(at_end.records) == b""
    assert at_end.high_watermark == 5
    assert from_start.error_code == 0 and len(bytes(from_start.records or b"")) > 0
