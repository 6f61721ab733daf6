"""The writing side of the ``exactly`` data source: an exactly-once Kafka sink for Spark.

Input columns, as Spark's Kafka sink: ``value`` (string or binary, required), ``key`` (string or
binary, optional), ``topic`` (string; the ``topic`` option overrides it), ``partition`` (int,
optional: else librdkafka's murmur2 partitioner - the Java client's - picks by key), ``headers``
(array<struct<key string, value binary>>, optional).

Exactly-once mode (``deliveryGuarantee=exactly_once``, the default)
-------------------------------------------------------------------
One transactional producer per (query id, Spark partition)::

    transactional.id = <transactionalIdPrefix>-<query id>-<partition id>

Spark's query id is stored in the checkpoint, so a restarted query and every retry of a task
reuse the same transactional.id. Each ``write()`` (executor):

1. ``init_transactions()`` - bumps the producer epoch: an older attempt of the same task (a zombie
   still running somewhere) is fenced, and its open transaction is aborted.
2. Looks up the newest committed progress marker of this transactional.id (``progress.py``).
   If it is for this batch id (or a later one) the batch was committed before - the driver died
   after the tasks committed but before Spark wrote its commit log - and the task skips it.
3. ``begin_transaction()``, produces the records, produces the progress marker for this batch,
   ``commit_transaction()``. Data and marker become visible together or not at all.

The driver's ``commit(messages, batchId)`` only reports: every task already committed its own
transaction, so a second call for the same batch (Spark may repeat it) changes nothing.

The guarantee, precisely
~~~~~~~~~~~~~~~~~~~~~~~~
* A ``read_committed`` consumer of the output sees every record of every micro-batch **exactly
  once**, whatever crashes, task retries or zombie tasks happen - provided the batch is
  deterministic (same input offsets, same records in the same Spark partition on replay, which
  Spark guarantees for its replay of the last batch with the same batch id and offsets).
* A micro-batch becomes visible **partition by partition** (one transaction per Spark task), not
  atomically as a whole: while a batch is being written a reader may see the output of some
  Spark partitions of the batch and not yet of others. Nothing is ever visible twice. (As with any
  Kafka transaction, a committed task's records on a Kafka partition also wait behind the LSO: an
  earlier-started transaction still open on that partition holds them back until it ends.)
* ``read_uncommitted`` readers may see records of aborted attempts (as with any Kafka
  transactional producer).
* Batch (non-streaming) writes get the same per-task guarantee under a random write id: retried
  tasks never duplicate, but a failed job leaves the partitions that did commit visible.

Broker failures
~~~~~~~~~~~~~~~
Transient errors while a partition's leader or the transaction coordinator moves to another
broker are retried inside the task (``retries.call_retrying``: ``init_transactions`` and
``commit_transaction`` again on a retriable error, as librdkafka documents; librdkafka itself
retries the produce requests and re-finds the coordinator). An error that needs an abort aborts
the transaction; it, a fatal one (the producer was fenced, the coordinator refused the
transaction's state) or a retriable one past ``transaction.timeout.ms`` fails the task, and
Spark's retry of the task starts with a new producer whose ``init_transactions`` bumps the epoch
and finishes or aborts whatever the failed attempt left open - the progress marker then tells
whether the failed attempt's commit made it. Task retries need ``spark.task.maxFailures`` > 1
(``local[N,F]`` on a local master: plain ``local[*]`` fails the query on the first task failure,
and a restart of the query from its checkpoint is the recovery).

Two-phase mode (``atomicBatches``; default ``auto``: on where the broker allows KIP-939)
-----------------------------------------------------------------------------------------
Steps 1-2 as above; step 3 flushes and then *prepares* instead of committing (the transaction is
adopted as a KIP-939 two-phase-commit transaction), and the driver's ``commit`` records its
decision and commits every task's transaction; see ``two_phase.py`` for the protocol, the
recovery and the guarantee (every batch all-or-nothing).

At-least-once mode (``deliveryGuarantee=at_least_once``) uses a plain idempotent producer: no
duplicates from producer retries, but a replayed batch is written again.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import pyarrow as pa
from confluent_kafka import KafkaException, Producer
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import BinaryType, IntegerType, StringType, StructType

from exactly.spark import clients, progress, two_phase
from exactly.spark.options import OptionError, SinkOptions
from exactly.spark.retries import call_retrying
from exactly.spark.rows import Row, arrow_rows, timed_batches
from exactly.spark.timings import record as record_timings

log = logging.getLogger("exactly.spark.sink")


@dataclass
class SinkCommitMessage(WriterCommitMessage):
    """What one write task did (travels back to the driver, so plain data only)."""

    partition: int
    attempt: int
    batch_id: int
    records: int
    skipped: bool = False  # the batch was already committed by an earlier attempt
    transactional_id: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    write_id: str | None = None
    prepared: tuple[str, int, int] | None = None  # two-phase mode: (txn id, holder pid, epoch)


def validate_schema(schema: StructType, options: SinkOptions) -> None:
    """Fail on the driver, before any task runs, on a DataFrame the sink cannot write."""
    fields = {f.name: f.dataType for f in schema.fields}
    if "value" not in fields:
        raise OptionError("the DataFrame to write needs a 'value' column (string or binary)")
    for name in ("key", "value"):
        if name in fields and not isinstance(fields[name], StringType | BinaryType):
            raise OptionError(f"column {name} must be string or binary, not {fields[name].simpleString()}")
    if options.topic is None and "topic" not in fields:
        raise OptionError("no topic: set the 'topic' option or add a 'topic' column")
    if "partition" in fields and not isinstance(fields["partition"], IntegerType):
        raise OptionError("column partition must be int")


# ---------------------------------------------------------------------------- executor side
def _produce(producer: Producer, row: Row, on_delivery: Any) -> None:
    topic, key, value, partition, headers = row
    while True:
        try:
            if partition is None and not headers:  # the common case: no keyword dict to build
                producer.produce(topic, value, key, on_delivery=on_delivery)
            else:
                kwargs: dict[str, Any] = {"key": key, "value": value, "on_delivery": on_delivery}
                if partition is not None:
                    kwargs["partition"] = partition
                if headers:
                    kwargs["headers"] = headers
                producer.produce(topic, **kwargs)
            return
        except BufferError:  # local queue full: serve delivery reports, then retry
            producer.poll(0.05)


class _Deliveries:
    """Delivery-report callback: remembers the first error and the offset of the marker."""

    def __init__(self) -> None:
        self.error: Any = None
        self.marker_offset = -1

    def __call__(self, err: Any, msg: Any) -> None:
        if err is not None and self.error is None:
            self.error = err

    def marker(self, err: Any, msg: Any) -> None:
        self(err, msg)
        if err is None:
            self.marker_offset = msg.offset()


def _producer_conf(options: SinkOptions) -> dict[str, Any]:
    return {
        "log_level": 3,
        **clients.PRODUCER_DEFAULTS,
        "partitioner": "murmur2_random",  # the Java client's partitioner, as Spark's Kafka sink
        "linger.ms": 5,
        "batch.size": 1_000_000,
        **options.client,
        "enable.idempotence": True,
        "acks": "all",
    }


def _task() -> tuple[int, int, str | None, int | None]:
    ctx = TaskContext.get()
    if ctx is None:  # not inside a Spark task (unit use): behave like partition 0, attempt 0
        return 0, 0, None, None
    query = ctx.getLocalProperty("sql.streaming.queryId")
    batch = ctx.getLocalProperty("streaming.sql.batchId")
    return ctx.partitionId(), ctx.attemptNumber(), query, int(batch) if batch is not None else None


def write_exactly_once(
    options: SinkOptions,
    progress_partitions: int,
    write_id: str,
    batch_id: int,
    rows: Iterator[Row],
    *,
    atomic: bool = False,
) -> SinkCommitMessage:
    partition, attempt, _query, _batch = _task()
    txn_id = f"{options.transactional_id_prefix}-{write_id}-{partition}"
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    # The set-up (fencing, the marker look-up) comes before the first row: the rows are produced
    # upstream meanwhile (Spark feeds this worker from another thread), so its round trips overlap
    # the upstream work instead of adding to it.
    if atomic:  # a transaction decided before the driver stopped must be committed, not aborted
        two_phase.resolve_leftover(options, write_id, txn_id, progress_partitions)
    producer = Producer(
        {
            **_producer_conf(options),
            "transactional.id": txn_id,
            "transaction.timeout.ms": options.transaction_timeout_ms,
        }
    )
    timeout = options.transaction_timeout_ms / 1000.0
    # fences older attempts and completes their transactions; a coordinator that is moving
    # (its broker died) answers retriably until the new one has loaded the transaction log
    call_retrying(lambda: producer.init_transactions(timeout), timeout, f"{txn_id}: init_transactions")
    timings["init"] = time.monotonic() - t0
    marker_partition = partition % progress_partitions
    if atomic:  # never waits behind a prepared transaction, which stays open until the driver decides
        last = two_phase.last_committed_batch(
            options, write_id, txn_id, marker_partition, progress_partitions
        )
    else:
        last = progress.last_committed_batch(
            options.client, options.progress_topic, marker_partition, txn_id, wait_s=options.progress_wait_s
        )
    timings["lookup"] = time.monotonic() - t0 - timings["init"]
    first = next(rows, None)
    if first is None:  # nothing to write: no transaction (a replay of this task is empty too)
        return SinkCommitMessage(partition, attempt, batch_id, 0)
    if last is not None and last >= batch_id:
        if last > batch_id:
            log.warning(
                "%s: asked to write batch %d but batch %d is committed; skipping", txn_id, batch_id, last
            )
        else:
            log.info("%s: batch %d already committed by an earlier attempt; skipping", txn_id, batch_id)
        return SinkCommitMessage(partition, attempt, batch_id, 0, True, txn_id, timings, write_id)
    deliveries = _Deliveries()
    producer.begin_transaction()
    count = 0
    try:
        for row in chain([first], rows):
            _produce(producer, row, deliveries)
            count += 1
            if count % 10_000 == 0:
                producer.poll(0)
        marker = progress.marker_value(batch_id, write_id, partition, count, attempt)
        producer.produce(
            options.progress_topic,
            key=txn_id.encode(),
            value=marker,
            partition=marker_partition,
            on_delivery=deliveries.marker,
        )
        timings["produce"] = time.monotonic() - t0 - timings["init"] - timings["lookup"]
        t_flush = time.monotonic()
        producer.flush(timeout)  # commit_transaction would flush too; explicit so faults see it all sent
        options.faults.before_commit(batch_id, partition)
        if atomic:
            if deliveries.error is not None:
                raise KafkaException(deliveries.error)
            timings["flush"] = time.monotonic() - t_flush
            held = two_phase.prepare(options, txn_id)  # the driver decides; librdkafka is fenced
            timings["prepare"] = time.monotonic() - t_flush - timings["flush"]
            timings["total"] = time.monotonic() - t0
            options.faults.after_prepare(batch_id, partition)
            prepared = (held.transactional_id, held.producer_id, held.producer_epoch)
            return SinkCommitMessage(
                partition, attempt, batch_id, count, False, txn_id, timings, write_id, prepared
            )
        # retriable (the coordinator moved, the commit's outcome unknown): the same call again,
        # as librdkafka documents; the coordinator answers a repeated EndTxn idempotently
        call_retrying(lambda: producer.commit_transaction(timeout), timeout, f"{txn_id}: commit")
    except KafkaException as exc:
        error = exc.args[0] if exc.args else None
        if error is not None and hasattr(error, "txn_requires_abort") and error.txn_requires_abort():
            try:
                producer.abort_transaction(timeout)
            except KafkaException:
                log.warning("%s: abort after a failed batch %d failed too", txn_id, batch_id, exc_info=True)
        raise
    if deliveries.error is not None:  # commit succeeded, so this cannot happen; be loud if it does
        raise KafkaException(deliveries.error)
    timings["total"] = time.monotonic() - t0
    options.faults.after_commit(batch_id, partition)
    if deliveries.marker_offset >= 0:
        progress.remember(
            options.client,
            options.progress_topic,
            txn_id,
            marker_partition,
            deliveries.marker_offset,
            batch_id,
        )
    return SinkCommitMessage(partition, attempt, batch_id, count, False, txn_id, timings, write_id)


def write_at_least_once(options: SinkOptions, batch_id: int, rows: Iterator[Row]) -> SinkCommitMessage:
    """A plain idempotent producer, kept across the tasks of this Python worker (no transactions:
    nothing binds it to a task; each task flushes what it produced before it returns)."""
    partition, attempt, _query, _batch = _task()
    conf = _producer_conf(options)
    producer = clients.shared("sink", conf, Producer)
    first = next(rows, None)
    if first is None:
        return SinkCommitMessage(partition, attempt, batch_id, 0)
    t0 = time.monotonic()
    deliveries = _Deliveries()
    count = 0
    for row in chain([first], rows):
        _produce(producer, row, deliveries)
        count += 1
        if count % 10_000 == 0:
            producer.poll(0)
    options.faults.before_commit(batch_id, partition)
    remaining = producer.flush(options.transaction_timeout_ms / 1000.0)
    if deliveries.error is not None or remaining:
        clients.drop_shared("sink", conf)  # a fatal idempotence error leaves it unusable
        raise KafkaException(deliveries.error or f"{remaining} records not delivered in time")
    options.faults.after_commit(batch_id, partition)
    return SinkCommitMessage(partition, attempt, batch_id, count, timings={"total": time.monotonic() - t0})


# ---------------------------------------------------------------------------- writers
# Spark constructs the writer again in the Python worker that runs every micro-batch's driver-side
# commit; the progress topic and the broker's two-phase support are looked up once per process
# (with an AdminClient and a wire connection each, that look-up cost more than a small batch's
# commit). Keyed by every option that could change the answer.
_RESOLVED: dict[tuple[Any, ...], tuple[int, bool]] = {}


def _resolve_on_driver(options: SinkOptions) -> tuple[int, bool]:
    """(progress topic partitions, two-phase mode) - created / asked once per process."""
    key = (
        tuple(sorted(options.client.items())),
        options.progress_topic,
        options.progress_partitions,
        options.exactly_once,
        options.atomic_batches,
    )
    found = _RESOLVED.get(key)
    if found is None:
        partitions = progress.ensure_progress_topic(
            options.client, options.progress_topic, options.progress_partitions
        )
        found = _RESOLVED[key] = (partitions, two_phase.resolve_atomic(options))
    return found


class _WriterBase:
    def __init__(self, options: SinkOptions, schema: StructType) -> None:
        validate_schema(schema, options)
        self.options = options
        self.progress_partitions = 1
        self.atomic = False
        if options.exactly_once:  # driver side, before any task: create the progress topic
            self.progress_partitions, self.atomic = _resolve_on_driver(options)

    def _write(self, iterator: Iterator[pa.RecordBatch], write_id: str | None) -> SinkCommitMessage:
        partition, _attempt, query, batch = _task()
        clock: dict[str, float] = {"input": 0.0}
        started = time.monotonic()
        rows = arrow_rows(timed_batches(iterator, clock), self.options.topic, clock)
        batch_id = batch if batch is not None else 0
        if not self.options.exactly_once:
            message = write_at_least_once(self.options, batch_id, rows)
            message.write_id = write_id or query
        else:
            wid = write_id or query
            if wid is None:
                raise RuntimeError("streaming write task without a query id (sql.streaming.queryId)")
            message = write_exactly_once(
                self.options, self.progress_partitions, wid, batch_id, rows, atomic=self.atomic
            )
        record_timings(
            "sink",
            query or write_id,
            batch,
            partition,
            {**message.timings, **clock, "task": time.monotonic() - started, "records": message.records},
        )
        return message

    def _commit(self, messages: list[Any], batch_id: int, write_id: str | None) -> None:
        t0 = time.monotonic()
        if self.atomic:
            reported, prepared = two_phase.prepared_of(messages)
            wid = reported or write_id
            if wid is not None:
                two_phase.commit(self.options, wid, self.progress_partitions, batch_id, prepared)
        self._report(messages, batch_id, "committed")
        query = write_id or next((m.write_id for m in messages if getattr(m, "write_id", None)), None)
        record_timings("commit", query, batch_id, -1, {"total": time.monotonic() - t0})

    def _abort(self, messages: list[Any], batch_id: int, write_id: str | None) -> None:
        if self.atomic:
            reported, prepared = two_phase.prepared_of(messages)
            two_phase.abort(self.options, reported or write_id, self.progress_partitions, batch_id, prepared)
            self._report(messages, batch_id, "aborted (nothing of it is visible)")
        else:
            self._report(messages, batch_id, "aborted (tasks that committed stay visible)")

    @staticmethod
    def _report(messages: list[Any], batch_id: int, verb: str) -> None:
        done = [m for m in messages if isinstance(m, SinkCommitMessage)]
        records = sum(m.records for m in done)
        skipped = sorted(m.partition for m in done if m.skipped)
        log.info(
            "batch %d %s: %d records from %d tasks%s",
            batch_id,
            verb,
            records,
            len(done),
            f"; partitions {skipped} were already committed" if skipped else "",
        )


class ExactlyStreamWriter(_WriterBase, DataSourceStreamArrowWriter):
    """Streaming sink: one transaction per (micro-batch, Spark partition)."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        return self._write(iterator, None)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Idempotent. Per-task mode: the tasks committed their own transactions, this only
        reports. Two-phase mode: record the decision, then commit every prepared transaction."""
        self._commit(list(messages), batchId, None)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Per-task mode: tasks that committed stay committed; the replay of this batch id skips
        them. Two-phase mode: nothing of the batch becomes visible (unless already decided)."""
        self._abort(list(messages), batchId, None)


class ExactlyBatchWriter(_WriterBase, DataSourceArrowWriter):
    """Batch sink (``df.write.format("exactly")``): per-task transactions under a random write id
    (two-phase mode: one decision for the whole job)."""

    def __init__(self, options: SinkOptions, schema: StructType) -> None:
        super().__init__(options, schema)
        self.write_id = uuid.uuid4().hex

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        return self._write(iterator, self.write_id)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self._commit(list(messages), 0, self.write_id)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        self._abort(list(messages), 0, self.write_id)
