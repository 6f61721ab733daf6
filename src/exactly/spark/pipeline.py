"""The orders Structured Streaming job: order-completed -> category-sales, total-sales.

    order-completed --(exactly source, read_committed)--> parse JSON
        --> per input partition, the batch's cents and orders per category and under "total"
            (partial_totals: mapInArrow, before the shuffle)
        --> running totals per key (applyInPandasWithState: state = total cents, order count)
        --> one update per (micro-batch, key): total, count, this batch's delta, the batch id
        --(exactly sink, exactly-once)--> category-sales (key = category) / total-sales (key = total)

Why a stateful Python function rather than ``groupBy().agg()``: the update must carry the batch's
*delta* and the batch id next to the new total, so ``verify`` can prove that no micro-batch was
lost or applied twice (total_i = total_{i-1} + delta_i). Spark checkpoints the state with the
offsets; a replayed batch recomputes the same updates from the same state, and the sink's
progress markers keep them from being written twice.

Why the partial sums before the shuffle: the stateful operator is a Python UDF fed through Arrow
and pandas per key group; handing it every order (twice: once under its category, once under the
total) made it the largest cost of a micro-batch. Summing each input partition's orders first in
one pyarrow ``group_by`` leaves it a few rows per partition; the deltas are the same numbers (the
sums of the same orders), and a replayed batch reads the same offsets into the same partitions,
so it recomputes the same partial sums.

Why the JSON is parsed there too, by pyarrow, rather than by Spark's ``from_json``: at large
micro-batches the per-order work is what is left, and Spark's ``from_json`` (Jackson, row by row
in the JVM) plus the projection of its struct cost more per order than the rest of the stage.
``parse_orders`` hands pyarrow's JSON reader the batch's values as one newline-delimited buffer
(column-wise, in C++; no Python per order). Which orders count is unchanged: one whose value is
null, not a JSON object, or lacks a string ``category`` or an integer ``amount`` that fits a long
is skipped (``from_json`` made it null and the filter dropped it). One deliberate difference: a
non-string JSON ``category`` (a number, say) is skipped, where ``from_json`` took its text.

Everything here that runs on executors (``partial_totals``, ``running_totals``) is a module-level
function so the Python workers import it from ``exactly`` rather than unpickling a closure.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from exactly.spark.orders import TOTAL_KEY, Topics

log = logging.getLogger("exactly.spark.pipeline")

PARTIAL_SCHEMA = "key string, amount long, orders long"
UPDATE_SCHEMA = "key string, batch long, total_cents long, orders long, delta_cents long, delta_orders long"
STATE_SCHEMA = "total_cents long, orders long"


@dataclass(frozen=True)
class JobConfig:
    bootstrap: str
    checkpoint: str
    topics: Topics = field(default_factory=Topics)
    trigger: str = "availableNow"  # "availableNow" | "processingTime:<interval>"
    max_offsets_per_trigger: int | None = 5000
    delivery: str = "exactly_once"
    transactional_id_prefix: str = "orders-pipeline"
    query_name: str = "orders-pipeline"
    extra_sink_options: tuple[tuple[str, str], ...] = ()
    # ``kafka.*`` client options for both the source and the sink (e.g. ``kafka.security.protocol``,
    # ``kafka.sasl.*``, ``kafka.ssl.*``): the connection settings a secured cluster needs
    kafka_options: tuple[tuple[str, str], ...] = ()


_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1


def parse_orders(values: Any) -> Any:
    """A binary column of order-completed JSON values -> a table (category string, amount long)
    of the orders that have both (see the module doc for what is skipped).

    Fast path: the values, each followed by a newline, are one buffer for pyarrow's JSON reader
    (explicit schema, other fields ignored). A batch with a value that reader refuses (not an
    object, a field of another type) is parsed again value by value, skipping the bad ones."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.json as pj

    values = values.filter(pc.is_valid(values))
    if len(values) == 0:
        return pa.table({"category": pa.array([], pa.string()), "amount": pa.array([], pa.int64())})
    schema = pa.schema([pa.field("category", pa.string()), pa.field("amount", pa.int64())])
    lines = pc.binary_join_element_wise(values, pa.scalar(b"", pa.binary()), pa.scalar(b"\n", pa.binary()))
    if lines.offset:  # a computed array starts at offset 0; copy one that does not
        lines = pa.concat_arrays([lines])
    lengths = pc.binary_length(lines)
    longest = int(pc.max(lengths).as_py())
    text = lines.buffers()[2].slice(0, int(pc.sum(lengths).as_py()))  # its bytes, back to back
    try:
        table = pj.read_json(
            pa.BufferReader(text),
            read_options=pj.ReadOptions(block_size=max(1 << 20, 2 * longest)),
            parse_options=pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"),
        )
    except pa.ArrowInvalid:
        table = _parse_orders_one_by_one(values.to_pylist(), schema)
    keep = pc.and_(pc.is_valid(table["category"]), pc.is_valid(table["amount"]))
    return table.filter(keep)


