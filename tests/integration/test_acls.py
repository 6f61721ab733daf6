"""ACLs against the real broker with real clients, all connecting as ``User:ANONYMOUS`` (no
authentication on a PLAINTEXT listener): refused without the ACL, served after
``AdminClient.create_acls`` / ``exactly acls --add`` without a restart, refused again after
``delete_acls``; ACLs survive a restart; ``exactly txn abort`` needs WRITE on the id.

The broker starts with ``authorizer.class.name`` set and a data directory provisioned with one
binding, ``User:ANONYMOUS`` ALTER + DESCRIBE on the cluster (so these tests may manage ACLs), the
way an operator seeds the first administrator; everything else goes through the ACL APIs.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from exactly.security import acl
from exactly.security.acl_store import ACL_FILE, AclStore
from exactly.security.authorizer import Authorizer, AuthorizerConfig
from tests.support.broker import Broker, child_env

pytestmark = pytest.mark.timeout(120)

ANON = "User:ANONYMOUS"


@pytest.fixture(scope="module")
def acl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    base = tmp_path_factory.mktemp("acl-broker")
    data = base / "data"
    data.mkdir()
    store = AclStore(data / ACL_FILE, Authorizer(AuthorizerConfig(frozenset(), False)))
    store.add(
        acl.binding(acl.ResourceType.CLUSTER, acl.CLUSTER_NAME, 3, ANON, "*", op, acl.AclPermissionType.ALLOW)
        for op in (acl.AclOperation.ALTER, acl.AclOperation.DESCRIBE)
    )
    broker = Broker(
        data,
        base / "broker.log",
        name="acl-broker",
        overrides={
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": "User:admin",
            "auto.create.topics.enable": "false",
        },
    )
    try:
        broker.start()
        yield broker
    finally:
        broker.close()


def _admin(b: Broker) -> AdminClient:
    return AdminClient({"bootstrap.servers": b.bootstrap})


def _topic_acl(
    name: str, op: AclOperation, pattern: ResourcePatternType = ResourcePatternType.LITERAL
) -> AclBinding:
    return AclBinding(ResourceType.TOPIC, name, pattern, ANON, "*", op, AclPermissionType.ALLOW)


def _create(admin: AdminClient, *bindings: AclBinding) -> None:
    for f in admin.create_acls(list(bindings), request_timeout=10).values():
        f.result()


def _produce_error(b: Broker, topic: str) -> KafkaError | None:
    """One message; the delivery report's error (None: written)."""
    errors: list[KafkaError | None] = []
    p = Producer({"bootstrap.servers": b.bootstrap, "message.timeout.ms": 10000, "enable.idempotence": False})
    p.produce(topic, b"v", on_delivery=lambda err, _msg: errors.append(err))
    p.flush(15)
    assert len(errors) == 1
    return errors[0]


def test_confluent_produce_denied_then_allowed_by_create_acls_without_restart(acl_broker: Broker) -> None:
    topic = f"acl-{uuid.uuid4().hex[:8]}"
    admin = _admin(acl_broker)
    with pytest.raises(KafkaException) as denied:
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(10)
    assert denied.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED

    _create(admin, _topic_acl("acl-", AclOperation.CREATE, ResourcePatternType.PREFIXED))
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(10)

    err = _produce_error(acl_broker, topic)
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, err

    _create(admin, _topic_acl(topic, AclOperation.WRITE))
    assert _produce_error(acl_broker, topic) is None

    listed = admin.describe_acls(
        AclBindingFilter(
            ResourceType.TOPIC,
            topic,
            ResourcePatternType.MATCH,
            None,
            None,
            AclOperation.ANY,
            AclPermissionType.ANY,
        ),
        request_timeout=10,
    ).result()
    assert {(b.name, b.resource_pattern_type, b.operation) for b in listed} == {
        (topic, ResourcePatternType.LITERAL, AclOperation.WRITE),
        ("acl-", ResourcePatternType.PREFIXED, AclOperation.CREATE),
    }

    flt = AclBindingFilter(
        ResourceType.TOPIC,
        topic,
        ResourcePatternType.LITERAL,
        ANON,
        "*",
        AclOperation.WRITE,
        AclPermissionType.ALLOW,
    )
    (deleted,) = [f.result() for f in admin.delete_acls([flt], request_timeout=10).values()]
    assert [(b.name, b.operation) for b in deleted] == [(topic, AclOperation.WRITE)]
    err = _produce_error(acl_broker, topic)
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, err

    # librdkafka learns of the denial from Metadata (DESCRIBE) and never sends the Produce
    audit = [line for line in acl_broker.log_text().splitlines() if "DENIED" in line and topic in line]
    assert any("principal=User:ANONYMOUS" in line and "operation=DESCRIBE" in line for line in audit), audit


