"""The orders pipeline on Spark against a three-broker cluster, one broker killed with kill -9
while a micro-batch is being written; the pipeline finishes and ``verify`` passes.

Topics are created as the pipeline creates them (replication factor -1) on brokers whose
defaults are RF 3 / min.insync.replicas 2 (``replicated_defaults``); the internal topics are
replicated too and have one partition each (``cluster_overrides``), so the one transaction
coordinator of every sink producer lives on one broker. The job runs in this process on the
session's SparkSession (``local[2,4]``: a failed task is retried), with ``maxOffsetsPerTrigger``
small enough for a dozen micro-batches. The sink's ``testing.pauseBatch`` hook holds the tasks of
micro-batch 3 after they produced their records and before they commit: the test then kills the
broker that is the transaction coordinator (and leader of whatever else it leads), lets the tasks
go on at once (their commit meets the failover), waits until the job wrote later micro-batches on
the two remaining brokers, restarts the dead one once ZooKeeper dropped it, and lets the job catch
up. ``verify`` then proves exactly-once: every committed order counted once, no (batch, key)
update twice, each update = previous total + its batch's delta.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from exactly.cli.local_cluster import Victim, choose_victim, replicated_defaults
from exactly.client.cluster_status import read_status
from exactly.client.wire import WireError
from exactly.cluster.zk import ClusterZk
from exactly.spark.orders import Topics, create_topics, generate, verify
from exactly.spark.pipeline import JobConfig, run
from tests.cluster.helpers import await_replicas_identical, running_cluster, wait_for
from tests.support.broker import Broker

# ``spark`` is the session's one SparkSession (tests/conftest.py), shared with tests/spark.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ORDERS = 3000
PAUSED_BATCH = 3


@pytest.fixture
def cluster(zk_connect: str, tmp_path: Path) -> Iterator[list[Broker]]:
    config = {
        **replicated_defaults(3),
        "zookeeper.session.timeout.ms": "3000",
        "replica.lag.time.max.ms": "10000",
    }
    yield from running_cluster(zk_connect, tmp_path, **config)  # type: ignore[arg-type]


def _status(bootstrap: str) -> Any:
    found: list[Any] = []

    def answered() -> bool:
        try:
            found[:] = [read_status(bootstrap, timeout_s=5)]
        except WireError:
            return False
        return True

    wait_for(answered, timeout=30, what="a Metadata answer")
    return found[0]


class Crash(threading.Thread):
    """The fault, next to the job (which runs in the test's main thread: the SparkSession's Python
    data sources are registered for it): once a task of ``PAUSED_BATCH`` holds its open
    transaction, kill -9 the coordinator's broker, release the tasks, wait until the job wrote two
    more micro-batches without it (or finished), then restart it once ZooKeeper dropped it."""

    def __init__(self, cluster: list[Broker], zk: ClusterZk, hooks: Path, topics: Topics) -> None:
        super().__init__(name="broker-crash", daemon=True)
        self.cluster, self.zk, self.hooks, self.topics = cluster, zk, hooks, topics
        self.bootstrap = ",".join(b.bootstrap for b in cluster)
        self.lines: list[str] = []  # the job's progress lines (appended by the main thread)
        self.job_done = threading.Event()
        self.victim: Victim | None = None
        self.batches_before = -1
        self.failure: BaseException | None = None

    def paused(self) -> list[str]:
        return sorted(p.name for p in self.hooks.glob(f"paused-{PAUSED_BATCH}-*"))

    def run(self) -> None:
        try:
            self._crash()
        except BaseException as exc:  # reported by the test
            self.failure = exc
        finally:
            (self.hooks / f"resume-{PAUSED_BATCH}").touch()

    def _until(self, check: Any, timeout: float, what: str) -> None:
        wait_for(lambda: check() or self.job_done.is_set(), timeout=timeout, what=what)
        assert check(), f"the job ended before {what}: " + "\n".join(self.lines)

    def _crash(self) -> None:
        self._until(lambda: bool(self.paused()), 240, f"a task of batch {PAUSED_BATCH} paused")
        self.batches_before = len(self.lines)
        self.victim = victim = choose_victim(
            _status(self.bootstrap), (self.topics.category, self.topics.total)
        )
        broker = self.cluster[victim.broker_id]
        broker.kill()
        print(f"killed {victim.describe()}; tasks {self.paused()} held open transactions")
        (self.hooks / f"resume-{PAUSED_BATCH}").touch()  # the commits now meet the failover
        self._until(lambda: len(self.lines) >= PAUSED_BATCH + 2, 240, "two micro-batches after the kill")
        wait_for(lambda: victim.broker_id not in self.zk.live_brokers(), timeout=30, what="deregistration")
        broker.start(port=broker.port or 0)
        print(f"restarted broker {victim.broker_id} after {len(self.lines)} micro-batches")


def test_orders_pipeline_survives_kill9_of_the_coordinator_broker(
    spark: Any,
    cluster: list[Broker],
    zk: ClusterZk,
    tmp_path: Path,
) -> None:
    bootstrap = ",".join(b.bootstrap for b in cluster)
    wait_for(lambda: len(zk.live_brokers()) == 3, what="three brokers registered")
    topics = Topics.with_prefix(f"cl-{random.randrange(16**6):06x}-")
    create_topics(bootstrap, topics, partitions=3)
    made = generate(bootstrap, topics, ORDERS, txn_size=100, abort_every=5, seed=13)
    assert made.committed == ORDERS and made.aborted > 0

    hooks = tmp_path / "hooks"
    config = JobConfig(
        bootstrap=bootstrap,
        checkpoint=str(tmp_path / "checkpoint"),
        topics=topics,
        trigger="availableNow",
        max_offsets_per_trigger=250,
        transactional_id_prefix=f"cl-{topics.orders}",
        extra_sink_options=(("testing.hookDir", str(hooks)), ("testing.pauseBatch", str(PAUSED_BATCH))),
    )
    crash = Crash(cluster, zk, hooks, topics)
    crash.start()
    try:
        summary = run(spark, config, on_progress=crash.lines.append)
    finally:
        crash.job_done.set()
        crash.join(120)
    assert crash.failure is None, crash.failure
    assert crash.victim is not None
    assert any(r.startswith("transaction coordinator of 1/1 ") for r in crash.victim.roles), crash.victim
    assert crash.batches_before == PAUSED_BATCH, crash.lines  # batches 0..2 written, 3 in flight
    assert cluster[crash.victim.broker_id].running, "the killed broker was not restarted"
    assert summary["finished"], summary
    assert summary["orders"] == ORDERS, summary
    assert summary["batches"] > PAUSED_BATCH + 2, crash.lines

    report = verify(bootstrap, topics)
    assert report.ok, report.summary()
    assert report.orders == ORDERS
    await_replicas_identical(bootstrap, [topics.orders, topics.category, topics.total], timeout=60)
