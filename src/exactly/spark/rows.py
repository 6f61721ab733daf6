"""The sink's input: Spark's Arrow record batches -> (topic, key, value, partition, headers) rows.

Column-wise: each column becomes one Python list in C (``to_pylist``), the rows are zipped from
those lists; nothing per row but the tuple. String keys and values are encoded to UTF-8 (the sink
writes bytes), binary ones pass through.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

Row = tuple[str, bytes | None, bytes | None, int | None, list[tuple[str, bytes | None]] | None]


def _as_bytes(value: Any) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return bytes(value)


def arrow_rows(
    batches: Iterator[pa.RecordBatch], default_topic: str | None, clock: dict[str, float] | None = None
) -> Iterator[Row]:
    """Arrow record batches -> (topic, key, value, partition, headers) tuples.

    Column-wise: each column becomes one Python list in C (``to_pylist``), the rows are zipped
    from those lists. ``clock["convert"]`` (if given) accumulates the conversion's seconds."""
    for batch in batches:
        t0 = time.monotonic()
        n = batch.num_rows
        if n == 0:
            continue
        names = batch.schema.names

        def column(
            name: str, batch: pa.RecordBatch = batch, names: list[str] = names, n: int = n
        ) -> list[Any]:
            return batch.column(names.index(name)).to_pylist() if name in names else [None] * n

        values = [_as_bytes(v) for v in column("value")] if _is_string(batch, "value") else column("value")
        keys = [_as_bytes(k) for k in column("key")] if _is_string(batch, "key") else column("key")
        if default_topic is not None:
            topics: list[Any] = [default_topic] * n
        else:
            topics = column("topic")
            if any(not t for t in topics):
                raise ValueError("a row has no topic (null 'topic' column and no 'topic' option)")
        partitions = column("partition")
        if "headers" in names:
            headers = [
                [(h["key"], _as_bytes(h["value"])) for h in hdrs] if hdrs else None
                for hdrs in column("headers")
            ]
        else:
            headers = [None] * n
        if clock is not None:
            clock["convert"] = clock.get("convert", 0.0) + time.monotonic() - t0
        yield from zip(topics, keys, values, partitions, headers)


def timed_batches(batches: Iterator[pa.RecordBatch], clock: dict[str, float]) -> Iterator[pa.RecordBatch]:
    """``batches``, adding the time spent waiting for each (upstream work) to ``clock["input"]``."""
    while True:
        t0 = time.monotonic()
        batch = next(batches, None)
        clock["input"] += time.monotonic() - t0
        if batch is None:
            return
        yield batch


def _is_string(batch: pa.RecordBatch, name: str) -> bool:
    index = batch.schema.get_field_index(name)
    return index >= 0 and bool(pa.types.is_string(batch.schema.field(index).type))
