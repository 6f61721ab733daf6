"""A short chaos pass for CI: a few fixed seeds of tests/chaos/run.py (about 25-35 s each), every
fault kind in the mix; the checker must find 0 anomalies. ``make chaos RUNS=50`` is the long one."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.runner import ChaosConfig, run_one

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

SEEDS = [101, 102, 103]


@pytest.mark.parametrize("seed", SEEDS)
def test_chaos_seed_has_no_anomalies(seed: int, tmp_path: Path) -> None:
    result = run_one(ChaosConfig(seed=seed, workdir=tmp_path / f"seed-{seed}", duration=15.0), keep=True)
    print(f"seed {seed}: faults {result.faults}: {result.report.summary()}")
    assert result.faults, "no fault was injected"
    assert result.report.stats["acked"] > 200 and result.report.stats["committed"] > 10, result.report.stats
    assert result.ok, (
        f"chaos seed {seed} found anomalies (history kept in {result.workdir}; reproduce with "
        f"`python -m tests.chaos.run --runs 1 --seed {seed}`):\n{result.report.summary()}"
    )
