"""The reading side of the ``exactly`` data source: a streaming reader and a batch reader.

Theory of operation
-------------------
* The **driver** plans: it lists the subscribed topic-partitions, asks the broker for their end
  offsets (the last stable offset under ``read_committed``), rations them with
  ``maxOffsetsPerTrigger`` and hands Spark one ``OffsetRange`` per topic-partition.
* **Executors** read: ``read_range`` takes a confluent-kafka consumer *inside the task* (clients
  are not picklable; ``fetch.py`` keeps one per Python worker across tasks), ``assign()``s the
  partition at the range's start (no consumer group, no offset commits - Spark's checkpoint is the
  only record of progress) and returns Arrow record batches until the partition's position
  reaches the range's end.
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
from confluent_kafka import Consumer, TopicPartition
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from exactly.spark.fetch import ReadClock, borrow_consumer, drain, return_consumer
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
def read_range(options: SourceOptions, part: OffsetRange) -> Iterator[pa.RecordBatch]:
    """Yield the records of ``part`` as Arrow batches; stop once the position reaches ``part.end``."""
    if part.end <= part.start:
        return
    clock = ReadClock()
    consumer, clock.reused = borrow_consumer(options)
    tp = TopicPartition(part.topic, part.partition)
    timeout_s = options.poll_timeout_ms / 1000.0
    healthy = False
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
        if start < part.end:
            consumer.assign([TopicPartition(part.topic, part.partition, start)])
            clock.connect = time.monotonic() - clock.started
            yield from drain(
                consumer,
                part,
                start,
                lambda position: _check_truncation(consumer, options, part, position),
                timeout_s,
                options.include_headers,
                clock,
            )
        healthy = True
    finally:
        return_consumer(options, consumer, healthy)
        clock.report(part.partition)


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
