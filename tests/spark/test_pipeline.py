"""The orders pipeline on the shared SparkSession: generate -> run -> verify, resumed, and replayed."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from exactly.spark.orders import Topics, create_topics, generate, verify
from exactly.spark.pipeline import JobConfig, run

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
