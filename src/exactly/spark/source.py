"""The reading side of the ``exactly`` data source: a streaming reader and a batch reader.

Theory of operation
-------------------
* The **driver** plans: it lists the subscribed topic-partitions, asks the broker for their end
  offsets (the last stable offset under ``read_committed``), rations them with
  ``maxOffsetsPerTrigger`` and hands Spark one ``OffsetRange`` per topic-partition.
* **Executors** read: ``read_range`` opens a confluent-kafka consumer *inside the task* (clients
  are not picklable), ``assign()``s the partition at the range's start (no consumer group, no
  offset commits - Spark's checkpoint is the only record of progress) and returns Arrow record
  batches until the partition's position reaches the range's end.
* **Why position, not the last record's offset:** the last offsets of a range may hold a COMMIT or
  ABORT control marker or records of an aborted transaction, which a read_committed consumer never
  returns. The consumer's position still moves past them, so ``position >= end`` is the one
  reliable "done" test; waiting for a record at ``end - 1`` would hang forever.
* The range was planned below the LSO, so every record in it belongs to a transaction that is
  already decided: a replay of the same range (Spark re-running a batch after a crash) returns
  exactly the same records.

The reader objects are pickled to the executors: they hold only ``SourceOptions`` (plain data) and
drop their driver-side AdminClient in ``__getstate__``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from exactly.spark.offsets import OffsetClient, OffsetMap, from_json_offsets, rate_limit, to_json_offsets
from exactly.spark.options import EARLIEST, LATEST, SourceOptions
from exactly.spark.retries import call_retrying

log = logging.getLogger("exactly.spark.source")

WATERMARK_TIMEOUT_S = 10.0  # one attempt; call_retrying retries a moved leader until the poll timeout

SOURCE_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
    "timestampType int"
)
HEADERS_FIELD = "headers array<struct<key: string, value: binary>>"

_HEADER_TYPE = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
_ARROW_FIELDS = [
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("timestamp", pa.timestamp("us", tz="UTC")),
    pa.field("timestampType", pa.int32()),
]
_ROWS_PER_BATCH = 10_000
# librdkafka timestamp types -> Spark's timestampType column (0 CreateTime, 1 LogAppendTime)
_TIMESTAMP_TYPE = {0: -1, 1: 0, 2: 1}


def source_schema(include_headers: bool) -> str:
    return f"{SOURCE_SCHEMA}, {HEADERS_FIELD}" if include_headers else SOURCE_SCHEMA


class DataLossError(RuntimeError):
    """Offsets a micro-batch needs are gone (retention, truncation) and failOnDataLoss is true."""


@dataclass(frozen=True)
class OffsetRange(InputPartition):
    """One Spark input partition: ``[start, end)`` of one topic-partition.

    ``from_earliest``: the partition appeared after the previous batch was planned; its start is
    "wherever the log begins", so a log start above ``start`` is not data loss."""

    topic: str
    partition: int
    start: int
    end: int
    from_earliest: bool = False


def plan_ranges(start: OffsetMap, end: OffsetMap) -> list[OffsetRange]:
    """One range per partition with something to read, in a stable order (deterministic replays)."""
    ranges = []
    for (topic, partition), until in sorted(end.items()):
        begin = start.get((topic, partition))
        if begin is None:
            if until > 0:
                ranges.append(OffsetRange(topic, partition, 0, until, from_earliest=True))
        elif until > begin:
            ranges.append(OffsetRange(topic, partition, begin, until))
    return ranges


# ---------------------------------------------------------------------------- executor side
def _consumer(options: SourceOptions) -> Consumer:
    conf: dict[str, Any] = {
        "log_level": 3,
        **options.client,
        # librdkafka insists on a group id even for assign(); nothing is ever committed to it
        "group.id": "exactly-spark-source",
        "isolation.level": options.isolation_level,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
    }
    return Consumer(conf)


def read_range(options: SourceOptions, part: OffsetRange) -> Iterator[pa.RecordBatch]:
    """Yield the records of ``part`` as Arrow batches; stop once the position reaches ``part.end``."""
    if part.end <= part.start:
        return
    consumer = _consumer(options)
    tp = TopicPartition(part.topic, part.partition)
    timeout_s = options.poll_timeout_ms / 1000.0
    try:
        low, _high = call_retrying(
            lambda: consumer.get_watermark_offsets(tp, timeout=min(timeout_s, WATERMARK_TIMEOUT_S)),
            timeout_s,
            f"watermarks of {part.topic}-{part.partition}",
        )
        start = part.start
        if start < low:
            if not part.from_earliest and options.fail_on_data_loss:
                raise DataLossError(
                    f"{part.topic}-{part.partition}: offsets {start}..{low - 1} were deleted before they "
                    "were read (set failOnDataLoss=false to skip them)"
                )
            if not part.from_earliest:
                log.warning("%s-%d: skipping lost offsets %d..%d", part.topic, part.partition, start, low - 1)
            start = low
        if start >= part.end:
            return
        consumer.assign([TopicPartition(part.topic, part.partition, start)])
        yield from _drain(consumer, options, part, start, timeout_s)
    finally:
        consumer.close()


def _drain(
    consumer: Consumer, options: SourceOptions, part: OffsetRange, start: int, timeout_s: float
) -> Iterator[pa.RecordBatch]:
    cols: list[list[Any]] = [[] for _ in range(8 if options.include_headers else 7)]
    tp = TopicPartition(part.topic, part.partition)
    position = start
    end = part.end
    deadline = time.monotonic() + timeout_s
    eof_seen = False
    while position < end:
        messages = consumer.consume(num_messages=_ROWS_PER_BATCH, timeout=0.2)
        done = False
        for msg in messages:
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    eof_seen = True
                    continue
                if err.fatal() or not err.retriable():
                    raise KafkaException(err)
                continue
            offset = msg.offset() or 0
            if offset >= end:
                done = True
                break
            ts_type, ts = msg.timestamp()
            cols[0].append(msg.key())
            cols[1].append(msg.value())
            cols[2].append(part.topic)
            cols[3].append(part.partition)
            cols[4].append(offset)
            cols[5].append(ts * 1000 if ts_type else None)
            cols[6].append(_TIMESTAMP_TYPE.get(ts_type, -1))
            if options.include_headers:
                headers: Any = msg.headers() or []
                cols[7].append([{"key": h[0], "value": h[1]} for h in headers])
            position = offset + 1
        if len(cols[0]) >= _ROWS_PER_BATCH:
            yield _to_arrow(cols, options.include_headers)
            cols = [[] for _ in cols]
        if done:
            break
        # control markers and aborted records are never delivered but do move the position
        now_at = consumer.position([tp])[0].offset
        if now_at >= 0 and now_at > position:
            position = now_at
        if messages:
            deadline = time.monotonic() + timeout_s
        elif time.monotonic() > deadline:
            raise TimeoutError(
                f"{part.topic}-{part.partition}: no progress for {timeout_s:.0f}s at offset {position}, "
                f"range ends at {end} (eof seen: {eof_seen}); see kafkaConsumer.pollTimeoutMs"
            )
        elif eof_seen:
            end = _check_truncation(consumer, options, part, position)
            eof_seen = False
    if cols[0]:
        yield _to_arrow(cols, options.include_headers)


def _check_truncation(consumer: Consumer, options: SourceOptions, part: OffsetRange, position: int) -> int:
    """At EOF below the planned end: has the log shrunk (a broker lost its unflushed tail)?
    Returns the end to read up to."""
    tp = TopicPartition(part.topic, part.partition)
    _low, high = call_retrying(
        lambda: consumer.get_watermark_offsets(tp, timeout=WATERMARK_TIMEOUT_S),
        options.poll_timeout_ms / 1000.0,
        f"watermarks of {part.topic}-{part.partition}",
    )
    if 0 <= high < part.end and high <= position:
        message = (
            f"{part.topic}-{part.partition}: the log ends at {high} but the batch was planned up to "
            f"{part.end} (records were lost on the broker)"
        )
        if options.fail_on_data_loss:
            raise DataLossError(message)
        log.warning("%s; continuing without them", message)
        return high
    return part.end


def _to_arrow(cols: list[list[Any]], include_headers: bool) -> pa.RecordBatch:
    fields = list(_ARROW_FIELDS)
    if include_headers:
        fields.append(pa.field("headers", _HEADER_TYPE))
    arrays = [pa.array(col, type=f.type) for col, f in zip(cols, fields)]
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))


# ---------------------------------------------------------------------------- readers
class _DriverClient:
    """Mixin: a lazily created OffsetClient that is never pickled."""

    options: SourceOptions
    _client: OffsetClient | None = None

    @property
    def client(self) -> OffsetClient:
        if self._client is None:
            self._client = OffsetClient(self.options)
        return self._client

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"] = None
        return state


class ExactlyBatchReader(_DriverClient, DataSourceReader):
    """``spark.read.format("exactly")``: a bounded ``[startingOffsets, endingOffsets)`` range."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        tps = self.client.topic_partitions()
        start = self.client.resolve(self.options.starting, tps, default=EARLIEST)
        end = self.client.resolve(self.options.ending, tps, default=LATEST)
        return [r for r in plan_ranges(start, end) if r.end > r.start] or [OffsetRange("", 0, 0, 0)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, OffsetRange)
        if not partition.topic:
            return iter(())
        return read_range(self.options, partition)


