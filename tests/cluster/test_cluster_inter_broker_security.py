"""The cluster's own traffic over secured listeners, with the ACL authorizer on and no ACL at all:
the brokers reach each other as their configured principal (``super.users=User:broker``), never
as ANONYMOUS.

* Every listener SASL_SSL with SCRAM-SHA-512 (``inter.broker.listener.name``,
  ``sasl.mechanism.inter.broker.protocol``, the broker's credentials in
  ``listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config``; the SCRAM users seeded in ZooKeeper
  before the brokers start, as Kafka's docs have operators do).
* Every listener SSL with required client certificates (``security.inter.broker.protocol=SSL``):
  each broker presents its keystore's certificate, mapped to ``User:broker``.
* Every listener SASL_PLAINTEXT with PLAIN: the brokers' and the clients' accounts are the
  listener's ``user_<name>`` JAAS entries, and the broker logs in with the same entry's
  ``username``/``password`` (Kafka's PlainLoginModule convention).

In all three an idempotent confluent-kafka producer (acks=all) writes to an RF 3 topic while its
leader is killed with SIGKILL; a new leader takes over and every acknowledged record is read
back exactly once. The SASL cluster then restarts a follower with a wrong inter-broker password:
it keeps running and retrying, logs the refusal and stays out of the ISR, until it is restarted
with the right one and catches up; a transaction over partitions led by every broker then commits
(KIP-890 verification and the coordinator's markers between brokers over SASL_SSL as well).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka import TopicPartition as KafkaPartition
from confluent_kafka.admin import AdminClient, NewTopic

from exactly.cluster.zk import ClusterZk
from exactly.cluster.zk_scram import encode_scram, encode_user_config, user_path
from exactly.security.scram import ScramMechanism, credential_from_password
from tests.cluster.helpers import broker_id, by_id, running_cluster, wait_for
from tests.support.broker import Broker
from tests.support.certs import TestPki, make_pki

pytestmark = pytest.mark.timeout(300)  # about 25 s each

BROKER_PW = "broker-Pw,1"
ADMIN_PW = "admin-Pw=1"
# PLAIN: this listener's accounts, and (username/password) what each broker logs in with
PLAIN_JAAS = (
    "org.apache.kafka.common.security.plain.PlainLoginModule required "
    f'username="broker" password="{BROKER_PW}" user_broker="{BROKER_PW}" user_admin="{ADMIN_PW}";'
)
SCRAM_JAAS_KEY = "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config"
RECORDS = 300


def scram_jaas(user: str, password: str) -> str:
    return f'org.apache.kafka.common.security.scram.ScramLoginModule required username="{user}" password="{password}";'


def authorizer(super_users: str) -> dict[str, str]:
    return {
        "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
        "super.users": super_users,
        "allow.everyone.if.no.acl.found": "false",
        "auto.create.topics.enable": "false",
        "replica.lag.time.max.ms": "6000",
    }


@pytest.fixture
def pki(tmp_path: Path) -> TestPki:
    return make_pki(tmp_path / "pki")


def seed_scram_user(zk: ClusterZk, user: str, password: str) -> None:
    """``/config/users/<user>`` in Kafka's format, before any broker runs (kafka-configs --zookeeper)."""
    mech = ScramMechanism.SCRAM_SHA_512
    config = {mech.mechanism_name: encode_scram(credential_from_password(mech, password))}
    zk.client.create(user_path(user), encode_user_config(config), makepath=True)


def sasl_client(pki: TestPki, brokers: list[Broker] | None = None) -> dict[str, str]:
    conf = {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "admin",
        "sasl.password": ADMIN_PW,
        "ssl.ca.location": str(pki.ca),
    }
    if brokers is not None:
        conf["bootstrap.servers"] = ",".join(b.bootstrap for b in brokers if b.running)
    return conf


def ssl_client(pki: TestPki, brokers: list[Broker] | None = None) -> dict[str, str]:
    conf = {
        "security.protocol": "SSL",
        "ssl.ca.location": str(pki.ca),
        "ssl.certificate.location": str(pki.alice.cert),
        "ssl.key.location": str(pki.alice.key),
    }
    if brokers is not None:
        conf["bootstrap.servers"] = ",".join(b.bootstrap for b in brokers if b.running)
    return conf


@pytest.fixture
def sasl_cluster(zk: ClusterZk, zk_connect: str, tmp_path: Path, pki: TestPki) -> Iterator[list[Broker]]:
    seed_scram_user(zk, "broker", BROKER_PW)
    seed_scram_user(zk, "admin", ADMIN_PW)
    yield from running_cluster(
        zk_connect,
        tmp_path,
        client_config=sasl_client(pki),
        **{
            "listeners": "SASL_SSL://127.0.0.1:0",
            "inter.broker.listener.name": "SASL_SSL",
            "sasl.enabled.mechanisms": "SCRAM-SHA-512",
            "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
            SCRAM_JAAS_KEY: scram_jaas("broker", BROKER_PW),
            "ssl.keystore.location": str(pki.server_keystore),
            "ssl.truststore.location": str(pki.ca),
            **authorizer("User:broker;User:admin"),
        },
    )


