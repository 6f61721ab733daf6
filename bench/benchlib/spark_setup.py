"""What the Spark benchmarks (``bench/spark_pipeline.py``, ``bench/spark_disagreement.py``) set up
alike: the broker they run against and the read_committed consumer that watches their outputs.

Kept in one place so the two measure against the same broker configuration and see output
updates with the same polling delay; a change to either shows in both reports.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from confluent_kafka import Consumer

from benchlib.brokers import REPO
from exactly.testing.broker import Broker


def start_broker(work_dir: Path) -> Broker:
    """Start ``exactly serve`` from this checkout with its data and log under ``work_dir``;
    two-phase commit is allowed, so the exactly-once sink runs in its default atomic mode. The
    caller closes it (``Broker.close``)."""
    return Broker(
        work_dir / "data",
        work_dir / "broker.log",
        name="bench-broker",
        src=REPO / "src",
        cwd=REPO,
        overrides={"transaction.two.phase.commit.enable": "true"},
    ).start()


def output_watcher(bootstrap: str, name: str) -> Consumer:
    """A read_committed consumer without a group's commits (the caller assigns its partitions)
    whose fetches wait at most 5 ms, so an output update is seen within a few milliseconds of
    becoming visible. ``name`` prefixes its group id (unique per call)."""
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"{name}-{uuid.uuid4().hex[:6]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 5,
            "log_level": 3,
        }
    )
