"""A short cluster chaos pass: two fixed seeds of ``tests.chaos.run --cluster 3`` (three brokers
on the session ZooKeeper, RF 3, min ISR 2; brokers killed and bounced, a leader SIGSTOPped past
its session timeout, the transaction coordinator crashed after PrepareCommit, a broker isolated).
The checker must find 0 anomalies and the replicas must end byte-identical.
``python -m tests.chaos.run --cluster 3 --seeds 1..50`` is the long one."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.cluster_runner import CLUSTER_FAULTS, run_cluster
from tests.chaos.runner import ChaosConfig
from tests.cluster.conftest import zk_connect, zookeeper  # noqa: F401  (the session ZooKeeper fixtures)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

SEEDS = [201, 202]


@pytest.mark.parametrize("seed", SEEDS)
def test_cluster_chaos_seed_has_no_anomalies(seed: int, zk_connect: str, tmp_path: Path) -> None:  # noqa: F811
    cfg = ChaosConfig(
        seed=seed, workdir=tmp_path / f"seed-{seed}", duration=15.0, faults=dict(CLUSTER_FAULTS)
    )
    result = run_cluster(cfg, zk_connect, keep=True)
    print(f"seed {seed}: faults {result.faults}: {result.report.summary()}")
    assert result.faults, "no fault was injected"
    # the cluster faults block the coordinators for seconds each (a stopped broker stays in the
    # ISR until its session expires), so a 15 s round may commit only a few transactions
    assert result.report.stats["acked"] > 100 and result.report.stats["committed"] >= 1, result.report.stats
    assert result.ok, (
        f"cluster chaos seed {seed} found anomalies (history kept in {result.workdir}; reproduce with "
        f"`python -m tests.chaos.run --cluster 3 --runs 1 --seed {seed}`):\n{result.report.summary()}"
    )