def _parse_orders_one_by_one(values: list[bytes], schema: Any) -> Any:
    import pyarrow as pa

    categories: list[str] = []
    amounts: list[int] = []
    for value in values:
        try:
            order = json.loads(value)
        except ValueError:
            continue
        if not isinstance(order, dict):
            continue
        category, amount = order.get("category"), order.get("amount")
        if (
            isinstance(category, str)
            and isinstance(amount, int)
            and not isinstance(amount, bool)
            and _LONG_MIN <= amount <= _LONG_MAX
        ):
            categories.append(category)
            amounts.append(amount)
    return pa.table([pa.array(categories, pa.string()), pa.array(amounts, pa.int64())], schema=schema)


def partial_totals(batches: Iterator[Any]) -> Iterator[Any]:
    """One input partition's order values of this micro-batch -> one row per category and one for
    the total: (key, cents, orders) (runs in a Python worker, mapInArrow)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    chunks = [b.column(0) for b in batches if b.num_rows]
    if not chunks:
        return
    table = parse_orders(pa.concat_arrays(chunks))
    if table.num_rows == 0:
        return
    grouped = table.group_by("category").aggregate([("amount", "sum"), ("amount", "count")])
    keys = [*grouped["category"].to_pylist(), TOTAL_KEY]
    cents = [*grouped["amount_sum"].to_pylist(), pc.sum(table["amount"]).as_py()]
    orders = [*grouped["amount_count"].to_pylist(), table.num_rows]
    yield pa.RecordBatch.from_arrays(
        [pa.array(keys, pa.string()), pa.array(cents, pa.int64()), pa.array(orders, pa.int64())],
        names=["key", "amount", "orders"],
    )


def running_totals(key: tuple[Any, ...], pdfs: Iterator[Any], state: Any) -> Iterator[Any]:
    """One key's partial sums of this micro-batch -> one update row (runs in a Python worker)."""
    import pandas as pd
    from pyspark import TaskContext

    total_cents, orders = state.get if state.exists else (0, 0)
    delta_cents = delta_orders = 0
    for pdf in pdfs:
        delta_cents += int(pdf["amount"].sum())
        delta_orders += int(pdf["orders"].sum())
    if delta_orders == 0:
        return
    ctx = TaskContext.get()
    batch_text = ctx.getLocalProperty("streaming.sql.batchId") if ctx is not None else None
    batch = int(batch_text) if batch_text is not None else -1
    total_cents, orders = int(total_cents) + delta_cents, int(orders) + delta_orders
    state.update((total_cents, orders))
    yield pd.DataFrame(
        {
            "key": [key[0]],
            "batch": [batch],
            "total_cents": [total_cents],
            "orders": [orders],
            "delta_cents": [delta_cents],
            "delta_orders": [delta_orders],
        }
    )


def build_updates(spark: Any, config: JobConfig) -> Any:
    """The streaming DataFrame of (topic, key, value) rows the sink writes."""
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    reader = (
        spark.readStream.format("exactly")
        .option("kafka.bootstrap.servers", config.bootstrap)
        .option("subscribe", config.topics.orders)
        .option("startingOffsets", "earliest")
        .option("kafka.isolation.level", "read_committed")
    )
    for key, value in config.kafka_options:
        reader = reader.option(key, value)
    if config.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(config.max_offsets_per_trigger))
    per_key = reader.load().select("value").mapInArrow(partial_totals, PARTIAL_SCHEMA)
    updates = per_key.groupBy("key").applyInPandasWithState(
        running_totals, UPDATE_SCHEMA, STATE_SCHEMA, "append", GroupStateTimeout.NoTimeout
    )
    return updates.select(
        F.when(F.col("key") == TOTAL_KEY, F.lit(config.topics.total))
        .otherwise(F.lit(config.topics.category))
        .alias("topic"),
        F.col("key"),
        F.to_json(
            F.struct(
                *[F.col(c) for c in ("key", "batch", "total_cents", "orders", "delta_cents", "delta_orders")]
            )
        ).alias("value"),
    )


