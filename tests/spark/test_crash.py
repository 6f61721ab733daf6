"""Crash tests: SIGKILL the Spark driver JVM and the broker while the orders pipeline runs.

The pipeline runs as a subprocess (``python -m exactly pipeline run``) so its JVM can be killed:
``spark-submit`` execs ``java``, a child of the pipeline process; we SIGKILL that java process,
then the whole process group (the Python driver and its Spark workers). After every crash the job
restarts from its checkpoint, and ``verify`` must pass at the end: every committed order counted
exactly once, no (batch, key) written twice, every update = previous total + its batch's delta.

Each phase starts a JVM (10-30 s), so these tests are few and bounded; they are marked slow.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from exactly.spark.orders import Topics, create_topics, generate, verify
from exactly.testing.wait import wait_until
from tests.support.broker import child_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

PROGRESS = re.compile(r"^batch (\d+): (\d+) orders")


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


class Pipeline:
    """``exactly pipeline run`` in its own process group, output in its own log file."""

    runs = 0

    def __init__(self, logs: Path, bootstrap: str, topics: Topics, ckpt: Path, *args: str) -> None:
        Pipeline.runs += 1
        logs.mkdir(parents=True, exist_ok=True)
        self.log = log = logs / f"run-{Pipeline.runs}.log"
        env = child_env()
        prefix = topics.orders[: -len("order-completed")]
        cmd = [
            sys.executable, "-m", "exactly", "pipeline", "run", "--bootstrap-server", bootstrap,
            "--topic-prefix", prefix, "--checkpoint", str(ckpt), "--master", "local[2]",
            "--shuffle-partitions", "4", *args,
        ]  # fmt: skip
        with log.open("a") as out:
            out.write(f"=== {' '.join(cmd)}\n")
        self.proc = subprocess.Popen(
            cmd, stdout=log.open("a"), stderr=subprocess.STDOUT, env=env, start_new_session=True
        )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def batches_seen(self) -> int:
        return sum(1 for line in self.text().splitlines() if PROGRESS.match(line))

    def wait_until(self, check: Any, timeout: float, what: str) -> None:
        """``check()`` within ``timeout``; fails at once if the pipeline exits first."""

        def done() -> bool:
            if check():
                return True
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"pipeline exited ({self.proc.returncode}) before {what}:\n{self.text()[-4000:]}"
                )
            return False

        wait_until(done, timeout, what, describe=lambda: self.text()[-4000:])

    def kill_jvm(self) -> int:
        """SIGKILL the driver JVM, then everything else the pipeline started. Returns the JVM pid."""

        def jvms() -> list[int]:
            found = [pid for pid in _descendants(self.proc.pid) if _comm(pid) == "java"]
            if not found and self.proc.poll() is not None:
                raise AssertionError(f"pipeline exited ({self.proc.returncode}):\n{self.text()[-4000:]}")
            return found

        javas = wait_until(jvms, 30, f"a java process under pipeline pid {self.proc.pid}")
        for pid in javas:
            os.kill(pid, signal.SIGKILL)
        self.kill_all()
        return javas[0]

    def kill_all(self) -> None:
        if self.proc.poll() is None or _descendants(self.proc.pid):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(30)

    def finish(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill_all()
            raise AssertionError(
                f"pipeline did not finish within {timeout}s:\n{self.text()[-4000:]}"
            ) from None


def _topics(tag: str) -> Topics:
    return Topics.with_prefix(f"crash-{tag}-{random.randrange(16**6):06x}-")


def _logs(logs: Path) -> str:
    return "".join(
        p.read_text(errors="replace") for p in sorted(logs.glob("run-*.log"), key=lambda p: p.stat().st_mtime)
    )[-6000:]


def _catch_up(log: Path, bootstrap: str, topics: Topics, ckpt: Path) -> None:
    final = Pipeline(
        log, bootstrap, topics, ckpt, "--trigger", "availableNow", "--max-offsets-per-trigger", "2000"
    )
    code = final.finish(300)
    assert code == 0, final.text()[-4000:]


def test_driver_sigkill_after_partial_sink_commit_and_at_random_points(
    fresh_broker: Any, tmp_path: Path
) -> None:
    broker = fresh_broker()
    bootstrap = broker.bootstrap
    topics = _topics("driver")
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
    _catch_up(log, bootstrap, topics, ckpt)
    report = verify(bootstrap, topics)
    assert report.ok, report.summary() + "\n" + _logs(log)
    assert report.orders == 5000


def test_broker_kill9_mid_run(fresh_broker: Any, tmp_path: Path) -> None:
    broker = fresh_broker()
    topics = _topics("broker")
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
        _catch_up(log, bootstrap, topics, ckpt)
    report = verify(bootstrap, topics)
    assert report.ok, report.summary() + "\n" + _logs(log)
    assert report.orders == 4000
