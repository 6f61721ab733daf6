"""The harness's pure parts: config values as the broker's strings, why a cluster cannot start,
and the error a cluster wait that runs out raises (no broker runs in these tests)."""

from __future__ import annotations

from pathlib import Path

import pytest

from exactly.testing import harness
from exactly.testing.broker import Broker
from exactly.testing.wait import WaitTimeout


def test_config_values_become_the_brokers_strings():
    assert harness.config_strings({"auto.create.topics.enable": False, "num.partitions": 3}) == {
        "auto.create.topics.enable": "false",
        "num.partitions": "3",
    }
    assert harness.config_strings(None) == {}


def test_cluster_defaults_are_capped_at_the_broker_count():
    one = harness.cluster_defaults(1)
    assert one["transaction.state.log.replication.factor"] == "1"
    assert one["min.insync.replicas"] == "1"
    assert harness.cluster_defaults(3)["min.insync.replicas"] == "2"


def test_missing_zookeeper_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setattr(harness, "JAVA_DIR", tmp_path)
    reason = harness.zookeeper_missing()
    assert reason is not None and "zookeeper.jar" in reason
    monkeypatch.setattr(harness.shutil, "which", lambda _name: None)
    assert "java is not installed" in (harness.zookeeper_missing() or "")


def test_a_cluster_wait_that_runs_out_is_a_timeout_error_and_a_failed_expectation(tmp_path: Path):
    handle = harness.ClusterHandle(tmp_path, 1, {})  # nothing started: no broker answers
    with pytest.raises(TimeoutError, match="a leader of orders-0 other than 1") as leader:
        handle.wait_for_leader("orders", not_on=1, timeout=0.2)
    handle.launchers = [Broker(tmp_path / "broker-0", tmp_path / "broker-0.log")]
    with pytest.raises(TimeoutError, match="broker 0 to be unregistered") as restart:
        handle.restart(0, timeout=0.2)
    for raised in (leader.value, restart.value):
        assert isinstance(raised, harness.ClusterTimeout)
        assert isinstance(raised, WaitTimeout)
