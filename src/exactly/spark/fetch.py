"""The source's executor side: read one offset range into Arrow record batches, fast.

Per record, Python does only what it cannot avoid: five C accessor calls on librdkafka's message
(``error``, ``offset``, ``key``, ``value``, ``timestamp``), each in a list comprehension over a
whole ``consume()`` batch. Everything per column is built by pyarrow in C: key and value from the
lists of bytes, topic and partition as repeated scalars, the timestamp in microseconds and Spark's
``timestampType`` (librdkafka's type minus one) by Arrow compute kernels.

Consumers are reused across tasks of one Python worker (``clients.py``): creating a librdkafka
consumer, connecting and fetching metadata costs more than reading a small micro-batch. Reuse is
safe because the source's consumers are plain assign()-ers - no group membership, no committed
offsets, no transactions: a consumer's only state is its assignment, which every read replaces
(and clears when it ends). A consumer whose read failed is closed, never reused.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from pyspark import TaskContext

from exactly.spark import clients
from exactly.spark.options import SourceOptions
from exactly.spark.timings import record as record_timings

ROWS_PER_BATCH = 20_000  # rows per Arrow batch handed to Spark
_CONSUME_MAX = 10_000  # messages per consume() call

HEADER_TYPE = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
ARROW_FIELDS = [
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("timestamp", pa.timestamp("us", tz="UTC")),
    pa.field("timestampType", pa.int32()),
]
_SCHEMA = pa.schema(ARROW_FIELDS)
_SCHEMA_WITH_HEADERS = pa.schema([*ARROW_FIELDS, pa.field("headers", HEADER_TYPE)])
_TIMESTAMP = pa.timestamp("us", tz="UTC")


# ---------------------------------------------------------------------------- consumers
# A read never waits for records that do not exist yet (a range ends below the LSO), so the broker
# need not hold a fetch long; and a held fetch delays every later request on the connection (the
# watermark query of the next range waited the whole default 500 ms behind it).
FETCH_WAIT_MAX_MS = 10


def _consumer_conf(options: SourceOptions) -> dict[str, Any]:
    return {
        "log_level": 3,
        "fetch.wait.max.ms": FETCH_WAIT_MAX_MS,
        **options.client,
        # librdkafka insists on a group id even for assign(); nothing is ever committed to it
        "group.id": "exactly-spark-source",
        "isolation.level": options.isolation_level,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
    }


def borrow_consumer(options: SourceOptions) -> tuple[Consumer, bool]:
    """(an idle consumer of this configuration from this worker's pool or a new one, whether reused)."""
    return clients.borrow("source", _consumer_conf(options), Consumer)


def return_consumer(options: SourceOptions, consumer: Consumer, healthy: bool) -> None:
    """Give a consumer back after a read: unassigned into the pool, or closed if it failed."""
    clients.give_back("source", _consumer_conf(options), consumer, healthy)


def consume_available(consumer: Any, max_messages: int, timeout_s: float) -> list[Any]:
    """What the consumer has queued (up to ``max_messages``) without waiting, else wait up to
    ``timeout_s`` for the first message. (``consume(n, timeout)`` alone waits for all ``n`` or
    the whole timeout - at the end of every range, where fewer remain, that is pure waiting.)"""
    messages: list[Any] = consumer.consume(num_messages=max_messages, timeout=0)
    if messages:
        return messages
    first: list[Any] = consumer.consume(num_messages=1, timeout=timeout_s)
    if not first:
        return first
    rest: list[Any] = consumer.consume(num_messages=max_messages - 1, timeout=0)
    return first + rest


# ---------------------------------------------------------------------------- timing
class ReadClock:
    """Where one range's read time goes, reported through ``timings`` when the read ends. The time
    Spark spends between our yields (sending a batch to the JVM) is not counted."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.connect = 0.0
        self.fetch = 0.0
        self.arrow = 0.0
        self.rows = 0
        self.reused = False

    def report(self, partition: int) -> None:
        ctx = TaskContext.get()
        query = ctx.getLocalProperty("sql.streaming.queryId") if ctx is not None else None
        batch = ctx.getLocalProperty("streaming.sql.batchId") if ctx is not None else None
        record_timings(
            "source",
            query,
            int(batch) if batch is not None else None,
            ctx.partitionId() if ctx is not None else partition,
            {
                "connect": self.connect,
                "fetch": self.fetch,
                "arrow": self.arrow,
                "total": self.connect + self.fetch + self.arrow,
                "rows": self.rows,
                "reused_consumer": self.reused,
            },
        )


# ---------------------------------------------------------------------------- conversion
def to_arrow(topic: str, partition: int, msgs: list[Any], include_headers: bool) -> pa.RecordBatch:
    """librdkafka messages (all without error, all of ``topic``-``partition``) -> one batch."""
    n = len(msgs)
    stamps = [m.timestamp() for m in msgs]
    types = pa.array([s[0] for s in stamps], pa.int32())
    micros = pc.multiply(pa.array([s[1] for s in stamps], pa.int64()), 1000)
    if pc.any(pc.equal(types, 0)).as_py():  # TIMESTAMP_NOT_AVAILABLE: a null timestamp
        micros = pc.if_else(pc.equal(types, 0), pa.scalar(None, pa.int64()), micros)
    columns = [
        pa.array([m.key() for m in msgs], pa.binary()),
        pa.array([m.value() for m in msgs], pa.binary()),
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.repeat(pa.scalar(partition, pa.int32()), n),
        pa.array([m.offset() for m in msgs], pa.int64()),
        micros.cast(_TIMESTAMP),
        # librdkafka 0 not available, 1 CreateTime, 2 LogAppendTime -> Spark -1, 0, 1
        pc.subtract(types, pa.scalar(1, pa.int32())),
    ]
    if include_headers:
        columns.append(
            pa.array([[{"key": k, "value": v} for k, v in (m.headers() or ())] for m in msgs], HEADER_TYPE)
        )
    return pa.RecordBatch.from_arrays(columns, schema=_SCHEMA_WITH_HEADERS if include_headers else _SCHEMA)


def records_below(messages: list[Any], end: int) -> tuple[list[Any], bool, int]:
    """(the data messages below ``end``, whether an EOF event was among them, the next position
    they imply or -1). Raises on a non-retriable error; retriable ones are skipped (librdkafka
    recovers by itself)."""
    good = [m for m in messages if m.error() is None]
    eof = False
    if len(good) != len(messages):
        for m in messages:
            err = m.error()
            if err is None:
                continue
            if err.code() == KafkaError._PARTITION_EOF:
                eof = True
            elif err.fatal() or not err.retriable():
                raise KafkaException(err)
    if not good:
        return good, eof, -1
    if (good[-1].offset() or 0) >= end:
        offsets = [m.offset() or 0 for m in good]
        good = good[: bisect_left(offsets, end)]
        return good, eof, end
    return good, eof, (good[-1].offset() or 0) + 1


def drain(
    consumer: Consumer,
    part: Any,
    start: int,
    end_at: Any,
    timeout_s: float,
    include_headers: bool,
    clock: ReadClock,
) -> Iterator[pa.RecordBatch]:
    """Consume ``part`` (assigned at ``start``) until the position reaches its end; yield batches.

    ``end_at(position)`` is called at an EOF below the end and returns the end to read up to (the
    caller's truncation check)."""
    tp = TopicPartition(part.topic, part.partition)
    position = start
    end = part.end
    deadline = time.monotonic() + timeout_s
    eof_seen = False
    pending: list[Any] = []
    while position < end:
        t0 = time.monotonic()
        messages = consume_available(consumer, _CONSUME_MAX, 0.2)
        good, eof, next_position = records_below(messages, end)
        eof_seen = eof_seen or eof
        if next_position >= 0:
            position = max(position, next_position)
        pending.extend(good)
        if position < end:
            # control markers and aborted records are never delivered but do move the position
            now_at = consumer.position([tp])[0].offset
            if now_at >= 0 and now_at > position:
                position = now_at
        t1 = time.monotonic()
        clock.fetch += t1 - t0
        if len(pending) >= ROWS_PER_BATCH:
            batch = to_arrow(part.topic, part.partition, pending, include_headers)
            clock.rows += len(pending)
            pending = []
            clock.arrow += time.monotonic() - t1
            yield batch
        if position >= end:
            break
        if messages:
            deadline = time.monotonic() + timeout_s
        elif time.monotonic() > deadline:
            raise TimeoutError(
                f"{part.topic}-{part.partition}: no progress for {timeout_s:.0f}s at offset {position}, "
                f"range ends at {end} (eof seen: {eof_seen}); see kafkaConsumer.pollTimeoutMs"
            )
        elif eof_seen:
            end = end_at(position)
            eof_seen = False
    if pending:
        t1 = time.monotonic()
        batch = to_arrow(part.topic, part.partition, pending, include_headers)
        clock.rows += len(pending)
        clock.arrow += time.monotonic() - t1
        yield batch
