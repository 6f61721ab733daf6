"""The harness's pure parts: config values as the broker's strings, and why a cluster cannot start."""

from __future__ import annotations

from pathlib import Path

import pytest

from exactly.testing import harness


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
