"""A single broker's start imports neither the cluster mode (kazoo, the ZooKeeper-backed replica
manager) nor the Prometheus client: they are most of what a broker start could skip, and the
pytest fixture's start-up target (bench/fixture_startup.py) depends on it. Each case runs in a
fresh interpreter, since this test process has imported everything already."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.broker import child_env

CLUSTER_AND_METRICS = (
    "kazoo",
    "prometheus_client",
    "exactly.cluster.zk",
    "exactly.server.replica_manager",
    "exactly.server.controlled_shutdown",
    "exactly.server.prometheus",
)

OPEN_A_BROKER = """
import asyncio, json, sys
from pathlib import Path
sys.modules["hypothesis"] = None  # as `exactly serve` does
import exactly.cli.main, exactly.cli.serve
from exactly.server.broker import Broker
from exactly.server.config import BrokerConfig

overrides = json.loads(sys.argv[2])
config = BrokerConfig.load(None, {"listeners": "PLAINTEXT://127.0.0.1:0", **overrides})

async def main():
    broker = Broker.open(config, Path(sys.argv[1]))
    await broker.start()
    await broker.shutdown()

asyncio.run(main())
print(json.dumps(sorted(m for m in %r if m in sys.modules)))
"""


def loaded(tmp_path: Path, overrides: dict[str, str]) -> list[str]:
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            OPEN_A_BROKER % (CLUSTER_AND_METRICS,),
            str(tmp_path / "data"),
            json.dumps(overrides),
        ],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return list(json.loads(proc.stdout.splitlines()[-1]))


def test_a_single_broker_imports_no_cluster_and_no_prometheus_client(tmp_path: Path) -> None:
    assert loaded(tmp_path, {}) == []


def test_metrics_port_brings_the_prometheus_endpoint(tmp_path: Path) -> None:
    assert loaded(tmp_path, {"metrics.port": "0"}) == ["exactly.server.prometheus", "prometheus_client"]
