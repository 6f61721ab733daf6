"""Per-listener security settings as Kafka's ChannelBuilders reads them."""

from __future__ import annotations

import ssl

import pytest

from exactly.security.listener_security import ListenerSecurityError, build_listener_security
from exactly.security.listeners import ListenerSpec, SecurityProtocol
from tests.support.certs import TestPki, make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TestPki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _values(pki: TestPki, **extra: str) -> dict[str, str]:
    return {
        "ssl.keystore.location": str(pki.server_keystore),
        "ssl.truststore.location": str(pki.ca),
        "sasl.enabled.mechanisms": "SCRAM-SHA-512",
        **extra,
    }


def test_sasl_ssl_ignores_the_broker_wide_client_auth_but_not_the_listener_one(pki: TestPki) -> None:
    spec = ListenerSpec("CLIENT", SecurityProtocol.SASL_SSL, "127.0.0.1", 0)
    wide = build_listener_security(_values(pki, **{"ssl.client.auth": "required"}), spec)
    assert wide.ssl_context is not None and wide.ssl_context.verify_mode == ssl.CERT_NONE
    prefixed = build_listener_security(
        _values(pki, **{"listener.name.client.ssl.client.auth": "required"}), spec
    )
    assert prefixed.ssl_context is not None and prefixed.ssl_context.verify_mode == ssl.CERT_REQUIRED
    assert prefixed.mechanisms == ("SCRAM-SHA-512",)


def test_ssl_listener_settings(pki: TestPki) -> None:
    spec = ListenerSpec("SSL", SecurityProtocol.SSL, "127.0.0.1", 0)
    sec = build_listener_security(_values(pki, **{"ssl.client.auth": "requested"}), spec)
    assert sec.ssl_context is not None
    assert sec.ssl_context.verify_mode == ssl.CERT_OPTIONAL
    assert sec.ssl_context.minimum_version == ssl.TLSVersion.TLSv1_2
    inline = {
        "ssl.keystore.certificate.chain": pki.server_cert.read_text(),
        "ssl.keystore.key": pki.server_key.read_text(),
    }
    assert build_listener_security(inline, spec).ssl_context is not None


@pytest.mark.parametrize(
    "extra",
    [
        {"ssl.enabled.protocols": "TLSv1.1"},
        {"ssl.keystore.type": "JKS"},
        {"ssl.client.auth": "sometimes"},
        {"ssl.keystore.location": "/nonexistent"},
        {"ssl.principal.mapping.rules": "RULE:(/x/"},
    ],
)
def test_unusable_tls_settings_are_refused(pki: TestPki, extra: dict[str, str]) -> None:
    spec = ListenerSpec("SSL", SecurityProtocol.SSL, "127.0.0.1", 0)
    with pytest.raises(ListenerSecurityError):
        build_listener_security(_values(pki, **extra), spec)


def test_client_auth_without_a_truststore_is_refused(pki: TestPki) -> None:
    spec = ListenerSpec("SSL", SecurityProtocol.SSL, "127.0.0.1", 0)
    values = {"ssl.keystore.location": str(pki.server_keystore), "ssl.client.auth": "required"}
    with pytest.raises(ListenerSecurityError, match="truststore"):
        build_listener_security(values, spec)
