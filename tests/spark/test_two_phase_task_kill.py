"""A write task killed with SIGKILL after it prepared its transaction (two-phase sink, KIP-939).

The orders pipeline runs on the session's SparkSession (``local[2,4]``: a failed task is retried)
against a broker that allows two-phase commit. In local mode a "task" is the Python worker that
runs the sink's ``write`` for one Spark partition (the executor is the driver's own JVM, whose
death is the driver-kill case of test_two_phase_crash.py). ``testing.taskHang`` makes the first
task of micro-batch ``HANG_BATCH`` to prepare write its process id to the hook dir and stop before
its commit message reaches the driver; the test then SIGKILLs exactly that process.

What must follow: the transaction the dead worker prepared is invisible while it waits, Spark
retries the task, the retried attempt's ``init_transactions`` (same transactional id) bumps the
epoch and aborts the dead attempt's transaction, the retry writes and prepares the batch again,
and the driver commits the batch once. A read_uncommitted reader sees the dead attempt's records
(they reached the log), a read_committed reader never does; ``verify`` passes, and a reader
watching the outputs the whole time never sees a batch in part outside its commit phase.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from exactly.client.broker_pool import BrokerPool
from exactly.client.two_phase import PreparedTxn
from exactly.client.txn_admin import describe_one
from exactly.spark.orders import Topics, create_topics, generate, verify
from exactly.spark.pipeline import start
from exactly.spark.two_phase import TWO_PHASE_COMMIT_TIMEOUT_MS
from exactly.testing.wait import wait_until
from tests.spark.batch_view import BatchView, PartialWatch, open_transactions
from tests.spark.helpers import hung_two_phase_job, read_all

# ``spark`` is the session's one SparkSession (tests/conftest.py)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ORDERS = 1200
HANG_BATCH = 1  # batch 0 is committed before, later batches after the kill


def _held(bootstrap: str, txn_id: str) -> tuple[str, PreparedTxn, int]:
    with BrokerPool.connect(bootstrap, timeout=30) as pool:
        state = describe_one(pool, txn_id)
    held = PreparedTxn(txn_id, state.producer_id, state.producer_epoch)
    return state.transaction_state, held, state.transaction_timeout_ms


def _batch_records(bootstrap: str, topics: Topics, *, committed: bool) -> Counter[int]:
    """Records per micro-batch in both output topics (read_committed or read_uncommitted)."""
    seen: Counter[int] = Counter()
    for topic, partitions in ((topics.category, 3), (topics.total, 1)):  # as create_topics makes them
        for got in read_all(bootstrap, topic, range(partitions), committed=committed):
            seen[int(got.value.split(b'"batch":', 1)[1].split(b",", 1)[0])] += 1
    return seen


def test_task_sigkilled_after_prepare_is_retried_and_the_batch_commits_once(
    spark: Any, fresh_broker: Any, tmp_path: Path
) -> None:
    bootstrap = fresh_broker(**{"transaction.two.phase.commit.enable": "true"}).bootstrap
    tag = f"{random.randrange(16**6):06x}"
    topics = Topics.with_prefix(f"task-kill-{tag}-")
    create_topics(bootstrap, topics, partitions=3)
    generate(bootstrap, topics, ORDERS, txn_size=100, abort_every=4, seed=5)
    prefix = f"task-kill-{tag}"
    config, hooks = hung_two_phase_job(
        bootstrap, tmp_path, topics, prefix, hang_batch=HANG_BATCH, max_offsets=300
    )
    watch = PartialWatch(bootstrap, topics)
    watch.start()
    started = time.monotonic()
    query = start(spark, config)
    try:

        def hung() -> list[Path]:
            assert query.isActive, f"the query ended before the hang: {query.exception()}"
            return sorted(hooks.glob(f"task-prepared-{HANG_BATCH}-*"))

        (ready,) = wait_until(hung, 180, f"a task of batch {HANG_BATCH} hanging after its prepare")
        print(f"{time.monotonic() - started:.1f}s: hung {ready.name}")
        partition, pid = int(ready.name.rsplit("-", 1)[1]), int(ready.read_text())
        txn_id = f"{prefix}-{query.id}-{partition}"
        state, dead, timeout_ms = _held(bootstrap, txn_id)
        assert (state, timeout_ms) == ("Ongoing", TWO_PHASE_COMMIT_TIMEOUT_MS), (state, timeout_ms)

        # quiet: the task hangs before the driver's commit, so nothing may be seen in part
        watch.quiet(True)
        seen = watch.stable
        wait_until(lambda: watch.stable > seen, 60, "a stable view of the outputs while the task hangs")
        watch.quiet(False)
        view = BatchView(bootstrap, topics)
        assert view.records.get(HANG_BATCH, 0) == 0, f"batch {HANG_BATCH} visible before its decision"
        assert sorted(view.batches) == list(range(HANG_BATCH)), sorted(view.batches)

        os.kill(pid, signal.SIGKILL)
        print(
            f"{time.monotonic() - started:.1f}s: "
            f"killed the Python worker {pid} of partition {partition} holding {dead}"
        )
        assert query.awaitTermination(240), "the query did not finish within 240 s"
        assert query.exception() is None, query.exception()
    finally:
        if query.isActive:
            query.stop()
        watch.stop()
    print(
        "batch durations (s):",
        [(p["batchId"], p["durationMs"].get("triggerExecution", 0) / 1000) for p in query.recentProgress],
    )
    elapsed = time.monotonic() - started

    # the retried attempt fenced the dead one (a later epoch of the same id) and its batch is in
    state, last, _ = _held(bootstrap, txn_id)
    assert state == "CompleteCommit", state
    assert (last.producer_id, last.producer_epoch > dead.producer_epoch) == (dead.producer_id, True), (
        dead,
        last,
    )
    assert not open_transactions(bootstrap, prefix)
    committed = _batch_records(bootstrap, topics, committed=True)
    uncommitted = _batch_records(bootstrap, topics, committed=False)
    assert uncommitted[HANG_BATCH] > committed[HANG_BATCH] > 0, (uncommitted, committed)
    assert {b: n for b, n in uncommitted.items() if b != HANG_BATCH} == {
        b: n for b, n in committed.items() if b != HANG_BATCH
    }, "only the killed attempt wrote records that are not committed"

    report = verify(bootstrap, topics)
    assert report.ok, report.summary()
    assert report.orders == ORDERS
    assert not BatchView(bootstrap, topics).partial()
    watch.check()
    print(f"{len(committed)} batches in {elapsed:.1f}s; {watch.summary()}")
