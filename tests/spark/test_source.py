"""The ``exactly`` source: schema, offsets, read_committed, and ranges that end on markers."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from tests.spark.helpers import produce_txn, read_all, txn_producer
from tests.support.clients import create_topic, produce_values, watermarks

pytestmark = pytest.mark.timeout(300)


def _reader(spark: Any, bootstrap: str, **options: str) -> Any:
    reader = spark.read.format("exactly").option("kafka.bootstrap.servers", bootstrap)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def _values(rows: list[Any]) -> list[bytes]:
    return sorted(bytes(r.value) for r in rows)


def test_batch_read_schema_and_committed_records_only(spark: Any, bootstrap: str, topic: str) -> None:
    create_topic(bootstrap, topic, partitions=2)
    p = txn_producer(bootstrap, f"src-{uuid.uuid4().hex}")
    produce_txn(p, topic, [b"c1-%d" % i for i in range(10)], headers=[("h", b"v")])
    produce_txn(p, topic, [b"a1-%d" % i for i in range(7)], commit=False)
    produce_txn(p, topic, [b"c2-%d" % i for i in range(5)])
    produce_txn(p, topic, [b"a2-%d" % i for i in range(3)], commit=False)  # the logs end with an abort

    df = _reader(spark, bootstrap, subscribe=topic, includeHeaders="true")
    assert df.columns == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
        "headers",
    ]
    assert [f.dataType.simpleString() for f in df.schema.fields] == [
        "binary",
        "binary",
        "string",
        "int",
        "bigint",
        "timestamp",
        "int",
        "array<struct<key:string,value:binary>>",
    ]
    rows = df.collect()
    assert _values(rows) == sorted([b"c1-%d" % i for i in range(10)] + [b"c2-%d" % i for i in range(5)])
    first = next(r for r in rows if bytes(r.value) == b"c1-0")
    assert first.topic == topic and first.timestampType == 0 and first.timestamp is not None
    assert [(h.key, bytes(h.value)) for h in first.headers] == [("h", b"v")]
    assert len({(r.partition, r.offset) for r in rows}) == len(rows)
    # without includeHeaders: Spark's default schema
    assert "headers" not in _reader(spark, bootstrap, subscribe=topic).columns


def test_read_uncommitted_sees_aborted_records(spark: Any, bootstrap: str, topic: str) -> None:
    create_topic(bootstrap, topic)
    p = txn_producer(bootstrap, f"src-{uuid.uuid4().hex}")
    produce_txn(p, topic, [b"c"] * 4)
    produce_txn(p, topic, [b"a"] * 3, commit=False)
    committed = _reader(spark, bootstrap, subscribe=topic).collect()
    everything = _reader(
        spark, bootstrap, subscribe=topic, **{"kafka.isolation.level": "read_uncommitted"}
    ).collect()
    assert _values(committed) == [b"c"] * 4
    assert _values(everything) == [b"a"] * 3 + [b"c"] * 4


def test_open_transaction_never_leaks_and_range_ends_before_it(
    spark: Any, bootstrap: str, topic: str
) -> None:
    """An open transaction's records are not read, and the batch read ends at the LSO (no hang)."""
    create_topic(bootstrap, topic)
    p = txn_producer(bootstrap, f"src-{uuid.uuid4().hex}")
    produce_txn(p, topic, [b"before-%d" % i for i in range(5)])
    produce_txn(p, topic, [b"open-%d" % i for i in range(5)], commit=None)
    try:
        rows = _reader(spark, bootstrap, subscribe=topic).collect()
        assert _values(rows) == sorted(b"before-%d" % i for i in range(5))
    finally:
        p.abort_transaction(30)


def test_ending_offsets_on_control_markers_and_aborted_tail(spark: Any, bootstrap: str, topic: str) -> None:
    """endingOffsets pointing just past an ABORT marker / inside an aborted batch still terminate."""
    create_topic(bootstrap, topic)
    p = txn_producer(bootstrap, f"src-{uuid.uuid4().hex}")
    produce_txn(p, topic, [b"c%d" % i for i in range(3)])  # offsets 0-2, COMMIT marker at 3
    produce_txn(p, topic, [b"a%d" % i for i in range(3)], commit=False)  # 4-6, ABORT at 7
    produce_txn(p, topic, [b"d%d" % i for i in range(2)])  # 8-9, COMMIT at 10
    _low, high = watermarks(bootstrap, topic)
    assert high == 11
    for end, expected in ((4, 3), (6, 3), (8, 3), (9, 4), (11, 5)):
        rows = _reader(
            spark,
            bootstrap,
            subscribe=topic,
            startingOffsets="earliest",
            endingOffsets=json.dumps({topic: {"0": end}}),
        ).collect()
        assert len(rows) == expected, f"endingOffsets {end}"
    rows = _reader(
        spark,
        bootstrap,
        subscribe=topic,
        startingOffsets=json.dumps({topic: {"0": 4}}),
        endingOffsets=json.dumps({topic: {"0": 8}}),
    ).collect()
    assert rows == []


