"""The plugin's fixtures and the context managers: configuration, several brokers, the shared
session broker, and teardown that leaves no process or directory behind, even after a failure."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

import exactly.testing
from exactly.testing.broker import Broker, child_env


def broker_config(bootstrap: str, name: str) -> str:
    """A broker config value as DescribeConfigs reports it."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ResourceType.BROKER, "0")
    return str(admin.describe_configs([resource])[resource].result(15)[name].value)


def auto_created_partitions(bootstrap: str, topic: str) -> int:
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, b"x")
    assert producer.flush(15) == 0
    return len(
        AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=15).topics[topic].partitions
    )


def process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.exactly_config({"num.partitions": 3})
def test_marker_configures_the_broker(exactly_broker):
    assert exactly_broker.config["num.partitions"] == "3"
    assert auto_created_partitions(exactly_broker.bootstrap_servers, "auto") == 3


def test_factory_starts_brokers_with_their_own_configs(exactly_broker_factory):
    one = exactly_broker_factory({"num.partitions": 2})
    two = exactly_broker_factory({"num.partitions": 5})
    assert one.bootstrap_servers != two.bootstrap_servers
    assert one.data_dir != two.data_dir
    assert auto_created_partitions(one.bootstrap_servers, "auto") == 2
    assert auto_created_partitions(two.bootstrap_servers, "auto") == 5


def test_session_broker_is_shared(exactly_broker_session, request):
    assert exactly_broker_session.running
    assert request.getfixturevalue("exactly_broker_session") is exactly_broker_session


def test_broker_can_be_killed_and_restarted_on_its_data(exactly_broker):
    bootstrap = exactly_broker.bootstrap_servers
    assert auto_created_partitions(bootstrap, "kept") == 1
    exactly_broker.kill()
    assert not exactly_broker.running
    exactly_broker.restart()
    assert exactly_broker.bootstrap_servers == bootstrap
    assert "kept" in AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=15).topics


def test_context_manager_cleans_up_after_an_exception():
    with pytest.raises(RuntimeError), exactly.testing.broker({"num.partitions": 4}) as b:
        pid, data_dir = b.launcher.pid, b.data_dir
        assert broker_config(b.bootstrap_servers, "num.partitions") == "4"
        raise RuntimeError("the test failed")
    assert pid is not None and process_gone(pid)
    assert not data_dir.parent.exists()


def test_context_manager_keeps_a_given_directory(tmp_path):
    with exactly.testing.broker(directory=tmp_path) as b:
        assert b.data_dir == tmp_path / "data"
    assert (tmp_path / "broker.log").exists()


def test_the_launcher_module_and_the_context_manager_share_a_name():
    """``exactly.testing.broker`` is the context manager; the launcher is still importable."""
    assert callable(exactly.testing.broker)
    assert Broker.__module__ == "exactly.testing.broker"
    assert sys.modules["exactly.testing.broker"].Broker is Broker


FAILING_TEST = textwrap.dedent(
    """
    import json, os

    def test_fails(exactly_broker, exactly_broker_factory):
        other = exactly_broker_factory()
        seen = [(b.launcher.pid, str(b.data_dir.parent)) for b in (exactly_broker, other)]
        with open(os.environ["EXACTLY_SEEN"], "w") as f:
            json.dump(seen, f)
        assert False, "this test fails on purpose"
    """
)


def test_a_failing_test_leaves_no_broker_or_directory_behind(tmp_path: Path):
    (tmp_path / "test_user.py").write_text(FAILING_TEST)
    seen_file = tmp_path / "seen.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "exactly.testing.pytest_plugin",
            "-p",
            "no:cacheprovider",
        ],
        cwd=tmp_path,
        env=child_env(extra={"EXACTLY_SEEN": str(seen_file)}),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "this test fails on purpose" in result.stdout
    assert "exactly broker log (tail)" in result.stdout  # the broker's log is in the report
    seen = json.loads(seen_file.read_text())
    assert len(seen) == 2
    for pid, directory in seen:
        assert process_gone(pid)
        assert not Path(directory).exists()
