"""`exactly zookeeper`: serves on loopback only, prints its address, stops on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from exactly.cluster.zookeeper import JAVA_DIR, ZooKeeperAddress, four_letter_word

pytestmark = pytest.mark.skipif(
    not (JAVA_DIR / "zookeeper.jar").exists(), reason="Debian's zookeeper package is not installed"
)


@pytest.mark.slow
def test_exactly_zookeeper_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "exactly", "zookeeper", "--data-dir", str(tmp_path), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line.startswith("zookeeper listening on 127.0.0.1:"), line
        port = int(line.rsplit(":", 1)[1])
        assert "Mode: standalone" in four_letter_word(ZooKeeperAddress("127.0.0.1", port), "srvr")
        config = (tmp_path / "zoo.cfg").read_text()
        assert "clientPortAddress=127.0.0.1" in config and "admin.enableServer=false" in config
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        with pytest.raises(OSError):
            four_letter_word(ZooKeeperAddress("127.0.0.1", port), "srvr")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