def plain_client(brokers: list[Broker] | None = None) -> dict[str, str]:
    conf = {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "admin",
        "sasl.password": ADMIN_PW,
    }
    if brokers is not None:
        conf["bootstrap.servers"] = ",".join(b.bootstrap for b in brokers if b.running)
    return conf


@pytest.fixture
def plain_cluster(zk_connect: str, tmp_path: Path) -> Iterator[list[Broker]]:
    yield from running_cluster(
        zk_connect,
        tmp_path,
        client_config=plain_client(),
        **{
            "listeners": "SASL_PLAINTEXT://127.0.0.1:0",
            "security.inter.broker.protocol": "SASL_PLAINTEXT",
            "sasl.enabled.mechanisms": "PLAIN",
            "sasl.mechanism.inter.broker.protocol": "PLAIN",
            "listener.name.sasl_plaintext.plain.sasl.jaas.config": PLAIN_JAAS,
            **authorizer("User:broker;User:admin"),
        },
    )


@pytest.fixture
def ssl_cluster(zk_connect: str, tmp_path: Path, pki: TestPki) -> Iterator[list[Broker]]:
    yield from running_cluster(
        zk_connect,
        tmp_path,
        client_config=ssl_client(pki),
        **{
            "listeners": "SSL://127.0.0.1:0",
            "security.inter.broker.protocol": "SSL",
            "ssl.client.auth": "required",
            "ssl.keystore.location": str(pki.server_keystore),  # also each broker's client certificate
            "ssl.truststore.location": str(pki.ca),
            # the brokers' certificate (CN=localhost) is User:broker, alice's is User:alice
            "ssl.principal.mapping.rules": "RULE:^CN=localhost$/broker/,RULE:^CN=(.*?),OU=clients.*$/$1/,DEFAULT",
            **authorizer("User:broker;User:alice"),
        },
    )


def partition_state(admin: AdminClient, topic: str) -> tuple[int, list[int]]:
    """(leader, ISR) of partition 0 as the cluster reports it."""
    meta = admin.list_topics(topic, timeout=10).topics[topic].partitions[0]
    return int(meta.leader), sorted(int(r) for r in meta.isrs)


def wait_for_state(
    admin: AdminClient, topic: str, ok: Any, what: str, timeout: float = 60.0
) -> tuple[int, list[int]]:
    seen: list[tuple[int, list[int]]] = []

    def check() -> bool:
        try:
            state = partition_state(admin, topic)
        except Exception:
            return False
        seen[:] = [state]
        return bool(ok(*state))

    wait_for(check, timeout=timeout, what=f"{what} (last seen {seen})")
    return seen[0]


