"""The orders pipeline in atomic two-phase mode (``atomicBatches=true``, KIP-939) on the
three-broker cluster; the broker that coordinates the sink's transactions is killed with kill -9
while a micro-batch's transactions are prepared and undecided, and restarted.

Every topic is replicated: the brokers' defaults are RF 3 / min.insync.replicas 2 for topics
created with RF -1 (the pipeline's outputs and the sink's progress topic) and for the internal
topics (``replicated_defaults``); ``__transaction_state`` has one partition, so one broker is the
coordinator of every transactional id of the sink. The job runs on the session's SparkSession
(``local[2,4]``, two shuffle partitions: two transactions per micro-batch). ``testing.taskHang``
holds the first task of micro-batch ``HANG_BATCH`` that prepared; once both transactions of the
batch are prepared (2PC, open), the test finds their coordinator with FindCoordinator, kills its
broker, waits until the next coordinator has loaded them (same holder epochs, still open, nothing
of the batch visible), lets the task go on -- the driver then decides and commits through the new
coordinator -- and restarts the killed broker while the job runs on. The job, restarted from its
checkpoint if the outage failed it, finishes; ``verify`` passes, every micro-batch is whole, and
a read_committed reader watching all along never saw a batch in part outside its commit phase.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException

from exactly.cli.local_cluster import replicated_defaults
from exactly.client.broker_pool import BrokerPool
from exactly.client.two_phase import PreparedTxn
from exactly.client.txn_admin import describe_one
from exactly.client.wire import WireError
from exactly.cluster.zk import ClusterZk
from exactly.spark.orders import Topics, create_topics, generate, verify
from exactly.spark.pipeline import start
from exactly.spark.two_phase import TWO_PHASE_COMMIT_TIMEOUT_MS
from exactly.testing.wait import wait_until
from tests.cluster.helpers import await_replicas_identical, broker_id, by_id, running_cluster, wait_for
from tests.spark.batch_view import BatchView, PartialWatch, open_transactions
from tests.spark.helpers import hung_two_phase_job
from tests.support.broker import Broker

# ``spark`` is the session's one SparkSession (tests/conftest.py), shared with tests/spark.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

ORDERS = 1200
HANG_BATCH = 1
TASKS = 2  # the session's spark.sql.shuffle.partitions: one transaction per task and batch


@pytest.fixture
def cluster(zk_connect: str, tmp_path: Path) -> Iterator[list[Broker]]:
    config = {
        **replicated_defaults(3),
        "transaction.two.phase.commit.enable": "true",
        "zookeeper.session.timeout.ms": "3000",
        "replica.lag.time.max.ms": "10000",
    }
    yield from running_cluster(zk_connect, tmp_path, **config)  # type: ignore[arg-type]


def _prepared(bootstrap: str, txn_ids: list[str]) -> list[PreparedTxn]:
    """The holders of ``txn_ids`` if every one is an open 2PC transaction (else [])."""
    found = []
    try:
        with BrokerPool.connect(bootstrap, timeout=10) as pool:
            for tid in txn_ids:
                state = describe_one(pool, tid)
                if (state.transaction_state, state.transaction_timeout_ms) != (
                    "Ongoing",
                    TWO_PHASE_COMMIT_TIMEOUT_MS,
                ):
                    return []
                found.append(PreparedTxn(tid, state.producer_id, state.producer_epoch))
    except (OSError, WireError):
        return []
    return found


def _coordinator_id(bootstrap: str, tid: str) -> int:
    with BrokerPool.connect(bootstrap, timeout=30) as pool:
        return pool.retrying("FindCoordinator", lambda: pool.coordinator_id(tid))


def test_two_phase_pipeline_survives_kill9_of_the_coordinator_while_prepared(
    spark: Any, cluster: list[Broker], zk: ClusterZk, tmp_path: Path
) -> None:
    bootstrap = ",".join(b.bootstrap for b in cluster)
    wait_for(lambda: len(zk.live_brokers()) == 3, what="three brokers registered")
    tag = f"{random.randrange(16**6):06x}"
    topics = Topics.with_prefix(f"cl2pc-{tag}-")
    create_topics(bootstrap, topics, partitions=3)
    made = generate(bootstrap, topics, ORDERS, txn_size=100, abort_every=5, seed=17)
    assert made.committed == ORDERS and made.aborted > 0

    prefix = f"cl2pc-{tag}"
    config, hooks = hung_two_phase_job(
        bootstrap, tmp_path, topics, prefix, hang_batch=HANG_BATCH, max_offsets=250
    )
    watch = PartialWatch(bootstrap, topics)
    watch.start()
    started = time.monotonic()
    restarts = 0
    query = start(spark, config)
    try:

        def hung() -> bool:
            assert query.isActive, f"the query ended before the hang: {query.exception()}"
            return any(hooks.glob(f"task-prepared-{HANG_BATCH}-*"))

        wait_for(hung, 240, f"a task of batch {HANG_BATCH} holding its prepared transaction")
        txn_ids = [f"{prefix}-{query.id}-{p}" for p in range(TASKS)]
        prepared = wait_until(lambda: _prepared(bootstrap, txn_ids), 60, "both tasks prepared", interval=0.2)
        victim = by_id(cluster, _coordinator_id(bootstrap, txn_ids[0]))
        assert {_coordinator_id(bootstrap, t) for t in txn_ids} == {broker_id(victim)}

        victim.kill()
        print(f"{time.monotonic() - started:.1f}s: killed coordinator broker {broker_id(victim)}; {prepared}")
        survivors = ",".join(b.bootstrap for b in cluster if b.running)
        wait_until(
            lambda: _coordinator_id(survivors, txn_ids[0]) != broker_id(victim),
            60,
            "a new coordinator",
            interval=0.2,
        )
        # the new coordinator loaded the prepared transactions: same holders, still open
        wait_until(
            lambda: _prepared(survivors, txn_ids) == prepared,
            60,
            "the prepared transactions loaded",
            interval=0.2,
            describe=lambda: _prepared(survivors, txn_ids),
        )
        watch.quiet(True)  # the driver waits for the held task: no commit phase is under way
        seen = watch.stable
        wait_for(lambda: watch.stable > seen, 60, what="a stable view of the outputs with the broker dead")
        watch.quiet(False)
        view = BatchView(survivors, topics)
        assert view.records.get(HANG_BATCH, 0) == 0, f"undecided batch {HANG_BATCH} visible"
        assert sorted(view.batches) == list(range(HANG_BATCH)), sorted(view.batches)

        (hooks / f"task-resume-{HANG_BATCH}").touch()  # the decision and commits meet the new coordinator
        wait_until(
            lambda: not query.isActive or len(BatchView(survivors, topics).batches) > HANG_BATCH + 1,
            120,
            "a micro-batch after the resumed one",
            interval=0.5,
        )
        wait_for(lambda: broker_id(victim) not in zk.live_brokers(), 30, what="deregistration")
        victim.start(port=victim.port or 0)
        print(f"{time.monotonic() - started:.1f}s: restarted broker {broker_id(victim)}")

        while True:  # availableNow: the query ends at the end of its input
            try:
                query.awaitTermination(240)
            except StreamingQueryException:
                pass  # a failed query raises here; query.exception() below says the same
            assert not query.isActive, "the query did not finish within 240 s"
            if query.exception() is None:
                break
            restarts += 1  # the outage failed it: a restart from the checkpoint is the recovery
            assert restarts <= 2, query.exception()
            print(f"restart {restarts} after: {str(query.exception())[:500]}")
            query = start(spark, config)
    finally:
        if query.isActive:
            query.stop()
        watch.stop()
    print(
        "batch durations (s):",
        [(p["batchId"], p["durationMs"].get("triggerExecution", 0) / 1000) for p in query.recentProgress],
    )

    report = verify(bootstrap, topics)
    assert report.ok, report.summary()
    assert report.orders == ORDERS
    final = BatchView(bootstrap, topics)
    assert not final.partial(), final.partial()
    assert HANG_BATCH in final.batches
    assert not open_transactions(bootstrap, prefix)
    watch.check()
    await_replicas_identical(bootstrap, [topics.orders, topics.category, topics.total], timeout=60)
    print(
        f"{len(final.batches)} batches in {time.monotonic() - started:.1f}s, {restarts} query restarts; "
        f"{watch.summary()}"
    )
