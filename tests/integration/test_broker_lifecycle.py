"""The `exactly serve` process contract: listening line, bound-address file, signals, restarts."""

from __future__ import annotations

import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.broker import LISTEN_PREFIX, SRC_DIR, Broker, serve_command
from tests.support.clients import admin, consume, create_topic, produce_values

pytestmark = pytest.mark.timeout(60)


def test_listening_line_and_bound_address(fresh_broker: Any) -> None:
    b: Broker = fresh_broker()
    text = b.log_text()
    lines = [line for line in text.splitlines() if line.startswith(LISTEN_PREFIX)]
    assert lines == [f"{LISTEN_PREFIX}{b.host}:{b.port}"]
    assert (b.data_dir / "bound-address").read_text().strip() == f"{b.host}:{b.port}"
    with socket.create_connection((b.host, b.port or 0), timeout=5):
        pass


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_is_a_clean_shutdown(fresh_broker: Any, topic: str, sig: signal.Signals) -> None:
    b: Broker = fresh_broker()
    create_topic(b.bootstrap, topic)
    produce_values(b.bootstrap, topic, [b"a", b"b"])
    proc = b._proc
    assert proc is not None
    proc.send_signal(sig)
    assert proc.wait(20) == 0
    b.start()
    assert [g.value for g in consume(b.bootstrap, topic, 2)] == [b"a", b"b"]


def test_restart_on_same_port(fresh_broker: Any, topic: str) -> None:
    b: Broker = fresh_broker()
    port = b.port
    create_topic(b.bootstrap, topic)
    b.restart(same_port=True, clean=False)
    assert b.port == port
    assert topic in admin(b.bootstrap).list_topics(timeout=10).topics


def test_config_file_and_overrides(fresh_broker: Any, tmp_path: Path, topic: str) -> None:
    config = tmp_path / "server.properties"
    config.write_text("# comment\nnum.partitions=4\nauto.create.topics.enable=true\n")
    b: Broker = fresh_broker(config_file=config)
    produce_values(b.bootstrap, topic, [b"x"], partition=3)
    assert sorted(admin(b.bootstrap).list_topics(timeout=10).topics[topic].partitions) == [0, 1, 2, 3]
    # -o wins over the file
    b2: Broker = fresh_broker(config_file=config, **{"num.partitions": "2"})
    produce_values(b2.bootstrap, topic, [b"x"], partition=1)
    assert sorted(admin(b2.bootstrap).list_topics(timeout=10).topics[topic].partitions) == [0, 1]


def test_second_broker_on_same_data_dir_or_port_fails_cleanly(fresh_broker: Any) -> None:
    b: Broker = fresh_broker()
    proc = subprocess.run(
        serve_command(b.data_dir.parent / "other", f"127.0.0.1:{b.port}"),
        capture_output=True,
        timeout=30,
        env={"PYTHONPATH": str(SRC_DIR), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode != 0
    assert b"Traceback" not in proc.stderr, proc.stderr.decode()[-2000:]
    assert b.running
