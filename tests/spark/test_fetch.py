"""The source's column-wise conversion (``fetch.py``) and the sink's (``rows.py``), without Spark:
librdkafka messages are stood in for by objects with the same accessors."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import KafkaError, KafkaException

from exactly.spark import fetch, rows


@dataclass
class Msg:
    _offset: int
    _key: bytes | None = b"k"
    _value: bytes | None = b"v"
    _ts: tuple[int, int] = (1, 1_700_000_000_123)
    _error: Any = None
    _headers: list[tuple[str, bytes]] | None = None

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def timestamp(self) -> tuple[int, int]:
        return self._ts

    def error(self) -> Any:
        return self._error

    def headers(self) -> list[tuple[str, bytes]] | None:
        return self._headers


def test_to_arrow_builds_spark_kafka_columns() -> None:
    msgs = [
        Msg(5, b"a", b"1", (1, 1_700_000_000_123)),
        Msg(7, None, None, (2, 1_700_000_000_456)),
        Msg(8, b"c", b"3", (0, -1)),
    ]
    batch = fetch.to_arrow("orders", 2, msgs, include_headers=False)
    got = batch.to_pydict()
    assert batch.schema.names == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
    ]
    assert got["key"] == [b"a", None, b"c"]
    assert got["value"] == [b"1", None, b"3"]
    assert got["topic"] == ["orders"] * 3
    assert got["partition"] == [2] * 3
    assert got["offset"] == [5, 7, 8]
    assert got["timestamp"][:2] == [
        datetime.fromtimestamp(1_700_000_000.123, UTC),
        datetime.fromtimestamp(1_700_000_000.456, UTC),
    ]
    assert got["timestamp"][2] is None  # librdkafka: timestamp not available
    assert got["timestampType"] == [0, 1, -1]  # CreateTime, LogAppendTime, unknown (as Spark)


def test_to_arrow_with_headers() -> None:
    batch = fetch.to_arrow("t", 0, [Msg(0, _headers=[("h", b"x")]), Msg(1)], include_headers=True)
    assert batch.to_pydict()["headers"] == [[{"key": "h", "value": b"x"}], []]


def test_records_below_cuts_at_the_end_and_reports_eof() -> None:
    eof = Msg(0, _error=KafkaError(KafkaError._PARTITION_EOF))
    good, saw_eof, position = fetch.records_below([Msg(3), Msg(4), eof, Msg(9), Msg(10)], end=10)
    assert [m.offset() for m in good] == [3, 4, 9]
    assert saw_eof
    assert position == 10
    good, saw_eof, position = fetch.records_below([Msg(3), Msg(6)], end=10)
    assert (len(good), saw_eof, position) == (2, False, 7)
    assert fetch.records_below([], end=10) == ([], False, -1)


def test_records_below_raises_on_a_non_retriable_error() -> None:
    with pytest.raises(KafkaException):
        fetch.records_below([Msg(0, _error=KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))], end=5)


def test_arrow_rows_encodes_strings_and_fills_missing_columns() -> None:
    batch = pa.RecordBatch.from_pydict(
        {"value": ["v1", None], "key": [b"k1", None], "partition": pa.array([1, None], pa.int32())}
    )
    clock: dict[str, float] = {}
    assert list(rows.arrow_rows(iter([batch]), "out", clock)) == [
        ("out", b"k1", b"v1", 1, None),
        ("out", None, None, None, None),
    ]
    assert clock["convert"] >= 0


def test_arrow_rows_topic_column_and_headers() -> None:
    header = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
    batch = pa.RecordBatch.from_pydict(
        {
            "value": pa.array([b"x"], pa.binary()),
            "topic": ["t1"],
            "headers": pa.array([[{"key": "h", "value": b"1"}]], header),
        }
    )
    assert list(rows.arrow_rows(iter([batch]), None)) == [("t1", None, b"x", None, [("h", b"1")])]
    missing = pa.RecordBatch.from_pydict({"value": [b"x"], "topic": pa.array([None], pa.string())})
    with pytest.raises(ValueError, match="no topic"):
        list(rows.arrow_rows(iter([missing]), None))