def test_assign_and_pattern_subscriptions(spark: Any, bootstrap: str, unique_name: Any) -> None:
    prefix = unique_name("pat")
    a, b = f"{prefix}-a", f"{prefix}-b"
    create_topic(bootstrap, a, partitions=2)
    create_topic(bootstrap, b)
    produce_values(bootstrap, a, [b"a0"] * 3, partition=0)
    produce_values(bootstrap, a, [b"a1"] * 2, partition=1)
    produce_values(bootstrap, b, [b"b0"] * 4)
    pattern = _reader(spark, bootstrap, subscribePattern=f"{prefix}-.*").collect()
    assert len(pattern) == 9
    assigned = _reader(spark, bootstrap, assign=json.dumps({a: [1]})).collect()
    assert _values(assigned) == [b"a1"] * 2
    with pytest.raises(Exception, match="exactly one of subscribe"):
        _reader(spark, bootstrap, subscribe=a, assign=json.dumps({a: [1]})).collect()


def test_stream_reads_lso_only_then_commit_makes_records_visible(
    spark: Any, bootstrap: str, topic: str, tmp_path: Any
) -> None:
    """Streaming: an open transaction holds the batch end at the LSO; after commit its records come,
    an aborted transaction's never do; maxOffsetsPerTrigger splits the backlog."""
    create_topic(bootstrap, topic, partitions=2)
    p = txn_producer(bootstrap, f"src-{uuid.uuid4().hex}")
    produce_txn(p, topic, [b"c-%02d" % i for i in range(20)])
    produce_txn(p, topic, [b"open-%d" % i for i in range(6)], commit=None)
    name = f"mem_{uuid.uuid4().hex[:8]}"
    query = (
        spark.readStream.format("exactly")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "8")
        .load()
        .writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        query.processAllAvailable()
        seen = _values(spark.sql(f"select value from {name}").collect())
        assert seen == sorted(b"c-%02d" % i for i in range(20))
        batches = [pr["numInputRows"] for pr in query.recentProgress if pr["numInputRows"]]
        assert max(batches) <= 8 and len(batches) >= 3, batches  # admission control
        p.commit_transaction(30)
        produce_txn(p, topic, [b"aborted"] * 5, commit=False)
        produce_txn(p, topic, [b"late-%d" % i for i in range(3)])
        query.processAllAvailable()
        seen = _values(spark.sql(f"select value from {name}").collect())
        expected = [b"c-%02d" % i for i in range(20)] + [b"open-%d" % i for i in range(6)]
        assert seen == sorted(expected + [b"late-%d" % i for i in range(3)])
    finally:
        query.stop()


def test_available_now_stops_at_the_target(spark: Any, bootstrap: str, topic: str, tmp_path: Any) -> None:
    create_topic(bootstrap, topic)
    produce_values(bootstrap, topic, [b"x%d" % i for i in range(25)])
    name = f"mem_{uuid.uuid4().hex[:8]}"
    query = (
        spark.readStream.format("exactly")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "10")
        .load()
        .writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120)
    assert spark.sql(f"select count(*) c from {name}").collect()[0].c == 25
    assert [pr["numInputRows"] for pr in query.recentProgress if pr["numInputRows"]] == [10, 10, 5]


def test_read_committed_consumer_agrees(bootstrap: str, topic: str, spark: Any) -> None:
    """Cross-check with a plain read_committed consumer: same records, same offsets."""
    create_topic(bootstrap, topic)
    p = txn_producer(bootstrap, f"src-{uuid.uuid4().hex}")
    for n in range(6):
        produce_txn(p, topic, [b"t%d-%d" % (n, i) for i in range(4)], commit=n % 3 != 1)
    rows = _reader(spark, bootstrap, subscribe=topic).collect()
    plain = read_all(bootstrap, topic)
    assert sorted((r.offset, bytes(r.value)) for r in rows) == sorted((g.offset, g.value) for g in plain)
