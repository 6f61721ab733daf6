"""The orders pipeline scaled out: ``exactly pipeline run --master spark://...`` on a Spark standalone
cluster (a master and two workers from the installed PySpark's launcher, tests/spark/standalone.py)
against a three-broker ``exactly`` cluster on the run's shared ZooKeeper, in atomic two-phase mode.

What it proves beyond the local[*] tests: the executors are separate JVMs, started by the workers
without the source tree on their PYTHONPATH, so their Python workers import ``exactly`` only from
the zip the driver ships (``addPyFile``); each worker's executor ran tasks (it fetched that zip,
which Spark does when it launches a task there); the sink ran with ``atomicBatches=true`` (which
fails the job where the brokers do not allow two-phase commit); ``verify`` passes.

The standalone cluster is started once per test session and shut down with its whole process tree.
The test does not use the session's in-process SparkSession (its driver is the pipeline's
subprocess), so it is not in the Spark xdist group: either worker may run it
(tests/support/scheduling.py).
"""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from exactly.cli.local_cluster import replicated_defaults
from exactly.spark.orders import Topics, create_topics, generate, verify
from tests.cluster.conftest import zk_connect, zookeeper  # the run's shared ZooKeeper (fixtures)
from tests.cluster.helpers import running_cluster
from tests.spark.standalone import StandaloneCluster
from tests.support.broker import Broker, child_env

__all__ = ["zk_connect", "zookeeper"]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ORDERS = 1200  # two micro-batches at 600 per trigger: state carried from one to the next


@pytest.fixture(scope="session")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    pytest.importorskip("pyspark")
    if shutil.which("java") is None:
        pytest.skip("java is not installed (make system-deps)")
    cluster = StandaloneCluster(tmp_path_factory.mktemp("spark-standalone"), workers=2, cores=1, memory="1g")
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.close()
    assert not cluster.leftover_groups(), "Spark daemons (or their executors) outlived close()"


@pytest.fixture
def brokers(zk_connect: str, tmp_path: Path) -> Iterator[list[Broker]]:
    config = {**replicated_defaults(3), "transaction.two.phase.commit.enable": "true"}
    yield from running_cluster(zk_connect, tmp_path / "brokers", **config)


def test_orders_pipeline_on_a_standalone_cluster_in_two_phase_mode(
    standalone: StandaloneCluster, brokers: list[Broker], tmp_path: Path
) -> None:
    bootstrap = ",".join(b.bootstrap for b in brokers)
    prefix = f"sa-{random.randrange(16**6):06x}-"
    topics = Topics.with_prefix(prefix)
    create_topics(bootstrap, topics, partitions=3)
    made = generate(bootstrap, topics, ORDERS, txn_size=100, abort_every=4, seed=5)
    assert made.committed == ORDERS and made.aborted > 0
    before = standalone.app_ids()

    command = [
        *(sys.executable, "-m", "exactly", "pipeline", "run", "--quiet"),
        *("--bootstrap-server", bootstrap, "--topic-prefix", prefix),
        *("--checkpoint", str(tmp_path / "checkpoint"), "--master", standalone.url),
        *("--max-offsets-per-trigger", "600", "--shuffle-partitions", "2"),
        *("--transactional-id-prefix", f"sa-{topics.orders}"),
        *("--spark-conf", "spark.executor.memory=512m", "--spark-conf", "spark.executor.cores=1"),
        *("--spark-conf", "spark.cores.max=2"),
        *("--sink-option", "atomicBatches=true"),
    ]
    proc = subprocess.run(command, capture_output=True, text=True, env=child_env(), timeout=800)
    output = f"{proc.stdout}\n{proc.stderr[-6000:]}"
    assert proc.returncode == 0, f"pipeline run -> {proc.returncode}:\n{output}\n{standalone.log_tail()}"
    assert f"master {standalone.url}" in proc.stdout
    assert f"pipeline finished: {ORDERS} orders in " in proc.stdout, output

    apps = standalone.app_ids() - before
    assert len(apps) == 1, apps
    executors = standalone.executor_dirs(apps.pop())
    for worker, dirs in executors.items():
        assert len(dirs) == 1, f"worker {worker}: {dirs}"
        # fetched by the executor when it was first given a task; its Python workers import it
        assert (dirs[0] / "exactly.zip").is_file(), f"worker {worker}'s executor ran no task"

    report = verify(bootstrap, topics)
    assert report.ok, report.summary()
    assert report.orders == ORDERS
    assert report.batches >= 2, report.summary()
