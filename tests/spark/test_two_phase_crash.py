"""Crash tests of the two-phase sink (``atomicBatches=true``, KIP-939) with real kills.

The orders pipeline runs as a subprocess (see ``pipeline_process``) against a broker that allows
two-phase commit. The driver stops at an exact step of its ``commit`` (``testing.driverHang``
creates ``driver-<step>-<batch>`` in the hook dir and waits), and the test kills it there:

(a) SIGKILL of the driver between the tasks' prepare and the decision: the batch stays invisible
    while the driver is dead, and the restart aborts and rewrites it;
(b) SIGKILL between the recorded decision and the commits: still invisible; the restart commits
    the decided transactions (the replayed tasks find them) and never rewrites the batch;
(c) SIGKILL after the first of several commits: part of the batch may be visible while the
    driver is dead (the commit phase, cut short, lasts until the restart), no other batch is
    partly visible, and the restart completes it;
(d) kill -9 of the broker while the batch's transactions are prepared and undecided; they
    survive the broker's restart, and the resumed driver decides and commits them.

After the last run ``verify`` passes and every batch is whole: in every micro-batch the category
deltas add up to the total's delta, in both topics or in neither (all-or-nothing across
category-sales and total-sales). Four JVM starts in all; marked slow.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from exactly.spark.orders import Topics, create_topics, generate, verify
from exactly.testing.wait import wait_until
from tests.spark.batch_view import BatchView, open_transactions
from tests.spark.pipeline_process import Pipeline, all_logs, catch_up, crash_topics

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ORDERS = 2000  # 3-4 micro-batches of 700 offsets: each step needs one, the last one ends
# two shuffle partitions: one wave of tasks on local[2], still two transactions per batch (9 keys)
ATOMIC = ("--sink-option", "atomicBatches=true", "--shuffle-partitions", "2")
RUN = ("--trigger", "processingTime:1s", "--max-offsets-per-trigger", "700", *ATOMIC)


def _hang(
    log: Path, bootstrap: str, topics: Topics, ckpt: Path, hooks: Path, step: str, *args: str
) -> tuple[Pipeline, int]:
    """Start a run whose driver stops at ``step`` of its first new decision; wait until it does."""
    run = Pipeline(
        log, bootstrap, topics, ckpt, *RUN,
        "--sink-option", f"testing.hookDir={hooks}", "--sink-option", f"testing.driverHang={step}", *args,
    )  # fmt: skip
    run.wait_until(lambda: any(hooks.glob(f"driver-{step}-*")), 240, f"the driver stopping {step}")
    (marker,) = hooks.glob(f"driver-{step}-*")
    return run, int(marker.name.rsplit("-", 1)[1])


def test_driver_sigkill_at_each_commit_step_and_broker_kill9_while_prepared(
    fresh_broker: Any, tmp_path: Path
) -> None:
    broker = fresh_broker(**{"transaction.two.phase.commit.enable": "true"})
    bootstrap = broker.bootstrap
    topics = crash_topics("2pc")
    create_topics(bootstrap, topics, partitions=3)
    generate(bootstrap, topics, ORDERS, txn_size=100, abort_every=4, seed=21)
    ckpt, hooks, log = tmp_path / "ckpt", tmp_path / "hooks", tmp_path / "logs"
    sink_prefix = "orders-pipeline-"  # the pipeline's default transactional id prefix

    # (a) prepared, undecided: the driver dies; nothing of the batch is visible
    run, batch = _hang(log, bootstrap, topics, ckpt, hooks / "a", "before-decision")
    run.kill_jvm()
    prepared = open_transactions(bootstrap, sink_prefix)
    assert prepared, "no prepared transaction left by the killed driver"
    view = BatchView(bootstrap, topics)
    assert view.records.get(batch, 0) == 0, f"undecided batch {batch} visible: {view.records[batch]}"
    print(f"(a) killed before the decision of batch {batch}; open: {prepared}")

    # (b) decided, nothing committed: the driver dies; still nothing of the batch is visible
    run, batch = _hang(log, bootstrap, topics, ckpt, hooks / "b", "after-decision")
    run.kill_jvm()
    assert open_transactions(bootstrap, sink_prefix), "the decided transactions are not open"
    view = BatchView(bootstrap, topics)
    assert view.records.get(batch, 0) == 0, f"uncommitted batch {batch} visible: {view.records[batch]}"
    assert not view.partial(), view.partial()
    print(f"(b) killed after the decision of batch {batch}")

    # (c) the first of several commits done: the driver dies in the commit phase
    run, batch = _hang(log, bootstrap, topics, ckpt, hooks / "c", "mid-commit")
    run.kill_jvm()
    # one EndTxn went through, the rest is open (whether the committed part is visible yet depends
    # on the markers and on an open transaction holding the partition's LSO before it)
    assert open_transactions(bootstrap, sink_prefix), "no transaction left to commit"
    view = BatchView(bootstrap, topics)
    assert view.partial() == [p for p in view.partial() if p.startswith(f"batch {batch}:")]
    mid_commit = batch
    print(f"(c) killed in the commit phase of batch {batch}: {view.records[batch]} records visible")

    # (d) prepared, undecided: kill -9 the broker; the transactions survive its restart
    run, batch = _hang(
        log, bootstrap, topics, ckpt, hooks / "d", "before-decision", "--until-caught-up", "--timeout", "240"
    )
    prepared = open_transactions(bootstrap, sink_prefix)
    assert prepared
    broker.kill()
    broker.restart(same_port=True)
    assert broker.bootstrap == bootstrap
    wait_until(  # the restarted coordinator loads its log first
        lambda: open_transactions(bootstrap, sink_prefix) == prepared,
        60,
        "the prepared transactions back after the broker restart",
        describe=lambda: open_transactions(bootstrap, sink_prefix),
    )
    view = BatchView(bootstrap, topics)
    assert view.records.get(batch, 0) == 0, f"undecided batch {batch} visible after the broker restart"
    assert not view.partial(), f"{view.partial()} (batch {mid_commit} was cut in its commit phase)"
    (hooks / "d" / "driver-resume").touch()
    code = run.finish(300)
    print(f"(d) broker killed with {prepared} prepared in batch {batch}; the run exited with {code}")
    if code != 0:  # the query may give up on the broker outage; restarting it is the recovery
        catch_up(log, bootstrap, topics, ckpt, *ATOMIC)

    report = verify(bootstrap, topics)
    assert report.ok, report.summary() + "\n" + all_logs(log)
    assert report.orders == ORDERS
    view = BatchView(bootstrap, topics)
    assert not view.partial(), "\n".join(view.partial()) + "\n" + all_logs(log)
    assert not open_transactions(bootstrap, sink_prefix)