def failover_keeps_every_acked_record(brokers: list[Broker], client: Any) -> tuple[str, Broker]:
    """An RF 3 topic, an idempotent acks=all producer, SIGKILL of the leader half-way; every
    acknowledged record read back once. Returns the topic and the killed broker."""
    topic = f"secured-{uuid.uuid4().hex[:8]}"
    admin = AdminClient(client(brokers))
    admin.create_topics([NewTopic(topic, 1, 3, config={"min.insync.replicas": "2"})])[topic].result(30)
    leader, _isr = wait_for_state(admin, topic, lambda ld, isr: ld >= 0 and isr == [0, 1, 2], "full ISR")

    acked: list[bytes] = []
    failed: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, msg: Any) -> None:
        if err is None:
            acked.append(msg.value())
        else:
            failed.append(err)

    producer = Producer(
        {
            **client(brokers),
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "message.timeout.ms": 60000,
        }
    )
    for i in range(RECORDS // 2):
        producer.produce(topic, f"v{i}".encode(), on_delivery=on_delivery)
    assert producer.flush(30) == 0
    victim = by_id(brokers, leader)
    victim.kill()
    for i in range(RECORDS // 2, RECORDS):
        producer.produce(topic, f"v{i}".encode(), on_delivery=on_delivery)
    assert producer.flush(90) == 0
    assert failed == []

    survivors = [b for b in brokers if b.running]
    admin = AdminClient(client(survivors))
    new_leader, isr = wait_for_state(admin, topic, lambda ld, isr: ld not in (-1, leader), "a new leader")
    assert leader not in isr

    consumer = Consumer(
        {
            **client(survivors),
            "group.id": f"check-{topic}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([KafkaPartition(topic, 0, 0)])
    got: list[bytes] = []
    wait_for(
        lambda: (
            got.extend(m.value() for m in consumer.consume(100, 0.5) if m.error() is None)
            or len(got) >= len(acked)
        ),
        timeout=60,
        what=f"{len(acked)} acknowledged records from leader {new_leader}",
    )
    consumer.close()
    assert sorted(got) == sorted(acked)  # every acknowledged record, each once
    assert len(acked) == RECORDS
    return topic, victim


def assert_no_denials(brokers: list[Broker]) -> None:
    """No request was refused by the authorizer, inter-broker ones included (audit lines)."""
    for b in brokers:
        assert "DENIED principal=" not in b.log_text(), b.name


def test_sasl_ssl_scram_cluster_fails_over_and_a_broker_with_a_wrong_password_stays_out(
    sasl_cluster: list[Broker], pki: TestPki
) -> None:
    topic, victim = failover_keeps_every_acked_record(sasl_cluster, lambda bs: sasl_client(pki, bs))
    assert_no_denials(sasl_cluster)
    for b in sasl_cluster:
        assert "inter-broker listener SASL_SSL (SASL_SSL, SCRAM-SHA-512 as User:broker)" in b.log_text()

    # The killed broker comes back with a wrong inter-broker password: it runs, the leader
    # refuses it on every attempt (logged, retried with back-off) and it stays out of the ISR;
    # with the right password again it catches up and rejoins.
    victim.overrides[SCRAM_JAAS_KEY] = scram_jaas("broker", "not-the-password")
    since = victim.log_size()
    victim.start()
    wait_for(
        lambda: victim.log_text(since).count("authentication failed as User:broker (SCRAM-SHA-512)") >= 3,
        timeout=60,
        what="repeated refused authentications in the restarted broker's log",
    )
    assert victim.running
    admin = AdminClient(sasl_client(pki, sasl_cluster))
    _leader, isr = partition_state(admin, topic)
    assert broker_id(victim) not in isr

    victim.overrides[SCRAM_JAAS_KEY] = scram_jaas("broker", BROKER_PW)
    victim.restart()
    wait_for_state(admin, topic, lambda ld, isr: broker_id(victim) in isr, "the broker back in the ISR")

    # A transaction over partitions led by every broker: KIP-890 verification (leader ->
    # coordinator) and the coordinator's markers (coordinator -> leaders) between brokers too.
    committed_transaction_is_read(sasl_cluster, sasl_client(pki, sasl_cluster))
    assert_no_denials(sasl_cluster)


def committed_transaction_is_read(brokers: list[Broker], client: dict[str, str]) -> None:
    topic = f"secured-tx-{uuid.uuid4().hex[:8]}"
    admin = AdminClient(client)
    spread = [[0, 1, 2], [1, 2, 0], [2, 0, 1]]  # each broker the preferred leader of one partition
    admin.create_topics([NewTopic(topic, num_partitions=3, replica_assignment=spread)])[topic].result(30)
    producer = Producer({**client, "transactional.id": f"tx-{topic}", "transaction.timeout.ms": 30000})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(30):
        producer.produce(topic, f"t{i}".encode(), partition=i % 3)
    producer.commit_transaction(60)
    consumer = Consumer(
        {
            **client,
            "group.id": f"check-{topic}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([KafkaPartition(topic, p, 0) for p in range(3)])
    got: list[bytes] = []
    wait_for(
        lambda: (
            got.extend(m.value() for m in consumer.consume(30, 0.5) if m.error() is None) or len(got) >= 30
        ),
        timeout=60,
        what="the committed transaction's 30 records",
    )
    consumer.close()
    assert sorted(got) == sorted(f"t{i}".encode() for i in range(30))


def test_ssl_cluster_with_client_certificates_fails_over(ssl_cluster: list[Broker], pki: TestPki) -> None:
    failover_keeps_every_acked_record(ssl_cluster, lambda bs: ssl_client(pki, bs))
    assert_no_denials(ssl_cluster)
    for b in ssl_cluster:
        assert "inter-broker listener SSL (SSL)" in b.log_text()


def test_sasl_plaintext_plain_cluster_fails_over_and_commits_a_transaction(
    plain_cluster: list[Broker],
) -> None:
    topic, victim = failover_keeps_every_acked_record(plain_cluster, plain_client)
    for b in plain_cluster:
        assert "inter-broker listener SASL_PLAINTEXT (SASL_PLAINTEXT, PLAIN as User:broker)" in b.log_text()
    # the killed broker catches up over the PLAIN inter-broker listener and rejoins the ISR
    victim.start()
    admin = AdminClient(plain_client(plain_cluster))
    wait_for_state(admin, topic, lambda ld, isr: broker_id(victim) in isr, "the broker back in the ISR")
    committed_transaction_is_read(plain_cluster, plain_client(plain_cluster))
    assert_no_denials(plain_cluster)