def exactly(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "exactly", *args], capture_output=True, text=True, timeout=60, env=child_env()
    )


def test_exactly_acls_command_and_txn_abort_needs_write_on_the_id(acl_broker: Broker) -> None:
    bs = ("--bootstrap-server", acl_broker.bootstrap)
    tid = f"acl-tx-{uuid.uuid4().hex[:8]}"
    topic = f"acl-txt-{uuid.uuid4().hex[:8]}"
    # kafka-acls' --producer: WRITE, DESCRIBE, CREATE on the topic, WRITE, DESCRIBE on the id,
    # IDEMPOTENT_WRITE on the cluster
    added = exactly(
        "acls", "--add", "--allow-principal", ANON, "--producer", "--idempotent",
        "--topic", topic, "--transactional-id", tid, *bs,
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    assert "Added 6 ACL(s)" in added.stdout, added.stdout
    admin = _admin(acl_broker)
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(10)

    listed = exactly("acls", "--list", "--transactional-id", tid, *bs)
    assert listed.returncode == 0, listed.stderr
    rows = [line.split("\t") for line in listed.stdout.splitlines()[1:]]
    assert sorted((r[0], r[1], r[5], r[6]) for r in rows) == [
        ("TRANSACTIONAL_ID", tid, "DESCRIBE", "ALLOW"),
        ("TRANSACTIONAL_ID", tid, "WRITE", "ALLOW"),
    ]

    p = Producer({"bootstrap.servers": acl_broker.bootstrap, "transactional.id": tid})
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(topic, b"open")
    p.flush(30)

    removed = exactly("acls", "--remove", "--transactional-id", tid, *bs)
    assert removed.returncode == 0 and "Removed 2 ACL(s)" in removed.stdout, removed.stderr
    denied = exactly("txn", "abort", "--transactional-id", tid, *bs)
    assert denied.returncode == 1 and "TRANSACTIONAL_ID_AUTHORIZATION_FAILED" in denied.stderr, denied.stderr

    readded = exactly(
        "acls", "--add", "--allow-principal", ANON, "--operation", "Write", "--operation", "Describe",
        "--transactional-id", tid, *bs,
    )  # fmt: skip
    assert readded.returncode == 0, readded.stderr
    aborted = exactly("txn", "abort", "--transactional-id", tid, *bs)
    assert aborted.returncode == 0, aborted.stderr
    assert "Aborted the Ongoing transaction" in aborted.stdout, aborted.stdout


def test_acls_survive_a_restart(acl_broker: Broker) -> None:
    admin = _admin(acl_broker)
    name = f"acl-keep-{uuid.uuid4().hex[:8]}"
    _create(admin, _topic_acl(name, AclOperation.READ))
    acl_broker.restart(clean=False)  # SIGKILL: the ACLs were on disk before the answer
    admin = _admin(acl_broker)
    listed = admin.describe_acls(
        AclBindingFilter(
            ResourceType.TOPIC,
            name,
            ResourcePatternType.LITERAL,
            None,
            None,
            AclOperation.ANY,
            AclPermissionType.ANY,
        ),
        request_timeout=10,
    ).result()
    assert [(b.name, b.operation, b.principal) for b in listed] == [(name, AclOperation.READ, ANON)]
    assert Path(acl_broker.data_dir / ACL_FILE).exists()
