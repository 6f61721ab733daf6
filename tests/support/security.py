"""Helpers of the security integration tests: the four-listener broker's settings, the users
command, client configurations for SCRAM over SASL_SSL and for client certificates over SSL, and the
failed-authentication counter of /metrics."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from typing import Any

from confluent_kafka import Consumer

from exactly.testing.broker import child_env
from tests.support.broker import Broker
from tests.support.certs import ClientCert, TestPki
from tests.support.metrics import metrics_url

PLAIN_JAAS = (
    "org.apache.kafka.common.security.plain.PlainLoginModule required "
    'username="admin" password="admin-pw" user_admin="admin-pw" user_bob="bob-pw";'
)
ALICE_PW = "alice-Pw,=1"  # a comma and an equals sign: SCRAM escapes them in names only


def secured_broker_config(pki: TestPki) -> dict[str, str]:
    """PLAINTEXT (bootstrap and admin, no authorizer), SASL_SSL (SCRAM-SHA-512/256, PLAIN), SSL
    with required client certificates, SASL_PLAINTEXT (for wire-level tests)."""
    return {
        "listeners": "PLAINTEXT://127.0.0.1:0,SASL_SSL://127.0.0.1:0,SSL://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
        "ssl.keystore.location": str(pki.server_keystore),
        "ssl.truststore.location": str(pki.ca),
        "listener.name.ssl.ssl.client.auth": "required",
        "sasl.enabled.mechanisms": "SCRAM-SHA-512,SCRAM-SHA-256,PLAIN",
        "listener.name.sasl_ssl.plain.sasl.jaas.config": PLAIN_JAAS,
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": PLAIN_JAAS,
        "group.initial.rebalance.delay.ms": "0",
        "transaction.state.log.num.partitions": "2",
        "offsets.topic.num.partitions": "2",
        "metrics.port": "0",
    }


def users_cli(broker: Broker, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """``exactly users ARGS`` against the broker's PLAINTEXT listener."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "exactly",
            "users",
            *args,
            "--bootstrap-server",
            broker.listener_address("PLAINTEXT"),
        ],
        input=stdin,
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
    )


def add_alice(broker: Broker) -> None:
    done = users_cli(broker, "add", "alice", "--password-stdin", stdin=ALICE_PW + "\n")
    assert done.returncode == 0, done.stderr


def scram_conf(sb: Broker, pki: TestPki, *, password: str = ALICE_PW, user: str = "alice") -> dict[str, Any]:
    return {
        "bootstrap.servers": sb.listener_address("SASL_SSL"),
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": user,
        "sasl.password": password,
        "ssl.ca.location": str(pki.ca),
    }


def ssl_conf(sb: Broker, pki: TestPki, cert: ClientCert | None = None) -> dict[str, Any]:
    cert = cert or pki.alice
    return {
        "bootstrap.servers": sb.listener_address("SSL"),
        "security.protocol": "SSL",
        "ssl.ca.location": str(pki.ca),
        "ssl.certificate.location": str(cert.cert),
        "ssl.key.location": str(cert.key),
    }


def failed_auth_total(sb: Broker) -> float:
    text = urllib.request.urlopen(metrics_url(sb), timeout=10).read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("exactly_failed_authentication_total{")
    )


def read_values(conf: dict[str, Any], topic: str, n: int) -> list[bytes]:
    c = Consumer(
        {
            **conf,
            "group.id": f"reader-{time.monotonic_ns()}",
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        c.subscribe([topic])
        out: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(out) < n and time.monotonic() < deadline:
            for m in c.consume(n - len(out), 0.5):
                if m.error() is None:
                    out.append(m.value())
        return out
    finally:
        c.close()
