"""The connecting side of the brokers' own traffic (``exactly.server.inter_broker`` inside
``BrokerConnection``) against the real secured broker: the settings come from broker
configuration values (Kafka's names), the connection authenticates as the configured principal
before its first request, and refused credentials or certificates fail the call cleanly.

The cluster tests run the same code in the replica fetchers and the marker sender; this covers
every mechanism and the failure modes on one broker, fast."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path
from typing import Any

import pytest
from kio.schema.metadata.v12.request import MetadataRequest

from exactly.security.inter_broker import inter_broker_security
from exactly.security.listeners import ListenerSpec, SecurityProtocol
from exactly.server.broker_connection import BrokerConnection
from exactly.server.inter_broker import BackingOff, InterBrokerAuthError, InterBrokerClient
from exactly.server.metadata_cache import BrokerEndpoint
from exactly.testing.wait import wait_until
from tests.support.broker import Broker
from tests.support.certs import TestPki
from tests.support.security import ALICE_PW, PLAIN_JAAS
from tests.support.security_fixtures import (  # noqa: F401  (fixtures: pki, module_broker_config, _alice, sb)
    alice_fixture,
    pki_fixture,
    secured_broker_config_fixture,
    secured_broker_fixture,
)

pytestmark = pytest.mark.timeout(120)

SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"


def connection(sb: Broker, listener: str, values: dict[str, str]) -> BrokerConnection:
    spec = ListenerSpec(listener, SecurityProtocol(listener), "127.0.0.1", 0)
    client = InterBrokerClient(inter_broker_security(values, spec))
    endpoint = BrokerEndpoint(0, "127.0.0.1", sb.listener_ports[listener])
    return BrokerConnection(endpoint, "inter-broker-test", client, timeout_s=20)


def metadata(conn: BrokerConnection) -> Any:
    async def run() -> Any:
        try:
            return await conn.call(
                MetadataRequest(
                    topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
                )
            )
        finally:
            conn.close()

    return asyncio.run(run())


def tls(pki: TestPki, **more: str) -> dict[str, str]:
    return {"ssl.truststore.location": str(pki.ca), **more}


@pytest.mark.parametrize(
    ("mechanism", "jaas"),
    [
        ("SCRAM-SHA-512", f'{SCRAM_MODULE} required username="alice" password="{ALICE_PW}";'),
        ("SCRAM-SHA-256", f'{SCRAM_MODULE} required username="alice" password="{ALICE_PW}";'),
        ("PLAIN", PLAIN_JAAS),  # the listener's own JAAS entry: username/password are the broker's
    ],
)
def test_sasl_ssl_authenticates_before_the_first_request(
    sb: Broker, pki: TestPki, mechanism: str, jaas: str
) -> None:
    values = tls(
        pki,
        **{
            "sasl.enabled.mechanisms": "SCRAM-SHA-512,SCRAM-SHA-256,PLAIN",
            "sasl.mechanism.inter.broker.protocol": mechanism,
            f"listener.name.sasl_ssl.{mechanism.lower()}.sasl.jaas.config": jaas,
        },
    )
    response = metadata(connection(sb, "SASL_SSL", values))
    assert [int(b.port) for b in response.brokers] == [sb.listener_ports["SASL_SSL"]]


def test_sasl_plaintext_with_the_broker_wide_jaas_config(sb: Broker) -> None:
    values = {
        "sasl.enabled.mechanisms": "PLAIN",
        "sasl.mechanism.inter.broker.protocol": "PLAIN",
        "sasl.jaas.config": PLAIN_JAAS,
    }
    assert metadata(connection(sb, "SASL_PLAINTEXT", values)).brokers


def test_a_wrong_password_is_a_clear_authentication_error(sb: Broker, pki: TestPki) -> None:
    values = tls(
        pki,
        **{
            "sasl.enabled.mechanisms": "SCRAM-SHA-512",
            "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
            "sasl.jaas.config": f'{SCRAM_MODULE} required username="alice" password="wrong";',
        },
    )
    with pytest.raises(InterBrokerAuthError, match=r"authentication failed as User:alice \(SCRAM-SHA-512\)"):
        metadata(connection(sb, "SASL_SSL", values))
    # the connection is dropped; the next call does not reconnect before the back-off has
    # passed, then tries again (and is refused again)
    conn = connection(sb, "SASL_SSL", values)
    with pytest.raises(InterBrokerAuthError):
        metadata(conn)
    with pytest.raises(BackingOff, match=r"not reconnecting for 0\.\d s after 1 refused attempt"):
        metadata(conn)
    outcomes: list[type[BaseException]] = []

    def refused_again() -> bool:
        try:
            metadata(conn)
        except (BackingOff, InterBrokerAuthError) as exc:
            outcomes.append(type(exc))
        return outcomes[-1] is InterBrokerAuthError

    wait_until(refused_again, 10, "a second attempt after the back-off", interval=0.05)
    with pytest.raises(BackingOff, match="after 2 refused attempt"):
        metadata(conn)


def test_ssl_presents_the_keystore_as_client_certificate(sb: Broker, pki: TestPki, tmp_path: Path) -> None:
    keystore = tmp_path / "alice-keystore.pem"
    keystore.write_text(pki.alice.key.read_text() + pki.alice.cert.read_text())
    assert metadata(connection(sb, "SSL", tls(pki, **{"ssl.keystore.location": str(keystore)}))).brokers
    # the listener requires a client certificate: without a keystore the handshake is refused
    with pytest.raises((OSError, asyncio.IncompleteReadError)):
        metadata(connection(sb, "SSL", tls(pki)))


def test_a_broker_certificate_outside_the_truststore_is_refused(sb: Broker, pki: TestPki) -> None:
    other_ca = pki.ca.parent / "other-ca.pem"
    with pytest.raises(ssl.SSLCertVerificationError):
        metadata(connection(sb, "SASL_SSL", {"ssl.truststore.location": str(other_ca), **_scram()}))


def _scram() -> dict[str, str]:
    return {
        "sasl.enabled.mechanisms": "SCRAM-SHA-512",
        "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
        "sasl.jaas.config": f'{SCRAM_MODULE} required username="alice" password="{ALICE_PW}";',
    }
