"""A cluster with two listeners: PLAINTEXT for the brokers' own traffic (inter.broker.listener.name)
and SASL_PLAINTEXT for clients. Replication keeps working over the inter-broker listener, and a
client that came in on SASL_PLAINTEXT is sent to every broker's SASL_PLAINTEXT endpoint."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

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
            "sasl.enabled.mechanisms": "PLAIN",
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