def start(spark: Any, config: JobConfig) -> Any:
    """Start the query (returns the StreamingQuery)."""
    writer = (
        build_updates(spark, config)
        .writeStream.format("exactly")
        .queryName(config.query_name)
        .outputMode("append")  # each update is an immutable event; Python sinks take append only
        .option("kafka.bootstrap.servers", config.bootstrap)
        .option("checkpointLocation", config.checkpoint)
        .option("deliveryGuarantee", config.delivery)
        .option("transactionalIdPrefix", config.transactional_id_prefix)
    )
    for key, value in (*config.kafka_options, *config.extra_sink_options):
        writer = writer.option(key, value)
    if config.trigger == "availableNow":
        writer = writer.trigger(availableNow=True)
    elif config.trigger.startswith("processingTime:"):
        writer = writer.trigger(processingTime=spark_interval(config.trigger.split(":", 1)[1]))
    else:
        raise ValueError(f"unknown trigger {config.trigger!r} (availableNow | processingTime:<interval>)")
    return writer.start()


_SHORT_INTERVAL = re.compile(r"^\s*(\d+)\s*(ms|s|m)\s*$")
_UNITS = {"ms": "milliseconds", "s": "seconds", "m": "minutes"}


def spark_interval(text: str) -> str:
    """``5s`` / ``500ms`` / ``1m`` -> Spark's ``5 seconds``; anything else is passed through."""
    match = _SHORT_INTERVAL.match(text)
    return f"{match.group(1)} {_UNITS[match.group(2)]}" if match else text


def describe_progress(progress: dict[str, Any] | None) -> str | None:
    """One line per micro-batch: orders in, time, rate, updates out."""
    if not progress:
        return None
    return (
        f"batch {progress.get('batchId')}: {progress.get('numInputRows', 0)} orders in "
        f"{progress.get('batchDuration', 0) / 1000:.2f}s "
        f"({progress.get('processedRowsPerSecond', 0.0):.0f} orders/s), "
        f"{(progress.get('sink') or {}).get('numOutputRows', 0)} updates written"
    )


def run(
    spark: Any,
    config: JobConfig,
    *,
    timeout: float | None = None,
    until_caught_up: bool = False,
    on_progress: Callable[[str], None] | None = print,
    on_rows: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Run the query until it ends (availableNow), is caught up (``until_caught_up``), or times out.

    ``on_progress`` gets one line per micro-batch, ``on_rows`` the input rows so far (both after
    each batch). Returns a summary: batches, input rows, seconds, and whether it finished."""
    query = start(spark, config)
    started = time.monotonic()
    seen: set[int] = set()
    rows = batches = idle_polls = 0
    finished = False
    try:
        while True:
            ended = query.awaitTermination(1.0)
            for progress in query.recentProgress:
                batch = progress.get("batchId")
                if batch is None or batch in seen:
                    continue
                seen.add(batch)
                if progress.get("numInputRows", 0) or (progress.get("sink") or {}).get("numOutputRows", 0):
                    rows += int(progress.get("numInputRows", 0))
                    batches += 1
                    line = describe_progress(progress)
                    if on_progress is not None and line:
                        on_progress(line)
                    if on_rows is not None:
                        on_rows(rows)
            if ended:
                finished = True
                break
            if until_caught_up:
                latest = query.lastProgress
                if latest and not query.status.get("isDataAvailable") and _caught_up(latest):
                    idle_polls += 1
                    if idle_polls >= 2:
                        finished = True
                        break
                else:
                    idle_polls = 0
            if timeout is not None and time.monotonic() - started > timeout:
                break
    finally:
        if query.isActive:
            query.stop()
    exc = query.exception()
    if exc is not None:
        raise RuntimeError(f"streaming query failed: {exc}")
    return {"batches": batches, "orders": rows, "seconds": time.monotonic() - started, "finished": finished}


def _caught_up(progress: dict[str, Any]) -> bool:
    source = (progress.get("sources") or [{}])[0]
    return bool(source.get("latestOffset")) and source.get("endOffset") == source.get("latestOffset")
