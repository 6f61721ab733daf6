"""TLS contexts from Kafka's ssl.* settings: the broker's client side (inter-broker) against its
server side, handshaken in memory (ssl.MemoryBIO: no sockets)."""

from __future__ import annotations

import ssl
from collections.abc import Callable
from pathlib import Path

import pytest

from exactly.security.tls import TlsConfigError, client_context, server_context
from tests.support.certs import TestPki, make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TestPki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def settings(**values: str) -> Callable[[str], str]:
    return lambda key: values.get(key.replace(".", "_"), "")


def handshake(client: ssl.SSLContext, server: ssl.SSLContext, server_name: str) -> ssl.SSLObject:
    """Run one TLS handshake between the two contexts; the server's SSLObject afterwards."""
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    c = client.wrap_bio(c_in, c_out, server_hostname=server_name)
    s = server.wrap_bio(s_in, s_out, server_side=True)
    done = {"c": False, "s": False}
    for _ in range(20):
        for name, obj in (("c", c), ("s", s)):
            if not done[name]:
                try:
                    obj.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done.values()):
            c.write(b"x")  # TLS 1.3: the server checks the client certificate after its Finished
            s_in.write(c_out.read())
            s.read(1)
            return s
    raise AssertionError("handshake did not finish")


def server(pki: TestPki) -> ssl.SSLContext:
    return server_context(
        settings(ssl_keystore_location=str(pki.server_keystore), ssl_truststore_location=str(pki.ca)),
        "required",
    )


def test_the_client_presents_its_keystore_and_checks_the_host(pki: TestPki) -> None:
    client = client_context(
        settings(
            ssl_keystore_location=str(pki.server_keystore),
            ssl_truststore_location=str(pki.ca),
            ssl_endpoint_identification_algorithm="https",
        )
    )
    peer = handshake(client, server(pki), "127.0.0.1").getpeercert()
    assert peer and dict(x[0] for x in peer["subject"])["commonName"] == "localhost"
    with pytest.raises(ssl.SSLCertVerificationError, match="mismatch"):
        handshake(client, server(pki), "broker.example")


def test_identification_off_skips_the_host_check_but_not_the_chain(pki: TestPki, tmp_path: Path) -> None:
    keystore = tmp_path / "alice.pem"
    keystore.write_text(pki.alice.key.read_text() + pki.alice.cert.read_text())
    client = client_context(
        settings(ssl_keystore_location=str(keystore), ssl_truststore_location=str(pki.ca))
    )
    handshake(client, server(pki), "broker.example")
    untrusting = client_context(settings(ssl_truststore_location=str(pki.ca.parent / "other-ca.pem")))
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(untrusting, server(pki), "127.0.0.1")


def test_without_a_keystore_a_required_client_certificate_is_missing(pki: TestPki) -> None:
    client = client_context(settings(ssl_truststore_location=str(pki.ca)))
    with pytest.raises(ssl.SSLError):
        handshake(client, server(pki), "127.0.0.1")


@pytest.mark.parametrize(
    "values",
    [
        {"ssl_keystore_type": "JKS"},
        {"ssl_enabled_protocols": "TLSv1.1"},
        {"ssl_endpoint_identification_algorithm": "ldap"},
        {"ssl_truststore_location": "/nonexistent/ca.pem"},
    ],
)
def test_unusable_client_settings_are_refused(values: dict[str, str]) -> None:
    with pytest.raises(TlsConfigError):
        client_context(settings(**values))
