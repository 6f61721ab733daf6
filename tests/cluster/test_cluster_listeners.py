"""A cluster with two listeners: PLAINTEXT for the brokers' own traffic (inter.broker.listener.name)
and SASL_PLAINTEXT for clients. Replication keeps working over the inter-broker listener, and a
client that came in on SASL_PLAINTEXT is sent to every broker's SASL_PLAINTEXT endpoint."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from exactly.cluster.zk import ClusterZk
from exactly.testing.broker import child_env
from exactly.testing.wait import wait_until
from tests.cluster.helpers import await_replicas_identical, bootstrap, running_cluster
from tests.support.broker import Broker

pytestmark = pytest.mark.timeout(180)

JAAS = (
    "org.apache.kafka.common.security.plain.PlainLoginModule required "
    'username="admin" password="admin-pw" user_admin="admin-pw";'
)


@pytest.fixture
def cluster(zk_connect: str, tmp_path: Path) -> Iterator[list[Broker]]:
    yield from running_cluster(
        zk_connect,
        tmp_path,
        count=2,
        **{
            "listeners": "PLAINTEXT://127.0.0.1:0,CLIENT://127.0.0.1:0",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CLIENT:SASL_PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-512",
            "listener.name.client.plain.sasl.jaas.config": JAAS,
            "offsets.topic.replication.factor": "2",
            "transaction.state.log.replication.factor": "2",
            "transaction.state.log.min.isr": "1",
        },
    )


def test_replication_over_the_inter_broker_listener_and_clients_on_theirs(
    cluster: list[Broker], topic: str
) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap(cluster)})
    admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=2)])[topic].result(30)
    client = {
        "bootstrap.servers": ",".join(b.listener_address("CLIENT") for b in cluster),
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "admin",
        "sasl.password": "admin-pw",
    }
    md = AdminClient(client).list_topics(timeout=15)
    assert sorted(b.port for b in md.brokers.values()) == sorted(b.listener_ports["CLIENT"] for b in cluster)
    p = Producer({**client, "acks": "all", "enable.idempotence": True})
    for i in range(40):
        p.produce(topic, f"v{i}".encode(), partition=i % 2)
    assert p.flush(30) == 0
    await_replicas_identical(bootstrap(cluster), [topic])
    c = Consumer({**client, "group.id": f"g-{topic}", "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    got: list[bytes] = []
    for _ in range(60):
        for m in c.consume(40 - len(got), 0.5):
            if m.error() is None:
                got.append(m.value())
        if len(got) >= 40:
            break
    c.close()
    assert sorted(got) == sorted(f"v{i}".encode() for i in range(40))


def _scram_works(broker: Broker, password: str) -> bool:
    conf = {
        "bootstrap.servers": broker.listener_address("CLIENT"),
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "alice",
        "sasl.password": password,
        "error_cb": lambda e: None,
    }
    try:
        return bool(AdminClient(conf).list_topics(timeout=3).brokers)
    except Exception:
        return False


def test_scram_credentials_live_in_zookeeper_for_every_broker(cluster: list[Broker], zk: ClusterZk) -> None:
    """A user added through one broker authenticates on the other (ZooKeeper's /config/users in
    Kafka's format, watched by every broker); a deletion reaches every broker too."""

    def users(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "exactly", "users", *args, "--bootstrap-server", cluster[0].bootstrap],
            input=stdin,
            capture_output=True,
            text=True,
            env=child_env(),
            timeout=60,
        )

    done = users("add", "alice", "--password-stdin", "--mechanism", "SCRAM-SHA-512", stdin="alice-pw\n")
    assert done.returncode == 0, done.stderr
    data, _stat = zk.client.get("/config/users/alice")
    node = json.loads(data)
    assert node["version"] == 1
    assert (
        node["config"]["SCRAM-SHA-512"].startswith("salt=")
        and "iterations=4096" in node["config"]["SCRAM-SHA-512"]
    )
    assert "alice-pw" not in data.decode()
    assert any(c.startswith("config_change_") for c in zk.client.get_children("/config/changes"))
    wait_until(lambda: _scram_works(cluster[1], "alice-pw"), 20, "alice to authenticate on broker 1")
    assert not _scram_works(cluster[1], "wrong")
    listing = users("list")
    assert any(line.split() == ["alice", "SCRAM-SHA-512", "4096"] for line in listing.stdout.splitlines())
    assert users("delete", "alice").returncode == 0
    assert zk.client.exists("/config/users/alice") is None
    wait_until(lambda: not _scram_works(cluster[1], "alice-pw"), 20, "alice to be gone on broker 1")
