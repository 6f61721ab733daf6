"""`exactly cluster`: ZooKeeper + N brokers on loopback, the bootstrap servers printed, a clean stop
on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from exactly.cluster.zookeeper import JAVA_DIR
from tests.cluster.helpers import wait_for

pytestmark = pytest.mark.skipif(
    not (JAVA_DIR / "zookeeper.jar").exists(), reason="Debian's zookeeper package is not installed"
)


@pytest.mark.slow
def test_exactly_cluster_serves_three_brokers_and_stops_on_sigterm(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "exactly", "cluster", "--brokers", "3", "--data-dir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline().strip() for _ in range(2)]
        assert lines[0].startswith("zookeeper 127.0.0.1:"), lines
        assert lines[1].startswith("bootstrap servers: "), lines
        servers = lines[1].split(": ", 1)[1].split(",")
        assert len(servers) == 3 and all(s.startswith("127.0.0.1:") for s in servers)
        admin = AdminClient({"bootstrap.servers": servers[0]})
        wait_for(lambda: sorted(admin.list_topics(timeout=5).brokers) == [0, 1, 2], what="three brokers")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        for i in range(3):
            assert "shutdown complete" in (tmp_path / f"broker-{i}.log").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
