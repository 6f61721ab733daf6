"""Client security settings: librdkafka's names, the Java client's names translated, refusals."""

from __future__ import annotations

import ssl

import pytest

from exactly.client.security import ClientConfigError, ClientSecurity, SaslSession, translate_java_security
from exactly.client.wire import WireClient, WireError


def test_plaintext_by_default() -> None:
    security = ClientSecurity.from_config({"bootstrap.servers": "x:1", "linger.ms": "5"})
    assert not security.uses_tls and not security.uses_sasl


def test_sasl_ssl_settings() -> None:
    security = ClientSecurity.from_config(
        {
            "security.protocol": "sasl_ssl",
            "sasl.mechanisms": "scram-sha-512",
            "sasl.username": "alice",
            "sasl.password": "pw",
            "ssl.endpoint.identification.algorithm": "none",
        }
    )
    assert security.uses_tls and security.uses_sasl
    assert security.sasl_mechanism == "SCRAM-SHA-512"
    context = security.ssl_context()
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert context.check_hostname is False
    assert context.verify_mode == ssl.CERT_REQUIRED


def test_java_settings_are_translated() -> None:
    conf = translate_java_security(
        {
            "sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required username="u" password="p";',
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": "/ca.pem",
        }
    )
    assert conf == {"sasl.username": "u", "sasl.password": "p", "ssl.ca.location": "/ca.pem"}


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        ({"security.protocol": "TLS"}, "security.protocol must be one of"),
        ({"security.protocol": "SASL_SSL", "sasl.username": "u", "sasl.password": "p"}, "got nothing"),
        ({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "GSSAPI"}, "got GSSAPI"),
        ({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN"}, "needs sasl.username"),
        ({"ssl.endpoint.identification.algorithm": "dns"}, "https or none"),
        ({"ssl.truststore.location": "/x.jks"}, "ssl.truststore.type=PEM"),
        ({"sasl.jaas.config": "com.example.Login required;"}, "not supported"),
    ],
)
def test_unusable_settings_are_refused(conf: dict[str, str], message: str) -> None:
    with pytest.raises(ClientConfigError, match=message):
        ClientSecurity.from_config(conf)


def test_missing_ca_file_is_one_line() -> None:
    security = ClientSecurity.from_config(
        {"security.protocol": "SSL", "ssl.ca.location": "/nonexistent/ca.pem"}
    )
    with pytest.raises(ClientConfigError, match="cannot load the TLS settings"):
        security.ssl_context()


def test_connect_reports_settings_before_connecting() -> None:
    with pytest.raises(WireError, match=r"security\.protocol must"):
        WireClient.connect("127.0.0.1:1", timeout=1, config={"security.protocol": "bogus"})


def test_plain_session_is_one_token() -> None:
    session = SaslSession("PLAIN", "bob", "pw")
    assert session.first() == b"\0bob\0pw"
    assert session.respond(b"") is None
