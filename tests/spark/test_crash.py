"""Crash tests: SIGKILL the Spark driver JVM and the broker while the orders pipeline runs.

The pipeline runs as a subprocess (``python -m exactly pipeline run``) so its JVM can be killed:
``spark-submit`` execs ``java``, a child of the pipeline process; we SIGKILL that java process,
then the whole process group (the Python driver and its Spark workers). After every crash the job
restarts from its checkpoint, and ``verify`` must pass at the end: every committed order counted
exactly once, no (batch, key) written twice, every update = previous total + its batch's delta.

Each phase starts a JVM (10-30 s), so these tests are few and bounded; they are marked slow.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import pytest

from exactly.spark.orders import create_topics, generate, verify
from tests.spark.pipeline_process import Pipeline, all_logs, catch_up, crash_topics

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_driver_sigkill_after_partial_sink_commit_and_at_random_points(
    fresh_broker: Any, tmp_path: Path
) -> None:
    broker = fresh_broker()
    bootstrap = broker.bootstrap
    topics = crash_topics("driver")
    create_topics(bootstrap, topics, partitions=3)
    generate(bootstrap, topics, 5000, txn_size=100, abort_every=4, seed=11)
    ckpt, hooks, log = tmp_path / "ckpt", tmp_path / "hooks", tmp_path / "logs"
    rng = random.Random()
    seed = rng.randrange(1 << 30)
    rng.seed(seed)
    print(f"random seed {seed}")

    # 1. batch 1: the first task to commit hangs after its commit, later ones hang before theirs
    #    (open transactions); kill the JVM then - sink committed, Spark's commit log not written.
    run = Pipeline(
        log, bootstrap, topics, ckpt, "--trigger", "processingTime:1s", "--max-offsets-per-trigger", "900",
        "--sink-option", f"testing.hookDir={hooks}", "--sink-option", "testing.hangBatch=1",
    )  # fmt: skip
    run.wait_until(lambda: any(hooks.glob("committed-1-*")), 240, "a committed task in batch 1")
    time.sleep(rng.uniform(0.0, 1.0))  # a random kill point (the fault), not a synchronisation
    run.kill_jvm()
    assert not (ckpt / "commits" / "1").exists(), "Spark committed batch 1 although a task never returned"
    committed = sorted(p.name for p in hooks.glob("committed-1-*"))
    print(f"killed with {committed} committed, {sorted(p.name for p in hooks.glob('paused-1-*'))} open")

    # 2. restart; kill the JVM again at a random point once it made progress
    run = Pipeline(
        log, bootstrap, topics, ckpt, "--trigger", "processingTime:1s", "--max-offsets-per-trigger", "700"
    )
    run.wait_until(lambda: run.batches_seen() >= 1, 240, "a micro-batch after the restart")
    time.sleep(rng.uniform(0.0, 2.5))  # a random kill point (the fault)
    run.kill_jvm()

    # 3. restart and catch up
    catch_up(log, bootstrap, topics, ckpt)
    report = verify(bootstrap, topics)
    assert report.ok, report.summary() + "\n" + all_logs(log)
    assert report.orders == 5000


def test_broker_kill9_mid_run(fresh_broker: Any, tmp_path: Path) -> None:
    broker = fresh_broker()
    topics = crash_topics("broker")
    create_topics(broker.bootstrap, topics, partitions=3)
    generate(broker.bootstrap, topics, 4000, txn_size=100, abort_every=5, seed=12)
    ckpt, log = tmp_path / "ckpt", tmp_path / "logs"
    bootstrap = broker.bootstrap
    run = Pipeline(
        log, bootstrap, topics, ckpt, "--trigger", "processingTime:1s", "--max-offsets-per-trigger", "500",
        "--until-caught-up", "--timeout", "240",
    )  # fmt: skip
    run.wait_until(lambda: run.batches_seen() >= 2, 240, "two micro-batches")
    time.sleep(random.uniform(0.0, 1.0))  # a random kill point (the fault)
    broker.kill()
    time.sleep(1.0)  # the outage the pipeline has to ride out
    broker.restart(same_port=True)
    assert broker.bootstrap == bootstrap
    code = run.finish(300)
    print(f"pipeline across the broker crash exited with {code}")
    if code != 0:  # the query may give up while the broker is down; restarting it is the recovery
        catch_up(log, bootstrap, topics, ckpt)
    report = verify(bootstrap, topics)
    assert report.ok, report.summary() + "\n" + all_logs(log)
    assert report.orders == 4000
