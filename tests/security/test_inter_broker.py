"""The inter-broker listener's client-side settings from Kafka's config names."""

from __future__ import annotations

import pytest

from exactly.security.inter_broker import InterBrokerConfigError, inter_broker_security
from exactly.security.listeners import ListenerSpec, SecurityProtocol

SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule"
PLAIN = "org.apache.kafka.common.security.plain.PlainLoginModule"


def spec(name: str, protocol: SecurityProtocol) -> ListenerSpec:
    return ListenerSpec(name, protocol, "127.0.0.1", 9094)


def test_plaintext_needs_nothing() -> None:
    settings = inter_broker_security({}, spec("PLAINTEXT", SecurityProtocol.PLAINTEXT))
    assert (settings.mechanism, settings.username, settings.password, dict(settings.tls)) == (
        None,
        None,
        None,
        {},
    )
    assert settings.describe() == "PLAINTEXT (PLAINTEXT)"


def test_ssl_takes_the_listener_prefixed_tls_settings_first() -> None:
    values = {
        "ssl.truststore.location": "/ca.pem",
        "listener.name.repl.ssl.truststore.location": "/repl-ca.pem",
        "ssl.keystore.location": "/broker.pem",
        "ssl.endpoint.identification.algorithm": "",
    }
    settings = inter_broker_security(values, spec("REPL", SecurityProtocol.SSL))
    assert settings.tls_setting("ssl.truststore.location") == "/repl-ca.pem"
    assert settings.tls_setting("ssl.keystore.location") == "/broker.pem"
    assert settings.tls_setting("ssl.endpoint.identification.algorithm") == ""
    assert settings.mechanism is None


def test_sasl_credentials_from_the_listener_and_mechanism_prefixed_jaas_config_first() -> None:
    values = {
        "sasl.enabled.mechanisms": "SCRAM-SHA-512,PLAIN",
        "sasl.mechanism.inter.broker.protocol": "scram-sha-512",
        "listener.name.internal.scram-sha-512.sasl.jaas.config": f'{SCRAM} required username="broker" password="s3cr=t,";',
        "sasl.jaas.config": f'{SCRAM} required username="other" password="other";',
    }
    settings = inter_broker_security(values, spec("INTERNAL", SecurityProtocol.SASL_SSL))
    assert (settings.mechanism, settings.username, settings.password) == (
        "SCRAM-SHA-512",
        "broker",
        "s3cr=t,",
    )
    assert "s3cr" not in repr(settings) and "s3cr" not in settings.describe()
    assert settings.describe() == "INTERNAL (SASL_SSL, SCRAM-SHA-512 as User:broker)"
    assert settings.tls_setting("ssl.endpoint.identification.algorithm") == ""  # unset here: ""


def test_sasl_falls_back_to_the_broker_wide_jaas_config() -> None:
    values = {
        "sasl.enabled.mechanisms": "PLAIN",
        "sasl.mechanism.inter.broker.protocol": "PLAIN",
        "sasl.jaas.config": f'{PLAIN} required username="broker" password="pw" user_broker="pw";',
    }
    settings = inter_broker_security(values, spec("SASL_PLAINTEXT", SecurityProtocol.SASL_PLAINTEXT))
    assert (settings.username, settings.password, dict(settings.tls)) == ("broker", "pw", {})


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"sasl.enabled.mechanisms": "PLAIN"}, "set sasl.mechanism.inter.broker.protocol"),
        (
            {"sasl.enabled.mechanisms": "PLAIN", "sasl.mechanism.inter.broker.protocol": "GSSAPI"},
            "GSSAPI is not supported",
        ),
        (
            {"sasl.enabled.mechanisms": "PLAIN", "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-256"},
            "must be one of listener SASL_SSL's sasl.enabled.mechanisms",
        ),
        (
            {"sasl.enabled.mechanisms": "PLAIN", "sasl.mechanism.inter.broker.protocol": "PLAIN"},
            "credentials are missing; set listener.name.sasl_ssl.plain.sasl.jaas.config",
        ),
        (
            {
                "sasl.enabled.mechanisms": "PLAIN",
                "sasl.mechanism.inter.broker.protocol": "PLAIN",
                "sasl.jaas.config": f'{SCRAM} required username="b" password="p";',
            },
            "PLAIN needs org.apache.kafka.common.security.plain.PlainLoginModule",
        ),
        (
            {
                "sasl.enabled.mechanisms": "SCRAM-SHA-256",
                "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-256",
                "sasl.jaas.config": f'{SCRAM} required username="b";',
            },
            "needs username and password",
        ),
        (
            {
                "sasl.enabled.mechanisms": "SCRAM-SHA-256",
                "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-256",
                "sasl.jaas.config": f'{SCRAM} required username="b" password="p"',
            },
            "missing ';'",
        ),
    ],
)
def test_unusable_sasl_settings_are_refused(values: dict[str, str], message: str) -> None:
    with pytest.raises(InterBrokerConfigError, match=message):
        inter_broker_security(values, spec("SASL_SSL", SecurityProtocol.SASL_SSL))
