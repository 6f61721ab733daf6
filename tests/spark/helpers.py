"""Helpers for the Spark connector tests: transactional writes and read-backs with plain clients."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, Producer, TopicPartition

from exactly.spark.orders import Topics
from exactly.spark.pipeline import JobConfig
from tests.support.clients import QUIET, Got, consumer


def txn_producer(bootstrap: str, txn_id: str) -> Producer:
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, "linger.ms": 5, **QUIET})
    p.init_transactions(30)
    return p


def produce_txn(
    p: Producer,
    topic: str,
    values: Iterable[bytes],
    *,
    commit: bool | None = True,
    partition: int | None = None,
    headers: list[tuple[str, bytes]] | None = None,
) -> None:
    """One transaction; flushed before commit/abort so aborted records really reach the log.
    ``commit=None`` leaves it open."""
    p.begin_transaction()
    for value in values:
        kwargs: dict[str, Any] = {"value": value, "key": value[:8]}
        if partition is not None:
            kwargs["partition"] = partition
        if headers:
            kwargs["headers"] = headers
        p.produce(topic, **kwargs)
    p.flush(30)
    if commit is True:
        p.commit_transaction(30)
    elif commit is False:
        p.abort_transaction(30)


def read_all(
    bootstrap: str,
    topic: str,
    partitions: Iterable[int] = (0,),
    *,
    committed: bool = True,
    timeout: float = 30,
) -> list[Got]:
    """Everything visible (read_committed by default) from the log start to the current end."""
    c = consumer(
        bootstrap,
        **{
            "isolation.level": "read_committed" if committed else "read_uncommitted",
            "enable.partition.eof": True,
        },
    )
    try:
        parts = list(partitions)
        ends = {
            p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1] for p in parts
        }
        pending = {p for p in parts if ends[p] > 0}
        c.assign([TopicPartition(topic, p, 0) for p in pending])
        got: list[Got] = []
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            for m in c.consume(num_messages=1000, timeout=0.2):
                err = m.error()
                if err is not None:
                    assert err.code() == KafkaError._PARTITION_EOF, err
                    continue
                ts_type, ts = m.timestamp()
                headers: Any = m.headers() or ()
                got.append(
                    Got(
                        int(m.partition() or 0),
                        int(m.offset() or 0),
                        m.key(),
                        m.value(),
                        tuple(headers),
                        ts_type,
                        ts,
                    )
                )
            for tp in c.position([TopicPartition(topic, p) for p in list(pending)]):
                if tp.offset >= ends[tp.partition]:
                    pending.discard(tp.partition)
        assert not pending, f"{topic}: partitions {pending} did not reach {ends}"
        return got
    finally:
        c.close()


def stream_copy(
    spark: Any, bootstrap: str, source: str, target: str, ckpt: Path, guarantee: str, **sink_options: str
) -> Any:
    """Start a query that copies ``source`` to ``target`` upper-cased, 40 offsets per micro-batch,
    over two partitions (``sink_options``: further options of the sink)."""
    writer = (
        spark.readStream.format("exactly")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "40")
        .load()
        .selectExpr("key", "upper(cast(value as string)) as value")
        .repartition(2)
        .writeStream.format("exactly")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", target)
        .option("deliveryGuarantee", guarantee)
        .option("checkpointLocation", str(ckpt))
        .trigger(availableNow=True)
    )
    for key, value in sink_options.items():
        writer = writer.option(key, value)
    return writer.start()


def hung_two_phase_job(
    bootstrap: str, tmp_path: Path, topics: Topics, name: str, *, hang_batch: int, max_offsets: int
) -> tuple[JobConfig, Path]:
    """The orders job in atomic two-phase mode whose first task to prepare in ``hang_batch`` writes
    its pid into the returned hook dir and hangs there (``testing.taskHang``) until the test
    touches ``task-resume-<batch>`` in it (or kills it). Transactional ids start with ``name``."""
    hooks = tmp_path / "hooks"
    config = JobConfig(
        bootstrap=bootstrap,
        checkpoint=str(tmp_path / "checkpoint"),
        topics=topics,
        max_offsets_per_trigger=max_offsets,
        transactional_id_prefix=name,
        query_name=name,
        extra_sink_options=(
            ("atomicBatches", "true"),
            ("testing.hookDir", str(hooks)),
            ("testing.taskHang", str(hang_batch)),
        ),
    )
    return config, hooks
