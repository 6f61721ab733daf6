"""The project's own tools against a secured broker: the wire-client commands (``txn``,
``acls``, ``cluster status``), the web console's gatherer and the Spark sink's two-phase probe
over SASL_SSL with SCRAM-SHA-512, configured the way Kafka users configure clients
(``--command-config`` with the Java client's names, ``-X`` with librdkafka's). The broker runs an
authorizer, so the tools really act as the principal they authenticate as: alice is a super
user, bob has no ACLs."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from exactly.cli.pipeline import spark_kafka_options
from exactly.client.broker_pool import BrokerPool
from exactly.client.wire import AuthenticationError
from exactly.spark.options import parse_sink_options
from exactly.spark.two_phase import resolve_atomic
from exactly.testing.broker import child_env
from exactly.webconsole.gather import Gatherer
from tests.support.broker import Broker
from tests.support.certs import TestPki, make_pki
from tests.support.clients import create_topic
from tests.support.security import ALICE_PW, add_alice, scram_conf, secured_broker_config, users_cli

pytestmark = pytest.mark.timeout(120)

BOB_PW = "bob-secret"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TestPki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def module_broker_config(pki: TestPki) -> dict[str, str]:
    return {
        **secured_broker_config(pki),
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:ANONYMOUS;User:alice",  # ANONYMOUS: the PLAINTEXT admin listener
        "transaction.two.phase.commit.enable": "true",
    }


@pytest.fixture(scope="module")
def _users(_module_broker: Broker) -> None:
    add_alice(_module_broker)
    done = users_cli(_module_broker, "add", "bob", "--password-stdin", stdin=BOB_PW + "\n")
    assert done.returncode == 0, done.stderr


@pytest.fixture
def sb(module_broker: Broker, _users: None) -> Broker:
    return module_broker


def client_settings(
    sb: Broker, pki: TestPki, *, user: str = "alice", password: str = ALICE_PW
) -> dict[str, Any]:
    conf = scram_conf(sb, pki, user=user, password=password)
    conf.pop("bootstrap.servers")
    return conf


def x_options(conf: dict[str, Any]) -> list[str]:
    return [arg for key, value in conf.items() for arg in ("-X", f"{key}={value}")]


def exactly(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "exactly", *args],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=90,
    )


@pytest.fixture
def open_transaction(sb: Broker, pki: TestPki) -> Iterator[str]:
    """A transactional id with an open transaction (alice, over SASL_SSL)."""
    topic = f"sec-{uuid.uuid4().hex[:8]}"
    create_topic(sb.listener_address("PLAINTEXT"), topic)
    tid = f"tid-{uuid.uuid4().hex[:8]}"
    producer = Producer({**scram_conf(sb, pki), "transactional.id": tid})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, b"v")
    producer.flush(30)
    yield tid
    producer.abort_transaction(30)


def test_txn_list_and_cluster_status_over_sasl_ssl_with_x_options(
    sb: Broker, pki: TestPki, open_transaction: str
) -> None:
    address = sb.listener_address("SASL_SSL")
    listed = exactly("txn", "list", "--bootstrap-server", address, *x_options(client_settings(sb, pki)))
    assert listed.returncode == 0, listed.stderr
    assert open_transaction in listed.stdout
    described = exactly(
        "txn", "describe", open_transaction, "--bootstrap-server", address,
        *x_options(client_settings(sb, pki)),
    )  # fmt: skip
    assert described.returncode == 0, described.stderr
    assert "Ongoing" in described.stdout
    status = exactly("cluster", "status", "--bootstrap-server", address, *x_options(client_settings(sb, pki)))
    assert status.returncode == 0, status.stderr
    # the same command without the settings cannot talk to a TLS port
    plain = exactly("txn", "list", "--bootstrap-server", address, "--request-timeout", "5")
    assert plain.returncode == 1
    assert "Traceback" not in plain.stderr


def test_acls_with_a_kafka_command_config_file_act_as_the_principal(
    sb: Broker, pki: TestPki, tmp_path: Path
) -> None:
    """A properties file as written for kafka-acls.sh (JAAS, PEM truststore) works unchanged;
    alice (super user) may manage ACLs, bob may not -- the request carries his principal."""
    address = sb.listener_address("SASL_SSL")
    props = tmp_path / "alice.properties"
    props.write_text(
        "# written for Kafka's tools\n"
        "security.protocol=SASL_SSL\n"
        "sasl.mechanism=SCRAM-SHA-512\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \\\n"
        f'    username="alice" password="{ALICE_PW}";\n'
        "ssl.truststore.type=PEM\n"
        f"ssl.truststore.location={pki.ca}\n"
    )
    topic = f"acl-{uuid.uuid4().hex[:8]}"
    base = ("acls", "--bootstrap-server", address, "--command-config", str(props))
    added = exactly(*base, "--add", "--allow-principal", "User:bob", "--operation", "Read", "--topic", topic)
    assert added.returncode == 0, added.stderr
    listed = exactly(*base, "--list", "--topic", topic)
    assert listed.returncode == 0, listed.stderr
    assert "User:bob" in listed.stdout
    bob = exactly(
        "acls", "--list", "--bootstrap-server", address,
        *x_options(client_settings(sb, pki, user="bob", password=BOB_PW)),
    )  # fmt: skip
    assert bob.returncode == 1
    assert "CLUSTER_AUTHORIZATION_FAILED" in bob.stderr
    assert "Traceback" not in bob.stderr


def test_wrong_password_is_one_clear_line_and_exit_1(sb: Broker, pki: TestPki) -> None:
    address = sb.listener_address("SASL_SSL")
    wrong = x_options(client_settings(sb, pki, password="not-it"))
    for command in (("txn", "list"), ("acls", "--list"), ("producers", "t", "0")):
        done = exactly(*command, "--bootstrap-server", address, *wrong)
        assert done.returncode == 1, (command, done.stdout)
        assert "authentication failed for user 'alice' (SCRAM-SHA-512)" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    with pytest.raises(AuthenticationError, match="authentication failed"):
        BrokerPool.connect(address, timeout=10, config=client_settings(sb, pki, password="not-it"))


def test_console_gatherer_snapshot_over_sasl_ssl(sb: Broker, pki: TestPki, open_transaction: str) -> None:
    gatherer = Gatherer(
        sb.listener_address("SASL_SSL"),
        timeout_s=20,
        hanging_after_ms=60_000,
        config=client_settings(sb, pki),
    )
    try:
        snapshot = gatherer.snapshot()
    finally:
        gatherer.close()
    assert snapshot.errors == ()
    assert snapshot.brokers
    assert open_transaction in {t.transactional_id for t in snapshot.transactions}


def test_spark_two_phase_probe_over_sasl_ssl(sb: Broker, pki: TestPki) -> None:
    """The sink's atomicBatches=auto probe connects with the ``kafka.*`` security options; with
    a wrong password it cannot, and falls back to per-task mode."""

    def options(password: str) -> dict[str, str]:
        conf = {f"kafka.{k}": str(v) for k, v in client_settings(sb, pki, password=password).items()}
        return {**conf, "kafka.bootstrap.servers": sb.listener_address("SASL_SSL"), "topic": "t"}

    assert resolve_atomic(parse_sink_options(options(ALICE_PW))) is True
    assert resolve_atomic(parse_sink_options(options("not-it"))) is False


def test_pipeline_generate_and_verify_over_sasl_ssl_as_the_authenticated_user(
    sb: Broker, pki: TestPki
) -> None:
    """``exactly pipeline generate`` / ``verify`` take the same ``-X`` settings (creating the topics,
    writing transactionally and reading back read_committed over SASL_SSL); bob, without ACLs, is
    refused with one line, no traceback. (``pipeline run`` hands the same settings to Spark as
    ``kafka.*`` options: ``spark_kafka_options``, and tests/spark/test_pipeline_security.py runs the
    job over SASL_SSL.)"""
    address = sb.listener_address("SASL_SSL")
    prefix = f"psec{uuid.uuid4().hex[:6]}-"
    alice = x_options(client_settings(sb, pki))
    common = ("--bootstrap-server", address, "--topic-prefix", prefix)
    made = exactly("pipeline", "generate", "--orders", "300", "--txn-size", "50", "-q", *common, *alice)
    assert made.returncode == 0, made.stderr
    assert "generated 300 committed orders" in made.stdout
    checked = exactly("pipeline", "verify", "--json", *common, *alice)
    # no job ran: verify reads the 300 orders back over SASL_SSL and reports the outputs missing
    assert checked.returncode == 1, checked.stderr
    assert '"orders": 300' in checked.stdout and "no update at all" in checked.stdout, checked.stdout
    bob = x_options(client_settings(sb, pki, user="bob", password=BOB_PW))
    refused = exactly("pipeline", "generate", "--orders", "10", "-q", *common, *bob)
    assert refused.returncode == 1
    assert "Traceback" not in refused.stderr and refused.stderr.count("\n") == 1, refused.stderr


def test_spark_kafka_options_carry_the_client_settings() -> None:
    settings = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "alice"}
    assert spark_kafka_options(settings) == (
        ("kafka.sasl.mechanism", "SCRAM-SHA-512"),
        ("kafka.sasl.username", "alice"),
        ("kafka.security.protocol", "SASL_SSL"),
    )
