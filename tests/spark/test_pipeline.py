"""The orders pipeline on the shared SparkSession: generate -> run -> verify, resumed, and replayed."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from exactly.spark.orders import Topics, create_topics, generate, verify
from exactly.spark.pipeline import JobConfig, parse_orders, partial_totals, run

pytestmark = pytest.mark.timeout(300)


def _topics() -> Topics:
    return Topics.with_prefix(f"p{uuid.uuid4().hex[:8]}-")


def _config(bootstrap: str, topics: Topics, ckpt: Path, delivery: str = "exactly_once") -> JobConfig:
    return JobConfig(
        bootstrap=bootstrap,
        checkpoint=str(ckpt),
        topics=topics,
        max_offsets_per_trigger=700,
        delivery=delivery,
    )


def test_pipeline_counts_committed_orders_exactly_once_and_resumes(
    spark: Any, bootstrap: str, tmp_path: Path
) -> None:
    topics = _topics()
    create_topics(bootstrap, topics, partitions=3)
    made = generate(bootstrap, topics, 1500, txn_size=100, abort_every=3, seed=1)
    assert made.aborted > 0
    config = _config(bootstrap, topics, tmp_path / "ckpt")
    summary = run(spark, config, on_progress=None)
    assert summary["finished"] and summary["orders"] == 1500
    report = verify(bootstrap, topics)
    assert report.ok, report.summary()
    assert report.truth_cents["total"] == sum(made.cents.values())
    assert report.batches >= 3  # 1500 orders + aborted ones, 700 offsets per trigger

    # more orders (an idempotent producer this time), same checkpoint: the totals continue
    more = generate(bootstrap, topics, 600, transactional=False, seed=2, first_order_id=1_000_000)
    summary = run(spark, config, on_progress=None)
    assert summary["orders"] == 600
    report = verify(bootstrap, topics)
    assert report.ok, report.summary()
    assert report.truth_cents["total"] == sum(made.cents.values()) + sum(more.cents.values())
    assert report.latest["total"]["orders"] == 2100


@pytest.mark.parametrize("delivery", ["exactly_once", "at_least_once"])
def test_replay_after_sink_commit(spark: Any, bootstrap: str, tmp_path: Path, delivery: str) -> None:
    """The last batch is replayed (its commit-log entry removed, as a driver crash leaves it): with
    the exactly-once sink verify still passes; with the at-least-once sink it reports the batch
    written twice - verify has teeth, and the sink's skip is what makes the difference."""
    topics = _topics()
    create_topics(bootstrap, topics, partitions=2)
    generate(bootstrap, topics, 1000, txn_size=100, abort_every=4, seed=3)
    ckpt = tmp_path / "ckpt"
    config = _config(bootstrap, topics, ckpt, delivery)
    run(spark, config, on_progress=None)
    assert verify(bootstrap, topics).ok
    commits = sorted(int(p.name) for p in (ckpt / "commits").iterdir() if p.name.isdigit())
    (ckpt / "commits" / str(commits[-1])).unlink()
    (ckpt / "commits" / f".{commits[-1]}.crc").unlink(missing_ok=True)
    run(spark, config, on_progress=None)
    report = verify(bootstrap, topics)
    if delivery == "exactly_once":
        assert report.ok, report.summary()
    else:
        assert not report.ok
        assert any(f"batch {commits[-1]} written twice" in p for p in report.problems), report.problems


def test_orders_are_parsed_column_wise_and_bad_values_skipped() -> None:
    """Which orders count, as Spark's from_json + the null filter decided before: a value that is
    null, not a JSON object, or lacks a string category or an integer amount that fits a long is
    skipped; other fields are ignored. A batch with one bad value still counts its good ones."""
    good = [
        b'{"order_id":1,"category":"books","amount":500,"completed_at":1}',
        b'{"category":"toys","amount":7}',
    ]
    assert parse_orders(pa.array([*good, None], pa.binary())).to_pylist() == [
        {"category": "books", "amount": 500},
        {"category": "toys", "amount": 7},
    ]
    bad = [
        b"not json",
        b"[1]",
        b'{"amount":3}',
        b'{"category":"x","amount":"3"}',
        b'{"category":"x","amount":1.5}',
        b'{"category":"x","amount":true}',
        b'{"category":"x","amount":99999999999999999999}',
    ]
    mixed = pa.array([good[0], *bad, good[1]], pa.binary())
    assert parse_orders(mixed).to_pylist() == [
        {"category": "books", "amount": 500},
        {"category": "toys", "amount": 7},
    ]
    assert parse_orders(mixed.slice(1, len(bad))).num_rows == 0


def test_partial_totals_sum_one_partition_per_category_and_in_total() -> None:
    values = pa.array(
        [
            b'{"category":"a","amount":5}',
            b'{"category":"b","amount":7}',
            b'{"category":"a","amount":1}',
            b"{}",
        ],
        pa.binary(),
    )
    batch = pa.RecordBatch.from_arrays([values], names=["value"])
    rows = [
        row for out in partial_totals(iter([batch.slice(0, 2), batch.slice(2)])) for row in out.to_pylist()
    ]
    assert sorted(rows, key=lambda r: r["key"]) == [
        {"key": "a", "amount": 6, "orders": 2},
        {"key": "b", "amount": 7, "orders": 1},
        {"key": "total", "amount": 13, "orders": 3},
    ]
