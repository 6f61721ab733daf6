"""``exactly pipeline generate`` + ``exactly pipeline run`` as a user runs them: the results on
stdout, the progress (orders so far and their rate) on stderr, none of it with --quiet."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.support.broker import Broker, child_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # two pipeline JVMs: about 90 s


def exactly(*args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "exactly", *args], capture_output=True, text=True, env=child_env(), timeout=500
    )
    assert proc.returncode == 0, f"exactly {' '.join(args)} -> {proc.returncode}:\n{proc.stderr[-4000:]}"
    return proc


def test_pipeline_run_reports_progress_on_stderr(broker: Broker, tmp_path: Path) -> None:
    common = ("--bootstrap-server", broker.bootstrap, "--topic-prefix", f"cli-{uuid.uuid4().hex[:8]}-")
    exactly("pipeline", "generate", "--orders", "400", "--txn-size", "100", "--quiet", *common)
    run = ("pipeline", "run", "--checkpoint", str(tmp_path / "ckpt"), "--master", "local[2]", *common)
    proc = exactly(*run, "--max-offsets-per-trigger", "200")
    assert "pipeline finished: 400 orders in " in proc.stdout
    assert "pipeline run: " not in proc.stdout
    last = [line for line in proc.stderr.splitlines() if line.startswith("pipeline run: ")][-1]
    assert last.startswith("pipeline run: 400 orders, ") and "orders/s" in last and "done in" in last, last

    exactly("pipeline", "generate", "--orders", "100", "--first-order-id", "400", "--quiet", *common)
    again = exactly(*run, "--quiet")
    assert "pipeline finished: 100 orders in " in again.stdout
    assert "pipeline run: " not in again.stderr