class ExactlyStreamReader(_DriverClient, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("exactly")``: offsets per topic-partition, ends at the LSO."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._target: OffsetMap | None = None  # Trigger.AvailableNow: never plan past this
        self._latest: OffsetMap | None = None

    def initialOffset(self) -> dict[str, Any]:
        tps = self.client.topic_partitions()
        offsets = self.client.resolve(self.options.starting, tps, default=EARLIEST)
        log.info("initial offsets %s", offsets)
        return to_json_offsets(offsets)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self.client.latest(self.client.topic_partitions())
        log.info("availableNow target offsets %s", self._target)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = from_json_offsets(start)
        tps = self.client.topic_partitions()
        gone = sorted(set(begin) - set(tps))
        if gone and self.options.fail_on_data_loss:
            raise DataLossError(f"partitions disappeared: {gone} (set failOnDataLoss=false to ignore)")
        latest = dict(self._target) if self._target is not None else self.client.latest(tps)
        self._latest = latest
        new = [tp for tp in latest if tp not in begin]
        earliest = self.client.earliest(new) if new else {}
        begin_all: OffsetMap = {**{tp: off for tp, off in begin.items() if tp in latest}, **earliest}
        # never move backwards (a partition whose log shrank stays where it was)
        end = {tp: max(off, begin_all.get(tp, off)) for tp, off in latest.items()}
        if isinstance(limit, ReadMaxRows):
            end = rate_limit(begin_all, end, limit.max_rows)
        # keep every partition the start knew (and new ones at their start) so offsets never shrink
        for tp, off in begin_all.items():
            end.setdefault(tp, off)
        return to_json_offsets(end)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return to_json_offsets(self._latest) if self._latest is not None else None

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        return plan_ranges(from_json_offsets(start), from_json_offsets(end))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, OffsetRange)
        return read_range(self.options, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: progress lives in Spark's checkpoint, never in a consumer group."""

    def stop(self) -> None:
        self._client = None
